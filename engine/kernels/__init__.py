"""Hot kernels, in two versions: numpy (`reference`, the oracle) and numba (`fast`).

The rules in `engine.rules` call the functions of this module; each one
picks a version:

* mode "numpy": always the numpy oracle;
* mode "numba": always the numba kernel (compiled on first use, then cached);
* mode "auto" (default): numba for the kernels where it measured faster
  (`AUTO_NUMBA`) once the array is big enough to pay for starting threads
  (`MIN_ELEMENTS`), numpy otherwise. Small lesson-sized tensors therefore
  never wait for a compile.

Switch with `engine.kernels.use("numpy")` (a context manager, or a plain call)
or the environment variable ENGINE_KERNELS=numpy|numba|auto. numba is only
imported when a fast kernel is first needed, so `import engine` stays quick.

The names say what the tape keeps, so they never collide with the fused
trainer's kernels (engine/trainer/kernels/), whose contracts differ:
`layer_norm_xhat_*` saves the normalised input, `attention_probs_*` the full
attention probabilities, `embedding_table_grad` returns a new table gradient.
"""
from __future__ import annotations

import os

import numpy as np

from . import reference

MODES = ("auto", "numpy", "numba")
# Below this many elements, starting threads costs more than the work.
MIN_ELEMENTS = 16_384
# The kernels "auto" runs in numba, from `python -m engine.kernels.bench` at the
# trainer's shape (B=16 T=128 C=128 H=4, float32) on a 2-core x86 machine.
# numba wins where numpy makes many temporaries or wastes work: layer norm
# (3x), the GELU gradient (3x), attention (2x: it skips the masked half), the
# embedding scatter-add (10x and more over np.add.at). numpy wins where the
# work is one exp per element: its exp/tanh are SIMD, and these kernels sum in
# float64, where engine.fast_math's exp is np.exp (scalar in numba without
# Intel SVML), so softmax, log-softmax, the cross-entropy forward and the GELU
# forward stay in numpy.
AUTO_NUMBA = {
    "layer_norm_xhat_forward", "layer_norm_xhat_backward", "gelu_backward",
    "attention_probs_forward", "attention_probs_backward", "embedding_table_grad",
    "cross_entropy_backward",
}

_mode = os.environ.get("ENGINE_KERNELS", "auto")
if _mode not in MODES:
    raise ValueError(f"ENGINE_KERNELS={_mode!r} is not one of {MODES}")


def mode() -> str:
    return _mode


class use:
    """Choose the kernel version: `kernels.use("numpy")` or `with kernels.use("numba"): ...`."""

    def __init__(self, new_mode: str):
        global _mode
        if new_mode not in MODES:
            raise ValueError(f"kernels.use({new_mode!r}): choose one of {MODES}")
        self.previous, _mode = _mode, new_mode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _mode
        _mode = self.previous


def _fast_module():
    from . import fast  # imports numba; done once, on first need
    return fast


def _pick(name: str, size: int):
    if _mode == "numba" or (_mode == "auto" and name in AUTO_NUMBA and size >= MIN_ELEMENTS):
        return getattr(_fast_module(), name)
    return getattr(reference, name)


def _c(a):
    return np.ascontiguousarray(a)


# Each wrapper below only chooses a version and makes the arrays contiguous;
# the maths lives in reference.py and fast.py.
def layer_norm_xhat_forward(x, w, b, eps):
    return _pick("layer_norm_xhat_forward", x.size)(_c(x), _c(w), _c(b), float(eps))


def layer_norm_xhat_backward(g, xhat, rstd, w):
    return _pick("layer_norm_xhat_backward", g.size)(_c(g), _c(xhat), _c(rstd), _c(w))


def softmax_forward(x):
    return _pick("softmax_forward", x.size)(_c(x))


def softmax_backward(g, y):
    return _pick("softmax_backward", g.size)(_c(g), _c(y))


def log_softmax_forward(x):
    return _pick("log_softmax_forward", x.size)(_c(x))


def log_softmax_backward(g, y):
    return _pick("log_softmax_backward", g.size)(_c(g), _c(y))


def cross_entropy_forward(logits, targets):
    return _pick("cross_entropy_forward", logits.size)(_c(logits), _c(targets))


def cross_entropy_backward(probs, targets, scale):
    return _pick("cross_entropy_backward", probs.size)(_c(probs), _c(targets), float(scale))


def gelu_forward(x):
    return _pick("gelu_forward", x.size)(_c(x))


def gelu_backward(g, x):
    return _pick("gelu_backward", g.size)(_c(g), _c(x))


def attention_probs_forward(q, k, v, scale):
    return _pick("attention_probs_forward", q.size * q.shape[1])(_c(q), _c(k), _c(v), float(scale))


def attention_probs_backward(g, q, k, v, att, scale):
    return _pick("attention_probs_backward", g.size * g.shape[1])(_c(g), _c(q), _c(k), _c(v), _c(att),
                                                   float(scale))


def embedding_table_grad(ids, g, vocab_size):
    return _pick("embedding_table_grad", g.size)(_c(ids), _c(g), int(vocab_size))
