"""Several builds of one command at once: the pool of compile slots (a real GNU make
jobserver whose gates real ninjas run their jobs through), the scheduler's hand-offs
between a build and its companions, failures and Ctrl-C, the shared umask and the live
lines.

The scheduler's tests stand in for ``pipeline.build_one`` (a unit test of the order and
the errors); the real builds at once are in test_build_fixture (a CUDA and a pure recipe
in one command) and test_interrupt (Ctrl-C in the middle of one of them).
"""

from __future__ import annotations

import dataclasses
import io
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import ctrl_c_when
from test_companions import companion_book
from test_first_hour import FakeTty
from wheelforge import _proc
from wheelforge._log import Reporter, clear_live
from wheelforge.builder import scheduler
from wheelforge.builder.artifact import reproducible
from wheelforge.builder.compiling import jobserver
from wheelforge.builder.config import resolve
from wheelforge.builder.pipeline import BuildResult, Pending
from wheelforge.errors import BuildError, ConfigError, SourceError


@pytest.mark.unit
def test_a_whole_compile_takes_its_slots_and_gives_them_back(tmp_path: Path) -> None:
    with jobserver.Pool(3, tmp_path) as pool:
        assert pool.free() == 3
        with pool.slots(2) as held:
            assert held == 2 and pool.free() == 1
        with pool.slots(10) as held:  # never more than the pool
            assert held == 3 and pool.free() == 0
        assert pool.free() == 3


def test_a_whole_compile_waits_for_its_slots_and_ctrl_c_stops_the_wait(
        tmp_path: Path) -> None:
    heard: list[str] = []
    with jobserver.Pool(2, tmp_path) as pool, pool.slots(1):
        later = threading.Timer(0.5, lambda: _proc.stop_all())
        later.start()
        try:
            with pytest.raises(KeyboardInterrupt), pool.slots(2, on_wait=lambda: heard.append("w")):
                pass
        finally:
            later.join()
            _proc.resume()
        assert heard == ["w"] and pool.free() == 1  # the one it had taken: back


def _jobs_ninja(root: Path, count: int, seconds: float, gate: str = "") -> Path:
    """A build.ninja of ``count`` jobs that each record when they ran, each command
    behind ``gate`` (as torch writes ``$PYTORCH_NVCC``)."""
    root.mkdir(parents=True)
    lines = ["rule s", f"  command = {gate} sh -c 'date +%s.%N > $out.start; "
             f"sleep {seconds}; date +%s.%N > $out'"]
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


def _ninja(root: Path, jobs: int) -> subprocess.Popen[str]:
    """A real ninja asked for ``-j jobs``, as torch asks for MAX_JOBS."""
    ninja = Path(sys.executable).with_name("ninja")
    if not ninja.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("ninja is missing from the test environment (the `test` extra)")
        pytest.skip("ninja is not in this environment (pip install -e '.[test]')")
    return subprocess.Popen([str(ninja), "-j", str(jobs)], cwd=root, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_two_ninjas_share_the_pool_unit_by_unit(tmp_path: Path) -> None:
    """Two real ninjas, each asked for -j 8, their commands behind the gate, run at most
    6 jobs together in a pool of 6.  a has 2 long jobs, b many short ones: while a's two
    run, b runs on the other 4 slots, and the slots a's units give back go to b's
    waiting units at once (no ninja needs to notice)."""
    with jobserver.Pool(6, tmp_path) as pool:
        gate = pool.gate("")
        a = _jobs_ninja(tmp_path / "a", 2, 3.0, gate)
        b = _jobs_ninja(tmp_path / "b", 40, 0.2, gate)
        first = _ninja(a, 8)
        time.sleep(0.5)  # b's compile starts later, as a companion's does
        second = _ninja(b, 8)
        for proc in (first, second):
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
        _until(lambda: pool.free() == 6)  # every slot back
    assert len(list(a.glob("*.start"))) == 2 and len(list(b.glob("*.start"))) == 40
    assert _most_at_once(a, b) <= 6
    a_ends = min(float(p.read_text()) for p in a.glob("o?"))
    assert _most_at_once(b, before=a_ends) == 4  # a's two hold 2: b runs on the rest
    b_ends = max(float(p.read_text()) for p in b.glob("o*[0-9]"))
    # b ended within what 40 units of 0.2 s take on 4 slots, plus the gate's start-up
    assert b_ends - min(float(p.read_text()) for p in b.glob("*.start")) < 2.0 + 40 * 0.3


def test_a_unit_of_several_nvcc_threads_takes_that_many_slots(tmp_path: Path) -> None:
    """NVCC_THREADS=2: each unit takes 2 of the pool's 5; two ninjas of 2-slot units
    never run more than 2 units (4 slots) at once, and neither waits forever (a gate
    waits for all its slots first in line, and nothing passes it)."""
    with jobserver.Pool(5, tmp_path) as pool:
        gate = pool.gate("", threads=2)
        roots = [_jobs_ninja(tmp_path / n, 6, 0.3, gate) for n in ("a", "b")]
        procs = [_ninja(r, 4) for r in roots]
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
        _until(lambda: pool.free() == 5)
    assert _most_at_once(*roots) == 2


def test_the_gate_passes_the_command_and_its_exit_status(tmp_path: Path) -> None:
    with jobserver.Pool(1, tmp_path) as pool:
        gate = pool.gate("sh -c", threads=1)
        out = subprocess.run(f"{gate} 'printf \"<%s>\" \"$0\" \"$1\"; exit 3' \"it's\" 'a b'",
                             shell=True, capture_output=True, text=True)
        assert (out.returncode, out.stdout) == (3, "<it's><a b>")
        missing = subprocess.run(f"{pool.gate('no-such-nvcc')} -c x.cu", shell=True,
                                 capture_output=True, text=True)
        assert missing.returncode == 127 and "cannot run no-such-nvcc" in missing.stderr
        _until(lambda: pool.free() == 1)


def test_a_gate_stopped_by_a_signal_stops_its_unit_and_gives_its_slots_back(
        tmp_path: Path) -> None:
    with jobserver.Pool(2, tmp_path) as pool:
        mark = tmp_path / "ran"
        unit = subprocess.Popen(f"exec {pool.gate('sh -c')} 'touch {mark}; exec sleep 60'",
                                shell=True, start_new_session=True)
        _until(mark.exists)
        assert pool.free() == 1
        os.kill(-unit.pid, signal.SIGTERM)  # as ninja stops its jobs: the process group
        assert unit.wait(10) == 128 + signal.SIGTERM
        _until(lambda: pool.free() == 2)
        # waiting for its slots when stopped: ends, and takes none with it
        with pool.slots(2):
            waiting = subprocess.Popen(f"exec {pool.gate('true')}", shell=True)
            time.sleep(0.5)
            waiting.terminate()
            assert waiting.wait(10) != 0
        _until(lambda: pool.free() == 2)


def test_the_slots_of_a_killed_gate_are_free_again(tmp_path: Path) -> None:
    with jobserver.Pool(3, tmp_path) as pool:
        mark = tmp_path / "ran"
        gate = subprocess.Popen([*shlex.split(pool.gate("sh -c", threads=2)),
                                 f"touch {mark}; exec sleep 60"])
        _until(mark.exists)
        assert pool.free() == 1
        gate.kill()  # SIGKILL: the gate says nothing, its connection closes
        gate.wait(10)
        _until(lambda: pool.free() == 3)


def test_the_units_of_the_longest_compile_go_first(tmp_path: Path) -> None:
    """One slot, held; units of priority 1 ask first, then units of priority 5: when the
    slot is free, the priority-5 units run first, then the others in the order they
    asked (the longest compile last time starts its units first)."""
    order = tmp_path / "order"
    with jobserver.Pool(1, tmp_path) as pool:
        gates = []
        with pool.slots(1):
            for name, priority in (("low1", 1), ("low2", 1), ("high1", 5), ("high2", 5)):
                gates.append(subprocess.Popen(
                    [*shlex.split(pool.gate("sh -c", priority=priority)),
                     f"echo {name} >> {order}"]))
                time.sleep(0.3)  # asked in this order
        for g in gates:
            assert g.wait(20) == 0
        assert order.read_text().split() == ["high1", "high2", "low1", "low2"]
        _until(lambda: pool.free() == 1)


def test_a_gate_waiting_when_the_pool_closes_fails_and_a_bad_request_is_refused(
        tmp_path: Path) -> None:
    pool = jobserver.Pool(1, tmp_path)
    with pool.slots(1):
        waiting = subprocess.Popen(shlex.split(pool.gate("true")), stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(0.5)
        pool.close()  # the command ends (an error elsewhere): its gates must not hang
        _, err = waiting.communicate(timeout=20)
    assert waiting.returncode == 1 and "pool of compile slots closed" in err
    with jobserver.Pool(1, tmp_path) as pool:
        gate = pool.gate("true").replace(" 1 0.0 ", " 1 not-a-number ")
        bad = subprocess.run(shlex.split(gate), capture_output=True, text=True, timeout=20)
        assert bad.returncode == 1 and pool.free() == 1


def _ordered_unit(pool: jobserver.Pool, name: str, priority: float, order: Path,
                  seconds: float = 0.0) -> subprocess.Popen[bytes]:
    """A unit behind the pool's gate that writes its name to ``order`` as it starts."""
    return subprocess.Popen([*shlex.split(pool.gate("sh -c", priority=priority)),
                             f"echo {name} >> {order}; sleep {seconds}"])


def test_slots_are_held_for_an_expected_longer_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile expected at priority 5 has not started: a unit of priority 1 waits for
    it; the expected compile's first unit takes the slot, then the other runs.  A hold
    ends after RESERVE_S, and at once on withdraw."""
    order = tmp_path / "order"

    def unit(pool: jobserver.Pool, name: str, priority: float) -> subprocess.Popen[bytes]:
        return _ordered_unit(pool, name, priority, order)

    with jobserver.Pool(1, tmp_path) as pool:
        pool.expect("long", 5)
        short = unit(pool, "short", 1)
        time.sleep(1.0)
        assert not order.exists()  # held for the expected one
        long = unit(pool, "long", 5)
        assert long.wait(20) == 0 and short.wait(20) == 0
        assert order.read_text().split() == ["long", "short"]

        order.unlink()
        pool.expect("gone", 5)
        short = unit(pool, "short", 1)
        time.sleep(0.5)
        pool.withdraw("gone")  # it will not compile: no hold
        assert short.wait(20) == 0 and order.read_text().split() == ["short"]

        monkeypatch.setattr(jobserver, "RESERVE_S", 0.5)
        pool.expect("late", 5)
        short = unit(pool, "short", 1)
        assert short.wait(20) == 0  # the hold ended without it


def test_a_hold_lasts_until_every_unit_the_expected_compile_starts_has_asked(
        tmp_path: Path) -> None:
    """The expected compile's ninja starts its units one gate after another: the
    shorter compile's units, waiting already, do not take the slots between the first
    of them and the next (measured on 16 cores: they did, and the longest compile's units
    ran last)."""
    order = tmp_path / "order"

    def unit(pool: jobserver.Pool, name: str, priority: float) -> subprocess.Popen[bytes]:
        return _ordered_unit(pool, name, priority, order, seconds=0.5)

    with jobserver.Pool(3, tmp_path) as pool:
        pool.expect("short", 1)
        pool.expect("long", 5)
        units = [unit(pool, f"short{i}", 1) for i in range(3)]
        time.sleep(1.0)
        for i in range(3):
            units.append(unit(pool, f"long{i}", 5))
            time.sleep(0.3)
        assert all(u.wait(30) == 0 for u in units)
    names = order.read_text().split()
    assert sorted(names[:3]) == ["long0", "long1", "long2"], names


def test_the_gate_writes_the_seconds_its_unit_ran(tmp_path: Path) -> None:
    """ninja's log counts a unit's wait at the gate; the gate's record does not."""
    out = tmp_path / "unit.o"
    with jobserver.Pool(1, tmp_path) as pool:
        with pool.slots(1):
            gate = subprocess.Popen([*shlex.split(pool.gate("sh -c")),
                                     "sleep 0.3; touch \"$2\"", "sh", "-o", str(out)])
            time.sleep(1.0)  # waits for the slot
        assert gate.wait(20) == 0
    ran = float(Path(str(out) + jobserver.SECONDS_SUFFIX).read_text())
    assert 0.25 < ran < 0.9


def test_a_unit_whose_threads_ran_on_lent_slots_records_its_cpu_seconds(
        tmp_path: Path) -> None:
    """ptxas's threads on slots the pool lent shorten a unit's wall, not its work: the
    next build packs its units by the work (two processes of ~0.6 CPU-s each on one
    slot: at least 1.2 s recorded, whatever the wall)."""
    out = tmp_path / "unit.o"
    spin = (f"{shlex.quote(sys.executable)} -c 'import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.6: pass'")
    with jobserver.Pool(2, tmp_path) as pool:
        gate = subprocess.run([*shlex.split(pool.gate("sh -c")),
                               f"{spin} & {spin}; wait; touch \"$2\"", "sh", "-o", str(out)],
                              timeout=60)
    assert gate.returncode == 0
    assert float(Path(str(out) + jobserver.SECONDS_SUFFIX).read_text()) >= 1.15


def _until(ready: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ scheduler

# companion_book: pureb, purea naming pureb as its companion, and an independent purec


def _stand_in(events: list[str], fail: str | None = None, slow: str | None = None):  # type: ignore[no-untyped-def]
    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, warm=None, on_key=None, on_version=None):
        name = str(recipe.name)
        keys = {c: (p.key() if isinstance(p, Pending) else p.build_key)
                for c, p in (companions or {}).items()}
        events.append(f"{name} key (companions {sorted(keys.items())})")
        if on_key is not None:
            on_key(f"key-{name}")
        if name == fail:
            raise SourceError(f"{name}: the source is gone")
        if on_version is not None:
            on_version("0.1.0+wf")
        if name == slow:
            time.sleep(0.5)
        for p in (companions or {}).values():
            assert isinstance(p, Pending)
            events.append(f"{name} pins {p.version()}")
        for p in (companions or {}).values():
            events.append(f"{name} publishes after {p.result().wheel.name}")
        assert pool is not None and pool.size >= 1
        assert warm is not None  # the command's warm interpreters (builder/artifact/importcheck.py)
        events.append(f"{name} done")
        return BuildResult(recipe, Path(f"/i/{name}-0.1.0+wf-py3-none-any.whl"), (), None,
                           f"key-{name}")
    return build_one


def _config(tmp_path: Path):  # type: ignore[no-untyped-def]
    return resolve(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache",
                   work_dir=tmp_path / "work", jobs=4)


@pytest.mark.unit
def test_builds_run_at_once_and_wait_for_their_companions_only_where_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    events: list[str] = []
    monkeypatch.setattr(scheduler, "build_one", _stand_in(events, slow="pureb"))
    out = io.StringIO()
    results = scheduler.build_with_companions([book.load("purea"), book.load("purec")], book,
                                              _config(tmp_path), Reporter(out))
    assert [r.recipe.name for r in results] == ["pureb", "purea", "purec"]  # companions first
    # purea has its companion's key and version before pureb has finished, and publishes
    # after pureb's wheel is published
    assert events.index("purea key (companions [('pureb', 'key-pureb')])") < \
        events.index("purea pins 0.1.0+wf") < events.index("pureb done") < \
        events.index("purea publishes after pureb-0.1.0+wf-py3-none-any.whl")
    assert events.index("purec done") < events.index("pureb done")  # purec did not wait
    assert "3 builds at once (pureb, purea, purec), sharing 4 compile slot(s)" in out.getvalue()


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_one_build_runs_in_the_callers_thread_with_the_commands_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One build needs no other thread.  One that compiles gets the command's pool all the
    same, whose jobserver lends ptxas's threads the slots its units leave free; a pure
    one gets none (nothing to compile, and no directory for a killed command to leave)."""
    book = companion_book(tmp_path)
    seen: list[tuple[bool, int | None]] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, warm=None, on_key=None, on_version=None):
        seen.append((threading.current_thread() is threading.main_thread(),
                     pool.size if pool is not None else None))
        return BuildResult(recipe, Path("/i/x.whl"), (), None, "k")

    monkeypatch.setattr(scheduler, "build_one", build_one)
    config = _config(tmp_path)
    pure = book.load("purec")
    scheduler.build_with_companions([pure], book, config, Reporter(io.StringIO()))
    compiles = dataclasses.replace(pure, build=dataclasses.replace(pure.build,
                                                                   kind="extension"))
    scheduler.build_with_companions([compiles], book, config, Reporter(io.StringIO()))
    assert seen == [(True, None), (True, config.jobs * config.nvcc_threads)]


def test_ctrl_c_stops_the_commands_of_every_build(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each build runs a real 60 s command in its own thread; SIGINT to the main thread
    stops both (their process groups killed) and the command raises KeyboardInterrupt."""
    book = companion_book(tmp_path)
    started: list[str] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, warm=None, on_key=None, on_version=None):
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_backend_warnings_of_builds_at_once_go_to_each_builds_log(tmp_path: Path) -> None:
    """warnings.catch_warnings is one state for the process: two builds' backend warnings,
    raised in two threads, each reach that build's log, and the caller's warning set-up is
    back afterwards."""
    import warnings

    from wheelforge.builder.compiling.backend import backend_warnings_to

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


@pytest.mark.unit
def test_builds_at_once_can_be_turned_off(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    book = companion_book(tmp_path)
    order: list[tuple[str, bool]] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, warm=None, on_key=None):
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


@pytest.mark.unit
def test_every_build_asks_its_environment_for_the_requirements_of_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The builds of one command share a managed environment: each asks it for the
    requirements of every build of the command (and the caller's others), so the first to
    prepare it installs them all before any compile, and none installs into it while
    another's setup.py imports from it (a fresh clone's `make build` failed so: mamba-ssm
    installed transformers, and numpy with it, while causal-conv1d's setup.py imported
    torch, which imported the half-installed numpy)."""
    book = companion_book(tmp_path)
    for name, extra in (("purea", "  requires: [einops]\n"), ("pureb", "  requires: [six]\n")):
        path = tmp_path / "recipes" / f"{name}.yaml"
        path.write_text(path.read_text().replace("verify:\n", "verify:\n" + extra))
    seen: dict[str, tuple[str, ...]] = {}
    asked: list[tuple[str, ...]] = []

    def build_one(recipe, config, reporter, companions=None, inspections=None, *,  # type: ignore[no-untyped-def]
                  pool=None, warm=None, on_key=None, on_version=None):
        seen[str(recipe.name)] = config.shared_requirements
        from wheelforge.builder import pipeline

        def managed_env(cache_dir, **kw):  # type: ignore[no-untyped-def]
            asked.append(kw["requirements"])
            raise SourceError("stop here")

        monkeypatch.setattr(pipeline.buildenv, "managed_env", managed_env)
        with pytest.raises(SourceError):
            pipeline._get_env(recipe, config, reporter, tmp_path / "log",
                              pipeline.buildenv.Inspections())
        if on_key is not None:
            on_key(f"key-{recipe.name}")
        if on_version is not None:
            on_version("0.1.0+wf")
        return BuildResult(recipe, Path(f"/i/{recipe.name}-0.1.0+wf-py3-none-any.whl"), (),
                           None, f"key-{recipe.name}")

    monkeypatch.setattr(scheduler, "build_one", build_one)
    scheduler.build_with_companions([book.load("purea"), book.load("purec")], book,
                                    _config(tmp_path), Reporter(io.StringIO()),
                                    shared_requirements=("packaging",))
    assert seen == {n: ("six", "einops", "packaging") for n in ("pureb", "purea", "purec")}
    assert len(asked) == 3 and all(set(a) >= {"six", "einops", "packaging"} for a in asked)
    assert scheduler.requirements_of([book.load("purea"), book.load("pureb")]) == \
        ("einops", "six")


#: A stand-in for nvcc's threads: a client of GNU make's jobserver protocol, as nvcc 13.0
#: is with --jobserver.  It takes up to WANT tokens from the pipe MAKEFLAGS names (for up
#: to SECONDS, default 10), writes how many it got to OUT, and gives them back once
#: RELEASE exists (or after 120 s: a test that failed first leaves no process behind).
_TOKEN_CLIENT = r'''
import os, sys, time
want, release, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
fifo = os.environ["MAKEFLAGS"].split("--jobserver-auth=fifo:")[1].split()[0]
fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
got, deadline = b"", time.monotonic() + seconds
while len(got) < want and time.monotonic() < deadline:
    try:
        got += os.read(fd, want - len(got))
    except BlockingIOError:
        time.sleep(0.05)
with open(out, "w") as f:
    f.write(str(len(got)))
deadline = time.monotonic() + 120  # a test that failed before releasing it: end anyway
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
os.write(fd, got)
'''


def test_a_quiet_pool_lends_its_free_slots_to_a_units_threads_and_takes_them_back(
        tmp_path: Path) -> None:
    """The pool's jobserver: a unit's gate holds one slot of 4; once the pool is quiet
    the other 3 go into the pipe, where the unit's threads take them.  A unit that asks
    meanwhile waits until the threads give them back, then runs; at the end every slot
    is free."""
    client, release, got = tmp_path / "client.py", tmp_path / "release", tmp_path / "got"
    client.write_text(_TOKEN_CLIENT)
    with jobserver.Pool(4, tmp_path) as pool:
        gate = shlex.split(pool.gate(shlex.quote(sys.executable)))
        first = subprocess.Popen([*gate, str(client), "3", str(release), str(got)])
        _until(lambda: got.exists() and got.read_text() != "")
        assert got.read_text() == "3"  # lent after LEND_AFTER_S of quiet
        assert pool.free() == 0  # one slot at the gate, three with its threads
        second = subprocess.Popen([*gate, "-c", "pass"])
        time.sleep(jobserver.LEND_AFTER_S + 0.5)
        assert second.poll() is None  # waits for a slot the threads hold
        release.touch()
        assert second.wait(20) == 0 and first.wait(20) == 0
        _until(lambda: pool.free() == 4)


def test_a_waiting_unit_keeps_the_free_slots_from_the_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool with a unit waiting lends nothing: unit a runs (1 of 2 slots) and its
    threads want a token; unit b asks for 2 and waits.  The free slot is b's: a's
    threads get no token however long the pool is quiet, and b runs once a ends."""
    client, release, got = tmp_path / "client.py", tmp_path / "release", tmp_path / "got"
    client.write_text(_TOKEN_CLIENT)
    monkeypatch.setattr(jobserver, "LEND_AFTER_S", 3.0)  # b asks well within it
    with jobserver.Pool(2, tmp_path) as pool:
        gate = shlex.split(pool.gate(shlex.quote(sys.executable)))
        a = subprocess.Popen([*gate, str(client), "1", str(release), str(got),
                              str(jobserver.LEND_AFTER_S + 2.0)])
        _until(lambda: pool.free() == 1)
        b = subprocess.Popen([*shlex.split(pool.gate("true", threads=2))])
        _until(lambda: got.exists() and got.read_text() != "")
        assert got.read_text() == "0" and b.poll() is None
        release.touch()
        assert a.wait(20) == 0 and b.wait(20) == 0
        _until(lambda: pool.free() == 2)


def test_a_slot_a_last_unit_frees_goes_to_the_threads_without_waiting_for_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's last units end one after another, often less than a second apart: the
    slot each frees goes to the threads of the units still running LEND_AFTER_END_S
    after it ends, not once no gate has ended for LEND_AFTER_S.  Unit a's threads want
    a token, unit b holds the pool's other slot; b's slot reaches a's threads well
    before LEND_AFTER_S (made long here) has passed since b ended."""
    client, release, got = tmp_path / "client.py", tmp_path / "release", tmp_path / "got"
    client.write_text(_TOKEN_CLIENT)
    monkeypatch.setattr(jobserver, "LEND_AFTER_S", 3.0)
    ended = tmp_path / "ended"
    with jobserver.Pool(2, tmp_path) as pool:
        gate = shlex.split(pool.gate(shlex.quote(sys.executable)))
        a = subprocess.Popen([*gate, str(client), "1", str(release), str(got), "30"])
        b = subprocess.Popen([*gate, "-c", "import time; time.sleep(4)"])
        _until(lambda: pool.free() == 0)
        assert b.wait(20) == 0
        ended.touch()
        _until(lambda: got.exists() and got.read_text() != "")
        lent_after = got.stat().st_mtime - ended.stat().st_mtime
        assert got.read_text() == "1"
        assert lent_after < jobserver.LEND_AFTER_S - 1.0, lent_after
        release.touch()
        assert a.wait(20) == 0
        _until(lambda: pool.free() == 2)


def test_a_slot_an_ending_unit_frees_goes_to_the_next_unit_its_ninja_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ninja starts its next unit a few milliseconds after one ends: the slot goes to
    that unit, not to the threads of a unit still running, which would keep it until
    their parts end.  Unit a's threads want a token; b ends and c, started right after
    it as ninja starts it (the same shell), runs at once (its gate asks within
    LEND_AFTER_END_S of b's end); a's threads get the slot once c has ended."""
    client, release, got = tmp_path / "client.py", tmp_path / "release", tmp_path / "got"
    client.write_text(_TOKEN_CLIENT)
    monkeypatch.setattr(jobserver, "LEND_AFTER_S", 0.5)
    monkeypatch.setattr(jobserver, "LEND_AFTER_END_S", 1.0)  # c asks well within it
    ran = tmp_path / "ran"
    with jobserver.Pool(2, tmp_path) as pool:
        gate = pool.gate(shlex.quote(sys.executable))
        a = subprocess.Popen([*shlex.split(gate), str(client), "1", str(release), str(got),
                              "30"])
        touch = f"-c 'import sys; open(sys.argv[1], \"w\")' {shlex.quote(str(ran))}"
        bc = subprocess.Popen(["sh", "-c", f"{gate} -c 'import time; time.sleep(3)' && "
                               f"{gate} {touch}"])
        # had a's threads taken b's slot, c would wait for them (30 s) and so would this
        assert bc.wait(20) == 0 and ran.exists()
        _until(lambda: got.exists() and got.read_text() != "")  # c's slot, once c ended
        assert got.read_text() == "1"
        release.touch()
        assert a.wait(20) == 0
        _until(lambda: pool.free() == 2)


_NVCC_UNIT = """\
#include <cuda/std/array>
#include <cuda/std/iterator>
template <int N> __global__ void total(float* out, long n) {
  cuda::std::array<float, N> a{};
  float s = 0;
  for (auto it = cuda::std::begin(a); it != cuda::std::end(a); ++it) s += *it;
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = s;
}
template __global__ void total<4>(float*, long);
template __global__ void total<8>(float*, long);
template __global__ void total<16>(float*, long);
"""


@pytest.mark.nvcc
def test_nvcc_through_the_pools_jobserver_writes_the_same_object_with_or_without_free_slots(
        tmp_path: Path, nvcc: str) -> None:
    """The real nvcc, with the options a build gives it, behind the gate: alone in a
    pool of 1 (no token to take) and in a pool of 4 whose free slots are lent.  Same
    bytes (the split is fixed, the tokens only say how many parts run at once); it
    found the pool's jobserver (no warning) and gave every token back.  The arguments
    in torch's order (``-c SRC -o OUT``), as its ninja file writes them."""
    flags = reproducible.nvcc_flags(Path(nvcc)) + jobserver.nvcc_flags(Path(nvcc))
    assert "--ptxas-options=--split-compile=8,--jobserver" in flags
    src, out = tmp_path / "k.cu", tmp_path / "k.o"
    src.write_text(_NVCC_UNIT)
    objects = []
    for size in (1, 4):
        with jobserver.Pool(size, tmp_path) as pool:
            time.sleep(jobserver.LEND_AFTER_S + 0.5)  # the free slots are in the pipe
            command = " ".join([pool.gate(shlex.quote(nvcc)), *flags, "-arch=sm_120",
                                "-lineinfo", "-c", shlex.quote(str(src)), "-o",
                                shlex.quote(str(out))])
            done = subprocess.run(command, shell=True, capture_output=True, text=True,
                                  cwd=tmp_path, timeout=300)
            assert done.returncode == 0, done.stderr
            assert "jobserver" not in done.stderr.lower(), done.stderr
            _until(lambda: pool.free() == size)  # noqa: B023 (called at once)
        objects.append(out.read_bytes())
    assert objects[0] == objects[1]


@pytest.mark.unit
def test_a_pool_that_cannot_start_leaves_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(a full temporary directory): no pool directory, no lock held, the error raised."""
    import errno

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "mkfifo", full)
    with pytest.raises(OSError, match="No space left"):
        jobserver.Pool(2, tmp_path)
    assert not list(tmp_path.glob(f"{jobserver.DIR_PREFIX}*"))
