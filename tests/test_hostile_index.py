"""The upstream watchers (`wheelforge outdated`, the nightly canary) against a hostile
package index: a real HTTP server on 127.0.0.1 (tests/hostile_http.py) that serves crafted
PyPI JSON (traversal and absolute file names, hashes that are paths, file:// URLs),
drips, sends without end and redirects to file:///etc/passwd.  Each attack wrote,
deleted, hung or crashed before; now each is a clear error and nothing outside the scratch
directory is written or deleted.  Deadlines in these tests are small; what is asserted is
the error, never the time."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from conftest import make_sdist, write_recipe
from hostile_http import Hostile, body, drip, drip_head, endless, hostile_server, redirect
from test_outdated import PATCH, SETUP, tree, wf
from wheelforge.maintain import outdated
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import SdistSource

PAYLOAD = b"the server's bytes\n"
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    with hostile_server() as server:
        yield server


def recipe(root: Path, sha: str) -> RecipeBook:
    """demo 1.0, pinned to an sdist the tests never fetch (1.1 is what the index offers)."""
    write_recipe(root, "demo", "format: 1\nname: demo\nversion: '1.0'\nsources:\n"
                 f"  - sdist: {{filename: demo-1.0.tar.gz, sha256: '{sha}', "
                 "url: 'http://127.0.0.1:9/demo-1.0.tar.gz'}\npatches: [0001-fix.patch]\n"
                 "build: {kind: pure}\n", {"0001-fix.patch": PATCH})
    return RecipeBook(root / "recipes", root / "patches")


def pypi_doc(filename: str, url: str, sha: str) -> bytes:
    return json.dumps({"info": {"name": "demo"}, "releases": {"1.1": [
        {"filename": filename, "packagetype": "sdist", "url": url,
         "digests": {"sha256": sha}}]}}).encode()


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def outdated_json(root: Path, *args: str, tmpdir: Path) -> tuple[dict[str, Any], str]:
    """`wheelforge outdated --json` (its scratch directories under ``tmpdir``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmpdir))
        res = wf("outdated", "--json", *args, cwd=root)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    [demo] = json.loads(res.stdout)["recipes"]
    return demo, res.stderr


# (case, filename, sha): the scratch cache is TMPDIR/wheelforge-XXX/cache/sources/sha256/SHA/
# so five '..' climb from the sha's directory to TMPDIR, six from the file name
TRAVERSALS = [
    ("dotdot filename", "../../../../../../victim/demo-1.1.tar.gz", PAYLOAD_SHA),
    ("absolute filename", "{victim}/demo-1.1.tar.gz", PAYLOAD_SHA),
    ("hash as a path", "demo-1.1.tar.gz", "../../../../../../victim"),
    ("absolute hash", "demo-1.1.tar.gz", "{victim}"),
]


@pytest.mark.parametrize("filename, sha", [c[1:] for c in TRAVERSALS],
                         ids=[c[0] for c in TRAVERSALS])
def test_a_crafted_name_writes_nothing_outside_the_scratch_directory(
        tmp_path: Path, hostile: Hostile, filename: str, sha: str) -> None:
    recipe(tmp_path / "project", PAYLOAD_SHA)
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "tmpdir").mkdir()
    filename, sha = (x.replace("{victim}", str(victim)) for x in (filename, sha))
    hostile.routes["/files/x.tar.gz"] = body(PAYLOAD)
    hostile.routes["/pypi/demo/json"] = body(pypi_doc(filename, hostile.url + "/files/x.tar.gz",
                                                      sha))
    before = tree_of(tmp_path)
    demo, _ = outdated_json(tmp_path / "project", "--index-url", hostile.url,
                            tmpdir=tmp_path / "tmpdir")
    assert tree_of(tmp_path) == before  # nothing written (the scratch directory is gone)
    assert not list((tmp_path / "tmpdir").iterdir())
    [newer] = demo["newer"]
    assert newer["series"] == "no sdist"
    assert "the index's sdist is refused" in newer["detail"], newer
    assert "/files/x.tar.gz" not in "".join(hostile.asked)  # never downloaded


def test_a_wrong_hash_deletes_nothing(tmp_path: Path, hostile: Hostile) -> None:
    """The old cache check unlinked a 'cached' file whose hash did not match: with an
    absolute file name, any file the user can delete."""
    recipe(tmp_path / "project", PAYLOAD_SHA)
    (tmp_path / "tmpdir").mkdir()
    victim = tmp_path / "precious" / "demo-1.1.tar.gz"
    victim.parent.mkdir()
    victim.write_bytes(b"keep me")
    hostile.routes["/pypi/demo/json"] = body(pypi_doc(str(victim), hostile.url + "/x",
                                                      "0" * 64))
    demo, _ = outdated_json(tmp_path / "project", "--index-url", hostile.url,
                            tmpdir=tmp_path / "tmpdir")
    assert victim.read_bytes() == b"keep me"
    [newer] = demo["newer"]
    assert "is not a bare sdist file name" in newer["detail"]


@pytest.mark.parametrize("url, said", [
    ("file:///dev/zero", "only http:// and https:// URLs are followed"),
    ("file:///etc/passwd", "only http:// and https:// URLs are followed"),
    ("ftp://127.0.0.1:9/demo-1.1.tar.gz", "only http:// and https:// URLs are followed"),
])
def test_an_sdist_url_that_is_not_http_is_refused(tmp_path: Path, hostile: Hostile, url: str,
                                                  said: str) -> None:
    recipe(tmp_path / "project", PAYLOAD_SHA)
    (tmp_path / "tmpdir").mkdir()
    hostile.routes["/pypi/demo/json"] = body(pypi_doc("demo-1.1.tar.gz", url, "0" * 64))
    demo, _ = outdated_json(tmp_path / "project", "--index-url", hostile.url,
                            tmpdir=tmp_path / "tmpdir")
    [newer] = demo["newer"]
    assert newer["series"] == "no sdist" and said in newer["detail"], newer


def test_a_dripping_index_meets_the_deadline(tmp_path: Path, hostile: Hostile) -> None:
    """A byte every 0.2 s never trips a per-read timeout of 1 s: the whole request has
    one deadline."""
    recipe(tmp_path / "project", PAYLOAD_SHA)
    (tmp_path / "tmpdir").mkdir()
    hostile.routes["/pypi/demo/json"] = drip(b'{"releases": {}}', every=0.2)
    demo, _ = outdated_json(tmp_path / "project", "--index-url", hostile.url, "--timeout",
                            "1", tmpdir=tmp_path / "tmpdir")
    [problem] = demo["problems"]
    assert problem.startswith(f"{hostile.url}/pypi/demo/json: cannot be read"), problem
    assert "not complete within the deadline of 1 s" in problem
    assert "--timeout" in problem


def test_an_index_dripping_its_headers_meets_the_deadline(tmp_path: Path,
                                                          hostile: Hostile) -> None:
    """The response never starts: the deadline cuts the connection while the headers
    are still being read."""
    recipe(tmp_path / "project", PAYLOAD_SHA)
    (tmp_path / "tmpdir").mkdir()
    ended: list[str] = []
    hostile.routes["/pypi/demo/json"] = drip_head(every=0.2, ended=ended)
    demo, _ = outdated_json(tmp_path / "project", "--index-url", hostile.url, "--timeout",
                            "1", tmpdir=tmp_path / "tmpdir")
    [problem] = demo["problems"]
    assert "not complete within the deadline of 1 s" in problem, problem
    for _ in range(50):  # the server notices the closed connection at its next byte
        if ended:
            break
        time.sleep(0.1)
    assert ended == ["client hung up"]  # cut during the headers, not waited out


def trial(tmp_path: Path, url: str) -> tuple[str, str]:
    book = recipe(tmp_path / "project", PAYLOAD_SHA)
    source = SdistSource(filename="demo-1.1.tar.gz", sha256=PAYLOAD_SHA, url=url)
    return outdated.try_series(book.load("demo"), Version("1.1"), source, {}, 0.3)


def test_an_endless_sdist_is_cut_at_the_size_cap(tmp_path: Path, hostile: Hostile,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outdated, "MAX_SDIST_BYTES", 1 << 20)
    hostile.routes["/demo-1.1.tar.gz"] = endless()
    series, detail = trial(tmp_path, hostile.url + "/demo-1.1.tar.gz")
    assert series == "fetch failed"
    assert f"larger than the limit of {1 << 20} bytes" in detail, detail


def test_an_sdist_sent_slowly_meets_the_deadline(tmp_path: Path, hostile: Hostile) -> None:
    """Fast enough for the minimum rate, never done: the download has a deadline (ten
    request deadlines: 3 s here)."""
    hostile.routes["/demo-1.1.tar.gz"] = drip(b"x" * 10**6, every=0.0002, stop_after=30)
    series, detail = trial(tmp_path, hostile.url + "/demo-1.1.tar.gz")
    assert series == "fetch failed"
    assert "not complete within the deadline of 3 s" in detail, detail


@pytest.mark.parametrize("to", ["file:///etc/passwd", "ftp://127.0.0.1:9/demo-1.1.tar.gz"])
def test_a_redirect_away_from_http_is_refused(tmp_path: Path, hostile: Hostile,
                                              to: str) -> None:
    hostile.routes["/demo-1.1.tar.gz"] = redirect(to)
    series, detail = trial(tmp_path, hostile.url + "/demo-1.1.tar.gz")
    assert series == "fetch failed"
    assert "redirect" in detail.lower() and to in detail, detail


def test_fetch_bytes_refuses_what_is_not_http(hostile: Hostile, tmp_path: Path) -> None:
    from wheelforge.builder.source.fetch import DownloadError, NetLimits, fetch_bytes

    limits = NetLimits(connect_timeout=2, stall_timeout=2, deadline=2, retries=0,
                       max_bytes=1000)
    (tmp_path / "f").write_text("secret")
    for url, said in [((tmp_path / "f").as_uri(), "only http:// and https://"),
                      ("data:,secret", "only http:// and https://"),
                      ("http://[::1", "it is not a URL")]:
        with pytest.raises(DownloadError) as info:
            fetch_bytes(url, limits, fix="x")
        assert said in info.value.why, (url, info.value.why)
    hostile.routes["/big"] = body(b"x" * 1001)
    with pytest.raises(DownloadError) as info:
        fetch_bytes(hostile.url + "/big", limits, fix="x")
    assert "larger than the limit of 1000 bytes" in info.value.why
    hostile.routes["/to-file"] = redirect("file:///etc/passwd")
    with pytest.raises(DownloadError) as info:
        fetch_bytes(hostile.url + "/to-file", limits, fix="x")
    assert "redirection to url 'file:///etc/passwd' is not allowed" in info.value.why.lower()


@pytest.mark.parametrize("args, said", [
    (["--index-url", "http://[::1"], "the index URL 'http://[::1' cannot be used"),
    (["--index-url", "file:///etc"], "only http:// and https:// URLs are followed"),
    (["--index-url", "pypi.org"], "its scheme is missing"),
    (["--timeout", "1e308"], "--timeout 1e+308 is not a usable deadline"),
    (["--timeout", "nan"], "--timeout nan is not a usable deadline"),
    (["--timeout", "-1"], "--timeout -1.0 is not a usable deadline"),
])
def test_bad_options_are_config_errors(tmp_path: Path, args: list[str], said: str) -> None:
    recipe(tmp_path, PAYLOAD_SHA)
    res = wf("outdated", *args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and said in res.stderr, res.stderr


def test_the_canary_refuses_a_crafted_name(tmp_path: Path, hostile: Hostile) -> None:
    """The nightly canary asks the same index code: a release whose sdist names a path
    is 'not checked', with why, and the victim is untouched."""
    from test_nightly_canary import builder, night, project

    _, sha = make_sdist(tree(tmp_path / "s", SETUP), tmp_path / "www", "demo", "0.1.0")
    victim = tmp_path / "precious" / "demo-0.2.0.tar.gz"
    victim.parent.mkdir()
    victim.write_bytes(b"keep me")
    doc = json.loads(pypi_doc(str(victim), hostile.url + "/x", "0" * 64))
    doc["releases"] = {"0.2.0": doc["releases"]["1.1"]}
    hostile.routes["/pypi/demo/json"] = body(json.dumps(doc).encode())
    path, book = project(tmp_path, f"sdist: {{filename: demo-0.1.0.tar.gz, sha256: '{sha}', "
                         "url: 'http://127.0.0.1:9/demo-0.1.0.tar.gz'}",
                         {"recipes": ["demo"], "index-url": hostile.url, "timeout": 2})
    report = night(tmp_path, path, book, builder([]))
    [c] = report.canaries
    assert c.state == "not checked", c
    assert "is not a bare sdist file name" in c.reason, c.reason
    assert victim.read_bytes() == b"keep me"
