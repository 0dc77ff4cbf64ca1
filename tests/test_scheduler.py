"""Several builds of one command at once: the pool of compile slots (a real GNU make
jobserver that a real ninja joins), the scheduler's hand-offs between a build and its
companions, failures and Ctrl-C, the shared umask and the live lines.

The scheduler's tests stand in for ``pipeline.build_one`` (a unit test of the order and
the errors); the real builds at once are in test_build_fixture (a CUDA and a pure recipe
in one command) and test_interrupt (Ctrl-C in the middle of one of them).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ctrl_c_when
from test_companions import companion_book
from test_first_hour import FakeTty
from wheelforge import _proc
from wheelforge._log import Reporter, clear_live
from wheelforge.builder import jobserver, reproducible, scheduler
from wheelforge.builder.backend import NINJA_PROGRESS
from wheelforge.builder.config import resolve
from wheelforge.builder.pipeline import BuildResult, Pending
from wheelforge.errors import BuildError, ConfigError, SourceError


def real_ninja() -> str:
    """The test environment's ninja (the `test` extra: ninja>=1.13, a jobserver client)."""
    found = Path(sys.executable).with_name("ninja")
    if found.exists():
        return str(found)
    if os.environ.get("CI") == "true":
        pytest.fail("ninja>=1.13 is missing from the test environment (the `test` extra)")
    pytest.skip("ninja>=1.13 is not in this environment (pip install -e '.[test]')")


def test_pool_hands_out_slots_and_takes_them_back(tmp_path: Path) -> None:
    with jobserver.Pool(3, tmp_path) as pool:
        assert pool.free() == 3
        with pool.slots(2) as held:
            assert held == 2 and pool.free() == 1
        with pool.slots(10) as held:  # never more than the pool
            assert held == 3 and pool.free() == 0
        assert pool.free() == 3
        with pool.lane("a", 8) as lane:
            assert lane.environ()["MAKEFLAGS"] == f"-j3 --jobserver-auth=fifo:{lane.fifo}"
            assert lane.sitting() == lane.given == 2 and pool.free() == 0  # 1 + 2 jobs
            fifo = lane.fifo
        assert not fifo.exists() and pool.free() == 3
        directory = fifo.parent
    assert not directory.exists()  # the pool's directory goes with the command


@pytest.mark.parametrize(("total", "wants", "got"), [
    (16, [("a", 15), ("b", 16)], {"a": 8, "b": 8}),
    (15, [("a", 15), ("b", 16)], {"a": 8, "b": 7}),  # the odd slot to the first
    (16, [("a", 3), ("b", 16)], {"a": 3, "b": 13}),  # what one cannot use, the other
    (4, [("a", 0), ("b", 2)], {"a": 0, "b": 2}),  # more than all want: the rest free
    (0, [("a", 5)], {"a": 0}),
    (7, [("a", 5), ("b", 5), ("c", 1)], {"a": 3, "b": 3, "c": 1}),
])
def test_the_pool_splits_its_slots_equally_within_what_each_can_use(
        total: int, wants: list[tuple[str, int]], got: dict[str, int]) -> None:
    assert jobserver.split(total, wants) == got


def _as_ninja(lane: jobserver.Lane, take: int = 0, give: int = 0) -> None:
    fd = os.open(lane.fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        assert len(os.read(fd, take)) == take if take else os.write(fd, b"+" * give) == give
    finally:
        os.close(fd)


def test_a_lane_in_its_tail_gives_its_slots_to_the_others(tmp_path: Path) -> None:
    """No ninja here: the pipes are read as ninja would.  Half of the pool is held for
    the expected b; once a's ninja says it has no job left to start, the slots its jobs
    give back go to b."""
    with jobserver.Pool(8, tmp_path) as pool:
        pool.expect("b")
        with pool.lane("a", 8) as a:
            assert a.given == 3 and pool.free() == 4  # 1 + 3 jobs; b's 4 held
            _as_ninja(a, take=3)  # ninja started and runs 4 jobs
            a.started.touch()
            os.utime(a.started, (0, time.time() - jobserver.GRAB_S))
            with pool.lane("b", 8) as b:
                assert b.given == 3 and pool.free() == 0
                a.progress(3, 7)  # 3 ended, 4 running: nothing left to start
                _as_ninja(a, give=2)  # two more end
                a.progress(5, 7)
                deadline = time.monotonic() + 5
                while b.given < 5 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert (a.given, b.given) == (1, 5)
        assert pool.free() == 8 - 1  # a's ninja never gave back the one it holds: lost


def test_a_lane_waits_for_its_share_rather_than_start_on_fewer(tmp_path: Path) -> None:
    """A ninja reads its pipe only when it starts and when one of its jobs ends: b opens
    once a's tail has left it half of the pool, not on the first free slot."""
    with jobserver.Pool(4, tmp_path) as pool, pool.lane("a", 4) as a:
        _as_ninja(a, take=3)  # a runs 4 jobs, more than it has units left
        a.started.touch()
        os.utime(a.started, (0, time.time() - jobserver.GRAB_S))
        a.progress(0, 4)
        opened: list[int] = []
        waited: list[str] = []

        def open_b() -> None:
            with pool.lane("b", 4, on_wait=lambda: waited.append("b")) as b:
                opened.append(b.given + 1)

        t = threading.Thread(target=open_b)
        t.start()
        _as_ninja(a, give=1)  # one of a's 4 ends: 1 free slot, b waits
        a.progress(1, 4)
        time.sleep(5 * jobserver.TICK_S)
        assert not opened
        _as_ninja(a, give=1)  # another: 2 free, b's half
        a.progress(2, 4)
        t.join(5)
        assert opened == [2] and waited == ["b"]  # told once


def test_two_compiles_of_one_recipe_get_a_lane_each(tmp_path: Path) -> None:
    """A nightly builds cells of one recipe for two torches at once: each compile has its
    own lane and share, and closing one leaves the other's alone."""
    with jobserver.Pool(8, tmp_path) as pool, pool.lane("causal-conv1d", 4) as a:
        with pool.lane("causal-conv1d", 4) as b:
            assert a.name != b.name and a.fifo != b.fifo
            assert (a.given, b.given, pool.free()) == (3, 3, 0)
        assert a.given == 3 and pool.free() == 4


def test_a_whole_compile_waits_while_lanes_keep_what_they_hold(tmp_path: Path) -> None:
    with jobserver.Pool(4, tmp_path) as pool, pool.lane("a", 4) as a:
        assert a.given == 3
        taken = threading.Event()

        def whole() -> None:
            with pool.slots(2):
                taken.set()

        t = threading.Thread(target=whole)
        t.start()
        assert taken.wait(5)  # a's pipe was full (ninja took nothing): taken back
        t.join()


@pytest.mark.parametrize(("version", "joins"), [
    ("1.13.2", True), ("1.13.0", True), ("1.14.1", True), ("2.0", True),
    ("1.12.1", False), ("1.11.1.4", False), ("not-a-version", False), (None, False)])
def test_only_ninja_1_13_and_later_joins_the_pool(version: str | None, joins: bool) -> None:
    found = {"ninja": version} if version else {}
    assert jobserver.ninja_joins(found) is joins


def _jobs_ninja(root: Path, count: int, seconds: float) -> Path:
    """A build.ninja of ``count`` jobs that each record when they ran."""
    root.mkdir(parents=True)
    lines = ["rule s", f"  command = sh -c 'date +%s.%N > $out.start; sleep {seconds}; "
             "date +%s.%N > $out'"]
    lines += [f"build o{i}: s" for i in range(count)]
    (root / "build.ninja").write_text("\n".join(lines) + "\n")
    return root


def _most_at_once(*roots: Path, before: float = float("inf")) -> int:
    spans = []
    for root in roots:
        for start in root.glob("*.start"):
            began, ended = float(start.read_text()), float(start.with_suffix("").read_text())
            if began < before:
                spans.append((began, min(ended, before)))
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = most = 0
    for _t, step in events:
        now += step
        most = max(most, now)
    return most


def _run_in_lane(pool: jobserver.Pool, shim: Path, name: str, root: Path) -> None:
    """A real ninja asked for -j 8 (as torch asks), in a lane of ``pool``, its progress
    lines read as pipeline reads them."""
    with pool.lane(name, 8) as lane:
        env = {**os.environ, **lane.environ(),
               "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
        assert shutil.which("ninja", path=env["PATH"]) == str(shim / "ninja")
        with subprocess.Popen(["ninja", "-v", "-j", "8"], cwd=root, env=env, text=True,
                              stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                m = NINJA_PROGRESS.match(line)
                if m:
                    lane.progress(int(m["done"]), int(m["total"]))
        assert proc.returncode == 0


def test_two_ninjas_share_the_pool_through_lanes(tmp_path: Path) -> None:
    """torch passes -j MAX_JOBS, which turns ninja's jobserver client off: the shim drops
    it.  Two real ninjas asked for -j 8 run at most 6 jobs together in a pool of 6: a
    has 2 long jobs, b many short ones.  b starts on its share beside a's long jobs, and
    gets the slots a cannot use (4 of b's at once while a's two run)."""
    ninja = real_ninja()
    a, b = _jobs_ninja(tmp_path / "a", 2, 4.0), _jobs_ninja(tmp_path / "b", 60, 0.2)
    with jobserver.Pool(6, tmp_path) as pool:
        shim = pool.shim(Path(ninja))
        pool.expect("b")
        threads = [threading.Thread(target=_run_in_lane, args=(pool, shim, n, r))
                   for n, r in (("a", a), ("b", b))]
        threads[0].start()
        time.sleep(0.3)  # b's compile starts a moment later, as a companion's does
        threads[1].start()
        for t in threads:
            t.join()
        assert pool.free() == 6  # every slot back
    assert len(list(a.glob("*.start"))) == 2 and len(list(b.glob("*.start"))) == 60
    assert _most_at_once(a, b) <= 6
    a_ends = min(float(p.read_text()) for p in a.glob("o?"))
    assert _most_at_once(b, before=a_ends) == 4  # a's idle slots went to b


def test_the_shim_keeps_every_other_argument(tmp_path: Path) -> None:
    echo = tmp_path / "echo-args"
    echo.write_text("#!/bin/sh\nfor a do printf '<%s>' \"$a\"; done\n")
    echo.chmod(0o755)
    with jobserver.Pool(2, tmp_path) as pool:
        shim = pool.shim(echo) / "ninja"
        out = subprocess.run([str(shim), "-v", "-j", "8", "-C", "dir with space", "-j4",
                              "-k", "0", "it's"], capture_output=True, text=True, check=True)
    assert out.stdout == "<-v><-C><dir with space><-k><0><it's>"


# ------------------------------------------------------------------------------ scheduler

# companion_book: pureb, purea naming pureb as its companion, and an independent purec


def _stand_in(events: list[str], fail: str | None = None, slow: str | None = None):  # type: ignore[no-untyped-def]
    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, on_key=None):
        name = str(recipe.name)
        keys = {c: (p.key() if isinstance(p, Pending) else p.build_key)
                for c, p in (companions or {}).items()}
        events.append(f"{name} key (companions {sorted(keys.items())})")
        if on_key is not None:
            on_key(f"key-{name}")
        if name == slow:
            time.sleep(0.5)
        if name == fail:
            raise SourceError(f"{name}: the source is gone")
        for p in (companions or {}).values():
            got = p.result() if isinstance(p, Pending) else p
            events.append(f"{name} pins {got.wheel.name}")
        assert pool is not None and pool.size >= 1
        events.append(f"{name} done")
        return BuildResult(recipe, Path(f"/i/{name}-0.1.0+wf-py3-none-any.whl"), (), None,
                           f"key-{name}")
    return build_one


def _config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return resolve(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache",
                   work_dir=tmp_path / "work", jobs=4)


def test_builds_run_at_once_and_wait_for_their_companions_only_where_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    events: list[str] = []
    monkeypatch.setattr(scheduler, "build_one", _stand_in(events, slow="pureb"))
    out = io.StringIO()
    results = scheduler.build_with_companions([book.load("purea"), book.load("purec")], book,
                                              _config(tmp_path), Reporter(out))
    assert [r.recipe.name for r in results] == ["pureb", "purea", "purec"]  # companions first
    # purea has its companion's key before pureb has finished, and its wheel before pinning
    assert events.index("purea key (companions [('pureb', 'key-pureb')])") < \
        events.index("pureb done") < events.index("purea pins pureb-0.1.0+wf-py3-none-any.whl")
    assert events.index("purec done") < events.index("pureb done")  # purec did not wait
    assert "3 builds at once (pureb, purea, purec), sharing 4 compile slot(s)" in out.getvalue()


def test_a_failed_companion_stops_only_the_builds_that_need_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    events: list[str] = []
    monkeypatch.setattr(scheduler, "build_one", _stand_in(events, fail="pureb"))
    out = io.StringIO()
    with pytest.raises(SourceError, match="pureb: the source is gone"):  # the cause, not its echo
        scheduler.build_with_companions([book.load("purea"), book.load("purec")], book,
                                        _config(tmp_path), Reporter(out))
    assert "purec done" in events and "purea done" not in events
    said = out.getvalue()
    assert "  pureb: failed: pureb: the source is gone\n" in said
    assert "  purea: not built (its companion pureb failed)\n" in said
    assert "  purec: published: purec-0.1.0+wf-py3-none-any.whl\n" in said


def test_the_companion_error_a_dependent_raises(tmp_path: Path) -> None:
    book = companion_book(tmp_path)
    failing = scheduler._Build(scheduler.plan([book.load("pureb")], book, _config(tmp_path))[0])
    waiting = scheduler._Build(scheduler.plan([book.load("purec")], book, _config(tmp_path))[0])
    failing.settle(SourceError("pureb: the source is gone"))
    with pytest.raises(BuildError) as exc:
        scheduler._needs(waiting, failing, failing.key)()
    assert exc.value.what == "purec was not built: its companion pureb failed"
    assert exc.value.why == "pureb: the source is gone"
    assert waiting.blocked_by == "pureb"


def test_one_build_runs_in_the_callers_thread_without_a_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    seen: list[object] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, on_key=None):
        seen.append((threading.current_thread() is threading.main_thread(), pool))
        return BuildResult(recipe, Path("/i/x.whl"), (), None, "k")

    monkeypatch.setattr(scheduler, "build_one", build_one)
    scheduler.build_with_companions([book.load("purec")], book, _config(tmp_path),
                                    Reporter(io.StringIO()))
    assert seen == [(True, None)]


def test_ctrl_c_stops_the_commands_of_every_build(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each build runs a real 60 s command in its own thread; SIGINT to the main thread
    stops both (their process groups killed) and the command raises KeyboardInterrupt."""
    book = companion_book(tmp_path)
    started: list[str] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, on_key=None):
        started.append(str(recipe.name))
        _proc.run(["sleep", "60"])
        raise AssertionError("not stopped")

    monkeypatch.setattr(scheduler, "build_one", build_one)
    began = time.monotonic()
    with ctrl_c_when(lambda: len(started) == 2), pytest.raises(KeyboardInterrupt):
        scheduler.build_with_companions([book.load("purec"), book.load("pureb")], book,
                                        _config(tmp_path), Reporter(io.StringIO()))
    assert time.monotonic() - began < 20
    assert not _proc.stopping()  # both builds ended: commands may run again
    assert _proc.run(["true"]).returncode == 0


def test_builds_at_once_share_the_umask_and_give_the_callers_back(tmp_path: Path) -> None:
    caller = os.umask(0o077)
    try:
        first, second = reproducible.umask(), reproducible.umask()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)  # the first build ends: the second keeps ours
        assert os.umask(0o022) == reproducible.UMASK
        os.umask(reproducible.UMASK)
        second.__exit__(None, None, None)
        assert os.umask(0o077) == 0o077
    finally:
        os.umask(caller)


def test_one_live_line_per_running_build() -> None:
    out = FakeTty()
    reporter = Reporter(out)
    a, b = reporter.view("causal-conv1d"), reporter.view("mamba-ssm")
    a.progress(3, 9)
    b.progress(1, 15)
    lines = out.getvalue().rsplit("\r\x1b[K", 1)[-1]
    assert lines.startswith("[causal-conv1d] [3/9] compiling, ")
    assert "\n[mamba-ssm] [1/15] compiling, " in lines
    b.info("unit costs recorded")  # a line above the live ones, prefixed
    assert out.getvalue().endswith("\r\x1b[K\x1b[1A\x1b[K[mamba-ssm]   unit costs recorded\n")
    a.done()  # causal-conv1d has ended: only mamba-ssm's line is drawn
    assert out.getvalue().endswith("unit costs recorded\n[mamba-ssm] [1/15] compiling, "
                                   "0.0s elapsed")
    clear_live()
    assert out.getvalue().endswith("\r\x1b[K")


def test_backend_warnings_of_builds_at_once_go_to_each_builds_log(tmp_path: Path) -> None:
    """warnings.catch_warnings is one state for the process: two builds' backend warnings,
    raised in two threads, each reach that build's log, and the caller's warning set-up is
    back afterwards."""
    import warnings

    from wheelforge.builder.backend import backend_warnings_to

    before = (list(warnings.filters), warnings.showwarning)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    inside = threading.Barrier(2)

    def build(log: Path, text: str) -> None:
        with backend_warnings_to(log):
            inside.wait()
            warnings.warn(text, UserWarning, stacklevel=1)
            inside.wait()

    threads = [threading.Thread(target=build, args=(log, f"from {log.stem}")) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert logs[0].read_text() == "warning from the build backend (UserWarning): from a\n"
    assert logs[1].read_text() == "warning from the build backend (UserWarning): from b\n"
    assert (list(warnings.filters), warnings.showwarning) == before


def test_builds_at_once_can_be_turned_off(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    order: list[tuple[str, bool]] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, on_key=None):
        assert all(isinstance(c, BuildResult) for c in (companions or {}).values())
        order.append((str(recipe.name), threading.current_thread() is threading.main_thread()))
        return BuildResult(recipe, Path(f"/i/{recipe.name}.whl"), (), None, "k")

    monkeypatch.setattr(scheduler, "build_one", build_one)
    monkeypatch.setenv(scheduler.ENV, "off")
    scheduler.build_with_companions([book.load("purea"), book.load("purec")], book,
                                    _config(tmp_path), Reporter(io.StringIO()))
    assert order == [("pureb", True), ("purea", True), ("purec", True)]
    assert scheduler.at_once({}) and scheduler.at_once({scheduler.ENV: "on"})
    with pytest.raises(ConfigError, match="WHEELFORGE_BUILDS_AT_ONCE='sometimes' is neither"):
        scheduler.at_once({scheduler.ENV: "sometimes"})
