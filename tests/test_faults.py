"""The index never lies: real `wheelforge` processes killed at every fsync and rename of a
publish, run concurrently, and run out of disk space.

The harness (tests/faults/harness.py) and its sitecustomize hook are shared with
scripts/fault_run.py, which runs the same trials in larger numbers.  Builds are of pure
fixtures (tests/packages/tinypure), in the managed environment of the user's cache.
"""

from __future__ import annotations

import contextlib
import json
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

#: Concurrency rounds of each case (scripts/fault_run.py --rounds runs more).
#: rounds of the concurrent-build tests: 3 keeps CI's time (the eight-key rounds build one
#: after another at the fixed build path); WF_FAULT_ROUNDS=10 or more for a stress run
ROUNDS = int(os.environ.get("WF_FAULT_ROUNDS", "3"))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def variants(work: Path) -> list[Path]:
    """The fixture recipe twice, with two build keys: two trials run at once."""
    return harness.pure_recipe(work, variants=2)


@pytest.fixture(scope="module")
def recipes(variants: list[Path]) -> Path:
    return variants[0]


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


def test_the_checks_catch_a_lying_index(work: Path, populated: Path) -> None:
    """index_problems, which every trial relies on, sees each kind of lie."""
    lies = {
        "a page missing": lambda i: (i / "simple/filler1/index.html").unlink(),
        "a stale landing page": lambda i: (i / "index.html").write_text("old"),
        "the marker": lambda i: (i / ".records/_writing").write_text("{}"),
        "a temp file": lambda i: (i / "simple/.wf-tmp-abc").write_text("x"),
        "a wheel without its record": lambda i: next((i / "files").glob("*.wf.json")).unlink(),
        "a key published twice": _duplicate_key,
    }
    for what, lie in lies.items():
        index = work / "lying"
        shutil.rmtree(index, ignore_errors=True)
        shutil.copytree(populated, index)
        lie(index)
        assert harness.index_problems(index, work), what


def _duplicate_key(index: Path) -> None:
    first, second = sorted((index / "files").glob("*.wf.json"))[:2]
    record = json.loads(first.read_text())
    other = json.loads(second.read_text())
    other["build_key"] = record["build_key"]
    second.write_text(json.dumps(other))


@pytest.mark.parametrize("into", ["empty index", "300 wheels"])
def test_a_build_killed_at_any_fsync_or_rename_of_its_publish_is_finished_by_the_next_build(
        work: Path, variants: list[Path], populated: Path, shared_cache: Path, into: str
) -> None:
    recipes = variants[0]
    template = None if into == "empty index" else populated
    points = _points(work, recipes, shared_cache, template)
    assert points >= 20  # the marker, the wheel, .metadata, sidecar, pages, directories
    trials = harness.kill_trials(work, variants, template, shared_cache, range(1, points + 1))
    assert all(t.killed for t in trials), [t.kill_at for t in trials if not t.killed]
    bad = [f"kill at {t.kill_at}/{points}: {'; '.join(t.problems)}\n{t.output}"
           for t in trials if t.problems]
    assert not bad, "\n".join(bad)


def test_serves_first_request_finishes_a_killed_publish(
        work: Path, variants: list[Path], populated: Path, shared_cache: Path) -> None:
    """`wheelforge serve` is the next command: before it answers, the index is repaired
    (every other kill point here; scripts/fault_run.py does every one)."""
    points = _points(work, variants[0], shared_cache, populated)
    trials = harness.kill_trials(work, variants, populated, shared_cache,
                                 range(1, points + 1, 2), then="serve")
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
        assert "faultpkg-0.1.0+wf-py3-none-any.whl" in page
    assert harness.index_problems(index, work) == []


@contextlib.contextmanager
def _server(index: Path) -> Iterator[str]:
    (index / "files").mkdir(parents=True, exist_ok=True)  # an empty index: serve reads one
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
              for r in range(ROUNDS)]
    assert [r.problems for r in rounds] == [()] * ROUNDS
    assert all(r.wheels == ("onekey-0.1.0+wf-py3-none-any.whl",) for r in rounds)


def test_eight_builds_of_eight_keys_of_one_project_publish_eight_build_numbers(
        work: Path, shared_cache: Path) -> None:
    dirs = harness.pure_recipe(work, "eightkeys", variants=8)
    rounds = [harness.concurrent_round(work, dirs, shared_cache, 8, f"eightkeys-{r}",
                                       name="eightkeys")
              for r in range(ROUNDS)]
    assert [r.problems for r in rounds] == [()] * ROUNDS
    expected = ("eightkeys-0.1.0+wf-py3-none-any.whl",
                *(f"eightkeys-0.1.0+wf-{n}-py3-none-any.whl" for n in range(1, 8)))
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
    assert "waiting for build key" in build.stderr and f"pid {nightly.pid} (wheelforge " \
        "nightly" in build.stderr
    assert "already published: slowpkg-0.1.0+wf-py3-none-any.whl" in build.stdout
    compiles = (err + build.stderr).count("==> compile")
    assert compiles == 1
    assert harness.wheels(index) == ["slowpkg-0.1.0+wf-py3-none-any.whl"]


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


# --------------------------------------------------------------------------- no traceback


def _broken(work: Path, kind: str) -> Path:
    """A copy of a small sound index with one thing broken."""
    index = work / "broken" / kind
    shutil.rmtree(index, ignore_errors=True)
    harness.populate(index, work / "broken-dist", 6)
    files = index / "files"
    first = sorted(files.glob("filler*.whl"))[0]
    if kind == "sidecar-not-utf8":
        first.with_name(first.name + ".wf.json").write_bytes(b"\xff\xfe{\x00")
    elif kind == "sidecar-not-a-record":
        first.with_name(first.name + ".wf.json").write_text("[1, 2]")
    elif kind == "wheel-not-a-zip":
        (files / "junk-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 cut short")
    elif kind == "not-a-wheel-name":
        (files / "notawheel.whl").write_bytes(b"x")
    elif kind == "files-is-a-file":
        shutil.rmtree(files)
        files.write_text("x")
    return index


#: (name, arguments with {index}, {afile}, {recipes}, {bad_recipes}, {bad_config},
#:  {cache}, {sdists} placeholders, broken index kind or None, exit code, text in stderr)
BROKEN = [
    ("rebuild, corrupt sidecar", "index rebuild --index {index}", "sidecar-not-utf8", 0,
     "warning: quarantined filler"),
    ("rebuild, foreign sidecar", "index rebuild --index {index}", "sidecar-not-a-record", 0,
     "sidecar record is not a JSON object"),
    ("rebuild, corrupt wheel", "index rebuild --index {index}", "wheel-not-a-zip", 0,
     "warning: quarantined junk-1.0-py3-none-any.whl"),
    ("rebuild, not a wheel name", "index rebuild --index {index}", "not-a-wheel-name", 0,
     "not a valid wheel file name"),
    ("rebuild, files/ a file", "index rebuild --index {index}", "files-is-a-file", 9,
     "publish error: cannot list the index's"),
    ("rebuild, index under a file", "index rebuild --index {afile}/index", None, 2,
     "config error: no index at"),
    ("consumer-config, corrupt sidecar", "consumer-config --index {index}",
     "sidecar-not-utf8", 0, "sidecar record is not valid JSON; `wheelforge index rebuild"),
    ("consumer-config, files/ a file", "consumer-config --index {index}", "files-is-a-file",
     9, "publish error: cannot list"),
    ("yank, corrupt sidecar", "yank filler1==0.0.1+cu130 --index {index}",
     "sidecar-not-utf8", 9, "publish error: files/filler1-0.0.1+cu130"),
    ("prune, corrupt wheel", "prune --keep 1 --index {index}", "wheel-not-a-zip", 0,
     "warning: "),
    ("serve, index under a file", "serve --port 0 --index {afile}/index", None, 2,
     "config error: no index at"),
    ("test, files/ a file", "test faultpkg --recipes {recipes} --index {index} "
     "--cache-dir {cache}", "files-is-a-file", 3, "declares no GPU test"),
    ("build, corrupt sidecar in files/", "build faultpkg --recipes {recipes} --sources "
     "{sdists} --index {index} --cache-dir {cache}", "sidecar-not-utf8", 0, "ok publish"),
    ("build, corrupt wheel in files/", "build faultpkg --recipes {recipes} --sources "
     "{sdists} --index {index} --cache-dir {cache}", "wheel-not-a-zip", 0, "ok publish"),
    ("build, files/ a file", "build faultpkg --recipes {recipes} --sources {sdists} "
     "--index {index} --cache-dir {cache}", "files-is-a-file", 9, "publish error: "),
    ("build, index a file", "build faultpkg --recipes {recipes} --index {afile}", None, 2,
     "is a file"),
    ("build, index under a file", "build faultpkg --recipes {recipes} --sources {sdists} "
     "--index {afile}/index --cache-dir {cache}", None, 9, "is not a directory"),
    ("build, cache under a file", "build faultpkg --recipes {recipes} --sources {sdists} "
     "--index {index} --cache-dir {afile}/cache", "sidecar-not-a-record", 9,
     "publish error: "),
    ("build, recipe not UTF-8", "build faultpkg --recipes {bad_recipes}", None, 3,
     "not UTF-8 (byte 0xff)"),
    ("build, project file not UTF-8", "build faultpkg --recipes {recipes} --config "
     "{bad_config}", None, 2, "not UTF-8 (byte 0xff)"),
    ("list, recipe not UTF-8", "list --recipes {bad_recipes}", None, 3, "not UTF-8"),
    ("show, recipe not UTF-8", "show faultpkg --recipes {bad_recipes}", None, 3,
     "not UTF-8 (byte 0xff)"),
    ("check, recipe not UTF-8", "check --recipes {bad_recipes}", None, 3, "not UTF-8"),
    ("nightly, project file not UTF-8", "nightly --config {bad_config} --recipes {recipes} "
     "--index {index} --cache-dir {cache}", "sidecar-not-a-record", 2, "not UTF-8 (byte 0xff)"),
    ("prune, project file not UTF-8", "prune --config {bad_config} --index {index}",
     "sidecar-not-a-record", 2, "not UTF-8 (byte 0xff)"),
    ("inspect, not a wheel", "inspect {afile}", None, 2,
     "config error: "),
]


@pytest.mark.parametrize(("args", "broken", "code", "text"),
                         [pytest.param(*case[1:], id=case[0]) for case in BROKEN])
def test_no_subcommand_shows_a_traceback_on_broken_inputs(
        work: Path, recipes: Path, shared_cache: Path, args: str, broken: str | None,
        code: int, text: str) -> None:
    afile = work / "afile"
    afile.write_text("a file, not a directory or a wheel")
    bad_recipes = work / "bad-recipes"
    bad_recipes.mkdir(exist_ok=True)
    (bad_recipes / "faultpkg.yaml").write_bytes(b"name: faultpkg\nsummary: \xff\xfe\n")
    bad_config = work / "bad-config.yaml"
    bad_config.write_bytes(b"matrix:\n  recipes: [\xff]\n")
    index = _broken(work, broken) if broken else work / "broken" / "none"
    argv = args.format(index=index, afile=afile, recipes=recipes, bad_recipes=bad_recipes,
                       bad_config=bad_config, cache=shared_cache, sdists=work / "sdists")
    done = subprocess.run([sys.executable, "-m", "wheelforge", *argv.split()],
                          env=harness.environ(), capture_output=True, text=True, timeout=120,
                          cwd=work)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == code, done.stderr[-3000:]
    assert text in done.stderr, done.stderr[-3000:]
    if args.startswith("index rebuild") and code == 0:  # what is left is sound
        assert harness.index_problems(index, work) == []


@pytest.mark.parametrize("command", [
    ["yank", "faultpkg==0.0.30", "--reason", "bad"],
    ["index", "rebuild"],
    ["prune", "--keep", "1"],
])
def test_other_writers_killed_part_way_are_finished_by_a_read_only_command(
        work: Path, populated: Path, command: list[str]) -> None:
    """yank, rebuild (of an index whose pages were deleted) and prune (remove, then
    rebuild) killed at spread points; the next command is consumer-config, which repairs
    before it reads."""
    if command == ["index", "rebuild"]:
        damaged = work / "no-pages"
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(populated, damaged)
        shutil.rmtree(damaged / "simple")
        (damaged / "index.html").unlink()
        populated = damaged
    points = harness.count_command(populated, work, command)
    assert points > 3
    spread = sorted({1, 2, points // 3, points // 2, points - 1, points})
    tag = command[0] + (command[1] if command[0] == "index" else "")
    outcomes = [harness.kill_command(populated, work, command, at, ["consumer-config"], tag)
                for at in spread]
    assert all(killed for killed, _ in outcomes)
    bad = [f"kill at {at}/{points}: {problems}" for at, (_, problems) in zip(spread, outcomes,
                                                                               strict=True)
           if problems]
    assert not bad, "\n".join(bad)


def test_repair_sweeps_a_report_temp_file_left_by_a_killed_nightly(work: Path,
                                                                   populated: Path) -> None:
    from wheelforge import index

    root = work / "index-report"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(populated, root)
    (root / "reports").mkdir()
    (root / "reports" / ".wf-tmp-0123456789ab").write_text("half a report")
    assert index.repair(root) is True
    assert harness.index_problems(root, work) == []
    assert index.repair(root) is False  # one stat and one scandir when there is nothing
