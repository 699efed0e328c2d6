"""One block's backward, walked op by op: the most it holds beyond what was alive when
it started.

The backward runs a block's ops in reverse. Each op's backward reads the gradient of
its output, makes the gradients of its inputs, and only then releases what its op
saved; a matmul's backward also makes its weight's gradient, which stays until the
optimizer step. Walking back from the block's last op, at op k the block holds

    the entries ops 0..k saved              (not yet released)
  + the weight gradients of ops k..last     (made so far)
  + the gradients of op k's inputs          (as large, and of the same dtype, as
                                             what op k saved of them)
  + the gradient of op k's output           (the next op's inputs' gradients)

and `backward_by_op` lists these, op by op. The rows are the block's
saved entries in forward order (`real_step`, as the recipes rewrite them); the rows of
the 16-bit weight copies autocast keeps are not inputs: they stay to the end of the
walk. The gradient of an op's input is read off what the op saved, which is exact
for a matmul, a norm or an elementwise op that keeps its input, an upper bound for
attention (its saved output and per-row statistics have no gradient beside Q, K, V)
and short for dropout (its mask is one byte an element). Under checkpointing the
block is rebuilt first, so its whole rows are alive when the walk starts
(`framework_step`). The walk's totals were confirmed on the CPU allocator's memory
events of checkpointed steps (`tools/budget_sweep.py --recompute full`).
"""
from __future__ import annotations

import itertools

from .kept import Saved
from .linears import BLOCK_LINEARS

# Rows of weights' 16-bit copies (real_step, lora): kept by every matmul's backward,
# not inputs of any op of the walk.
WEIGHT_COPIES = ("block matmuls", "frozen matmuls", "lora adapters")
# SDPA keeps its output, which is also the projection's input: the projection has
# no row of its own there, and its weight's gradient comes with SDPA's backward.
PROJECTION_INPUT = "scaled_dot_product_attention"


def _ops(rows: list[Saved]) -> list[tuple[str, int]]:
    """(op, bytes it saved) in forward order, consecutive rows of one op merged."""
    ops: list[list] = []
    for x in rows:
        if x.op in WEIGHT_COPIES:
            continue
        if ops and ops[-1][0] == x.op:
            ops[-1][1] += x.bytes
        else:
            ops.append([x.op, x.bytes])
    return [(op, size) for op, size in ops]


def input_op(linear, ops: list[str]) -> str | None:
    """The op of `ops` whose rows hold `linear`'s input: the op it `reads`, or SDPA's
    (whose output is the projection's input); None when neither is there."""
    where = linear.reads if linear.reads in ops else PROJECTION_INPUT
    return where if where in ops else None


def weight_gradients_by_op(cfg, ops: list[str], tensors, block: int,
                           grad_bytes: int) -> list[int]:
    """Bytes of the weight gradients each op's backward makes, for block `block`'s
    trained tensors among `tensors` (optimizer_step.ParamTensor): a linear layer's
    (and its adapters', `<layer>.lora_...`) at the op that saved its input."""
    made = [0] * len(ops)
    mine = [(f".{t.name}", t.numel) for t in tensors if t.block == block]
    for linear in BLOCK_LINEARS[cfg.architecture]:
        where = input_op(linear, ops)
        if where is not None:
            made[ops.index(where)] += grad_bytes * sum(
                numel for name, numel in mine if f".{linear.name}." in name)
    return made


def backward_by_op(cfg, rows: list[Saved], tensors, block: int, grad_bytes: int,
                   layers: tuple = (), rebuilt: bool = False) -> list[int]:
    """What block `block`'s backward holds beyond what was alive before it, at each of
    its ops, the last first: its saved rows not yet released, its weight gradients made
    so far and the gradients it is making (see the module's doc). `layers`: (the op
    whose rows come before a layer that keeps no row, what its backward holds), each
    one more moment of the walk, where the rows of that op and those before it are
    still saved; when the block is `rebuilt` (checkpointing), a layer after the last
    op with rows runs its backward before anything asks for the rebuild: no row is
    alive yet."""
    ops = _ops(rows)
    names, sizes = [op for op, _ in ops], [size for _, size in ops]
    copies = sum(x.bytes for x in rows if x.op in WEIGHT_COPIES)
    made = weight_gradients_by_op(cfg, names, tensors, block, grad_bytes)
    saved_to = list(itertools.accumulate(sizes))                  # rows of ops 0..k
    made_from = list(itertools.accumulate(made[::-1]))[::-1] + [0]  # gradients of ops k..
    held = []
    for k in range(len(ops) - 1, -1, -1):
        working = sizes[k] + (sizes[k + 1] if k + 1 < len(ops) else 0)
        held.append(copies + saved_to[k] + made_from[k] + working)
    for before, size in layers:
        if before not in names:
            continue
        k = names.index(before)
        if rebuilt and k == len(ops) - 1:
            held.append(size)
        else:
            held.append(copies + saved_to[k] + made_from[k + 1] + size)
    return held
