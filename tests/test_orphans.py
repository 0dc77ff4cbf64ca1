"""No orphans: when wheelforge dies by SIGKILL (the OOM killer's signal, which no handler
sees), every process it started dies too, grandchildren in process groups of their own
and re-parented orphans included: within 2 s, and the next build of the same key runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_interrupt import _comm, start, wait_for_compiler
from wheelforge._proc import descendants

# A stand-in for wheelforge: runs a "backend" through _proc.run that starts a job in a
# process group of its own (as ninja does) and an orphan that is re-parented to init.
PARENT = r"""
import sys
from wheelforge import _proc
_proc.run([sys.executable, "-c", sys.argv[1]])
"""
BACKEND = r"""
import os, subprocess, sys, time
subprocess.Popen(["sleep", "300"], preexec_fn=lambda: os.setpgid(0, 0))  # like a ninja job
if os.fork() == 0:                                           # an orphan, re-parented
    subprocess.Popen(["sleep", "301"]); os._exit(0)
time.sleep(0.3)
print("started", flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def session(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[3])


def in_sessions(sessions: set[int]) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if session(int(entry)) in sessions and alive(int(entry)):
                    found.append((int(entry), _comm(int(entry))))
            except (OSError, IndexError, ValueError):
                continue
    return found


def sleepers(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[:2] == [b"sleep", marker.encode()] and alive(int(entry)):
                out.append(int(entry))
    return out


def test_sigkill_takes_grandchildren_and_orphans_along():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, BACKEND], stdout=subprocess.PIPE,
                              text=True)
    sessions: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (sleepers("300") and sleepers("301")):
            time.sleep(0.05)
        job, orphan = sleepers("300"), sleepers("301")
        assert job and orphan, "the backend did not start its children"
        tree = descendants(parent.pid)
        backend = next(p for p in tree if _comm(p).startswith("python"))
        sessions.add(session(backend))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # the watchdog (in the tree, in a session of its own) exits once the sessions it
        # watched are empty: wait for both, up to the promised 2 s
        def left() -> list[int]:
            return [p for p in [*tree, *job, *orphan] if alive(p) and p != parent.pid]
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and (in_sessions(sessions) or left()):
            time.sleep(0.05)
        assert not in_sessions(sessions)
        assert not left(), [(p, _comm(p)) for p in left()]
    finally:
        parent.kill()
        parent.wait()
        for pid, _ in in_sessions(sessions):  # on a failure, leave nothing of ours behind
            os.kill(pid, signal.SIGKILL)


@pytest.mark.nvcc
def test_sigkill_mid_compile_leaves_nothing_running(tmp_path: Path, shared_cache: Path,
                                                     nvcc: str, short_tmpdir: Path):
    """Nothing running; what is left on disk (the pool of compile slots, which nothing
    could remove) goes with `wheelforge clean`."""
    # TMPDIR short enough for the pool's socket (else the pool goes to /tmp:
    # tests/test_first_day.py)
    tmp = short_tmpdir
    proc = start(tmp_path, shared_cache, tmpdir=tmp)
    tree = wait_for_compiler(proc)
    sessions = {session(p) for p in tree if alive(p)} - {session(proc.pid)}
    assert sessions
    names = sorted({_comm(p) for p in tree})
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and (in_sessions(sessions)
                                           or any(alive(p) for p in tree)):
        time.sleep(0.05)
    left = in_sessions(sessions) + [(p, _comm(p)) for p in tree if alive(p)]
    assert not left, f"still running 2 s after SIGKILL: {left} (the tree was {names})"
    (pool,) = tmp.glob("wheelforge-jobs-*")
    clean = subprocess.run([sys.executable, "-m", "wheelforge", "clean", "--cache-dir",
                            str(tmp_path / "clean-cache")], env={**os.environ, "TMPDIR": str(tmp)},
                           capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert f"removed {pool} " in clean.stdout and not pool.exists()

    # the same key: no stale lock in the way (and no stale state at the fixed build path).
    # Through the user's compile cache: this build is not interrupted, and where an earlier
    # build filled it (tests/fixture_build.py, `make build`), it need not compile again.
    again = start(tmp_path, shared_cache, tmpdir=tmp, compile_cache="ccache")
    _, err = again.communicate(timeout=900)
    assert again.returncode == 0, err[-3000:]
    assert list((tmp_path / "index" / "files").glob("tinyext-*.whl"))


def test_a_command_that_ended_is_not_held_by_what_it_left_behind() -> None:
    """A build backend the OOM killer took leaves ninja and its compilers holding the
    output pipe: once the command has ended, what is left of its session is killed after
    a short grace, and a command killed by a signal says so as a shell would."""
    from wheelforge import _proc

    began = time.monotonic()
    done = _proc.run(["sh", "-c", "echo started; sleep 120 & exit 0"], check=False)
    assert done.returncode == 0 and done.output == "started\n"
    assert time.monotonic() - began < 60  # not the sleep's 120 s
    with pytest.raises(_proc.CommandFailed) as failed:
        _proc.run(["sh", "-c", "kill -9 $$"])
    assert failed.value.tail.endswith("sh was killed by SIGKILL (exit status 137)\n")
