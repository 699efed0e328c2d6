"""Read a model's shape from a Hugging Face `config.json` (GPT-2 and LLaMA families).

The file is data: only the shape fields below are read, each checked to be a
whole number; nothing in it chooses a path, a command or any other setting.
The batch shape and training policy come from the caller.

    GPT-2 (model_type "gpt2"): n_layer, n_embd, n_head, vocab_size,
        n_positions, n_inner (null: 4 x n_embd), tie_word_embeddings (default true);
        add_cross_attention must be false (a decoder-only model)
    LLaMA (model_type "llama"): num_hidden_layers, hidden_size,
        num_attention_heads, num_key_value_heads (default: one per head),
        head_dim (default: hidden_size / heads), intermediate_size, vocab_size,
        max_position_embeddings, tie_word_embeddings (default false);
        attention_bias and mlp_bias must be false (LLaMA has no biases)
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .config import BudgetConfig, BudgetError

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


def config_from_hf(data: dict, source: str = "config.json", **changes) -> BudgetConfig:
    """A BudgetConfig with the model shape of a Hugging Face config (a dict,
    from `read_hf_config`), one micro-batch of the model's full context in
    bf16 unless `changes` say otherwise."""
    kind = data.get("model_type")
    if kind == "gpt2":
        shape = {field: _whole(data, key, source) for key, field in _GPT2.items()}
        inner = data.get("n_inner")
        shape["d_ff"] = 0 if inner is None else _whole(data, "n_inner", source)
        tied = data.get("tie_word_embeddings", True)
        shape["architecture"] = "gpt2"
        if data.get("add_cross_attention", False) is not False:
            raise BudgetError(f'{source}: "add_cross_attention": '
                              f'{json.dumps(data["add_cross_attention"])}; blocks with '
                              f"cross-attention (an encoder-decoder) are not modelled here, "
                              f"only decoder-only GPT-2 configs are read.")
    elif kind == "llama":
        shape = {field: _whole(data, key, source) for key, field in _LLAMA.items()}
        shape["n_kv_head"] = _whole(data, "num_key_value_heads", source,
                                    default=shape["n_head"])
        # LLaMA 3.x configs may give a head size of their own (heads x head_dim
        # need not equal the width); absent or null means width / heads.
        if data.get("head_dim") is not None:
            head = _whole(data, "head_dim", source)
            if head * shape["n_head"] != shape["d_model"]:
                shape["d_head"] = head
        for key in ("attention_bias", "mlp_bias"):
            if data.get(key, False) is not False:
                raise BudgetError(f'{source}: "{key}": {json.dumps(data[key])}; the LLaMA '
                                  f'block here has no biases, so only configs with "{key}": '
                                  f"false are read.")
        tied = data.get("tie_word_embeddings", False)
        shape["architecture"] = "llama"
    else:
        raise BudgetError(f'{source}: "model_type": {json.dumps(kind)} is not read here; '
                          f"the GPT-2 ('gpt2') and LLaMA ('llama') families are.")
    if not isinstance(tied, bool):
        raise BudgetError(f'{source}: "tie_word_embeddings": {json.dumps(tied)} must be '
                          f"true or false.")
    start = {"name": f"{kind} from {source}",  # the file's text is shown nowhere
             "tied_embedding": tied, "micro_batch": 1, "seq_len": shape["block_size"],
             "precision": "bf16", **shape}
    return BudgetConfig(**{**start, **changes}).validate()
