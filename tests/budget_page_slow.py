"""The budget page with slow answers, for the browser tests: `python tests/budget_page_slow.py
SECONDS ARGS...` serves `python -m widgets.budget_app ARGS...` with every /api/budget answer
held back SECONDS (answers computed before included), as on a loaded machine."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from widgets.budget_page import server  # noqa: E402


def slowed(create_app, seconds: float):
    def create(*args, **kwargs):
        app = create_app(*args, **kwargs)

        async def slow_app(scope, receive, send):
            if scope["type"] == "http" and scope["path"] == "/api/budget":
                await asyncio.sleep(seconds)
            await app(scope, receive, send)
        return slow_app
    return create


if __name__ == "__main__":
    server.create_app = slowed(server.create_app, float(sys.argv[1]))
    sys.exit(server.main(sys.argv[2:]))
