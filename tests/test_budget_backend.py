"""The backend a real step runs on (CUDA or the CPU) and what the loop keeps of the
model's output: the backend records (torch-free), the terms they change, and PyTorch
on this CPU measured against the backend-cpu prediction (skipped without torch or
transformers)."""
from __future__ import annotations

import dataclasses
import importlib.util

import re

import pytest

import engine.budget as bm
from engine.budget.backends import BACKENDS, backend
from engine.budget.real_step import (BACKWARD_END, FORWARD_END, OPTIMIZER_STEP, gpt2_block,
                                     kept_output_terms, outside_saved, outputs_kept,
                                     _attention)

FIELDS = {f.name for f in dataclasses.fields(bm.BudgetConfig)}


def config(**knobs) -> bm.BudgetConfig:
    """A config with the loop's knobs this checkout has (the for-loop optimizer, so
    the optimizer's own temporaries stay out of these comparisons)."""
    knobs = {"optimizer_impl": "for-loop", **knobs}
    return bm.BudgetConfig(**{k: v for k, v in knobs.items() if k in FIELDS}).validate()


SMALL = dict(n_layer=2, d_model=64, n_head=4, vocab_size=1000, micro_batch=2, seq_len=64)
OTHER = dict(n_layer=3, d_model=96, n_head=6, vocab_size=500, micro_batch=4, seq_len=32)
LLAMA = dict(architecture="llama", n_kv_head=2, tied_embedding=False)


# ------------------------------------------------------------- the records
def test_a_dropout_mask_is_a_bool_on_cuda_and_a_float_like_its_input_on_the_cpu():
    assert [backend("cuda").dropout_mask_bytes(b) for b in (2, 4)] == [1, 1]
    assert [backend("cpu").dropout_mask_bytes(b) for b in (2, 4)] == [2, 4]


def test_only_the_cpu_takes_sdpas_math_path_and_only_with_dropout():
    assert backend("cpu").sdpa_math(dropout=True)
    assert not backend("cpu").sdpa_math(dropout=False)
    assert not backend("cuda").sdpa_math(dropout=True)
    assert backend("cpu").math_bytes == 4  # the math path upcasts 16-bit inputs


@pytest.mark.parametrize("op", ["layer_norm", "softmax", "log_softmax", "pow", "exp", "rsqrt"])
def test_cuda_lists_the_norms_and_softmaxes_as_fp32_and_the_cpu_does_not(op):
    assert backend("cuda").output_bytes(op, 2, autocast=True) == 4
    assert backend("cpu").output_bytes(op, 2, autocast=True) == 2


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_both_run_matmuls_in_16_bits_and_nll_loss_in_fp32(name):
    record = backend(name)
    assert record.output_bytes("matmul", 2, autocast=True) == 2
    assert record.output_bytes("scaled_dot_product_attention", 2, autocast=True) == 2
    assert record.output_bytes("nll_loss", 2, autocast=True) == 4
    assert record.output_bytes("softmax", 4, autocast=False) == 4  # no autocast: the input's


def test_only_the_cpu_casts_cross_entropys_input_to_fp32():
    assert backend("cpu").output_bytes("cross_entropy", 2, autocast=True) == 4
    assert backend("cuda").output_bytes("cross_entropy", 2, autocast=True) == 2


def _autocast_header() -> str:
    torch = pytest.importorskip("torch", reason="the autocast lists are read from torch")
    from pathlib import Path
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip(f"this torch ships no {header.name} to read CUDA's lists from")
    return header.read_text()


def _macro(header: str, name: str) -> set[str]:
    start = header.index(f"#define {name}(_)")
    body = header[start:header.index("\n\n", start)]
    return {m.split(",")[0].strip() for m in re.findall(r"_\(([^)]*)\)", body)}


def test_cudas_autocast_lists_explain_the_16_bit_log_softmax():
    """CUDA's fp32 list holds nll_loss but not cross_entropy_loss, and log_softmax is
    in the set-dtype list, whose policy leaves a dtype already given alone: so
    cross_entropy's own `log_softmax(x, dim, x.scalar_type())` runs in 16 bits."""
    header = _autocast_header()
    fp32 = _macro(header, "AT_FORALL_FP32")
    assert "nll_loss" in fp32 and "cross_entropy_loss" not in fp32
    assert "log_softmax" in _macro(header, "AT_FORALL_FP32_SET_OPT_DTYPE")
    assert "if the output\n                      // type is already set, don't touch it" in header


def test_cudas_cross_entropy_keeps_16_bit_log_probs_and_an_fp32_copy():
    """CUDA's decomposition run under the CPU's autocast (the same two policies: an
    explicit dtype left alone, nll_loss on the fp32 list), its saved tensors against
    `outside_saved(..., "cuda")`'s loss entries; F.cross_entropy on the CPU keeps one
    fp32 tensor, as `outside_saved(..., "cpu")` says."""
    torch = pytest.importorskip("torch", reason="the loss's saved tensors are torch's")
    import torch.nn.functional as F
    from engine.budget.real_step import loss_log_probs
    cfg = bm.preset("gpt2-small", activation_model="pytorch", precision="bf16",
                    micro_batch=2, seq_len=16, vocab_size=300, n_layer=1)
    n, V = cfg.micro_batch * cfg.seq_len, cfg.vocab_size
    logits = torch.randn(n, V, requires_grad=True)
    y = torch.randint(0, V, (n,))

    def saved_bytes(loss_of) -> int:
        seen = {}
        def pack(t):
            if t.shape == (n, V):
                seen[t.data_ptr()] = t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", torch.bfloat16):
                loss_of(logits.to(torch.bfloat16))
        return sum(seen.values())

    cuda_way = saved_bytes(lambda l: F.nll_loss(torch.log_softmax(l, -1, dtype=l.dtype), y))
    assert cuda_way == sum(x.bytes for x in loss_log_probs(cfg, "cuda")) == n * V * (2 + 4)
    cpu_way = saved_bytes(lambda l: F.cross_entropy(l, y))
    assert cpu_way == sum(x.bytes for x in loss_log_probs(cfg, "cpu")) == n * V * 4
    hf = cfg.with_(activation_model="hf")  # transformers upcasts its logits: fp32 on both
    assert sum(x.bytes for x in loss_log_probs(hf, "cuda")) == n * V * 4


def test_an_unknown_backend_or_op_is_refused_by_name():
    with pytest.raises(ValueError, match="backend='tpu' is unknown; allowed: cuda, cpu"):
        backend("tpu")
    with pytest.raises(ValueError, match="op='conv2d'"):
        backend("cpu").output_bytes("conv2d", 2, autocast=True)


# ------------------------------------------------ the terms they change
def _bytes(items, op_prefix: str) -> int:
    return sum(x.bytes for x in items if x.op.startswith(op_prefix))


def test_gpt2s_gelu_is_fp32_under_cuda_autocast_and_16_bit_under_the_cpus():
    cfg = config(**SMALL, activation_model="hf", precision="bf16")
    n_f = 2 * 64 * 256
    assert _bytes(gpt2_block(cfg, "cuda"), "GELU") == n_f * (4 + 4 + 4 + 2)
    assert _bytes(gpt2_block(cfg, "cpu"), "GELU") == n_f * 2 * 4


def test_the_cpus_sdpa_with_dropout_keeps_three_fp32_t_by_t_tensors():
    cfg = config(**SMALL, activation_model="hf", attention="flash", dropout=True,
                 precision="bf16")
    scores = 4 * 64 * 64 * 2
    assert _bytes(_attention(cfg, "cpu", 64, True), "SDPA math") == 3 * scores * 4 + 3 * 128 * 64 * 4
    assert not any("T x T" in x.tensor or x.op.startswith("SDPA math")
                   for x in _attention(cfg, "cuda", 64, True))


def test_the_embedding_dropout_mask_is_fp32_on_the_cpu_even_under_autocast():
    cfg = config(**SMALL, activation_model="pytorch", dropout=True, precision="bf16")
    mask = next(x for x in outside_saved(cfg, "cpu") if x.op == "embedding dropout")
    assert mask.itemsize == 4
    assert next(x for x in outside_saved(cfg, "cuda") if x.op == "embedding dropout").itemsize == 1


def test_the_loops_defaults_keep_nanogpts_logits_and_drop_the_trainers():
    assert outputs_kept(config(**SMALL, activation_model="pytorch"))
    assert not outputs_kept(config(**SMALL, activation_model="hf"))
    assert outputs_kept(config(**SMALL, activation_model="hf", outputs="kept"))


def test_a_kept_output_holds_logits_and_cache_past_the_backward():
    cfg = config(**SMALL, activation_model="hf", outputs="kept")
    logits, cache = 2 * 64 * 1000 * 4, 2 * 2 * 128 * 64 * 4  # L x (K + V) x n x h x fp32
    terms = kept_output_terms(cfg, "cpu")
    for moment in (BACKWARD_END, OPTIMIZER_STEP):
        assert dict(terms[moment]) == {"the caller's output: logits": logits,
                                       "the caller's output: key/value cache": cache}
    # the loop rebinds `outputs` only when the next forward returns
    assert sum(b for _, b in terms[FORWARD_END]) == logits + cache
    assert FORWARD_END not in kept_output_terms(cfg, "cpu", first_step=True)
    assert FORWARD_END in kept_output_terms(cfg.with_(accumulation=2), "cpu", first_step=True)


def test_a_freed_output_lives_only_until_the_forward_returns():
    cfg = config(**SMALL, activation_model="hf", attention="flash", dropout=True)
    terms = kept_output_terms(cfg, "cpu")
    assert list(terms) == [FORWARD_END]
    # the math path kept fp32 copies, so the cache's K (V is read as it is) is extra
    assert dict(terms[FORWARD_END]) == {"logits": 2 * 64 * 1000 * 4,
                                        "key/value cache, until the forward returns":
                                        2 * 128 * 64 * 4}
    freed = {x.tensor for x in outside_saved(cfg, "cpu")}
    kept = {x.tensor for x in outside_saved(cfg.with_(outputs="kept"), "cpu")}
    assert kept - freed == {"logits", "key/value cache attention did not keep"}


# --------------------------------------------- measured with PyTorch here
def _missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


# (model, shape, knobs): two shapes each; dropout, bf16 autocast on the CPU, outputs kept/freed
CPU_CASES = [
    ("hf", SMALL, dict(attention="flash", dropout=True, precision="bf16", outputs="freed")),
    ("hf", OTHER, dict(attention="flash", dropout=True, precision="bf16", outputs="kept")),
    ("hf", SMALL, dict(attention="standard", dropout=True, precision="bf16", outputs="kept")),
    ("hf", OTHER, dict(attention="standard", precision="fp32", outputs="kept")),
    ("hf", SMALL, dict(attention="flash", dropout=True, precision="bf16", outputs="kept",
                       **LLAMA)),
    ("hf", OTHER, dict(attention="flash", dropout=True, precision="bf16", outputs="freed",
                       **LLAMA)),
    ("hf", SMALL, dict(attention="standard", dropout=True, precision="bf16", outputs="freed",
                       **LLAMA)),
    ("hf", OTHER, dict(attention="standard", precision="bf16", outputs="kept", **LLAMA)),
    ("pytorch", SMALL, dict(attention="flash", dropout=True, precision="bf16", outputs="kept")),
    ("pytorch", OTHER, dict(attention="flash", dropout=True, precision="bf16", outputs="freed")),
    ("pytorch", SMALL, dict(attention="standard", dropout=True, precision="bf16",
                            outputs="freed")),
    ("pytorch", OTHER, dict(attention="standard", precision="bf16", outputs="kept")),
]


@pytest.mark.parametrize("model, shape, knobs", CPU_CASES, ids=[
    f"{m}-L{s['n_layer']}-" + "-".join(str(v) for v in k.values()) for m, s, k in CPU_CASES])
def test_backend_cpu_predicts_the_step_pytorch_runs_here(model, shape, knobs):
    """The step in its own precision on this CPU against `--backend cpu`: what
    the forward leaves alive, the steady-state peak and step 1's peak."""
    missing = _missing("torch", *(["transformers"] if model == "hf" else []))
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (pip install -e '.[transformers]')")
    if "backend" not in FIELDS or "outputs" not in FIELDS:
        pytest.skip("this checkout's BudgetConfig has no backend or outputs knob yet")
    from engine.budget.lab.torch_step import measure_step
    cfg = config(**shape, activation_model=model, backend="cpu", **knobs)
    m = measure_step(cfg, device="cpu")
    assert m.config.precision == cfg.precision  # backend cpu runs the requested precision
    acts = bm.real_step_activations(m.config, device="cpu")
    assert bm.fixed_bytes(m.config)["weights"] == m.weights
    assert acts.saved == pytest.approx(m.activations, rel=0.05)
    assert acts.step.peak_moment.bytes == pytest.approx(m.peak, rel=0.05)
    assert acts.step.first_step_peak_moment.bytes == pytest.approx(m.peak_first_step, rel=0.05)


@pytest.mark.skipif(bool(_missing("torch", "transformers")),
                    reason="torch and transformers are not installed")
def test_a_kept_output_is_measured_as_the_logits_and_the_unkept_cache():
    """Kept minus freed, measured: exactly the logits and the cache copies
    attention did not keep (LLaMA's fp32 K under autocast)."""
    from engine.budget.lab.torch_step import measure_step
    base = dict(**SMALL, **LLAMA, activation_model="hf", attention="flash",
                precision="bf16", backend="cpu")
    kept = measure_step(config(**base, outputs="kept"), device="cpu").activations
    freed = measure_step(config(**base, outputs="freed"), device="cpu").activations
    logits, rotated_k = 2 * 64 * 1000 * 2, 2 * 128 * 32 * 4  # bf16 logits, L x n x k fp32
    assert kept - freed == logits + rotated_k
