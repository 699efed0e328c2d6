"""The step's buffers carved from one block of memory, on huge pages where Linux gives them."""
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.gpt_config import GPTConfig
from engine.trainer import arena
from engine.trainer.model import FusedGPT, StepBuffers
from engine.trainer.optim import AdamW

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode():
    """The kernel's transparent huge page mode ("always", "madvise", "never"), or None."""
    if not sys.platform.startswith("linux") or not THP_SETTING.exists():
        return None
    text = THP_SETTING.read_text()
    return text[text.index("[") + 1:text.index("]")]


def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (Linux smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start <= address < stop
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping of this process holds address {address:#x}")


def _arrays(buffers: StepBuffers) -> list[np.ndarray]:
    found = [v for v in vars(buffers).values() if isinstance(v, np.ndarray)]
    for layer in buffers.layer_sets:
        found += [v for v in vars(layer).values() if isinstance(v, np.ndarray)]
    return found


CFG = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)


def test_carve_hands_out_zeroed_disjoint_arrays_each_on_a_cache_line():
    calls = []

    def build(zeros):
        calls.append(zeros)
        return [zeros(3, 5), zeros(7), zeros(0, 4), zeros(2, 2, 9)]

    arrays = arena.carve(build, np.float32)
    assert len(calls) == 2                                  # measured, then carved
    assert [a.shape for a in arrays] == [(3, 5), (7,), (0, 4), (2, 2, 9)]
    for a in arrays:
        assert a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % arena.LINE == 0
        assert not a.any()
    for i, a in enumerate(arrays):                          # writing one leaves the others
        a[...] = i + 1
    for i, a in enumerate(arrays):
        assert (a == i + 1).all()


def test_step_buffers_lie_in_one_block_and_keep_their_shapes():
    loose = StepBuffers.__new__(StepBuffers)                 # the same layout, array by array
    loose._allocate(lambda *shape: np.zeros(shape, np.float32), CFG, 4, 64, np.float32,
                    False, "standard")
    carved = StepBuffers(CFG, 4, 64, np.float32, False)
    got, want = _arrays(carved), _arrays(loose)
    assert [a.shape for a in got] == [a.shape for a in want]
    assert carved.saved_nbytes() == loose.saved_nbytes()
    starts = [a.ctypes.data for a in got]
    ends = [a.ctypes.data + a.nbytes for a in got]
    assert max(ends) - min(starts) <= sum(a.nbytes + arena.LINE for a in got)
    assert all(not a.any() for a in got)


@pytest.mark.skipif(_thp_mode() in (None, "never"),
                    reason="no transparent huge pages here (not Linux, or the kernel's "
                           "transparent_hugepage setting is 'never'): nothing to ask for")
def test_a_models_buffers_are_advised_for_huge_pages():
    cfg = GPTConfig(vocab_size=65, block_size=128, n_layer=4, n_head=4, n_embd=128)
    model = FusedGPT(cfg, 2)                  # 0.8 M parameters: 3.2 MB for each flat buffer
    opt = AdamW(model.params.flat, [(0, model.params.flat.size, True)])
    for array in (model.acts.res, model.params.flat, model.grads.flat, opt.m, opt.v):
        assert "hg" in _mapping_flags(array.ctypes.data), array.shape
        assert array.ctypes.data % arena.HUGE_PAGE == 0


def test_under_one_huge_page_no_mapping_is_made(monkeypatch):
    """A buffer under 2 MiB is plain np.zeros (a whole huge page for a few KiB would
    waste memory); from 2 MiB on, the arena maps its own memory."""
    def no_mapping(*args, **kwargs):
        raise AssertionError("the arena mapped memory")
    monkeypatch.setattr(arena.mmap, "mmap", no_mapping)
    small = arena.zeros(1000, np.float32)
    assert small.shape == (1000,) and not small.any() and small.ctypes.data % arena.LINE == 0
    with pytest.raises(AssertionError, match="mapped memory"):
        arena.zeros(arena.HUGE_PAGE // 4, np.float32)
