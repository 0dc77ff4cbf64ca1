"""The nginx configuration of docs/index.md, run as written (only `listen` and `root`
replaced) on 127.0.0.1 with a temporary prefix: PEP 691 negotiation and content types,
hidden files, sidecars and symlinks refused, and pip installing from it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, require_tool
from test_index import PIP_ACCEPT, fetch, pip_download, populate, raw_get

JSON = "application/vnd.pypi.simple.v1+json"


def docs_config() -> str:
    text = (REPO / "docs" / "index.md").read_text()
    (block,) = re.findall(r"```nginx\n(.*?)```", text, re.S)
    return block


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nginx(prefix: Path, root: Path) -> tuple[subprocess.Popen[bytes], int]:
    nginx = require_tool("nginx", "/usr/sbin/nginx")
    port = free_port()
    site = docs_config()
    site, n = re.subn(r"^    listen 8080;$", f"    listen 127.0.0.1:{port};", site, flags=re.M)
    assert n == 1
    site, n = re.subn(r"^    root /srv/wheelforge/index;$", f"    root {root};", site, flags=re.M)
    assert n == 1
    (prefix / "logs").mkdir(parents=True)
    (prefix / "wheelforge-index.conf").write_text(site)
    temps = "\n".join(f"    {kind}_temp_path {prefix}/{kind};"
                      for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (prefix / "nginx.conf").write_text(f"""\
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 2;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log {prefix}/logs/access.log;
{temps}
    include {prefix}/wheelforge-index.conf;
}}
""")
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-e", str(prefix / "logs/error.log"),
                             "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else b""
            log = (prefix / "logs/error.log").read_text(errors="replace")
            pytest.fail(f"nginx exited with {proc.returncode}: {out.decode()}{log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("nginx did not listen within 20 s")


def stop_nginx(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # SIGTERM: a fast shutdown of the master and its workers
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def nginx_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, bytes]]:
    tmp = tmp_path_factory.mktemp("nginx")
    root = populate(tmp / "index", tmp / "dist")
    secret = b"TOP-SECRET-OUTSIDE-THE-INDEX"
    (tmp / "outside").mkdir()
    (tmp / "outside" / "secret.whl").write_bytes(secret)
    (root / "files" / "evil-1.0-py3-none-any.whl").symlink_to(tmp / "outside" / "secret.whl")
    (root / "files" / ".wf-tmp-partial").write_bytes(b"partial")
    proc, port = start_nginx(tmp / "prefix", root)
    try:
        yield f"http://127.0.0.1:{port}", root, secret
    finally:
        stop_nginx(proc)


@pytest.mark.parametrize(
    ("accept", "content_type", "page"),
    [
        (None, "text/html; charset=utf-8", "index.html"),
        ("text/html", "text/html; charset=utf-8", "index.html"),
        (JSON, JSON, "index.json"),
        ("application/vnd.pypi.simple.latest+json", JSON, "index.json"),
        (PIP_ACCEPT, JSON, "index.json"),
        ("application/vnd.pypi.simple.v1+json;q=1.0, text/html;q=0.5", JSON, "index.json"),
        ("text/html, application/vnd.pypi.simple.v1+json;q=0.5", "text/html; charset=utf-8",
         "index.html"),
        ("application/json", "text/html; charset=utf-8", "index.html"),
    ],
)
@pytest.mark.parametrize("path", ["/simple/", "/simple/demo-pkg/", "/cu130-torch2.14/simple/",
                                  "/cu130-torch2.14/simple/helper/"])
def test_nginx_negotiates_simple_pages(nginx_index: tuple[str, Path, bytes], accept: str | None,
                                       content_type: str, page: str, path: str):
    base, root, _ = nginx_index
    status, headers, body = fetch(base + path, accept)
    assert (status, headers["Content-Type"], headers["Vary"]) == (200, content_type, "Accept")
    assert body == (root / path.strip("/") / page).read_bytes()


def test_nginx_serves_files_and_redirects(nginx_index: tuple[str, Path, bytes]):
    base, root, _ = nginx_index
    wheel = next((root / "files").glob("helper-*.whl"))
    quoted = "/files/" + urllib.parse.quote(wheel.name)
    status, headers, body = fetch(base + quoted)
    assert (status, headers["Content-Type"], body) == (200, "application/octet-stream",
                                                        wheel.read_bytes())
    status, headers, body = fetch(base + quoted + ".metadata")
    assert (status, headers["Content-Type"]) == (200, "application/octet-stream")
    status, headers, _ = fetch(base + "/")
    assert (status, headers["Content-Type"]) == (200, "text/html; charset=utf-8")
    status, headers, _ = fetch(base + "/simple/demo-pkg")
    assert (status, headers["Location"]) == (301, "/simple/demo-pkg/")
    assert fetch(base + "/simple/", method="POST")[0] == 405


@pytest.mark.parametrize(
    "target",
    ["/.lock", "/.records/_summary.json", "/files/helper-2.0-py3-none-any.whl.wf.json",
     "/files/.wf-tmp-partial", "/files/evil-1.0-py3-none-any.whl", "/files/",
     "/../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/files/%2e%2e/%2e%2e/outside/secret.whl"],
)
def test_nginx_never_serves_hidden_files_or_outside(nginx_index: tuple[str, Path, bytes],
                                                    target: str):
    base, _, secret = nginx_index
    status, response = raw_get(base, target)
    assert status in (400, 403, 404), (target, status)
    assert secret not in response and b"partial" not in response and b'"sha256"' not in response


def test_pip_downloads_through_nginx(nginx_index: tuple[str, Path, bytes], tmp_path: Path):
    base, root, _ = nginx_index
    wheel = pip_download(base + "/cu130-torch2.14/simple/", "helper", tmp_path / "dl")
    assert wheel.read_bytes() == (root / "files" / wheel.name).read_bytes()
    log = (root.parent / "prefix" / "logs" / "access.log").read_text()
    assert '"GET /cu130-torch2.14/simple/helper/ HTTP/1.1" 200' in log
