"""SIGINT, SIGTERM and --timeout in the middle of a real compile of the CUDA fixture:
every compiler process stops within 10 s, nothing is published, no lock is held."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tinyext_project, tinypure_project
from wheelforge._proc import descendants
from wheelforge.builder.artifact.importcheck import MARK

pytestmark = pytest.mark.nvcc

COMPILERS = ("nvcc", "cicc", "ptxas", "ninja", "cc1plus", "cudafe++")
WARM: set[int] = set()  # the warm interpreters (builder/artifact/importcheck.py) seen in the trees


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(tmp_path: Path, shared_cache: Path, *extra: str,
          names: tuple[str, ...] = ("tinyext",),
          tmpdir: Path | None = None, compile_cache: str = "off") -> subprocess.Popen[str]:
    sdists = tinyext_project(tmp_path)
    if "tinypure" in names:
        tinypure_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    # off: a cache hit would leave nothing to interrupt
    env["WHEELFORGE_COMPILE_CACHE"] = compile_cache
    if tmpdir is not None:  # where the command's pool of compile slots goes
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen(
        [sys.executable, "-m", "wheelforge", "build", *names, "--arch", "12.0", "--force",
         "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
         "--index", str(tmp_path / "index"), "--cache-dir", str(shared_cache),
         "--work-dir", str(tmp_path / "work"), *extra],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_deliver_sigint)


def _deliver_sigint() -> None:
    """In the child: SIGINT as at a terminal.  A test run started in the background by a
    non-interactive shell (`.ci/run &`) inherits SIGINT ignored, and Python keeps an
    ignored SIGINT ignored, as it should for a background job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_compiler(proc: subprocess.Popen[str], timeout: float = 600) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        tree = descendants(proc.pid)
        if any(_comm(p) in ("cicc", "cc1plus") for p in tree):
            warm = [p for p in tree if MARK.encode() in _cmdline(p)]
            assert warm, "the compile started without the import check's warm interpreter"
            WARM.update(warm)
            return tree
        time.sleep(0.2)
    pytest.fail("no compiler process appeared")


def assert_clean_stop(proc: subprocess.Popen[str], tree: list[int], tmp_path: Path,
                      code: int, published: str = "*.whl") -> str:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()  # leave no build behind, then fail with what it printed
        _, err = proc.communicate()
        pytest.fail(f"still running 30 s after the signal:\n{err[-2000:]}")
    assert proc.returncode == code, err[-2000:]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in tree if _comm(p) in COMPILERS]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"still running: {[(p, _comm(p)) for p in alive]}"
    warm = [p for p in tree if p in WARM]  # the import check's warm interpreter
    while warm and time.monotonic() < deadline + 10:
        warm = [p for p in warm if _alive(p)]
        time.sleep(0.2)
    assert not warm, "the import check's warm interpreter still runs"
    assert not list((tmp_path / "index").rglob(published))
    lock = tmp_path / "index" / ".lock"
    if lock.exists():
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held
    assert "nothing was published; work directory kept at" in err
    return err


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_compile(tmp_path: Path, shared_cache: Path, nvcc: str,
                            sig: signal.Signals, code: int) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = start(tmp_path, shared_cache, tmpdir=tmpdir)
    tree = wait_for_compiler(proc)
    proc.send_signal(sig)
    err = assert_clean_stop(proc, tree, tmp_path, code)
    assert "interrupted (" in err
    # the step says it was stopped, not that it failed
    assert "stopped compile" in err and "failed compile" not in err
    # a stopped nvcc leaves its temporary files (tmpxft_*) behind: they went to the build's
    # own TMPDIR under its fixed path, which the stop removed, not to the user's
    assert not list(tmpdir.glob("tmpxft_*"))


def test_timeout_mid_compile(tmp_path: Path, shared_cache: Path, nvcc: str) -> None:
    proc = start(tmp_path, shared_cache, "--timeout", "1")
    # the alarm fires 1 s in: usually before the compile, which must stop all the same
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 124, err[-2000:]
    assert "interrupted (timeout)" in err
    assert not list((tmp_path / "index").rglob("*.whl"))


def test_sigint_stops_builds_running_at_once(tmp_path: Path, shared_cache: Path,
                                             nvcc: str) -> None:
    """Two recipes in one command build in threads of their own: Ctrl-C in the middle of
    the extension's compile stops its compiler tree and the command as one."""
    proc = start(tmp_path, shared_cache, names=("tinyext", "tinypure"))
    tree = wait_for_compiler(proc)
    proc.send_signal(signal.SIGINT)
    # the pure build may have been published before the signal: never the extension
    err = assert_clean_stop(proc, tree, tmp_path, 130, published="tinyext-*.whl")
    assert "interrupted (" in err
    assert "[tinyext] " in err and "stopped compile" in err and "failed compile" not in err
