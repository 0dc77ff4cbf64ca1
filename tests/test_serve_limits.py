"""`serve` under load and abuse, with real sockets on 127.0.0.1: hundreds of concurrent
clients all answered, idle and half-sent requests closed within the idle timeout while
other clients are served, keep-alive, pipelining, malformed and oversized requests, and
connections beyond the limit queued rather than refused."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import make_wheel
from wheelforge import index

IDLE = 1.0
CLIENTS = 300
HALF_OPEN = 200
PURE = {"channel": None, "cuda": None, "torch": None, "archs": [], "build_key": None}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    tmp = tmp_path_factory.mktemp("serve-limits")
    root = tmp / "index"
    for n in range(3):
        wheel = make_wheel(tmp / "dist", {}, name=f"pkg{n}", version="1.0")
        index.publish(root, wheel, **PURE)
    httpd = index.make_server(root, limits=index.ServeLimits(idle_timeout=IDLE))
    thread = threading.Thread(target=httpd.serve_forever)
    thread.start()
    try:
        yield httpd.server_address[1], root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


_LEFT: dict[int, bytes] = {}  # bytes of the next response read with the previous one


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response off ``sock`` (Content-Length framed)."""
    buf = _LEFT.pop(sock.fileno(), b"")
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed inside a body"
        rest += chunk
    if len(rest) > length:  # pipelined: the next response's first bytes
        _LEFT[sock.fileno()] = rest[length:]
    return status, headers, rest[:length]


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_hundreds_of_concurrent_clients_are_all_answered(served: tuple[int, Path]):
    port, root = served
    expected = (root / "simple" / "index.html").read_bytes()
    socks = [connect(port) for _ in range(CLIENTS)]
    try:
        for s in socks:
            s.sendall(get("/simple/", "Connection: close\r\n"))
        for s in socks:
            status, _, body = read_response(s)
            assert (status, body) == (200, expected)
    finally:
        for s in socks:
            s.close()


def test_keep_alive_and_pipelining(served: tuple[int, Path]):
    port, root = served
    with connect(port) as s:
        s.sendall(get("/simple/") + get("/simple/pkg1/", "Accept: application/vnd.pypi."
                                                         "simple.v1+json\r\n"))
        assert read_response(s)[0] == 200
        status, headers, body = read_response(s)
        assert (status, headers["content-type"]) == (200, "application/vnd.pypi.simple.v1+json")
        assert body == (root / "simple/pkg1/index.json").read_bytes()
        s.sendall(get("/no-such-file"))
        status, headers, _ = read_response(s)
        assert status == 404 and "connection" not in headers  # an error keeps the connection
        s.sendall(get("/simple/"))
        assert read_response(s)[0] == 200
    with connect(port) as s:  # HTTP/1.0 closes unless asked otherwise
        s.sendall(b"GET /simple/ HTTP/1.0\r\n\r\n")
        status, headers, _ = read_response(s)
        assert (status, headers["connection"]) == (200, "close")
        assert closed_within(s, 2)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\n bad folding\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /simple?a\nSet-Cookie:x HTTP/1.1\r\n\r\n", 400),  # no response splitting
        (b"GET /simple?a\rX: y HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
    ],
)
def test_malformed_requests_are_answered_and_closed(served: tuple[int, Path],
                                                    request_bytes: bytes, status: int):
    port, _ = served
    with connect(port) as s:
        s.sendall(request_bytes)
        got, headers, _ = read_response(s)
        assert (got, headers["connection"]) == (status, "close")
        assert closed_within(s, 2)


def test_idle_and_half_sent_requests_are_closed_while_others_are_served(
        served: tuple[int, Path]):
    port, _ = served
    idle = [connect(port) for _ in range(HALF_OPEN // 2)]
    half = [connect(port) for _ in range(HALF_OPEN // 2)]
    for s in half:
        s.sendall(b"GET /simple/ HTTP/1.1\r\nHost: t\r\n")  # never finished
    drip = connect(port)  # active, one byte at a time, but never a complete request
    start = time.monotonic()
    try:
        for _ in range(5):  # the held connections do not slow anyone down
            with connect(port) as s:
                s.sendall(get("/simple/", "Connection: close\r\n"))
                assert read_response(s)[0] == 200
        dripped = b"GET /simple/ HTTP/1.1\r\nX-Slow: " + b"a" * 1000
        sel = selectors.DefaultSelector()
        for s in (*idle, *half):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        open_socks = set(idle + half)
        drip_closed = None
        for i in range(200):  # bounded: 200 rounds of 50 ms, a byte dripped in each
            if drip_closed is None:
                try:
                    drip.send(dripped[i % len(dripped):][:1])
                except OSError:
                    drip_closed = time.monotonic() - start
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(100)
                except ConnectionResetError:
                    data = b""
                assert data == b"", "a half-sent request got an answer"
                sel.unregister(sock)
                open_socks.discard(sock)
            if not open_socks and drip_closed is not None:
                break
        elapsed = time.monotonic() - start
        assert not open_socks, f"{len(open_socks)} still open after {elapsed:.1f} s"
        assert drip_closed is not None, "a dripping client outlived the idle timeout"
        assert drip_closed < IDLE + 1.5, drip_closed
        assert elapsed < IDLE + 1.5, elapsed
    finally:
        for s in (*idle, *half, drip):
            s.close()


def test_connections_beyond_the_limit_wait_in_the_queue(tmp_path: Path):
    root = tmp_path / "index"
    index.publish(root, make_wheel(tmp_path / "dist", {}, name="pkg", version="1.0"), **PURE)
    httpd = index.make_server(root, limits=index.ServeLimits(idle_timeout=IDLE,
                                                             max_connections=2))
    thread = threading.Thread(target=httpd.serve_forever)
    thread.start()
    port = httpd.server_address[1]
    try:
        holders = [connect(port) for _ in range(2)]
        for s in holders:
            s.sendall(get("/simple/"))
            assert read_response(s)[0] == 200
        with connect(port) as third:  # queued, not refused, answered once a slot is free
            third.sendall(get("/simple/", "Connection: close\r\n"))
            holders[0].close()
            assert read_response(third)[0] == 200
        holders[1].close()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_shutdown_closes_open_connections(tmp_path: Path):
    root = tmp_path / "index"
    index.publish(root, make_wheel(tmp_path / "dist", {}, name="pkg", version="1.0"), **PURE)
    httpd = index.make_server(root, limits=index.ServeLimits(idle_timeout=60))
    thread = threading.Thread(target=httpd.serve_forever)
    thread.start()
    with connect(httpd.server_address[1]) as s:
        s.sendall(get("/simple/"))
        assert read_response(s)[0] == 200
        httpd.shutdown()
        assert closed_within(s, 2)
    httpd.server_close()
    thread.join(timeout=5)
    assert not thread.is_alive()
