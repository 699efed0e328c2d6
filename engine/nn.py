"""Small layers built from `engine.functional`, and the reference GPT.

Everything here is ordinary tape code: each layer is a few functional ops,
so `engine.memory` sees exactly the ops listed below, and the gradients are
whatever the rules in engine/rules.py say.

What the tape saves (measured by `engine.memory`, held equal by tests;
the GPT's entries are one table, engine/gpt_saved.py, read by the closed
forms below and by the budget's "engine" model)
======================================================================

Counted in activation bytes; parameters the ops keep a reference to (a
weight for dx, a LayerNorm gain) are not counted, they are weights. Each
buffer counts once (see engine/memory.py). `f` is the float itemsize
(4 for float32, 8 for float64); integer ids and targets are int64 (8 bytes).

MLP (Linear -> activation -> Linear) on an input of shape (B, n_in):
    fc1 matmul     x                   B * n_in
    relu or tanh   its output h        B * n_hidden   (fc2's matmul saves the
                                                       same buffer: counted once)
    gelu instead   its input u         B * n_hidden   and fc2 saves gelu(u):
                                                       another B * n_hidden
    bias adds      nothing
  => relu/tanh: f * B * (n_in + n_hidden);  gelu: f * B * (n_in + 2 * n_hidden)

GPT block (pre-LN), input x of shape (B, T, C), H heads; per block 13 saved
activation entries in 11 buffers:
    ln1  layer_norm       xhat (B,T,C), rstd (B,T)
    attn qkv matmul       h = ln1(x) (B,T,C)
         causal_attention q, k, v: views of one (B,T,3C) buffer; att (B,H,T,T)
         proj matmul      y, the heads merged (B,T,C)
    ln2  layer_norm       xhat (B,T,C), rstd (B,T)
    mlp  fc matmul        h = ln2(x) (B,T,C)
         gelu             u, its input (B,T,4C)
         fcproj matmul    gelu(u) (B,T,4C)
    (bias adds, residual adds, the head split/merge reshapes: nothing)
  => elements per block: 16*B*T*C + 2*B*T + B*H*T*T, times f   (`block_saved_bytes`)
  With selective recompute (`block.recompute_attention`, engine.recompute.
  selective_recompute) causal_attention becomes a checkpoint node that keeps
  q, k, v only (the same buffer): att (B,H,T,T) is rebuilt in the backward,
  and a block keeps 16*B*T*C + 2*B*T elements.

Whole GPT, L blocks, vocabulary V:
    embedding            ids (B,T) int64                        8 * B*T
    wte[ids] + wpe[:T]   nothing (a gather, a slice, an add)
    L blocks             L * block_saved_bytes
    lnf layer_norm       xhat (B,T,C), rstd (B,T)               f * (B*T*C + B*T)
    head matmul (tied)   h = lnf(x) (B,T,C)                     f * B*T*C
    cross_entropy        probs (B,T,V), targets (B*T,) int64    f * B*T*V + 8 * B*T
                         (only when targets are given)
  => `gpt_saved_bytes(cfg, B, T, dtype, with_targets)`; the peak of saved
     bytes equals this total (nothing is freed before backward starts).
"""
from __future__ import annotations

import numpy as np

from . import functional as F
from . import gpt_saved
from .gpt_config import GPTConfig
from .recompute import checkpoint
from .tensor import Tensor, name_scope


class Module:
    """A container of named parameter tensors with a forward (`__call__`)."""

    def parameters(self) -> dict[str, Tensor]:
        found: dict[str, Tensor] = {}
        for attr, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                found[value.name or attr] = value
            elif isinstance(value, Module):
                for name, p in value.parameters().items():
                    found.setdefault(name, p)
        return found

    def zero_grad(self) -> None:
        for p in self.parameters().values():
            p.zero_grad()

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _as_parameter(value, name: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return Tensor(value, requires_grad=True, name=name)


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


class Linear(Module):
    """y = x @ weight + bias, weight stored (in, out) as in engine.gpt_config.

    Linear(n_in, n_out, seed=0, dtype=np.float64) draws weight from
    N(0, 1/n_in) (so outputs keep unit scale); Linear.from_tensors(w, b)
    uses given tensors."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True, seed: int = 0,
                 dtype=np.float64, name: str = "linear"):
        rng = np.random.default_rng(seed)
        self.weight = Tensor(rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_in, n_out)),
                             requires_grad=True, name=f"{name}.weight", dtype=dtype)
        self.bias = (Tensor(np.zeros(n_out), requires_grad=True, name=f"{name}.bias",
                            dtype=dtype) if bias else None)
        self.name = name

    @classmethod
    def from_tensors(cls, weight: Tensor, bias: Tensor | None = None, name: str = "linear"):
        layer = cls.__new__(cls)
        layer.weight, layer.bias, layer.name = weight, bias, name
        return layer

    def forward(self, x) -> Tensor:
        return F.linear(_as_tensor(x), self.weight, self.bias)


class LayerNorm(Module):
    """Normalise the last axis, then scale by weight (ones) and shift by bias (zeros)."""

    def __init__(self, n_features: int, eps: float = 1e-5, dtype=np.float64,
                 name: str = "ln"):
        self.weight = Tensor(np.ones(n_features), requires_grad=True, name=f"{name}.weight",
                             dtype=dtype)
        self.bias = Tensor(np.zeros(n_features), requires_grad=True, name=f"{name}.bias",
                           dtype=dtype)
        self.eps = eps

    def forward(self, x) -> Tensor:
        return F.layer_norm(_as_tensor(x), self.weight, self.bias, self.eps)


ACTIVATIONS = {"relu": F.relu, "tanh": F.tanh, "gelu": F.gelu}


class MLP(Module):
    """Two linear layers with an activation between: fc2(act(fc1(x)))."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, activation: str = "relu",
                 seed: int = 0, dtype=np.float64):
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: activation {activation!r} is not one of "
                             f"{sorted(ACTIVATIONS)}")
        self.fc1 = Linear(n_in, n_hidden, seed=seed, dtype=dtype, name="fc1")
        self.fc2 = Linear(n_hidden, n_out, seed=seed + 1, dtype=dtype, name="fc2")
        self.activation = activation

    def forward(self, x) -> Tensor:
        with name_scope("fc1"):
            h = self.fc1(x)
        with name_scope(self.activation):
            h = ACTIVATIONS[self.activation](h)
        with name_scope("fc2"):
            return self.fc2(h)

    @staticmethod
    def saved_bytes(batch: int, n_in: int, n_hidden: int, activation: str = "relu",
                    dtype=np.float64) -> int:
        """Closed form of the activation bytes the tape saves (module docstring)."""
        hidden_buffers = 2 if activation == "gelu" else 1
        return np.dtype(dtype).itemsize * batch * (n_in + hidden_buffers * n_hidden)


class Block(Module):
    """One pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    `params` maps the names of engine.gpt_config (prefix 'h{i}.') to tensors.
    recompute_attention=True: keep q, k, v and rebuild the attention
    probabilities in the backward (selective recompute, engine.recompute)."""

    def __init__(self, cfg: GPTConfig, params: dict[str, Tensor], index: int):
        self.cfg, self.index = cfg, index
        self.recompute_attention = False
        self.prefix = f"h{index}."
        self.p = {k[len(self.prefix):]: v for k, v in params.items()
                  if k.startswith(self.prefix)}

    def parameters(self) -> dict[str, Tensor]:
        return {self.prefix + k: v for k, v in self.p.items()}

    def forward(self, x: Tensor) -> Tensor:
        p, (B, T, C), H = self.p, x.shape, self.cfg.n_head
        hs = C // H
        with name_scope(self.prefix + "ln1"):
            h = F.layer_norm(x, p["ln1_w"], p["ln1_b"])
        with name_scope(self.prefix + "attn"):
            qkv = h @ p["qkv_w"] + p["qkv_b"]                       # (B, T, 3C)
            q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, hs).transpose(1, 2)
                       for i in range(3))                           # (B, H, T, hs) views
            if self.recompute_attention:                            # keep q, k, v only
                y = checkpoint(F.causal_attention, q, k, v, label="attention core")
            else:
                y = F.causal_attention(q, k, v)                     # (B, H, T, hs)
            y = y.transpose(1, 2).reshape(B, T, C)                  # heads side by side
            x = x + (y @ p["proj_w"] + p["proj_b"])
        with name_scope(self.prefix + "ln2"):
            h = F.layer_norm(x, p["ln2_w"], p["ln2_b"])
        with name_scope(self.prefix + "mlp"):
            u = h @ p["fc_w"] + p["fc_b"]                           # (B, T, 4C)
            x = x + (F.gelu(u) @ p["fcproj_w"] + p["fcproj_b"])
        return x


def block_saved_bytes(B: int, T: int, C: int, H: int, dtype=np.float32) -> int:
    """Activation bytes one GPT block saves (engine/gpt_saved.py's table):
    f (16BTC + 2BT + BHT^2)."""
    f = np.dtype(dtype).itemsize
    return sum(n * size for _, _, n, size in gpt_saved.block_entries(B, T, C, H, f))


def gpt_saved_bytes(cfg: GPTConfig, B: int, T: int, dtype=np.float32,
                    with_targets: bool = True) -> int:
    """Activation bytes the whole GPT saves for one forward (the same table)."""
    f, C, V = np.dtype(dtype).itemsize, cfg.n_embd, cfg.vocab_size
    outside = gpt_saved.outside_entries(B, T, C, V, f, with_targets)
    return (cfg.n_layer * block_saved_bytes(B, T, C, cfg.n_head, dtype)
            + sum(n * size for _, _, n, size in outside))


class GPT(Module):
    """The reference GPT on the tape: GPT(cfg, params) with params from
    engine.gpt_config.init_params. model(ids) -> logits (B, T, V);
    model(ids, targets) -> mean cross-entropy loss (a scalar Tensor).

    model.params[name] are Tensors (requires_grad=True) holding copies of the
    given arrays (a Tensor given in params is used as it is, not copied);
    after loss.backward() their .grad are the gradients."""

    def __init__(self, cfg: GPTConfig, params: dict[str, np.ndarray]):
        from .gpt_config import param_shapes
        expected = param_shapes(cfg)
        missing = sorted(set(expected) - set(params))
        if missing:
            raise KeyError(f"GPT: params lack {missing[:4]}{'...' if len(missing) > 4 else ''}"
                           f"; build them with engine.gpt_config.init_params(cfg)")
        for name, shape in expected.items():
            if tuple(np.shape(params[name])) != shape:
                raise ValueError(f"GPT: params[{name!r}] has shape {np.shape(params[name])}, "
                                 f"the config needs {shape}")
        self.cfg = cfg
        self.params = {name: _as_parameter(params[name], name) for name in expected}
        self.blocks = [Block(cfg, self.params, i) for i in range(cfg.n_layer)]

    def parameters(self) -> dict[str, Tensor]:
        return dict(self.params)

    def grads(self) -> dict[str, np.ndarray | None]:
        return {name: p.grad for name, p in self.params.items()}

    def forward(self, ids, targets=None) -> Tensor:
        ids_arr = ids.data if isinstance(ids, Tensor) else np.asarray(ids)
        if ids_arr.ndim != 2:
            raise ValueError(f"GPT: ids must have shape (B, T), got {ids_arr.shape}; for a "
                             f"single sequence pass ids[None]")
        B, T = ids_arr.shape
        if T > self.cfg.block_size:
            raise ValueError(f"GPT: sequence length T={T} exceeds block_size="
                             f"{self.cfg.block_size} (the position table has that many rows)")
        p = self.params
        with name_scope("embed"):
            x = F.embedding(ids_arr, p["wte"]) + p["wpe"][:T]
        for block in self.blocks:
            x = block(x)
        with name_scope("lnf"):
            x = F.layer_norm(x, p["lnf_w"], p["lnf_b"])
        with name_scope("head"):
            logits = x @ p["wte"].T                                 # tied output head
        if targets is None:
            return logits
        with name_scope("loss"):
            return F.cross_entropy(logits, targets)
