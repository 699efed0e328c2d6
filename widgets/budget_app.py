"""The budget calculator as a page of its own: `python -m widgets.budget_app`.

The page (widgets.budget_page) runs on Starlette served by uvicorn, the optional
extra `page` (`pip install -e '.[page]'`; `make budget-app` installs it):

    python -m widgets.budget_app                 # http://127.0.0.1:8866/, opens a browser
    python -m widgets.budget_app --preset llama2-7b --port 8870 --no-browser
    python -m widgets.budget_app --listen ::1    # IPv6 loopback
    python -m widgets.budget_app --listen 0.0.0.0 --allow-host mybox.lan   # serve a network

Every setting of the page is a knob of engine.budget's knob table, and the settings
live in the URL, so a link reproduces what its sender saw. A model named by its Hub id
is fetched by this process with huggingface_hub (the extra `hub`; HF_TOKEN in its
environment for a gated model; HF_HUB_OFFLINE=1 reads only its disk cache). One process serves every
visitor (no kernel, no process per visitor); it listens on 127.0.0.1 unless `--listen`
says otherwise and answers only requests whose Host names it; the page loads nothing
from elsewhere and writes no files; SIGTERM and Ctrl-C stop it with status 0.
"""
from __future__ import annotations

import importlib.util
import sys

INSTALL = ".venv/bin/python -m pip install -e '.[page]'   (or: make budget-app)"


def missing_extras() -> list[str]:
    """The packages of the `page` extra that are not installed."""
    return [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]


def main(argv=None) -> int:
    missing = missing_extras()
    if missing:
        print(f"error: the budget page needs {' and '.join(missing)} (the optional extra "
              f"'page'), which is not installed; install it with\n  {INSTALL}",
              file=sys.stderr)
        return 2
    from widgets.budget_page.server import main as serve
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main())
