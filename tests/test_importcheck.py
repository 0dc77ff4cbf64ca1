"""The import check's warm interpreter (builder/artifact/importcheck.py), with real interpreters:
it answers as the cold check does, each check starts from the same state, a crash in an
import is reported and the interpreter serves the next check, a changed environment or an
interpreter that did not start leaves the check to the cold path, and close() leaves no
process.  Here the warm interpreter preloads ``json`` (torch takes seconds); the builds'
use with torch is covered by the fixture's builds (tests/test_build_fixture.py) and the
end-to-end builds."""

from __future__ import annotations

import os
import sys
import threading
import time
import venv
from pathlib import Path

import pytest

from wheelforge import _proc
from wheelforge.builder.artifact.importcheck import MARK, WarmImports, cold_problems

PY = Path(sys.executable)


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    """An unpacked 'wheel': a good module, a failing one, a crashing one, and two that
    tell whether an earlier check's import leaked into this one."""
    where = tmp_path / "unpacked"
    where.mkdir()
    (where / "good.py").write_text("import json\nVALUE = json.dumps([1])\n")
    (where / "bad.py").write_text("raise RuntimeError('the extension is broken')\n")
    (where / "crash.py").write_text("import ctypes\nctypes.string_at(0)\n")
    (where / "first.py").write_text("import sys\nsys.first_was_here = True\n")
    (where / "second.py").write_text(
        "import sys\n"
        "if 'first' in sys.modules or hasattr(sys, 'first_was_here'):\n"
        "    raise RuntimeError('an earlier check leaked into this one')\n")
    (where / "where.py").write_text(
        "import os, sys\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "assert os.getcwd() == here, os.getcwd()\n"
        "assert sys.path[:2] == ['', here], sys.path[:2]\n"
        "assert os.environ['PYTHONPATH'] == here\n")
    return where


def test_warm_answers_as_cold_does(wheel_dir: Path) -> None:
    with WarmImports(preload="json") as warm:
        warm.start(PY)
        for modules in (("good",), ("good", "bad"), ("no_such_module",), ("where",)):
            assert warm.problems(PY, wheel_dir, modules, None) == \
                cold_problems(PY, wheel_dir, modules, False, None), modules
        assert warm.problems(PY, wheel_dir, ("good", "bad"), None) == \
            ["import bad failed: RuntimeError: the extension is broken"]


def test_each_check_starts_from_the_same_state(wheel_dir: Path) -> None:
    with WarmImports(preload="json") as warm:
        warm.start(PY)
        assert warm.problems(PY, wheel_dir, ("first",), None) == []
        assert warm.problems(PY, wheel_dir, ("second",), None) == []


def test_checks_at_once_are_all_answered(wheel_dir: Path) -> None:
    answers: list[list[str] | None] = []
    with WarmImports(preload="json") as warm:
        warm.start(PY)
        threads = [threading.Thread(target=lambda m=m: answers.append(
            warm.problems(PY, wheel_dir, m, None))) for m in [("good",), ("bad",)] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(map(str, answers)) == sorted(map(str, [[]] * 4 + [
        ["import bad failed: RuntimeError: the extension is broken"]] * 4))


def test_a_crash_in_an_import_is_reported_and_the_next_check_served(
        wheel_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with WarmImports(preload="json") as warm:
        warm.start(PY)
        found = warm.problems(PY, wheel_dir, ("crash",), log)
        assert found is not None and len(found) == 1
        assert found[0].startswith("the import check's process died before it answered")
        assert "Segmentation fault" in log.read_text()  # faulthandler says where
        assert "crash.py" in log.read_text()
        assert warm.problems(PY, wheel_dir, ("good",), log) == []
    text = log.read_text()
    assert "in a child of the command's warm interpreter" in text
    assert MARK not in text


def test_a_changed_environment_is_checked_cold(wheel_dir: Path, tmp_path: Path) -> None:
    """An install into the environment after the warm interpreter started (a recipe's
    verify requirements, another build's) is not seen by what it imported at its start:
    the check runs cold (None), and a new start serves it warm again."""
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    site = next((tmp_path / "env" / "lib").glob("python*/site-packages"))
    with WarmImports(preload="json") as warm:
        warm.start(python)
        assert warm.problems(python, wheel_dir, ("good",), None) == []
        time.sleep(0.01)
        (site / "newly_installed.py").write_text("")
        os.utime(site, None)
        assert warm.problems(python, wheel_dir, ("good",), None) is None
        warm.start(python)
        assert warm.problems(python, wheel_dir, ("good",), None) == []


def test_an_interpreter_that_cannot_start_leaves_the_check_cold(
        wheel_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with WarmImports(preload="no_such_module_to_preload") as warm:
        warm.start(PY)
        assert warm.problems(PY, wheel_dir, ("good",), log) is None
        assert list(warm.running()) == []
    assert "could not serve the import check: ModuleNotFoundError: No module named " \
           "'no_such_module_to_preload'; it runs in a fresh interpreter" in log.read_text()
    assert WarmImports().problems(PY, wheel_dir, ("good",), None) is None  # none started


def test_close_leaves_no_process(wheel_dir: Path) -> None:
    warm = WarmImports(preload="json")
    warm.start(PY)
    assert warm.problems(PY, wheel_dir, ("good",), None) == []
    pids = list(warm.running())
    assert len(pids) == 1
    warm.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pids[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pids[0]}").exists()
    warm.start(PY)  # closed: starts nothing
    assert list(warm.running()) == []


@pytest.mark.unit
def test_a_child_s_answer_is_the_last_marked_line() -> None:
    """``_proc.marked``: how wheelforge reads a child interpreter's answer among what else
    it printed (the import check, the stack check, the platform tag's analysis)."""
    said = "warning: x\nM: {\"a\": 1}\nchatter M: {\"a\": 0}\nM: {\"a\": 2}\ntrailing\n"
    assert _proc.marked(said, "M: ") == {"a": 2}
    assert _proc.marked("no answer\n", "M: ") is None
    assert _proc.marked("M: {not json\n", "M: ") is None
    assert _proc.marked("", "M: ") is None


def test_close_does_not_wait_for_an_import_still_running(tmp_path: Path) -> None:
    """A build that fails soon after its compile started closes the command while the
    warm interpreter still imports torch: it is killed, not waited for."""
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    site = next((tmp_path / "env" / "lib").glob("python*/site-packages"))
    (site / "slow_to_import.py").write_text("import time\ntime.sleep(60)\n")
    warm = WarmImports(preload="slow_to_import")
    warm.start(python)
    time.sleep(0.5)  # started, importing
    began = time.monotonic()
    warm.close()
    assert time.monotonic() - began < 30  # the import would take 60 s
    assert list(warm.running()) == []
    leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and b"slow_to_import" in _cmdline(p)]
    assert not leftover


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
