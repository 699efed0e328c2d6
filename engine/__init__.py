"""A small autograd engine for learning how the backward pass is engineered.

    import engine
    from engine import Tensor, F

    w = Tensor(np.random.randn(3, 2), requires_grad=True)
    loss = F.relu(Tensor(x) @ w).sum()
    loss.backward()          # w.grad now holds dloss/dw

Two engines live here and never import each other (tests/test_layering.py):

* the tape (this folder): `Tensor` and the tape (tensor.py), every op's
  forward and VJP (rules.py), the ops as functions (`engine.functional`, also
  `engine.F`), `gradcheck`, forward mode `jvp`, the `memory` recorder,
  `detect_anomaly`, the scalar engine (`engine.scalar`), layers and the
  reference GPT (`engine.nn`), numba kernels (kernels/), the budget model
  (`engine.budget`, `python -m engine.budget`); lessons 00-09;
* the fused trainer (engine/trainer/): `FusedGPT` on hand-written kernels,
  AdamW, threads/MPI, the training step, `python -m engine.train` and
  `python -m engine.bench`; lessons 10-13.

They share gpt_config (shape and initial weights), timing, numba_config,
fast_math, constants, blas (which BLAS library, and its threads), and
fused_buffers (the fused step's buffers, which the budget reads). The exercise checks and the learner's pieces live
outside the library, in the `coursework` package; the library never imports it.

Lesson <-> module:

    lesson  concept
    00      why gradients, timing                    tape: timing.py
    01, 02  scalar autograd by hand                  tape: scalar.py
    02, 03  the tape, graph nodes                    tape: tensor.py (Tensor, apply,
                                                           TapeObserver)
    03      VJP rules, ops as functions              tape: rules.py, functional.py, kernels/
    04      gradient checking, eps, forward mode     tape: gradcheck.py, eps_sweep.py,
                                                           forward_mode.py
    05      NaN/Inf, broken gradients                tape: anomaly.py
    06      activation memory, measured              tape: memory.py, nn.py (GPT),
                                                           gpt_saved.py
    07      the training-step budget                 tape: budget/
    08      accumulation, activation recompute       tape: accumulation.py, recompute.py
                                                     trainer: model.py (checkpointing=True)
    09      precision                                tape: precision.py
    10      fused kernels                            tape: kernels/ (numpy oracle + numba)
                                                     trainer: kernels/, model.py (FusedGPT),
                                                              kernel_registry.py
    11      embeddings, deterministic scatter-add    tape: kernels/ (embedding_table_grad)
                                                     trainer: kernels/embedding.py, data.py
    12      between backward and step                tape: -
                                                     trainer: optim.py, kernels/adamw.py,
                                                              parallel.py, mpi_job.py
    13      the CPU trainer                          tape: -
                                                     trainer: step.py, train.py, cli.py, lab/,
                                                              checkpoint_files.py

Adding an op to the tape: see CONTRIBUTING.md ("Adding an op").
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
