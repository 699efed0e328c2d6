"""One block's backward, walked op by op: the most it holds beyond what was alive when
it started.

The backward runs a block's ops in reverse. Each op's backward reads the gradient of
its output, makes the gradients of its inputs, and only then releases what its op
saved; a matmul's backward also makes its weight's gradient, which stays until the
optimizer step. Walking back from the block's last op, at op k the block holds

    the entries ops 0..k saved              (not yet released)
  + the weight gradients of ops k..last     (made so far)
  + the 16-bit weight copies of the linear  (each matmul's backward node keeps its
    layers not yet walked back               copy and lets it go once it has run)
  + the gradients of op k's inputs          (as large, and of the same dtype, as
                                             what op k saved of them)
  + the gradient of op k's output           (as large as what the next op saved of
                                             its input, or in the full fine-tune saves:
                                             a frozen layer keeps no input, but the
                                             gradient through it has the input's size)
  + what op k's backward makes on the way   (transformers' RMSNorm is written as small
                                             ops: `real_step.backward_temporaries`)

and `backward_by_op` lists these, op by op. The rows are the block's saved entries in
forward order (`real_step`, as the recipes rewrite them). The gradient of an op's input
is read off what the op saved, which is exact for a matmul, a norm or an elementwise
op that keeps its input, an upper bound for attention (its saved output and per-row
statistics have no gradient beside Q, K, V) and short for dropout (its mask is one
byte an element). Under checkpointing the block is rebuilt first, so its rows are
alive when the walk starts (`framework_step`). Each term was confirmed on the CPU
allocator's memory events, tensor by tensor at the measured peak, of the steps
`tools/budget_sweep.py` draws (`--recompute full` and `none`, `--wide`).
"""
from __future__ import annotations

import itertools

from .kept import Saved
from .linears import BLOCK_LINEARS, targeted, width
from .real_step import backward_temporaries

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
    (and its adapters', `<layer>.lora_...`) at the op that saved its input, an adapted
    layer's at its adapter's op."""
    made = [0] * len(ops)
    mine = [(f".{t.name}", t.numel) for t in tensors if t.block == block]
    for linear in BLOCK_LINEARS[cfg.architecture]:
        adapter = f"lora {linear.name}"
        where = adapter if adapter in ops else input_op(linear, ops)
        if where is not None:
            made[ops.index(where)] += grad_bytes * sum(
                numel for name, numel in mine if f".{linear.name}." in name)
    return made


def _positions(cfg, names: list[str], base: list[str]) -> dict[str, float]:
    """Where each linear layer's backward runs in the walk, by layer name, as an index
    of `names`: at its adapter's op or at the op that saved its input; a layer that
    keeps no row (frozen, not adapted) runs between the op that made its input (read
    off the full fine-tune's ops `base`) and the op after it, at that op's index plus
    a half. A layer found nowhere runs before the walk (-1)."""
    found = {}
    for linear in BLOCK_LINEARS[cfg.architecture]:
        adapter = f"lora {linear.name}"
        reads = input_op(linear, base)
        made_by = (reads if reads == PROJECTION_INPUT
                   else base[base.index(reads) - 1] if reads else None)
        if adapter in names:
            found[linear.name] = names.index(adapter)
        elif linear.reads in names:
            found[linear.name] = names.index(linear.reads)
        elif made_by in names:
            found[linear.name] = names.index(made_by) + 0.5
        else:
            found[linear.name] = -1
    return found


def _copies(cfg, rows: list[Saved], positions: dict[str, float]) -> list[tuple[float, int]]:
    """(where in the walk, bytes) of each layer's 16-bit weight copies (the rows
    `WEIGHT_COPIES`, shared among the layers by their weights' sizes): a copy is kept by
    its matmul's backward node and goes when that node has run."""
    linears = BLOCK_LINEARS[cfg.architecture]
    adapted = {l.name for l in targeted(cfg)} if cfg.lora_rank else set()
    weights = {l.name: width(cfg, l.fan_in) * width(cfg, l.fan_out) for l in linears}
    adapters = {l.name: width(cfg, l.fan_in) + width(cfg, l.fan_out)
                for l in linears if l.name in adapted}
    found = []
    for x in rows:
        if x.op not in WEIGHT_COPIES:
            continue
        shares = adapters if x.op == "lora adapters" else weights
        total, names = sum(shares.values()), list(shares)
        if not total:  # no layer to place it at: kept through the walk
            found.append((-1, x.bytes))
            continue
        parts = [x.bytes * shares[name] // total for name in names]
        parts[-1] += x.bytes - sum(parts)  # what the division dropped: nothing is lost
        found += [(positions[name], part) for name, part in zip(names, parts)]
    return found


def output_gradients(base: list[Saved]) -> dict[str, int]:
    """The gradient of each op's output, by op: as large as what the next op of the full
    fine-tune's rows `base` saved of its input. A recipe that freezes a linear layer
    drops that layer's row, not the gradient through it (GPT-2's MLP projection under
    LoRA on c_attn: the GELU's output gradient is still B x T x 4h)."""
    ops = _ops(base)
    return {op: ops[k + 1][1] for k, (op, _) in enumerate(ops[:-1])}


def backward_by_op(cfg, rows: list[Saved], tensors, block: int, grad_bytes: int,
                   layers: tuple = (), rebuilt: bool = False,
                   base: list[Saved] = (), graph_gradients: tuple = ()) -> list[int]:
    """What block `block`'s backward holds beyond what was alive before it, at each of
    its ops, the last first: its saved rows not yet released, its weight gradients made
    so far and the gradients it is making (see the module's doc; the gradient of an
    op's output is at least what `output_gradients` reads off the full fine-tune's rows
    `base`). `layers`: (the op whose rows come before a layer that keeps no row, what
    its backward holds), each one more moment of the walk, where the rows of that op
    and those before it are still saved; when the block is `rebuilt` (checkpointing),
    a layer after the last op with rows runs its backward before anything asks for the
    rebuild: no row is alive yet. `graph_gradients`: (op, bytes) of gradients no
    optimizer holds, made by that op's backward (new tensors whatever `grad_bytes`)."""
    ops = _ops(rows)
    names, sizes = [op for op, _ in ops], [size for _, size in ops]
    copies = _copies(cfg, rows, _positions(cfg, names, [op for op, _ in _ops(base)]))

    def copies_kept(at: float) -> int:  # the copies of the layers not yet walked back
        return sum(size for where, size in copies if where <= at)
    made = weight_gradients_by_op(cfg, names, tensors, block, grad_bytes)
    for op, size in graph_gradients:
        if op in names:
            made[names.index(op)] += size
    saved_to = list(itertools.accumulate(sizes))                  # rows of ops 0..k
    made_from = list(itertools.accumulate(made[::-1]))[::-1] + [0]  # gradients of ops k..
    through = output_gradients(base)
    inputs = {}  # each op's first row in the full fine-tune: its input
    for x in base:
        inputs.setdefault(x.op, x.bytes)
    held = []
    for k in range(len(ops) - 1, -1, -1):
        output = max(sizes[k + 1] if k + 1 < len(ops) else 0, through.get(names[k], 0))
        chain = backward_temporaries(names[k]) * inputs.get(names[k], 0)
        held.append(copies_kept(k) + saved_to[k] + made_from[k] + sizes[k] + output + chain)
    for before, size in layers:
        if before not in names:
            continue
        k = names.index(before)
        if rebuilt and k == len(ops) - 1:
            held.append(size)
        else:
            held.append(copies_kept(k + 0.5) + saved_to[k] + made_from[k + 1] + size)
    return held
