"""Fault injection against real `wheelforge` processes, shared by tests/test_faults.py
and scripts/fault_run.py (which runs the larger sweeps).

* :func:`kill_trial`: a `wheelforge build` of a pure fixture, SIGKILLed at its k-th
  fsync or rename inside the index (sitecustomize.py in this directory counts them),
  then the next ordinary command (the same build, or `wheelforge serve` and its first
  request), then :func:`index_problems`.
* :func:`concurrent_round`: N builds started at once.
* :func:`index_problems`: what makes an index lie: any difference from `index rebuild`
  of a copy, a marker, a temp file, a build key published twice, a wheel without a
  valid record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import make_sdist, make_wheel, tinypure_as, write_recipe  # noqa: E402
from conftest import pure_recipe as pure_recipe_text  # noqa: E402


def pure_recipe(root: Path, name: str = "faultpkg", variants: int = 1, *,
                setup: str | None = None, imports: str | None = None) -> list[Path]:
    """tests/packages/tinypure as ``name``, with ``variants`` recipe directories that
    differ only in one environment value: one build key each, one project.  ``setup``:
    a setup.py to add (e.g. one that takes its time).  Returns the recipe directories;
    the sdist is in ROOT/sdists."""
    src = root / "pkgs" / name
    if not src.exists():
        tinypure_as(root, name)
        if setup is not None:
            (src / "setup.py").write_text(setup)
    _, sha = make_sdist(src, root / "sdists", name, "0.1.0")
    out = []
    for v in range(variants):
        out.append(write_recipe(root / f"variant{v}", name, pure_recipe_text(
            name, sha, imports=[m.strip() for m in (imports or name).split(",")],
            env={"WF_VARIANT": str(v)})))
    return out


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "PYTHONPATH")
           and not k.startswith("WF_KILL")}
    env.update(extra)
    return env


def build_argv(root: Path, recipes: Path, index: Path, cache: Path,
               name: str = "faultpkg") -> list[str]:
    return [sys.executable, "-m", "wheelforge", "build", name, "--recipes", str(recipes),
            "--sources", str(root / "sdists"), "--index", str(index), "--cache-dir",
            str(cache), "--work-dir", str(root / "work")]


def killer_env(index: Path, at: int, count_file: Path | None = None) -> dict[str, str]:
    extra = {"PYTHONPATH": str(HERE), "WF_KILL_DIR": str(index), "WF_KILL_AT": str(at)}
    if count_file is not None:
        extra["WF_KILL_COUNT"] = str(count_file)
    return environ(**extra)


def run(argv: Sequence[str], env: dict[str, str], timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True,
                          timeout=timeout)


def count_points(root: Path, recipes: Path, index: Path, cache: Path) -> int:
    """The fsyncs and renames inside the index of one publish (the index is then reset
    by the caller)."""
    counter = root / "count"
    counter.unlink(missing_ok=True)
    done = run(build_argv(root, recipes, index, cache), killer_env(index, 0, counter))
    assert done.returncode == 0, done.stderr[-3000:]
    return int(counter.read_text())


# --------------------------------------------------------------------------- checks


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root`` but the lock file."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in filenames:
            path = os.path.join(dirpath, f)
            key = os.path.normpath(os.path.join(rel, f))
            if key != ".lock":
                with open(path, "rb") as fh:
                    out[key] = fh.read()
    return out


_CHECKING = threading.Lock()  # index_problems records warnings: one check at a time


def index_problems(index: Path, scratch: Path) -> list[str]:
    """Everything that makes ``index`` lie; [] when it holds the invariant."""
    with _CHECKING:
        return _index_problems(index, scratch)


def _index_problems(index: Path, scratch: Path) -> list[str]:
    from wheelforge import index as wf_index
    from wheelforge._fs import TMP_PREFIX

    problems = []
    if (index / ".records" / "_writing").exists():
        problems.append("the marker .records/_writing is still there")
    temps = [str(p.relative_to(index)) for p in index.rglob(f"{TMP_PREFIX}*")]
    if temps:
        problems.append(f"temp files left: {temps}")
    files = index / "files"
    keys: Counter[str] = Counter()
    for wheel in sorted(files.glob("*.whl")) if files.is_dir() else []:
        sidecar = wheel.with_name(wheel.name + ".wf.json")
        try:
            record = wf_index.from_json(sidecar.read_bytes())
        except (OSError, wf_index.records.PublishError) as exc:
            problems.append(f"{wheel.name} has no valid record: {exc}")
            continue
        if record.build_key:
            keys[record.build_key] += 1
    twice = {k[:12]: n for k, n in keys.items() if n > 1}
    if twice:
        problems.append(f"build keys published more than once: {twice}")
    before = tree(index)
    copy = scratch / "rebuilt"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(index, copy, symlinks=True)
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        wf_index.rebuild(copy)
    if said:
        problems.append(f"index rebuild of a copy warned: {[str(w.message) for w in said]}")
    after = tree(copy)
    shutil.rmtree(copy, ignore_errors=True)
    if before != after:
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k, 0)
                        != after.get(k, 0))
        problems.append(f"differs from `index rebuild` of a copy: {differ[:8]}")
    return problems


def wheels(index: Path) -> list[str]:
    return sorted(p.name for p in (index / "files").glob("*.whl"))


# --------------------------------------------------------------------------- kill trials


@dataclass(frozen=True)
class Trial:
    kill_at: int
    killed: bool  # the process died of SIGKILL (else it finished before the k-th call)
    next_rc: int
    problems: tuple[str, ...]
    output: str = ""


def populate(index: Path, dist: Path, count: int, name: str = "faultpkg") -> None:
    """An index of ``count`` wheels (several projects, a channel, and older versions of
    ``name``): their files and records written directly, then `index rebuild`."""
    import hashlib

    from wheelforge import index as wf_index
    from wheelforge.index.records import _inspect_wheel

    files = index / "files"
    files.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        project = name if i % 10 == 0 else f"filler{i % 37}"
        pure = i % 3 == 0
        wheel = make_wheel(dist, {f"{project}/__init__.py": f"V = {i}\n"}, name=project,
                           version=f"0.0.{i}" + ("" if pure else "+cu130"),
                           tag="py3-none-any" if pure else "cp311-cp311-linux_x86_64")
        dest = files / wheel.name
        shutil.copyfile(wheel, dest)
        info = _inspect_wheel(dest)
        (files / (wheel.name + ".metadata")).write_bytes(info.metadata)
        data = dest.read_bytes()
        record = wf_index.WheelRecord(
            filename=wheel.name, project=info.project, version=str(info.version),
            sha256=hashlib.sha256(data).hexdigest(), size=len(data), requires_python=None,
            upload_time=f"2026-01-01T00:00:{i % 60:02d}.000000Z",
            channel=None if pure else "cu130-torch2.14", cuda=None if pure else "13.0",
            torch=None if pure else "2.14.1", archs=() if pure else ("sm_120",),
            build_key=f"fill-{i}",
            metadata_sha256=hashlib.sha256(info.metadata).hexdigest(), summary=None)
        (files / (wheel.name + ".wf.json")).write_text(wf_index.to_json(record))
    wf_index.rebuild(index)


def kill_trial(root: Path, recipes: Path, template: Path | None, cache: Path, at: int,
               then: str = "build", tag: str = "") -> Trial:
    """Kill a build at its ``at``-th fsync/rename in the index, then run ``then``
    ("build": the same build; "serve": `wheelforge serve` and one request)."""
    index = root / f"index-{then}-{at}{tag}"
    shutil.rmtree(index, ignore_errors=True)
    if template is not None:
        shutil.copytree(template, index, symlinks=True)
    argv = build_argv(root, recipes, index, cache)
    killed = run(argv, killer_env(index, at))
    was_killed = killed.returncode == -signal.SIGKILL
    if then == "build":
        nxt = run(argv, environ())
        rc, out = nxt.returncode, nxt.stdout + nxt.stderr
    else:
        rc, out = serve_once(index)
    problems = index_problems(index, root)
    if rc != 0:
        problems.append(f"the next command ({then}) exited {rc}")
    if "Traceback" in out:
        problems.append("a traceback")
    if then == "build" and len(wheels(index)) != (len(wheels(template)) if template else 0) + 1:
        problems.append(f"expected one new wheel, files/ holds {wheels(index)[-4:]}")
    shutil.rmtree(index, ignore_errors=True)
    return Trial(at, was_killed, rc, tuple(problems), out[-2000:] if problems else "")


def _sigint_as_at_a_terminal() -> None:
    """In the child: SIGINT stops it, as at a terminal.  A run started in the background by
    a non-interactive shell (`.ci/run &`) hands its children SIGINT ignored, which Python
    keeps: `serve` then ran until the 30 s kill below."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def serve_once(index: Path) -> tuple[int, str]:
    """Start `wheelforge serve --port 0`, fetch the root page once, stop it."""
    proc = subprocess.Popen([sys.executable, "-m", "wheelforge", "serve", "--index",
                             str(index), "--port", "0"], env=environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_as_at_a_terminal)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving" not in line:
            proc.kill()
            out, err = proc.communicate(timeout=30)
            return 1, line + out + err
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "simple/", timeout=30) as response:
            body = response.read()
        ok = 0 if response.status == 200 and body else 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return ok, out + err


# --------------------------------------------------------------------------- concurrency


@dataclass(frozen=True)
class Round:
    codes: tuple[int, ...]
    wheels: tuple[str, ...]
    problems: tuple[str, ...]


def concurrent_round(root: Path, recipe_dirs: Sequence[Path], cache: Path, n: int, tag: str,
                     name: str = "faultpkg") -> Round:
    """``n`` builds started together (build i uses recipe_dirs[i % len]) into a fresh
    index; every one must exit 0 and each build key be published exactly once."""
    index = root / f"index-{tag}"
    shutil.rmtree(index, ignore_errors=True)
    procs = [subprocess.Popen(build_argv(root, recipe_dirs[i % len(recipe_dirs)], index, cache,
                                         name),
                              env=environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(n)]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = tuple(p.returncode for p in procs)
    problems = index_problems(index, root)
    keys = min(n, len(recipe_dirs))
    found = wheels(index)
    if len(found) != keys:
        problems.append(f"{len(found)} wheels for {keys} build keys: {found}")
    for code, (_out, err) in zip(codes, outs, strict=True):
        if code != 0 or "Traceback" in err:
            problems.append(f"exit {code}: {err[-1500:]}")
    shutil.rmtree(index, ignore_errors=True)
    return Round(codes, tuple(found), tuple(problems))


def kill_trials(root: Path, recipe_dirs: Sequence[Path], template: Path | None, cache: Path,
                points: Sequence[int], then: str = "build") -> list[Trial]:
    """:func:`kill_trial` at each of ``points``, as many at a time as there are recipe
    directories (each of its own build key, so that the trials do not wait for each
    other's build key lock; each trial has an index of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    def trial(i: int) -> Trial:
        return kill_trial(root, recipe_dirs[i % len(recipe_dirs)], template, cache,
                          points[i], then, tag=f"-{i}")

    with ThreadPoolExecutor(max_workers=len(recipe_dirs)) as pool:
        return list(pool.map(trial, range(len(points))))


def summary(trials: Sequence[Trial]) -> str:
    bad = [t for t in trials if t.problems]
    killed = sum(t.killed for t in trials)
    return json.dumps({"trials": len(trials), "killed": killed, "bad": len(bad)})


# --------------------------------------------------------------------------- full disk


@dataclass(frozen=True)
class Fill:
    free: int  # bytes free on the index's filesystem when the run started
    code: int  # exit status (0 published, 9 refused), or -1 for a library call that raised
    published: bool
    problems: tuple[str, ...]
    output: str = ""


def can_mount() -> str | None:
    """None when this process can mount a tmpfs, else why not."""
    import tempfile

    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount(8)"
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tmp],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return f"mount -t tmpfs failed: {done.stderr.strip()}"
        subprocess.run(["umount", tmp], check=True)
    return None


class Tmpfs:
    """A small tmpfs mounted at ``path`` for the duration (``with``)."""

    def __init__(self, path: Path, size: int):
        self.path, self.size = path, size

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs",
                        str(self.path)], check=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        if subprocess.run(["umount", str(self.path)]).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)])


def fill_to(mount: Path, free: int) -> int:
    """Allocate a filler file so that ``free`` bytes (rounded to pages) stay free;
    return the bytes actually free."""
    filler = mount / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(mount)
    have = st.f_bavail * st.f_frsize
    take = max(0, have - free) // 4096 * 4096
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        if take:
            os.posix_fallocate(fd, 0, take)
    finally:
        os.close(fd)
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize


def fill_levels(levels: int, top: int) -> list[int]:
    """``levels`` free-space figures from 0 to ``top``, denser near 0."""
    return sorted({int(top * (i / max(1, levels - 1)) ** 2) // 4096 * 4096
                   for i in range(levels)} | {0})


def fill_sweep(root: Path, recipes: Path, cache: Path, levels: int, name: str,
               size: int = 8 << 20, top: int = 3 << 20) -> list[Fill]:
    """`wheelforge build` into an index on a tmpfs of ``size`` bytes filled to each level:
    each run must publish completely (exit 0, the index sound) or exit 9 with the index
    byte for byte as it was."""
    template = root / "disk-template"
    shutil.rmtree(template, ignore_errors=True)
    populate(template, root / "disk-dist", 12)
    out: list[Fill] = []
    with Tmpfs(root / "mnt", size) as mount:
        for free in fill_levels(levels, top):
            index = mount / "index"
            shutil.rmtree(index, ignore_errors=True)
            (mount / "filler").unlink(missing_ok=True)
            shutil.copytree(template, index)
            actual = fill_to(mount, free)
            before = tree(index)
            done = run(build_argv(root, recipes, index, cache, name), environ())
            text = done.stdout + done.stderr
            problems = _judge(index, before, done.returncode, text, root)
            published = done.returncode == 0
            out.append(Fill(actual, done.returncode, published, tuple(problems),
                            text[-1500:] if problems else ""))
            (mount / "filler").unlink(missing_ok=True)
            shutil.rmtree(index, ignore_errors=True)
    return out


def library_fill_sweep(root: Path, levels: int, top: int = 384 << 10) -> list[Fill]:
    """`index.publish_build` into an index on a tmpfs filled to each level, with the
    free-space check before the publish turned off, so that the writes themselves hit
    ENOSPC at every point: PublishError and the index as it was, or a sound publish."""
    from wheelforge import index as wf_index
    from wheelforge.errors import PublishError
    from wheelforge.index import store

    template = root / "lib-template"
    shutil.rmtree(template, ignore_errors=True)
    populate(template, root / "lib-dist", 30)
    wheel = make_wheel(root / "lib-new", {"newpkg/__init__.py": "X = 1\n" * 2000},
                       name="newpkg", version="1.0")
    out: list[Fill] = []
    check_room = store._check_room
    store._check_room = lambda index_dir, wheel: None  # type: ignore[assignment]
    try:
        with Tmpfs(root / "libmnt", 4 << 20) as mount:
            for free in fill_levels(levels, top):
                index = mount / "index"
                shutil.rmtree(index, ignore_errors=True)
                (mount / "filler").unlink(missing_ok=True)
                shutil.copytree(template, index)
                actual = fill_to(mount, free)
                before = tree(index)
                code, text = 0, ""
                try:
                    wf_index.publish_build(index, wheel, build_key="new-key", channel=None,
                                           cuda=None, torch=None, archs=())
                except PublishError as exc:
                    code, text = 9, exc.render()
                (mount / "filler").unlink(missing_ok=True)  # room for the checks' rebuild
                problems = _judge(index, before, code, text, root)
                out.append(Fill(actual, code, code == 0, tuple(problems), text))
                shutil.rmtree(index, ignore_errors=True)
    finally:
        store._check_room = check_room  # type: ignore[assignment]
    return out


def _judge(index: Path, before: dict[str, bytes | None], code: int, text: str,
           scratch: Path) -> list[str]:
    problems = []
    if "Traceback" in text:
        problems.append("a traceback")
    if code == 0:
        problems += index_problems(index, scratch)
        new = set(wheels(index)) - {k.split("/", 1)[1] for k in before
                                    if k.startswith("files/") and k.endswith(".whl")}
        if len(new) != 1:
            problems.append(f"exit 0 but {len(new)} new wheels")
    elif code == 9:
        after = tree(index)
        if after != before:
            differ = sorted(k for k in before.keys() | after.keys()
                            if before.get(k, 0) != after.get(k, 0))
            problems.append(f"exit 9 but the index changed: {differ[:8]}")
        if "space" not in text:
            problems.append("exit 9 without saying that space ran out")
    else:
        problems.append(f"exit {code}, neither 0 nor 9")
    return problems


def kill_command(index_template: Path, root: Path, argv_tail: Sequence[str], at: int,
                 then: Sequence[str], tag: str) -> tuple[bool, list[str]]:
    """Kill `wheelforge ARGV_TAIL --index INDEX` at its ``at``-th fsync/rename in a copy
    of the template, run `wheelforge THEN --index INDEX`, and check the index; returns
    (killed, problems)."""
    index = root / f"index-cmd-{tag}-{at}"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(index_template, index)
    head = [sys.executable, "-m", "wheelforge"]
    killed = run([*head, *argv_tail, "--index", str(index)], killer_env(index, at))
    nxt = run([*head, *then, "--index", str(index)], environ())
    problems = index_problems(index, root)
    if nxt.returncode != 0 or "Traceback" in nxt.stderr:
        problems.append(f"`wheelforge {' '.join(then)}` exited {nxt.returncode}: "
                        f"{nxt.stderr[-1500:]}")
    shutil.rmtree(index, ignore_errors=True)
    return killed.returncode == -signal.SIGKILL, problems


def count_command(index_template: Path, root: Path, argv_tail: Sequence[str]) -> int:
    index = root / "index-cmd-count"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(index_template, index)
    counter = root / "count-cmd"
    counter.unlink(missing_ok=True)
    done = run([sys.executable, "-m", "wheelforge", *argv_tail, "--index", str(index)],
               killer_env(index, 0, counter))
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.rmtree(index)
    return int(counter.read_text()) if counter.exists() else 0
