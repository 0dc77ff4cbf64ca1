"""The CLI is the interface: exit codes and messages asserted exactly.

Run in the test's process (tests/cli_inprocess.py): these check only text and exit codes.
"""

from __future__ import annotations

from pathlib import Path

from cli_inprocess import Ran, run_wheelforge
from conftest import REPO, write_recipe


def wf(*args: str, cwd: Path = REPO) -> Ran:
    return run_wheelforge(*args, cwd=cwd)


def test_help_teaches() -> None:
    res = wf("--help")
    assert res.returncode == 0
    for cmd in ("build", "check", "inspect", "list", "show", "doctor", "test", "serve",
                "consumer-config", "yank"):
        assert f"  {cmd} " in res.stdout
    build = wf("build", "--help").stdout
    for opt in ("--arch", "--python", "--jobs", "--index", "--sources", "--timeout", "MAX_JOBS",
                "TORCH_CUDA_ARCH_LIST"):
        assert opt in build


def test_list_and_show() -> None:
    res = wf("list")
    assert res.stdout.splitlines() == [
        "causal-conv1d                1.7.0        extension",
        "causal-conv1d-stable         1.7.0        extension",
        "fla-core                     0.6.0        pure",
        "flash-attn                   2.8.3.post2  extension",
        "flash-linear-attention       0.6.0        pure",
        "mamba-ssm                    2.3.2.post1  extension",
        "mamba-ssm-stable             2.3.2.post1  extension",
    ]
    show = wf("show", "causal-conv1d").stdout
    assert "patch:     patches/causal-conv1d/0001-find-nvcc.patch" in show
    show = wf("show", "mamba-ssm").stdout
    assert ("           after release v2.3.2.post1 (a14b1dff0454a3bc27d9eb31355dc01e4b2490ec); "
            "label ge9594ce1c732") in show
    assert "companion: causal-conv1d (built for the same target, required exactly)" in show


def test_check_reports_every_problem(tmp_path: Path) -> None:
    write_recipe(tmp_path, "a", "format: 1\nname: a\nversion: '1'\nsources: []\nbuild: {kind: x}\n")
    write_recipe(tmp_path, "b", "format: 1\nname: b\nversoin: '1'\n")
    res = wf("check", "--recipes", str(tmp_path / "recipes"), cwd=tmp_path)
    assert res.returncode == 3
    assert "recipe error: 2 recipe(s) have problems" in res.stderr
    assert "a.yaml: sources: is required" in res.stderr
    assert "a.yaml: build.kind: must be one of extension, pure, got 'x'" in res.stderr
    assert "b.yaml: versoin: unknown key; did you mean 'version'?" in res.stderr


def test_unknown_recipe() -> None:
    res = wf("build", "causal-conv1", "--index", "/nonexistent")
    assert res.returncode == 3
    assert "no recipe named 'causal-conv1'" in res.stderr
    assert "did you mean 'causal-conv1d'?" in res.stderr


def test_bad_arch_is_a_config_error() -> None:
    res = wf("build", "causal-conv1d", "--arch", "sm_120")
    assert res.returncode == 2
    assert "config error: 'sm_120' is not a CUDA architecture" in res.stderr


def test_inspect_not_a_wheel(tmp_path: Path) -> None:
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    res = wf("inspect", str(bad))
    assert res.returncode != 0 and "Traceback" not in res.stderr
