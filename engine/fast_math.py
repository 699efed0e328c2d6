"""An exp that the compiler can vectorise, and fused multiply-adds.

numba turns `np.exp` on a float32 into a call to the C library's `expf`, one
element at a time (about 2.4 ns each here). GELU and softmax call it millions
of times per step, so float32 gets a polynomial `exp` written with plain
arithmetic and fused multiply-adds (`fma`, where the CPU has them), which
LLVM turns into 16-wide vector code (about 0.45 ns each here, against 0.65
with separate multiplies and adds; within 1 ulp). float64, used by the
gradient checks, keeps `np.exp`.

`exp(x)` picks the version by the argument's type when numba compiles the
caller, so kernels stay dtype-generic. (GELU's tanh is written through it:
0.5 (1 + tanh z) = 1 / (1 + exp(-2z)), see engine/trainer/kernels/gelu.py.)

A trap worth knowing: in numba, `x + 1` or `0.5 * x` with a float32 `x` is
computed in float64 (a Python number is a float64 or int64, and the pair
promotes). Kernels therefore build their constants in the array's own type,
`one = x.dtype.type(1)`, and never mix a bare literal into float32 arithmetic.
"""
from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from .numba_config import target_cpu_features


@intrinsic
def _float32_from_bits(typingctx, bits):
    """Reinterpret an int32 bit pattern as a float32 (builds 2**n exactly)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


def _target_has_fma() -> bool:
    """Whether the CPU numba compiles for has a fused multiply-add instruction
    (x86 since Haswell and Piledriver, 2013, but not every low-end Atom,
    Celeron or Pentium; every 64-bit ARM)."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return True
    return "+fma" in target_cpu_features().split(",")


HAS_FMA = _target_has_fma()


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c. With the CPU's fused multiply-add (LLVM's llvm.fma: rounded
    once, the same bits on every CPU that has it) where there is one; else a
    multiply and an add, each rounded (llvm.fma without the instruction is a
    library call per element: 12.7 against 0.95 ns per exp, measured with numba
    compiling for a Sandy Bridge). Either way the choice is made here, never
    by the optimiser: fast-math's "contract" would let LLVM fuse where it sees
    fit, and it did not see alike for a fresh compile and a cache load."""
    if not (a == b == c and a in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        x, y, z = args
        if HAS_FMA:
            return builder.fma(x, y, z)
        return builder.fadd(builder.fmul(x, y), z)

    return a(a, b, c), codegen


@register_jitable
def _exp_float32(x):
    # exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2;
    # exp(r) from a degree-7 polynomial (Cephes' expf coefficients), each
    # Horner step one fused multiply-add.
    # Held to [-87, 87]: 2**n stays a normal float, and so does 1 / (1 + exp(x)),
    # the sigmoid GELU computes (below 1 / (1 + exp(87)) = 1.6e-38 lie the
    # subnormal numbers, which CPUs compute many times slower; see GELU's kernel).
    x = min(max(x, np.float32(-87.0)), np.float32(87.0))
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = fma(n, np.float32(2.12194440e-4), fma(n, np.float32(-0.693359375), x))
    p = np.float32(1.9875691500e-4)
    p = fma(p, r, np.float32(1.3981999507e-3))
    p = fma(p, r, np.float32(8.3334519073e-3))
    p = fma(p, r, np.float32(4.1665795894e-2))
    p = fma(p, r, np.float32(1.6666665459e-1))
    p = fma(p, r, np.float32(5.0000001201e-1))
    er = fma(p, r * r, r) + np.float32(1.0)
    two_n = _float32_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
    return er * two_n


def exp(x):
    """e**x; vectorisable in float32 (see module docstring)."""
    return np.exp(x)


@overload(exp)
def _exp_overload(x):
    if x == types.float32:
        return lambda x: _exp_float32(x)
    return lambda x: np.exp(x)
