"""The benchmark's reference: the same GPT in PyTorch eager, in a process of its own.

`torch_gpt` writes the model in PyTorch. `TorchTwin` runs it in a child
process, with the same initial weights and batches as ours, and the parent
asks it for blocks of training steps, timed in the child.

Why a process of its own: both sides keep thread pools that idle between
their blocks of steps (ours: numba's OpenMP threads and the BLAS's; PyTorch:
its own OpenMP runtime and MKL's), and each library sets up its pools from
the environment once, when it loads. In one process the two share the
environment, so one side runs under the other's choices (the engine asks for
sleeping idle threads, OMP_WAIT_POLICY=PASSIVE, which slows PyTorch), and
our replicas waited for each other several times longer while PyTorch
sat in the same process (trainer/kernels/cpu/README.md). In its own
process PyTorch loads under the user's environment, as a practitioner would
run it, and neither side's idle threads live in the other's address space.

The child speaks pickle over its stdin and stdout (its own prints go to
stderr): one setup message, then requests, then ("close",). A request is
("steps", first batch, count): training steps, answered with each step's
seconds; ("forward_backward", first batch, count): the same without the
optimizer (the attention sweep times this); or ("saved_bytes", batch): what
autograd keeps for one backward.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback

import numpy as np

from ...gpt_config import GPTConfig
from ...timing import timed_steps


def torch_gpt(cfg: GPTConfig, params: dict[str, np.ndarray], attention: str = "sdpa"):
    """The same GPT in PyTorch eager: returns (loss_fn(ids, targets), tensors by name).

    Weights are stored (in, out) as in engine.gpt_config, so a linear layer is
    x @ w + b; attention is torch's fused scaled_dot_product_attention
    ("sdpa", the eager default a practitioner would write) or the textbook
    softmax(q k^T / sqrt(hs)) v with a mask ("manual")."""
    import torch
    import torch.nn.functional as F

    tensors = {name: torch.tensor(np.array(value), requires_grad=True)
               for name, value in params.items()}
    C, H, V = cfg.n_embd, cfg.n_head, cfg.vocab_size
    hs = C // H

    def attend(q, k, v, T):
        if attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def loss_fn(ids, targets):
        p = tensors
        B, T = ids.shape
        x = p["wte"][ids] + p["wpe"][:T]
        for i in range(cfg.n_layer):
            w = lambda n: p[f"h{i}.{n}"]  # noqa: E731
            h = F.layer_norm(x, (C,), w("ln1_w"), w("ln1_b"), 1e-5)
            q, k, v = (t.view(B, T, H, hs).transpose(1, 2)
                       for t in (h @ w("qkv_w") + w("qkv_b")).split(C, dim=-1))
            y = attend(q, k, v, T).transpose(1, 2).reshape(B, T, C)
            x = x + y @ w("proj_w") + w("proj_b")
            h = F.layer_norm(x, (C,), w("ln2_w"), w("ln2_b"), 1e-5)
            x = x + F.gelu(h @ w("fc_w") + w("fc_b"), approximate="tanh") @ w("fcproj_w") \
                + w("fcproj_b")
        x = F.layer_norm(x, (C,), p["lnf_w"], p["lnf_b"], 1e-5)
        return F.cross_entropy((x @ p["wte"].T).view(-1, V), targets.reshape(-1))

    return loss_fn, tensors


def torch_missing() -> str | None:
    """Why PyTorch cannot be the reference here, or None when it is installed."""
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed; pip install torch to compare"
    return None


class TorchTwin:
    """PyTorch's side of the benchmark, in a child process.

    Built with the model's shape, its initial weights and every batch of the
    run; on start the child computes the first step's gradients (before any
    update: `grads`, numpy arrays by parameter name) and then times that first
    step (`first_step_s`). `steps(first, count)` runs batches first, first+1,
    ... and returns each step's seconds, measured in the child."""

    def __init__(self, cfg: GPTConfig, params: dict[str, np.ndarray], batches, *,
                 attention: str = "sdpa", threads: int = 1):
        from ...numba_config import users_environment
        from ..child_process import start_python
        # torch is imported before anything of ours, under the user's environment
        self._child = start_python("import torch, sys; from engine.trainer.lab.torch_twin import "
                                   "serve; serve(sys.stdin.buffer)", env=users_environment(),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = self._ask({"config": cfg.to_dict(), "params": params, "batches": batches,
                           "attention": attention, "threads": threads})
        self.version, self.grads = ready["version"], ready["grads"]
        self.first_step_s = ready["first_step_s"]

    def steps(self, first: int, count: int) -> list[float]:
        """Training steps on batches first, first+1, ...: each one's seconds."""
        return self._ask(("steps", first, count))

    def forward_backward(self, first: int, count: int) -> list[float]:
        """Forward and backward only, no optimizer: each one's seconds."""
        return self._ask(("forward_backward", first, count))

    def saved_bytes(self, batch: int = 0) -> int:
        """Bytes autograd saves for one backward on that batch (torch_saved_bytes)."""
        return self._ask(("saved_bytes", batch))

    def close(self) -> None:
        if self._child.poll() is None:
            try:
                pickle.dump(("close",), self._child.stdin)
                self._child.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self._child.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _ask(self, message):
        try:
            pickle.dump(message, self._child.stdin)
            self._child.stdin.flush()
            kind, answer = pickle.load(self._child.stdout)
        except (BrokenPipeError, EOFError) as exc:
            self._child.kill()
            raise RuntimeError(f"the PyTorch process stopped (exit code "
                               f"{self._child.wait()}); its messages are above") from exc
        if kind == "error":
            self.close()
            raise RuntimeError(f"the PyTorch process failed:\n{answer}")
        return answer


def serve(requests) -> None:
    """The child's side of TorchTwin: answer requests from `requests` (a binary
    stream) on the original stdout, which nothing else writes to."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())     # stray prints go to stderr

    def reply(kind, value):
        pickle.dump((kind, value), answers)
        answers.flush()

    try:
        handlers = _setup(pickle.load(requests), reply)
        while True:
            request = pickle.load(requests)
            if request[0] == "close":
                return
            reply("ok", handlers[request[0]](*request[1:]))
    except EOFError:                 # the parent went away
        return
    except Exception:                # noqa: BLE001 - the parent raises it with the text
        reply("error", traceback.format_exc())


def torch_saved_bytes(loss_fn, ids, targets, params=()) -> int:
    """Bytes of the distinct tensors PyTorch's autograd saves for one backward
    (counted through saved_tensors_hooks; views of one storage counted once;
    the parameters' own storages left out, as activation_bytes leaves them)."""
    import torch
    weights = {p.untyped_storage().data_ptr() for p in params}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(ids, targets)
    loss.backward()
    return sum(storages.values())


def _setup(setup: dict, reply):
    """Build the twin, answer with its first-step gradients and first-step time;
    return the handlers of the requests that follow, by name (the timed ones
    through engine.timing.timed_steps)."""
    import torch
    torch.set_num_threads(setup["threads"])
    cfg = GPTConfig(**setup["config"])
    loss_fn, tensors = torch_gpt(cfg, setup["params"], setup["attention"])
    decay = [t for t in tensors.values() if t.ndim >= 2]
    no_decay = [t for t in tensors.values() if t.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in setup["batches"]]
    every = list(tensors.values())

    def step(i):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(every, 1.0)
        opt.step()
        return loss.item()

    loss_fn(*batches[0]).backward()                   # the first step's gradients
    grads = {name: t.grad.numpy().copy() for name, t in tensors.items()}
    for t in every:
        t.grad = None

    def forward_backward(i):
        loss_fn(*batches[i]).backward()
        for t in every:
            t.grad = None

    steps = timed_steps(step)
    first_step_s, = steps(0, 1)
    reply("ok", {"version": torch.__version__, "grads": grads, "first_step_s": first_step_s})
    return {"steps": steps, "forward_backward": timed_steps(forward_backward),
            "saved_bytes": lambda i: torch_saved_bytes(loss_fn, *batches[i], every)}
