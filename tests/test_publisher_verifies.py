"""The publisher trusts no builder: `wheelforge nightly publish` verifies every stage again.

Stages are written here as a builder writes them (cell.json beside the wheel), then
changed the ways a broken or hostile builder or artifact store would: a member changed
with cell.json's sha256 updated to match, a symlink to a wheel outside the stage, a
truncated zip, a malformed file name (builders that disagree under --require-reproduced:
tests/test_stage_signatures.py).
Each is refused through the real command, with nothing published and no traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel, require_tool
from test_nightly import wheelforge
from wheelforge import index
from wheelforge.builder.compiling.backend import check_wheel_name
from wheelforge.errors import VerifyError
from wheelforge.nightly.stagecheck import verify_stage_wheel
from wheelforge.wheel import check_wheel, integrity_problems

KEY = "ab" * 32
VERSION = "1.0+wf"


def _cell(archs: str | None = None, **rules: list[str]) -> dict[str, Any]:
    return {"id": 0, "recipe": "demo", "version": "1.0", "python": None,
            "torch": "torch==2.14.1", "cuda": "13.0", "pip_args": [], "archs": archs,
            "build_key": KEY, "toolchain": {"python": "py3"}, **rules}


def _plan(root: Path, **rules: list[str]) -> Path:
    path = root / "plan.json"
    path.write_text(json.dumps({"schema": 1, "created": "2026-12-01T00:00:00Z",
                                "config": "w.yaml", "index": str(root / "index"),
                                "cells": [_cell(**rules)], "done": []}))
    return path


def _stage(root: Path, name: str, *, host: str = "builder-a:/cache",
           payload: str = "VALUE = 1\n") -> tuple[Path, Path]:
    """A built stage of the plan's one cell, as `nightly run` writes it."""
    stage = root / "stages" / name
    wheel = make_wheel(stage, {"demo/__init__.py": payload}, name="demo", version=VERSION)
    _write_record(stage, wheel, host)
    return stage, wheel


def _write_record(stage: Path, wheel: Path, host: str = "builder-a:/cache") -> None:
    (stage / "cell.json").write_text(json.dumps({
        "schema": 1, "cell": _cell(), "status": "built", "host": host, "duration_s": 1.0,
        "wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}))


def _publish(root: Path, *args: str | Path) -> Any:
    return wheelforge("nightly", "publish", "--plan", _plan(root), "--index", root / "index",
                      "--cache-dir", root / "cache", *args, cwd=root)


def _published(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "index").rglob("*.whl"))


def _tamper(wheel: Path, member: str, data: bytes) -> None:
    """Rewrite one member of ``wheel``, leaving RECORD as it was."""
    with zipfile.ZipFile(wheel) as zf:
        entries = [(zi, zf.read(zi)) for zi in zf.infolist()]
    with zipfile.ZipFile(wheel, "w") as zf:
        for zi, old in entries:
            zf.writestr(zi, data if zi.filename == member else old)


def _refused(res: Any, code: int, *needles: str) -> None:
    assert res.returncode == code, res.stderr[-3000:]
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in res.stderr, res.stderr[-3000:]


def test_an_honest_stage_is_published(tmp_path: Path) -> None:
    stage, wheel = _stage(tmp_path, "cell-0")
    res = _publish(tmp_path, stage)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _published(tmp_path) == [wheel.name]


def test_a_tampered_wheel_with_a_matching_record_is_refused(tmp_path: Path) -> None:
    stage, wheel = _stage(tmp_path, "cell-0")
    _tamper(wheel, "demo/__init__.py", b"import os; os.system('id')\n")
    _write_record(stage, wheel)  # cell.json's sha256 updated to match the changed file
    res = _publish(tmp_path, stage)
    _refused(res, 8, "failed the publisher's verification",
             "demo/__init__.py: hash in RECORD does not match the file",
             "nothing was published")
    assert _published(tmp_path) == []


def test_the_plans_content_rules_are_applied_to_the_staged_wheel(tmp_path: Path) -> None:
    """A builder whose wheel holds what the recipe's verify.top-level / verify.excluded
    refuse (flash-attn's `hopper` and `flash_attn/cute`) is refused by the publisher from
    the plan's copy of the rules, though its RECORD is honest."""
    stage = tmp_path / "stages" / "cell-0"
    wheel = make_wheel(stage, {"demo/__init__.py": "X = 1\n", "demo/cute/k.py": "Y = 2\n",
                               "hopper/__init__.py": ""}, name="demo", version=VERSION)
    _write_record(stage, wheel)
    plan = _plan(tmp_path, top_level=["demo"], excluded=["demo/cute"])
    res = wheelforge("nightly", "publish", "--plan", plan, "--index", tmp_path / "index",
                     "--cache-dir", tmp_path / "cache", stage, cwd=tmp_path)
    _refused(res, 8, "failed the publisher's verification (2 problem(s))",
             "top-level module(s) or package(s) the recipe does not ship: hopper",
             "demo/cute is in the wheel (1 file(s), e.g. demo/cute/k.py)")
    assert _published(tmp_path) == []
    # a plan written before the rules were recorded still loads (no rules: not checked)
    assert _publish(tmp_path, stage).returncode == 0


def test_a_symlinked_wheel_is_refused_not_followed(tmp_path: Path) -> None:
    outside = make_wheel(tmp_path / "elsewhere", {"demo/__init__.py": "X = 1\n"},
                         name="demo", version=VERSION)
    stage = tmp_path / "stages" / "cell-0"
    stage.mkdir(parents=True)
    os.symlink(outside, stage / outside.name)
    _write_record(stage, outside)
    res = _publish(tmp_path, stage)
    _refused(res, 8, "holds links or special files", f"{outside.name}: a symlink (to {outside})")
    assert _published(tmp_path) == []


def test_a_corrupted_zip_is_refused(tmp_path: Path) -> None:
    stage, wheel = _stage(tmp_path, "cell-0")
    wheel.write_bytes(wheel.read_bytes()[:-40])
    _write_record(stage, wheel)
    res = _publish(tmp_path, stage)
    _refused(res, 8, f"cannot read {wheel.name}", "BadZipFile")
    assert _published(tmp_path) == []


def test_a_malformed_wheel_name_is_a_verification_error(tmp_path: Path) -> None:
    stage, wheel = _stage(tmp_path, "cell-0")
    bad = wheel.rename(stage / "demo-1.0+wf-py3-none.whl")
    _write_record(stage, bad)
    res = _publish(tmp_path, stage)
    _refused(res, 8, "not a valid wheel file name")
    assert _published(tmp_path) == []
    with pytest.raises(VerifyError, match="not a valid wheel file name"):
        check_wheel_name("demo-1.0-py3-none.whl", "demo")
    check_wheel_name(wheel.name, "demo")


# --require-reproduced counts builders by their verified SSH signatures, not by the
# stages' host fields: tests/test_stage_signatures.py


@pytest.mark.unit
def test_the_index_verifies_what_any_caller_publishes(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", {"demo/__init__.py": "X = 1\n"}, name="demo")
    _tamper(wheel, "demo/__init__.py", b"X = 2\n")
    with pytest.raises(VerifyError, match="failed verification") as err:
        index.publish(tmp_path / "index", wheel, channel=None, cuda=None, torch=None,
                      archs=(), build_key=None)
    assert "demo/__init__.py: hash in RECORD does not match the file" in str(err.value.why)
    assert not (tmp_path / "index" / "files").exists() or \
        not list((tmp_path / "index" / "files").glob("*.whl"))


@pytest.mark.unit
@pytest.mark.parametrize(("change", "needle"), [
    ({"wheel": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n"},
     "WHEEL says Tag cp311-cp311-linux_x86_64, the file name says py3-none-any"),
    ({"wheel": b"Wheel-Version: 1.0\n"}, "has no Tag line"),
    ({"metadata": b"Metadata-Version: 2.1\nName: other\nVersion: 1.0\n\n"},
     "METADATA Name is 'other'"),
    ({"metadata": b"Metadata-Version: 2.1\nName: demo\nVersion: 2.0\n\n"},
     "METADATA Version is '2.0'"),
    ({"libs": b"\x7fELF"}, "demo.libs/: a directory of grafted libraries"),
])
def test_integrity_names_each_inconsistency(tmp_path: Path, change: dict[str, bytes],
                                            needle: str) -> None:
    files: dict[str, bytes | str] = {"demo/__init__.py": "X = 1\n"}
    if "libs" in change:
        files["demo.libs/libfoo.so"] = change["libs"]
    wheel = make_wheel(tmp_path, files, name="demo")
    member = {"wheel": "demo-1.0.dist-info/WHEEL",
              "metadata": "demo-1.0.dist-info/METADATA"}
    for key, data in change.items():
        if key in member:
            _tamper(wheel, member[key], data)
    found = integrity_problems(wheel)
    assert any(needle in p for p in found), found
    with pytest.raises(VerifyError, match="failed verification"):
        check_wheel(wheel)


def tiny_so(tmp_path: Path) -> bytes:
    """A real shared object without device code, compiled with gcc."""
    import subprocess

    gcc = require_tool("gcc")
    src = tmp_path / "tiny.c"
    src.write_text("int tiny(void) { return 42; }\n")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp_path / "tiny.so", src], check=True)
    return (tmp_path / "tiny.so").read_bytes()


def test_an_extension_cell_without_cuda_code_fails_the_sass_check(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": tiny_so(tmp_path)}, name="demo",
                       tag="cp311-cp311-linux_x86_64")
    with pytest.raises(VerifyError) as err:
        verify_stage_wheel(wheel.parent, wheel.name, "12.0")
    assert "no shared object in the wheel holds CUDA code" in str(err.value.why)
    with pytest.raises(VerifyError, match="failed the publisher's verification") as err:
        verify_stage_wheel(wheel.parent, wheel.name, None)  # a pure cell holds no .so
    assert "a pure wheel holds shared objects: demo/_C.so" in str(err.value.why)
