"""mamba-ssm-stable's ported binding loads and registers its ops under torch 2.11, 2.12 and
2.14 (CUDA 13), each in a venv of its own; on the CPU each op's own argument check refuses a
CPU tensor.

The binding is the real one (the pinned commit, mamba-ssm-stable's patches applied),
compiled with g++ against the managed torch's stable headers at target 2.10, and linked
with stand-in kernels (tests/packages/stablestub) instead of nvcc's: a real mamba-ssm-stable
build is 20-40 minutes on a 2-core runner, too much for the suite (docs/stable-abi.md
gives the real wheel's figures, loaded under the same three torches).  What this module
adds: one g++ compile of the binding (about 20 s here) and three venvs of torch, which uv
hard-links from its cache (the causal-conv1d stable test installs the same torches).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, uv_torch_venv
from test_stable_abi_mamba import compile_cxx, stable_tree, torch_include  # noqa: F401
from wheelforge.builder.artifact import abiaudit

pytestmark = [pytest.mark.e2e]

TORCHES = ["2.11.0", "2.12.1", "2.14.1"]  # every CUDA 13 torch the index serves
PROBE = Path(__file__).with_name("stable_abi_mamba_probe.py")
STUB = REPO / "tests" / "packages" / "stablestub" / "selective_scan_stub.cpp"
TARGET = "0x020a000000000000"  # TORCH_TARGET_VERSION 2.10, as the recipe's setup.py


@pytest.fixture(scope="module")
def binding(stable_tree: Path, shared_cache: Path,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """selective_scan_cuda.abi3.so: the ported binding and the stand-in kernels."""
    out = tmp_path_factory.mktemp("binding")
    port = stable_tree / "csrc" / "selective_scan" / "selective_scan.cpp"
    for source, obj in ((port, "selective_scan.o"), (STUB, "stub.o")):
        done = compile_cxx(stable_tree, shared_cache, TARGET, source, out / obj)
        assert done.returncode == 0, done.stderr[-3000:]
    cxx = shutil.which("g++") or pytest.fail("g++ is needed to link the binding")
    so = out / "pkg" / "selective_scan_cuda.abi3.so"
    so.parent.mkdir()
    # as torch's cpp_extension links it: libtorch by its soname (the torch that imports
    # it has loaded it), no rpath
    torch_lib = torch_include(shared_cache).parent / "lib"
    subprocess.run([cxx, "-shared", "-o", str(so), str(out / "selective_scan.o"),
                    str(out / "stub.o"), f"-L{torch_lib}", "-ltorch", "-ltorch_cpu", "-lc10"],
                   check=True, timeout=600)
    return so


def test_the_binding_links_only_stable_torch_symbols(binding: Path) -> None:
    wheel = binding.parent.parent / "selective_scan_cuda-1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(binding, binding.name)
    assert abiaudit.stable_abi_problems(wheel, ["torch>=2.10"]) == []
    audit = abiaudit.audit_wheel(wheel)
    assert str(audit.min_torch).startswith("2.10"), audit


@pytest.mark.parametrize("torch", TORCHES)
def test_the_binding_loads_under_every_cuda13_torch(binding: Path, torch: str,
                                                    tmp_path: Path, uv: str) -> None:
    py = uv_torch_venv(uv, tmp_path / f"torch{torch}", torch)
    probe = subprocess.run([str(py), str(PROBE)], text=True, capture_output=True,
                           timeout=600, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(binding.parent)})
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["torch"].startswith(torch) and "+cu130" in found["torch"], found
    assert found["module"] == str(binding), found
    assert found["ops"] == ["fwd", "bwd"]
    # the op's own checks, not the dispatcher's "no kernel for the CPU backend"
    assert "selective_scan_fwd: u must be a CUDA tensor" in found["fwd"], found
    assert "selective_scan_bwd: u must be a CUDA tensor" in found["bwd"], found
    assert "selective_scan_fwd: u must be float32, float16 or bfloat16" in found["dtype"], found
