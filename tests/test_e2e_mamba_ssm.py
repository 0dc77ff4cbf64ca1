"""The real thing for mamba-ssm: the pinned upstream commit from the offline bundle, its
companion causal-conv1d, real nvcc 13.0, the managed torch 2.14.1 (CUDA 13.0), the real
index, and a fresh venv that installs both from it with pip.

The build is the run's shared build of the shipped recipes (tests/upstream.py), which the
causal-conv1d and stack end-to-end tests check too: its companion causal-conv1d was
compiled for real by the first step and is already published when mamba-ssm is built; the
compile cache stays on for mamba-ssm (on a fresh machine it compiles for real, about 8
minutes on 2 cores; where `make build` or an earlier run compiled it, the cache serves it
and the wheel is still verified in full).
"""

from __future__ import annotations

import re
import subprocess
import venv
from pathlib import Path

import pytest

from conftest import MANYLINUX, built_wheel
from upstream import URL, StackBuild, bundle
from wheelforge.builder.artifact.verify import shared_object_archs
from wheelforge.wheel import read_metadata

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

LABEL = "cu130torch2.14sm120"
CC_VERSION = f"1.7.0+{LABEL}"
MAMBA_VERSION = f"2.3.2.post1+ge9594ce1c732.{LABEL}"
CC = f"causal_conv1d-{CC_VERSION}-cp311-cp311"  # + the manylinux tag
MAMBA = f"mamba_ssm-{MAMBA_VERSION}-cp311-cp311"


@pytest.fixture(scope="module")
def built(upstream_stack: StackBuild) -> Path:
    out = upstream_stack.output
    # the companion first (already published, for the same target); then mamba-ssm from the
    # mirror, never GitHub
    for stem in (CC, MAMBA):
        assert re.search(rf"published: {re.escape(stem)}-{MANYLINUX}\.whl  \[sm_120\]",
                         out), out
    assert out.index(f"published: {CC}") < out.index(f"published: {MAMBA}")
    assert f"git mirror     {URL} -> {bundle()}  [--git-mirror]" in out
    assert "cloning" not in out and "github.com/state-spaces/mamba.git" not in out
    return upstream_stack.index


def test_mamba_ssm_wheel_holds_sm120_only(built: Path) -> None:
    wheel = built_wheel(built / "files", MAMBA)
    per_so = shared_object_archs(wheel)
    assert [so.split(".")[0] for so, _ in per_so] == ["selective_scan_cuda"]
    for _, archs in per_so:
        assert archs.sass == {"sm_120"} and archs.ptx == frozenset()
    meta = read_metadata(wheel).decode().split("\n\n")[0]
    assert f"Version: {MAMBA_VERSION}" in meta
    requires = {ln.split(":", 1)[1].strip() for ln in meta.splitlines()
                if ln.startswith("Requires-Dist:")}
    assert "torch==2.14.*" in requires
    assert f"causal-conv1d=={CC_VERSION}" in requires  # the companion, exactly
    assert not any(r.startswith("ninja") for r in requires)
    # upstream's other runtime requirements are kept; the Mamba-3 stack is the extra
    # mamba3 (patch 0009), with the tvm-ffi bound tilelang 0.1.8 imports with
    for kept in ("triton>=3.5.0", "einops", "transformers"):
        assert kept in requires, (kept, requires)
    assert {r for r in requires if r.startswith(("tilelang", "apache-tvm-ffi", "quack"))} == {
        'tilelang==0.1.8; extra == "mamba3"', 'apache-tvm-ffi<0.1.12; extra == "mamba3"',
        'quack-kernels>=0.3.4; extra == "mamba3"'}
    assert "Provides-Extra: mamba3" in meta


def test_fresh_venv_installs_both_from_the_index(built: Path, tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    py = tmp_path / "venv" / "bin" / "python"
    simple = (built / "simple").as_uri()
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
         "--extra-index-url", simple, f"mamba-ssm=={MAMBA_VERSION}"],
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=3000)
    assert install.returncode == 0, install.stdout[-4000:]
    assert built_wheel(built / "files", MAMBA).name in install.stdout and \
        built_wheel(built / "files", CC).name in install.stdout  # both from the local index
    check = subprocess.run(
        [str(py), "-c", "import torch, selective_scan_cuda, causal_conv1d_cuda, mamba_ssm;"
         "print(selective_scan_cuda.__file__); print(torch.__version__)"],
        text=True, capture_output=True, timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "2.14.1" in check.stdout and str(tmp_path / "venv") in check.stdout
