"""ipywidgets front ends over pure `engine` functions.

Each widget lives in its own module and is imported on first use, so
`import widgets` stays fast and a notebook only pays for what it shows.
"""
import importlib

_WHERE = {
    "BudgetWidget": "widgets.budget",
    "draw_graph": "widgets.graph",
    "GraphView": "widgets.graph",
    "MemoryTimeline": "widgets.memory_timeline",
    "EpsSweep": "widgets.eps_sweep",
    "TrainerDashboard": "widgets.trainer",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'widgets' has no attribute {name!r}; "
                         f"available: {', '.join(sorted(_WHERE))}")
