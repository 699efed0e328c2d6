"""What the tape's reference GPT (`engine.nn.GPT`) keeps for its backward, as one
table: engine.nn's closed forms and the budget's "engine" activation model both
read it, and `engine.memory` measures the same bytes (tests hold them equal).

Each entry is (op, tensor, kind, elements), with elements a function of the
micro-batch B, the sequence T, the width C, the heads H and the vocabulary V;
kind "float" is stored at the float dtype's itemsize, "int64" at 8 bytes.
Parameters an op keeps a reference to (a weight for dx, a LayerNorm gain) are
weights, not activations; bias adds, residual adds and the head split/merge
reshapes save nothing.
"""
from __future__ import annotations

INT64_BYTES = 8

# One pre-LN block, input x of shape (B, T, C): 13 saved entries in 11 buffers.
BLOCK = (
    ("ln1 layer_norm", "xhat", "float", lambda B, T, C, H: B * T * C),
    ("ln1 layer_norm", "rstd", "float", lambda B, T, C, H: B * T),
    ("attn qkv matmul", "input ln1(x)", "float", lambda B, T, C, H: B * T * C),
    ("attn causal_attention", "q, k, v (one buffer)", "float", lambda B, T, C, H: 3 * B * T * C),
    ("attn causal_attention", "att", "float", lambda B, T, C, H: B * H * T * T),
    ("attn proj matmul", "merged heads", "float", lambda B, T, C, H: B * T * C),
    ("ln2 layer_norm", "xhat", "float", lambda B, T, C, H: B * T * C),
    ("ln2 layer_norm", "rstd", "float", lambda B, T, C, H: B * T),
    ("mlp fc matmul", "input ln2(x)", "float", lambda B, T, C, H: B * T * C),
    ("mlp gelu", "input", "float", lambda B, T, C, H: 4 * B * T * C),
    ("mlp fcproj matmul", "gelu output", "float", lambda B, T, C, H: 4 * B * T * C),
)
ATTENTION_PROBABILITIES = "att"  # what selective recompute rebuilds in the backward

# Outside the blocks: the ids (kept until the embedding's VJP, the very last),
# the final layer norm, the tied head's input, and the loss (with targets only).
OUTSIDE = (
    ("embed embedding", "ids", "int64", lambda B, T, C, V: B * T),
    ("lnf layer_norm", "xhat", "float", lambda B, T, C, V: B * T * C),
    ("lnf layer_norm", "rstd", "float", lambda B, T, C, V: B * T),
    ("head matmul", "input lnf(x)", "float", lambda B, T, C, V: B * T * C),
)
LOSS = (
    ("loss cross_entropy", "probs", "float", lambda B, T, C, V: B * T * V),
    ("loss cross_entropy", "targets", "int64", lambda B, T, C, V: B * T),
)


def itemsize(kind: str, float_bytes: int) -> int:
    return INT64_BYTES if kind == "int64" else float_bytes


def block_entries(B: int, T: int, C: int, H: int, float_bytes: int):
    """(op, tensor, elements, itemsize) of each entry one block keeps."""
    return [(op, t, n(B, T, C, H), itemsize(k, float_bytes)) for op, t, k, n in BLOCK]


def outside_entries(B: int, T: int, C: int, V: int, float_bytes: int,
                    with_targets: bool = True):
    """(op, tensor, elements, itemsize) of each entry kept outside the blocks."""
    table = OUTSIDE + (LOSS if with_targets else ())
    return [(op, t, n(B, T, C, V), itemsize(k, float_bytes)) for op, t, k, n in table]
