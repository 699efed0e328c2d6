"""ZeRO-3's gathered weights (engine.budget.sharding.weights_gathered): a device stores
a shard of the weights but computes with whole ones, gathered by the engine around each
module's or unit's forward and backward. Each moment of a real step holds them as
"gathered weights" terms, counted here by hand from LLaMA-2-7B's shapes (32 blocks,
width 4096, MLP 11008, vocabulary 32000, untied head; fp32 weights under autocast).
Stages 0-2, one device and the textbook models gather nothing."""
import pytest

import engine.budget as bm
from engine.budget import moments as M
from engine.budget import sharding

L, D, F, V = 32, 4096, 11008, 32000
ATTENTION = D * D                     # q, k, v, o: each width x width
MLP = D * F                           # gate, up, down: each width x 11008
BLOCK = 4 * ATTENTION + 3 * MLP + 2 * D   # 202,383,360 elements, two RMSNorm gains
ROOT = 2 * V * D + D                  # embedding, head, final norm: 262,148,096
FP32 = 4
GATHERED = "gathered weights"


def _gathered(b, first_step=False) -> dict[str, dict[str, int]]:
    step = b.activations.step
    return {m.name: {a.what: a.bytes for a in m.terms if a.term == GATHERED}
            for m in (step.first_step if first_step else step.moments)}


def _llama(**changes):
    return bm.preset("llama2-7b", **{"activation_model": "hf", "devices": 8, "zero": 3,
                                     **changes})


def test_the_shapes_by_hand():
    assert BLOCK == 202_383_360 and ROOT == 262_148_096
    assert L * BLOCK + ROOT == bm.parameter_count(_llama())


@pytest.mark.parametrize("first_step", [False, True])
def test_fsdp_holds_the_root_unit_and_one_or_two_blocks_whole(first_step):
    """The root unit (embedding, final norm, head) whole from the forward to the end of
    the backward; the last block prefetched at the loss's and the head's backward; the
    recomputed block and the one before it in a block's backward; nothing at the step."""
    b = bm.budget(_llama(zero_engine="fsdp", recompute="full"))
    found = {at: sum(held.values()) for at, held in _gathered(b, first_step).items()}
    assert found == {M.FORWARD_END: ROOT * FP32,
                     M.LOSS_BACKWARD: (ROOT + BLOCK) * FP32,
                     M.HEAD_BACKWARD: (ROOT + BLOCK) * FP32,
                     M.LAST_BLOCK_BACKWARD: (ROOT + 2 * BLOCK) * FP32,
                     M.FIRST_BLOCK_BACKWARD: (ROOT + 2 * BLOCK) * FP32,
                     M.BACKWARD_END: ROOT * FP32,
                     M.OPTIMIZER_STEP: 0}
    # 1.05 GB + 0.81 GB at the head's backward, on top of the step it was before
    assert found[M.HEAD_BACKWARD] == 1_858_125_824


def test_fsdp_moves_the_peak_by_the_root_and_two_blocks():
    """Without checkpointing the peak is the last block's backward (every block's rows
    beside it): the root unit, that block and the one prefetched before it are whole;
    at the head's backward the root and the prefetched last block."""
    cfg = _llama(zero_engine="fsdp")
    b = bm.budget(cfg)
    moments = {m.name: m for m in b.activations.step.moments}
    peak = b.activations.step.peak_moment
    assert peak.name == M.LAST_BLOCK_BACKWARD
    gathered = sum(a.bytes for a in peak.terms if a.term == GATHERED)
    assert gathered == (ROOT + 2 * BLOCK) * FP32
    assert sum(a.bytes for a in moments[M.HEAD_BACKWARD].terms
               if a.term == GATHERED) == (ROOT + BLOCK) * FP32
    rest = sum(a.bytes for a in peak.terms if a.term != GATHERED)
    assert b.peak == rest + gathered


def _deepspeed_turn_by_hand() -> tuple[int, int]:
    """Elements whole at the end of the forward under DeepSpeed's defaults: kept, those
    used again within stage3_max_reuse_distance (1e9) elements of the modules between;
    ahead, the backward's next modules the prefetcher gathered until 1e9 were whole."""
    # Kept: the head and final norm (used again at once), all of block 31 (its first
    # module, q, is used again after 185 + 262 + 185 = 633M elements), and of block 30
    # the modules from v on: v is used again after o, the MLP (16.8 + 135.3), block 31
    # twice (2 x 202.4), the head twice and the final norm (262.1), then the MLP and o
    # backwards: 969.6M < 1e9; k's distance is 1003.2M: released.
    kept = (V * D + D) + BLOCK + (2 * ATTENTION + D + 3 * MLP)
    assert kept == 502_284_288
    # Ahead, in the backward's order: k and q of block 30 and its first norm, blocks 29
    # and 28 whole, block 27's down and up: the 1e9-th element falls in up.
    order = [ATTENTION, ATTENTION, D] + [MLP, MLP, MLP, D, ATTENTION, ATTENTION, ATTENTION,
                                         ATTENTION, D] * 3
    ahead, live = 0, kept
    for n in order:
        if live >= sharding.MAX_LIVE_ELEMENTS:
            break
        ahead, live = ahead + n, live + n
    assert ahead == 2 * ATTENTION + D + 2 * BLOCK + 2 * MLP == 528_502_784
    return kept, ahead


def test_deepspeed_at_the_turn_holds_a_billion_elements_whole():
    b = bm.budget(_llama())   # deepspeed, recompute none
    kept, ahead = _deepspeed_turn_by_hand()
    found = _gathered(b)
    at_turn = found[M.FORWARD_END]
    assert at_turn[sharding._WHY["kept"]] == kept * FP32
    assert at_turn[sharding._WHY["ahead"]] == ahead * FP32
    assert found[M.LOSS_BACKWARD] == at_turn
    # at the head's backward the head runs; the final norm and block 31 are still kept
    head = found[M.HEAD_BACKWARD]
    assert head[sharding._WHY["used"]] == V * D * FP32
    assert head[sharding._WHY["kept"]] == (kept - V * D) * FP32
    # the token embedding's backward, last of all: the embedding alone
    assert found[M.BACKWARD_END] == {sharding._WHY["used"]: V * D * FP32}
    assert found[M.OPTIMIZER_STEP] == {}
    # the live bound: at most a bucket (and one module) beyond 1e9 elements
    total = sum(at_turn.values()) // FP32
    assert sharding.MAX_LIVE_ELEMENTS <= total < (sharding.MAX_LIVE_ELEMENTS
                                                  + sharding.PREFETCH_BUCKET_ELEMENTS + MLP)


def test_deepspeed_step_one_records_the_order_and_gathers_one_module_at_a_time():
    found = _gathered(bm.budget(_llama(recompute="full")), first_step=True)
    used = sharding._WHY["used"]
    assert found[M.FORWARD_END] == {} and found[M.LOSS_BACKWARD] == {}
    assert found[M.HEAD_BACKWARD] == {used: V * D * FP32}
    assert found[M.FIRST_BLOCK_BACKWARD] == {used: MLP * FP32}  # its largest: gate/up/down
    assert found[M.BACKWARD_END] == {used: V * D * FP32}


def test_under_lora_and_qlora_the_frozen_weights_are_gathered_too():
    """FSDP's block unit: the frozen block and its adapters (q and v, rank 16); QLoRA's
    linear weights in 4 bits with an fp32 absmax per 64."""
    adapters = 2 * 16 * (D + D)
    lora = bm.budget(_llama(zero_engine="fsdp", lora_rank=16, recompute="full"))
    found = {at: sum(h.values()) for at, h in _gathered(lora).items()}
    assert found[M.FORWARD_END] == ROOT * FP32
    assert found[M.FIRST_BLOCK_BACKWARD] == (ROOT + 2 * (BLOCK + adapters)) * FP32
    nf4 = sum(n // 2 + n // 64 * 4 for n in [ATTENTION] * 4 + [MLP] * 3)
    qlora = bm.budget(_llama(zero_engine="fsdp", lora_rank=16, qlora=True,
                             recompute="full"))
    found = {at: sum(h.values()) for at, h in _gathered(qlora).items()}
    assert found[M.HEAD_BACKWARD] == ROOT * FP32 + nf4 + (2 * D + adapters) * FP32


@pytest.mark.parametrize("changes", [
    {}, dict(lora_rank=16), dict(lora_rank=16, qlora=True), dict(lora_rank=8, dora=True),
    dict(lora_rank=8, modules_to_save="lm_head"), dict(preset="gpt2-small"),
    dict(preset="llama3.2-1b", recompute="full")])
def test_the_modules_hold_every_stored_weight(changes):
    changes = dict(changes)
    cfg = bm.preset(changes.pop("preset", "llama2-7b"), activation_model="hf", devices=8,
                    zero=3, **changes)
    modules = sharding.weight_modules(cfg)
    assert sum(b for _, _, b in modules) == bm.fixed_bytes(cfg)["weights"]
    for engine in ("deepspeed", "fsdp"):  # every moment of every step is a known term
        step = bm.budget(cfg.with_(zero_engine=engine)).activations.step
        assert any(a.term == GATHERED for m in step.moments for a in m.terms)


# The peaks (steady state, step 1) of LLaMA-2-7B, Hugging Face's step with recompute on
# 8 devices, at the stages that gather no weight: the step model's own, which the
# gathered weights of ZeRO 3 must leave as they are.
PEAKS = {("deepspeed", 0): (113_032_347_648, 107_814_649_856),
         ("deepspeed", 1): (65_863_438_336, 60_645_740_544),
         ("deepspeed", 2): (50_603_560_960, 43_865_145_344),
         ("fsdp", 2): (50_603_560_960, 43_865_145_344)}


@pytest.mark.parametrize("zero_engine,zero", [("deepspeed", 0), ("deepspeed", 1),
                                              ("deepspeed", 2), ("fsdp", 2)])
def test_stages_0_to_2_gather_nothing_and_keep_their_peaks(zero_engine, zero):
    cfg = _llama(zero=zero, zero_engine=zero_engine, recompute="full")
    b = bm.budget(cfg)
    step = b.activations.step
    assert not any(a.term == GATHERED for m in (*step.moments, *step.first_step)
                   for a in m.terms)
    assert (b.peak, b.peak_first_step) == PEAKS[(zero_engine, zero)]


def test_one_device_and_the_textbook_models_gather_nothing():
    one = bm.budget(_llama(devices=1))
    assert not any(a.term == GATHERED for m in one.activations.step.moments for a in m.terms)
    assert sharding.weights_gathered(_llama(devices=1)) == {}
    textbook = bm.budget(bm.preset("llama2-7b", devices=8, zero=3))  # the paper's shard
    assert textbook.peak == 68_560_625_664
    assert not any(a.term == GATHERED for m in textbook.activations.step.moments
                   for a in m.terms)


def test_the_output_names_what_is_gathered():
    fsdp = bm.describe_breakdown(bm.budget(_llama(zero_engine="fsdp")))
    assert "the root unit's weights (embeddings, final norm, head)" in fsdp
    assert "gathered ahead of its backward (backward_prefetch=BACKWARD_PRE)" in fsdp
    deepspeed = bm.describe_breakdown(bm.budget(_llama()))
    assert "gathered ahead of use (stage3_prefetch_bucket_size 5e7 elements)" in deepspeed
    assert "kept whole for their use again soon (stage3_max_reuse_distance 1e9" in deepspeed
