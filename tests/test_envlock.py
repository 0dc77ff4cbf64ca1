"""A managed build environment is not changed under another process's build.

The other process is real (a Python holding the environment's use lock, as a build of
another `wheelforge build` does from its build environment step to its end); the
installer is a stand-in that records what it was asked (unit tests: no torch is
installed), the environment a real venv made by uv.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wheelforge._fs import locked
from wheelforge.builder import buildenv, envlock

BASE = Path(getattr(sys, "_base_executable", sys.executable))

#: another process's build: holds the use lock shared until a line arrives on stdin
HOLDER = """
import sys
from pathlib import Path
from wheelforge._fs import locked
from wheelforge.builder import envlock
lock, use = Path(sys.argv[1]), Path(sys.argv[2])
hold = envlock.Hold()
with locked(lock):
    hold.take(lock, use)
print("held", flush=True)
sys.stdin.readline()
hold.release()
"""

#: can another process take the lock exclusive now?  prints free or busy
PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("busy")
"""


def _holder(lock: Path, use: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(use)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0


def _others_see(use: Path) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(use)], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_change_waits_for_another_process_not_for_this_ones(tmp_path: Path) -> None:
    lock, use = tmp_path / "env.lock", tmp_path / "env.use"
    mine = envlock.Hold()
    with locked(lock):
        mine.take(lock, use)
    assert _others_see(use) == "busy"
    with locked(lock), envlock.changing(use) as free:
        assert free  # this process's own builds never block it
    assert _others_see(use) == "busy"  # and still hold it after

    other = _holder(lock, use)
    with locked(lock), envlock.changing(use) as free:
        assert not free
    assert _others_see(use) == "busy"
    _release(other)
    mine.release()
    assert _others_see(use) == "free"


def test_a_build_lets_the_environment_go_while_it_waits_for_a_companion(
        tmp_path: Path) -> None:
    lock, use = tmp_path / "env.lock", tmp_path / "env.use"
    with envlock.Hold() as hold:
        with locked(lock):
            hold.take(lock, use)
        with hold.paused():
            assert _others_see(use) == "free"
        assert _others_see(use) == "busy"
    assert _others_see(use) == "free"


@pytest.fixture
def made_env(tmp_path: Path, uv: str) -> tuple[Path, Path, Path]:
    """A managed environment as managed_env leaves it (a uv venv and the marker), without
    torch: its cache directory, its creation lock and its use lock."""
    cache = tmp_path / "cache"
    key = buildenv.env_key(BASE, "torch==2.14.1", buildenv.BASE_REQUIREMENTS, ())
    root = cache / "envs" / key
    subprocess.run([uv, "venv", "--no-config", "--python", str(BASE), str(root)],
                   check=True, capture_output=True)
    (root / buildenv.MARKER).write_text(json.dumps({"torch": "torch==2.14.1"}))
    return cache, cache / "envs" / f"{key}.lock", cache / "envs" / f"{key}.use"


def _managed(cache: Path, said: list[str], hold: envlock.Hold | None = None
             ) -> buildenv.BuildEnv:
    return buildenv.managed_env(cache, base_python=BASE, torch_req="torch==2.14.1",
                                requirements=["wf-probe"], with_torch=False,
                                installer=buildenv.Installer(kind="pip", why="test"),
                                progress=said.append, hold=hold)


def test_an_install_waits_until_another_processs_build_ends(
        made_env: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process builds with the environment: the install of a requirement it
    lacks waits (and says so) until that build ends, then runs; the build that asked
    then holds the environment itself."""
    cache, lock, use = made_env
    installs: list[list[str]] = []
    monkeypatch.setattr(buildenv, "_install",
                        lambda _i, _p, _a, reqs, _s, _l: installs.append(list(reqs)))
    monkeypatch.setattr(buildenv, "_WAIT_S", 0.2)
    other = _holder(lock, use)
    said: list[str] = []
    hold = envlock.Hold()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_managed(cache, said, hold), done.set()))
    worker.start()
    try:
        time.sleep(1.5)
        assert not installs and not done.is_set()
        assert any(s.startswith("waiting to install wf-probe into the build environment")
                   and "another wheelforge process is building with it" in s for s in said)
    finally:
        _release(other)
    worker.join(timeout=30)
    assert done.is_set()
    assert installs == [["torch==2.14.1", "wf-probe"]]
    assert any(s.startswith("the build environment is free: waited") for s in said)
    assert _others_see(use) == "busy"  # this build holds it now
    hold.release()
    assert _others_see(use) == "free"


def test_the_builds_of_one_process_do_not_wait_for_each_other(
        made_env: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cache, lock, use = made_env
    installs: list[list[str]] = []
    monkeypatch.setattr(buildenv, "_install",
                        lambda _i, _p, _a, reqs, _s, _l: installs.append(list(reqs)))
    first = envlock.Hold()
    with locked(lock):
        first.take(lock, use)
    said: list[str] = []
    _managed(cache, said)
    assert installs == [["torch==2.14.1", "wf-probe"]]
    assert not any(s.startswith("waiting") for s in said)
    first.release()
