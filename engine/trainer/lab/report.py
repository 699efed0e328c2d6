"""The benchmark's report as text: one shape in detail (`format_report`), or one
table over several shapes (`format_table`)."""
from __future__ import annotations

from .machine import kept_traffic, machine_ceiling
from .profile import cached_step_ms


def _kib_or_mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def format_first_step(r: dict) -> str:
    """The first step's time, what it compiled or loaded, and the pages it faulted in."""
    c = r["compile"]
    line = (f"first step {c['first_step_s']:.2f} s (kernels compiled: {c['compiled']}, "
            f"loaded from cache: {c['loaded_from_cache']}")
    if "page_faults" in c:
        line += f"; {c['page_faults']:,} page faults"
    if "newly_resident_bytes" in c:
        line += f", {c['newly_resident_bytes'] / 2 ** 20:,.0f} MiB newly resident"
    return line + ")"


def format_report(r: dict) -> str:
    c = r["config"]
    mode = (f"{c['replicas']} replicas x 1 thread" if c["thread_mode"] == "replicas"
            else f"1 model, {c['threads']}-thread kernels")
    lines = [f"fused trainer benchmark: V={c['vocab_size']} T={c['block_size']} "
             f"L={c['n_layer']} H={c['n_head']} C={c['n_embd']} B={c['batch_size']} float32, "
             f"{c['threads']} thread(s): {mode}; BLAS: {c['blas']}",
             f"matrix products: {c['products']}",
             format_first_step(r), ""]
    if "thread_plan" in c:
        lines.insert(2, c["thread_plan"])
    o, t = r["ours"], r["torch"]
    if "activation_bytes" in r:
        lines.insert(2, f"activations kept for the backward: {_kib_or_mib(r['activation_bytes'])}, "
                        f"attention's share {_kib_or_mib(r['attention_saved_bytes'])} "
                        f"({c.get('attention', 'standard')} kernel)")
    q = lambda sp: f"{sp['median']:.1f} ({sp['p25']:.1f}-{sp['p75']:.1f})"  # noqa: E731
    lines.append(f"{'':24}{'ms/step (quartiles)':>22}{'tokens/s':>10}{'GFLOP/s':>9}"
                 f"{'best ms':>9}{'alone ms':>20}")
    alone = lambda sp: q(sp) if sp["median"] is not None else "-"  # noqa: E731
    lines.append(f"{'fused (FusedGPT)':24}{q(o['spread']):>22}{o['tokens_per_s']:>10,.0f}"
                 f"{o['gflops']:>9.1f}{o['ms_min']:>9.1f}{alone(o['alone']):>20}")
    if t:
        gf = r["flops_per_step"]["total"] / (t["ms_per_step"] / 1e3) / 1e9
        lines.append(f"{'PyTorch ' + t['version'] + ' eager':24}{q(t['spread']):>22}"
                     f"{t['tokens_per_s']:>10,.0f}{gf:>9.1f}{t['ms_min']:>9.1f}"
                     f"{alone(t['alone']):>20}")
        sr = t["speedup_rounds"]
        lines.append(f"speed-up over PyTorch eager: {sr['median']:.2f}x paired (median of "
                     f"{sr['rounds']} rounds of {c.get('block', 1)}-step blocks in both orders, "
                     f"range {sr['min']:.2f}-{sr['max']:.2f}x; {t['speedup']:.2f}x from the "
                     f"step medians, {t['speedup_best']:.2f}x best step against best step"
                     + (f", {t['speedup_alone']:.2f}x alone" if t["speedup_alone"] else "")
                     + f"; attention={t['attention']})")
        lines.append(f"first-step gradients: largest relative difference "
                     f"{t['first_step_grad_max_rel_diff']:.2e} ({t['first_step_grad_worst_tensor']})")
    else:
        lines.append(f"PyTorch comparison skipped: {r['torch_skipped']}")
    if c["replicas"] > 1:
        lines.append(f"waiting for the other replicas and summing their gradients: "
                     f"{o['wait_ms_per_step']:.1f} ms a step "
                     f"({o['wait_ms_per_step'] / o['ms_per_step']:.0%} of the median step)")
    lin = r["linear"]
    lines.append("")
    lines.append(f"linear layers: {lin['in_step_gflops'] or 0:.1f} GFLOP/s inside the step vs "
                 f"{lin['sgemm_alone_gflops']:.1f} GFLOP/s for the same products alone"
                 + (f" ({lin['share_of_sgemm']:.0%})" if "share_of_sgemm" in lin else ""))
    if "machine_sgemm_gflops" in lin:
        lines.append(f"machine sgemm (1024^3, {c['blas']}, default threads): "
                     f"{lin['machine_sgemm_gflops']:.1f} GFLOP/s; the whole step ran at "
                     f"{o['gflops'] / lin['machine_sgemm_gflops']:.0%} of it")
    if "cpu_own_sgemm" in lin:
        own = lin["cpu_own_sgemm"]
        lines.append(f"with the CPU's own kernels ({own['blas']}; OPENBLAS_CORETYPE unset, "
                     f"in a child process): {own['gflops']:.1f} GFLOP/s; the whole step ran "
                     f"at {o['gflops'] / own['gflops']:.0%} of it")
    lines.append("")
    lines += format_profile(r)
    return "\n".join(lines)


def format_profile(r: dict) -> list[str]:
    """Where the time of one step went: kernel by kernel, then outside the kernels."""
    lines = [f"where the time goes (profiled step {r['profiled_step_ms']:.1f} ms; kernels "
             f"of {r['per_kernel_note']}):"]
    total = sum(r["per_kernel_ms"].values())
    for name, ms in r["per_kernel_ms"].items():
        lines.append(f"  {name:24}{ms:8.2f} ms  {ms / total:6.1%} of the kernels")
    for name, ms in r["outside_kernels_ms"].items():
        lines.append(f"  {name}: {ms:.2f} ms")
    again = r.get("again_ms")
    if again:
        lines += ["", "every call, as called in the step and again at once (its data then in "
                  "the caches):"]
        for name, t in again.items():
            lines.append(f"  {name:24}{t['as_called_ms']:8.2f} ms  again {t['again_ms']:6.2f} ms"
                         f"  {t['as_called_ms'] / t['again_ms']:5.2f}x")
        called, warm, step_ms = cached_step_ms(r)
        lines.append(f"  {'all calls':24}{called:8.2f} ms  again {warm:6.2f} ms"
                     f"  {called / warm:5.2f}x")
        rate = r["linear"].get("machine_sgemm_gflops")
        share = (f", {r['flops_per_step']['total'] / step_ms / 1e6 / rate:.0%} of the "
                 f"machine's sgemm rate" if rate else "")
        lines.append(f"the median step less what its calls pay for where their data was: "
                     f"about {step_ms:.1f} ms{share}")
    return lines + format_memory(r)


def format_memory(r: dict) -> list[str]:
    """The memory rates of one core and of the step's cores at once, and what the
    kept activations cost at the latter."""
    m = r.get("memory")
    if not m:
        return []
    cache = m["reported_cache_bytes"]
    def rates(x):
        return (f"writes {x['write_gbs']:.1f} GB/s, {x['streamed_gbs']:.1f} GB/s streamed "
                f"past the caches; reads {x['read_gbs']:.1f} GB/s")
    lines = [f"memory, one core (a {_kib_or_mib(m['buffer_bytes'])} buffer"
             + (f"; the OS reports a {_kib_or_mib(cache)} cache" if cache else "")
             + f"): {rates(m)}"]
    together = r.get("memory_together")
    if together:
        lines.append(f"memory, {together['cores']} cores at once, all together: "
                     f"{rates(together)}")
    if "activation_bytes" in r:
        per_core, ordinary, streamed = kept_traffic(r)
        paid = ""
        if r.get("again_ms"):
            called, warm, _ = cached_step_ms(r)
            paid = f"; the calls above paid {called - warm:.1f} ms for where their data was"
        lines.append(f"the activations kept, {_kib_or_mib(per_core)} a core, written once and "
                     f"read back once at these rates: {ordinary:.1f} ms a step "
                     f"({streamed:.1f} ms with every write streamed){paid}")
    return lines


def _sgemm_share_and_wait(c: dict, o: dict, sgemm: float) -> tuple[str, str]:
    """Our step's share of the machine's sgemm rate, and the replicas' waiting
    share of the step (none with one replica), as a table shows them."""
    share = f"{o['gflops'] / sgemm:.0%}" if sgemm else "-"
    wait = f"{o['wait_ms_per_step'] / o['ms_per_step']:.0%}" if c["replicas"] > 1 else "-"
    return share, wait


def format_table(reports: list[dict]) -> str:
    """One line per shape: ours and PyTorch's ms/step (median, quartiles), tokens/s,
    GFLOP/s, the share of the machine's sgemm rate, the ratios (paired rounds and
    alone), the replicas' waiting share and the first-step gradient agreement."""
    w = max([5] + [len(r.get("shape", "")) for r in reports])
    head = (f"{'shape':>{w}}{'B':>4}{'T':>6}{'L':>3}{'H':>3}{'C':>5} |"
            f"{'ours ms/step':>20}{'tok/s':>8}{'GFLOP/s':>8}{'sgemm':>6}{'wait':>5} |"
            f"{'torch ms/step':>20}{'tok/s':>8} |{'paired x (range)':>18}"
            f"{'alone ms ours/torch':>21}{'x':>6} |{'grad rel':>9}")
    lines = [head, "-" * len(head)]
    q = lambda sp: f"{sp['median']:.1f} ({sp['p25']:.0f}-{sp['p75']:.0f})"  # noqa: E731
    sgemm = machine_ceiling(reports)
    for r in reports:
        c, o, t = r["config"], r["ours"], r["torch"]
        share, wait = _sgemm_share_and_wait(c, o, sgemm)
        line = (f"{r.get('shape', ''):>{w}}{c['batch_size']:>4}{c['block_size']:>6}"
                f"{c['n_layer']:>3}{c['n_head']:>3}{c['n_embd']:>5} |{q(o['spread']):>20}"
                f"{o['tokens_per_s']:>8,.0f}{o['gflops']:>8.1f}{share:>6}{wait:>5} |")
        if t:
            sr = t["speedup_rounds"]
            alone = (f"{o['alone']['median']:.1f}/{t['alone']['median']:.1f}"
                     if t["speedup_alone"] else "-")
            line += (f"{q(t['spread']):>20}{t['tokens_per_s']:>8,.0f} |"
                     f"{sr['median']:>7.2f} ({sr['min']:.2f}-{sr['max']:.2f})"
                     f"{alone:>21}{(t['speedup_alone'] or 0):>6.2f} |"
                     f"{t['first_step_grad_max_rel_diff']:>9.1e}")
        else:
            line += f"{'(no torch)':>20}"
        lines.append(line)
    r0 = reports[0]
    t0 = r0["torch"]
    lines.append(f"ours: {r0['config']['threads']} thread(s), "
                 f"{r0['config']['thread_mode']}; {r0['config']['attention']} attention; "
                 f"BLAS {r0['config']['blas']}"
                 + (f"; PyTorch {t0['version']} eager, attention={t0['attention']}" if t0 else "")
                 + f"; float32; vocabulary {r0['config']['vocab_size']}")
    lines.append(f"our matrix products: {r0['config']['products']}")
    if sgemm:
        lines.append(f"machine sgemm rate: {sgemm:.1f} GFLOP/s (1024^3, {r0['config']['blas']}, "
                     f"all cores; "
                     f"the best of the readings taken after each shape)")
    own = max((r["linear"]["cpu_own_sgemm"] for r in reports if "cpu_own_sgemm" in r["linear"]),
              key=lambda x: x["gflops"], default=None)
    if own:
        shares = ", ".join(f"{r.get('shape', '?')} {r['ours']['gflops'] / own['gflops']:.0%}"
                           for r in reports)
        lines.append(f"with the CPU's own kernels ({own['blas']}; OPENBLAS_CORETYPE unset, in a "
                     f"child process; best reading): {own['gflops']:.1f} GFLOP/s; the steps at "
                     f"{shares} of it")
    lines.append("ms/step: median (quartiles) of the paired steps; sgemm: the step's GFLOP/s "
                 "over the machine's 1024^3 sgemm rate; wait: replicas waiting and summing "
                 "gradients, share of the step; paired x: median (range) over rounds of "
                 "PyTorch's block median / ours; alone: medians of the standalone runs; "
                 "grad rel: largest first-step gradient difference to PyTorch, relative")
    return "\n".join(lines)


def _plan_words(c: dict) -> str:
    if c["thread_mode"] == "replicas" and c["replicas"] > 1:
        return f"{c['replicas']} replicas x 1"
    return f"1 model x {c['threads']}"


def format_scaling(reports: list[dict]) -> str:
    """One line per (shape, thread count): the plan the step ran, ours and PyTorch's
    ms/step at that thread count, tokens/s, the share of the machine's sgemm rate, the
    replicas' waiting share and the paired ratio; then each plan's reason."""
    w = max([5] + [len(r.get("shape", "")) for r in reports])
    head = (f"{'shape':>{w}}{'threads':>8}  {'plan':<18}|{'ours ms/step':>13}{'tok/s':>9}"
            f"{'sgemm':>6}{'wait':>5} |{'torch ms/step':>14}{'tok/s':>9} |{'paired x':>9}")
    lines = [head, "-" * len(head)]
    sgemm = machine_ceiling(reports)
    for r in reports:
        c, o, t = r["config"], r["ours"], r["torch"]
        share, wait = _sgemm_share_and_wait(c, o, sgemm)
        line = (f"{r.get('shape', 'B=' + str(c['batch_size'])):>{w}}{c['threads']:>8}  "
                f"{_plan_words(c):<18}|{o['ms_per_step']:>13.1f}{o['tokens_per_s']:>9,.0f}"
                f"{share:>6}{wait:>5} |")
        if t:
            line += (f"{t['ms_per_step']:>14.1f}{t['tokens_per_s']:>9,.0f} |"
                     f"{t['speedup_rounds']['median']:>8.2f}x")
        else:
            line += f"{'(no torch)':>14}"
        lines.append(line)
    lines.append("ms/step: median of the paired steps; sgemm: the step's GFLOP/s over the "
                 "machine's best 1024^3 sgemm reading (all cores); wait: replicas waiting and "
                 "summing gradients, share of the step; torch: PyTorch eager with as many "
                 "threads; paired x: median over rounds of PyTorch's block median / ours")
    for r in reports:
        if "thread_plan" in r["config"]:
            lines.append(f"{r.get('shape', '')} {r['config']['threads']} thread(s): "
                         f"{r['config']['thread_plan']}".lstrip())
    return "\n".join(lines)
