"""A model's config.json from the Hugging Face Hub, by its id (`meta-llama/Llama-3.1-8B`).

`huggingface_hub.hf_hub_download` fetches the file and keeps it in huggingface_hub's
own disk cache (HF_HOME, by default ~/.cache/huggingface), so a model read once is
read again offline; HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE mean what they mean to
every Hugging Face library. The file is then read by `engine.budget.hf.read_hf_config`,
the reader of `--hf-config`, with its bounds.

Every failure is one line saying what to do: an id that is not `owner/name` is refused
before any network; a gated model asks for a token in the environment or the pasted
file; a machine offline with nothing cached says so. `huggingface_hub` is optional (the
extra `hub`); without it the line says how to install it.
"""
from __future__ import annotations

import importlib.util
import re

from .config import BudgetError
from .hf import read_hf_config

# How long the Hub may take to answer (seconds): the HEAD request that finds the file.
TIMEOUT_SECONDS = 10
INSTALL = "python -m pip install huggingface_hub   (or: pip install -e '.[hub]')"
# The Hub's rule for a model id: an owner and a name, each of letters, digits, '-', '_'
# and '.', neither starting nor ending with '-' or '.', at most 96 characters.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
MODEL_ID = re.compile(rf"{_PART}/{_PART}")
PASTE = "or paste the model's config.json instead"


def check_model_id(model_id: str) -> str:
    """`model_id` when it is an `owner/name` Hub id, else BudgetError (no network used)."""
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id) or ".." in model_id:
        shown = repr(model_id[:60]) if isinstance(model_id, str) else repr(model_id)
        raise BudgetError(f"hf_model={shown} is not a Hub model id; write owner/name as on "
                          f"the model's Hub page, e.g. meta-llama/Llama-3.1-8B.")
    return model_id


def available() -> bool:
    """Whether huggingface_hub is installed."""
    return importlib.util.find_spec("huggingface_hub") is not None


def hub_config(model_id: str, revision: str | None = None) -> dict:
    """The config.json of Hub model `model_id` as a dict, fetched (or read from the disk
    cache); BudgetError in one line saying what to do when it cannot be had."""
    check_model_id(model_id)
    if not available():
        raise BudgetError(f"hf_model {model_id}: reading a model from the Hub needs "
                          f"huggingface_hub, which is not installed; install it with "
                          f"{INSTALL}, {PASTE}.")
    from huggingface_hub import hf_hub_download
    from huggingface_hub import errors as E
    try:
        path = hf_hub_download(model_id, "config.json", revision=revision,
                               etag_timeout=TIMEOUT_SECONDS)
    except E.GatedRepoError:
        raise BudgetError(f"hf_model {model_id} is a gated model: accept its terms on its "
                          f"Hub page and set HF_TOKEN in the environment to a token of that "
                          f"account, {PASTE}.") from None
    except E.RepositoryNotFoundError:
        raise BudgetError(f"hf_model {model_id}: the Hub has no such model, or it is private "
                          f"(then set HF_TOKEN in the environment); check the id, "
                          f"{PASTE}.") from None
    except E.RevisionNotFoundError:
        raise BudgetError(f"hf_model {model_id}: the Hub has no revision {revision!r} of "
                          f"it.") from None
    except E.RemoteEntryNotFoundError:
        raise BudgetError(f"hf_model {model_id} has no config.json on the Hub (not a "
                          f"transformers model?); {PASTE}.") from None
    except (E.LocalEntryNotFoundError, E.OfflineModeIsEnabled):
        raise BudgetError(f"hf_model {model_id}: the Hub cannot be reached (offline, or "
                          f"HF_HUB_OFFLINE is set) and its config.json is not in the cache; "
                          f"go online once, {PASTE}.") from None
    except Exception as exc:  # the HTTP client's own errors (a reset, a read timeout)
        first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise BudgetError(f"hf_model {model_id}: the Hub did not give its config.json "
                          f"({first}); try again, {PASTE}.") from None
    return read_hf_config(path)
