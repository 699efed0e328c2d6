"""Read a model's shape and its training switches from a Hugging Face
`config.json` (the GPT-2 family and LLaMA-shaped families).

The file is data: only the fields below are read, each checked; nothing in it
chooses a path, a command or any other setting. The batch shape and training
policy come from the caller.

    GPT-2 (model_type "gpt2"): n_layer, n_embd, n_head, vocab_size,
        n_positions, n_inner (null: 4 x n_embd), tie_word_embeddings (default true);
        add_cross_attention must be false (a decoder-only model)
    LLaMA-shaped (model_type "llama", "qwen2", "mistral", "qwen3"):
        num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads
        (default: one per head), head_dim (default: hidden_size / heads; Qwen3's
        class: 128), intermediate_size, vocab_size, max_position_embeddings,
        tie_word_embeddings (default false). What each family adds to the block:
        qwen2    biases on q, k and v (its modeling code sets them always)
        mistral  sliding_window (null: none)
        qwen3    an RMSNorm over each head of q and of k
        llama    attention_bias (biases on q, k, v and the output projection; qwen3
                 reads it too) and mlp_bias (on gate, up and down), default false
        qwen2 and qwen3 slide only with use_sliding_window, from layer
        max_window_layers on: all layers or none are modelled, a mix is refused.
        gemma, gemma2, gemma3_text (head_dim default 256, tied head by default):
                 see `engine.budget.gemma` for what each adds; their
                 attention_bias is read as llama's.
    A multimodal config.json (gemma3, llava, mistral3: a "text_config" beside a
    vision tower) is refused, naming the text_config that holds the language model.

The switches, each the default of its knob unless the caller sets it
(`config_and_sources` says where each value came from):

    dropout    GPT-2: resid_pdrop, embd_pdrop, attn_pdrop (GPT2Config's default
               0.1 each); on when any is above 0, and then every GPT-2 dropout
               site is counted (the rare file whose pdrops differ is counted as if
               all were on, and the source says so). LLaMA-shaped: attention_dropout
               (default 0), its only dropout.
    use_cache  (default true in every family's config class): whether the forward
               builds a key/value cache, read by the "hf" step only.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .config import BudgetConfig, BudgetError
from .gemma import GEMMA_TYPES as GEMMA, GLOBAL_EVERY

MAX_CONFIG_BYTES = 1_000_000  # a config.json is a few kB

_GPT2 = {"n_layer": "n_layer", "n_embd": "d_model", "n_head": "n_head",
         "vocab_size": "vocab_size", "n_positions": "block_size"}
_LLAMA = {"num_hidden_layers": "n_layer", "hidden_size": "d_model",
          "num_attention_heads": "n_head", "intermediate_size": "d_ff",
          "vocab_size": "vocab_size", "max_position_embeddings": "block_size"}


def _read_bounded(path: Path) -> bytes | None:
    """At most MAX_CONFIG_BYTES + 1 bytes of `path`, or None when it is not a regular
    file. Opened without blocking, so a named pipe cannot wait for a writer forever, and
    checked on the open file, so /dev/zero (size 0, endless) is refused before reading."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(MAX_CONFIG_BYTES + 1)


def read_hf_config(path) -> dict:
    """The JSON object of a config.json, or BudgetError saying what is wrong."""
    path = Path(path)
    try:
        raw = _read_bounded(path)
    except OSError as exc:
        raise BudgetError(f"cannot read the Hugging Face config {str(path)!r}: "
                          f"{exc.strerror}; give the path of a config.json.") from None
    if raw is None:
        raise BudgetError(f"{str(path)!r} is not a regular file (a pipe, a device or a "
                          f"folder); give the path of the model's config.json.")
    if len(raw) > MAX_CONFIG_BYTES:
        raise BudgetError(f"{str(path)!r} is more than {MAX_CONFIG_BYTES:,} bytes, too large "
                          f"for a config.json; give the model's config.json.")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BudgetError(f"{str(path)!r} is not a JSON file ({exc}); give the model's "
                          f"config.json.") from None
    except RecursionError:  # brackets nested deeper than Python's parser follows
        raise BudgetError(f"{str(path)!r} nests its brackets too deeply for a config.json; "
                          f"give the model's config.json.") from None
    if not isinstance(data, dict):
        raise BudgetError(f"{str(path)!r} holds a JSON {type(data).__name__}, not the "
                          f"object of a config.json.")
    return data


def _whole(data: dict, key: str, source: str, default=None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BudgetError(f'{source}: "{key}": {json.dumps(value)} is not a positive whole '
                          f"number; a {data.get('model_type')} config.json has one there.")
    return value


# model_types whose block is not GPT-2's or LLaMA's, and what differs
_NOT_LLAMA = {
    "mixtral": "a mixture-of-experts MLP (a router and experts) replaces SwiGLU",
    "qwen2_moe": "a mixture-of-experts MLP (a router and experts) replaces SwiGLU",
    "qwen3_moe": "a mixture-of-experts MLP (a router and experts) replaces SwiGLU",
    "ministral": "its layers alternate between sliding-window and full attention",
    "phi3": "one fused q/k/v matmul and one fused gate/up matmul",
    "granite": "multipliers on the embeddings, residuals, attention scores and logits",
    "olmo": "LayerNorm without a gain instead of RMSNorm",
    "olmo2": "norms after attention and MLP, and q/k norms over the whole width",
    "cohere": "LayerNorm and attention beside the MLP (a parallel block)",
    "starcoder2": "LayerNorm and a GELU MLP with biases",
}
LLAMA_SHAPED = ("llama", "qwen2", "mistral", "qwen3", *GEMMA)


@dataclass(frozen=True)
class Source:
    """Where a setting came from: "file" (the config.json), "flag" (the
    caller), or "default" (transformers' own when the file is silent)."""
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.detail}" if self.detail else self.where


def _refuse_kind(kind, source: str, data: dict):
    text = data.get("text_config")
    if isinstance(text, dict):  # a multimodal model: a vision tower beside a language model
        inner = text.get("model_type")
        raise BudgetError(
            f'{source}: "model_type": {json.dumps(kind)} is a multimodal model; its '
            f'"text_config" holds the language model ({json.dumps(inner)}): save that '
            f"object as a config.json of its own and pass it (the budget then leaves out "
            f"the vision tower), e.g. python -c \"import json; c = json.load(open("
            f"'config.json')); json.dump(c['text_config'], open('text_config.json', 'w'))\"")
    known = ", ".join(("gpt2",) + LLAMA_SHAPED)
    why = _NOT_LLAMA.get(kind) if isinstance(kind, str) else None
    differs = f"its block differs from LLaMA's: {why}; " if why else ""
    raise BudgetError(f'{source}: "model_type": {json.dumps(kind)} is not read here; '
                      f"{differs}the families read are {known}.")


def _gpt2_shape(data: dict, source: str) -> tuple[dict, bool]:
    shape = {field: _whole(data, key, source) for key, field in _GPT2.items()}
    inner = data.get("n_inner")
    shape["d_ff"] = 0 if inner is None else _whole(data, "n_inner", source)
    shape["architecture"] = "gpt2"
    if data.get("add_cross_attention", False) is not False:
        raise BudgetError(f'{source}: "add_cross_attention": '
                          f'{json.dumps(data["add_cross_attention"])}; blocks with '
                          f"cross-attention (an encoder-decoder) are not modelled here, "
                          f"only decoder-only GPT-2 configs are read.")
    return shape, data.get("tie_word_embeddings", True)


def _llama_shape(data: dict, kind: str, source: str) -> tuple[dict, bool]:
    shape = {field: _whole(data, key, source) for key, field in _LLAMA.items()}
    shape["n_kv_head"] = _whole(data, "num_key_value_heads", source, default=shape["n_head"])
    # LLaMA 3.x configs may give a head size of their own (heads x head_dim
    # need not equal the width); absent or null means width / heads, except in
    # Qwen3's config class, whose default is 128.
    head = data.get("head_dim", {"qwen3": 128}.get(kind, 256 if kind in GEMMA else None))
    if head is not None:
        head = _whole({**data, "head_dim": head}, "head_dim", source)
        if head * shape["n_head"] != shape["d_model"]:
            shape["d_head"] = head
    biases = {"llama": ("attention_bias", "mlp_bias"), "qwen3": ("attention_bias",),
              **{gemma: ("attention_bias",) for gemma in GEMMA}}
    for key in biases.get(kind, ()):
        shape[key] = _switch(data, key, source)
    if kind in GEMMA:
        _gemma_soft_capping(data, kind, source)
    shape["architecture"] = "llama"
    shape["qkv_bias"] = kind == "qwen2"
    shape["qk_norm"] = kind in ("qwen3", "gemma3_text")
    shape["sliding_window"] = _sliding_window(data, kind, shape["n_layer"], source)
    return shape, data.get("tie_word_embeddings", kind in GEMMA)


def _gemma_soft_capping(data: dict, kind: str, source: str) -> None:
    """Gemma 2 soft-caps its scores and logits (its config class: 50 and 30), Gemma
    and Gemma 3 neither; the other way round is not modelled."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = data.get(key, 1.0 if kind == "gemma2" else None)
        capped = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        if capped != (kind == "gemma2"):
            says = "a positive number" if kind == "gemma2" else "null"
            raise BudgetError(f'{source}: "{key}": {json.dumps(value)}; a {kind} block is '
                              f"modelled as its config class makes it, with {says} there.")


def _gemma_layer_pattern(data: dict, kind: str, layers: int, source: str) -> None:
    """Gemma 2 and 3 as their config classes lay out their layers: one global layer
    every GLOBAL_EVERY (2, or Gemma 3's sliding_window_pattern 6), the rest windowed."""
    every = GLOBAL_EVERY[kind]
    given = data.get("sliding_window_pattern", every) if kind == "gemma3_text" else every
    usual = ["sliding_attention" if (i + 1) % every else "full_attention"
             for i in range(layers)]
    if given != every or data.get("layer_types", usual) != usual:
        raise BudgetError(f"{source}: a {kind} config whose layer_types or "
                          f"sliding_window_pattern differ from its config class's (one "
                          f"global layer in every {every}) is not modelled; only the "
                          f"released layouts are read.")


def _switch(data: dict, key: str, source: str) -> bool:
    """A true/false field of the file (false when absent, as in its config class)."""
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BudgetError(f'{source}: "{key}": {json.dumps(value)} must be true or false.')
    return value


def _sliding_window(data: dict, kind: str, layers: int, source: str) -> int:
    """The window every layer uses (0: none). Mistral's applies to all layers;
    Qwen2's and Qwen3's only with use_sliding_window, to layers from
    max_window_layers on (or as layer_types lists them). Gemma 2 and 3 alternate
    windowed and full layers: their window is read, and `engine.budget.gemma` says
    where it changes the step."""
    if kind in ("gemma2", "gemma3_text"):  # their config classes' default windows
        _gemma_layer_pattern(data, kind, layers, source)
        return _whole(data, "sliding_window", source, default=4096)
    if kind == "mistral":
        window = data.get("sliding_window")
        return 0 if window is None else _whole(data, "sliding_window", source)
    if kind not in ("qwen2", "qwen3") or data.get("use_sliding_window", False) is not True:
        return 0
    window = _whole(data, "sliding_window", source, default=4096)
    types = data.get("layer_types")
    if not isinstance(types, list):
        first = data.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            _whole(data, "max_window_layers", source)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if set(types) == {"sliding_attention"}:
        return window
    if set(types) <= {"full_attention"}:
        return 0
    raise BudgetError(f"{source}: some layers use a sliding window and others full "
                      f"attention (use_sliding_window with max_window_layers or layer_types); "
                      f"the budget models one kind of layer: all sliding or none.")


def _fraction(data: dict, key: str, source: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise BudgetError(f'{source}: "{key}": {json.dumps(value)} is not a dropout '
                          f"probability (a number from 0 up to 1).")
    return value


def _dropout(data: dict, kind: str, source: str) -> tuple[bool, Source]:
    """The file's dropout: on when any of its probabilities is above 0."""
    if kind == "gpt2":  # GPT2Config's default is 0.1 at each site
        keys, default = ("resid_pdrop", "embd_pdrop", "attn_pdrop"), 0.1
    else:
        keys, default = ("attention_dropout",), 0.0
    p = {key: _fraction(data, key, source, default) for key in keys}
    said = ", ".join(f"{key} {value:g}" for key, value in p.items())
    on = any(p.values())
    if on and not all(p.values()):
        said += " (every GPT-2 dropout site is counted as on)"
    where = "file" if any(key in data for key in keys) else "default"
    return on, Source(where, said if where == "file" else f"transformers' {said}")


def _use_cache(data: dict, source: str) -> tuple[str, Source]:
    value = data.get("use_cache", True)
    if not isinstance(value, bool):
        raise BudgetError(f'{source}: "use_cache": {json.dumps(value)} must be true or false.')
    if "use_cache" not in data:
        return "on", Source("default", "transformers' use_cache true")
    return ("on" if value else "off"), Source("file", f"use_cache {json.dumps(value)}")


def config_and_sources(data: dict, source: str = "config.json",
                       **changes) -> tuple[BudgetConfig, dict[str, Source]]:
    """A BudgetConfig with the model shape and switches of a Hugging Face
    config (a dict, from `read_hf_config`), one micro-batch of the model's full
    context in bf16 unless `changes` say otherwise; and where each switch
    (dropout, use_cache) came from: "flag" when `changes` set it."""
    kind = data.get("model_type")
    if kind == "gpt2":
        shape, tied = _gpt2_shape(data, source)
    elif kind in LLAMA_SHAPED:
        shape, tied = _llama_shape(data, kind, source)
    else:
        _refuse_kind(kind, source, data)
    if not isinstance(tied, bool):
        raise BudgetError(f'{source}: "tie_word_embeddings": {json.dumps(tied)} must be '
                          f"true or false.")
    fields = BudgetConfig.__dataclass_fields__
    start = {"name": f"{kind} from {source}",  # the file's text is shown nowhere
             "tied_embedding": tied, "micro_batch": 1, "seq_len": shape["block_size"],
             "precision": "bf16", "model_type": kind, **shape}
    start = {key: value for key, value in start.items() if key in fields}
    model = changes.get("activation_model", fields["activation_model"].default)
    switches, sources = {}, {}
    if model != "engine":  # the engine's own GPT has no dropout to set
        switches["dropout"], sources["dropout"] = _dropout(data, kind, source)
    file_cache = _use_cache(data, source)  # checked always, used by transformers' step only
    if model == "hf" and "use_cache" in fields:
        switches["use_cache"], sources["use_cache"] = file_cache
    for knob, flag in (("dropout", "--dropout"), ("use_cache", "--use-cache")):
        if changes.get(knob, "default") != "default":
            sources[knob] = Source("flag", flag)
    cfg = BudgetConfig(**{**start, **switches, **changes}).validate()
    if shape.get("sliding_window"):
        sources["sliding_window"] = Source("file", window_says(cfg))
    return cfg, sources


def window_says(cfg: BudgetConfig) -> str:
    """What a sliding window changes in the step at `cfg`'s sequence length."""
    window, n = getattr(cfg, "sliding_window", 0), cfg.seq_len
    if not window:
        return "no sliding window"
    if n < window:
        return (f"sliding_window {window}: at seq_len {n} it hides no key, so the step is "
                f"the same as without it")
    if cfg.attention == "flash" and cfg.activation_model == "hf":
        gqa = ", and K and V repeated to every head" if cfg.kv_heads != cfg.n_head else ""
        return (f"sliding_window {window} <= seq_len {n}: SDPA is given a mask instead of "
                f"is_causal, so each layer keeps a float copy of it (B x T x T){gqa}")
    return (f"sliding_window {window} <= seq_len {n}: it hides keys, but eager attention "
            f"adds a B x T x T mask anyway, so the step keeps nothing more")


def config_from_hf(data: dict, source: str = "config.json", **changes) -> BudgetConfig:
    """The BudgetConfig of `config_and_sources`, without the sources."""
    return config_and_sources(data, source, **changes)[0]
