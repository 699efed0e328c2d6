"""A small autograd engine for learning how the backward pass is engineered.

    import engine
    from engine import Tensor, F

    w = Tensor(np.random.randn(3, 2), requires_grad=True)
    loss = F.relu(Tensor(x) @ w).sum()
    loss.backward()          # w.grad now holds dloss/dw

Pieces: `Tensor` and the tape (engine/tensor.py), every op's forward and
VJP (engine/rules.py), the ops as functions (`engine.functional`, also
`engine.F`), `gradcheck`, forward mode `jvp`, the `memory` recorder,
`detect_anomaly`, the scalar engine of the first lessons (`engine.scalar`),
layers and the reference GPT (`engine.nn`), numba kernels (engine/kernels/).
"""
from ._versions import check_versions

check_versions()

from . import functional, kernels, memory, nn, scalar  # noqa: E402
from . import functional as F  # noqa: E402
from .anomaly import AnomalyError, detect_anomaly  # noqa: E402
from .forward_mode import jvp  # noqa: E402
from .gradcheck import GradcheckError, GradcheckReport, gradcheck  # noqa: E402
from .rules import ShapeError  # noqa: E402
from .tensor import Tensor, enable_grad, name_scope, no_grad, set_grad_enabled  # noqa: E402

__all__ = ["Tensor", "no_grad", "enable_grad", "set_grad_enabled", "name_scope", "functional",
           "F", "gradcheck", "GradcheckReport", "GradcheckError", "jvp", "memory",
           "detect_anomaly", "AnomalyError", "ShapeError", "scalar", "nn", "kernels",
           "check_versions"]
