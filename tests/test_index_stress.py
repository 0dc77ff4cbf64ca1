"""The index under concurrency and crashes.

* 16 publisher processes publish into one index at once while 4 reader threads (two on
  the files, two over HTTP through make_server) read every page, HTML and JSON, follow
  every link and re-hash every file and its PEP 658 metadata: no read may be torn, missing
  or mismatching.
* A publisher is SIGKILLed at a random moment, at least 20 times: no file under a final
  name is ever truncated, the pages always parse and their links hold, and the next
  publish (or rebuild) repairs everything.

Set WF_STRESS_SEED to replay the random kill delays of a failed run (its seed is in the
failure message).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel
from wheelforge import index
from wheelforge._fs import TMP_PREFIX

PUBLISHERS = 16
WHEELS_EACH = 3
KILL_TRIALS = 24
KILL_WINDOW_S = 0.05
DEADLINE_S = 50
TARGETS: list[dict[str, Any]] = [
    {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1", "archs": ["sm_120"],
     "build_key": "k130"},
    {"channel": "cu128-torch2.14", "cuda": "12.8", "torch": "2.14.1",
     "archs": ["sm_100", "sm_120"], "build_key": "k128"},
    {"channel": None, "cuda": None, "torch": None, "archs": [], "build_key": None},
]
LINUX = "cp311-cp311-linux_x86_64"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"

PUBLISHER = """
import json, os, sys, time
from pathlib import Path
from wheelforge import index

root, go, jobs = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
for wheel, target in jobs:
    index.publish(root, Path(wheel), **target)
"""


def build(dist: Path, name: str, version: str, target: dict[str, Any]) -> Path:
    """A tiny wheel: a platform wheel for a CUDA target, a pure one otherwise."""
    module = name.replace("-", "_")
    tag = LINUX if target["channel"] else "py3-none-any"
    return make_wheel(dist, {f"{module}/__init__.py": f"V = {version!r}\n"}, name=name,
                      version=version, tag=tag, metadata_extra="Summary: stress test wheel")


def spawn(root: Path, go: Path, jobs: list[tuple[Path, dict[str, Any]]]) -> subprocess.Popen[str]:
    payload = json.dumps([(str(w), t) for w, t in jobs])
    return subprocess.Popen([sys.executable, "-c", PUBLISHER, str(root), str(go), payload],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- a reader


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def anchors(page: bytes, url: str) -> list[dict[str, str | None]]:
    text = page.decode("utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n"), f"torn {url}"
    parser = _Anchors()
    parser.feed(text)
    parser.close()
    return parser.anchors


Fetch = Callable[[str, str | None], bytes]


def fetch_file(url: str, _accept: str | None) -> bytes:
    path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    if path.endswith("/"):
        path += "index.json" if _accept == JSON_TYPE else "index.html"
    return Path(path).read_bytes()


def fetch_http(url: str, accept: str | None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: bytes = response.read()
        assert len(data) == int(response.headers["Content-Length"]), f"short read of {url}"
        return data


def check_file(fetch: Fetch, url: str, sha: str, metadata: Any) -> None:
    """The file at ``url`` hashes to ``sha``; its PEP 658 metadata to ``metadata``'s."""
    data = fetch(url, None)
    assert sha256(data) == sha, f"{url}: sha256 mismatch"
    if metadata:
        meta_sha = metadata["sha256"] if isinstance(metadata, dict) else metadata
        meta_sha = meta_sha.removeprefix("sha256=")
        assert sha256(fetch(url + ".metadata", None)) == meta_sha, f"{url}.metadata mismatch"


def read_everything(fetch: Fetch, base: str) -> int:
    """Read the landing page, every simple root (HTML and JSON), every project page and
    every file they link to; AssertionError on the first inconsistency.  Returns the
    number of files verified."""
    landing = fetch(base + "index.html", None)
    roots = [base + "simple/"] + [
        urllib.parse.urljoin(base, a["href"] or "") for a in anchors(landing, base)
        if re.fullmatch(r"[a-z0-9][a-z0-9._-]*/simple/", a["href"] or "")
        and a["href"] != "simple/"
    ]
    verified = 0
    for root in roots:
        projects = [a["href"] or "" for a in anchors(fetch(root, HTML_TYPE), root)]
        listed = {p["name"] for p in json.loads(fetch(root, JSON_TYPE))["projects"]}
        assert listed, f"{root}: empty JSON root"
        for href in projects:
            page = urllib.parse.urljoin(root, href)
            for a in anchors(fetch(page, HTML_TYPE), page):
                url, _, fragment = urllib.parse.urljoin(page, a["href"] or "").partition("#")
                check_file(fetch, url, fragment.removeprefix("sha256="),
                           a.get("data-core-metadata"))
                verified += 1
            for f in json.loads(fetch(page, JSON_TYPE))["files"]:
                url = urllib.parse.urljoin(page, f["url"]).partition("#")[0]
                check_file(fetch, url, f["hashes"]["sha256"], f["core-metadata"])
                verified += 1
    return verified


def check_at_rest(root: Path) -> None:
    """No file under a final name is truncated, and every page parses and links right."""
    for wheel in sorted((root / "files").glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            assert zf.testzip() is None, wheel
            (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            metadata = zf.read(meta_name)
        sidecar = wheel.with_name(wheel.name + ".wf.json")
        if sidecar.exists():
            record = index.from_json(sidecar.read_bytes())
            data = wheel.read_bytes()
            assert (record.sha256, record.size) == (sha256(data), len(data)), wheel
        meta_file = wheel.with_name(wheel.name + ".metadata")
        if meta_file.exists():
            assert meta_file.read_bytes() == metadata, meta_file
    if (root / "index.html").exists():
        read_everything(fetch_file, root.as_uri() + "/")


def pages(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("index.*"))
            if p.relative_to(root).parts[0] not in ("files", ".records")}


def check_repaired(root: Path) -> None:
    """Nothing left over, every wheel listed with its hash, pages equal to a rebuild."""
    assert [p for p in root.rglob(f"{TMP_PREFIX}*")] == []
    assert not (root / ".records" / "_writing").exists()
    on_disk = {w.name: sha256(w.read_bytes()) for w in (root / "files").glob("*.whl")}
    listed = {}
    for page in (root / "simple").glob("*/index.json"):
        listed.update({f["filename"]: f["hashes"]["sha256"]
                       for f in json.loads(page.read_text())["files"]})
    assert listed == on_disk
    check_at_rest(root)
    before = pages(root)
    index.rebuild(root)
    assert pages(root) == before


# --------------------------------------------------------------------------- concurrency


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "index"
    root.mkdir()
    httpd = index.make_server(root)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_concurrent_publishers_and_readers(served: tuple[Path, str], tmp_path: Path):
    root, http_base = served
    index.publish(root, build(tmp_path / "seed", "stress-0", "0.1", TARGETS[2]), **TARGETS[2])
    go = tmp_path / "go"
    jobs = [[(build(tmp_path / f"dist{i}", f"stress-{i % 5}", f"1.{i}.{j}", TARGETS[(i + j) % 3]),
              TARGETS[(i + j) % 3]) for j in range(WHEELS_EACH)] for i in range(PUBLISHERS)]
    publishers = [spawn(root, go, batch) for batch in jobs]
    for proc in publishers:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"

    done = threading.Event()
    errors: list[str] = []
    stats: list[tuple[int, int, int]] = []  # per reader: passes, passes during publishing, files

    def reader(fetch: Fetch, base: str) -> None:
        passes = during = files = 0
        try:
            while True:
                finished = done.is_set()  # read before the pass: a last full pass after the end
                files += read_everything(fetch, base)
                passes += 1
                during += not finished
                if finished:
                    break
        except Exception as exc:  # noqa: BLE001 (reported below, with its type)
            errors.append(f"{base}: {type(exc).__name__}: {exc}")
        stats.append((passes, during, files))

    readers = [threading.Thread(target=reader, args=args) for args in
               [(fetch_file, root.as_uri() + "/")] * 2 + [(fetch_http, http_base)] * 2]
    for thread in readers:
        thread.start()
    go.touch()
    deadline = time.monotonic() + DEADLINE_S
    try:
        for proc in publishers:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, err
    finally:
        done.set()
        for thread in readers:
            thread.join(timeout=60)
    assert errors == []
    assert len(stats) == 4 and all(during >= 1 and files > 0 for _p, during, files in stats), stats

    published = {w.name for batch in jobs for w, _t in batch}
    assert published <= {p.name for p in (root / "files").glob("*.whl")}
    check_repaired(root)
    for channel in ("cu130-torch2.14", "cu128-torch2.14"):
        in_channel = {f["filename"] for p in (root / channel / "simple").glob("*/index.json")
                      for f in json.loads(p.read_text())["files"]}
        expected = {w.name for batch in jobs for w, t in batch if t["channel"] in (channel, None)}
        assert expected <= in_channel


# --------------------------------------------------------------------------- crashes


def test_sigkill_during_publish_never_corrupts_and_the_next_change_repairs(tmp_path: Path):
    seed = int(os.environ.get("WF_STRESS_SEED") or random.SystemRandom().randrange(1 << 32))
    rng = random.Random(seed)
    root = tmp_path / "index"
    for i, target in enumerate(TARGETS):
        index.publish(root, build(tmp_path / "seed", f"base-{i}", "1.0", target), **target)
    go = tmp_path / "go"
    go.touch()  # start at once
    mid_change = 0
    started = time.monotonic()
    for trial in range(KILL_TRIALS):
        context = f"seed {seed}, trial {trial}"
        dist = tmp_path / f"dist{trial}"
        batch = [(build(dist, f"crash-{(trial + j) % 4}", f"{trial}.{j}", TARGETS[(trial + j) % 3]),
                  TARGETS[(trial + j) % 3]) for j in range(8)]
        proc = spawn(root, go, batch)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n", context
        time.sleep(rng.uniform(0, KILL_WINDOW_S))
        proc.kill()
        proc.communicate(timeout=30)
        mid_change += (root / ".records" / "_writing").exists()

        try:
            check_at_rest(root)  # the old (or new) state is whole
            if trial % 2:
                index.rebuild(root)
            else:
                index.publish(root, build(dist, "next", f"{trial}", TARGETS[2]), **TARGETS[2])
            check_repaired(root)
            for wheel, target in batch:  # publishing again completes what was interrupted
                if (root / "files" / wheel.name).exists():
                    record = index.publish(root, wheel, **target).record
                    assert record.channel == target["channel"], wheel.name
        except AssertionError as exc:
            raise AssertionError(f"{context}: {exc}") from exc
    elapsed = time.monotonic() - started
    check_repaired(root)
    # the kills landed inside changes, not only before or between them
    assert mid_change >= KILL_TRIALS // 4, (seed, mid_change)
    assert elapsed < DEADLINE_S, elapsed
