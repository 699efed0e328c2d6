"""Pictures of a real framework's training step beside the budget (lesson 07).

Nothing is computed here: the measured bytes come from the measurement file, the
predictions from `engine.budget`'s public functions, and these functions only draw them.

* `plot_measured_steps`: per measured step, three bars: what was measured, what the
  budget predicts for that code, and what the textbook formula says.
* `plot_step_memory`: one strip of memory through a step, a stacked bar at each of the
  budget's moments (the end of the forward, the loss's backward, the optimizer step),
  the vocabulary-sized [B*N, V] tensors in their own colour, the measured bytes marked.
* `folded_table`: the numbers behind a picture, as an HTML section that stays closed
  until clicked (a plain `<details>`: JupyterLab, GitHub and nbconvert all show it, and
  its text form is one constant line, so nbval has nothing to compare).
"""
from __future__ import annotations

import html
import textwrap

BAR_COLORS = {"measured": "#333333", "budget (this code)": "#4c72b0",
              "textbook formula": "#bbbbbb"}
STRIP_COLORS = {"weights, gradients, optimizer": "#8c8c8c",
                "saved activations": "#4c72b0",
                "[B·N, V] tensors": "#c44e52"}
GB = 1e9


def plot_measured_steps(ax, names, measured, budget, formula, what="peak (step 2)"):
    """Grouped horizontal bars in GB: for each step (top to bottom, in `names`' order) the
    measured bytes, the budget's prediction and the textbook formula's."""
    import numpy as np
    y = np.arange(len(names))
    height = 0.27
    for k, (label, values) in enumerate((("measured", measured), ("budget (this code)", budget),
                                         ("textbook formula", formula))):
        ax.barh(y + (k - 1) * height, [v / GB for v in values], height,
                color=BAR_COLORS[label], label=label)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel(f"{what}, GB")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="lower right")


def vocabulary_sized(nbytes: int, n_tokens: int, vocab: int) -> bool:
    """Whether a tensor of `nbytes` is one [n_tokens, vocab] tensor in 2 or 4 bytes."""
    return nbytes in (2 * n_tokens * vocab, 4 * n_tokens * vocab)


#: The budget's step terms drawn grey: one buffer per parameter (weights, gradients,
#: optimizer state) and what the backward's last gradients and the optimizer's update add.
PARAMETER_TERMS = ("weights", "master weights", "gradients", "optimizer state",
                   "gradients of earlier micro-batches", "backward's last gradients",
                   "optimizer temporaries")


def moment_parts(moment, saved_items, saved_total: int, n_tokens: int, vocab: int) -> dict:
    """A budget moment's bytes in the strip's three parts. `saved_items` are the forward's
    saved tensors (the budget's activation items); when the moment holds all of them as
    one entry, the vocabulary-sized ones among them are counted as such (at the head's
    backward the gradient of the logits has taken the log_softmax output's place)."""
    parts = dict.fromkeys(STRIP_COLORS, 0)
    vocab_saved = sum(i.bytes for i in saved_items if vocabulary_sized(i.bytes // i.count,
                                                                       n_tokens, vocab))
    for alive in moment.terms:
        size = alive.bytes
        if alive.term == "saved by the forward":
            inside = vocab_saved if size == saved_total else 0
            parts["[B·N, V] tensors"] += inside
            parts["saved activations"] += size - inside
        elif vocabulary_sized(size, n_tokens, vocab):
            parts["[B·N, V] tensors"] += size
        elif alive.term in PARAMETER_TERMS:
            parts["weights, gradients, optimizer"] += size
        else:
            parts["saved activations"] += size
    return parts


def plot_step_memory(ax, result, n_tokens: int, vocab: int, measured: dict | None = None):
    """The strip: one stacked bar (GB) per moment of the budget's step, in order, with the
    [B*N, V] tensors in red and labelled; `measured` ({moment name: bytes}) adds a marker."""
    step = result.activations.step
    names, tops = [], []
    for x, moment in enumerate(step.moments):
        parts = moment_parts(moment, result.activations.items, result.activations.saved,
                             n_tokens, vocab)
        bottom = 0.0
        for part, size in parts.items():
            ax.bar(x, size / GB, 0.6, bottom=bottom, color=STRIP_COLORS[part],
                   label=part if x == 0 else None)
            if part == "[B·N, V] tensors" and size:
                ax.text(x, bottom + size / GB / 2, f"{size / GB:.1f} GB\n"
                        f"{size / (4 * n_tokens * vocab):g} x fp32\n[B·N, V]",
                        ha="center", va="center", color="white", fontsize=8)
            bottom += size / GB
        names.append(textwrap.fill(moment.name.replace("the ", "", 1), 12))
        tops.append(bottom)
        if measured and moment.name in measured:
            ax.plot([x - 0.3, x + 0.3], [measured[moment.name] / GB] * 2, color="k", lw=2,
                    label="measured" if not any(t.get_label() == "measured"
                                                for t in ax.lines) else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("bytes alive, GB")
    ax.set_ylim(0, max(tops) * 1.35)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9, ncols=2)


def folded_table(title: str, header, rows):
    """An HTML table inside a closed <details> section titled `title`."""
    from IPython.display import HTML
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return HTML(f"<details><summary>{html.escape(title)}</summary>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></details>")
