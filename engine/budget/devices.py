"""Accelerators a budget can be checked against: memory and dense FLOP/s.

Figures are the vendors' data-sheet numbers for dense math (no structured
sparsity). "16-bit" is bf16/fp16 on the tensor (matrix) cores with fp32
accumulation; "fp32" is plain fp32 math (not TF32). Memory is what the driver
reports as the card's total, the figure a practitioner reads: nvidia-smi's
"Memory-Usage" total in MiB (rocm-smi's "VRAM Total Memory" in bytes for the
MI300X), taken from published nvidia-smi/rocm-smi output of each card. It is a
little less than the data sheet's "80 GB" or "24 GB" on most cards (ECC and the
firmware's reservations); the fit verdict sets aside `headroom` for the CUDA
context and the allocator on top (engine.budget.fit).

    card (data sheet)                        memory reported   bf16 / fp32 TFLOP/s
    A100 40 GB (NVIDIA A100 data sheet)      40,960 MiB        312 / 19.5
    A100 80 GB (same)                        81,920 MiB        312 / 19.5
    A10G (AWS's A10; NVIDIA A10 data sheet)  23,028 MiB        125 / 31.2
    H100 SXM 80 GB HBM3 (NVIDIA H100)        81,559 MiB        989 / 67
    H200 SXM 141 GB (NVIDIA H200)            143,771 MiB       989 / 67
    B200 (NVIDIA HGX B200, 180 GB; eight-GPU
        figures / 8)                         183,359 MiB       2,250 / 75
    MI300X (AMD Instinct MI300X, 192 GB)     205,822,885,888 B 1,307.4 / 163.4
                                             (196,288 MiB)
    L40S (NVIDIA L40S, 48 GB)                46,068 MiB        362 / 91.6
    L4 (NVIDIA L4, 24 GB)                    23,034 MiB        121 / 30.3
    RTX 3090 (Ampere GA102 whitepaper, 24 GB) 24,576 MiB       71 (fp32 accumulation)
                                                               / 35.6
    RTX 4090 (Ada whitepaper, 24 GB)         24,564 MiB        165.2 (fp32
                                                               accumulation) / 82.6

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
MiB = 2 ** 20


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
    Device("A100-40GB", 40_960 * MiB, 312e12, 19.5e12),
    Device("A100-80GB", 81_920 * MiB, 312e12, 19.5e12),
    Device("A10G", 23_028 * MiB, 125e12, 31.2e12),
    Device("H100-80GB-SXM", 81_559 * MiB, 989e12, 67e12, short="h100"),
    Device("H200-141GB", 143_771 * MiB, 989e12, 67e12, short="h200"),
    Device("B200-180GB", 183_359 * MiB, 2250e12, 75e12, short="b200"),
    Device("MI300X", 205_822_885_888, 1307.4e12, 163.4e12),
    Device("L40S", 46_068 * MiB, 362e12, 91.6e12),
    Device("L4", 23_034 * MiB, 121e12, 30.3e12),
    Device("RTX-3090", 24_576 * MiB, 71e12, 35.6e12),
    Device("RTX-4090", 24_564 * MiB, 165.2e12, 82.6e12),
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
