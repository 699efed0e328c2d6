"""The budget's "measure" refuses a shape whose tables would not fit before it allocates
any of them: the position table, the token table and every weight, not only the
activations and the FLOPs."""
import pytest

from engine import budget as B
from engine.budget import lab
from engine import gpt_config
from engine.budget.lab.measure import MEASURE_MAX_WEIGHT_BYTES
from widgets.budget import BudgetWidget


def _no_allocation(*args, **kwargs):
    raise AssertionError("measure allocated the model's tables for a shape it must refuse")


@pytest.mark.parametrize("changes", [{"block_size": 10**7}, {"block_size": 2 * 10**6},
                                     {"vocab_size": 10**7}])
def test_measure_refuses_huge_tables_before_allocating_them(changes, monkeypatch):
    monkeypatch.setattr(gpt_config, "init_params", _no_allocation)
    cfg = B.preset("tiny", **changes)
    with pytest.raises(B.BudgetError, match="too large to measure .* of fp32 weights"):
        lab.measure(cfg)


def test_the_widget_s_measure_says_why_a_huge_position_table_is_not_measured(monkeypatch):
    monkeypatch.setattr(gpt_config, "init_params", _no_allocation)
    w = BudgetWidget(preset="tiny", plots=False, block_size=10**7)
    w.measure()
    assert "too large to measure" in w.measure_result.value
    assert "10,000,000 positions" in w.measure_result.value and w.measured is None


def test_a_shape_within_the_bounds_is_still_measured():
    m = lab.measure(B.preset("tiny", micro_batch=1, seq_len=16, block_size=4096, n_layer=1))
    assert m["measured_weights"] == m["predicted_weights"] <= MEASURE_MAX_WEIGHT_BYTES


# ------------------------------------ `--measure torch`: the step predicted, if it fits
torch = pytest.importorskip("torch")
from engine.budget.lab import torch_step  # noqa: E402
from engine.budget.cli import main  # noqa: E402


@pytest.fixture
def builds(monkeypatch):
    """The devices measure_step built a model on ('meta' costs no memory)."""
    seen, build = [], torch_step._build

    def recording(cfg):
        seen.append(str(torch.empty(0).device))
        return build(cfg)
    monkeypatch.setattr(torch_step, "_build", recording)
    return seen


def test_an_untied_plain_step_builds_and_measures_an_untied_model(builds):
    cfg = B.preset("tiny", activation_model="pytorch", tied_embedding=False, n_layer=1,
                   micro_batch=1, seq_len=16, optimizer_impl="for-loop")
    m = torch_step.measure_step(cfg, device="cpu")
    assert m.weights == B.fixed_bytes(m.config)["weights"]      # the head's table counted
    assert builds == ["meta", "cpu"]


def test_a_llama_config_s_own_head_dim_is_the_one_built():
    pytest.importorskip("transformers")
    cfg = B.config_from_hf({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64,
                            "num_attention_heads": 4, "num_key_value_heads": 2,
                            "head_dim": 32, "intermediate_size": 128, "vocab_size": 100,
                            "max_position_embeddings": 64}, activation_model="hf",
                           micro_batch=1, seq_len=16)
    assert cfg.head_dim == 32 != cfg.d_model // cfg.n_head
    torch_step._same_shape_as_predicted(cfg)                    # no BudgetError


def test_a_model_of_another_shape_than_predicted_is_refused_before_it_is_built(
        builds, monkeypatch):
    from engine.budget import counts
    cfg = B.preset("tiny", activation_model="pytorch", micro_batch=1, seq_len=16)
    real = counts.parameter_count(cfg)
    monkeypatch.setattr(counts, "parameter_count", lambda c: real + 1)
    with pytest.raises(B.BudgetError, match=f"would build a model of {real:,} parameters, "
                                            f"but the budget counts {real + 1:,}"):
        torch_step.measure_step(cfg, device="cpu")
    assert builds == ["meta"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_step_that_does_not_fit_is_refused_before_anything_is_allocated(
        builds, monkeypatch, device):
    monkeypatch.setattr(torch_step, "available_memory", lambda d: (1 << 20, f"{d}'s test"))
    cfg = B.preset("tiny", activation_model="pytorch", micro_batch=1, seq_len=16)
    with pytest.raises(B.BudgetError) as refused:
        torch_step.measure_step(cfg, device=device)
    said = str(refused.value)
    assert f"predicted to need" in said and f"{device}'s test is 1.05 MB" in said, said
    assert "Nothing was allocated" in said and "vocab_size=" in said, said
    assert builds == ["meta"]


def test_the_gpu_s_free_memory_is_what_a_cuda_step_is_compared_with(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (3 << 30, 80 << 30))
    assert torch_step.available_memory("cuda") == (
        3 << 30, "the GPU's free memory (torch.cuda.mem_get_info)")
    have, where = torch_step.available_memory("cpu")
    assert have > 0 and "available memory" in where


@pytest.mark.parametrize("argv", [
    ["--preset", "tiny", "--activations", "pytorch", "--vocab", "16777216", "--width", "65536"],
    ["--preset", "tiny", "--activations", "pytorch", "--positions", "16777216",
     "--width", "65536"],
    ["--preset", "tiny", "--activations", "pytorch", "--width", "65536", "--heads", "4"],
    ["--preset", "llama2-70b", "--activations", "hf"],
], ids=["vocab", "positions", "width", "llama2-70b"])
def test_the_cli_refuses_a_shape_too_large_for_the_memory_in_one_line(
        builds, capsys, monkeypatch, argv):
    if "hf" in argv:
        pytest.importorskip("transformers")
    monkeypatch.setattr(torch_step, "available_memory", lambda d: (64 << 30, "this test's"))
    assert main(argv + ["--measure", "torch"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: --measure torch would run a step predicted to need"), err
    assert "but this test's is 68.7 GB. Nothing was allocated." in err, err
    assert "lower --vocab " in err and "--width " in err and "--positions " in err, err
    assert builds == ["meta"]
