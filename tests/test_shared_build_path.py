"""Another local user against the build path, the locks and `wheelforge clean` (issue 52:
"take over a root build through the fixed build path", "truncate files through wheelforge
clean"; issue 53: "a build waiting on another's lock is silent, and names a truncated
command").

Each test plays the attack as a second user with no account (``setpriv --reuid=N``, as
root; CI runs as root) and shows it held: a clear error or a safe outcome, and nothing
truncated, deleted, run or read.  On the old code (one shared ``/tmp/wheelforge-build``,
locks opened through links, clean sweeping whatever is old) each of them fails.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import IN_CI
from wheelforge import _fs, workdirs
from wheelforge.builder.artifact import reproducible
from wheelforge.builder.env import envlock
from wheelforge.errors import ConfigError, ToolchainError

OTHER = 4242  # the attacker: a uid with no account
SECOND = 4243  # a second honest user

if os.geteuid() != 0 and not IN_CI:
    pytest.skip("playing another local user needs root (setpriv --reuid); CI runs as root",
                allow_module_level=True)


def as_user(uid: int, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           *cmd], text=True, capture_output=True, timeout=120,
                          env={**os.environ, "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"})
    if check:
        assert done.returncode == 0, done.stderr
    return done


def as_user_py(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return as_user(uid, sys.executable, "-c", code, *args, check=False)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write, sticky: a /tmp of the test's own."""
    path = Path(tempfile.mkdtemp(prefix="wf-shared-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of root's that the attacks aim at."""
    path = tmp_path / "precious"
    path.write_text("root's data\n")
    return path


# -- the build path -----------------------------------------------------------------------

def test_the_build_root_is_per_user_and_private() -> None:
    assert reproducible.build_root() == Path(f"/tmp/wheelforge-build-{os.geteuid()}")
    assert reproducible.build_root(OTHER) == Path(f"/tmp/wheelforge-build-{OTHER}")
    assert reproducible.build_root() == reproducible.BUILD_ROOT


def test_a_link_planted_at_a_lock_truncates_nothing(shared: Path, victim: Path) -> None:
    """The old attack: a symlink at NAME-VERSION.lock in the shared root made root's build
    truncate the link's target.  A lock is never opened through a link, and a shared
    (others-writable) root is refused before anything is opened in it."""
    lock = shared / "p-1.0.lock"
    as_user(OTHER, "ln", "-s", str(victim), str(lock))
    with pytest.raises(ConfigError, match="refusing the lock file") as err, \
            _fs.owned_lock(lock):
        pass
    assert "symbolic link" in err.value.why and "fix: remove" in err.value.render()
    with pytest.raises(ToolchainError, match="writable by other users"), \
            reproducible.fixed_paths("p-1.0", root=shared):
        pass
    with pytest.raises(ConfigError), _fs.locked(lock):
        pass
    assert victim.read_text() == "root's data\n"


def test_a_hard_link_a_fifo_or_a_device_at_a_lock_is_refused(tmp_path: Path,
                                                              victim: Path) -> None:
    os.link(victim, tmp_path / "hard.lock")
    os.mkfifo(tmp_path / "fifo.lock")
    for name in ("hard.lock", "fifo.lock"):
        with pytest.raises(ConfigError, match="refusing the lock file") as err, \
                _fs.owned_lock(tmp_path / name):
            pass
        assert "not a plain file with one name" in err.value.why
    assert victim.read_text() == "root's data\n"


def test_a_build_root_made_first_by_another_user_is_refused(shared: Path) -> None:
    """The old attack: a user who made /tmp/wheelforge-build first could swap the
    extracted tree during root's build (root ran their setup.py and published it)."""
    root = shared / "build-root"
    as_user(OTHER, "mkdir", "-m", "0777", str(root))
    with pytest.raises(ToolchainError, match=f"belongs to uid {OTHER}") as err, \
            reproducible.fixed_paths("p-1.0", root=root):
        pytest.fail("built in another user's directory")
    assert "rm -rf" in err.value.fix
    assert os.listdir(root) == []  # nothing made, locked or extracted there
    # a link in its place, to a directory of root's: refused, never followed
    os.rmdir(root)
    target = shared / "roots-own"
    target.mkdir(mode=0o700)
    as_user(OTHER, "ln", "-s", str(target), str(root))
    with pytest.raises(ToolchainError, match="not a directory"), \
            reproducible.fixed_paths("p-1.0", root=root):
        pass
    assert os.listdir(target) == []


def test_a_build_root_under_another_users_directory_is_refused(shared: Path) -> None:
    parent = shared / "theirs"
    as_user(OTHER, "mkdir", "-m", "0755", str(parent))
    with pytest.raises(ToolchainError, match=f"which belongs to uid {OTHER}"), \
            reproducible.fixed_paths("p-1.0", root=parent / "root"):
        pass
    loose = shared / "loose"  # root's, but anyone may rename what is in it
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(ToolchainError, match="not sticky"), \
            reproducible.fixed_paths("p-1.0", root=loose / "root"):
        pass


def test_no_other_user_can_enter_swap_or_lock_a_build(shared: Path) -> None:
    """While root builds: the tree cannot be read, renamed or replaced, and its lock cannot
    be taken, by another user."""
    root = shared / "build-root"
    with reproducible.fixed_paths("p-1.0", root=root) as fixed:
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        (fixed.src / "p-1.0").mkdir(parents=True)
        (fixed.src / "p-1.0" / "setup.py").write_text("print('root's source')\n")
        for cmd in (["cat", str(fixed.src / "p-1.0" / "setup.py")],
                    ["mv", str(fixed.src), str(fixed.root / "away")],
                    ["mkdir", str(fixed.root / "src2")],
                    ["flock", "-n", str(root / "p-1.0.lock"), "true"],
                    ["touch", str(root / "q-1.0.lock")]):
            done = as_user(OTHER, *cmd, check=False)
            assert done.returncode != 0, cmd
        assert (fixed.src / "p-1.0" / "setup.py").read_text() == "print('root's source')\n"


SLOT = f"wf-test-slot-{os.getpid()}-1.0"
HOLD = """
import sys, time
from wheelforge.builder.artifact import reproducible
try:
    with reproducible.fixed_paths(sys.argv[1]) as fixed:
        print(fixed.root, flush=True)
except Exception as exc:
    print(exc.render() if hasattr(exc, "render") else repr(exc), flush=True)
    sys.exit(3)
"""


def test_users_do_not_lock_each_other_out_at_the_default_path() -> None:
    """The old 0644 lock: a lock file root left at the shared path locked every other
    user out of that version for good.  Each user now builds in a root of their own, at
    the default path: root holding a version does not block another user's build of it,
    and a root left by one user is nobody else's business."""
    mine = reproducible.build_root()
    theirs = reproducible.build_root(SECOND)
    shutil.rmtree(theirs, ignore_errors=True)
    try:
        with reproducible.fixed_paths(SLOT) as fixed:  # root's, the real default
            assert fixed.root == mine / SLOT
            done = as_user_py(SECOND, HOLD, SLOT)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.strip() == str(theirs / SLOT)
        st = os.lstat(theirs)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (SECOND, 0o700)
        # root's lock file is left behind, 0644: it is in root's own root, not in the way
        assert (mine / f"{SLOT}.lock").exists()
        assert as_user_py(SECOND, HOLD, SLOT).returncode == 0
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
        _fs.discard(mine / f"{SLOT}.lock")


def test_a_default_build_root_squatted_by_another_user_is_refused_clearly() -> None:
    """The attacker makes the victim's default root first: the victim's build stops with
    what, why and what to do, and writes nothing there."""
    squatted = reproducible.build_root(SECOND)
    shutil.rmtree(squatted, ignore_errors=True)
    try:
        as_user(OTHER, "mkdir", "-m", "0777", str(squatted))
        done = as_user_py(SECOND, HOLD, SLOT)
        assert done.returncode == 3
        assert f"the build root {squatted} belongs to uid {OTHER}, not to you" in done.stdout
        assert "why:" in done.stdout and f"fix: have it removed (as root: rm -rf {squatted})" \
            in done.stdout
        assert os.listdir(squatted) == []
    finally:
        shutil.rmtree(squatted, ignore_errors=True)


# -- a lock another user holds ----------------------------------------------------------------

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"pid 1 (wheelforge build nightly-maintenance) since 2026-01-01")
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_another_users_lock_is_waited_for_untrusted_and_never_written(
        shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old fake holder: the attacker's lock file said whatever they wrote, and it was
    printed as the holder.  Now its text is not trusted (the holder is unknown), the wait
    says so at once and again, and the file is never truncated or written."""
    monkeypatch.setattr(_fs, "WAIT_REPORT_S", 0.3)
    lock = shared / "k.lock"
    holder = subprocess.Popen(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                               "--clear-groups", sys.executable, "-c", HOLDER, str(lock), "1.5"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said: list[str] = []
        with _fs.owned_lock(lock, on_busy=said.append) as mine:
            assert mine
    finally:
        holder.kill()
        holder.wait()
    assert len(said) >= 3, said
    assert all("nightly-maintenance" not in s for s in said)
    assert said[0].startswith(f"an unknown process (its lock file belongs to uid {OTHER}")
    assert "waiting" in said[-1]
    assert "nightly-maintenance" in lock.read_text()  # theirs: never written


# -- waiting says whom, at once and periodically -------------------------------------------------

SAME_USER_HOLDER = """
import sys, time
from wheelforge import _fs
with _fs.owned_lock(__import__("pathlib").Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(1.5)
"""


def test_a_wait_names_the_holder_and_its_whole_command_at_once_and_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fs, "WAIT_REPORT_S", 0.3)
    lock = tmp_path / "k.lock"
    args = [str(lock), "build", "causal-conv1d", "--arch", "12.0", "--python",
            "/opt/some where/venv/bin/python"]
    holder = subprocess.Popen([sys.executable, "-c", SAME_USER_HOLDER, *args],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said: list[str] = []
        started = time.monotonic()
        with _fs.owned_lock(lock, on_busy=said.append):
            waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert waited > 0.5 and len(said) >= 3, said
    assert said[0].startswith(f"pid {holder.pid} (wheelforge {lock} build causal-conv1d "
                              "--arch 12.0 --python '/opt/some where/venv/bin/python') since ")
    assert "waiting" not in said[0] and "so far" in said[-1]


def test_a_holders_text_cannot_drive_the_terminal(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    lock.write_bytes(b"pid 7 (wheelforge build \x1b]0;owned\x07x) since then")
    assert "\x1b" not in _fs.lock_holder(lock) and "pid 7" in _fs.lock_holder(lock)


def test_the_fixed_path_wait_is_reported_periodically(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Two processes of one user at one fixed path: the second says whom it waits for,
    at once and again while it waits."""
    monkeypatch.setattr(_fs, "WAIT_REPORT_S", 0.3)
    root = tmp_path / "r"
    code = ("import sys, time\nfrom pathlib import Path\n"
            "from wheelforge.builder.artifact import reproducible\n"
            "with reproducible.fixed_paths('p-1.0', root=Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(1.2)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE,
                              text=True)
    said: list[str] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with reproducible.fixed_paths("p-1.0", root=root, on_busy=said.append):
            pass
    finally:
        holder.kill()
        holder.wait()
    assert len(said) >= 2 and said[0].startswith(f"pid {holder.pid} ("), said


# -- wheelforge clean ----------------------------------------------------------------------------

def clean(*args: str | Path, tmpdir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "wheelforge", "clean", *map(str, args)],
                          cwd=cwd, text=True, capture_output=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmpdir)})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


def test_clean_dry_run_truncates_nothing_through_a_planted_lock(
        shared: Path, victim: Path, tmp_path: Path) -> None:
    """The old attack: even `clean --dry-run`, as root, truncated the target of a link
    planted as a run's lock (it opened the lock to test it, creating and truncating).
    Here: a pool directory in TMPDIR and a work directory, each another user's with a
    link as its lock, and one of root's own whose lock is a link."""
    pool = shared / "wheelforge-jobs-evil"
    work = shared / "work"
    work.mkdir()
    os.chmod(work, 0o1777)  # shared, sticky: another user's directories beside root's
    as_user(OTHER, "mkdir", str(pool), str(work / "evil"))
    for d in (pool, work / "evil"):
        as_user(OTHER, "ln", "-s", str(victim), str(d / workdirs.RUN_LOCK))
    own = work / "own"
    own.mkdir()
    (own / workdirs.RUN_LOCK).symlink_to(victim)
    for extra in (("--dry-run",), ()):
        done = clean("--work-dir", work, "--cache-dir", tmp_path / "cache", *extra,
                     tmpdir=shared, cwd=tmp_path)
        assert victim.read_text() == "root's data\n"
        assert pool.is_dir() and (work / "evil").is_dir() and own.is_dir()
        assert f"kept {pool}: it belongs to uid {OTHER}" in done.stdout
        assert f"kept {work / 'evil'}: it belongs to uid {OTHER}" in done.stdout
        assert f"kept {own}: its {workdirs.RUN_LOCK} is not a plain file of yours" \
            in done.stdout
    assert os.lstat(victim).st_size == len("root's data\n")


def test_clean_work_dir_removes_only_what_wheelforge_made_for_you(
        shared: Path, tmp_path: Path) -> None:
    """The old attack: `clean --work-dir DIR` deleted every subdirectory of DIR untouched
    for an hour, whoever made it.  Now: only the user's own directories marked by the
    user's run lock; another user's (old, with or without a lock) and an unmarked one of
    the user's stay, each named."""
    work = shared / "work"
    work.mkdir()
    os.chmod(work, 0o1777)
    theirs, theirs_locked = work / "theirs", work / "theirs-locked"
    as_user(OTHER, "mkdir", str(theirs), str(theirs_locked))
    as_user(OTHER, "touch", str(theirs / "data"), str(theirs_locked / workdirs.RUN_LOCK))
    unmarked, dead = work / "unmarked", work / "dead"
    unmarked.mkdir()
    dead.mkdir()
    (dead / workdirs.RUN_LOCK).write_text("")
    hours_ago = time.time() - 7200
    for d in (theirs, theirs_locked, unmarked, dead):
        os.utime(d, (hours_ago, hours_ago))
    done = clean("--work-dir", work, "--cache-dir", tmp_path / "cache", tmpdir=tmp_path,
                 cwd=tmp_path)
    assert theirs.is_dir() and (theirs / "data").exists() and theirs_locked.is_dir()
    assert unmarked.is_dir() and not dead.exists()
    assert f"kept {theirs}: it belongs to uid {OTHER}: wheelforge removes only your own" \
        in done.stdout
    assert f"kept {unmarked}: no run lock in it" in done.stdout
    assert f"removed {dead} " in done.stdout


def test_clean_leaves_a_parent_others_may_rearrange_alone(shared: Path,
                                                          tmp_path: Path) -> None:
    """A work directory anyone may write and that is not sticky: another user could
    swap a directory of root's for another between the check and the removal."""
    work = shared / "loose"
    work.mkdir()
    os.chmod(work, 0o777)
    dead = work / "dead"
    dead.mkdir()
    (dead / workdirs.RUN_LOCK).write_text("")
    done = clean("--work-dir", work, "--cache-dir", tmp_path / "cache", tmpdir=tmp_path,
                 cwd=tmp_path)
    assert dead.is_dir()
    assert f"kept {dead}: wheelforge removes nothing under {work}: other users may write it " \
           "and it is not sticky (mode 0777)" in done.stdout


def test_sweep_reads_a_lock_and_never_creates_or_writes_it(tmp_path: Path) -> None:
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / workdirs.RUN_LOCK).write_text("pid 1 (wheelforge build x) since then")
    before = os.stat(dead / workdirs.RUN_LOCK)
    swept = workdirs.sweep([(tmp_path, "*")], dry_run=True)
    assert [p for p, _ in swept.removed] == [dead]
    after = os.stat(dead / workdirs.RUN_LOCK)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


def test_a_run_claim_is_the_mark_clean_needs(tmp_path: Path) -> None:
    """A run's directory, claimed then left (its process gone), goes; while claimed it
    stays, with its holder."""
    d = tmp_path / "run"
    d.mkdir()
    held = threading.Event()
    release = threading.Event()

    def run() -> None:
        with workdirs.claim(d):
            held.set()
            release.wait(10)

    t = threading.Thread(target=run)
    t.start()
    held.wait(10)
    # the same process holds it: flock is per open file, so the sweep's own open sees it
    swept = workdirs.sweep([(tmp_path, "*")])
    assert d.is_dir() and swept.kept and swept.kept[0][1].startswith("in use by pid ")
    release.set()
    t.join(10)
    swept = workdirs.sweep([(tmp_path, "*")])
    assert not d.exists() and [p for p, _ in swept.removed] == [d]


USE_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(30)
"""


def test_a_build_environments_user_is_named_with_its_whole_command(tmp_path: Path) -> None:
    """An install waiting for another process's build names it from /proc (the kernel's
    word, not a file's): the whole command line, not its first two words."""
    use = tmp_path / "env.use"
    holder = subprocess.Popen([sys.executable, "-c", USE_HOLDER, str(use), "wheelforge",
                               "build", "causal-conv1d", "--arch", "12.0", "--python",
                               "/opt/a venv/bin/python"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert envlock.others(use) == [
            f"pid {holder.pid} (wheelforge build causal-conv1d --arch 12.0 --python "
            "'/opt/a venv/bin/python')"]
    finally:
        holder.kill()
        holder.wait()


def test_a_build_of_this_command_waiting_for_another_says_so_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nightly's cells of one recipe version in threads of one process: the second
    says whom it waits for at once and again while it waits."""
    monkeypatch.setattr(_fs, "WAIT_REPORT_S", 0.3)
    root = tmp_path / "r"
    inside = threading.Event()
    said: list[str] = []

    def second() -> None:
        inside.wait(10)
        with reproducible.fixed_paths("p-1.0", root=root, on_busy=said.append):
            pass

    t = threading.Thread(target=second)
    t.start()
    with reproducible.fixed_paths("p-1.0", root=root):
        inside.set()
        time.sleep(1.6)
    t.join(10)
    assert len(said) >= 3 and said[0] == f"another build of this command (pid {os.getpid()})"
    assert said[-1].endswith("s so far")


def test_another_users_unreadable_lock_is_a_clear_error(shared: Path) -> None:
    lock = shared / "k.lock"
    as_user(OTHER, "sh", "-c", f"umask 077 && : > {lock}")
    done = as_user_py(SECOND, "import sys\nfrom pathlib import Path\nfrom wheelforge import _fs\n"
                      "try:\n    with _fs.owned_lock(Path(sys.argv[1])): pass\n"
                      "except Exception as exc:\n    print(exc.render()); sys.exit(3)\n",
                      str(lock))
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"config error: cannot open the lock file {lock}" in done.stdout
    assert "fix: run as the user who owns it" in done.stdout
