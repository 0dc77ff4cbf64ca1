"""`wheelforge patch start --to` and the state file of the repository it makes
(issue 52): a link, a dangling link or a path under /proc as --to, and a forged
``.git/wheelforge.json`` entry with ``../``, each gave a traceback (exit 70); each is now
refused with what, why and what to do (exit 2), and nothing is made or written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import test_patchflow
from test_patchflow import snapshot, start, wf
from wheelforge.errors import ConfigError
from wheelforge.maintain import patchwork

project = test_patchflow.project  # the fixture: recipes/demo.yaml, its sdist and two patches


def refused(res: object, *needles: str) -> str:
    assert res.returncode == 2, res.stderr  # type: ignore[attr-defined]
    err: str = res.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and err.startswith("config error: ")
    assert "why:" in err and "fix:" in err
    for needle in needles:
        assert needle in err, err
    return err


def test_start_refuses_a_link_to_an_empty_directory(project: Path) -> None:
    (project / "elsewhere").mkdir()
    (project / "link").symlink_to("elsewhere")
    refused(start(project, "--to", "link"), "link is a symbolic link (to elsewhere)",
            "never follows a link")
    assert list((project / "elsewhere").iterdir()) == []


def test_start_refuses_a_dangling_link(project: Path) -> None:
    (project / "dangling").symlink_to("nowhere")
    refused(start(project, "--to", "dangling"), "dangling is a symbolic link (to nowhere, "
            "which does not exist)")
    assert not (project / "nowhere").exists()


@pytest.mark.parametrize("dest", ["/proc/self/cwd/work", "/proc/1/new", "/sys/wf"])
def test_start_refuses_a_kernel_file_system(project: Path, dest: str) -> None:
    refused(start(project, "--to", dest), f"{dest} is under /{dest.split('/')[1]}")
    assert not (project / "work").exists()  # /proc/self/cwd/work: the cwd of the moment


def test_start_into_a_directory_it_cannot_make_says_so(project: Path) -> None:
    (project / "file").write_text("a file, not a directory\n")
    refused(start(project, "--to", "file/sub"), "cannot make the patch repository at")


def test_export_refuses_a_forged_state_entry(project: Path) -> None:
    assert start(project).returncode == 0
    (project / "evil.patch").write_text("x")  # what a forged entry would read and publish
    state_file = project / "patch-work" / "demo" / ".git" / "wheelforge.json"
    state = json.loads(state_file.read_text())
    state["patches"][0].update(file="../../evil.patch", sha256=hashlib.sha256(b"x").hexdigest())
    state_file.write_text(json.dumps(state))
    before = snapshot(project)
    refused(wf("patch", "demo", "export", cwd=project),
            f"{state_file} is not a state 'wheelforge patch start' wrote",
            "patch entry 0 names '../../evil.patch', not a patch file name",
            "do not edit .git/wheelforge.json")
    assert snapshot(project) == before


@pytest.mark.parametrize("entry", [
    {"file": "/etc/evil.patch"}, {"file": "sub/x.patch"}, {"file": ".hidden.patch"},
    {"file": "x.diff"}, {"file": 7}, {"sha256": "not hex"}, {"key": None}, "a string"])
def test_read_state_refuses_an_entry_that_is_no_patch_of_the_series(
        tmp_path: Path, entry: object) -> None:
    good = {"file": "0001-fix.patch", "sha256": "0" * 64, "key": "1" * 64}
    state = {"recipe": "demo", "patches": [good, {**good, **entry} if isinstance(entry, dict)
                                           else entry]}
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "wheelforge.json").write_text(json.dumps(state))
    with pytest.raises(ConfigError) as info:
        patchwork.read_state(tmp_path)
    assert "patch entry 1" in info.value.why
    if isinstance(entry, dict) and isinstance(entry.get("file"), str):
        assert repr(entry["file"]) in info.value.why
    state["patches"] = [good]
    (tmp_path / ".git" / "wheelforge.json").write_text(json.dumps(state))
    assert patchwork.read_state(tmp_path)["patches"] == [good]


def test_export_refuses_a_state_nested_too_deep(project: Path) -> None:
    assert start(project).returncode == 0
    state_file = project / "patch-work" / "demo" / ".git" / "wheelforge.json"
    state_file.write_text("[" * 100_000 + "]" * 100_000)
    refused(wf("patch", "demo", "export", cwd=project), "nested too deep")
