"""Accelerators a budget can be checked against: memory and dense FLOP/s.

Figures are the vendors' data-sheet numbers for dense math (no structured
sparsity). "16-bit" is bf16/fp16 on the tensor cores with fp32 accumulation;
"fp32" is plain fp32 math (not TF32). Memory is what the data sheet calls
"40 GB" etc., which is GiB (40 x 2^30 bytes) on these parts.

    A100 (NVIDIA A100 data sheet): 312 TFLOP/s bf16, 19.5 TFLOP/s fp32
    H100 SXM (NVIDIA H100 data sheet): 989 TFLOP/s bf16, 67 TFLOP/s fp32
    RTX 4090 (Ada GPU architecture whitepaper): 165.2 TFLOP/s bf16 with fp32
        accumulation, 82.6 TFLOP/s fp32

"this machine" is measured: its memory from the operating system, its
FLOP/s from one large float32 product (sgemm through the engine's BLAS,
engine.blas), used for every precision (numpy computes 16-bit storage in
fp32).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..timing import sgemm_flops

GiB = 2 ** 30


@dataclass(frozen=True)
class Device:
    name: str
    memory: int          # bytes
    flops_16bit: float   # dense bf16/fp16 FLOP/s
    flops_fp32: float    # dense fp32 FLOP/s

    def flops(self, precision: str) -> float:
        return self.flops_fp32 if precision == "fp32" else self.flops_16bit


DEVICES = {d.name: d for d in (
    Device("A100-40GB", 40 * GiB, 312e12, 19.5e12),
    Device("A100-80GB", 80 * GiB, 312e12, 19.5e12),
    Device("H100-80GB-SXM", 80 * GiB, 989e12, 67e12),
    Device("RTX-4090", 24 * GiB, 165.2e12, 82.6e12),
)}
THIS_MACHINE = "this machine"


def device_figures(cfg) -> tuple[int, float] | None:
    """(memory bytes, FLOP/s at cfg's precision) of the device `cfg` names,
    with `device_memory` / `device_flops` overriding; None without a device."""
    named = DEVICES.get(cfg.device)
    memory = cfg.device_memory or (named.memory if named else 0)
    flops = cfg.device_flops or (named.flops(cfg.precision) if named else 0)
    if not memory and not flops:
        return None
    return memory, flops


def machine_memory() -> int:
    """Physical memory of this machine in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def this_machine() -> dict:
    """The settings that describe this machine as a device (measured now):
    {"device": "this machine", "device_memory": ..., "device_flops": ...}."""
    return {"device": THIS_MACHINE, "device_memory": machine_memory() or 1,
            "device_flops": max(1, int(sgemm_flops()))}
