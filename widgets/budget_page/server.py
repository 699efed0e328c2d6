"""The command line of the page and uvicorn's limits.

uvicorn serves the Starlette application in one process (no kernel or process per
visitor) with:
  * the security headers on every answer (`headers`), uvicorn's own 503 included;
  * a cap on connections and requests in flight (`limit_concurrency`: 503 beyond it);
  * a deadline for a request's head: uvicorn's own timeouts start only after a first
    response (`timeout_keep_alive`), so a connection that sends nothing, or a request
    head byte by byte, is closed after HEAD_SECONDS by the small protocol class below,
    which also gives uvicorn's own 400 (a malformed request) the security headers. It
    extends uvicorn's HTTP/1.1 protocol, which is not a public interface: a uvicorn
    newer than NEWEST_TESTED_UVICORN is named in a warning when this module loads;
  * bounded request heads (h11's `max_incomplete_event_size`);
  * SIGTERM and Ctrl-C: uvicorn's graceful stop, then exit status 0.
The socket is bound here, before uvicorn starts, so a fault names its cause: the
address (`--listen`) or the port (`--port`).
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import re
import signal
import socket
import sys
import webbrowser

from engine import budget as B
from uvicorn.protocols.http.h11_impl import H11Protocol
import h11
import uvicorn

from . import answers, settings
from .app import SECURITY_HEADERS, create_app

# The newest uvicorn the page's tests passed with (its protocol class is extended below).
NEWEST_TESTED_UVICORN = (0, 55)
if tuple(int(p) for p in uvicorn.__version__.split(".")[:2] if p.isdigit()) > NEWEST_TESTED_UVICORN:
    import warnings
    warnings.warn(f"uvicorn {uvicorn.__version__} is newer than the page was tested with "
                  f"(0.55): if the page misbehaves, install 'uvicorn<0.56'.", stacklevel=1)

HEAD_SECONDS = 5            # to send a request's head, from connecting or the last answer
MAX_CONNECTIONS = 1000      # connections and requests in flight (uvicorn: 503 beyond)
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers; a pasted config.json rides in the URL
WILDCARDS = ("0.0.0.0", "::", "")


class HeadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's head, and the
    configured headers on its answer to a malformed request."""

    def send_400_response(self, msg: str) -> None:
        # h11's 400 is written without the headers uvicorn adds to every other answer.
        event = h11.Response(status_code=400, reason=b"Bad Request", headers=[
            *self.server_state.default_headers,
            (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")])
        for part in (event, h11.Data(data=msg.encode("ascii")), h11.EndOfMessage()):
            self.transport.write(self.conn.send(part))
        self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_too_slow)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()  # no request head in time: the slot goes back


def host_names(listen: str, extra=()) -> list[str]:
    """The Host names this server answers: the loopback names, its own address and
    `extra` (each with or without a port; the port is the socket's business)."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if listen not in WILDCARDS:
        names.add(f"[{listen}]" if ":" in listen else listen)
    for name in extra:
        names.add(_host_part(name))
    return sorted({n.lower() for n in names})


def _host_part(name: str) -> str:
    """`mybox.lan:8866` -> `mybox.lan`, `[fe80::1]:80` and `fe80::1` -> `[fe80::1]`."""
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[0-9a-fA-F:]*:[0-9a-fA-F:.]*|[\w.-]+)(?::(\d{1,5}))?",
                     name.strip())
    if not m:
        raise ValueError(f"--allow-host {name!r} is not a host name; write a name such as "
                         f"mybox.lan or mybox.lan:8866")
    host = m.group(1)
    if ":" in host and not host.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"--allow-host {name!r} is not a host name; write a name "
                             f"such as mybox.lan or mybox.lan:8866") from None
        host = f"[{host}]"
    return host


def bind(listen: str, port: int) -> socket.socket:
    """A listening socket, or SystemExit's message naming the address or the port."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(listen or "0.0.0.0").version == 6 \
            else socket.AF_INET
    except ValueError:
        raise OSError(errno.EADDRNOTAVAIL, f"--listen {listen!r} is not an IP address; "
                      f"give one of this machine's addresses, e.g. 127.0.0.1, ::1 or "
                      f"0.0.0.0 (every network)") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listen, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"port {port} is in use on {listen}; choose another "
                          f"--port") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EINVAL):
            raise OSError(exc.errno, f"--listen {listen}: this machine has no such address "
                          f"({exc.strerror}); give one of its addresses, e.g. 127.0.0.1")
        if exc.errno == errno.EACCES:
            raise OSError(exc.errno, f"port {port} needs privileges here; choose a "
                          f"--port above 1023") from None
        raise
    sock.set_inheritable(True)
    return sock


def _stop(*_) -> None:
    raise SystemExit(0)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m widgets.budget_app",
                                 description="The training-step budget calculator as a "
                                             "page of its own.")
    ap.add_argument("--preset", default=settings.DEFAULT_PRESET, choices=B.PRESET_NAMES,
                    help=f"the model the page opens with (default: {settings.DEFAULT_PRESET})")
    ap.add_argument("--port", type=int, default=8866, help="port (default 8866)")
    ap.add_argument("--listen", default="127.0.0.1", metavar="ADDRESS",
                    help="the address to serve on (default 127.0.0.1: this machine only; "
                         "::1 for IPv6); 0.0.0.0 or :: serves every network this machine "
                         "is on, with --allow-host naming how visitors reach it")
    ap.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="a host name visitors use to reach it (with --listen), e.g. "
                         "mybox.lan or mybox.lan:8866; repeat for several")
    ap.add_argument("--no-browser", action="store_true", help="only serve; open no browser")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    # A stop asked for is a clean exit, status 0: before serving at once; while serving,
    # uvicorn stops gracefully and then raises the signal again for this handler.
    signal.signal(signal.SIGTERM, _stop)
    if not 0 < args.port < 65536:
        ap.error(f"--port {args.port}: choose a port between 1 and 65535, e.g. 8866")
    try:
        hosts = host_names(args.listen, args.allow_host)
        sock = bind(args.listen, args.port)
    except (OSError, ValueError) as exc:
        print(f"error: {exc.strerror if isinstance(exc, OSError) else exc}.", file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")  # pictures as PNG bytes; no window, no display
    start, query = settings.config_from_params({"preset": args.preset})
    answers.answer(start)  # the first visitor need not wait for matplotlib to load
    config = uvicorn.Config(
        create_app(hosts, args.preset), http=HeadDeadline, lifespan="off",
        headers=SECURITY_HEADERS,
        limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=HEAD_SECONDS,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES, server_header=False,
        date_header=False, access_log=False, log_level="warning")
    shown = "127.0.0.1" if args.listen in WILDCARDS else args.listen
    host = f"[{shown}]" if ":" in shown else shown
    url = f"http://{host}:{args.port}/?{query}"
    print(f"the budget calculator: {url} (Ctrl-C stops it)", flush=True)
    if args.listen in WILDCARDS:
        print(f"--listen {args.listen} serves every network of this machine, but answers "
              f"only the host names {', '.join(hosts)}: visitors from elsewhere get "
              f"'Invalid host header' unless you name the address they use with "
              f"--allow-host (e.g. --allow-host mybox.lan).", flush=True)
    if not args.no_browser:
        webbrowser.open(url)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0
