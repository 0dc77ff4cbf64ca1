"""`wheelforge outdated`: releases after the pin on a fake index (a real HTTP server on
127.0.0.1 speaking the PyPI JSON API), tags and commits of a local git mirror, and
whether the series applies to each; recipes and patches are never written."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, make_sdist, write_recipe

SETUP = "".join(f"line {i}\n" for i in range(1, 21))
PATCH = ("--- a/setup.py\n+++ b/setup.py\n@@ -4,3 +4,3 @@\n line 4\n-line 5\n+LINE 5\n"
         " line 6\n")


def wf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), NO_COLOR="1")
    env.pop("WHEELFORGE_INDEX_URL", None)
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def upstream_repo(root: Path, setup: str, tag: str) -> tuple[Path, str]:
    """A git repository ROOT/upstream whose one commit holds ``setup`` as setup.py, tagged
    ``tag``; returns the repository and that commit."""
    up = root / "upstream"
    up.mkdir()
    git("init", "-q", "-b", "main", cwd=up)
    (up / "setup.py").write_text(setup)
    git("add", ".", cwd=up)
    git("commit", "-qm", "one", cwd=up)
    git("tag", tag, cwd=up)
    return up, git("rev-parse", "HEAD", cwd=up)


def tag_release(up: Path, setup: str, tag: str) -> str:
    """A second commit of ``up`` with ``setup`` as setup.py, tagged ``tag`` (annotated, as
    releases are); returns that commit."""
    (up / "setup.py").write_text(setup)
    git("commit", "-qam", "two", cwd=up)
    git("tag", "-a", "-m", "release", tag, cwd=up)
    return git("rev-parse", f"{tag}^{{commit}}", cwd=up)


def mirror_of(up: Path, root: Path) -> Path:
    """A bare mirror of ``up`` at ROOT/mirror.git (what --git-mirror names)."""
    mirror = root / "mirror.git"
    git("clone", "-q", "--mirror", str(up), str(mirror), cwd=root)
    return mirror


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """A static HTTP server on 127.0.0.1 for ``root``; yields its base URL."""
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(root))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def tree(root: Path, setup: str) -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text(setup)
    return root


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """demo 1.0 pinned; the index has 1.1 (series applies), 1.2 (does not), 2.0rc1 (a
    pre-release), 1.3 (all files yanked) and 0.9 (older)."""
    www = tmp_path / "www"
    files = www / "files"
    _, sha10 = make_sdist(tree(tmp_path / "s10", SETUP), files, "demo", "1.0")
    _, sha11 = make_sdist(tree(tmp_path / "s11", SETUP.replace("line 18", "line XVIII")),
                          files, "demo", "1.1")
    _, sha12 = make_sdist(tree(tmp_path / "s12", SETUP.replace("line 5\n", "line five\n")),
                          files, "demo", "1.2")
    with serve(www) as url:
        def sdist(v: str, sha: str, **kw: object) -> dict[str, object]:
            return {"filename": f"demo-{v}.tar.gz", "packagetype": "sdist",
                    "url": f"{url}/files/demo-{v}.tar.gz", "digests": {"sha256": sha}, **kw}
        doc = {"info": {"name": "demo"}, "releases": {
            "0.9": [], "1.0": [sdist("1.0", sha10)], "1.1": [sdist("1.1", sha11)],
            "1.2": [sdist("1.2", sha12)], "2.0rc1": [sdist("1.1", sha11)],
            "1.3": [sdist("1.3", "0" * 64, yanked=True)]}}
        (www / "pypi" / "demo").mkdir(parents=True)
        (www / "pypi" / "demo" / "json").write_text(json.dumps(doc))
        body = ("# keep me\nformat: 1\nname: demo\nversion: '1.0'\nsources:\n"
                f"  - sdist: {{filename: demo-1.0.tar.gz, sha256: '{sha10}', "
                f"url: '{url}/files/demo-1.0.tar.gz'}}\npatches: [0001-fix.patch]\n"
                "build: {kind: pure}\n")
        write_recipe(tmp_path, "demo", body, {"0001-fix.patch": PATCH})
        yield tmp_path, url


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for d in ("recipes", "patches")
            for p in sorted((root / d).rglob("*")) if p.is_file()}


def test_outdated_json_against_a_fake_index(index: tuple[Path, str]) -> None:
    root, url = index
    before = snapshot(root)
    res = wf("outdated", "--json", "--index-url", url, cwd=root)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    [demo] = doc["recipes"]
    assert demo["pinned"] == "1.0" and demo["problems"] == []
    got = {n["version"]: (n["found"], n["series"]) for n in demo["newer"]}
    assert got == {"1.1": ("index", "applies"), "1.2": ("index", "does not apply")}
    detail = next(n["detail"] for n in demo["newer"] if n["version"] == "1.2")
    assert detail == "patch 0001-fix.patch does not apply to demo 1.2 (hunk 1 at setup.py:4)"
    assert snapshot(root) == before


def test_outdated_table(index: tuple[Path, str]) -> None:
    root, url = index
    res = wf("outdated", "demo", "--index-url", url, cwd=root)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["recipe", "pinned", "upstream", "series"]
    assert lines[1].split() == ["demo", "1.0", "1.1", "(index)", "applies:", "1", "patch(es)"]
    assert lines[2].startswith("demo    1.0     1.2 (index)  does not apply: patch 0001-fix")


def test_outdated_unreachable_index_is_reported(index: tuple[Path, str]) -> None:
    root, _ = index
    res = wf("outdated", "--json", "--index-url", "http://127.0.0.1:9", "--timeout", "5",
             cwd=root)
    assert res.returncode == 0, res.stderr
    [demo] = json.loads(res.stdout)["recipes"]
    assert demo["newer"] == []
    assert demo["problems"][0].startswith("http://127.0.0.1:9/pypi/demo/json: cannot be read")


def test_outdated_git_mirror(tmp_path: Path) -> None:
    up, pinned = upstream_repo(tmp_path, SETUP, "v1.0")
    tag_release(up, SETUP.replace("line 5\n", "line five\n"), "v1.1")
    (up / "other.py").write_text("x = 1\n")
    git("add", ".", cwd=up)
    git("commit", "-qm", "three", cwd=up)
    head = git("rev-parse", "HEAD", cwd=up)
    mirror = mirror_of(up, tmp_path)
    remote = "http://127.0.0.1:9/demo.git"  # never contacted: the mirror serves it
    body = (f"format: 1\nname: demo\nversion: '1.0'\nsources:\n  - git: {{url: '{remote}', "
            f"commit: {pinned}, tag: v1.0}}\npatches: [0001-fix.patch]\nbuild: {{kind: pure}}\n")
    write_recipe(tmp_path, "demo", body, {"0001-fix.patch": PATCH})
    before = snapshot(tmp_path)
    res = wf("outdated", "--json", "--git-mirror", f"{remote}={mirror}", "--index-url",
             "http://127.0.0.1:9", "--timeout", "5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    [demo] = json.loads(res.stdout)["recipes"]
    assert demo["head"] == head and demo["commits_after_pin"] == 2
    assert [(n["version"], n["found"], n["series"]) for n in demo["newer"]] == [
        ("1.1", "tag v1.1", "does not apply")]
    assert demo["problems"] == []  # a git-only recipe does not ask the index
    assert snapshot(tmp_path) == before
