"""Toolchain detection and preflight, with fake nvcc scripts (no real compiler needed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from wheelforge.arch import parse_arch_list
from wheelforge.builder.compiling.toolchain import check_archs, check_torch_cuda, find_cuda
from wheelforge.errors import ToolchainError


def fake_cuda(root: Path, release: str, codes: str = "sm_90 sm_100 sm_120") -> Path:
    home = root / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").write_text("")
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nif [ \"$1\" = --list-gpu-code ]; then for c in "
                    f"{codes}; do echo $c; done; exit 0; fi\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return home


def test_find_cuda_home(tmp_path: Path) -> None:
    home = fake_cuda(tmp_path, "13.0")
    cuda = find_cuda({"CUDA_HOME": str(home), "PATH": "/nonexistent"})
    assert (cuda.home, str(cuda.version), cuda.origin) == (home, "13.0", "$CUDA_HOME")


def test_find_cuda_on_path(tmp_path: Path) -> None:
    home = fake_cuda(tmp_path, "12.8")
    cuda = find_cuda({"PATH": str(home / "bin")})
    assert cuda.home == home and cuda.origin == "nvcc on PATH"


def test_find_cuda_follows_wrapper_script(tmp_path: Path) -> None:
    home = fake_cuda(tmp_path, "13.0")
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    (wrapper_dir / "nvcc").write_text(f'#!/bin/sh\nexec {home}/bin/nvcc "$@"\n')
    (wrapper_dir / "nvcc").chmod(0o755)
    cuda = find_cuda({"PATH": str(wrapper_dir)})
    assert cuda.home == home


def test_old_nvcc_fails_fast_for_blackwell(tmp_path: Path) -> None:
    cuda = find_cuda({"CUDA_HOME": str(fake_cuda(tmp_path, "12.4", "sm_90")), "PATH": ""})
    start = time.monotonic()
    with pytest.raises(ToolchainError) as exc:
        check_archs(cuda, parse_arch_list("12.0"))
    assert time.monotonic() - start < 1.0
    assert "12.0 needs CUDA 12.8 or newer, nvcc is 12.4" in exc.value.why
    assert "CUDA_HOME" in exc.value.fix


def test_arch_not_listed_by_nvcc(tmp_path: Path) -> None:
    cuda = find_cuda({"CUDA_HOME": str(fake_cuda(tmp_path, "13.0", "sm_100 sm_120")),
                      "PATH": ""})
    check_archs(cuda, parse_arch_list("10.0;12.0"))
    with pytest.raises(ToolchainError) as exc:
        check_archs(cuda, parse_arch_list("7.5"))
    assert "does not list sm_75 in --list-gpu-code" in exc.value.why


def test_torch_cuda_major_mismatch(tmp_path: Path) -> None:
    cuda = find_cuda({"CUDA_HOME": str(fake_cuda(tmp_path, "13.0")), "PATH": ""})
    with pytest.raises(ToolchainError, match="built for CUDA 12.8 but nvcc is CUDA 13.0"):
        check_torch_cuda(cuda, "12.8", "2.9.1+cu128")
    with pytest.raises(ToolchainError, match="CPU-only build"):
        check_torch_cuda(cuda, None, "2.14.1+cpu")
    check_torch_cuda(cuda, "13.0", "2.14.1")


@pytest.mark.unit
def test_nothing_found_lists_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("wheelforge.builder.compiling.toolchain.STANDARD_PREFIXES",
                        (str(tmp_path / "std"),))
    with pytest.raises(ToolchainError) as exc:
        find_cuda({"PATH": str(tmp_path / "bin")})
    assert exc.value.what == "nvcc, the CUDA compiler, was not found"
    assert f"standard prefix: {tmp_path / 'std'}" in exc.value.why


@pytest.mark.unit
@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
@pytest.mark.parametrize(("make", "why"), [
    (lambda p: p / "nope", "does not exist"),
    (lambda p: p, "has no bin/nvcc"),
])
def test_an_explicit_cuda_home_that_is_no_toolkit_fails_naming_it(
        tmp_path: Path, var: str, make: Callable[[Path], Path], why: str) -> None:
    """torch's builder uses $CUDA_HOME (else $CUDA_PATH) as given: never fall back silently
    to another toolkit (here a good one on PATH)."""
    good = fake_cuda(tmp_path, "13.0")
    bad = make(tmp_path)
    with pytest.raises(ToolchainError) as exc:
        find_cuda({var: str(bad), "PATH": str(good / "bin")})
    assert exc.value.what == f"{var}={bad} is not a CUDA toolkit"
    assert exc.value.why.startswith(f"{bad} {why}")
    assert f"point {var} at a toolkit" in exc.value.fix


def test_cuda_home_wins_over_cuda_path_as_in_torch(tmp_path: Path) -> None:
    good = fake_cuda(tmp_path, "13.0")
    found = find_cuda({"CUDA_HOME": str(good), "CUDA_PATH": str(tmp_path / "nope"), "PATH": ""})
    assert (found.home, found.origin) == (good, "$CUDA_HOME")


def test_sm_90a_needs_cuda_12(tmp_path: Path) -> None:
    cuda = find_cuda({"CUDA_HOME": str(fake_cuda(tmp_path, "11.8", "sm_90")), "PATH": ""})
    check_archs(cuda, parse_arch_list("9.0"))
    with pytest.raises(ToolchainError) as exc:
        check_archs(cuda, parse_arch_list("9.0a"))
    assert exc.value.why == "9.0a needs CUDA 12.0 or newer, nvcc is 11.8"
    assert exc.value.fix.startswith("install CUDA 12.0 or newer and point CUDA_HOME at it")
