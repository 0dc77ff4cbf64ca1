"""A second channel built for real (issue 54): causal-conv1d against PyPI's torch 2.11.0
(a CUDA 13.0 build), on this machine with its CUDA toolkit hidden (a mount namespace:
tests/hide_cuda.sh), so compiled by the managed toolkit's nvcc (PyPI's cuda-toolkit wheels),
published into its own channel, cu130-torch2.11, and stack-checked there.

Once per test run (a session fixture, one cold build: ~3 min on 2 cores): the recipe's
patches against torch 2.11's headers and ABI, its verify imports in the torch 2.11
environment, then the channel's wheels installed with their dependencies (torch 2.11.0
from the usual index) into a fresh venv and imported.  Nothing mocked: real torch, real
nvcc, real uv and pip.  The cache root is tests/upstream.py's (the user's managed
environments and verified sdists linked, an empty compile cache).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import upstream
from conftest import hidden_cuda_prefix, require_python311
from wheelforge import index
from wheelforge.index import health

pytestmark = pytest.mark.e2e

TORCH = "torch==2.11.0"
CHANNEL = "cu130-torch2.11"
PROJECT = "causal-conv1d"


@dataclass(frozen=True)
class ChannelBuild:
    index: Path
    output: str


@pytest.fixture(scope="session")
def torch211(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> ChannelBuild:
    require_python311()
    base = tmp_path_factory.mktemp("session-torch211")
    cache = upstream.cache_root(base / "cache", shared_cache)
    empty = base / "empty"
    empty.mkdir()
    # as on a machine without a CUDA toolkit (issue 54): /usr/local/cuda hidden, so
    # toolkit: auto takes PyPI's
    output = upstream.wheelforge_build(
        [PROJECT, "--torch", TORCH, "--arch", "12.0",
         "--index", str(base / "index"), "--cache-dir", str(cache), "--stack-check"],
        upstream.cold_env(), prefix=hidden_cuda_prefix(empty))
    return ChannelBuild(index=base / "index", output=output)


def test_built_with_torch_211_and_the_managed_toolkit(torch211: ChannelBuild) -> None:
    out = torch211.output
    assert "torch 2.11.0+cu130 (CUDA 13.0)" in out, out[-4000:]
    assert "CUDA toolkit managed cuda-toolkit 13.0." in out, out[-4000:]
    assert "toolkit: auto, and no system toolkit" in out, out[-4000:]
    assert "nvidia-cuda-nvcc 13.0." in out
    (record,) = index.load_records(torch211.index)
    assert (record.channel, record.torch, record.cuda, record.archs) == (
        CHANNEL, "2.11.0+cu130", "13.0", ("sm_120",))
    assert record.filename.startswith("causal_conv1d-1.7.0+cu130torch2.11sm120-cp311-")
    with zipfile.ZipFile(torch211.index / "files" / record.filename) as whl:
        metadata = whl.read("causal_conv1d-1.7.0+cu130torch2.11sm120.dist-info/METADATA")
        sboms = [n for n in whl.namelist() if n.endswith(".cdx.json")]
        sbom = json.loads(whl.read(sboms[0])) if sboms else {}
    # the wheel runs only with the torch it was built against
    assert "Requires-Dist: torch==2.11.*" in metadata.decode(), metadata.decode()
    assert "nvidia-cuda-nvcc" in json.dumps(sbom), "the managed toolkit is in the SBOM"


def test_published_into_its_channel_with_its_constraints(torch211: ChannelBuild) -> None:
    channel = torch211.index / CHANNEL
    page = json.loads((channel / "simple" / PROJECT / "index.json").read_text())
    assert [f["filename"] for f in page["files"]] == [index.load_records(torch211.index)[0]
                                                       .filename]
    constraints = (channel / "constraints.txt").read_text()
    assert "causal-conv1d==1.7.0+cu130torch2.11sm120" in constraints, constraints


def test_the_channels_stack_check_passed(torch211: ChannelBuild) -> None:
    """The build's stack gate: the channel's wheels with their dependencies (torch 2.11.0)
    installed into a fresh venv and imported together."""
    status = health.read_status(torch211.index, CHANNEL)
    assert status is not None, torch211.output[-4000:]
    assert status.state == "good", (status, torch211.output[-4000:])
