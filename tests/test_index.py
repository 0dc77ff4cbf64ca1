"""The local index: publish, pages, yank, channels, rebuild, and the HTTP server.

Test wheels are built here from a dict of files (METADATA, WHEEL, RECORD);
nothing needs the network, nvcc or torch.  pip is run for real against the
index, through file:// and through the server on 127.0.0.1.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import html
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from wheelforge import _fs, index
from wheelforge._fs import TMP_PREFIX
from wheelforge.errors import IndexWarning, PublishError
from wheelforge.index import _markup, _writes, pages, records, store

CU130 = {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1"}
CU128 = {"channel": "cu128-torch2.14", "cuda": "12.8", "torch": "2.14.1"}
NO_TARGET: dict[str, Any] = {"channel": None, "cuda": None, "torch": None}
LINUX = "cp311-cp311-linux_x86_64"
PURE = "py3-none-any"


# --------------------------------------------------------------------------- helpers


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    directory: Path,
    name: str = "demo-pkg",
    version: str = "1.0",
    tag: str = PURE,
    *,
    summary: str = "A demo package",
    requires_python: str | None = ">=3.9",
    metadata_name: str | None = None,
    payload: bytes = b"VALUE = 1\n",
) -> Path:
    """A valid wheel (METADATA, WHEEL, RECORD) built from a dict of files."""
    dist = re.sub(r"[-_.]+", "_", name)
    dist_info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {metadata_name or name}\nVersion: {version}\n"
    metadata += f"Summary: {summary}\n"
    if requires_python is not None:
        metadata += f"Requires-Python: {requires_python}\n"
    files = {
        f"{dist}/__init__.py": payload,
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {str(tag == PURE).lower()}\n"
            f"Tag: {tag}\n"
        ).encode(),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def wheel_metadata(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, Any]] = []
        self.meta: dict[str, str] = {}
        self.titles: list[str] = []
        self._current: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "a":
            self._current = {**values, "text": ""}
            self.anchors.append(self._current)
        elif tag == "meta" and "name" in values:
            self.meta[values["name"] or ""] = values.get("content") or ""
        if "title" in values and tag != "a":
            self.titles.append(values["title"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._current["text"] += data


def parse_html(path: Path) -> _Anchors:
    parser = _Anchors()
    parser.feed(path.read_text("utf-8"))
    parser.close()
    return parser


def page_dirs(root: Path) -> list[Path]:
    """Every directory holding a generated index.json (simple roots and projects)."""
    return sorted(p.parent for p in root.rglob("index.json") if ".records" not in p.parts)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every generated page, by relative path."""
    pages = {}
    for path in sorted(root.rglob("index.*")):
        rel = path.relative_to(root)
        if rel.parts[0] not in ("files", ".records"):
            pages[str(rel)] = path.read_bytes()
    return pages


def publish(root: Path, wheel: Path, target: dict[str, Any] | None = None,
            archs: tuple[str, ...] = ("sm_120",), build_key: str | None = "key-1"
            ) -> index.PublishResult:
    target = NO_TARGET if target is None else target
    return index.publish(root, wheel, archs=archs if target["channel"] else (),
                         build_key=build_key, **target)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "index"


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    return tmp_path / "dist"


def populate(root: Path, dist: Path) -> Path:
    """Two CUDA builds of demo-pkg in two channels, a pure helper, a channel-less
    platform wheel, and a yanked version."""
    publish(root, make_wheel(dist, version="1.0+cu130torch2.14", tag=LINUX), CU130)
    publish(root, make_wheel(dist, version="1.0+cu128torch2.14", tag=LINUX), CU128)
    publish(root, make_wheel(dist, version="0.9+cu130torch2.14", tag=LINUX), CU130)
    publish(root, make_wheel(dist, name="helper", version="2.0"))
    publish(root, make_wheel(dist, name="native-only", version="1.0", tag=LINUX))
    index.yank(root, "demo-pkg", "0.9+cu130torch2.14", "broken ABI")
    return root


@pytest.fixture(scope="module")
def populated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("template")
    return populate(tmp_path / "index", tmp_path / "dist")


@pytest.fixture
def populated(root: Path, populated_template: Path) -> Path:
    """A private copy of the populated index (copying is cheaper than publishing)."""
    shutil.copytree(populated_template, root, symlinks=True)
    return root


# --------------------------------------------------------------------------- publish


def test_publish_copies_the_wheel_and_writes_metadata_sidecar_and_pages(root: Path, dist: Path):
    wheel = make_wheel(dist, name="Demo.Pkg", version="1.0+cu130torch2.14", tag=LINUX)
    result = index.publish(root, wheel, archs=["sm_120", "sm_90"], build_key="abc", **CU130)

    assert not result.noop
    assert result.path == root / "files" / wheel.name
    assert result.path.read_bytes() == wheel.read_bytes()
    assert (root / "files" / f"{wheel.name}.metadata").read_bytes() == wheel_metadata(wheel)
    sidecar = index.from_json((root / "files" / f"{wheel.name}.wf.json").read_text())
    assert sidecar == result.record
    record = result.record
    assert record.project == "demo-pkg"
    assert record.version == "1.0+cu130torch2.14"
    assert (record.sha256, record.size) == (sha256(wheel), wheel.stat().st_size)
    assert record.requires_python == ">=3.9"
    assert record.summary == "A demo package"
    assert (record.channel, record.cuda, record.torch) == ("cu130-torch2.14", "13.0", "2.14.1")
    assert record.archs == ("sm_90", "sm_120")
    assert record.build_key == "abc"
    assert record.yanked is None and record.tested is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record.upload_time)
    assert record.metadata_sha256 == hashlib.sha256(wheel_metadata(wheel)).hexdigest()
    for page in ("simple/index.html", "simple/index.json", "simple/demo-pkg/index.html",
                 "simple/demo-pkg/index.json", "cu130-torch2.14/simple/index.json",
                 "cu130-torch2.14/simple/demo-pkg/index.html", "index.html"):
        assert (root / page).is_file(), page
    assert index.load_records(root) == [record]


def test_published_files_and_pages_are_world_readable(root: Path, dist: Path):
    publish(root, make_wheel(dist))
    for path in [*root.joinpath("files").iterdir(), *root.rglob("index.*")]:
        assert path.stat().st_mode & 0o044 == 0o044, path


def test_publishing_the_same_bytes_again_is_a_noop(root: Path, dist: Path):
    wheel = make_wheel(dist)
    first = publish(root, wheel)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and p.name != ".lock"}

    again = publish(root, wheel)

    assert again.noop and again.record == first.record and again.path == first.path
    after = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_different_bytes_under_a_published_name_are_refused(root: Path, dist: Path, tmp_path: Path):
    wheel = make_wheel(dist)
    publish(root, wheel)
    original = wheel.read_bytes()
    other = make_wheel(tmp_path / "other", payload=b"VALUE = 2\n")
    assert other.name == wheel.name

    with pytest.raises(PublishError) as excinfo:
        publish(root, other)

    assert "already published" in excinfo.value.what
    assert "immutable" in excinfo.value.why
    assert "bump the build" in excinfo.value.fix and "yank" in excinfo.value.fix
    assert (root / "files" / wheel.name).read_bytes() == original


def test_the_same_wheel_for_another_target_is_refused(root: Path, dist: Path):
    wheel = make_wheel(dist, version="1.0+cu130torch2.14", tag=LINUX)
    publish(root, wheel, CU130)
    with pytest.raises(PublishError, match="another build target") as excinfo:
        publish(root, wheel, CU128)
    assert "channel" in excinfo.value.why


def test_an_interrupted_publish_is_finished(root: Path, dist: Path):
    wheel = make_wheel(dist)
    (root / "files").mkdir(parents=True)
    shutil.copy(wheel, root / "files" / wheel.name)  # crashed before .metadata and sidecar

    result = publish(root, wheel)

    assert not result.noop
    assert (root / "files" / f"{wheel.name}.wf.json").is_file()
    assert [a["text"] for a in parse_html(root / "simple/demo-pkg/index.html").anchors] == [
        wheel.name
    ]


@pytest.mark.parametrize(
    ("build", "target", "match"),
    [
        (lambda d: make_wheel(d).rename(d / "not-a-wheel.whl"), {}, "not a valid wheel file name"),
        (lambda d: make_wheel(d, metadata_name="other"), {}, "inconsistent metadata"),
        (lambda d: make_wheel(d, requires_python='>=3.9"><script>'), {}, "inconsistent metadata"),
        (lambda d: make_wheel(d), {"channel": "../evil"}, "invalid build target"),
        (lambda d: make_wheel(d), {"channel": "simple"}, "invalid build target"),
        (lambda d: make_wheel(d), {"cuda": "thirteen"}, "invalid build target"),
        (lambda d: make_wheel(d), {"archs": "sm_120"}, "invalid build target"),
        (lambda d: make_wheel(d), {"archs": ['sm_120"><b>']}, "invalid build target"),
        (lambda d: (d / "junk-1.0-py3-none-any.whl").write_bytes(b"nope") and
         d / "junk-1.0-py3-none-any.whl", {}, "cannot read"),
    ],
)
def test_invalid_input_is_refused(root: Path, dist: Path, build: Any, target: dict[str, Any],
                                  match: str):
    dist.mkdir()
    wheel = build(dist)
    arguments: dict[str, Any] = {**NO_TARGET, "archs": (), "build_key": None, **target}
    with pytest.raises(PublishError, match=match):
        index.publish(root, wheel, **arguments)
    assert not (root / "files").exists() or not any((root / "files").iterdir())


@pytest.mark.parametrize(
    ("cuda", "torch", "expected"),
    [("13.0", "2.14.1", "cu130-torch2.14"), ("12.8", "2.9.0+cu128", "cu128-torch2.9"),
     ("13", "2.14", "cu130-torch2.14")],
)
def test_channel_name(cuda: str, torch: str, expected: str):
    assert index.channel_name(cuda, torch) == expected


def test_record_json_round_trips_and_rejects_malformed_sidecars():
    record = index.WheelRecord(
        filename="demo_pkg-1.0-py3-none-any.whl", project="demo-pkg", version="1.0",
        sha256="0" * 64, size=3, requires_python=None, upload_time="2025-01-01T00:00:00.000000Z",
        channel=None, cuda=None, torch=None, archs=("sm_120",), build_key=None, yanked="",
        tested={"passed": True, "cases": 3},
    )
    assert index.from_json(index.to_json(record)) == record
    data = json.loads(index.to_json(record))
    data.update(size="3", project="Demo_Pkg", channel="../../etc")
    with pytest.raises(PublishError) as excinfo:
        index.from_json(json.dumps(data))
    for field in ("size", "project", "channel"):
        assert field in excinfo.value.why


# --------------------------------------------------------------------------- pages


def assert_pages_consistent(root: Path) -> None:
    """Every page parses, JSON agrees with HTML, and every link's hashes match its files."""
    versions = {r.filename: Version(r.version) for r in index.load_records(root)}
    for directory in page_dirs(root):
        html_page = parse_html(directory / "index.html")
        data = json.loads((directory / "index.json").read_text())
        assert html_page.meta["pypi:repository-version"] == "1.1"
        assert data["meta"] == {"api-version": "1.1"}
        if "projects" in data:  # a root
            names = [p["name"] for p in data["projects"]]
            assert names == sorted(names)
            assert [a["href"] for a in html_page.anchors] == [f"{n}/" for n in names]
            assert [a["text"] for a in html_page.anchors] == names
            for name in names:
                assert (directory / name / "index.html").is_file()
            continue
        assert data["name"] == directory.name
        files = data["files"]
        assert len(files) == len(html_page.anchors) > 0
        for anchor, entry in zip(html_page.anchors, files, strict=True):
            url, _, fragment = anchor["href"].partition("#")
            assert anchor["text"] == entry["filename"]
            assert url == entry["url"]
            assert fragment == f"sha256={entry['hashes']['sha256']}"
            assert anchor.get("data-requires-python") == entry.get("requires-python")
            assert anchor["data-core-metadata"] == f"sha256={entry['core-metadata']['sha256']}"
            assert anchor["data-dist-info-metadata"] == anchor["data-core-metadata"]
            assert entry["dist-info-metadata"] == entry["core-metadata"]
            yanked = anchor.get("data-yanked")
            assert entry["yanked"] == (False if yanked is None else yanked or True)
            assert isinstance(entry["size"], int)
            assert re.fullmatch(r"\d{4}-.*Z", entry["upload-time"])
            target = (directory / urllib.parse.unquote(url)).resolve()
            assert target.parent == (root / "files").resolve()
            assert fragment == f"sha256={sha256(target)}"
            assert entry["size"] == target.stat().st_size
            metadata = target.with_name(target.name + ".metadata")
            assert anchor["data-core-metadata"] == f"sha256={sha256(metadata)}"
            assert metadata.read_bytes() == wheel_metadata(target)
        ordered = [versions[f["filename"]] for f in files]
        assert ordered == sorted(ordered)
        assert [Version(v) for v in data["versions"]] == sorted(set(ordered))


def test_pages_parse_json_agrees_with_html_and_hashes_match(populated: Path):
    assert len(page_dirs(populated)) == 10  # simple/ + 3 projects, 2 channels + 2 projects each
    assert_pages_consistent(populated)


def test_files_are_sorted_by_version_then_name(root: Path, dist: Path):
    for version in ("1.10", "1.9", "1.0"):
        publish(root, make_wheel(dist, version=version))
    publish(root, make_wheel(dist, version="1.9", tag="py2.py3-none-any"))
    data = json.loads((root / "simple/demo-pkg/index.json").read_text())
    assert data["versions"] == ["1.0", "1.9", "1.10"]
    assert [f["filename"] for f in data["files"]] == [
        "demo_pkg-1.0-py3-none-any.whl",
        "demo_pkg-1.9-py2.py3-none-any.whl",
        "demo_pkg-1.9-py3-none-any.whl",
        "demo_pkg-1.10-py3-none-any.whl",
    ]


def test_hostile_text_is_escaped_everywhere(root: Path, dist: Path):
    summary = '"><script>alert(1)</script>&amp;'
    wheel = make_wheel(dist, summary=summary, requires_python=">=3.9,<4,!=3.10.*")
    publish(root, wheel, build_key="<i>key</i>")
    reason = '<b onclick="x()">don\'t</b>\nsecond line'
    index.yank(root, "demo-pkg", "1.0", reason)

    for path in [root / "index.html", *(d / "index.html" for d in page_dirs(root))]:
        text = path.read_text()
        assert "<script>alert" not in text and "<b onclick" not in text, path
    anchor = parse_html(root / "simple/demo-pkg/index.html").anchors[0]
    assert anchor["data-requires-python"] == ">=3.9,<4,!=3.10.*"
    assert anchor["data-yanked"] == reason
    assert 'data-requires-python="&gt;=3.9,&lt;4,!=3.10.*"' in (
        root / "simple/demo-pkg/index.html").read_text()
    entry = json.loads((root / "simple/demo-pkg/index.json").read_text())["files"][0]
    assert entry["yanked"] == reason and entry["requires-python"] == ">=3.9,<4,!=3.10.*"
    landing = parse_html(root / "index.html")
    assert summary in landing.titles and reason in landing.titles
    assert (root / "files" / f"{wheel.name}.metadata").read_bytes() == wheel_metadata(wheel)


TRICKY_TEXT = [
    "", "demo_pkg-1.0+cu130torch2.14sm120-py3-none-any.whl", "&", "&amp;", "&#10;", "<", ">",
    '"', "'", "\n", "\r", "\r\n", "a\nb\rc", "<script>alert('x')</script>", 'say "hi" & <go>',
    "tab\tnul\x00bell\x07", "üñí©ødé <ü>", "\u2028\u2029\x85", "😀&😀", "&" * 50, "x" * 5000 + "'",
    "'" + "x" * 5000, ">=3.9,<4,!=3.10.*",
]


def reference_escape(text: str) -> str:
    return html.escape(text, quote=True).replace("\n", "&#10;").replace("\r", "&#13;")


@pytest.mark.parametrize("text", TRICKY_TEXT + [chr(c) for c in range(0x100)])
def test_the_escape_fast_path_equals_html_escape(text: str):
    assert _markup._e(text) == reference_escape(text)


def test_the_escape_fast_path_equals_html_escape_on_random_text():
    rng = random.Random(20250101)
    alphabet = "&<>\"'\n\r\t\x00 aZ09-_.+=;#/ü😀"
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        assert _markup._e(text) == reference_escape(text), repr(text)


def reference_file_json(r: index.WheelRecord, href: str) -> str:
    """The PEP 691 file object as json.dumps writes it (what _file_json formats by hand)."""
    entry: dict[str, Any] = {"filename": r.filename, "hashes": {"sha256": r.sha256}}
    if r.requires_python is not None:
        entry["requires-python"] = r.requires_python
    meta: dict[str, str] | bool = {"sha256": r.metadata_sha256} if r.metadata_sha256 else False
    entry["core-metadata"] = meta
    entry["dist-info-metadata"] = meta
    entry["yanked"] = (r.yanked or True) if r.yanked is not None else False
    entry["size"] = r.size
    entry["upload-time"] = r.upload_time
    return href + '",' + json.dumps(entry, ensure_ascii=False, separators=(",", ":"))[1:]


@pytest.mark.parametrize("text", TRICKY_TEXT)
@pytest.mark.parametrize("yanked", [None, "", "reason"])
@pytest.mark.parametrize("metadata_sha256", [None, "f" * 64])
def test_file_json_equals_json_dumps(text: str, yanked: str | None, metadata_sha256: str | None):
    record = index.WheelRecord(
        filename="demo_pkg-1.0-py3-none-any.whl", project="demo-pkg", version="1.0",
        sha256="0" * 64, size=1234, requires_python=text or None, upload_time=text,
        channel=None, cuda=None, torch=None, archs=(), build_key=None,
        yanked=text if yanked == "reason" else yanked, metadata_sha256=metadata_sha256,
    )
    href = _markup._quote(record.filename)
    fragment = pages._file_json(record, href)
    assert fragment == reference_file_json(record, href)
    assert json.loads('{"url":"' + fragment)["upload-time"] == text


def test_landing_page_lists_every_wheel(populated: Path):
    text = (populated / "index.html").read_text()
    landing = parse_html(populated / "index.html")
    wheel_links = [a for a in landing.anchors if a["href"].startswith("files/")]
    assert sorted(urllib.parse.unquote(a["href"][6:]) for a in wheel_links) == sorted(
        p.name for p in (populated / "files").glob("*.whl")
    )
    assert text.lower().count("<script") == 1  # the page's own: install lines, copy buttons
    assert "cu130-torch2.14/simple/" in text and "yanked" in text and "sm_120" in text
    for wheel in (populated / "files").glob("*.whl"):
        digest = sha256(wheel)
        assert f'title="{digest}"><code>{digest[:12]}</code>' in text


def test_set_tested_is_shown_on_the_landing_page(root: Path, dist: Path):
    wheel = make_wheel(dist)
    publish(root, wheel)
    record = index.set_tested(root, wheel.name, {"status": "passed", "gpu": "RTX 5090"})
    assert record.tested == {"status": "passed", "gpu": "RTX 5090"}
    assert index.load_records(root)[0].tested == record.tested
    assert '<td class="ok wrap" title="{&quot;gpu&quot;: &quot;RTX 5090&quot;, ' in (
        root / "index.html").read_text()


# --------------------------------------------------------------------------- yank


def test_yank_and_unyank_show_in_html_and_json(root: Path, dist: Path):
    wheels = [
        make_wheel(dist, version="1.0"),
        make_wheel(dist, version="1.0", tag="py2.py3-none-any"),
        make_wheel(dist, version="2.0"),
    ]
    for wheel in wheels:
        publish(root, wheel)

    def yanked() -> dict[str, Any]:
        anchors = parse_html(root / "simple/demo-pkg/index.html").anchors
        files = json.loads((root / "simple/demo-pkg/index.json").read_text())["files"]
        html_state = {a["text"]: a.get("data-yanked") for a in anchors}
        json_state = {f["filename"]: f["yanked"] for f in files}
        assert {k: (False if v is None else v or True) for k, v in html_state.items()} == json_state
        return json_state

    yanked_names = index.yank(root, "Demo_Pkg", "1.0.0", "security hole")
    assert yanked_names == sorted(w.name for w in wheels[:2])
    assert yanked() == {wheels[0].name: "security hole", wheels[1].name: "security hole",
                        wheels[2].name: False}
    assert "security hole" in (root / "index.html").read_text()

    index.yank(root, "demo-pkg", "2.0", "")
    assert yanked()[wheels[2].name] is True
    assert 'data-yanked=""' in (root / "simple/demo-pkg/index.html").read_text()

    assert index.unyank(root, "demo-pkg", "1.0") == sorted(w.name for w in wheels[:2])
    assert yanked() == {wheels[0].name: False, wheels[1].name: False, wheels[2].name: True}
    assert index.load_records(root)[2].yanked == ""

    with pytest.raises(PublishError, match="no published file"):
        index.yank(root, "demo-pkg", "3.0", "nope")
    with pytest.raises(PublishError, match="no published file"):
        index.unyank(root, "nothing-here", "1.0")


# --------------------------------------------------------------------------- channels


def _channel_files(root: Path, channel: str, project: str) -> list[str]:
    data = json.loads((root / channel / "simple" / project / "index.json").read_text())
    for entry in data["files"]:
        assert entry["url"] == "../../../files/" + urllib.parse.quote(entry["filename"])
        assert (root / channel / "simple" / project / urllib.parse.unquote(entry["url"])).is_file()
    return [f["filename"] for f in data["files"]]


def test_channels_hold_only_their_wheels_plus_pure_ones(populated: Path):
    root = populated
    for channel in ("cu130-torch2.14", "cu128-torch2.14"):
        projects = json.loads((root / channel / "simple/index.json").read_text())["projects"]
        assert [p["name"] for p in projects] == ["demo-pkg", "helper"]
        assert _channel_files(root, channel, "helper") == ["helper-2.0-py3-none-any.whl"]
        assert not (root / channel / "simple/native-only").exists()
    assert _channel_files(root, "cu130-torch2.14", "demo-pkg") == [
        f"demo_pkg-0.9+cu130torch2.14-{LINUX}.whl", f"demo_pkg-1.0+cu130torch2.14-{LINUX}.whl"
    ]
    assert _channel_files(root, "cu128-torch2.14", "demo-pkg") == [
        f"demo_pkg-1.0+cu128torch2.14-{LINUX}.whl"
    ]
    top = json.loads((root / "simple/index.json").read_text())["projects"]
    assert [p["name"] for p in top] == ["demo-pkg", "helper", "native-only"]
    assert len(json.loads((root / "simple/demo-pkg/index.json").read_text())["files"]) == 3


def test_a_new_channel_gets_the_existing_pure_wheels(root: Path, dist: Path):
    publish(root, make_wheel(dist, name="helper", version="2.0"))
    publish(root, make_wheel(dist, version="1.0+cu130torch2.14", tag=LINUX), CU130)
    assert _channel_files(root, "cu130-torch2.14", "helper") == ["helper-2.0-py3-none-any.whl"]
    publish(root, make_wheel(dist, name="helper", version="2.1"))
    assert _channel_files(root, "cu130-torch2.14", "helper") == [
        "helper-2.0-py3-none-any.whl", "helper-2.1-py3-none-any.whl"
    ]


# --------------------------------------------------------------------------- rebuild


def test_rebuild_from_files_reproduces_the_incremental_pages(populated: Path):
    root = populated
    index.set_tested(root, f"demo_pkg-1.0+cu128torch2.14-{LINUX}.whl", {"passed": False})
    before = snapshot(root)
    landing = (root / "index.html").read_bytes()
    shutil.rmtree(root / "simple")
    for channel in ("cu130-torch2.14", "cu128-torch2.14"):
        shutil.rmtree(root / channel)
    shutil.rmtree(root / ".records")
    (root / "index.html").unlink()

    assert index.rebuild(root) == 5

    assert snapshot(root) == before
    assert (root / "index.html").read_bytes() == landing
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("index.*")}
    assert index.rebuild(root) == 5
    assert {p: p.stat().st_mtime_ns for p in root.rglob("index.*")} == mtimes  # nothing rewritten


def test_rebuild_derives_a_sidecar_for_a_wheel_copied_in_by_hand(root: Path, dist: Path):
    publish(root, make_wheel(dist))
    stray = make_wheel(dist, name="extra", version="0.1")
    shutil.copy(stray, root / "files" / stray.name)

    assert index.rebuild(root) == 2

    record = index.from_json((root / "files" / f"{stray.name}.wf.json").read_text())
    assert record.sha256 == sha256(stray) and record.channel is None
    assert (root / "files" / f"{stray.name}.metadata").read_bytes() == wheel_metadata(stray)
    assert [a["text"] for a in parse_html(root / "simple/index.html").anchors] == [
        "demo-pkg", "extra"
    ]


def test_rebuild_removes_pages_no_wheel_supports(populated: Path):
    root = populated
    for path in (root / "files").glob("demo_pkg-1.0+cu128*"):
        path.unlink()
    assert index.rebuild(root) == 4
    assert not (root / "cu128-torch2.14").exists()
    assert _channel_files(root, "cu130-torch2.14", "demo-pkg")
    for path in (root / "files").glob("native_only-*"):
        path.unlink()
    assert index.rebuild(root) == 3
    assert not (root / "simple/native-only").exists()
    assert "native" not in (root / "simple/index.json").read_text()


def test_rebuild_leaves_the_garbage_collector_as_it_found_it(populated: Path):
    assert gc.isenabled()
    index.rebuild(populated)
    assert gc.isenabled()
    gc.disable()
    try:
        index.rebuild(populated)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_rebuild_refuses_a_modified_wheel(root: Path, dist: Path):
    wheel = make_wheel(dist)
    publish(root, wheel)
    with open(root / "files" / wheel.name, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(PublishError, match="sidecar says"):
        index.rebuild(root)


def test_temp_files_are_swept(root: Path, dist: Path):
    publish(root, make_wheel(dist, version="1.0+cu130torch2.14", tag=LINUX), CU130)
    in_files = root / "files" / f"{TMP_PREFIX}wheel"
    elsewhere = [root / "simple" / f"{TMP_PREFIX}root", root / "simple/demo-pkg" / f"{TMP_PREFIX}p",
                 root / "cu130-torch2.14/simple" / f"{TMP_PREFIX}x", root / f"{TMP_PREFIX}landing"]

    def leave_leftovers() -> None:
        for path in [in_files, *elsewhere]:
            path.write_bytes(b"partial")

    leave_leftovers()
    publish(root, make_wheel(dist, name="other"))
    assert not in_files.exists()  # files/ is listed, and swept, by every change

    leave_leftovers()
    index.rebuild(root)
    assert [p for p in [in_files, *elsewhere] if p.exists()] == []

    leave_leftovers()
    (root / ".records/_writing").touch()  # what a killed writer leaves behind
    publish(root, make_wheel(dist, name="other", version="2.0"))
    assert [p for p in [in_files, *elsewhere] if p.exists()] == []
    assert not (root / ".records/_writing").exists()


def test_a_failed_batch_write_renames_nothing_and_leaves_no_temp_files(tmp_path: Path):
    (tmp_path / "blocker").write_bytes(b"a file where a directory should be")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept/index.html").write_bytes(b"old")
    items = [(tmp_path / f"new{i}/index.html", b"new") for i in range(200)]
    items += [(tmp_path / "kept/index.html", b"new"), (tmp_path / "blocker/x/index.html", b"new")]

    with pytest.raises(NotADirectoryError):
        _writes._write_all(items)

    assert (tmp_path / "kept/index.html").read_bytes() == b"old"
    assert list(tmp_path.rglob("index.html")) == [tmp_path / "kept/index.html"]
    assert list(tmp_path.rglob(f"{TMP_PREFIX}*")) == []

    _writes._write_all(items[:-1])
    assert all(path.read_bytes() == b"new" for path, _data in items[:-1])
    assert list(tmp_path.rglob(f"{TMP_PREFIX}*")) == []


KILLED_PUBLISH = """
import os, sys
from pathlib import Path
from wheelforge import index

limit, calls, real_replace = int(sys.argv[1]), 0, os.replace

def replace(src, dst):
    global calls
    calls += 1
    if calls == limit:
        os._exit(17)  # die like kill -9: no finally blocks, no cleanup
    real_replace(src, dst)

os.replace = replace
index.publish(Path(sys.argv[2]), Path(sys.argv[3]), channel="cu130-torch2.14", cuda="13.0",
              torch="2.14.1", archs=["sm_120"], build_key="key-1")
"""


@pytest.mark.integration
@pytest.mark.parametrize("killed_at_rename", [1, 2, 3, 4, 5, 7, 9, 10])
def test_a_killed_publish_leaves_valid_pages_and_the_next_change_repairs_it(
    populated: Path, dist: Path, killed_at_rename: int
):
    """Renames 1-3: wheel, .metadata, sidecar; 4 the project's cache; 5-8 project and
    channel pages; 9 the landing page; 10 the summary cache."""
    root = populated
    wheel = make_wheel(dist, version="2.0+cu130torch2.14", tag=LINUX)
    done = subprocess.run(
        [sys.executable, "-c", KILLED_PUBLISH, str(killed_at_rename), str(root), str(wheel)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 17, done.stderr

    assert_pages_consistent(root)  # the old (or new) pages are all valid

    publish(root, make_wheel(dist, name="helper", version="3.0"))
    assert list(root.rglob(f"{TMP_PREFIX}*")) == []
    assert not (root / ".records/_writing").exists()
    repaired = snapshot(root)
    index.rebuild(root)
    assert snapshot(root) == repaired  # pages agree with the files on disk
    publish(root, wheel, CU130)  # completes, or is a no-op if the record was committed
    record = next(r for r in index.load_records(root) if r.filename == wheel.name)
    assert (record.channel, record.archs, record.build_key) == (CU130["channel"], ("sm_120",),
                                                                "key-1")
    assert wheel.name in _channel_files(root, "cu130-torch2.14", "demo-pkg")
    assert_pages_consistent(root)


def test_publish_reads_only_the_published_projects_records(
    root: Path, dist: Path, monkeypatch: pytest.MonkeyPatch
):
    for version in ("1.0", "1.1", "1.2"):
        publish(root, make_wheel(dist, name="other", version=version))
    publish(root, make_wheel(dist, version="1.0"))
    for sidecar in (root / "files").glob("other-*.wf.json"):
        sidecar.write_text("{ damaged")
    hashed: list[str] = []
    real = _fs.sha256_file
    for module in (records, store):
        monkeypatch.setattr(module, "sha256_file", lambda p: hashed.append(p.name) or real(p))

    publish(root, make_wheel(dist, version="1.1"))

    assert hashed == ["demo_pkg-1.1-py3-none-any.whl"]
    assert len(json.loads((root / "simple/demo-pkg/index.json").read_text())["files"]) == 2
    assert len(json.loads((root / "simple/other/index.json").read_text())["files"]) == 3
    with pytest.warns(IndexWarning, match="not valid JSON"):
        index.rebuild(root)  # the truth is the sidecars: rebuild reads them all
    # ... and moves the wheels whose record is corrupt out of files/, saying so
    assert sorted(p.name for p in (root / ".quarantine").glob("*.whl")) == [
        f"other-{v}-py3-none-any.whl" for v in ("1.0", "1.1", "1.2")]
    assert not (root / "simple/other").exists()
    assert "other" not in (root / "simple/index.html").read_text()


@pytest.mark.parametrize("damage", [
    lambda data: b"garbage\n",
    lambda data: data[:len(data) // 2],  # cut in the middle of the rows or the fragments
    lambda data: data[:-1],  # no final newline
    lambda data: data.replace(b" ", b"  ", 1),  # header
    lambda data: data.split(b"\n", 1)[0] + b"\n",  # the header alone
])
def test_damaged_caches_are_regenerated(populated: Path, dist: Path, damage: Any):
    root = populated
    for cache in (root / ".records").iterdir():
        cache.write_bytes(damage(cache.read_bytes()))
    publish(root, make_wheel(dist, name="helper", version="2.1"))
    incremental = snapshot(root)
    index.rebuild(root)
    assert snapshot(root) == incremental


def test_a_project_cache_holds_its_landing_rows(populated: Path):
    root = populated
    (root / ".records/demo-pkg.rows").write_text("a cache file of an older schema\n")
    index.rebuild(root)
    projects = sorted(p.name for p in (root / "simple").iterdir() if p.is_dir())
    assert sorted(p.name for p in (root / ".records").iterdir()) == [
        "_summary.json", *(f"{p}.cache" for p in projects)
    ]
    landing = (root / "index.html").read_text()
    for project in projects:
        entries = pages._load_cache(root, project)
        assert entries and pages._load_rows(root, project) == pages._rows(entries)
        assert f"<tbody>\n{pages._rows(entries)}</tbody>" in landing


# --------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, bytes]]:
    """A served index (read-only for the tests), with traps around and inside it."""
    tmp_path = tmp_path_factory.mktemp("served")
    populated = populate(tmp_path / "index", tmp_path / "dist")
    secret = b"TOP-SECRET-OUTSIDE-THE-INDEX"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.whl").write_bytes(secret)
    (populated / "files" / "evil-1.0-py3-none-any.whl").symlink_to(outside / "secret.whl")
    (populated / "files" / "outdir").symlink_to(outside)
    (populated / "files" / f"{TMP_PREFIX}partial").write_bytes(b"partial")
    httpd = index.make_server(populated)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    host, port = httpd.server_address[:2]
    try:
        yield f"http://{host}:{port}", populated, secret
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def raw_get(base: str, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Send ``target`` exactly as given (no client-side normalisation)."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     .encode("latin-1"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    status = int(response.split(b" ", 2)[1])
    return status, response


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(
    url: str, accept: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    if accept is not None:
        request.add_header("Accept", accept)
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


PIP_ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, "
              "text/html; q=0.01")


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        (None, "text/html; charset=utf-8"),
        ("text/html", "text/html; charset=utf-8"),
        ("*/*", "text/html; charset=utf-8"),
        ("application/vnd.pypi.simple.v1+html", "application/vnd.pypi.simple.v1+html"),
        ("application/vnd.pypi.simple.v1+json", "application/vnd.pypi.simple.v1+json"),
        ("application/vnd.pypi.simple.latest+json", "application/vnd.pypi.simple.v1+json"),
        (PIP_ACCEPT, "application/vnd.pypi.simple.v1+json"),
        ("text/html, application/vnd.pypi.simple.v1+json;q=0.5", "text/html; charset=utf-8"),
    ],
)
@pytest.mark.parametrize("path", ["/simple/", "/simple/demo-pkg/", "/cu130-torch2.14/simple/",
                                  "/cu130-torch2.14/simple/helper/"])
def test_server_negotiates_simple_pages(server: tuple[str, Path, bytes], accept: str | None,
                                        content_type: str, path: str):
    base, root, _ = server
    status, headers, body = fetch(base + path, accept)
    assert status == 200
    assert headers["Content-Type"] == content_type
    assert headers["Vary"] == "Accept"
    page = "index.json" if content_type.endswith("json") else "index.html"
    assert body == (root / path.strip("/") / page).read_bytes()


def test_server_refuses_unacceptable_types_and_other_methods(server: tuple[str, Path, bytes]):
    base, _, _ = server
    assert fetch(base + "/simple/", "application/json")[0] == 406
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        status, headers, _ = fetch(base + "/simple/", method=method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_server_content_types_and_head(server: tuple[str, Path, bytes]):
    base, root, _ = server
    wheel = next((root / "files").glob("helper-*.whl"))
    quoted = "/files/" + urllib.parse.quote(wheel.name)
    status, headers, body = fetch(base + quoted)
    assert (status, headers["Content-Type"], body) == (200, "application/octet-stream",
                                                        wheel.read_bytes())
    status, headers, body = fetch(base + quoted + ".metadata")
    assert (status, headers["Content-Type"]) == (200, "application/octet-stream")
    assert body == wheel_metadata(wheel)
    status, headers, body = fetch(base + quoted, method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["Content-Length"] == str(wheel.stat().st_size)
    status, headers, body = fetch(base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body == (root / "index.html").read_bytes()


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/simple/demo-pkg", "/simple/demo-pkg/"),
        ("/simple/Demo_Pkg/", "/simple/demo-pkg/"),
        ("/simple/DEMO.pkg", "/simple/demo-pkg/"),
        ("/cu130-torch2.14/simple/Helper/", "/cu130-torch2.14/simple/helper/"),
        ("/simple", "/simple/"),
    ],
)
def test_server_redirects_to_normalized_project_urls(server: tuple[str, Path, bytes], path: str,
                                                     location: str):
    base, _, _ = server
    status, headers, _ = fetch(base + path)
    assert (status, headers["Location"]) == (301, location)


@pytest.mark.parametrize(
    "target",
    [
        "/../etc/passwd",
        "/simple/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/files/..%2f..%2fetc/passwd",
        "/files/..%2f..%2foutside/secret.whl",
        "/files/%2e%2e/%2e%2e/outside/secret.whl",
        "/files/evil-1.0-py3-none-any.whl",
        "/files/outdir/secret.whl",
        "/files/outdir/",
        "/files/..\\..\\outside\\secret.whl",
        "/files/x%00.whl",
        "//etc/passwd",
        "http://evil/etc/passwd",
        "/.lock",
        "/.records/_summary.json",
        "/files/helper-2.0-py3-none-any.whl.wf.json",
        f"/files/{TMP_PREFIX}partial",
        "/files/",
    ],
)
def test_server_never_serves_outside_or_hidden_files(server: tuple[str, Path, bytes], target: str):
    base, _, secret = server
    status, response = raw_get(base, target)
    assert status in (400, 403, 404), (target, status)
    assert secret not in response and b"root:" not in response and b"partial" not in response
    assert b'"sha256"' not in response


# --------------------------------------------------------------------------- pip


def pip_download(index_url: str, requirement: str, dest: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PIP_CONFIG_FILE=os.devnull, NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
               "--isolated", "--disable-pip-version-check", "--no-input", "--only-binary=:all:",
               "--index-url", index_url, "--dest", str(dest), requirement]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dest.glob("*.whl")
    return wheel


@pytest.mark.integration
def test_pip_downloads_from_the_file_url_index(populated: Path, tmp_path: Path):
    wheel = pip_download((populated / "cu130-torch2.14/simple").as_uri(), "helper==2.0",
                         tmp_path / "dl")
    assert wheel.read_bytes() == (populated / "files" / wheel.name).read_bytes()


@pytest.mark.integration
def test_pip_downloads_over_http(server: tuple[str, Path, bytes], tmp_path: Path):
    base, root, _ = server
    wheel = pip_download(base + "/simple/", "helper", tmp_path / "dl")
    assert wheel.read_bytes() == (root / "files" / wheel.name).read_bytes()


def test_a_forced_rebuild_that_reproduces_its_wheel_publishes_nothing_new(
        root: Path, dist: Path) -> None:
    """`wheelforge build --force` of a published build key: the same bytes (under the
    published wheel's build number) are that wheel, and nothing is written; different
    bytes go under the next build number, naming the wheel they did not reproduce."""
    from wheelforge.wheel import retag

    def relabel_of(raw: Path):  # as the pipeline's: one build's wheel under any number
        return lambda tag: retag(raw, raw.parent / f"build-{tag}", tag)

    first = relabel_of(make_wheel(dist / "a", tag=LINUX))(None)
    store.publish_build(root, first, build_key="k1", archs=["sm_120"], **CU130)
    before = sorted(p.name for p in (root / "files").iterdir())

    again = relabel_of(make_wheel(dist / "b", tag=LINUX))
    res = store.publish_build(root, again("1"), build_key="k1", archs=["sm_120"],
                              relabel=again, force=True, **CU130)
    assert (res.published, res.reproduced, res.path.name) == (False, True, first.name)
    assert sorted(p.name for p in (root / "files").iterdir()) == before

    other = relabel_of(make_wheel(dist / "c", tag=LINUX, payload=b"VALUE = 2\n"))
    res = store.publish_build(root, other("1"), build_key="k1", archs=["sm_120"],
                              relabel=other, force=True, **CU130)
    assert res.published and not res.reproduced and res.differs_from == first.name
    assert res.path.name == first.name.replace("-1.0-", "-1.0-1-")
    # without --force the key is found published: nothing is written
    res = store.publish_build(root, other("2"), build_key="k1", archs=["sm_120"], **CU130)
    assert not res.published and not res.reproduced
