"""The stack gate with real pip and real venvs, on fixture stacks of pure wheels (seconds):
a dependency that breaks another wheel's optional import is caught and named with its
requirement chain; a good stack names what it resolved; unreachable dependencies are "not
checked", never "good"; the status is recorded in the index and shown on its landing page.

The whole shipped stack (torch and the four recipes, dependencies from PyPI) is checked in
tests/test_e2e_stack.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel, write_recipe
from wheelforge import _proc, index
from wheelforge.consume import stack
from wheelforge.index import health

NO_TARGET: dict[str, Any] = {"channel": None, "cuda": None, "torch": None, "archs": [],
                             "build_key": None}
CU130: dict[str, Any] = {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1",
                         "archs": ["sm_120"], "build_key": "key-1"}
#: the failure measured with tilelang 0.1.8 and apache-tvm-ffi 0.1.12, reproduced
BREAKS = "raise AttributeError(\"attribute '__dict__' of 'type' objects is not writable\")\n"


def wheelforge(*args: str, cwd: Path, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full.pop("WHEELFORGE_STACK_CHECK", None)
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd, env=full,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600)


def fixture_stack(tmp: Path, *, spoiler_breaks: bool) -> tuple[Path, Path]:
    """An index with two pure wheels: alpha (whose optional `import spoiler` treats only an
    ImportError as absence, as fla-core treats tilelang) and beta (which requires spoiler,
    as mamba-ssm requires tilelang); and a directory of dependency wheels with spoiler."""
    dist, deps, root = tmp / "dist", tmp / "deps", tmp / "index"
    alpha = make_wheel(dist, {"alpha/__init__.py":
                              "try:\n    import spoiler\nexcept ImportError:\n"
                              "    spoiler = None\n"}, name="alpha", version="1.0+wf")
    beta = make_wheel(dist, {"beta/__init__.py": "VALUE = 1\n"}, name="beta",
                      version="2.0+wf", metadata_extra="Requires-Dist: spoiler>=1")
    make_wheel(deps, {"spoiler/__init__.py": BREAKS if spoiler_breaks else "OK = True\n"},
               name="spoiler", version="1.5")
    for w in (alpha, beta):
        index.publish(root, w, **NO_TARGET)
    return root, deps


def test_a_dependency_that_breaks_another_wheels_import_is_caught_and_named(
        tmp_path: Path) -> None:
    root, deps = fixture_stack(tmp_path, spoiler_breaks=True)
    res = wheelforge("stack", "check", "--index", str(root), "--deps-dir", str(deps),
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert res.returncode == 13, res.stdout
    assert ("stack simple/: broken: import alpha failed: AttributeError: attribute '__dict__' "
            "of 'type' objects is not writable in spoiler 1.5; through alpha -> spoiler; "
            "spoiler is installed because beta -> spoiler") in res.stdout
    assert "Traceback" not in res.stdout
    status = health.read_status(root, None)
    assert status is not None and status.state == "broken"
    assert status.resolved == {"spoiler": "1.5"}
    assert status.culprit_chains == ("beta -> spoiler",)
    assert [(o.module, o.ok) for o in status.imports] == [("alpha", False), ("beta", True)]
    assert status.pins == ("alpha==1.0+wf", "beta==2.0+wf")
    landing = (root / "index.html").read_text()
    assert '<b>simple/</b>: <span class="bad">broken: import alpha failed' in landing
    # the log keeps the whole traceback
    log = Path(status.reason.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "spoiler/__init__.py" in log.read_text()
    # the venv is gone, the log stays
    assert not any((tmp_path / "cache" / "stack").iterdir())


def test_an_interpreter_that_crashes_as_it_ends_breaks_the_stack(tmp_path: Path) -> None:
    """Every import succeeds and the answer is printed, but a library's teardown kills
    the interpreter (SIGSEGV): a user's script would end so too."""
    dist, root = tmp_path / "dist", tmp_path / "index"
    wheel = make_wheel(dist, {"crasher/__init__.py":
                              "import atexit, os, signal\n"
                              "atexit.register(os.kill, os.getpid(), signal.SIGSEGV)\n"},
                       name="crasher", version="1.0+wf")
    index.publish(root, wheel, **NO_TARGET)
    (tmp_path / "deps").mkdir()
    res = wheelforge("stack", "check", "--index", str(root), "--deps-dir",
                     str(tmp_path / "deps"), "--cache-dir", str(tmp_path / "cache"),
                     cwd=tmp_path)
    assert res.returncode == 13, res.stdout
    assert ("stack simple/: broken: every import succeeded, but the interpreter that "
            "imported them was killed by SIGSEGV as it ended") in res.stdout
    status = health.read_status(root, None)
    assert status is not None and status.state == "broken"
    assert [(o.module, o.ok) for o in status.imports] == [("crasher", True)]


def test_a_good_stack_names_what_it_resolved(tmp_path: Path) -> None:
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)
    res = wheelforge("stack", "check", "--index", str(root), "--deps-dir", str(deps),
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    assert "stack simple/: good" in res.stdout
    status = health.read_status(root, None)
    assert status is not None and status.state == "good" and status.reason == ""
    assert status.resolved == {"spoiler": "1.5"}
    assert all(o.ok for o in status.imports)
    assert status.dependencies_from == str(deps)
    assert '<span class="ok">good</span>' in (root / "index.html").read_text()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_pip_resolves_the_dependencies_and_uv_writes_them_unless_told_pip(
        tmp_path: Path, installer: str) -> None:
    """The stack check's venv is a scratch one: pip resolves the dependencies (a dry run,
    with every setting pip reads) and uv writes exactly those versions from its cache;
    WHEELFORGE_INSTALLER=pip has pip write them.  The same stack either way, and pip's
    own `pip check` and the imports run after both (here offline: --deps-dir, which uv
    gets as --no-index --find-links)."""
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)
    make_wheel(deps, {"spoiler/__init__.py": "OK = True\n"}, name="spoiler", version="1.6")
    res = wheelforge("stack", "check", "--index", str(root), "--deps-dir", str(deps),
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path,
                     env={"WHEELFORGE_INSTALLER": installer})
    assert res.returncode == 0, res.stdout
    written_by_uv = "their dependencies as pip resolved them (1), written by uv" in res.stdout
    assert written_by_uv == (installer == "uv"), res.stdout
    if installer == "pip":
        assert "pip writes the dependencies (uv cannot: WHEELFORGE_INSTALLER=pip)" in res.stdout
    status = health.read_status(root, None)
    assert status is not None and status.state == "good"
    assert status.resolved == {"spoiler": "1.6"}


@pytest.mark.unit
def test_what_pip_lists_is_read_among_its_warnings_and_compared_as_versions() -> None:
    from wheelforge.consume.venv import _listed_versions, _same_version

    out = ('WARNING: Location \'file:///x/\' is ignored\n'
           '[{"name": "Torch", "version": "2.14.1+cu130"}, {"name": "a_b", "version": "1.0"}]\n'
           "WARNING: something after\n")
    assert _listed_versions(out) == {"torch": "2.14.1+cu130", "a-b": "1.0"}
    assert _listed_versions("no json here") == {} == _listed_versions("[not json")
    assert _same_version("1.0", "1.0.0") and not _same_version("2.14.1+cu130", "2.14.1")
    assert not _same_version(None, "1.0")


@pytest.mark.unit
def test_the_dry_runs_report_gives_names_versions_and_direct_urls_only() -> None:
    from wheelforge.consume.venv import _report_requirements

    report = {"version": "1", "install": [
        {"metadata": {"name": "torch", "version": "2.14.1"}, "is_direct": False,
         "download_info": {"url": "https://files.example/torch-2.14.1-cp311.whl"}},
        {"metadata": {"name": "Local_Thing", "version": "0.1"}, "is_direct": True,
         "download_info": {"url": "file:///w/local_thing-0.1-py3-none-any.whl"}}]}
    assert _report_requirements(json.dumps(report)) == [
        ("torch", "2.14.1", None),
        ("Local_Thing", "0.1", "file:///w/local_thing-0.1-py3-none-any.whl")]


def test_unreachable_dependencies_are_not_checked_never_good(tmp_path: Path) -> None:
    """No network and no --deps-dir: pip's index is a port where nothing listens."""
    root, _deps = fixture_stack(tmp_path, spoiler_breaks=False)
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/", "PIP_FIND_LINKS": "",
           "PIP_CONFIG_FILE": os.devnull}
    res = wheelforge("stack", "check", "--index", str(root),
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout
    assert "stack simple/: not checked: the dependencies could not be reached" in res.stdout
    status = health.read_status(root, None)
    assert status is not None and status.state == "not checked"
    assert "not checked" in (root / "index.html").read_text()


def test_a_stable_channels_abi3_wheel_is_checked_with_a_newer_python(tmp_path: Path) -> None:
    """A cp310-abi3 wheel (the stable channel's) installs into CPython 3.10 and every later
    one: the gate checks it with this interpreter (it said "not checked: the wheels are for
    cp310" under 3.11)."""
    dist, root = tmp_path / "dist", tmp_path / "index"
    stable = {**CU130, "channel": "cu13-stable"}
    index.publish(root, make_wheel(dist, {"ext/__init__.py": ""}, name="ext",
                                   version="1.0+cu13stable",
                                   tag="cp310-abi3-linux_x86_64"), **stable)
    res = wheelforge("stack", "check", "--index", str(root), "--channel", "cu13-stable",
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    assert "not checked" not in res.stdout, res.stdout
    status = health.read_status(root, "cu13-stable")
    assert status is not None and status.state == "good", res.stdout


def test_a_channel_is_checked_with_the_pure_wheels_and_a_wrong_python_is_not_checked(
        tmp_path: Path) -> None:
    """A channel's pages hold its wheels and the channel-less pure ones; a cp39 wheel is
    not checked with this interpreter (it says which one to pass)."""
    dist, root = tmp_path / "dist", tmp_path / "index"
    index.publish(root, make_wheel(dist, {"ext/__init__.py": ""}, name="ext",
                                   version="1.0+cu130", tag="cp39-cp39-linux_x86_64"), **CU130)
    index.publish(root, make_wheel(dist, {"purep/__init__.py": ""}, name="purep",
                                   version="1.0+wf"), **NO_TARGET)
    res = wheelforge("stack", "check", "--index", str(root), "--channel", "cu130-torch2.14",
                     "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert ("stack cu130-torch2.14: not checked: the channel's wheels are for cp39, the "
            "interpreter ") in res.stdout and f"is {tag}: pass --python" in res.stdout
    status = health.read_status(root, "cu130-torch2.14")
    assert status is not None and status.pins == ("ext==1.0+cu130", "purep==1.0+wf")


def test_an_unknown_channel_is_a_usage_error(tmp_path: Path) -> None:
    root, _ = fixture_stack(tmp_path, spoiler_breaks=False)
    res = wheelforge("stack", "check", "--index", str(root), "--channel", "cu999",
                     cwd=tmp_path)
    assert res.returncode == 2
    assert "has no channel 'cu999'" in res.stdout and "Traceback" not in res.stdout


@pytest.mark.unit
def test_pip_check_failures_break_the_stack(tmp_path: Path) -> None:
    """pip check's findings (a requirement an installed distribution does not meet) are a
    broken stack even when every import works (a fake pip check result: unit level)."""
    make = stack._Maker(channel=None, pins=("a==1",), checked_at="t", python="py",
                        dependencies_from="x")
    bad = _proc.Completed(("pip", "check"), 1, "a 1 has requirement b>=2, but you have b 1.\n")
    data = {"imports": [{"module": "a", "ok": True}], "dists": {"a": {"version": "1",
                                                                      "requires": ["b>=2"]},
                                                                "b": {"version": "1"}}}
    status = stack._judge(data, {"a"}, bad, make, tmp_path / "log")
    assert status.state == "broken"
    assert status.reason.startswith("pip check: a 1 has requirement b>=2, but you have b 1.")
    ok = stack._judge(data, {"a"}, _proc.Completed(("pip", "check"), 0, "No broken"), make,
                      tmp_path / "log")
    assert ok.state == "good" and ok.resolved == {"b": "1"}


@pytest.mark.unit
@pytest.mark.parametrize("dists, expected", [
    ({"mamba-ssm": {"requires": ["tilelang==0.1.8", "einops"]}, "fla-core": {"requires": []},
      "tilelang": {"requires": ["apache-tvm-ffi"]}}, ["mamba-ssm -> tilelang"]),
    # an extra that was not asked for installs nothing
    ({"mamba-ssm": {"requires": ['tilelang; extra == "mamba3"']}, "fla-core": {}}, []),
    ({"fla-core": {"requires": ["x"]}, "x": {"requires": ["tilelang"]},
      "mamba-ssm": {"requires": ["tilelang"]}},
     ["fla-core -> x -> tilelang", "mamba-ssm -> tilelang"]),
])
def test_requirement_chains(dists: dict[str, dict[str, object]], expected: list[str]) -> None:
    assert stack.requirement_chains(dists, ["fla-core", "mamba-ssm"], "tilelang") == expected


@pytest.mark.unit
@pytest.mark.parametrize("text", [
    "", "[]", '{"schema": 1}', '{"schema": 1, "state": "great"}',
    '{"schema": 1, "state": "good", "channel": "../x"}',
    '{"schema": 1, "state": "good", "resolved": {"a": 1}}',
    '{"schema": 2, "state": "good"}',
])
def test_a_damaged_status_file_reads_as_never_checked(tmp_path: Path, text: str) -> None:
    (tmp_path / health.STACK_FILE).write_text(text)
    assert health.read_status(tmp_path, None) is None


@pytest.mark.unit
def test_the_status_round_trips(tmp_path: Path) -> None:
    status = health.StackStatus(
        channel=None, state="broken", checked_at="2026-12-02T07:00:00Z", reason="r",
        pins=("a==1",), resolved={"b": "2"},
        imports=(health.ImportOutcome(module="a", ok=False, error="E: x", through=("a", "b")),),
        culprit_chains=("a -> b",))
    assert health.from_json(health.to_json(status)) == status
    assert json.loads(health.to_json(status))["schema"] == health.SCHEMA


def alpha_project(root: Path) -> Path:
    """A pure recipe `alpha` (a real sdist) whose package requires spoiler and treats only an
    ImportError of it as absence; returns the sdists directory."""
    src = root / "pkgs" / "alpha"
    (src / "alpha").mkdir(parents=True)
    (src / "alpha" / "__init__.py").write_text(
        "try:\n    import spoiler\nexcept ImportError:\n    spoiler = None\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n\n[project]\nname = "alpha"\n'
        'version = "0.1.0"\ndependencies = ["spoiler"]\n')
    sdists = root / "sdists"
    sdists.mkdir()
    sdist = sdists / "alpha-0.1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(src, arcname="alpha-0.1.0")
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    write_recipe(root, "alpha", f"""format: 1
name: alpha
version: "0.1.0"
sources:
  - sdist: {{filename: alpha-0.1.0.tar.gz, sha256: "{sha}"}}
build:
  kind: pure
""")
    return sdists


def test_the_nightly_checks_every_channel_and_names_the_dependency_that_broke_it(
        tmp_path: Path) -> None:
    """Night 1: the stack is good with spoiler 1.0.  Night 2 builds nothing (the cell is
    published), but spoiler 2.0 has come out and breaks alpha's optional import: the gate
    still runs, the night fails, and the report names the dependency that moved."""
    sdists = alpha_project(tmp_path)
    (tmp_path / "wheelforge.yaml").write_text(
        "matrix:\n  recipes: [alpha]\n  torch:\n    - {spec: 'torch==2.14.1', cuda: '13.0'}\n"
        "  archs: ['12.0']\n")
    deps = tmp_path / "deps"
    make_wheel(deps, {"spoiler/__init__.py": "OK = True\n"}, name="spoiler", version="1.0")
    args = ["nightly", "--config", str(tmp_path / "wheelforge.yaml"), "--recipes",
            str(tmp_path / "recipes"), "--sources", str(sdists), "--index",
            str(tmp_path / "index"), "--cache-dir", str(tmp_path / "cache"), "--work-dir",
            str(tmp_path / "work"), "--deps-dir", str(deps)]
    first = wheelforge(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "stack simple/: good" in first.stdout
    # spoiler 2.0 is released and breaks alpha's import
    shutil.rmtree(deps)
    make_wheel(deps, {"spoiler/__init__.py": BREAKS}, name="spoiler", version="2.0")
    second = wheelforge(*args, cwd=tmp_path)
    assert second.returncode == 1, second.stdout[-3000:]
    assert "skipped  alpha" in second.stdout  # nothing was built
    assert "stack simple/: broken: import alpha failed: AttributeError" in second.stdout
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    (status,) = report["stacks"]
    assert status["state"] == "broken"
    assert "since then spoiler 1.0 -> 2.0" in status["reason"]
    page = (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()
    assert "<h2>Stack check</h2>" in page and "spoiler 1.0 -&gt; 2.0" in page


def test_a_build_whose_stack_breaks_stays_published_and_exits_13(tmp_path: Path) -> None:
    """What a broken stack does to publishing: the verified wheel stays published (the index
    is immutable), the channel is marked broken, and the build exits 13 naming the culprit."""
    sdists = alpha_project(tmp_path)
    deps = tmp_path / "deps"
    make_wheel(deps, {"spoiler/__init__.py": BREAKS}, name="spoiler", version="2.0")
    res = wheelforge("build", "alpha", "--recipes", str(tmp_path / "recipes"), "--sources",
                     str(sdists), "--index", str(tmp_path / "index"), "--cache-dir",
                     str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"),
                     "--deps-dir", str(deps), cwd=tmp_path)
    assert res.returncode == 13, res.stdout[-3000:]
    assert "published: alpha-0.1.0+wf-py3-none-any.whl  [pure Python]" in res.stdout
    assert ("stack simple/: broken: import alpha failed: AttributeError: attribute "
            "'__dict__' of 'type' objects is not writable in spoiler 2.0") in res.stdout
    assert "the stack of simple/ is broken" in res.stdout and "Traceback" not in res.stdout
    assert [r.filename for r in index.load_records(tmp_path / "index")] == [
        "alpha-0.1.0+wf-py3-none-any.whl"]
    assert '<span class="bad">broken' in (tmp_path / "index" / "index.html").read_text()


@pytest.mark.unit
def test_recording_a_status_refreshes_the_landing_page_alone(tmp_path: Path) -> None:
    """index.record_stack writes the status and the landing page in one change under the
    index lock; the project pages (and every wheel) are left as they were; the status it
    replaces comes back."""
    wheel = make_wheel(tmp_path / "w", {"demo/__init__.py": ""}, name="demo")
    root = tmp_path / "index"
    index.publish(root, wheel, **NO_TARGET)
    project_page = root / "simple" / "demo" / "index.html"
    before = project_page.stat().st_mtime_ns
    status = health.StackStatus(channel=None, state="broken", checked_at="2026-12-02T07:00:00Z",
                                reason="import demo failed", pins=("demo==1.0",))
    assert index.record_stack(root, status) is None
    assert health.read_status(root, None) == status
    assert "import demo failed" in (root / "index.html").read_text()
    assert project_page.stat().st_mtime_ns == before
    good = health.StackStatus(channel=None, state="good", checked_at="2026-12-02T08:00:00Z",
                              pins=("demo==1.0",))
    assert index.record_stack(root, good) == status
    assert not (root / ".records" / "_writing").exists()


def test_a_venv_made_while_the_builds_ran_serves_the_check_and_goes_after(
        tmp_path: Path) -> None:
    """`wheelforge build` makes the check's venv beside its builds (stack.EarlyVenv): the
    check takes it (said on the console and in the log), pip check's output still reaches
    the log (it runs beside the imports), and nothing is left under the work directory.
    One made from another interpreter is not taken: the check makes its own, and closing
    the unused one removes it."""
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)
    work = tmp_path / "cache" / "stack"
    options = stack.StackOptions(python=Path(sys.executable), work_dir=work,
                                 log_dir=tmp_path / "logs", deps_dir=deps)
    said: list[str] = []
    with stack.EarlyVenv(Path(sys.executable), work) as early:
        status = stack.check(root, None, None, options, say=said.append, early=early)
    assert status.state == "good", status.reason
    assert any("a fresh venv from" in s and "made while the builds ran" in s for s in said)
    (log,) = (tmp_path / "logs").glob("stack-*.log")
    text = log.read_text()
    assert "-m venv" in text and "(made while the builds ran)" in text
    assert "pip check --disable-pip-version-check  (beside the imports)" in text
    assert "No broken requirements found" in text
    assert not any(work.iterdir())

    other = tmp_path / "other-python"
    other.symlink_to(sys.executable)
    said.clear()
    with stack.EarlyVenv(other, work) as early:
        status = stack.check(root, None, None, options, say=said.append, early=early)
        assert status.state == "good", status.reason
        assert not any("made while the builds ran" in s for s in said)
        assert len(list(work.iterdir())) == 1  # the unused one, until closed
    assert not any(work.iterdir())


def test_a_module_that_blocks_at_import_is_stopped_at_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(issue 52: the limit was applied only once the interpreter closed its output, so a
    module that blocks at import kept the check running for as long as it blocked)."""
    import time

    import psutil

    monkeypatch.setattr(stack, "IMPORT_TIMEOUT_S", 3.0)
    wheel = make_wheel(tmp_path / "dist", {"blocker/__init__.py":
                                           "import time\nprint('blocking', flush=True)\n"
                                           "time.sleep(120.25)\n"},
                       name="blocker", version="1.0+wf")
    root = tmp_path / "index"
    index.publish(root, wheel, **NO_TARGET)
    (tmp_path / "deps").mkdir()
    options = stack.StackOptions(python=Path(sys.executable), work_dir=tmp_path / "stack",
                                 log_dir=tmp_path / "logs", deps_dir=tmp_path / "deps")
    began = time.monotonic()
    status = stack.check(root, None, None, options)
    assert time.monotonic() - began < 100  # venv and install included; not the 120 s
    assert status.state == "broken"
    assert "the import check did not finish" in status.reason
    assert "timed out after 3 s" in status.reason
    left = [p for p in psutil.process_iter(["cmdline"])
            if any("blocker" in part for part in p.info["cmdline"] or ())]
    assert not left
