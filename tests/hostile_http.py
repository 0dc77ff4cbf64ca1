"""A hostile package index for tests: a real HTTP server on 127.0.0.1, started by the test,
that answers each path as the test says: crafted bytes, a body dripped a byte at a time,
an endless body, a redirect (to file:///etc/passwd, to ftp://)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


def body(data: bytes, content_type: str = "application/octet-stream") -> Answer:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return answer


def drip(data: bytes, every: float, stop_after: float = 20.0) -> Answer:
    """``data`` a byte every ``every`` seconds (no Content-Length), then spaces until
    ``stop_after`` seconds have passed: a client with only a per-read timeout waits it
    all out."""
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        started = time.monotonic()
        stream = iter(data)
        with contextlib.suppress(OSError):
            while time.monotonic() - started < stop_after:
                h.wfile.write(bytes([next(stream, 0x20)]))
                h.wfile.flush()
                time.sleep(every)
    return answer


def drip_head(every: float, ended: list[str], stop_after: float = 20.0) -> Answer:
    """The status line, then one header a byte every ``every`` seconds: the response never
    begins, and each read gets a byte well within any per-read timeout.  ``ended`` gets
    "client hung up" when the client closed the connection first, else "sent all"."""
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        started = time.monotonic()
        try:
            h.wfile.write(b"HTTP/1.0 200 OK\r\nX-Slow: ")
            while time.monotonic() - started < stop_after:
                h.wfile.write(b"a")
                h.wfile.flush()
                time.sleep(every)
            h.wfile.write(b"\r\nContent-Length: 2\r\n\r\n{}")
            h.wfile.flush()
            ended.append("sent all")
        except OSError:
            ended.append("client hung up")
    return answer


def endless(chunk: int = 1 << 16, limit: int = 256 << 20) -> Answer:
    """Bytes as fast as the client reads them, up to ``limit`` (a sane end for a test)."""
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        sent = 0
        with contextlib.suppress(OSError):
            while sent < limit:
                h.wfile.write(b"\0" * chunk)
                sent += chunk
    return answer


def redirect(to: str, code: int = 302) -> Answer:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return answer


@dataclass
class Hostile:
    """The server's routes (path -> answer) and the paths asked, in order."""

    url: str = ""
    routes: dict[str, Answer] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)


@contextlib.contextmanager
def hostile_server() -> Iterator[Hostile]:
    state = Hostile()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def do_GET(self) -> None:  # noqa: N802
            state.asked.append(self.path)
            answer = state.routes.get(self.path.split("?")[0])
            if answer is None:
                self.send_error(404)
                return
            answer(self)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
