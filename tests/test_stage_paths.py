"""The publisher never reads a path a stage names outside the stage (issue 52).

Confirmed on the old code: a stage's cell.json ``log`` field naming any file on the
publisher's machine (``/etc/passwd``) got that file copied into the served
``reports/logs/``.  Now the field must name a plain file inside the stage (no absolute
path, no ``..``, no symlink: opened with O_NOFOLLOW), else the stage is refused naming
the field, and nothing is published or copied.  The stage reader is fuzzed too: any
cell.json is a clear error or a record, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_wheel
from test_publisher_verifies import VERSION, _cell, _publish, _published, _refused
from wheelforge.errors import VerifyError, WheelforgeError
from wheelforge.nightly import stagecheck
from wheelforge.nightly.fanout import load_stage

SECRET = "root:x:0:0:the publisher's secret\n"


def _stage(root: Path, log: str | None, *, status: str = "built") -> Path:
    stage = root / "stages" / "cell-0"
    wheel = make_wheel(stage, {"demo/__init__.py": "X = 1\n"}, name="demo", version=VERSION)
    (stage / "build.log").write_text("the build's log\n")
    record: dict[str, Any] = {"schema": 1, "cell": _cell(), "status": status,
                              "host": "builder-a:/cache", "duration_s": 1.0, "log": log}
    if status == "built":
        record.update(wheel=wheel.name, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    else:
        wheel.unlink()
        record.update(error="it failed")
    (stage / "cell.json").write_text(json.dumps(record))
    return stage


def _copies(root: Path) -> list[str]:
    logs = root / "index" / "reports" / "logs"
    return sorted(p.read_text() for p in logs.iterdir()) if logs.is_dir() else []


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "publisher-secret"
    path.write_text(SECRET)
    return path


@pytest.mark.parametrize("status", ["built", "failed"])
@pytest.mark.parametrize(("form", "needle"), [
    ("absolute", "an absolute path: the publisher reads nothing outside the stage"),
    ("dotdot", "a path with '..': it leaves the stage"),
    ("subdir", "not a plain file name of the stage"),
])
def test_a_log_field_outside_the_stage_is_refused(tmp_path: Path, secret: Path, status: str,
                                                  form: str, needle: str) -> None:
    value = {"absolute": str(secret), "dotdot": "../../publisher-secret",
             "subdir": "sub/build.log"}[form]
    stage = _stage(tmp_path, value, status=status)
    res = _publish(tmp_path, stage)
    _refused(res, 8, f"its cell.json field 'log' names {value!r}", needle,
             "nothing was published")
    assert _published(tmp_path) == []
    assert SECRET not in _copies(tmp_path)
    assert not (tmp_path / "index" / "reports").exists()


def test_etc_passwd_is_never_copied(tmp_path: Path) -> None:
    stage = _stage(tmp_path, "/etc/passwd")
    _refused(_publish(tmp_path, stage), 8, "its cell.json field 'log' names '/etc/passwd'")
    assert _copies(tmp_path) == []


def test_a_symlinked_log_is_refused_not_followed(tmp_path: Path, secret: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    stage = _stage(tmp_path, "build.log")
    (stage / "build.log").unlink()
    os.symlink(secret, stage / "build.log")
    _refused(_publish(tmp_path, stage), 8, "build.log: a symlink")
    assert _published(tmp_path) == [] and _copies(tmp_path) == []
    # the field check alone refuses it too, and the open never follows a link swapped in
    # after the check (O_NOFOLLOW)
    with pytest.raises(VerifyError, match="field 'log' names 'build.log'") as err:
        stagecheck.stage_file(stage, "log", "build.log")
    assert "a symlink" in str(err.value.why)

    def checked_then_swapped(stage: Path, field: str, value: str) -> Path:
        return stage / value  # as if the check passed and the link came after it

    monkeypatch.setattr(stagecheck, "stage_file", checked_then_swapped)
    with pytest.raises(VerifyError, match="cannot open 'build.log'"):
        stagecheck.open_in_stage(stage, "log", "build.log")


def test_a_missing_log_is_refused(tmp_path: Path) -> None:
    stage = _stage(tmp_path, "build.log")
    (stage / "build.log").unlink()
    _refused(_publish(tmp_path, stage), 8, "field 'log' names 'build.log'",
             "the stage has no such file")


@pytest.mark.parametrize("status", ["built", "failed"])
def test_the_stages_own_log_is_copied_under_its_cells_name(tmp_path: Path,
                                                           status: str) -> None:
    stage = _stage(tmp_path, "build.log", status=status)
    res = _publish(tmp_path, stage)
    assert res.returncode == (0 if status == "built" else 1), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    logs = tmp_path / "index" / "reports" / "logs"
    copies = sorted(p.name for p in logs.iterdir())
    assert copies == [f"demo-1.0-cell0-{'ab' * 6}.log"]
    assert (logs / copies[0]).read_text() == "the build's log\n"
    page = (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()
    assert f'href="logs/{copies[0]}"' in page


# --------------------------------------------------------------------------- fuzz

_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
            | st.sampled_from([float("inf"), float("nan"), 10**400, "/etc/passwd", "..",
                               "build.log", "cell.json", ".", ""]))
_json = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20)
_FIELDS = ("schema", "cell", "status", "host", "duration_s", "wheel", "sha256", "channel",
           "cuda", "torch", "archs", "note", "error", "log_tail", "log", "builder_log")


def _record_strategy() -> st.SearchStrategy[dict[str, Any]]:
    good = {"schema": 1, "cell": _cell(), "status": "failed", "host": "h", "duration_s": 1.0}
    cell_fields = st.fixed_dictionaries({}, optional={k: _json for k in _cell()})
    return st.fixed_dictionaries({}, optional={k: _json for k in _FIELDS}).flatmap(
        lambda over: st.builds(lambda c: {**good, **over, **(
            {"cell": {**_cell(), **c}} if not isinstance(over.get("cell"), dict) else {})},
            cell_fields))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(record=_record_strategy(), log=st.none() | st.text(max_size=30))
def test_any_cell_json_is_a_record_or_a_clear_error(tmp_path: Path, record: dict[str, Any],
                                                   log: str | None) -> None:
    stage = tmp_path / "fuzz"
    stage.mkdir(exist_ok=True)
    (stage / "build.log").write_text("log\n")
    if log is not None:
        record = {**record, "log": log}
    (stage / "cell.json").write_text(json.dumps(record))
    try:
        rec = load_stage(stage)
    except WheelforgeError:
        return
    if rec.log is not None:  # accepted: a plain file of the stage
        assert rec.log == "build.log"


def test_a_deeply_nested_cell_json_is_a_clear_error(tmp_path: Path) -> None:
    stage = tmp_path / "deep"
    stage.mkdir()
    (stage / "cell.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(WheelforgeError, match="not a wheelforge plan or stage record"):
        load_stage(stage)
