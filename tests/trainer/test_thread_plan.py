"""The thread plan's rule (engine/trainer/thread_plan.py): its choices for a table
of (threads, batch, context length) cases, and the overrides."""
import pytest

from engine.trainer.thread_plan import block_matmul_weights, choose_plan

TINY = block_matmul_weights(4, 128)       # L=4 C=128: 2.4 GFLOP for a 512-token replica
WIDE = block_matmul_weights(6, 256)       # L=6 C=256: 14.5 GFLOP for a 512-token replica

# (threads, batch, T[, block weights]) -> (mode, replicas, kernel threads, rows per replica)
CASES = [
    # two cores: what the trainer always ran there
    ((2, 16, 128), ("replicas", 2, 1, 8)),
    ((2, 2, 16), ("replicas", 2, 1, 1)),
    ((2, 3, 128), ("kernels", 1, 2, 3)),
    ((1, 16, 128), ("kernels", 1, 1, 16)),
    # up to eight cores: one replica per core was the fastest plan measured
    ((4, 64, 128), ("replicas", 4, 1, 16)),
    ((8, 64, 128), ("replicas", 8, 1, 8)),
    ((8, 16, 128), ("replicas", 8, 1, 2)),
    ((3, 16, 128), ("replicas", 2, 1, 8)),
    # replicas of one short sequence are too small beyond two
    ((4, 4, 128), ("kernels", 1, 4, 4)),
    ((8, 16, 16), ("kernels", 1, 8, 16)),
    ((4, 16, 64), ("replicas", 4, 1, 4)),
    # sixteen cores: more than eight replicas only when each does 6+ GFLOP a step
    ((16, 64, 128, TINY), ("kernels", 1, 16, 64)),
    ((16, 16, 128, TINY), ("kernels", 1, 16, 16)),
    ((16, 64, 128, WIDE), ("replicas", 16, 1, 4)),
    ((16, 16, 128, WIDE), ("kernels", 1, 16, 16)),     # 16 replicas of 128 tokens: too small
    ((16, 64, 128), ("kernels", 1, 16, 64)),           # the model unknown: at most eight
    ((12, 64, 128, TINY), ("replicas", 8, 1, 8)),
    ((12, 64, 128, WIDE), ("replicas", 8, 1, 8)),      # 12 does not divide 64
    ((12, 48, 128, WIDE), ("replicas", 12, 1, 4)),
    ((32, 16, 128, WIDE), ("kernels", 1, 32, 16)),     # 8 of 32 threads busy: kernels
]


@pytest.mark.parametrize("case, expected", CASES)
def test_the_rule_chooses_for_the_shape_batch_and_cores(case, expected):
    threads, batch, T, *weights = case
    plan = choose_plan(threads, batch, T, block_weights=weights[0] if weights else None)
    assert (plan.mode, plan.replicas, plan.kernel_threads, plan.rows) == expected
    assert plan.reason and plan.describe().startswith("thread plan: ")


def test_thread_mode_overrides_the_rule():
    forced = choose_plan(16, 16, 128, "replicas")
    assert (forced.mode, forced.replicas, forced.rows) == ("replicas", 16, 1)
    assert choose_plan(8, 64, 128, "kernels").replicas == 1
    assert choose_plan(8, 64, 128, concurrent=False).mode == "kernels"


def test_bad_input_names_the_setting():
    with pytest.raises(ValueError, match="threads must be at least 1"):
        choose_plan(0, 16, 128)
    with pytest.raises(ValueError, match="mode must be"):
        choose_plan(2, 16, 128, "many")
