"""The landing page's coverage table (index/coverage.py): project x channel x archs, each
cell built, failed in the latest night (its reason, linked to its log) or not in the matrix.

An index of fixture wheels in three channels and a nightly report as wheelforge.nightly
writes it (its JSON fields); the page is parsed and read cell by cell.  Then the report as
data others may write: a link, a huge file, traversal in a log name, markup in a reason.
The page in headless Chromium (layout, dark mode contrast): tests/test_coverage_page.py.
"""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel
from wheelforge import index
from wheelforge.index import coverage

CC = "causal-conv1d"
REASON = "build failed: nvcc exited with status 2 <script>alert(1)</script>"


class _Table(HTMLParser):
    """The coverage table as rows of (text, class, hrefs) per cell."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str, list[str]]]] = []
        self._in = self._cell = False
        self._text: list[str] = []
        self._cls = ""
        self._hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("class") == "coverage":
            self._in = True
        elif self._in and tag == "tr":
            self.rows.append([])
        elif self._in and tag in ("td", "th"):
            self._cell, self._text, self._cls, self._hrefs = True, [], a.get("class") or "", []
        elif self._cell and tag == "a":
            self._hrefs.append(a.get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if self._in and tag in ("td", "th"):
            self.rows[-1].append((" ".join("".join(self._text).split()), self._cls, self._hrefs))
            self._cell = False
        elif tag == "table":
            self._in = False

    def handle_data(self, data: str) -> None:
        if self._cell:
            self._text.append(data)


def table(root: Path) -> dict[tuple[str, str], dict[str, tuple[str, str, list[str]]]]:
    """{(project, archs): {channel: (text, class, hrefs)}} of ROOT's landing page."""
    parser = _Table()
    parser.feed((root / "index.html").read_text(encoding="utf-8"))
    head, *rows = parser.rows
    channels = [text for text, _, _ in head[2:]]
    return {(r[0][0], r[1][0]): dict(zip(channels, r[2:], strict=True)) for r in rows}


def _ext(dist: Path, version: str, label: str) -> Path:
    return make_wheel(dist, {"causal_conv1d/_C.so": b"\x7fELF" + bytes(64)}, name=CC,
                      version=f"{version}+{label}", tag="cp311-cp311-linux_x86_64")


def _cell(recipe: str, torch: str, archs: str | None, status: str, **extra: Any) -> dict[str, Any]:
    return {"recipe": recipe, "version": "1.7.0", "python": "python3.11", "torch": torch,
            "cuda": "13.0", "pip_args": [], "archs": archs, "status": status, "subset": "",
            **extra}


def write_report(root: Path, cells: list[dict[str, Any]]) -> Path:
    reports = root / index.REPORTS_DIR
    (reports / "logs").mkdir(parents=True, exist_ok=True)
    path = reports / coverage.REPORT_JSON
    path.write_text(json.dumps({"schema": 1, "cells": cells}), encoding="utf-8")
    return path


def make_index(tmp_path: Path) -> Path:
    """causal-conv1d in cu130-torch2.14 (two arch sets) and cu130-torch2.11 (one), and a
    pure fla-core."""
    root, dist = tmp_path / "index", tmp_path / "dist"
    for torch, label, archs in (("2.14.1", "cu130torch2.14sm120", ["sm_120"]),
                                ("2.14.1", "cu130torch2.14sm100sm120", ["sm_100", "sm_120"]),
                                ("2.11.0", "cu130torch2.11sm120", ["sm_120"])):
        index.publish(root, _ext(dist, "1.7.0", label), channel=index.channel_name("13.0", torch),
                      cuda="13.0", torch=torch, archs=archs, build_key=f"k-{label}")
    pure = make_wheel(dist, {"fla/__init__.py": "V = 1\n"}, name="fla-core", version="0.5.0")
    index.publish(root, pure, channel=None, cuda=None, torch=None, archs=[], build_key=None)
    return root


@pytest.fixture
def published(tmp_path: Path) -> Path:
    return make_index(tmp_path)


def night(root: Path) -> list[dict[str, Any]]:
    """The shipped matrix's shape: four torches, two arch sets, a pure recipe; 2.12.1's
    12.0 cell failed (its log copied beside the report), 2.13's were not run."""
    (root / index.REPORTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
    (root / index.REPORTS_DIR / "logs" / "causal-conv1d-1.7.0-1.log").write_text("nvcc: error\n")
    cells = [_cell("fla-core", "torch==2.14.1", None, "skipped")]
    for torch in ("torch==2.14.1", "torch==2.13.0,!=2.13.0+cpu", "torch==2.12.1",
                  "torch==2.11.0"):
        for archs in ("12.0", "10.0;12.0"):
            status = "skipped" if "2.14" in torch else "not run"
            extra: dict[str, Any] = {}
            if torch == "torch==2.12.1" and archs == "12.0":
                status, extra = "failed", {"error": REASON + "\nsecond line",
                                           "log_file": "logs/causal-conv1d-1.7.0-1.log"}
            if torch == "torch==2.11.0" and archs == "10.0;12.0":
                status, extra = "failed", {"error": "toolchain error", "log_file": None}
            cells.append(_cell(CC, torch, archs, status, **extra))
    return cells


def test_without_a_report_no_table(published: Path) -> None:
    """No nightly report: the matrix is not known; the wheels table says what is built."""
    page = (published / "index.html").read_text()
    assert "<h2>Coverage</h2>" not in page and 'class="coverage"' not in page


def test_with_an_unreadable_report_built_or_not_built(published: Path) -> None:
    write_report(published, []).write_text("[]")
    index.refresh(published)
    got = table(published)
    assert set(got) == {(CC, "sm_120"), (CC, "sm_100 sm_120"), ("fla-core", "pure Python")}
    assert got[(CC, "sm_120")] == {"cu130-torch2.14": ("built 1.7.0", "ok", []),
                                  "cu130-torch2.11": ("built 1.7.0", "ok", [])}
    assert got[(CC, "sm_100 sm_120")]["cu130-torch2.11"] == ("not built", "none", [])
    assert {c[0] for c in got[("fla-core", "pure Python")].values()} == {"built 0.5.0"}
    assert "not read: not a nightly report" in (published / "index.html").read_text()


def test_a_night_gives_every_cell_its_state(published: Path) -> None:
    write_report(published, night(published))
    index.refresh(published)
    got = table(published)
    assert list(got[(CC, "sm_120")]) == ["cu130-torch2.14", "cu130-torch2.13",
                                         "cu130-torch2.12", "cu130-torch2.11"]
    row, wide = got[(CC, "sm_120")], got[(CC, "sm_100 sm_120")]
    assert row["cu130-torch2.14"] == ("built 1.7.0", "ok", [])
    assert row["cu130-torch2.13"] == ("not run", "none", [])
    text, css, hrefs = row["cu130-torch2.12"]
    assert css == "bad wrap" and text == f"failed: {REASON} log"
    assert hrefs == ["reports/logs/causal-conv1d-1.7.0-1.log"]
    assert (published / hrefs[0]).is_file()
    assert row["cu130-torch2.11"] == ("built 1.7.0", "ok", [])
    # failed tonight, an earlier build still served; no log: no link
    assert wide["cu130-torch2.11"] == ("failed: toolchain error", "bad wrap", [])
    assert wide["cu130-torch2.14"][0] == "built 1.7.0"
    # the markup in the reason is text, never a tag
    page = (published / "index.html").read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_not_in_the_matrix(published: Path, tmp_path: Path) -> None:
    """A night of one channel: the other channel's build is still shown, marked; a target
    nothing built nor planned is 'not in the matrix'."""
    write_report(published, [_cell(CC, "torch==2.14.1", "12.0", "skipped"),
                             _cell(CC, "torch==2.14.1", "10.0;12.0", "skipped")])
    index.refresh(published)
    got = table(published)
    assert got[(CC, "sm_120")]["cu130-torch2.11"] == (
        "built 1.7.0 (not in the matrix)", "ok", [])
    assert got[(CC, "sm_100 sm_120")]["cu130-torch2.11"] == ("not in the matrix", "none", [])
    assert got[("fla-core", "pure Python")]["cu130-torch2.14"][0] == (
        "built 0.5.0 (not in the matrix)")


def test_a_yanked_build_is_not_coverage(published: Path, tmp_path: Path) -> None:
    write_report(published, [_cell(CC, "torch==2.11.0", "12.0", "skipped")])
    newer = _ext(tmp_path / "d2", "1.8.0", "cu130torch2.11sm120")
    index.publish(published, newer, channel="cu130-torch2.11", cuda="13.0", torch="2.11.0",
                  archs=["sm_120"], build_key="k-new")
    assert table(published)[(CC, "sm_120")]["cu130-torch2.11"][0] == "built 1.8.0"
    index.yank(published, CC, "1.8.0+cu130torch2.11sm120", "bad kernels")
    assert table(published)[(CC, "sm_120")]["cu130-torch2.11"][0] == "built 1.7.0"


def test_the_summary_cache_carries_the_cells(published: Path, tmp_path: Path) -> None:
    """A publish of another project reads the cached summary of this one: the table is the
    same as after a full rebuild."""
    write_report(published, [])
    index.refresh(published)
    before = table(published)
    other = make_wheel(tmp_path / "d3", {"x/__init__.py": ""}, name="other", version="1.0")
    index.publish(published, other, channel=None, cuda=None, torch=None, archs=[],
                  build_key=None)
    after = table(published)
    assert {k: v for k, v in after.items() if k[0] != "other"} == before
    index.rebuild(published)
    assert table(published) == after


# ------------------------------------------------------------ the report as hostile data


def test_a_linked_report_is_not_followed(published: Path, tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"cells": [_cell(CC, "torch==2.12.1", "12.0", "failed",
                                                   error="SECRET from elsewhere")]}))
    reports = published / index.REPORTS_DIR
    reports.mkdir()
    os.symlink(secret, reports / coverage.REPORT_JSON)
    index.refresh(published)
    page = (published / "index.html").read_text()
    assert "SECRET" not in page
    assert "reports/nightly-latest.json not read: it is a link" in page


def test_a_huge_report_is_not_read(published: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coverage, "MAX_REPORT_BYTES", 1000)
    write_report(published, night(published))
    index.refresh(published)
    page = (published / "index.html").read_text()
    assert "not read: larger than" in page and "failed:" not in page


def test_a_damaged_report_is_said(published: Path) -> None:
    path = write_report(published, [])
    path.write_text("{not json")
    index.refresh(published)
    assert "not read: not a nightly report" in (published / "index.html").read_text()
    path.write_text(json.dumps({"cells": [{"recipe": 3}, "x", _cell(CC, "torch", "x;y", "built"),
                                          _cell(CC, "torch==2.11.0", "12.0", "built")]}))
    index.refresh(published)
    assert table(published)[(CC, "sm_120")]["cu130-torch2.11"][0] == "built 1.7.0"


@pytest.mark.parametrize("log_file", ["../../../etc/passwd", "logs/../../index.html",
                                      "/etc/passwd", "logs/sub/x.log", "logs/missing.log",
                                      "javascript:alert(1)"])
def test_a_log_link_only_to_a_log_copy_beside_the_report(published: Path,
                                                         log_file: str) -> None:
    write_report(published, [_cell(CC, "torch==2.11.0", "12.0", "failed", error="boom",
                                   log_file=log_file)])
    (published / index.REPORTS_DIR / "logs" / "sub").mkdir()
    (published / index.REPORTS_DIR / "logs" / "sub" / "x.log").write_text("x")
    index.refresh(published)
    text, css, hrefs = table(published)[(CC, "sm_120")]["cu130-torch2.11"]
    assert (text, css, hrefs) == ("failed: boom (1.7.0 still served)", "bad wrap", [])


def test_the_nightly_report_refreshes_the_page(published: Path) -> None:
    """nightly/report.py's link_from_landing_page: each report refreshes the table, not
    only the first one."""
    from wheelforge.nightly.report import link_from_landing_page

    write_report(published, [_cell(CC, "torch==2.11.0", "12.0", "failed", error="first")])
    link_from_landing_page(published, published / index.REPORTS_DIR)
    assert table(published)[(CC, "sm_120")]["cu130-torch2.11"][0].startswith("failed: first")
    write_report(published, [_cell(CC, "torch==2.11.0", "12.0", "skipped")])
    link_from_landing_page(published, published / index.REPORTS_DIR)
    assert table(published)[(CC, "sm_120")]["cu130-torch2.11"] == ("built 1.7.0", "ok", [])


def test_a_torch_range_is_not_placed(published: Path) -> None:
    """A pin such as ``torch>=2.14,<2.15`` names its channel only once built: its cells are
    not placed, and no cell is said to be not in the matrix."""
    write_report(published, [_cell(CC, "torch>=2.14,<2.15", "12.0", "failed", error="x")])
    index.refresh(published)
    got = table(published)
    assert got[(CC, "sm_100 sm_120")]["cu130-torch2.11"] == ("not built", "none", [])
    assert got[(CC, "sm_120")]["cu130-torch2.14"] == ("built 1.7.0", "ok", [])
    assert "1 of its cells name a torch range" in (published / "index.html").read_text()


def test_the_shipped_matrix_has_a_channel_per_cuda13_torch() -> None:
    """wheelforge.yaml: torch 2.14.1, 2.12.1 and 2.11.0, CUDA 13.0 each (docs/nightly.md);
    `make build`'s default stays 2.14.1."""
    from conftest import REPO
    from wheelforge.builder.config import DEFAULT_TORCH
    from wheelforge.recipe.matrix import load_matrix

    matrix = load_matrix(REPO / "wheelforge.yaml")
    assert [coverage._channel(p.spec, p.cuda) for p in matrix.torches] == [
        "cu130-torch2.14", "cu130-torch2.12", "cu130-torch2.11"]
    assert {p.cuda for p in matrix.torches} == {"13.0"}
    assert matrix.torches[0].spec == DEFAULT_TORCH == "torch==2.14.1"
    assert "torch: \"torch==2.14.1\"" in (REPO / "wheelforge.yaml").read_text()
