"""A managed build environment is not changed under another process's build.

In the unit tests the other process is real (a Python holding the environment's use
lock, as another `wheelforge build` does from its build environment step to its end),
the installer a stand-in that records what it was asked and the environment a real venv
made by uv without torch.  The end-to-end test runs two real `wheelforge build` commands
on one cache, real uv and a real torch environment.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wheelforge._fs import locked
from wheelforge.builder.env import buildenv, envlock

BASE = Path(getattr(sys, "_base_executable", sys.executable))

#: another process's build: holds the use lock shared until a line arrives on stdin
HOLDER = """
import sys
from pathlib import Path
from wheelforge._fs import locked
from wheelforge.builder.env import envlock
lock, use = Path(sys.argv[1]), Path(sys.argv[2])
hold = envlock.Hold()
with locked(lock):
    hold.take(lock, use)
print("held", flush=True)
sys.stdin.readline()
hold.release()
"""

#: can another process take the lock exclusive (argv[2] "ex") or shared ("sh") now?
#: prints free or busy
PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, (fcntl.LOCK_EX if sys.argv[2] == "ex" else fcntl.LOCK_SH) | fcntl.LOCK_NB)
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


def _others_see(use: Path, mode: str = "ex") -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(use), mode], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_change_waits_for_another_process_not_for_this_ones(tmp_path: Path) -> None:
    lock, use = tmp_path / "env.lock", tmp_path / "env.use"
    mine = envlock.Hold()
    with locked(lock):
        mine.take(lock, use)
    assert _others_see(use) == "busy"
    with locked(lock), envlock.changing(use) as free:
        assert free  # this process's own builds never block it
        assert _others_see(use, "sh") == "busy"  # exclusive while it changes
    assert _others_see(use) == "busy"  # and hold it after,
    assert _others_see(use, "sh") == "free"  # shared again

    other = _holder(lock, use)
    with locked(lock), envlock.changing(use) as free:
        assert not free
    (named,) = envlock.others(use)  # this process's own hold is not named
    assert named.startswith(f"pid {other.pid} (")
    _release(other)
    # the failed conversion dropped this process's shared lock (flock(2)); it was taken back
    assert _others_see(use) == "busy"
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


SLOW_SETUP = '''
import importlib, importlib.util, os, sys, time
from setuptools import setup

if "bdist_wheel" in sys.argv:  # the compile: setup.py runs in the managed environment
    here = os.path.dirname(os.path.abspath(__file__))
    control = open(os.path.join(here, "control.txt")).read().strip()
    open(os.path.join(control, "started"), "w").close()
    deadline = time.time() + 600
    while not os.path.exists(os.path.join(control, "go")) and time.time() < deadline:
        importlib.invalidate_caches()
        if importlib.util.find_spec("wf_probe") is not None:  # installed under this build
            open(os.path.join(control, "changed-under-me"), "w").close()
        time.sleep(0.1)
setup(name="slowpure", version="0.1.0", packages=["slowpure"])
'''


def _pure(root: Path, name: str, setup_py: str, requires: tuple[str, ...] = (),
          extra: dict[str, str] | None = None) -> None:
    from conftest import make_sdist, pure_recipe, write_recipe

    src = root / "src" / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text("")
    (src / "setup.py").write_text(setup_py)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n')
    for fname, text in (extra or {}).items():
        (src / fname).write_text(text)
    _, sha = make_sdist(src, root / "sdists", name, "0.1.0")
    write_recipe(root, name, pure_recipe(name, sha, requires=requires))


@pytest.mark.e2e
def test_another_commands_install_waits_for_a_running_build(tmp_path: Path) -> None:
    """Two real `wheelforge build` commands on one cache, as two shells start them: the
    first compiles (its setup.py runs in the managed environment until told to end, and
    looks for wf-probe all the while); the second needs wf-probe installed into that
    environment.  The second waits, says so, and installs once the first is done; the
    first never saw the environment change under it."""
    from conftest import make_wheel

    control = tmp_path / "control"
    control.mkdir()
    _pure(tmp_path, "slowpure", SLOW_SETUP, extra={"control.txt": str(control)})
    _pure(tmp_path, "needy", 'from setuptools import setup\n'
          'setup(name="needy", version="0.1.0", packages=["needy"])\n', requires=("wf-probe",))
    links = tmp_path / "links"
    make_wheel(links, {"wf_probe/__init__.py": ""}, name="wf-probe", version="1.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHEELFORGE_")}
    env["PIP_FIND_LINKS"] = " ".join([env.get("PIP_FIND_LINKS", ""), str(links)]).strip()

    def build(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "wheelforge", "build", name, "--no-stack-check",
             "--recipes", str(tmp_path / "recipes"), "--sources", str(tmp_path / "sdists"),
             "--index", str(tmp_path / "index"), "--cache-dir", str(tmp_path / "cache"),
             "--work-dir", str(tmp_path / f"work-{name}")],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

    first = build("slowpure")
    second: subprocess.Popen[str] | None = None
    heard: queue.Queue[str | None] = queue.Queue()  # the second's lines; None at its end
    said: list[str] = []

    def listen(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            heard.put(line)
        heard.put(None)

    try:
        try:
            deadline = time.monotonic() + 900  # the first makes the torch environment
            while not (control / "started").exists():
                assert first.poll() is None, first.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "the first build never compiled"
                time.sleep(0.2)
            second = build("needy")
            threading.Thread(target=listen, args=(second,), daemon=True).start()
            deadline = time.monotonic() + 600  # a second that hangs silently fails the test
            while not said or "waiting to install wf-probe into the build environment" \
                    not in said[-1]:
                try:
                    line = heard.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    pytest.fail("the second command neither waited nor ended in 600 s:\n"
                                + "".join(said)[-3000:])
                if line is None:
                    pytest.fail("the second command did not wait:\n" + "".join(said)[-3000:])
                said.append(line)
            assert (f"another wheelforge process is building with it (pid {first.pid} "
                    f"(wheelforge build slowpure --no-stack-check --recipes {tmp_path}/recipes "
                    f"--sources {tmp_path}/sdists ") in said[-1]  # the whole command
            assert f"--work-dir {tmp_path}/work-slowpure))" in said[-1]
            time.sleep(3)  # it keeps waiting
            assert second.poll() is None and not (control / "changed-under-me").exists()
        finally:
            (control / "go").touch()
        out_first = first.communicate(timeout=600)[0]
        assert first.returncode == 0, out_first[-3000:]
        assert second is not None
        second.wait(timeout=600)
        while (line := heard.get(timeout=60)) is not None:
            said.append(line)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    out_second = "".join(said)
    assert second.returncode == 0, out_second[-3000:]
    assert not (control / "changed-under-me").exists()
    assert "the build environment is free: waited" in out_second
    assert "installing wf-probe into the build environment" in out_second
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "index" / "files").glob("*.whl")
                  ) == ["needy", "slowpure"]


def test_a_waiting_change_stops_with_the_command(
        made_env: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or --timeout) stops a build that waits for another process's build: the
    wait ends at once, nothing is installed."""
    from wheelforge import _proc

    cache, lock, use = made_env
    installs: list[list[str]] = []
    monkeypatch.setattr(buildenv, "_install",
                        lambda _i, _p, _a, reqs, _s, _l: installs.append(list(reqs)))
    other = _holder(lock, use)
    said: list[str] = []
    ended: list[BaseException] = []

    def work() -> None:
        try:
            _managed(cache, said)
        except BaseException as exc:  # noqa: BLE001 - what the thread ended with
            ended.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not any(s.startswith("waiting") for s in said):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _proc.stop_all()
        worker.join(timeout=5)
        assert not worker.is_alive()
    finally:
        _proc.resume()
        _release(other)
    assert len(ended) == 1 and isinstance(ended[0], KeyboardInterrupt)
    assert not installs
