"""Accelerators a budget can be checked against: memory and dense FLOP/s.

Figures are the vendors' data-sheet numbers for dense math (no structured
sparsity). "16-bit" is bf16/fp16 on the tensor (matrix) cores with fp32
accumulation; "fp32" is plain fp32 math (not TF32). Memory is the figure the
data sheet quotes ("80 GB"), taken as GiB (80 x 2^30 bytes), which is what
these parts carry; the driver reports a little less, and the fit verdict sets
aside `headroom` for the CUDA context and the allocator on top (engine.budget.fit).

    A100 40/80 GB (NVIDIA A100 data sheet): 312 TFLOP/s bf16, 19.5 fp32
    A10G (AWS's variant of the A10; NVIDIA's A10 data sheet): 125 bf16, 31.2 fp32
    H100 SXM (NVIDIA H100 data sheet): 989 bf16, 67 fp32
    H200 SXM (NVIDIA H200 data sheet, 141 GB): 989 bf16, 67 fp32
    B200 (NVIDIA HGX B200 data sheet, 180 GB per GPU, eight-GPU figures / 8):
        2,250 bf16, 75 fp32
    MI300X (AMD Instinct MI300X data sheet, 192 GB): 1,307.4 bf16, 163.4 fp32
    L40S (NVIDIA L40S data sheet, 48 GB): 362 bf16, 91.6 fp32
    L4 (NVIDIA L4 data sheet, 24 GB): 121 bf16, 30.3 fp32
    RTX 3090 (NVIDIA Ampere GA102 whitepaper, 24 GB): 71 bf16 with fp32
        accumulation, 35.6 fp32
    RTX 4090 (Ada GPU architecture whitepaper, 24 GB): 165.2 bf16 with fp32
        accumulation, 82.6 fp32

A device is named by its full name, a short one, or the start of exactly one
full name, in any case and with or without dashes: "H200-141GB", "h200",
"h100-80gb", "rtx-3090", "RTX3090", "mi300x".

"this machine" is measured: its memory from the operating system, its
FLOP/s from one large float32 product (sgemm through the engine's BLAS,
engine.blas), used for every precision (numpy computes 16-bit storage in
fp32).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..timing import sgemm_flops

GiB = 2 ** 30


@dataclass(frozen=True)
class Device:
    name: str
    memory: int          # bytes
    flops_16bit: float   # dense bf16/fp16 FLOP/s
    flops_fp32: float    # dense fp32 FLOP/s
    short: str = ""      # a short name that also selects it ("h200")

    def flops(self, precision: str) -> float:
        return self.flops_fp32 if precision == "fp32" else self.flops_16bit


DEVICES = {d.name: d for d in (
    Device("A100-40GB", 40 * GiB, 312e12, 19.5e12),
    Device("A100-80GB", 80 * GiB, 312e12, 19.5e12),
    Device("A10G", 24 * GiB, 125e12, 31.2e12),
    Device("H100-80GB-SXM", 80 * GiB, 989e12, 67e12, short="h100"),
    Device("H200-141GB", 141 * GiB, 989e12, 67e12, short="h200"),
    Device("B200-180GB", 180 * GiB, 2250e12, 75e12, short="b200"),
    Device("MI300X", 192 * GiB, 1307.4e12, 163.4e12),
    Device("L40S", 48 * GiB, 362e12, 91.6e12),
    Device("L4", 24 * GiB, 121e12, 30.3e12),
    Device("RTX-3090", 24 * GiB, 71e12, 35.6e12),
    Device("RTX-4090", 24 * GiB, 165.2e12, 82.6e12),
)}
THIS_MACHINE = "this machine"
NO_DEVICE = "none"


def _plain(name: str) -> str:
    """'RTX-3090' and 'rtx 3090' -> 'rtx3090': how names are compared."""
    return re.sub(r"[\s_-]", "", name.lower())


_BY_PLAIN_NAME = {_plain(key): d for d in DEVICES.values()
                  for key in (d.name, d.short) if key}


def find_device(name: str) -> Device | None:
    """The device a name selects, or None: its full or short name, or the start of
    exactly one full name ("h100-80gb"), in any case, dashes optional."""
    if not isinstance(name, str) or not _plain(name):
        return None
    plain = _plain(name)
    if plain in _BY_PLAIN_NAME:
        return _BY_PLAIN_NAME[plain]
    starting = [d for d in DEVICES.values() if _plain(d.name).startswith(plain)]
    return starting[0] if len(starting) == 1 else None


def device_figures(cfg) -> tuple[int, float] | None:
    """(memory bytes, FLOP/s at cfg's precision) of the device `cfg` names,
    with `device_memory` / `device_flops` overriding; None without a device."""
    named = find_device(cfg.device)
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
