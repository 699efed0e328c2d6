"""A stand-in of the Hugging Face Hub's file API for tests, served on 127.0.0.1, and the
environment that points huggingface_hub at it (HF_ENDPOINT) with a disk cache of its own."""
from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_FILE = ROOT / "tests" / "fixtures" / "llama2_7b_config.json"
GPT2_FILE = ROOT / "tests" / "fixtures" / "gpt2_config.json"
MODEL, GATED, SMALL = "someone/llama-2-7b", "gated-org/llama-2-7b", "someone/gpt2"
FILES = {MODEL: LLAMA_FILE, SMALL: GPT2_FILE}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class StandInHub(BaseHTTPRequestHandler):
    """`/{owner}/{name}/resolve/{revision}/config.json` as the Hub answers it: the file
    with the headers huggingface_hub reads (ETag, X-Repo-Commit, Content-Length), a 401
    GatedRepo for the gated model, a 404 RepoNotFound for any other. `seen` lists the
    paths asked for."""
    seen: list = []

    def _answer(self, with_body: bool) -> None:
        type(self).seen.append(self.path)
        for repo, file in FILES.items():
            if self.path == f"/{repo}/resolve/main/config.json":
                body = file.read_bytes()
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)
                return
        status, code = (401, "GatedRepo") if self.path.startswith(f"/{GATED}/") else (
            404, "RepoNotFound")
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", "Access to model is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        self._answer(with_body=False)

    def do_GET(self):
        self._answer(with_body=True)

    def log_message(self, *args):
        pass


@contextmanager
def stand_in_hub(folder: Path):
    """Serve the stand-in Hub; yields the environment variables that point
    huggingface_hub at it, with its cache under `folder`."""
    StandInHub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
               "HF_HOME": str(folder / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
    finally:
        server.shutdown()
        server.server_close()
