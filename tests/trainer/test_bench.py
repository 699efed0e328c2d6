"""engine.bench reports (it never judges speed): the fields exist, the numbers
are positive, and PyTorch, when it imports, computes the same first-step
gradients from the same initial weights."""
from __future__ import annotations

import json

import numba
import numpy as np
import pytest

from engine import bench
from engine.gpt_config import GPTConfig
from engine.trainer.lab import memory_rates

CFG = GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16)


@pytest.fixture(autouse=True)
def small_memory_buffer(monkeypatch):
    """The memory rates over 4 MiB, not a buffer past the caches: these tests check
    what the report holds, and a gigabyte would cost each run a second."""
    monkeypatch.setattr(memory_rates, "MIN_BYTES", 4 << 20)
    monkeypatch.setattr(memory_rates, "MAX_BYTES", 4 << 20)


def test_report_without_torch_has_every_number():
    r = bench.run(CFG, 4, steps=2, warmup=1, with_torch=False)
    assert r["torch"] is None and "no-torch" in r["torch_skipped"]
    assert r["ours"]["ms_per_step"] > 0 and r["ours"]["tokens_per_s"] > 0
    assert r["linear"]["sgemm_alone_gflops"] > 0
    assert {"matmul", "attention_backward", "layernorm_forward"} <= set(r["per_kernel_ms"])
    assert r["compile"]["first_step_s"] > 0
    text = bench.format_report(r)
    assert "PyTorch comparison skipped" in text and "where the time goes" in text
    assert r["again_ms"]["matmul"]["again_ms"] > 0
    assert "again at once" in text and {"layernorm_forward", "layernorm_backward",
                                        "bias_grad"} <= set(r["again_ms"])
    called, warm, step_ms = bench.cached_step_ms(r)
    # every kernel the profile timed was timed again too (no comparison of the two
    # passes' times: they are separate passes, and a busy machine moves either)
    assert set(r["again_ms"]) == set(r["per_kernel_ms"]) and called > 0 and warm > 0
    assert step_ms == pytest.approx(r["ours"]["ms_per_step"] - called + warm)
    assert "the median step less what its calls pay" in text
    m = r["memory"]
    assert m["buffer_bytes"] == 4 << 20 and min(m["write_gbs"], m["streamed_gbs"],
                                                 m["read_gbs"]) > 0
    cores = min(bench.step_cores(r["config"]), numba.config.NUMBA_NUM_THREADS)
    together = r.get("memory_together")
    assert (together is None) == (cores == 1) and (together is None or together["cores"] == cores)
    per_core, ordinary, streamed = bench.kept_traffic(r)
    assert per_core == r["activation_bytes"] / cores
    rates = together or m
    assert ordinary == pytest.approx(per_core / (rates["write_gbs"] / cores) / 1e6
                                     + per_core / (rates["read_gbs"] / cores) / 1e6)
    assert f"reads {m['read_gbs']:.1f} GB/s" in text
    assert (f"written once and read back once at these rates: {ordinary:.1f} ms a step "
            f"({streamed:.1f} ms with every write streamed); the calls above paid "
            f"{called - warm:.1f} ms") in text
    if r["compile"].get("page_faults") is not None:       # where the OS counts them
        assert f"{r['compile']['page_faults']:,} page faults" in text
    if r["compile"].get("newly_resident_bytes") is not None:
        mib = r["compile"]["newly_resident_bytes"] / 2 ** 20
        assert f"{mib:,.0f} MiB newly resident" in text


def test_the_kept_activations_are_shared_by_the_cores_that_run_the_step():
    alone = {"cores": 1, "write_gbs": 2.0, "streamed_gbs": 8.0, "read_gbs": 4.0,
             "buffer_bytes": 1 << 30, "reported_cache_bytes": 0}
    # two cores at once get 3 GB/s of writes between them, not twice one core's 2
    both = {"cores": 2, "write_gbs": 3.0, "streamed_gbs": 16.0, "read_gbs": 8.0}
    replicas = {"config": {"thread_mode": "replicas", "replicas": 2, "threads": 2},
                "activation_bytes": 6e9, "memory": alone, "memory_together": both}
    assert bench.kept_traffic(replicas) == pytest.approx((3e9, 2000 + 750, 375 + 750))
    kernels = {"config": {"thread_mode": "kernels", "replicas": 1, "threads": 4},
               "activation_bytes": 8e9, "memory": alone,
               "memory_together": {**both, "cores": 4}}
    assert bench.kept_traffic(kernels) == pytest.approx((2e9, 8000 / 3 + 1000, 500 + 1000))
    one = {"config": {"thread_mode": "replicas", "replicas": 1, "threads": 1},
           "activation_bytes": 8e9, "memory": alone}
    assert bench.kept_traffic(one) == pytest.approx((8e9, 4000 + 2000, 1000 + 2000))
    # four replicas on two threads: each of the two cores carries two replicas' share
    crowded = {**replicas, "config": {"thread_mode": "replicas", "replicas": 4, "threads": 4}}
    assert bench.kept_traffic(crowded) == bench.kept_traffic(replicas)
    text = "\n".join(bench.format_memory(replicas))
    assert "memory, 2 cores at once, all together: writes 3.0 GB/s" in text
    assert bench.format_memory({"config": {}}) == []              # measured nothing


def test_resident_memory_grows_by_what_is_first_touched_on_huge_pages_too():
    from engine.trainer.arena import huge_page_memory
    from engine.trainer.lab.first_step import _resident_bytes
    if _resident_bytes() is None:
        pytest.skip("this OS has no /proc/self/statm")
    memory = huge_page_memory(16 * 2 ** 20)        # huge pages where Linux gives them
    before = _resident_bytes()
    memory[::4096] = 1                             # one write per small page
    grown = _resident_bytes() - before
    assert 15 * 2 ** 20 <= grown <= 20 * 2 ** 20, grown


def test_page_faults_count_the_first_touch_of_fresh_memory():
    from engine.trainer.lab.first_step import _page_faults
    if _page_faults() is None:
        pytest.skip("this OS does not count page faults")
    import mmap
    mapping = mmap.mmap(-1, 8 * 2 ** 20)           # fresh anonymous memory: no page yet
    fresh = np.frombuffer(mapping, np.uint8)
    before = _page_faults()
    fresh[::4096] = 1                              # one write per page
    assert _page_faults() > before
    del fresh
    mapping.close()


def test_torch_twin_has_the_same_first_step_gradients():
    pytest.importorskip("torch", reason="PyTorch is not installed: the comparison is skipped")
    r = bench.run(CFG, 4, steps=2, warmup=1, with_torch=True)
    t = r["torch"]
    assert t["first_step_grad_max_rel_diff"] < 1e-4, t["first_step_grad_worst_tensor"]
    assert t["speedup"] > 0 and t["ms_per_step"] > 0
    manual = bench.run(CFG, 4, steps=1, warmup=0, torch_attention="manual")
    assert manual["torch"]["first_step_grad_max_rel_diff"] < 1e-4


def test_pytorchs_side_runs_in_its_own_process_and_reports_its_failures():
    pytest.importorskip("torch", reason="PyTorch is not installed: the comparison is skipped")
    import os
    from engine.gpt_config import init_params
    from engine.trainer.lab.torch_twin import TorchTwin
    params = init_params(CFG, 0, np.float32)
    rng = np.random.default_rng(0)
    batches = [tuple(rng.integers(0, CFG.vocab_size, (2, 2, 16))) for _ in range(4)]
    with TorchTwin(CFG, params, batches) as twin:
        assert twin._child.pid != os.getpid() and twin.first_step_s > 0
        assert set(twin.grads) == set(params) and twin.grads["wte"].shape == params["wte"].shape
        seconds = twin.steps(1, 3)
        assert len(seconds) == 3 and all(s > 0 for s in seconds)
    assert twin._child.returncode == 0                     # closed, not killed
    broken = dict(params)
    del broken["lnf_w"]
    with pytest.raises(RuntimeError, match="PyTorch process failed(.|\n)*lnf_w"):
        TorchTwin(CFG, broken, batches)


def test_cli_json(capsys):
    assert bench.main(["--no-torch", "--steps", "1", "--warmup", "0", "--n-layer", "1",
                       "--n-embd", "16", "--n-head", "2", "--block-size", "16",
                       "--batch-size", "2", "--vocab-size", "12", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["vocab_size"] == 12 and len(report["ours"]["ms_all"]) == 1
    assert np.isfinite(report["ours"]["gflops"])


def test_shapes_parse_as_presets_or_pairs():
    assert bench.parse_shape("T1024") == ("T1024", (2, 1024, 4, 4, 128))
    assert bench.parse_shape("T=256,B=8")[1] == (8, 256, 4, 4, 128)
    with pytest.raises(ValueError, match="key=value"):
        bench.parse_shape("T=big")
    for name, (B, T, *_rest) in bench.SHAPES.items():
        assert B * T == bench.TOKENS_PER_STEP, name


def test_paired_timing_alternates_blocks_in_both_orders_on_the_same_batches():
    from engine.timing import timed_steps
    from engine.trainer.lab.versus_torch import _time_steps
    calls = []
    ours = timed_steps(lambda i: calls.append(("ours", i)))

    def theirs(first, count):                       # as TorchTwin.steps: a block at once
        calls.extend(("torch", i) for i in range(first, first + count))
        return [0.01] * count

    t = _time_steps(ours, theirs, warmup=1, steps=4, say=lambda s: None, block=2, alone=1)
    assert calls[:2] == [("ours", 1), ("torch", 1)]  # one warm-up step each
    timed = calls[2:]
    assert [c[0] for c in timed] == ["ours", "torch"] + ["ours"] * 2 + ["torch"] * 4 + ["ours"] * 2
    assert [i for s, i in timed if s == "ours"] == [i for s, i in timed if s == "torch"] \
        == [2, 3, 4, 5, 6]
    assert len(t["ours"]) == len(t["torch"]) == 4 and len(t["rounds"]) == 2
    assert len(t["ours_alone"]) == len(t["torch_alone"]) == 1
    assert t["torch"] == [0.01] * 4 and all(s >= 0 for s in t["ours"])


def test_shape_table_has_one_row_per_shape():
    shapes = [bench.parse_shape("B=2,T=8,L=1,H=2,C=8"), bench.parse_shape("B=2,T=16,L=1,H=2,C=8")]
    reports = bench.run_shapes(shapes, 11, steps=1, warmup=0, with_torch=False)
    table = bench.format_table(reports).splitlines()
    assert [r["shape"] for r in reports] == ["B=2,T=8,L=1,H=2,C=8", "B=2,T=16,L=1,H=2,C=8"]
    assert "(no torch)" in table[2] and "(no torch)" in table[3]
    assert all(r["ours"]["wait_ms_per_step"] >= 0 for r in reports)
    # the second shape's first step runs the kernels the first one compiled or loaded:
    # nothing to count (numba's own counts run from the process's start)
    assert reports[1]["compile"]["compiled"] == reports[1]["compile"]["loaded_from_cache"] == 0


def test_the_table_measures_every_shape_against_the_best_sgemm_reading():
    from engine.trainer.lab.machine import machine_ceiling
    reports = [{"linear": {"machine_sgemm_gflops": g}} for g in (180.0, 95.0, 200.0)]
    assert machine_ceiling(reports) == 200.0
    assert machine_ceiling([{"linear": {}}]) is None


def test_the_cpus_own_sgemm_is_measured_without_openblas_coretype(monkeypatch):
    """Where OPENBLAS_CORETYPE holds OpenBLAS to other kernels, the benchmark also
    reads the rate of the kernels OpenBLAS would pick: in a child process that
    does not see the variable. Without the variable there is nothing to read."""
    from types import SimpleNamespace
    from engine import blas
    from engine.trainer.lab.machine import cpu_own_sgemm
    monkeypatch.setattr(blas, "library", lambda: SimpleNamespace(name="openblas"))
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    own = cpu_own_sgemm()
    assert own["coretype"] is None, "the child saw OPENBLAS_CORETYPE"
    assert own["gflops"] > 0 and own["blas"].startswith("OpenBLAS")
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert cpu_own_sgemm() is None


def test_the_table_reads_every_step_against_the_cpus_own_sgemm_too():
    shapes = [bench.parse_shape("B=2,T=8,L=1,H=2,C=8"), bench.parse_shape("B=2,T=16,L=1,H=2,C=8")]
    reports = bench.run_shapes(shapes, 11, steps=1, warmup=0, with_torch=False)
    for r, rate in zip(reports, (300.0, 400.0)):
        r["linear"]["cpu_own_sgemm"] = {"blas": "OpenBLAS 0.3.30, SkylakeX kernels",
                                        "gflops": rate, "coretype": None}
    line = [x for x in bench.format_table(reports).splitlines() if "CPU's own kernels" in x]
    assert len(line) == 1 and "400.0 GFLOP/s" in line[0]          # the best reading
    want = f"{reports[1]['shape']} {reports[1]['ours']['gflops'] / 400.0:.0%}"
    assert want in line[0]


def test_a_list_of_thread_counts_prints_one_scaling_table(capsys):
    assert bench.main(["--no-torch", "--steps", "1", "--warmup", "0", "--n-layer", "1",
                       "--n-embd", "16", "--n-head", "2", "--block-size", "16",
                       "--batch-size", "2", "--vocab-size", "12", "--threads", "1", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["shape", "threads", "plan"]
    rows = [line.split() for line in lines[2:4]]
    assert [row[1] for row in rows] == ["1", "2"]
    assert " ".join(rows[0][2:5]) == "1 model x" and "(no torch)" in lines[2]
    assert any(line.startswith("1 thread(s): thread plan: 1 model x 1-thread kernels")
               for line in lines)


def test_sweep_attention_refuses_several_thread_counts(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--sweep-attention", "--threads", "1", "2"])
    assert "--sweep-attention runs at one thread count" in capsys.readouterr().err
