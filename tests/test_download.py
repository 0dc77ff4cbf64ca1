"""Source downloads against real, misbehaving HTTP servers on 127.0.0.1: a server that
drips a byte every few seconds, one that never answers, one that refuses, one that
answers 503 before 200, one that is too slow for the deadline.  Every failure is a
SourceError (exit 4) that names the URL and what happened; transient ones are retried."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from test_source import recipe_for, sdist_bytes, sdist_entry
from wheelforge import _proc
from wheelforge.builder.env import buildenv
from wheelforge.builder.source.fetch import NetLimits, cache_path, fetch
from wheelforge.errors import SourceError, ToolchainError

DATA = sdist_bytes()
SHA = hashlib.sha256(DATA).hexdigest()
FAST = NetLimits(connect_timeout=1, stall_timeout=1.5, min_rate=200, deadline=20, retries=2,
                 backoff=0.1)

Handler = Callable[[socket.socket, int], None]


def head(status: str, length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 {status}\r\n{size}Connection: close\r\n{extra}\r\n".encode()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], tuple[str, list[int]]]]:
    """Start a server whose connections run ``handler(sock, n)`` (n: the request number)."""
    servers: list[Server] = []

    def start(handler: Handler) -> tuple[str, list[int]]:
        seen: list[int] = []

        class H(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(10)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
                seen.append(len(seen) + 1)
                with contextlib.suppress(OSError):  # the client gave up: as it should
                    handler(self.request, len(seen))

        server = Server(("127.0.0.1", 0), H)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/demo-1.0.tar.gz", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def download(tmp_path: Path, url: str, limits: NetLimits = FAST) -> tuple[Path, float]:
    recipe = recipe_for(tmp_path, sdist_entry(SHA, url))
    start = time.monotonic()
    got = fetch(recipe, tmp_path / "cache", [], limits=limits)
    return got.archive, time.monotonic() - start


def failing(tmp_path: Path, url: str, limits: NetLimits = FAST) -> tuple[SourceError, float]:
    start = time.monotonic()
    with pytest.raises(SourceError) as info:
        download(tmp_path, url, limits)
    elapsed = time.monotonic() - start
    err = info.value
    assert err.exit_code == 4  # exit status 4, a source error
    assert url in err.why
    recipe = recipe_for(tmp_path, sdist_entry(SHA, url))
    cached = cache_path(tmp_path / "cache", recipe.sources[0])
    assert not cached.exists() and not [p for p in cached.parent.glob("*") if p.is_file()]
    return err, elapsed


def drip(every: float) -> Handler:
    def handler(sock: socket.socket, _n: int) -> None:
        sock.sendall(head("200 OK", len(DATA)))
        for i in range(len(DATA)):  # bounded: the client hangs up long before
            sock.sendall(DATA[i:i + 1])
            time.sleep(every)
    return handler


def test_a_server_dripping_a_byte_every_few_seconds_is_cut_off(tmp_path: Path, serve):
    url, seen = serve(drip(3.0))
    err, elapsed = failing(tmp_path, url, NetLimits(stall_timeout=1.5, retries=0))
    assert "stalled: no data for 1.5 s" in err.why
    assert elapsed < 5


def test_a_server_below_the_minimum_rate_is_cut_off(tmp_path: Path, serve):
    url, seen = serve(drip(0.2))  # 5 B/s: never silent for long, far too slow
    err, elapsed = failing(tmp_path, url, NetLimits(stall_timeout=1.5, min_rate=200, retries=1,
                                                    backoff=0.1))
    assert "stalled: " in err.why and "the minimum is 200 B/s" in err.why
    assert "(2 attempts)" in err.why and seen == [1, 2]
    assert elapsed < 8


def test_a_server_that_never_answers(tmp_path: Path, serve):
    url, _ = serve(lambda sock, n: time.sleep(5))
    err, elapsed = failing(tmp_path, url, NetLimits(stall_timeout=1, retries=0))
    assert "no response within 1 s" in err.why
    assert elapsed < 4


def test_a_refused_connection_is_retried_with_backoff(tmp_path: Path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/demo-1.0.tar.gz"
    err, elapsed = failing(tmp_path, url, NetLimits(retries=2, backoff=0.2))
    assert "cannot connect: Connection refused" in err.why and "(3 attempts)" in err.why
    assert elapsed >= 0.2 + 0.4  # the pauses double


def test_503_then_200_succeeds(tmp_path: Path, serve):
    def handler(sock: socket.socket, n: int) -> None:
        if n == 1:
            sock.sendall(head("503 Service Unavailable", 0, "Retry-After: 0\r\n"))
        else:
            sock.sendall(head("200 OK", len(DATA)) + DATA)

    url, seen = serve(handler)
    archive, _ = download(tmp_path, url)
    assert archive.read_bytes() == DATA and seen == [1, 2]


def test_a_404_is_not_retried(tmp_path: Path, serve):
    url, seen = serve(lambda sock, n: sock.sendall(head("404 Not Found", 0)))
    err, _ = failing(tmp_path, url)
    assert f"{url}: HTTP 404 Not Found" in err.why and seen == [1]


def test_503_every_time_gives_up_after_the_retries(tmp_path: Path, serve):
    url, seen = serve(lambda sock, n: sock.sendall(head("503 Service Unavailable", 0)))
    err, _ = failing(tmp_path, url)
    assert f"{url}: HTTP 503 Service Unavailable (3 attempts)" in err.why and seen == [1, 2, 3]


def test_ctrl_c_ends_the_back_off_between_attempts_at_once(tmp_path: Path, serve):
    """A 503 then a 60 s back-off: stopping the command (Ctrl-C, --timeout:
    ``_proc.stop_all``) ends the wait at once, nothing half-downloaded left behind."""
    url, seen = serve(lambda sock, n: sock.sendall(head("503 Service Unavailable", 0)))
    ended: list[BaseException] = []

    def run() -> None:
        try:
            download(tmp_path, url, NetLimits(retries=3, backoff=60, deadline=300))
        except BaseException as exc:  # noqa: BLE001 (the test looks at what it was)
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the first attempt failed: the back-off began
        stopped = time.monotonic()
        _proc.stop_all()
        thread.join(20)
        assert not thread.is_alive() and time.monotonic() - stopped < 5
    finally:
        _proc.resume()
    assert len(ended) == 1 and isinstance(ended[0], KeyboardInterrupt) and seen == [1]
    recipe = recipe_for(tmp_path, sdist_entry(SHA, url))
    cached = cache_path(tmp_path / "cache", recipe.sources[0])
    assert not cached.exists() and not [p for p in cached.parent.glob("*") if p.is_file()]


def test_a_truncated_body_is_retried(tmp_path: Path, serve):
    def handler(sock: socket.socket, n: int) -> None:
        sock.sendall(head("200 OK", len(DATA)) + (DATA[:10] if n == 1 else DATA))

    url, seen = serve(handler)
    archive, _ = download(tmp_path, url)
    assert archive.read_bytes() == DATA and seen == [1, 2]


def test_the_overall_deadline(tmp_path: Path, serve):
    def handler(sock: socket.socket, _n: int) -> None:
        sock.sendall(head("200 OK", 10_000_000))
        for _ in range(1000):  # 1 KB every 5 ms: above the minimum rate, but 10 MB is far
            sock.sendall(b"x" * 1000)
            time.sleep(0.005)

    url, seen = serve(handler)
    err, elapsed = failing(tmp_path, url, NetLimits(deadline=1.5, min_rate=100, retries=3))
    assert "not complete within the deadline of 1.5 s" in err.why and seen == [1]
    assert elapsed < 4


def test_a_wrong_hash_is_not_retried(tmp_path: Path, serve):
    url, seen = serve(lambda sock, n: sock.sendall(head("200 OK", 8) + b"tampered"))
    recipe = recipe_for(tmp_path, sdist_entry(SHA, url))
    with pytest.raises(SourceError) as info:
        fetch(recipe, tmp_path / "cache", [], limits=FAST)
    assert "does not match the recipe" in info.value.what and seen == [1]


@pytest.mark.integration
def test_managed_env_pip_gets_timeout_and_retries(tmp_path: Path, serve):
    """pip in a managed environment runs with --timeout and --retries; a user's
    torch-pip-args come after them and win (here --retries 1: two requests to a 503)."""
    url, seen = serve(lambda sock, n: sock.sendall(head("503 Service Unavailable", 0)))
    index_url = url.rsplit("/", 1)[0] + "/simple/"
    log = tmp_path / "pip.log"
    with pytest.raises(ToolchainError) as info:
        buildenv._pip_install(Path(sys.executable),
                              ["--retries", "1", "--isolated", "--no-cache-dir", "--dry-run",
                               "--index-url", index_url, "wheelforge-no-such-project"],
                              lambda _m: None, log)
    assert "wheelforge-no-such-project" in info.value.what
    assert " --timeout 30 --retries 5 --retries 1 " in log.read_text().splitlines()[0]
    assert seen == [1, 2]


@pytest.mark.integration
def test_a_git_server_that_stops_sending_is_cut_off(tmp_path: Path, serve):
    """git over http gets the download's stall limit (GIT_HTTP_LOW_SPEED_LIMIT/_TIME):
    a server that answers git's first request with a header and then nothing fails the
    fetch within about stall_timeout, instead of hanging the build."""
    from test_git_source import recipe_for as git_recipe

    def stall(sock: socket.socket, _n: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: "
                     b"application/x-git-upload-pack-advertisement\r\n"
                     b"Content-Length: 100000\r\n\r\n001e# service=git-upload-pack\n")
        time.sleep(20)

    url, seen = serve(stall)
    repo = url.rsplit("/", 1)[0] + "/demo.git"
    recipe = git_recipe(tmp_path, f"url: '{repo}', commit: {'a' * 40}")
    start = time.monotonic()
    with pytest.raises(SourceError) as info:
        fetch(recipe, tmp_path / "cache", [], limits=NetLimits(stall_timeout=2, retries=0))
    elapsed = time.monotonic() - start
    assert info.value.exit_code == 4
    assert repo in info.value.why and "git fetch failed" in info.value.why
    assert seen and elapsed < 12, elapsed
