"""`python -m engine.bench --sweep-attention`: for each sequence length, the
bytes one forward+backward keeps and its ms, for our standard and flash
attention kernels and for PyTorch's scaled_dot_product_attention."""
from __future__ import annotations

import numpy as np

from ...gpt_config import GPTConfig, init_params
from ...timing import median_seconds
from ..model import activation_bytes
from .torch_twin import TorchTwin, torch_missing


SWEEP_LENGTHS = (128, 256, 512, 1024, 2048)


def sweep_attention(cfg: GPTConfig, lengths=SWEEP_LENGTHS, tokens: int = 2048, *,
                    repeats: int = 3, threads: int | None = None, with_torch: bool = True,
                    seed: int = 0, progress=None) -> dict:
    """For each sequence length T (batch B = max(1, tokens // T)): the bytes one
    forward+backward of the model keeps, attention's share, and the median
    forward+backward ms, for our standard and flash kernels and for the same
    model in PyTorch with scaled_dot_product_attention(is_causal=True), which
    runs in a process of its own (torch_twin.TorchTwin), as in the benchmark.
    One model at a time, every kernel on `threads` threads."""
    from dataclasses import replace
    from ..kernels.threads import cores, restore_threads, set_threads
    from ..model import FusedGPT
    say = progress or (lambda line: None)
    with_torch = with_torch and torch_missing() is None
    n_threads = threads or cores()
    rows, version = [], None
    for T in lengths:
        c = replace(cfg, block_size=T)
        B = max(1, tokens // T)
        rng = np.random.default_rng(seed)
        ids, targets = rng.integers(0, c.vocab_size, (2, B, T))
        params = init_params(c, seed, np.float32)
        row = {"T": T, "B": B}
        info = set_threads(n_threads)
        try:
            for kind in ("standard", "flash"):
                say(f"T={T} B={B}: ours, {kind} attention...")
                model = FusedGPT(c, B, params=params, attention=kind)
                step = lambda: (model.forward(ids, targets), model.backward())  # noqa: E731
                row[kind] = {"ms": median_seconds(step, repeats, warmup=1) * 1e3,
                             **activation_bytes([model])}
                del model
        finally:
            restore_threads(info)
        if with_torch:          # in a process of its own, as in the benchmark (torch_twin.py)
            say(f"T={T} B={B}: PyTorch SDPA, in a process of its own...")
            batches = [(ids, targets)] * (repeats + 1)         # one batch, repeated
            with TorchTwin(c, params, batches, attention="sdpa", threads=n_threads) as twin:
                seconds = twin.forward_backward(0, repeats + 1)[1:]      # the first warms up
                row["torch_sdpa"] = {"ms": float(np.median(seconds)) * 1e3,
                                     "activation_bytes": twin.saved_bytes(0)}
                version = twin.version
        rows.append(row)
    return {"config": {**cfg.to_dict(), "tokens_per_batch": tokens, "threads": n_threads,
                       "repeats": repeats, "torch": version},
            "rows": rows}


def format_sweep(r: dict) -> str:
    c = r["config"]
    mib = lambda n: f"{n / 2**20:9.2f}"  # noqa: E731
    lines = [f"attention sweep: L={c['n_layer']} H={c['n_head']} C={c['n_embd']} "
             f"V={c['vocab_size']}, B*T = {c['tokens_per_batch']} tokens, {c['threads']} "
             f"thread(s), forward+backward median of {c['repeats']}",
             f"{'T':>6}{'B':>4} | {'standard':^27} | {'flash':^27} | {'PyTorch SDPA':^18}",
             f"{'':10}| {'kept MiB':>9}{'attn MiB':>9}{'ms':>9} | {'kept MiB':>9}{'attn MiB':>9}"
             f"{'ms':>9} | {'saved MiB':>9}{'ms':>9}"]
    for row in r["rows"]:
        s, f, t = row["standard"], row["flash"], row.get("torch_sdpa")
        line = (f"{row['T']:>6}{row['B']:>4} | {mib(s['activation_bytes'])}"
                f"{mib(s['attention_saved_bytes'])}{s['ms']:9.1f} | {mib(f['activation_bytes'])}"
                f"{mib(f['attention_saved_bytes'])}{f['ms']:9.1f} | ")
        line += f"{mib(t['activation_bytes'])}{t['ms']:9.1f}" if t else "   (no torch)"
        lines.append(line)
    return "\n".join(lines)
