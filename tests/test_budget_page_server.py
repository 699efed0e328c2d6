"""The budget page's server answers with the security headers even where uvicorn answers
by itself: a malformed request (its 400) and more connections than it takes (its 503).

Skipped without the page's extra (starlette, uvicorn)."""
from __future__ import annotations

import socket

import pytest

from budget_page_tools import serving
from lab_tools import free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page'")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
from widgets.budget_page.app import SECURITY_HEADERS  # noqa: E402
from widgets.budget_page.server import MAX_CONNECTIONS  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("server"), port=free_port()) as (url, _):
        yield url


def raw_answer(base: str, request: bytes) -> tuple[int, dict]:
    """The status and headers of the server's answer to the bytes `request`."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(head[0].split()[1]), headers


def assert_security_headers(headers: dict) -> None:
    for name, value in SECURITY_HEADERS:
        assert headers.get(name) == [value], (name, headers.get(name))  # present, once


def test_uvicorns_own_400_carries_the_security_headers(base):
    status, headers = raw_answer(base, b"NOT AN HTTP REQUEST\r\n\r\n")
    assert status == 400
    assert_security_headers(headers)


def test_uvicorns_own_503_carries_the_security_headers(base):
    port = int(base.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):  # every connection the server takes, held open
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        status, headers = raw_answer(base, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    finally:
        for s in held:
            s.close()
    assert status == 503
    assert_security_headers(headers)


def test_the_pages_own_answers_carry_each_header_once(base):
    for request in (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                    b"GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"):
        status, headers = raw_answer(base, request)
        assert status in (200, 404, 400)
        assert_security_headers(headers)
