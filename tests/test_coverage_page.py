"""The landing page's coverage table in headless Chromium: the cells as the browser parsed
them, every text of the table legible (WCAG 4.5:1) in light and dark mode, the page still
within a 1400 px window with four channels and a long failure reason.

The index and night are tests/test_coverage.py's.  Needs the Debian package `chromium`
(skipped without it, except under CI=true).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import colours_script, contrast, layout, probe
from conftest import require_tool
from test_coverage import CC, REASON, _cell, make_index, night, write_report
from wheelforge import index

#: the coverage table's cells: text, class, links, and the colours they are drawn in
CELLS = """() => [...document.querySelectorAll("table.coverage tr")].map((tr) =>
  [...tr.children].map((c) => ({text: c.textContent.replace(/\\s+/g, " ").trim(),
                                cls: c.className,
                                links: [...c.querySelectorAll("a")].map((a) => a.href)})))"""

#: every element of the coverage table with text of its own: its colour and background
COLOURS = colours_script("table.coverage, table.coverage *")


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/test_coverage.py's index and night, with pure and a second project's cells."""
    root = make_index(tmp_path_factory.mktemp("coverage"))
    cells = [c for c in night(root) if c["recipe"] != "fla-core"]  # built, not planned
    long = "x" * 400  # a reason longer than a cell: cut, whole in the title
    cells.append(_cell("mamba-ssm", "torch==2.14.1", "12.0", "failed",
                       error=f"C++20 required by torch's headers {long}"))
    write_report(root, cells)
    index.refresh(root)
    return root / "index.html"


def test_the_browser_shows_every_cell(chromium: str, page: Path, tmp_path: Path) -> None:
    rows = probe(chromium, page, tmp_path / "profile", CELLS)
    assert isinstance(rows, list)
    head, *body = rows
    assert [c["text"] for c in head] == ["Project", "Archs", "cu130-torch2.14",
                                         "cu130-torch2.13", "cu130-torch2.12",
                                         "cu130-torch2.11"]
    by_row = {(r[0]["text"], r[1]["text"]): r[2:] for r in body}
    assert list(by_row) == [(CC, "sm_120"), (CC, "sm_100 sm_120"), ("fla-core", "pure Python"),
                            ("mamba-ssm", "sm_120")]
    cc = by_row[(CC, "sm_120")]
    assert [c["text"] for c in cc] == ["built 1.7.0", "not run", f"failed: {REASON} log",
                                       "built 1.7.0"]
    assert [c["cls"] for c in cc] == ["ok", "none", "bad wrap", "ok"]
    assert cc[2]["links"] == [(page.parent / "reports/logs/causal-conv1d-1.7.0-1.log").as_uri()]
    mamba = by_row[("mamba-ssm", "sm_120")]
    assert mamba[0]["text"].startswith("failed: C++20 required by torch's headers xxx")
    assert mamba[0]["text"].endswith("...") and len(mamba[0]["text"]) == len("failed: ") + 200
    assert [c["text"] for c in mamba[1:]] == ["not in the matrix"] * 3
    assert [c["text"] for c in by_row[("fla-core", "pure Python")]] == [
        "built 0.5.0 (not in the matrix)"] * 4


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_table_is_legible(chromium: str, page: Path, tmp_path: Path, dark: bool) -> None:
    found = probe(chromium, page, tmp_path / "profile", COLOURS, dark=dark)
    assert isinstance(found, list) and len(found) > 20
    kinds = {x["what"].split(":")[0] for x in found}
    assert {"td.ok", "td.bad wrap", "td.none", "span.note", "a", "code"} <= kinds, kinds
    bad = [f"{x['what']}: {contrast(x['fg'], x['bg']):.1f}:1 ({x['fg']} on {x['bg']})"
           for x in found if contrast(x["fg"], x["bg"]) < 4.5]
    assert not bad, bad


def test_fits_1400_px(chromium: str, page: Path, tmp_path: Path) -> None:
    got = layout(chromium, page, tmp_path / "profile", width=1400)
    assert not got.overflows, got
