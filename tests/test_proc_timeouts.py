"""_proc.run's timeout holds while the command runs (issue 52: it used to be applied only
once the command had closed its output, so ``timeout=1`` on a silent 4 s command returned
normally after 4 s): a silent command, one that closes its output early, one that ignores
SIGTERM and one whose grandchild holds the pipe are each stopped within timeout + grace,
with every process they started, and the error says what, why and what to do."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from wheelforge import _proc
from wheelforge.errors import WheelforgeError

TIMEOUT = 1.0
#: timeout + the TERM-to-KILL grace + room for a loaded 2-core machine
BOUND = TIMEOUT + 2.0 + 2.0


def marker() -> str:
    """A sleep duration no other process has: how a test finds its own sleepers."""
    return f"6.{uuid.uuid4().int % 10**6:06d}"


def sleepers(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] and mark in proc.info["cmdline"] and \
                proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def stopped(argv: list[str], mark: str, *, check: bool = True) -> tuple[object, float]:
    """Run ``argv`` with the timeout; what it gave (the error or the result) and how long
    it took.  Nothing of it may be left running."""
    began = time.monotonic()
    try:
        got: object = _proc.run(argv, timeout=TIMEOUT, check=check)
    except _proc.CommandFailed as exc:
        got = exc
    took = time.monotonic() - began
    left = sleepers(mark)
    for proc in left:  # leave nothing behind on a failure
        proc.kill()
    assert not left, f"still running after the timeout: {[p.cmdline() for p in left]}"
    return got, took


def assert_timed_out(got: object, took: float, argv: list[str]) -> _proc.CommandTimedOut:
    assert isinstance(got, _proc.CommandTimedOut), f"not stopped: {got!r} after {took:.1f} s"
    assert took < BOUND, f"stopped after {took:.1f} s"
    assert got.returncode == 124 and got.argv == tuple(argv)
    assert "timed out after 1 s" in got.why and "SIGKILL" in got.why
    assert got.fix
    return got


def test_a_silent_command_is_stopped() -> None:
    mark = marker()
    argv = ["sleep", mark]
    got, took = stopped(argv, mark)
    assert_timed_out(got, took, argv)


def test_a_command_that_closed_its_output_is_stopped() -> None:
    mark = marker()
    argv = ["sh", "-c", f"echo started; exec >&- 2>&-; sleep {mark}"]
    got, took = stopped(argv, mark)
    err = assert_timed_out(got, took, argv)
    assert err.tail.startswith("started\n"), err.tail  # what it said is kept


def test_a_command_that_ignores_sigterm_is_killed() -> None:
    mark = marker()
    argv = ["sh", "-c", f"trap '' TERM; echo ready; sleep {mark}; echo survived"]
    got, took = stopped(argv, mark)
    err = assert_timed_out(got, took, argv)
    assert took >= TIMEOUT + _proc.TIMEOUT_GRACE_S - 0.2  # the grace was given
    assert "ready" in err.tail and "survived" not in err.tail


GRANDCHILD = """
import os, subprocess, sys
subprocess.Popen(["sleep", sys.argv[1]], process_group=0)  # a job of its own, as ninja's
subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True)  # a session of its own
print("started", flush=True)
os.execvp("sleep", ["sleep", sys.argv[1]])
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen's process_group is 3.11's")
def test_grandchildren_holding_the_pipe_are_stopped() -> None:
    mark = marker()
    argv = [sys.executable, "-c", GRANDCHILD, mark]
    got, took = stopped(argv, mark)
    assert_timed_out(got, took, argv)


def test_check_false_gives_the_result_with_what_was_read() -> None:
    mark = marker()
    argv = ["sh", "-c", f"echo one; echo two; sleep {mark}"]
    got, took = stopped(argv, mark, check=False)
    assert isinstance(got, _proc.Completed) and took < BOUND
    assert got.timed_out and got.returncode == 124
    assert got.output.startswith("one\ntwo\n") and "timed out after 1 s" in got.output


def test_the_error_reaches_the_command_line_as_a_message() -> None:
    err = _proc.CommandTimedOut(["pip", "install", "x"], 300, "tail\n")
    assert isinstance(err, WheelforgeError) and err.exit_code == 124
    text = err.render()
    assert text.startswith("timed out: pip install x did not finish")
    assert "why: pip timed out after 300 s" in text and "fix: run the command by hand" in text


def test_a_quick_command_is_untouched_by_its_timeout() -> None:
    done = _proc.run(["sh", "-c", "printf 'a\\r\\nb\\rc'; exit 3"], timeout=30, check=False)
    assert done == _proc.Completed(("sh", "-c", "printf 'a\\r\\nb\\rc'; exit 3"), 3,
                                   "a\nb\nc")


def test_the_log_says_it_timed_out(tmp_path: Path) -> None:
    mark = marker()
    log = tmp_path / "cmd.log"
    with pytest.raises(_proc.CommandTimedOut):
        _proc.run(["sh", "-c", f"echo working; sleep {mark}"], timeout=TIMEOUT, log=log)
    assert log.read_text().splitlines()[1:] == [
        "working", f"sh timed out after 1 s: stopped with every process it started (SIGTERM, "
        f"SIGKILL {_proc.TIMEOUT_GRACE_S:g} s later)"]
    assert not sleepers(mark)


def test_a_command_that_ended_in_time_is_not_timed_out_by_what_it_left() -> None:
    """It exited at once, and a process it left behind holds its output past the timeout:
    its exit status counts, and what it left behind is killed."""
    mark = marker()
    argv = ["sh", "-c", f"echo done; sleep {mark} & exit 0"]
    got, took = stopped(argv, mark)
    assert got == _proc.Completed(tuple(argv), 0, "done\n") and took < BOUND


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e308])
def test_a_timeout_too_large_to_matter_is_no_limit(timeout: float) -> None:
    done = _proc.run(["sh", "-c", "echo ok"], timeout=timeout)
    assert done.output == "ok\n" and not done.timed_out
