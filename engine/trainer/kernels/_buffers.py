"""Small helpers the kernel wrappers share: output buffers and argument checks.

Every wrapper in engine.trainer.kernels follows one convention:

* inputs are positional; outputs are keyword arguments (`out=`, `dx=`, ...);
* an output left as None is allocated (zeros), so the wrapper works as a pure
  function: `out, mean, rstd = layernorm_forward(x, w, b)`;
* an output you pass is filled in place, so a training step can run on
  buffers laid out once and allocate nothing;
* outputs documented as "added into" accumulate (`+=`): parameter gradients
  (for gradient accumulation) and the residual stream's gradient.
"""
from __future__ import annotations

import math

import numpy as np

FLOAT_DTYPES = (np.float32, np.float64)


def float_dtype(kernel: str, *arrays) -> np.dtype:
    """The common float dtype of the arrays; a clear error when they differ."""
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1:
        raise TypeError(f"{kernel}: arrays mix dtypes {sorted(str(d) for d in dtypes)}; "
                        f"cast them all to float32 (training) or float64 (checks)")
    dtype = dtypes.pop()
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{kernel}: dtype {dtype} is not supported; use float32 or float64")
    return dtype


def rows(kernel: str, name: str, a: np.ndarray, width: int | None = None) -> np.ndarray:
    """View `a` as a C-contiguous 2-D (rows, features) array without copying."""
    if not a.flags.c_contiguous:
        raise ValueError(f"{kernel}: {name} must be C-contiguous (got strides {a.strides}); "
                         f"pass np.ascontiguousarray({name})")
    if a.ndim < 1:
        raise ValueError(f"{kernel}: {name} must have at least one axis, got a scalar")
    if width is not None and a.shape[-1] != width:
        raise ValueError(f"{kernel}: {name} has {a.shape[-1]} features (shape {a.shape}), "
                         f"expected {width}")
    return a.reshape(-1, a.shape[-1])


def output(kernel: str, name: str, buf, shape, dtype) -> np.ndarray:
    """The caller's buffer (checked) or a new zero-filled one."""
    shape = tuple(int(s) for s in shape)
    if buf is None:
        return np.zeros(shape, dtype)
    if buf.dtype != dtype:
        raise TypeError(f"{kernel}: output {name} has dtype {buf.dtype}, expected {dtype}")
    if buf.size != math.prod(shape) or not buf.flags.c_contiguous:   # (np.prod: 10x slower)
        raise ValueError(f"{kernel}: output {name} must be a C-contiguous array with shape "
                         f"{shape}, got shape {buf.shape}")
    return buf.reshape(shape)
