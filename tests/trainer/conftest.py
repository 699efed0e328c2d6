"""Fixtures the trainer's kernel tests share."""
from __future__ import annotations

import pytest


@pytest.fixture(params=["one thread: heads one by one", "threads: heads in parallel"])
def attention_build(request, monkeypatch):
    """Run an attention test once on each build of the standard and flash
    kernels, whatever this machine's thread count (see kernels/attention.py)."""
    from engine.trainer.kernels import threads
    one_thread = request.param.startswith("one thread")
    monkeypatch.setattr(threads, "single_threaded", lambda: one_thread)
    return request.param
