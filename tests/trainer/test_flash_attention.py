"""The flash attention kernel, in both builds (one (batch, head) pair after
another on one thread, the pairs in parallel), equals the textbook attention (float64, 1e-10 relative),
passes a central-difference check, keeps O(T) numbers per head, and gives a
FusedGPT the same gradients as the standard kernel."""
from __future__ import annotations

import numpy as np
import pytest

import engine.trainer.kernels as F
from engine.gpt_config import GPTConfig, init_params
from engine.trainer.model import FusedGPT
from . import reference as ref

RTOL = 1e-10


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.fixture
def rng():
    return np.random.default_rng(17)


# odd T, T not a multiple of a vector (16 float32), T of one and of several vectors,
# one head, head size 1, and T = 150: query-row blocks of 32 (four) and 22
SHAPES = [(2, 7, 2, 6), (1, 33, 3, 12), (2, 16, 4, 8), (1, 37, 1, 5),
          (2, 19, 3, 3), (1, 1, 1, 1), (1, 48, 2, 40), (1, 150, 2, 8)]


@pytest.mark.parametrize("B,T,H,C", SHAPES)
def test_flash_forward_equals_reference_and_saves_the_row_logsumexp(rng, attention_build,
                                                                   B, T, H, C):
    qkv = rng.standard_normal((B, T, 3 * C)) * 2
    out, lse = F.flash_attention_forward(qkv, H)
    want, _ = ref.attention(qkv, H)
    assert rel(out, want) < RTOL
    q, k, _ = ref.split_heads(qkv, H)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C // H)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    top = s.max(-1)
    want_lse = top + np.log(np.exp(s - top[..., None]).sum(-1))
    assert lse.shape == (B, H, T) and rel(lse, want_lse) < RTOL


@pytest.mark.parametrize("B,T,H,C", SHAPES)
def test_flash_backward_equals_reference_and_passes_gradcheck(rng, attention_build,
                                                              B, T, H, C):
    qkv = rng.standard_normal((B, T, 3 * C))
    out, lse = F.flash_attention_forward(qkv, H)
    dout = rng.standard_normal(out.shape)
    dqkv = F.flash_attention_backward(dout, qkv, out, lse)
    assert rel(dqkv, ref.attention_grad(dout, qkv, H)) < RTOL
    loss = lambda z: float((F.flash_attention_forward(z, H)[0] * dout).sum())  # noqa: E731
    assert ref.directional_check(loss, qkv, dqkv, rng) < 1e-6


def test_flash_survives_large_scores(rng, attention_build):
    """The running maximum keeps exp from overflowing where a naive softmax would."""
    qkv = rng.standard_normal((1, 40, 3 * 8)) * 30
    out, lse = F.flash_attention_forward(qkv, 2)
    assert np.all(np.isfinite(out)) and rel(out, ref.attention(qkv, 2)[0]) < RTOL


def test_float32_flash_matches_the_standard_kernel(rng, attention_build):
    qkv = rng.standard_normal((2, 45, 3 * 32)).astype(np.float32)
    dout = rng.standard_normal((2, 45, 32)).astype(np.float32)
    out, probs = F.attention_forward(qkv, 4)
    fout, lse = F.flash_attention_forward(qkv, 4)
    assert fout.dtype == np.float32 and lse.dtype == np.float32
    assert rel(fout, out) < 1e-5
    assert rel(F.flash_attention_backward(dout, qkv, fout, lse),
               F.attention_backward(dout, qkv, probs)) < 1e-5


def test_saved_statistic_is_linear_in_T(rng):
    for T in (16, 64):
        qkv = rng.standard_normal((1, T, 3 * 8)).astype(np.float32)
        _, probs = F.attention_forward(qkv, 2)
        _, lse = F.flash_attention_forward(qkv, 2)
        assert lse.nbytes == 2 * T * 4 and probs.nbytes == 2 * T * T * 4


def test_mismatched_shapes_are_named(rng):
    qkv = rng.standard_normal((1, 10, 12))
    out, lse = F.flash_attention_forward(qkv, 2)
    with pytest.raises(ValueError, match="lse"):
        F.flash_attention_backward(out, qkv, out, lse[:, :, :5])
    with pytest.raises(ValueError, match="divisible"):
        F.flash_attention_forward(qkv, 3)


# ------------------------------------------------------------------ in the model
CFG = GPTConfig(vocab_size=11, block_size=20, n_layer=2, n_head=2, n_embd=8)


def _grads(attention, dtype, checkpointing=False):
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 11, (3, 20)), rng.integers(0, 11, (3, 20))
    model = FusedGPT(CFG, 3, params=init_params(CFG, 0, dtype), dtype=dtype,
                     attention=attention, checkpointing=checkpointing)
    loss = model.forward(x, y)
    model.backward()
    return loss, model.grads.flat.copy(), model


def test_fused_gpt_with_flash_attention_has_the_standard_gradients():
    loss_std, g_std, m_std = _grads("standard", np.float64)
    loss_fl, g_fl, m_fl = _grads("flash", np.float64)
    assert abs(loss_fl - loss_std) < 1e-12 and rel(g_fl, g_std) < RTOL
    _, g_ck, _ = _grads("flash", np.float64, checkpointing=True)
    assert rel(g_ck, g_fl) < RTOL
    # what the two keep: (B, H, T, T) probabilities against (B, H, T) statistics
    B, H, T, L = 3, CFG.n_head, CFG.block_size, CFG.n_layer
    saved_gap = m_std.acts.saved_nbytes() - m_fl.acts.saved_nbytes()
    assert saved_gap == L * B * H * (T * T - T) * 8


def test_unknown_attention_kind_is_refused():
    with pytest.raises(ValueError, match="attention='fast'.*standard.*flash"):
        FusedGPT(CFG, 2, attention="fast")


# ------------------------------------------------------------ trainer and bench
def test_trainer_with_flash_attention_follows_the_standard_run():
    from engine import train as T
    from engine.trainer.data import Dataset, load_corpus
    data = Dataset.from_text(load_corpus()[:20_000])
    small = dict(n_layer=1, n_head=2, n_embd=16, block_size=24, batch_size=4, steps=3,
                 eval_every=3, eval_batches=1, threads=1, dtype="float64")
    runs = {kind: [r["loss"] for r in T.train(attention=kind, dataset=data, **small).history]
            for kind in ("standard", "flash")}
    assert np.allclose(runs["flash"], runs["standard"], rtol=1e-10, atol=0)


def test_train_cli_refuses_an_unknown_attention_kernel(capsys):
    from engine import train as T
    with pytest.raises(SystemExit):
        T.main(["--attention", "sparse", "--steps", "1"])
    assert "--attention" in capsys.readouterr().err


def test_bench_reports_activation_bytes_for_either_kernel(capsys):
    import json
    from engine import bench
    reports = {}
    for kind in ("standard", "flash"):
        assert bench.main(["--no-torch", "--steps", "1", "--warmup", "0", "--n-layer", "1",
                           "--n-embd", "16", "--n-head", "2", "--block-size", "32",
                           "--batch-size", "2", "--vocab-size", "12", "--json",
                           "--attention", kind]) == 0
        reports[kind] = json.loads(capsys.readouterr().out)
    std, fl = reports["standard"], reports["flash"]
    assert std["config"]["attention"] == "standard" and fl["config"]["attention"] == "flash"
    assert std["attention_saved_bytes"] == 2 * 2 * 32 * 32 * 4      # B H T T float32
    assert fl["attention_saved_bytes"] == 2 * 2 * 32 * 4            # B H T
    assert std["activation_bytes"] - fl["activation_bytes"] == 2 * 2 * (32 * 32 - 32) * 4
    assert "attention's share 0.5 KiB (flash kernel)" in bench.format_report(fl)


def test_attention_sweep_shows_quadratic_against_linear_bytes():
    from engine.trainer.lab.attention_sweep import format_sweep, sweep_attention
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    r = sweep_attention(cfg, (16, 32), tokens=32, repeats=1, threads=1)
    short, long_ = r["rows"]
    assert (short["B"], long_["B"]) == (2, 1)
    # same tokens per batch: the probabilities double with T, the statistics stay put
    kept = {kind: [row[kind]["attention_saved_bytes"] for row in r["rows"]]
            for kind in ("standard", "flash")}
    assert kept["standard"][1] == 2 * kept["standard"][0]
    assert kept["flash"][1] == kept["flash"][0]
    for row in r["rows"]:
        assert row["standard"]["ms"] > 0 and row["flash"]["ms"] > 0
        if "torch_sdpa" in row:
            assert row["torch_sdpa"]["activation_bytes"] > 0
    assert "flash" in format_sweep(r)


# ------------------------------------------------------------------ the budget
@pytest.mark.parametrize("attention", ["standard", "flash"])
@pytest.mark.parametrize("L, C, H, V, B, T, recompute", [
    (2, 8, 2, 11, 3, 20, "none"), (1, 12, 3, 7, 2, 33, "none"), (3, 8, 1, 5, 1, 48, "full")])
def test_budget_predicts_the_fused_trainers_saved_bytes(attention, L, C, H, V, B, T, recompute):
    from engine.budget import BudgetConfig
    from engine.budget.activations import fused_trainer_saved
    cfg = BudgetConfig(n_layer=L, d_model=C, n_head=H, vocab_size=V, micro_batch=B,
                       seq_len=T, recompute=recompute)
    predicted = sum(x.bytes for x in fused_trainer_saved(cfg, attention))
    model = FusedGPT(GPTConfig(V, T, L, H, C), B, attention=attention,
                     checkpointing=recompute == "full")
    assert predicted == model.acts.saved_nbytes()


def test_budget_attention_models_are_quadratic_and_linear_in_T():
    from engine.budget import BudgetConfig, BudgetError
    from engine.budget.activations import fused_attention_saved
    short, long_ = (BudgetConfig(n_layer=1, d_model=8, n_head=2, micro_batch=1, seq_len=T)
                    for T in (64, 128))
    assert fused_attention_saved(long_).bytes == 4 * fused_attention_saved(short).bytes
    assert (fused_attention_saved(long_, "flash").bytes
            == 2 * fused_attention_saved(short, "flash").bytes)
    with pytest.raises(BudgetError, match="not a kernel"):
        fused_attention_saved(short, "sparse")
