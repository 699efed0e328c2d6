"""Drawing expression graphs of scalar values, before and after backward.

* `draw_graph(root)` returns a matplotlib figure of the graph that produced
  `root`: one box per value (its name, its value, its gradient) and one circle
  per operation, inputs on the left, the output on the right. Pure matplotlib:
  no graphviz binary is needed.
* `GraphView(root)` is an ipywidgets view of the same picture with a slider
  over the backward pass: step 0 is the graph before backward, each further
  step visits one node in reverse topological order, the last step is the
  graph after backward. Each edge a visited node has sent its gradient along
  is labelled with what it sent: the node's gradient times its local
  derivative for that input (`engine.scalar.LOCAL_GRADIENTS`).

Both work on any node that looks like `engine.scalar.Value`: a number in
`.data`, a gradient in `.grad`, its inputs in `.inputs` (or `.parents`), the
name of the operation that made it in `.op`, and optionally a `.label`. The
scalar engine a learner writes in lesson 02 has the same shape (with
`.parents`), so its graphs draw too.

The widget computes no gradients itself: it calls the node's own backward
(`root.backward()` unless told otherwise) and only reads the recorded values.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from engine.scalar import LOCAL_GRADIENTS

PARENT_ATTRIBUTES = ("inputs", "parents", "_prev")
OP_ATTRIBUTES = ("op", "_op")
OP_SYMBOLS = {"*": "×", "+": "+", "-": "−", "/": "÷", "neg": "−x", "**": "x^p",
              "square": "x²", "relu": "relu", "tanh": "tanh", "exp": "exp", "log": "log"}

BOX_W, BOX_H, OP_R = 1.55, 0.62, 0.24
XSTEP = 2.7  # distance between a value column and the next one
COLOR_BOX, COLOR_OP, COLOR_NOW, COLOR_DONE = "#e8f0fb", "#fdf1d8", "#ffd166", "#d7f2dd"
COLOR_EDGE_GRAD = "#1b7a3a"


# ---------------------------------------------------------------- reading a graph
def parents_of(node) -> tuple:
    """The inputs of `node`, in a stable order (empty for a leaf)."""
    for attr in PARENT_ATTRIBUTES:
        if hasattr(node, attr):
            value = getattr(node, attr)
            if value is None:
                return ()
            items = list(value)
            if isinstance(value, (set, frozenset)):
                items.sort(key=_creation_key)  # sets have no order; keep drawings stable
            return tuple(items)
    raise TypeError(
        f"draw_graph cannot find the inputs of {type(node).__name__}: it looks for one of "
        f"the attributes {', '.join(PARENT_ATTRIBUTES)}. Give your node class one of them "
        f"(a tuple of the nodes it was computed from).")


def _creation_key(node):
    return getattr(node, "_id", None) or getattr(node, "id", None) or id(node)


def op_of(node) -> str:
    """The name of the operation that produced `node` ('' for a leaf)."""
    for attr in OP_ATTRIBUTES:
        if hasattr(node, attr):
            return str(getattr(node, attr) or "")
    return ""


def symbol_of(node) -> str:
    """What the circle of the operation that made `node` shows."""
    op = op_of(node)
    exponent = getattr(node, "exponent", None)
    if op == "**" and exponent is not None:
        return "x²" if exponent == 2 else f"x^{exponent:g}"
    return OP_SYMBOLS.get(op, op or "?")


def local_derivatives(node):
    """d node / d each input, from the engine's table, or None for an op it does not
    know. Lesson 02's own nodes name x² "square" (engine.scalar writes `** 2`)."""
    ps = parents_of(node)
    op = op_of(node)
    if op == "square" and len(ps) == 1:
        return (2.0 * _value(ps[0]),)
    rule = LOCAL_GRADIENTS.get(op)
    if rule is None:
        return None
    try:
        return tuple(float(d) for d in rule(node, *ps))
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None


def topological_order(root) -> list:
    """Every node `root` depends on, each after all of its inputs, `root` last."""
    order, seen = [], set()
    stack = [(root, False)]
    while stack:  # iterative depth-first search: deep graphs do not hit the recursion limit
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for p in reversed(parents_of(node)):
            if id(p) not in seen:
                stack.append((p, False))
    return order


def _value(node) -> float:
    return float(getattr(node, "data"))


def _grad(node):
    g = getattr(node, "grad", None)
    return None if g is None else float(g)


def fmt(v) -> str:
    """A short, stable rendering of a number for a box."""
    if v is None:
        return "–"
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.4g}"


# ---------------------------------------------------------------- layout
@dataclass
class Layout:
    """Where each value box and each operation circle goes."""
    nodes: list                       # topological order
    boxes: dict = field(default_factory=dict)   # id(node) -> (x, y) of its value box
    ops: dict = field(default_factory=dict)     # id(node) -> (x, y) of the op that made it
    width: float = 1.0
    height: float = 1.0


def layout(root) -> Layout:
    """Columns by depth (inputs left, output right), rows by the parents' mean height."""
    nodes = topological_order(root)
    depth: dict[int, int] = {}
    for n in nodes:
        ps = parents_of(n)
        depth[id(n)] = 1 + max(depth[id(p)] for p in ps) if ps else 0
    # a leaf sits just left of its first consumer, not far away at the left edge
    consumers: dict[int, list] = {}
    for n in nodes:
        for p in parents_of(n):
            consumers.setdefault(id(p), []).append(n)
    for n in nodes:
        if not parents_of(n) and id(n) in consumers:
            depth[id(n)] = min(depth[id(c)] for c in consumers[id(n)]) - 1
    columns: dict[int, list] = {}
    for n in nodes:
        columns.setdefault(depth[id(n)], []).append(n)
    out = Layout(nodes=nodes)
    row: dict[int, float] = {}
    for d in sorted(columns):
        col = columns[d]
        if d > min(columns):
            col.sort(key=lambda n: _mean_row(n, row))
        for i, n in enumerate(col):
            row[id(n)] = i - (len(col) - 1) / 2
    xstep = XSTEP
    for n in nodes:
        x = depth[id(n)] * xstep
        out.boxes[id(n)] = (x, -row[id(n)] * 1.25)
        if parents_of(n):
            out.ops[id(n)] = (x - xstep / 2, -row[id(n)] * 1.25)
    xs = [p[0] for p in out.boxes.values()] + [p[0] for p in out.ops.values()]
    ys = [p[1] for p in out.boxes.values()]
    out.width = max(xs) - min(xs) + BOX_W + 0.4
    out.height = max(ys) - min(ys) + BOX_H + 0.6
    return out


def _mean_row(n, row) -> float:
    rows = [row[id(p)] for p in parents_of(n) if id(p) in row]
    return sum(rows) / len(rows) if rows else 0.0


# ---------------------------------------------------------------- drawing
def draw_graph(root, names=None, grads=None, highlight=None, title=None, ax=None,
               show_grad=True, edge_grads=None):
    """Draw the expression graph that produced `root`; return the matplotlib figure.

    names:     {"w": w, ...} labels for some nodes (the others show only numbers).
    grads:     {id(node): value or None} to show instead of each node's `.grad`
               (None shows a dash: "not computed yet"). GraphView uses it.
    highlight: nodes drawn in a warm colour (the node being visited).
    show_grad: False draws values only.
    edge_grads: {(id(node), i): value} the gradient sent back along the edge from
               input i of `node` (drawn in green on that edge). GraphView uses it.
    """
    lay = layout(root)
    label = {id(n): n.label for n in lay.nodes if getattr(n, "label", "")}
    label.update({id(node): name for name, node in (names or {}).items()})
    marked = {id(n) for n in (highlight or ())}
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(2.0 + 1.1 * lay.width, 16),
                                        min(1.0 + 0.9 * lay.height, 10)))
    else:
        fig = ax.figure

    def box_text(n):
        head = label.get(id(n))
        value = f"{head} = {fmt(_value(n))}" if head else fmt(_value(n))
        if not show_grad:
            return value
        g = grads.get(id(n)) if grads is not None else _grad(n)
        return f"{value}\ngrad {fmt(g)}"

    for n in lay.nodes:  # edges first, so the shapes sit on top of them
        bx, by = lay.boxes[id(n)]
        if id(n) in lay.ops:
            ox, oy = lay.ops[id(n)]
            _arrow(ax, (ox + OP_R, oy), (bx - BOX_W / 2, by))
            ps = parents_of(n)
            for i, p in enumerate(ps):
                px, py = lay.boxes[id(p)]
                twins = [q for q in ps if q is p]
                rad = 0.0
                if len(twins) > 1:  # x * x: one arrow per use, bent apart
                    rad = 0.35 if ps.index(p) == i else -0.35
                elif ox - px > XSTEP and abs(oy - py) < BOX_H:  # would cross other shapes
                    rad = -0.4
                _arrow(ax, (px + BOX_W / 2, py), (ox - OP_R, oy), rad)
                sent = (edge_grads or {}).get((id(n), i))
                if sent is not None:
                    mx, my = (px + BOX_W / 2 + ox - OP_R) / 2, (py + oy) / 2
                    if rad:  # on the bent arrow, not between the two
                        my -= rad * (ox - px) / 2
                    ax.text(mx, my + 0.12, f"← {fmt(sent)}", ha="center", va="bottom",
                            fontsize=8, color=COLOR_EDGE_GRAD, zorder=5, family="monospace",
                            bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.5))
    for n in lay.nodes:
        bx, by = lay.boxes[id(n)]
        face = COLOR_NOW if id(n) in marked else COLOR_BOX
        ax.add_patch(FancyBboxPatch((bx - BOX_W / 2, by - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc=face, ec="#33518a", lw=1.2, zorder=3))
        ax.text(bx, by, box_text(n), ha="center", va="center", fontsize=9, zorder=4,
                family="monospace")
        if id(n) in lay.ops:
            ox, oy = lay.ops[id(n)]
            ax.add_patch(Circle((ox, oy), OP_R, fc=COLOR_OP, ec="#a0741b", lw=1.2, zorder=3))
            symbol = symbol_of(n)
            ax.text(ox, oy, symbol, ha="center", va="center", zorder=4,
                    fontsize=10 if len(symbol) <= 2 else 7)
    xs = [p[0] for p in lay.boxes.values()]
    ys = [p[1] for p in lay.boxes.values()]
    ax.set_xlim(min(xs) - BOX_W / 2 - 0.2, max(xs) + BOX_W / 2 + 0.2)
    ax.set_ylim(min(ys) - BOX_H / 2 - 0.7, max(ys) + BOX_H / 2 + 0.7)  # room for bent arrows
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def _arrow(ax, start, end, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10,
                                 color="#7a7a7a", lw=1.0, zorder=1, shrinkA=0, shrinkB=0,
                                 connectionstyle=f"arc3,rad={rad}"))


# ---------------------------------------------------------------- the widget
class GraphView:
    """The graph of `root` with a slider over its backward pass.

    Step 0 shows the graph before backward; step k shows it after the first k
    nodes of the reverse topological order have been visited (a visited node's
    gradient is complete: everything downstream of it has sent its share);
    the last step shows the graph after backward. `backward(root)` defaults to
    `root.backward()` and runs once, when the view is made. Build the view from
    a graph whose backward has not run yet, or the "before" picture shows the
    gradients of the earlier run.
    """

    def __init__(self, root, names=None, backward=None, title="backward pass"):
        import ipywidgets as w

        from widgets._figures import PreviewVBox
        self.root, self.names, self.title = root, dict(names or {}), title
        self.order = list(reversed(topological_order(root)))  # the visiting order
        self.before = {id(n): _grad(n) for n in self.order}
        (backward or (lambda r: r.backward()))(root)
        self.after = {id(n): _grad(n) for n in self.order}
        self._name = {id(n): n.label for n in self.order if getattr(n, "label", "")}
        self._name.update({id(node): name for name, node in self.names.items()})

        self.step = w.IntSlider(value=0, min=0, max=len(self.order), step=1,
                                description="step", continuous_update=True)
        self.before_button = w.Button(description="before backward")
        self.after_button = w.Button(description="after backward")
        self.label = w.Label()
        self.plot = w.Output()
        self.fig = None
        self.png = b""
        self.step.observe(self._update, names="value")
        self.before_button.on_click(lambda _: setattr(self.step, "value", 0))
        self.after_button.on_click(lambda _: setattr(self.step, "value", self.step.max))
        self._update()
        # every step's picture has the same size: hold the cell at it while pictures change
        self.plot.layout = w.Layout(min_height=f"{_png_height(self.png) + 8}px")
        self.ui = PreviewVBox([w.HBox([self.before_button, self.step, self.after_button]),
                               self.label, self.plot], preview=lambda: self.png)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.ui)

    # what each step shows ------------------------------------------------
    def grads_at(self, k: int) -> dict:
        """{id(node): gradient shown} after the first k nodes were visited."""
        if k == 0:
            return dict(self.before)
        visited = {id(n) for n in self.order[:k]}
        return {i: (self.after[i] if i in visited else None) for i in self.after}

    def edge_grads_at(self, k: int) -> dict:
        """{(id(node), i): gradient sent to input i} for the first k visited nodes."""
        sent = {}
        for node in self.order[:k]:
            local = local_derivatives(node)
            grad = self.after[id(node)]
            if local is None or grad is None:
                continue
            for i, d in enumerate(local):
                sent[(id(node), i)] = d * grad
        return sent

    def describe(self, k: int) -> str:
        if k == 0:
            return (f"Before backward: the forward pass is done, every grad is still "
                    f"{fmt(self.before[id(self.root)])}. {len(self.order)} nodes to visit.")
        node = self.order[k - 1]
        name = self._display_name(node)
        g = fmt(self.after[id(node)])
        if k == 1:
            text = f"Step 1 of {len(self.order)}: the seed, d{name}/d{name} = {g}."
        else:
            text = f"Step {k} of {len(self.order)}: {name} has its complete gradient {g}."
        ps = parents_of(node)
        if ps:
            shown = ", ".join(self._display_name(p) for p in ps)
            text += f" It sends grad × the local derivative of '{symbol_of(node)}' to {shown}"
            local = local_derivatives(node)
            if local is not None and self.after[id(node)] is not None:
                sent = ", ".join(fmt(d * self.after[id(node)]) for d in local)
                text += f": {sent} (green on the edges)"
            text += "."
        else:
            text += " A leaf: nothing to pass on."
        if k == len(self.order):
            text += " Backward is done."
        return text

    def _display_name(self, node) -> str:
        if id(node) in self._name:
            return self._name[id(node)]
        op = symbol_of(node) if op_of(node) else ""
        return f"({op} = {fmt(_value(node))})" if op else f"({fmt(_value(node))})"

    def make_figure(self):
        k = self.step.value
        now = [self.order[k - 1]] if k else []
        return draw_graph(self.root, names=self.names, grads=self.grads_at(k),
                          highlight=now, title=f"{self.title}: step {k} of {len(self.order)}",
                          edge_grads=self.edge_grads_at(k))

    def _update(self, change=None):
        self.label.value = self.describe(self.step.value)
        if self.fig is not None:
            plt.close(self.fig)
        self.fig = self.make_figure()
        # Render the PNG here rather than leave it to the notebook's display hooks, so the
        # picture is the same in a kernel, in a test and in a script; replace the picture
        # in one model update, so the cell never collapses between two pictures.
        self.png = png_image(self.fig).data
        self.plot.outputs = ({"output_type": "display_data", "metadata": {},
                              "data": {"image/png": base64.b64encode(self.png).decode("ascii"),
                                       "text/plain": "<graph picture>"}},)
        plt.close(self.fig)  # the Output keeps the picture; no second copy at cell end


def _png_height(png: bytes) -> int:
    return int.from_bytes(png[20:24], "big")  # the IHDR chunk: width, then height


def png_image(fig):
    """The figure as an IPython Image (PNG bytes)."""
    from IPython.display import Image
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return Image(data=buffer.getvalue(), format="png")
