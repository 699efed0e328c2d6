"""Saved pieces: a passed exercise's function is stored and loads back."""
import numpy as np

from coursework import pieces


def test_a_saved_numba_kernel_loads_and_a_broken_one_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    ns = {}
    src = ("@njit(cache=False)\n"
           "def double(x):\n"
           "    out = np.empty_like(x)\n"
           "    for i in prange(x.size):\n"
           "        out[i] = 2 * x[i]\n"
           "    return out\n")
    (tmp_path / "src.py").write_text(src)
    code = compile(src, str(tmp_path / "src.py"), "exec")
    import numba
    exec(code, {"np": np, "njit": numba.njit, "prange": numba.prange}, ns)
    assert pieces.save_piece("double", ns["double"], "99.1") is not None
    loaded = pieces.load_piece("double")
    assert np.array_equal(loaded(np.arange(3.0)), [0.0, 2.0, 4.0])
    # a piece whose code refers to a name the notebook had but the file lacks
    (tmp_path / "double.py").write_text("def double(x):\n    return FACTOR * x\nFACTOR_USED = FACTOR\n")
    assert pieces.piece_for_slot("never_written") == (None, "not written yet")
    fn, why = pieces.piece_for_slot("double")
    assert fn is None and why.startswith("yours does not load: NameError")


def _write_piece(folder, name, source, function):
    import json
    (folder / f"{name}.py").write_text(source)
    (folder / "index.json").write_text(json.dumps({name: {"function": function,
                                                          "exercise": "04.3"}}))


def test_the_gradient_checker_slot_runs_yours_or_says_why_the_engines_runs(tmp_path,
                                                                          monkeypatch):
    from coursework import slots
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    fn, owner = pieces.gradient_checker()
    assert fn is slots.engine_spot_check and owner == "the engine's, because not written yet"
    slots.check("spot_check", slots.engine_spot_check)       # the engine keeps the contract
    # a checker that passes everything is skipped: it misses the planted wrong element
    _write_piece(tmp_path, "spot_check",
                 "def spot_check(f, x, g, n_checks=6, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0):\n"
                 "    return []\n", "spot_check")
    fn, owner = pieces.gradient_checker()
    assert fn is slots.engine_spot_check
    assert owner.startswith("the engine's, because yours was skipped: did not pass a right gradient")
