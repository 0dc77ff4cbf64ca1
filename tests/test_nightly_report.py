"""The nightly report as people look at it (issue 17): its log links work when the index is
served over HTTP, the "last lines" box shows the log's last lines, and the page fits a
1400 px window without sideways scrolling (headless Chromium), long names and fix lines
wrapping.  The cells are built by a fake builder (the real ones are in test_nightly.py):
the report, the copy of the logs, the server and the browser are real."""

from __future__ import annotations

import io
import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from browser import layout, screenshot
from conftest import make_sdist, make_wheel, pure_recipe, require_tool, write_recipe
from test_landing_page import decode_png
from wheelforge import index, nightly
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.config import BuildConfig
from wheelforge.errors import BuildError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import load_matrix
from wheelforge.recipe.model import Recipe

LONG = "flash-linear-attention-with-a-very-long-project-name-for-layout"
FIX = ("install gcc 14 or older and select it with CC and CXX (e.g. CC=gcc-14 CXX=g++-14), "
       "or use a newer CUDA toolkit; work directory kept at /var/lib/wheelforge/work/" + LONG
       + "-0.1.0-0123456789abcdef0123456789abcdef")


def pure(root: Path, name: str) -> None:
    src = root / "src" / name
    (src / name.replace("-", "_")).mkdir(parents=True)
    (src / name.replace("-", "_") / "__init__.py").write_text("")
    _, sha = make_sdist(src, root / "sdists", name, "0.1.0")
    write_recipe(root, name, pure_recipe(name, sha))


def builder(logs: Path) -> object:
    """Builds 'ok' cells (a made-up wheel, published) and fails the LONG one with a log."""
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        log = logs / f"{recipe.name}-0.1.0-20261201T000000.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"log line {i} of {recipe.name}" for i in range(100)]
        log.write_text("\n".join(lines) + "\n")
        if recipe.name == LONG:
            raise BuildError(f"the build of {recipe.name}-0.1.0 failed (exit status 1)",
                             why="first error, log line 7: " + "x" * 300, fix=FIX, log=str(log))
        key = identity.build_key(recipe, config, {"python": "py3"})
        wheel = make_wheel(config.work_dir / "dist", {"ok/__init__.py": ""}, name=recipe.name,
                           version="0.1.0")
        res = index.publish(config.index_dir, wheel, channel=None, cuda=None, torch=None,
                            archs=(), build_key=key)
        return pipeline.BuildResult(recipe, res.path, (), None, key, log=log)
    return build


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nightly")
    for name in ("ok-one", LONG):
        pure(root, name)
    (root / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": ["ok-one", LONG], "python": [sys.executable],
        "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}], "archs": ["12.0"]}}))
    book = RecipeBook(root / "recipes", root / "patches")
    settings = nightly.Settings(index_dir=root / "index", cache_dir=root / "cache",
                                work_dir=root / "work", project_file=root / "wheelforge.yaml")
    done = nightly.run(load_matrix(root / "wheelforge.yaml", book.names()), book, settings,
                       reporter=Reporter(io.StringIO()),
                       build=builder(root / "buildmachine" / "logs"))  # type: ignore[arg-type]
    assert [r.status for r in done.results] == ["built", "failed"]
    return root / "index" / "reports" / "nightly-latest.html"


def test_logs_are_copied_beside_the_report_and_linked_relatively(report: Path) -> None:
    page = report.read_text()
    reports = report.parent
    for name in ("ok-one", LONG):
        copy = reports / "logs" / f"{name}-0.1.0-20261201T000000.log"
        assert copy.read_text().startswith(f"log line 0 of {name}\n")
        assert f'href="logs/{copy.name}"' in page
    assert "buildmachine" not in page.split("<h2>Failures</h2>")[0].split("<tbody>")[1]


def test_log_links_work_over_http(report: Path) -> None:
    server = index.make_server(report.parent.parent)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/reports/"
        with urllib.request.urlopen(base + "nightly-latest.html", timeout=30) as resp:
            page = resp.read().decode()
        href = page.split('<a href="logs/', 1)[1].split('"', 1)[0]
        with urllib.request.urlopen(base + "logs/" + href, timeout=30) as resp:
            assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert resp.read().decode().startswith("log line 0 of ")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_last_lines_are_the_logs_not_the_error_again(report: Path) -> None:
    page = report.read_text()
    box = page.split("<summary>last lines of the log</summary><pre>", 1)[1].split("</pre>")[0]
    assert box.splitlines() == [f"log line {i} of {LONG}" for i in range(60, 100)]
    assert "first error" not in box


@pytest.mark.unit
def test_a_failure_without_a_log_has_no_last_lines_box(tmp_path: Path) -> None:
    cell = nightly.CellResult(recipe="x", version=None, python="python3", torch="torch",
                              cuda="13.0", pip_args=(), archs="12.0", status="failed",
                              error="recipe error: no recipe named 'x'")
    rep = nightly.NightlyReport(started="2026-12-01T00:00:00Z", finished="2026-12-01T00:00:01Z",
                                duration_s=1.0, config="wheelforge.yaml", index=str(tmp_path),
                                results=(cell,))
    page = nightly.render_html(rep, tmp_path)
    assert "recipe error: no recipe named" in page and "last lines" not in page


@pytest.mark.unit
def test_canaries_in_the_json_and_the_html_escaped(tmp_path: Path) -> None:
    canary = nightly.CanaryResult(
        recipe="mamba-ssm", pinned="2.3.0", version="2.4.0", state="failed", applies="no",
        failed_step="applies", reason="patch 0002-<x>.patch does not apply",
        source="sdist:mamba_ssm-2.4.0.tar.gz@sha256:00")
    rep = nightly.NightlyReport(started="2026-12-01T00:00:00Z", finished="2026-12-01T00:00:01Z",
                                duration_s=1.0, config="wheelforge.yaml", index=str(tmp_path),
                                results=(), canaries=(canary,))
    assert not rep.failed  # a canary is never part of the night's status
    doc = json.loads(nightly.to_json(rep))
    assert doc["canaries"][0]["failed_step"] == "applies"
    page = nightly.render_html(rep, tmp_path)
    assert "<h2>Canaries</h2>" in page and "0002-&lt;x&gt;.patch" in page
    assert '<td class="failed">no</td>' in page
    assert canary.line() == ("canary mamba-ssm 2.3.0 -> 2.4.0: applies no / builds not run / "
                             "verifies not run / stack not run (applies: patch 0002-<x>.patch "
                             "does not apply)")


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium", "/usr/bin/chromium")


def test_the_report_fits_1400_px(chromium: str, report: Path, tmp_path: Path) -> None:
    found = layout(chromium, report, tmp_path / "profile", width=1400)
    assert found.client_width == 1400
    assert not found.overflows, (found.scroll_width, found.wide)


def test_the_report_screenshot_shows_text_and_the_failure(chromium: str, report: Path,
                                                          tmp_path: Path) -> None:
    shot = screenshot(chromium, report, tmp_path / "profile", tmp_path / "report.png")
    width, height, rgb = decode_png(shot.read_bytes())
    assert (width, height) == (1400, 900)
    dark = red = 0
    for r, g, b in zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True):
        if r + g + b < 200:
            dark += 1
        elif r > 150 and g < 80 and b < 80:
            red += 1  # "failed" (#cf222e)
    assert 0.002 * width * height < dark < 0.3 * width * height
    assert red > 20


def test_a_matrix_python_named_by_its_command_is_resolved_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matrix.python: [python3], as users write it: looked up on PATH, and the run says
    which interpreter that is."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    pure(tmp_path, "ok-one")
    (tmp_path / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": ["ok-one"], "python": ["python3"],
        "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}], "archs": ["12.0"]}}))
    book = RecipeBook(tmp_path / "recipes", tmp_path / "patches")
    out = io.StringIO()
    settings = nightly.Settings(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache",
                                work_dir=tmp_path / "work",
                                project_file=tmp_path / "wheelforge.yaml")
    done = nightly.run(load_matrix(tmp_path / "wheelforge.yaml", book.names()), book, settings,
                       reporter=Reporter(out),
                       build=builder(tmp_path / "logs"))  # type: ignore[arg-type]
    [said] = [ln for ln in out.getvalue().splitlines() if "matrix python" in ln]
    assert said == f"  matrix python python3: {done.results[0].python}"
    assert Path(done.results[0].python).is_absolute()
