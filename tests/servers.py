"""Real servers for the shared compile cache tests: redis-server and an nginx WebDAV
location, each on 127.0.0.1 at a free port, in a temporary directory, stopped after."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import require_tool

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
{user}
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_max_body_size 1g;
    server {{
        listen 127.0.0.1:{port};
        location /ccache/ {{
            root {root}/dav;
            dav_methods PUT DELETE MKCOL;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server did not listen on 127.0.0.1:{port}: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def redis(root: Path) -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a fresh redis-server (no persistence) until exit."""
    exe = require_tool("redis-server")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                 "--appendonly", "no", "--dir", str(root),
                                 "--protected-mode", "yes"], stdout=out, stderr=out)
    try:
        _wait_port(port, proc, log)
        yield f"redis://127.0.0.1:{port}"
    finally:
        _stop(proc)


@contextlib.contextmanager
def webdav(root: Path) -> Iterator[str]:
    """``http://127.0.0.1:PORT/ccache/`` of a fresh nginx WebDAV location until exit."""
    exe = require_tool("nginx", "/usr/sbin/nginx")
    root.mkdir(parents=True, exist_ok=True)
    (root / "dav" / "ccache").mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    user = "user root;" if os.geteuid() == 0 else ""  # workers keep the tests' user
    conf.write_text(NGINX_CONF.format(root=root, port=port, user=user))
    log = root / "stderr.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "-p", str(root), "-c", str(conf), "-e",
                                 str(root / "error.log")], stdout=out, stderr=out)
    try:
        _wait_port(port, proc, root / "error.log")
        yield f"http://127.0.0.1:{port}/ccache/"
    finally:
        _stop(proc)
