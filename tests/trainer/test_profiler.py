"""The lab's KernelProfiler times a model's kernel calls from outside: the model
keeps its bits, and once the profiler is gone the model is as it was."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpt_config import init_params
from engine.trainer import model as G
from engine.trainer.lab.profile import KernelProfiler
from engine.trainer.parallel import ThreadReplicas

from .test_gpt_model import CFG, batch, grads_of


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_profiling_a_second_run_of_each_call_changes_no_bit(attention):
    """The benchmark's second timing of a call reruns every call, those that add
    into their outputs or overwrite an input too (on what the first run left,
    put back afterwards): the step's loss and gradients keep their bits, step
    after step."""
    params = init_params(CFG, seed=5)
    x, y = batch(6)
    plain = G.FusedGPT(CFG, 4, params=params, attention=attention)
    timed = G.FusedGPT(CFG, 4, params=params, attention=attention)
    x.setflags(write=False)                         # a batch nobody may write: left alone
    with KernelProfiler(timed, again=True) as prof:
        for _ in range(2):                          # the second step starts from the first's
            want_loss, want = grads_of(plain, x, y)
            loss, got = grads_of(timed, x, y)
            assert loss == want_loss
            assert all(np.array_equal(got[k], want[k]) for k in want)
    assert set(prof.again) == set(prof.seconds)     # every kernel ran again
    assert {"crossentropy_softmax", "bias_gelu_backward", "layernorm_backward", "bias_grad",
            "embedding_backward", f"{'flash_' if attention == 'flash' else ''}"
            "attention_backward"} <= set(prof.again)
    for name, (first, again) in prof.again.items():
        assert first == pytest.approx(prof.seconds[name]) and again > 0, name


def test_the_profiler_times_replica_zero_and_leaves_no_trace():
    """On ThreadReplicas it times the first replica's calls; afterwards no model
    carries anything of it (the plain registry call is back)."""
    replicas = ThreadReplicas(CFG, 4, 2)
    x, y = batch(1)
    with KernelProfiler(replicas) as prof:
        replicas.forward_backward(x, y)
    assert {"matmul", "layernorm_forward", "attention_backward"} <= set(prof.seconds)
    assert prof.again is None and all(s > 0 for s in prof.seconds.values())
    replicas.close()
    for m in replicas.replicas:
        assert "_k" not in vars(m)
        assert not any("profile" in name for name in vars(m))
