"""The budget's "measure" refuses a shape whose tables would not fit before it allocates
any of them: the position table, the token table and every weight, not only the
activations and the FLOPs."""
import pytest

from engine import budget as B
from engine import gpt_config
from engine.budget.measure import MEASURE_MAX_WEIGHT_BYTES
from widgets.budget import BudgetWidget


def _no_allocation(*args, **kwargs):
    raise AssertionError("measure allocated the model's tables for a shape it must refuse")


@pytest.mark.parametrize("changes", [{"block_size": 10**7}, {"block_size": 2 * 10**6},
                                     {"vocab_size": 10**7}])
def test_measure_refuses_huge_tables_before_allocating_them(changes, monkeypatch):
    monkeypatch.setattr(gpt_config, "init_params", _no_allocation)
    cfg = B.preset("tiny", **changes)
    with pytest.raises(B.BudgetError, match="too large to measure .* of fp32 weights"):
        B.measure(cfg)


def test_the_widget_s_measure_says_why_a_huge_position_table_is_not_measured(monkeypatch):
    monkeypatch.setattr(gpt_config, "init_params", _no_allocation)
    w = BudgetWidget(preset="tiny", plots=False, block_size=10**7)
    w.measure()
    assert "too large to measure" in w.measure_result.value
    assert "10,000,000 positions" in w.measure_result.value and w.measured is None


def test_a_shape_within_the_bounds_is_still_measured():
    m = B.measure(B.preset("tiny", micro_batch=1, seq_len=16, block_size=4096, n_layer=1))
    assert m["measured_weights"] == m["predicted_weights"] <= MEASURE_MAX_WEIGHT_BYTES
