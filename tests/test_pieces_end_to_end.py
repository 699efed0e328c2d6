"""The complete set of pieces, built from the solution notebooks, runs lesson 13's trainer.

Every solution function that a check saves as a piece is taken from its lesson source
(course/source/NN_*.py), defined the way a notebook defines it, and saved through the
check's own `save_piece` (fresh-namespace reload and the slot's contract) into a
temporary pieces folder, by `coursework.solution_pieces`, the builder lesson 13's
solution notebook runs on. Lesson 13's `plug_in_pieces` must then put every trainer slot
on the learner's code, and a few float64 steps must give the engine's own losses.
Typical broken pieces are refused by the check and, written to the folder anyway,
skipped by lesson 13 with the reason.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from coursework import lesson12, lesson13, pieces
from coursework._core import ExerciseError
from coursework.solution_pieces import SOLUTION_PIECES, save_solution_pieces, solution_namespace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def pieces_folder(tmp_path, monkeypatch):
    folder = tmp_path / "pieces"
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(folder))
    yield folder
    from engine.trainer.model import reset_kernels
    reset_kernels()


def run_trainer(trainer, train_step, steps=3):
    """Lesson 13's loop, `steps` float64 steps on a small GPT; the losses and norms."""
    from engine.gpt_config import GPTConfig
    from engine.trainer.model import FusedGPT
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = FusedGPT(cfg, batch_size=2, seed=5, dtype=np.float64)
    optimizer = trainer.make_optimizer(model)
    rng = np.random.default_rng(14)
    out = []
    for _ in range(steps):
        x, y = rng.integers(0, 13, size=(2, 8)), rng.integers(0, 13, size=(2, 8))
        loss, norm = train_step(model, optimizer, trainer.clip, x, y, 3e-2, 0.05,
                                lesson13.PhaseLog())
        out.append((float(loss), float(norm)))
    return out, model.params.flat.copy()


def test_every_solution_piece_passes_its_own_check_loaded_on_its_own(pieces_folder, tmp_path):
    save_solution_pieces(SOLUTION_PIECES, tmp_path)
    for name in SOLUTION_PIECES:
        assert pieces.load_piece(name) is not None, name
    # the notebook's imports travel with the piece (lesson 08 uses Tensor and engine)
    assert "from engine.tensor import Tensor" in (pieces_folder / "checkpoint_replay.py").read_text()


def test_lesson_13_trains_on_the_solution_pieces_and_matches_the_engine(pieces_folder, tmp_path):
    save_solution_pieces(lesson13.TRAINER_PIECES, tmp_path)
    train_step = solution_namespace("13", tmp_path)["train_step"]
    from engine.trainer.model import kernel_owners
    trainer = lesson13.plug_in_pieces()
    assert set(trainer.pieces) == set(lesson13.TRAINER_PIECES), trainer.skipped
    owners = kernel_owners()
    assert owners["bias_gelu_forward"] == "you (10.1)"
    assert owners["crossentropy_softmax"] == "you (10.2)"
    assert owners["embedding_backward"] == "you (11.1)"
    table = trainer.slot_table()
    assert all("yours (" in line for line in table), table
    yours, p_yours = run_trainer(trainer, train_step)

    engine_only = lesson13.Trainer({}, {n: "not written yet" for n in lesson13.TRAINER_PIECES})
    from engine.trainer.model import reset_kernels
    reset_kernels()
    engines, p_engine = run_trainer(engine_only, lesson13.reference_train_step)
    # float64; the engine clips by max_norm / (norm + 1e-6), the lesson by max_norm / norm:
    # a relative difference of about 1e-6 / norm in the clipped gradient. Stated tolerance:
    # losses and norms to 1e-6 relative, weights (of size ~0.05, lr 3e-2) to 1e-6 absolute
    np.testing.assert_allclose(yours, engines, rtol=1e-6)
    np.testing.assert_allclose(p_yours, p_engine, rtol=0, atol=1e-6)
    assert yours[0][1] > 0.05          # the step clipped: the norms before clipping exceed 0.05


BROKEN = {
    "wrong result": ("clip_global_norm", "def clip(grads, max_norm):\n"
                     "    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))\n"
                     "    for g in grads.values():\n"
                     "        g *= 0.5\n"
                     "    return norm\n", "clip", "flat gradient buffer"),
    "not in place": ("clip_global_norm", "def clip(grads, max_norm):\n"
                     "    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))\n"
                     "    for k in grads:\n"
                     "        grads[k] = grads[k] * min(1.0, max_norm / norm)\n"
                     "    return norm\n", "clip", "not scaled in place"),
    "needs a global": ("bias_gelu_forward", "@njit\n"
                       "def gelu(x, b, out):\n"
                       "    for i in range(x.shape[0]):\n"
                       "        for j in range(x.shape[1]):\n"
                       "            u = x[i, j] + b[j]\n"
                       "            out[i, j] = 0.5 * u * (1.0 + np.tanh(K * (u + 0.044715 * u ** 3)))\n"
                       "    return out\n", "gelu", "'K'"),
    "raises": ("adamw_step", "def adamw(p, g, m, v, step, lr, b1, b2, eps, wd):\n"
               "    raise ValueError('oops')\n", "adamw", "raised ValueError"),
    "returns None": ("softmax_cross_entropy", "def xent(logits, targets):\n"
                     "    logits[...] = 0.0\n", "xent", "returned None"),
}


def _define(tmp_path, source, function, extra=None):
    path = tmp_path / f"{function}_cell.py"
    path.write_text(source)
    namespace = pieces._fresh_namespace()
    namespace.update(extra or {})
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[function]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_piece_is_refused_by_its_check_and_skipped_by_lesson_13(case, pieces_folder,
                                                                         tmp_path):
    name, source, function, says = BROKEN[case]
    fn = _define(tmp_path, source, function, extra={"K": 0.7978845608028654})
    with pytest.raises(ExerciseError, match=re.escape(says)):
        pieces.save_piece(name, fn, "99.9")
    assert not (pieces_folder / f"{name}.py").exists()
    # written to the folder anyway (an older course, a hand-edited file): lesson 13 runs
    # the engine's version and says why
    pieces_folder.mkdir(exist_ok=True)
    (pieces_folder / f"{name}.py").write_text(source)
    (pieces_folder / "index.json").write_text(f'{{"{name}": {{"function": "{function}", '
                                              f'"exercise": "99.9"}}}}')
    trainer = lesson13.plug_in_pieces()
    assert name not in trainer.pieces
    assert trainer.owner(name).startswith("engine's: yours ")
    assert says.strip("'") in trainer.owner(name) or "does not load" in trainer.owner(name)
    steps, _ = run_trainer(trainer, lesson13.reference_train_step, steps=1)
    assert np.isfinite(steps[0][0])


def test_the_rebinding_clip_passed_12_1_before_and_is_refused_now(pieces_folder, tmp_path):
    _, source, function, _ = BROKEN["not in place"]
    fn = _define(tmp_path, source, function)
    with pytest.raises(ExerciseError, match="train unclipped"):
        lesson12.check_clip_global_norm(fn)


def test_an_unwritable_pieces_folder_keeps_the_passed_answer(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(blocker / "pieces"))
    fn = solution_namespace("12", tmp_path)["clip_global_norm"]
    lesson12.check_clip_global_norm(fn)
    out = capsys.readouterr().out
    assert "could not be saved as the piece 'clip_global_norm'" in out
    assert "Exercise 12.1 (clip_global_norm) passed." in out


def test_a_solution_notebook_keeps_its_pieces_away_from_the_learners(tmp_path, monkeypatch):
    monkeypatch.delenv("BACKPROP_PIECES_DIR", raising=False)
    monkeypatch.chdir(ROOT / "course" / "solutions")
    folder = pieces.pieces_dir()
    assert folder != ROOT / "course" / "my_pieces"
    assert "backprop-solution-pieces-" in folder.name


def test_an_accumulation_loop_without_the_division_is_skipped_in_lesson_13(pieces_folder,
                                                                           tmp_path):
    source = ("def accumulate(model, micro_batches):\n"
              "    model.zero_grad()\n"
              "    total = 0.0\n"
              "    for ids, targets in micro_batches:\n"
              "        loss = model(ids, targets)\n"
              "        loss.backward()\n"
              "        total += loss.item()\n"
              "    return total / len(micro_batches)\n")
    fn = _define(tmp_path, source, "accumulate")
    pieces.save_piece("accumulate", fn, "08.1")      # the tape check is lesson 08's own
    trainer = lesson13.plug_in_pieces()
    assert "accumulate" not in trainer.pieces
    assert "accumulated gradient differs from the engine's loop (norm ratio 4" in \
        trainer.owner("accumulate")


def test_the_slot_table_times_each_piece_and_names_a_slow_one(pieces_folder, tmp_path):
    source = ("def clip(grads, max_norm):\n"
              "    total = 0.0\n"
              "    for g in grads.values():\n"
              "        for value in g.reshape(-1):\n"
              "            total += float(value) * float(value)\n"
              "    norm = total ** 0.5\n"
              "    if norm > max_norm:\n"
              "        for g in grads.values():\n"
              "            g *= max_norm / norm\n"
              "    return norm\n")
    pieces.save_piece("clip_global_norm", _define(tmp_path, source, "clip"), "12.1")
    trainer = lesson13.plug_in_pieces()
    from engine.gpt_config import GPTConfig
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    table = trainer.slot_table(cfg, batch_size=4, train_step_owner="yours (13.1)")
    clip_line = next(line for line in table if "global-norm clipping" in line)
    assert "yours (12.1)" in clip_line and "ms vs the engine's" in clip_line
    # which piece is called slow must not hang on this machine's load: a fixed timer
    table = trainer.slot_table(cfg, batch_size=4, timer=lambda name, fn, cfg, b: (3e-3, 1e-3))
    assert table[-1] == "slow pieces: clip_global_norm (3.0x the engine's time)"
    table = trainer.slot_table(cfg, batch_size=4, timer=lambda name, fn, cfg, b: (1e-3, 1e-3))
    assert table[-1] == "slow pieces: none (each within 2x the engine's)"
    table = trainer.slot_table(cfg, batch_size=4, train_step_owner="yours (13.1)")
    assert any(line.endswith("(13.1): yours (13.1)") for line in table)


def _mlp_grads():
    from engine import Tensor
    rng = np.random.default_rng(3)
    x, w, b = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=3)
    params = [Tensor(x, requires_grad=True), Tensor(w, requires_grad=True),
              Tensor(b, requires_grad=True)]
    ((params[0] @ params[1] + params[2]).tanh() ** 2).sum().backward()
    return [p.grad.copy() for p in params]


def test_the_lesson_03_rules_run_inside_the_tape_and_match_its_own(pieces_folder, tmp_path):
    save_solution_pieces(["matmul_vjp", "unbroadcast"], tmp_path)
    want = _mlp_grads()
    with pieces.tape_rules() as tape:
        got = _mlp_grads()
    assert tape.calls == {"matmul_vjp": 1, "unbroadcast": 1}
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    assert tape.report()[0].endswith("yours (03.1), ran 1 times")
    from engine import rules
    assert rules._VJP_OVERRIDES == {}             # the block restored the tape's own rules


def test_a_broken_unbroadcast_is_refused_and_the_tape_keeps_its_own(pieces_folder, tmp_path):
    source = "def unbroadcast(grad, shape):\n    return grad.sum(axis=0)\n"
    fn = _define(tmp_path, source, "unbroadcast")
    with pytest.raises(ExerciseError, match=r"brought back to \(4, 1\) differs"):
        pieces.save_piece("unbroadcast", fn, "03.2")
    pieces_folder.mkdir(exist_ok=True)
    (pieces_folder / "unbroadcast.py").write_text(source)
    (pieces_folder / "index.json").write_text('{"unbroadcast": {"function": "unbroadcast", '
                                              '"exercise": "03.2"}}')
    want = _mlp_grads()
    with pieces.tape_rules() as tape:
        got = _mlp_grads()
    assert "unbroadcast" not in tape.pieces and tape.calls == {}
    assert "the engine's: yours was skipped:" in tape.report()[1]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_save_leaves_no_temporary_files_and_clears_those_of_a_killed_one(pieces_folder,
                                                                          tmp_path):
    pieces_folder.mkdir()
    (pieces_folder / ".clip_global_norm-killed.tmp").write_text("half a piece")
    save_solution_pieces(["clip_global_norm"], tmp_path)
    assert sorted(p.name for p in pieces_folder.iterdir()) == ["clip_global_norm.py",
                                                               "index.json"]


# ------------------------------------------- lesson 13's solution run and its other pieces
def test_lesson_13_as_a_solution_notebook_runs_on_a_fresh_folder_of_reference_pieces(
        pieces_folder):
    from coursework import solution_pieces
    pieces_folder.mkdir()
    (pieces_folder / "index.json").write_text("{}")          # the learner's own folder
    folder = solution_pieces.use_solution_pieces(before_lesson="13")
    assert folder != pieces_folder and pieces.pieces_dir() == folder
    assert (pieces_folder / "index.json").read_text() == "{}"    # never written
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted(SOLUTION_PIECES)
    trainer = lesson13.plug_in_pieces()
    assert trainer.skipped == {} and all("yours (" in line for line in trainer.slot_table())
    assert lesson13.checkpoint_peak_piece()[1] == "yours (08.3)"
    assert lesson13.bf16_piece()[1] == "yours (09.1)"


def test_only_a_notebook_in_course_solutions_is_a_solution_run(tmp_path, monkeypatch):
    from coursework.solution_pieces import in_solution_notebook
    monkeypatch.chdir(ROOT / "course" / "solutions")
    assert in_solution_notebook()
    monkeypatch.chdir(ROOT / "course")                       # where student notebooks run
    assert not in_solution_notebook()
    monkeypatch.chdir(tmp_path)
    assert not in_solution_notebook()


def _write_piece(folder, name, source, function):
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    (folder / "index.json").write_text(f'{{"{name}": {{"function": "{function}", '
                                       f'"exercise": "99.9"}}}}')


def test_lesson_13_runs_the_engine_s_formula_and_rounding_without_pieces(pieces_folder):
    from engine.precision import round_to_bf16
    from coursework.lesson08 import exact_checkpoint_peak
    fn, owner = lesson13.checkpoint_peak_piece()
    assert fn is exact_checkpoint_peak and owner == "the reference formula's, because not written yet"
    fn, owner = lesson13.bf16_piece()
    assert fn is round_to_bf16 and owner == "the engine's, because not written yet"


def test_a_wrong_checkpoint_formula_is_skipped_by_lesson_13_with_the_reason(pieces_folder):
    _write_piece(pieces_folder, "checkpoint_peak",
                 "def peak(n, k, a, b):\n    return -(-n // k) * a\n", "peak")
    fn, owner = lesson13.checkpoint_peak_piece()
    assert owner.startswith("the reference formula's, because yours was skipped: checkpoint_peak(4, 1")
    from engine.gpt_config import tiny_config
    from engine.trainer.model import FusedGPT
    cfg = tiny_config(103)
    assert lesson13.predicted_checkpointed_bytes(fn, cfg, 16) == \
        FusedGPT(cfg, batch_size=16, checkpointing=True).acts.saved_nbytes()


def test_a_truncating_bf16_is_skipped_by_lesson_13_with_the_reason(pieces_folder):
    _write_piece(pieces_folder, "to_bf16",
                 "def cut(x):\n    return (x.view(np.uint32) & np.uint32(0xFFFF0000))"
                 ".view(np.float32)\n", "cut")
    fn, owner = lesson13.bf16_piece()
    assert owner.startswith("the engine's, because yours was skipped: on a float32 array")
    from engine.precision import round_to_bf16
    assert fn is round_to_bf16
