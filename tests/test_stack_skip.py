"""Issue 53: a night (or a build) that published nothing does not run the stack check of a
channel whose last check passed with exactly what the check would install and import now;
it says so.  The work is counted (calls of the check), never timed.

The first check is real (pip, a venv, the fixture stack of tests/test_stack.py, the
dependencies from a directory: seconds); the checks counted after it are fakes.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import make_wheel
from test_stack import NO_TARGET, fixture_stack
from wheelforge import index
from wheelforge._log import Reporter
from wheelforge.cli import stack as stack_cli
from wheelforge.consume import stack, stackinputs
from wheelforge.index import health
from wheelforge.index.health import StackStatus
from wheelforge.nightly import gate
from wheelforge.nightly.cells import CellResult, Settings

PYTHON = Path(getattr(sys, "_base_executable", sys.executable))


def cell(python: Path = PYTHON) -> CellResult:
    """A pure cell already published (a night with nothing to do)."""
    return CellResult(recipe="alpha", version="1.0+wf", python=str(python), torch="",
                      cuda="", pip_args=(), archs=None, status="skipped")


@dataclasses.dataclass
class Counted:
    """stack.check, counted; the real one, or a fake that answers ``answer``."""

    real: Callable[..., StackStatus]
    answer: StackStatus | None = None
    calls: int = 0

    def __call__(self, *args: object, **kwargs: object) -> StackStatus:
        self.calls += 1
        return self.real(*args, **kwargs) if self.answer is None else self.answer


def night(settings: Settings) -> tuple[tuple[StackStatus, ...], str]:
    out = io.StringIO()
    statuses = gate.check_night(settings, None, [cell()], Reporter(out))
    return statuses, out.getvalue()


@pytest.fixture
def passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, Counted]:
    """An index whose stack was checked (for real) by a night and passed."""
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)
    settings = Settings(index_dir=root, cache_dir=tmp_path / "cache", deps_dir=deps)
    counted = Counted(stack.check)
    monkeypatch.setattr(stack, "check", counted)
    statuses, _ = night(settings)
    assert counted.calls == 1 and [s.state for s in statuses] == ["good"], statuses
    assert len(statuses[0].inputs) == 64  # the digest is recorded with the pass
    assert health.read_status(root, None) == statuses[0]
    return settings, counted


def test_a_night_that_changed_nothing_keeps_the_pass_and_says_so(
        passed: tuple[Settings, Counted]) -> None:
    settings, counted = passed
    recorded = health.read_status(settings.index_dir, None)
    statuses, said = night(settings)
    assert counted.calls == 1  # not invoked again
    assert statuses == (recorded,)
    assert recorded is not None
    assert (f"stack simple/: check skipped: the channel is unchanged since the check of "
            f"{recorded.checked_at} (passed); `wheelforge stack check` reruns it") in said
    assert health.read_status(settings.index_dir, None) == recorded  # nothing rewritten


def test_the_check_runs_again_when_anything_it_would_install_changed(
        passed: tuple[Settings, Counted], tmp_path: Path) -> None:
    settings, counted = passed
    before = health.read_status(settings.index_dir, None)
    assert before is not None
    counted.answer = before
    # asked for: WHEELFORGE_STACK_CHECK=always
    night(dataclasses.replace(settings, stack_recheck=True))
    assert counted.calls == 2
    # a new file in the dependencies' directory
    make_wheel(settings.deps_dir or tmp_path, {"other/__init__.py": ""}, name="other")
    night(settings)
    assert counted.calls == 3
    # the check that was recorded did not pass (a broken stack is checked every night)
    health.write_status(settings.index_dir, dataclasses.replace(before, state="broken"))
    night(settings)
    assert counted.calls == 4


def test_a_new_wheel_or_another_interpreter_or_pip_setting_is_another_digest(
        tmp_path: Path) -> None:
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)

    def digest(python: Path = PYTHON, environ: dict[str, str] | None = None) -> str:
        return stackinputs.digest(root, None, None, python, deps, environ or {})

    first = digest()
    assert first and first == digest()
    assert digest(environ={"PIP_INDEX_URL": "https://example.invalid/simple"}) != first
    assert digest(environ={"UNRELATED": "1"}) == first
    other = tmp_path / "python3"
    other.symlink_to(PYTHON)
    assert digest(python=other) != first
    newer = make_wheel(tmp_path / "dist2", {"alpha/__init__.py": ""}, name="alpha",
                       version="1.1+wf")
    index.publish(root, newer, **NO_TARGET)
    assert digest() != first
    assert stackinputs.digest(tmp_path / "no-index", None, None, PYTHON, None, {}) == ""


def test_build_skips_an_unchanged_channel_and_stack_check_never_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`build` (run_gate with skip_unchanged) keeps a pass of the same inputs; `wheelforge
    stack check` (run_gate's default) reruns the check.  Without --deps-dir the line says
    that the usual index's new releases were not seen."""
    root, _ = fixture_stack(tmp_path, spoiler_breaks=False)
    inputs = stackinputs.digest(root, None, None, PYTHON, None,
                                dict(stack.into.child_env(None)))
    good = StackStatus(channel=None, state="good", checked_at="2026-12-01T03:00:00Z",
                       inputs=inputs)
    health.write_status(root, good)
    counted = Counted(stack.check, answer=good)
    monkeypatch.setattr(stack, "check", counted)

    def gate_run(**kw: bool) -> list[StackStatus]:
        return stack_cli.run_gate(root, [None], python=PYTHON, cache_dir=tmp_path / "cache",
                                  recipes_dir=None, deps_dir=None,
                                  reporter=Reporter(io.StringIO()), **kw)

    assert gate_run(skip_unchanged=True) == [good]
    assert counted.calls == 0
    said = capsys.readouterr().out
    assert ("stack simple/: check skipped: the channel is unchanged since the check of "
            "2026-12-01T03:00:00Z (passed); its dependencies come from the usual index, "
            "whose new releases that check did not see; `wheelforge stack check` reruns it"
            ) in said
    gate_run()
    assert counted.calls == 1
    assert stack_cli.gate_forced({"WHEELFORGE_STACK_CHECK": "always"})
    assert not stack_cli.gate_forced({"WHEELFORGE_STACK_CHECK": "on"})


def test_build_makes_no_early_venv_where_every_channel_passed_with_these_inputs(
        tmp_path: Path) -> None:
    """The venv a build makes beside its compiles (3-5 s of a core, waited for at its end)
    is not made where the check would be skipped: every channel passed with the inputs of
    now.  Where one did not, or was never checked, it is."""
    root, deps = fixture_stack(tmp_path, spoiler_breaks=False)

    def pays() -> bool:
        return stack_cli.early_venv_pays(root, python=PYTHON, recipes_dir=None,
                                         deps_dir=deps)

    assert pays()  # never checked
    inputs = stackinputs.digest(root, None, None, PYTHON, deps,
                                dict(stack.into.child_env(None)))
    good = StackStatus(channel=None, state="good", checked_at="2026-12-01T03:00:00Z",
                       inputs=inputs)
    health.write_status(root, good)
    assert not pays()
    health.write_status(root, dataclasses.replace(good, inputs="0" * 64))
    assert pays()
    assert stack_cli.early_venv_pays(tmp_path / "none", python=PYTHON, recipes_dir=None,
                                     deps_dir=None)


def test_a_noop_build_skips_the_check_and_makes_no_venv(tmp_path: Path) -> None:
    """The real `wheelforge build` twice (a pure recipe, dependencies from a directory):
    the first publishes and checks; the second publishes nothing, runs no check and makes
    no venv (the log directory gains no stack log), and says why."""
    from test_stack import alpha_project, wheelforge

    sdists = alpha_project(tmp_path)
    deps = tmp_path / "deps"
    make_wheel(deps, {"spoiler/__init__.py": "OK = True\n"}, name="spoiler", version="2.0")
    argv = ["build", "alpha", "--recipes", str(tmp_path / "recipes"), "--sources",
            str(sdists), "--index", str(tmp_path / "index"), "--cache-dir",
            str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"),
            "--deps-dir", str(deps)]
    first = wheelforge(*argv, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "stack simple/: good" in first.stdout
    logs = sorted((tmp_path / "cache" / "logs").glob("stack-*.log"))
    assert len(logs) == 1
    again = wheelforge(*argv, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "already published: alpha-0.1.0+wf-py3-none-any.whl" in again.stdout
    assert "stack check of" not in again.stdout
    assert "stack simple/: check skipped: the channel is unchanged since the check of " \
        in again.stdout
    assert sorted((tmp_path / "cache" / "logs").glob("stack-*.log")) == logs
    assert not list((tmp_path / "cache" / "stack").glob("stack-*"))  # no early venv left
    forced = subprocess.run([sys.executable, "-m", "wheelforge", *argv], cwd=tmp_path,
                            env={**os.environ, "WHEELFORGE_STACK_CHECK": "always"},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=600)
    assert forced.returncode == 0, forced.stdout[-3000:]
    assert "stack check of simple/" in forced.stdout and "check skipped" not in forced.stdout
