"""The index never lies: real `wheelforge` processes killed at every fsync and rename of a
publish, run concurrently, and run out of disk space.

The harness (tests/faults/harness.py) and its sitecustomize hook are shared with
scripts/fault_run.py, which runs the same trials in larger numbers.  Builds are of pure
fixtures (tests/packages/tinypure), in the managed environment of the user's cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import IN_CI

sys.path.insert(0, str(Path(__file__).parent / "faults"))
import harness  # noqa: E402

#: Concurrency rounds here; scripts/fault_run.py runs 10 of each (see docs/index.md).
ROUNDS_ONE_KEY = int(os.environ.get("WF_FAULT_ROUNDS", "4"))
ROUNDS_MANY_KEYS = int(os.environ.get("WF_FAULT_ROUNDS", "2"))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def recipes(work: Path) -> Path:
    return harness.pure_recipe(work)[0]


@pytest.fixture(scope="module")
def populated(work: Path) -> Path:
    """An index of 300 wheels (30 of them older versions of the fixture's project)."""
    template = work / "template"
    harness.populate(template, work / "dist", 300)
    assert harness.index_problems(template, work) == []
    return template


def _points(work: Path, recipes: Path, cache: Path, template: Path | None) -> int:
    index = work / "counting"
    shutil.rmtree(index, ignore_errors=True)
    if template is not None:
        shutil.copytree(template, index)
    n = harness.count_points(work, recipes, index, cache)
    shutil.rmtree(index)
    return n


# --------------------------------------------------------------------------- kill points


@pytest.mark.parametrize("into", ["empty index", "300 wheels"])
def test_a_build_killed_at_any_fsync_or_rename_of_its_publish_is_finished_by_the_next_build(
        work: Path, recipes: Path, populated: Path, shared_cache: Path, into: str) -> None:
    template = None if into == "empty index" else populated
    points = _points(work, recipes, shared_cache, template)
    assert points >= 20  # the marker, the wheel, .metadata, sidecar, pages, directories
    trials = [harness.kill_trial(work, recipes, template, shared_cache, at)
              for at in range(1, points + 1)]
    assert all(t.killed for t in trials), [t.kill_at for t in trials if not t.killed]
    bad = [f"kill at {t.kill_at}/{points}: {'; '.join(t.problems)}\n{t.output}"
           for t in trials if t.problems]
    assert not bad, "\n".join(bad)


def test_serves_first_request_finishes_a_killed_publish(
        work: Path, recipes: Path, populated: Path, shared_cache: Path) -> None:
    """`wheelforge serve` is the next command: before it answers, the index is repaired
    (every fourth kill point here; scripts/fault_run.py does every one)."""
    points = _points(work, recipes, shared_cache, populated)
    trials = [harness.kill_trial(work, recipes, populated, shared_cache, at, then="serve")
              for at in range(1, points + 1, 4)]
    bad = [f"kill at {t.kill_at}: {'; '.join(t.problems)}\n{t.output}"
           for t in trials if t.problems]
    assert not bad, "\n".join(bad)


def test_a_server_running_during_the_crash_repairs_before_its_next_answer(
        work: Path, recipes: Path, shared_cache: Path) -> None:
    index = work / "index-live"
    shutil.rmtree(index, ignore_errors=True)
    argv = harness.build_argv(work, recipes, index, shared_cache)
    with _server(index) as url:
        killed = harness.run(argv, harness.killer_env(index, 16))  # after the wheel's rename
        assert killed.returncode == -9
        assert (index / ".records/_writing").exists()
        import urllib.request

        with urllib.request.urlopen(url + "simple/faultpkg/", timeout=30) as response:
            page = response.read().decode()
        assert "faultpkg-0.1.0-py3-none-any.whl" in page
    assert harness.index_problems(index, work) == []


@contextlib.contextmanager
def _server(index: Path) -> Iterator[str]:
    index.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "wheelforge", "serve", "--index", str(index),
                             "--port", "0"], env=harness.environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving" in line, line + proc.stderr.read() if proc.stderr else line
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# --------------------------------------------------------------------------- concurrency


def test_eight_builds_of_one_key_publish_one_file(work: Path, shared_cache: Path) -> None:
    dirs = harness.pure_recipe(work, "onekey")
    rounds = [harness.concurrent_round(work, dirs, shared_cache, 8, f"onekey-{r}", name="onekey")
              for r in range(ROUNDS_ONE_KEY)]
    assert [r.problems for r in rounds] == [()] * ROUNDS_ONE_KEY
    assert all(r.wheels == ("onekey-0.1.0-py3-none-any.whl",) for r in rounds)


def test_eight_builds_of_eight_keys_of_one_project_publish_eight_build_numbers(
        work: Path, shared_cache: Path) -> None:
    dirs = harness.pure_recipe(work, "eightkeys", variants=8)
    rounds = [harness.concurrent_round(work, dirs, shared_cache, 8, f"eightkeys-{r}",
                                       name="eightkeys")
              for r in range(ROUNDS_MANY_KEYS)]
    assert [r.problems for r in rounds] == [()] * ROUNDS_MANY_KEYS
    expected = ("eightkeys-0.1.0-py3-none-any.whl",
                *(f"eightkeys-0.1.0-{n}-py3-none-any.whl" for n in range(1, 8)))
    assert all(sorted(r.wheels) == sorted(expected) for r in rounds)


SLOW_SETUP = "import time\ntime.sleep({seconds})\nfrom setuptools import setup\nsetup()\n"


def test_a_build_started_while_a_nightly_builds_the_same_cell_waits_and_skips(
        work: Path, shared_cache: Path) -> None:
    """One compile: the build waits for the build key's lock the nightly holds (saying
    who holds it), then finds the wheel published."""
    [recipes] = harness.pure_recipe(work, "slowpkg", setup=SLOW_SETUP.format(seconds=4))
    project = work / "slow.yaml"
    project.write_text(yaml.safe_dump({"matrix": {
        "recipes": ["slowpkg"], "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
        "archs": ["12.0"]}}))
    index = work / "index-slow"
    shutil.rmtree(index, ignore_errors=True)
    common = ["--recipes", str(recipes), "--sources", str(work / "sdists"), "--index",
              str(index), "--cache-dir", str(shared_cache), "--work-dir", str(work / "work")]
    nightly = subprocess.Popen([sys.executable, "-m", "wheelforge", "nightly", "--config",
                                str(project), *common], env=harness.environ(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_holder(shared_cache / "locks", f"pid {nightly.pid} ", nightly)
        build = harness.run([sys.executable, "-m", "wheelforge", "build", "slowpkg", *common],
                            harness.environ())
        out, err = nightly.communicate(timeout=300)
    finally:
        if nightly.poll() is None:
            nightly.kill()
            nightly.communicate()
    assert nightly.returncode == 0, err[-2000:]
    assert build.returncode == 0, build.stderr[-2000:]
    assert f"waiting for build key" in build.stderr and f"pid {nightly.pid} (wheelforge " \
        "nightly" in build.stderr
    assert "already published: slowpkg-0.1.0-py3-none-any.whl" in build.stdout
    compiles = (err + build.stderr).count("==> compile")
    assert compiles == 1
    assert harness.wheels(index) == ["slowpkg-0.1.0-py3-none-any.whl"]


def _wait_for_holder(locks: Path, holder: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        for lock in locks.glob("*.lock"):
            with contextlib.suppress(OSError):
                if lock.read_text().startswith(holder):
                    return
        time.sleep(0.05)
    pytest.fail("the nightly never took a build key's lock")


def test_work_directories_are_per_run_and_named_only_when_they_exist(
        work: Path, shared_cache: Path) -> None:
    [recipes] = harness.pure_recipe(work, "failpkg", imports="failpkg, no_such_module")
    index = work / "index-fail"
    argv = harness.build_argv(work, recipes, index, shared_cache, "failpkg")
    runs = [harness.run(argv, harness.environ()) for _ in range(2)]
    kept = []
    for done in runs:
        assert done.returncode == 8, done.stderr[-2000:]
        kept.append(done.stderr.split("work directory kept at ", 1)[1].split()[0].rstrip(";"))
    assert kept[0] != kept[1] and all(Path(k).is_dir() for k in kept)
    # a failure before any work directory exists names none
    index.parent.joinpath("index-file").write_text("not a directory")
    done = harness.run(harness.build_argv(work, recipes, work / "index-file" / "index",
                                          shared_cache, "failpkg"), harness.environ())
    assert done.returncode == 9 and "is not a directory" in done.stderr
    assert "work directory" not in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- full disk


def _mountable() -> None:
    why = harness.can_mount()
    if why is not None:
        if IN_CI:
            pytest.fail(f"CI runs as root and must mount a tmpfs: {why}")
        pytest.skip(why)


def test_a_build_into_a_full_disk_publishes_completely_or_exits_9_changing_nothing(
        work: Path, shared_cache: Path) -> None:
    _mountable()
    [recipes] = harness.pure_recipe(work, "diskpkg")
    results = harness.fill_sweep(work, recipes, shared_cache, 8, name="diskpkg")
    bad = [f"{r.free} B free: {'; '.join(r.problems)}\n{r.output}" for r in results
           if r.problems]
    assert not bad, "\n".join(bad)
    assert any(r.code == 9 for r in results) and any(r.published for r in results)


def test_enospc_at_any_write_of_a_publish_leaves_the_index_as_it_was(work: Path) -> None:
    """With the free-space check before the publish off, the writes themselves run out of
    space, at every point of the batch: a PublishError and the index unchanged."""
    _mountable()
    results = harness.library_fill_sweep(work, 28)
    bad = [f"{r.free} B free: {'; '.join(r.problems)}\n{r.output}" for r in results
           if r.problems]
    assert not bad, "\n".join(bad)
    assert sum(r.code == 9 for r in results) >= 5 and any(r.published for r in results)


def test_a_read_only_index_is_refused_before_the_compile(work: Path, shared_cache: Path
                                                          ) -> None:
    if os.geteuid() == 0:
        _mountable()
        index = work / "ro-index"
        shutil.copytree(work / "template", index) if (work / "template").exists() else \
            index.mkdir()
        subprocess.run(["mount", "--bind", "-o", "ro", str(index), str(index)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(index)], check=True)
    else:
        index = work / "ro-index"
        index.mkdir(exist_ok=True)
        index.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        [recipes] = harness.pure_recipe(work, "ropkg")
        done = harness.run(harness.build_argv(work, recipes, index, shared_cache, "ropkg"),
                           harness.environ())
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(index)], check=True)
    assert done.returncode == 9, done.stderr[-2000:]
    assert "cannot write to the index" in done.stderr and "==> compile" not in done.stderr
    assert "Traceback" not in done.stderr
