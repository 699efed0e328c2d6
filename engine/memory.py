"""Measure what the tape keeps for backward: per op, in total, and over time.

    with engine.memory.record() as mem:
        loss = model(ids, targets)
        loss.backward()
    print(mem.table())          # one line per saved tensor
    mem.saved_bytes, mem.peak_bytes, mem.timeline

Nothing here is estimated: the recorder watches the tape. When an op is
recorded it lists the arrays the op saved for its VJP (see the `save` calls
in engine/rules.py); when backward has run a node's VJP and freed its saved
arrays, the recorder frees them too.

How bytes are counted, so the numbers mean memory:

* An array is counted by the memory that owns it (numpy's base array), and
  each such buffer only once: when relu saves its output and the next
  matmul saves the same array, that is one buffer. A view (a slice, a
  reshape, a transpose) counts as the whole buffer it keeps alive.
* Saved buffers that belong to parameters (leaf tensors with
  requires_grad=True, such as a weight the matmul keeps for dx) are listed
  with kind "parameter" but are not activation memory: they exist anyway.
  `saved_bytes` and `peak_bytes` count activations only (inputs and
  intermediate results, integer ids and targets included).
* A buffer is live from the op that first saved it until backward has run
  every node that saved it, or until the graph is dropped without a
  backward (its nodes are garbage collected). `timeline` holds the live
  activation bytes after each recorded op (forward), after each node's VJP
  (backward) and after each dropped node that saved something ("dropped").
* The recorder keeps sizes and identities, never the arrays: a forward you
  drop frees its memory while you record.
"""
from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass

import numpy as np

from .tensor import TapeObserver, Tensor, add_observer, remove_observer, root_buffer


@dataclass
class SavedTensor:
    """One array an op saved for its backward."""
    node: int            # the node's number on the tape (in recording order)
    op: str              # the op's name, e.g. "matmul"
    scope: str           # the name_scope it ran in, e.g. "h0.attn" ("" if none)
    slot: str            # the name the rule saved it under, e.g. "xhat"
    tensor: str          # the tensor's name when it has one (parameters do), else ""
    shape: tuple
    dtype: str
    nbytes: int          # bytes of this array (a view's own size)
    counted_bytes: int   # bytes added to the total: the owning buffer, or 0 if already counted
    kind: str            # "activation" or "parameter"

    @property
    def where(self) -> str:
        return f"{self.scope}/{self.op}" if self.scope else self.op


@dataclass
class TimelinePoint:
    phase: str           # "forward", "backward" or "dropped"
    node: int
    label: str           # scope/op
    live_bytes: int      # activation bytes held by the tape after this step


class MemoryRecorder(TapeObserver):
    """Context manager that records the tape's saved tensors. Use `record()`."""

    def __init__(self):
        self.saved: list[SavedTensor] = []
        self.timeline: list[TimelinePoint] = [TimelinePoint("start", 0, "", 0)]
        # Only sizes, ids and weak references: holding a buffer would keep it alive.
        # An id stays valid while its buffer lives, and a saved buffer lives while
        # the node that saved it does, until `_node_dropped` forgets it.
        self._live: dict[int, list] = {}      # buffer id -> [nbytes, users, kind]
        self._param_buffers: dict[int, tuple] = {}  # id -> (weakref to buffer, name)
        self._node_buffers: dict[int, list[int]] = {}
        self._recording = False
        self.live_bytes = 0
        self.peak_bytes = 0

    # ------------------------------------------------------------ recording
    def __enter__(self):
        add_observer(self)
        self._recording = True
        return self

    def __exit__(self, *exc):
        self._recording = False
        remove_observer(self)

    def _parameter_name(self, buf: np.ndarray):
        """The parameter's name if buf is a parameter's buffer (None if not)."""
        entry = self._param_buffers.get(id(buf))
        return entry[1] if entry is not None and entry[0]() is buf else None

    def after_forward(self, op, inputs, result, recorded) -> None:
        if not recorded:
            return
        names = {}
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad and x.is_leaf:
                buf = root_buffer(x.data)
                self._param_buffers[id(buf)] = (weakref.ref(buf), x.name or "")
            if isinstance(x, Tensor) and x.name:
                names[id(x.data)] = x.name
        buffers = []
        for slot, value in op.saved_arrays():
            buf = root_buffer(value)
            key = id(buf)
            param_name = self._parameter_name(buf)
            kind = "activation" if param_name is None else "parameter"
            if key in self._live:
                self._live[key][1] += 1
                counted = 0
            else:
                self._live[key] = [buf.nbytes, 1, kind]
                counted = buf.nbytes
                if kind == "activation":
                    self.live_bytes += counted
            buffers.append(key)
            self.saved.append(SavedTensor(
                node=op.node_id, op=op.name, scope=op.scope, slot=slot,
                tensor=names.get(id(value)) or param_name or "",
                shape=tuple(value.shape),
                dtype=str(value.dtype), nbytes=int(value.nbytes), counted_bytes=int(counted),
                kind=kind))
        self._node_buffers[id(op)] = buffers
        # forget them if the graph is dropped without a backward
        weakref.finalize(op, self._node_dropped, id(op), op.node_id, _where(op)).atexit = False
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.timeline.append(TimelinePoint("forward", op.node_id, _where(op), self.live_bytes))

    def after_backward(self, op, g, grads, released: bool) -> None:
        if id(op) not in self._node_buffers:
            return  # recorded before this recorder started
        if released:
            self._let_go(self._node_buffers.pop(id(op)))
        self.timeline.append(TimelinePoint("backward", op.node_id, _where(op), self.live_bytes))

    def _node_dropped(self, op_id: int, node: int, label: str) -> None:
        """A node died before backward released it: its saved buffers are gone."""
        keys = self._node_buffers.pop(op_id, None)
        if keys is None:
            return  # backward released it already
        self._let_go(keys)
        if keys and self._recording:
            self.timeline.append(TimelinePoint("dropped", node, label, self.live_bytes))

    def _let_go(self, keys) -> None:
        for key in keys:
            entry = self._live[key]
            entry[1] -= 1
            if entry[1] == 0:
                if entry[2] == "activation":
                    self.live_bytes -= entry[0]
                del self._live[key]

    # -------------------------------------------------------------- results
    @property
    def saved_bytes(self) -> int:
        """Activation bytes the forward saved (each buffer once)."""
        return sum(s.counted_bytes for s in self.saved if s.kind == "activation")

    @property
    def parameter_bytes(self) -> int:
        """Bytes of parameter buffers the tape referenced (not activation memory)."""
        return sum(s.counted_bytes for s in self.saved if s.kind == "parameter")

    def table(self) -> str:
        """A readable listing: every saved tensor, then the totals."""
        lines = [f"{'node':>4}  {'op':<28} {'saved':<8} {'shape':<18} {'dtype':<8} "
                 f"{'bytes':>12}  note"]
        for s in self.saved:
            if s.kind == "parameter":
                note = f"parameter {s.tensor}".rstrip() + " (a weight, not counted)"
            elif s.counted_bytes == 0:
                note = "same buffer as an earlier entry"
            elif s.counted_bytes != s.nbytes:
                note = f"view of a {s.counted_bytes:,}-byte buffer"
            else:
                note = ""
            bytes_shown = s.counted_bytes if s.kind == "activation" else 0
            lines.append(f"{s.node:>4}  {s.where:<28} {s.slot:<8} {str(s.shape):<18} "
                         f"{s.dtype:<8} {bytes_shown:>12,}  {note}".rstrip())
        lines.append(f"activation bytes saved: {self.saved_bytes:,}   peak live: "
                     f"{self.peak_bytes:,}   parameters referenced: {self.parameter_bytes:,}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"saved": [asdict(s) | {"shape": list(s.shape)} for s in self.saved],
                "timeline": [asdict(p) for p in self.timeline],
                "saved_bytes": self.saved_bytes, "peak_bytes": self.peak_bytes,
                "parameter_bytes": self.parameter_bytes}


def _where(op) -> str:
    return f"{op.scope}/{op.name}" if getattr(op, "scope", "") else op.name


def record() -> MemoryRecorder:
    """A recorder to use as `with engine.memory.record() as mem: ...`."""
    return MemoryRecorder()
