"""The doctor's checks, against fake nvcc, gcc, ninja, git and python scripts (no real tools)."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from wheelforge.arch import parse_arch_list
from wheelforge.builder.checks.doctor import Finding, failures, render, run_checks

GiB = 2**30


class Usage(NamedTuple):
    total: int
    used: int
    free: int

ALL_SASS = "sm_75 sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_103 sm_110 sm_120 sm_121"


def script(path: Path, body: str) -> Path:
    """A tiny executable; only shell builtins, since PATH holds nothing but the fakes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def fake_cuda(root: Path, release: str, codes: str = ALL_SASS, host_config: str = "") -> Path:
    home = root / f"cuda-{release}"
    (home / "include" / "crt").mkdir(parents=True)
    (home / "include" / "cuda_runtime.h").write_text("")
    if host_config:
        (home / "include" / "crt" / "host_config.h").write_text(host_config)
    script(home / "bin" / "nvcc",
           'if [ "$1" = --list-gpu-code ]; then for c in ' + codes + '; do echo $c; done; '
           f"exit 0; fi\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    return home


def fake_gcc(bin_dir: Path, version: str, name: str = "gcc") -> Path:
    return script(bin_dir / name, f"echo '{name} (GCC) {version}'\n"
                  "echo 'Copyright (C) 2025 Free Software Foundation, Inc.'\n")


def fake_clang(bin_dir: Path, version: str) -> Path:
    return script(bin_dir / "clang", f"echo 'Ubuntu clang version {version} (1ubuntu1)'\n"
                  "echo 'Target: x86_64-pc-linux-gnu'\n")


def fake_python(path: Path, torch: str | None = "2.9.1+cu128", torch_cuda: str | None = "12.8",
                torch_error: str | None = None) -> Path:
    """Prints what buildenv's probe prints (buildenv._PROBE), whatever it is asked."""
    info: dict[str, Any] = {
        "python": str(path), "version": "3.12.3", "tag": "cp312",
        "dists": {"torch": (torch or "").split("+")[0]} if torch else {},
        "torch": torch, "torch_cuda": torch_cuda,
        "torch_error": torch_error,
    }
    return script(path, f"printf '%s\\n' {shlex.quote(json.dumps(info))}\n")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """gcc 12, ninja and git: a machine where everything but CUDA is fine."""
    d = tmp_path / "bin"
    fake_gcc(d, "12.2.0")
    script(d / "ninja", "echo 1.13.1\n")
    script(d / "objcopy", "echo 'GNU objcopy (GNU Binutils for Debian) 2.40'\n")
    script(d / "git", "echo 'git version 2.39.5'\n")
    return d


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real /usr/local/cuda; plenty of disk and memory unless a test says otherwise."""
    monkeypatch.setattr("wheelforge.builder.compiling.toolchain.STANDARD_PREFIXES",
                        (str(tmp_path / "no-cuda"),))
    set_disk(monkeypatch, free_gib=200)
    set_memory(monkeypatch, gib=128, cores=16)


def set_disk(monkeypatch: pytest.MonkeyPatch, free_gib: float,
             seen: list[str] | None = None) -> None:
    def disk_usage(path: str | Path) -> Any:
        if seen is not None:
            seen.append(str(path))
        return Usage(1000 * GiB, 1000 * GiB - int(free_gib * GiB), int(free_gib * GiB))
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)


def set_memory(monkeypatch: pytest.MonkeyPatch, gib: float, cores: int = 16) -> None:
    monkeypatch.setattr("wheelforge.builder.config.memory_available_gib", lambda: gib)
    monkeypatch.setattr("wheelforge.builder.config.cpu_count", lambda: cores)


def check(tmp_path: Path, environ: dict[str, str], *, arch: str = "12.0",
          python: Path | None = None, jobs: int | None = 8,
          toolkit: str = "auto") -> list[Finding]:
    return run_checks(archs=parse_arch_list(arch), python=python, work_dir=tmp_path / "work",
                      cache_dir=tmp_path / "cache", jobs=jobs, environ=environ,
                      toolkit=toolkit)


def one(findings: list[Finding], name: str) -> Finding:
    (found,) = [f for f in findings if f.check == name]
    return found


def env(bin_dir: Path, home: Path | None = None, **extra: str) -> dict[str, str]:
    out = {"PATH": str(bin_dir), **extra}
    if home is not None:
        out["CUDA_HOME"] = str(home)
    return out


# -- nvcc and architectures --------------------------------------------------------------------

def test_old_nvcc_fails_for_blackwell_in_well_under_a_second(tmp_path: Path,
                                                              bin_dir: Path) -> None:
    home = fake_cuda(tmp_path, "12.4", "sm_75 sm_80 sm_86 sm_89 sm_90")
    start = time.monotonic()
    findings = check(tmp_path, env(bin_dir, home))
    assert time.monotonic() - start < 1.0
    arch = one(findings, "arch 12.0")
    assert (arch.status, arch.detail) == ("FAIL", "needs CUDA 12.8+, nvcc is 12.4")
    assert "CUDA_HOME" in arch.fix and "drop 12.0 from --arch" in arch.fix
    assert failures(findings) == [arch]
    assert f"FAIL  arch 12.0    needs CUDA 12.8+, nvcc is 12.4  -> fix: {arch.fix}" in \
        render(findings).splitlines()


def test_cuda_13_compiles_blackwell(tmp_path: Path, bin_dir: Path) -> None:
    home = fake_cuda(tmp_path, "13.0")
    findings = check(tmp_path, env(bin_dir, home), arch="10.0;12.0")
    assert failures(findings) == []
    assert [f.status for f in findings if f.check.startswith("arch")] == ["OK", "OK"]
    assert f"OK    nvcc         13.0 at {home}/bin/nvcc ($CUDA_HOME)" in render(findings)


def test_arch_missing_from_list_gpu_code(tmp_path: Path, bin_dir: Path) -> None:
    home = fake_cuda(tmp_path, "13.0", "sm_90 sm_100")
    arch = one(check(tmp_path, env(bin_dir, home)), "arch 12.0")
    assert arch.status == "FAIL" and "does not list sm_120 in --list-gpu-code" in arch.detail


def test_no_nvcc_is_one_failure_and_archs_are_not_checked(tmp_path: Path, bin_dir: Path) -> None:
    findings = check(tmp_path, env(bin_dir), arch="9.0;12.0", toolkit="system")
    nvcc = one(findings, "nvcc")
    assert nvcc.status == "FAIL" and "nvcc, the CUDA compiler, was not found" in nvcc.detail
    assert "CUDA_HOME" in nvcc.fix
    assert [f.status for f in findings if f.check.startswith("arch")] == ["SKIP", "SKIP"]
    assert failures(findings) == [nvcc]


# -- torch -------------------------------------------------------------------------------------

def test_torch_cuda_major_differs_from_nvcc(tmp_path: Path, bin_dir: Path) -> None:
    home = fake_cuda(tmp_path, "13.0")
    python = fake_python(tmp_path / "venv" / "bin" / "python", "2.9.1+cu128", "12.8")
    findings = check(tmp_path, env(bin_dir, home), python=python)
    assert one(findings, "torch").status == "OK"
    mismatch = one(findings, "torch cuda")
    assert (mismatch.status, mismatch.detail) == (
        "FAIL", "torch 2.9.1+cu128 is built for CUDA 12.8, nvcc is 13.0")
    assert "CUDA 12.x toolkit" in mismatch.fix


def test_torch_cuda_major_matches(tmp_path: Path, bin_dir: Path) -> None:
    home = fake_cuda(tmp_path, "13.0")
    python = fake_python(tmp_path / "venv" / "bin" / "python", "2.9.1+cu130", "13.0")
    findings = check(tmp_path, env(bin_dir, home), python=python)
    assert one(findings, "torch cuda").status == "OK"
    assert one(findings, "torch").detail == f"torch 2.9.1+cu130 (CUDA 13.0) in {python}"


def test_cpu_only_torch(tmp_path: Path, bin_dir: Path) -> None:
    python = fake_python(tmp_path / "venv" / "bin" / "python", "2.9.1+cpu", None)
    found = one(check(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), python=python),
                "torch cuda")
    assert found.status == "FAIL" and "CPU-only" in found.detail


def test_torch_not_importable(tmp_path: Path, bin_dir: Path) -> None:
    python = fake_python(tmp_path / "venv" / "bin" / "python", None, None,
                         "ModuleNotFoundError: No module named 'torch'")
    findings = check(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), python=python)
    torch = one(findings, "torch")
    assert torch.status == "FAIL" and "No module named 'torch'" in torch.detail
    assert "pip install torch" in torch.fix
    assert not [f for f in findings if f.check == "torch cuda"]


def managed(tmp_path: Path, environ: dict[str, str], spec: str | None,
            pip_args: tuple[str, ...] = (), base: Path | None = None) -> list[Finding]:
    return run_checks(archs=parse_arch_list("12.0"), python=None, work_dir=tmp_path / "work",
                      cache_dir=tmp_path / "cache", jobs=8, environ=environ,
                      managed_torch=spec, managed_torch_pip_args=pip_args,
                      managed_python=base or Path(sys.executable))


@pytest.mark.parametrize(("spec", "pip_args", "nvcc", "status", "detail"), [
    ("torch==2.14.1", (), "13.0", "OK",
     "torch CUDA 13.0 (PyPI's torch 2.14 wheels), nvcc 13.0: same major"),
    ("torch==2.14.1", (), "12.8", "FAIL", "torch==2.14.1 is built for CUDA 13.0, nvcc is 12.8"),
    ("torch==2.9.1", ("--index-url", "https://download.pytorch.org/whl/cu128"), "13.0", "FAIL",
     "torch==2.9.1 is built for CUDA 12.8, nvcc is 13.0"),
    ("torch==2.9.1+cu128", (), "12.9", "OK",
     "torch CUDA 12.8 (its local version +cu128), nvcc 12.9: same major"),
    ("torch==2.14.1", ("--index-url", "https://download.pytorch.org/whl/cpu"), "13.0", "FAIL",
     "torch==2.14.1 from the index https://download.pytorch.org/whl/cpu is a CPU-only "
     "build"),
    ("torch>=2.10", (), "13.0", "SKIP",
     "cannot tell the CUDA of torch>=2.10 before the environment exists"),
])
def test_without_python_the_managed_torch_is_judged_by_its_requirement(
        tmp_path: Path, bin_dir: Path, spec: str, pip_args: tuple[str, ...], nvcc: str,
        status: str, detail: str) -> None:
    """No environment yet: the torch line says what it will have, and torch's CUDA is
    checked against nvcc from the requirement, or SKIP; never OK for a check not run."""
    findings = managed(tmp_path, env(bin_dir, fake_cuda(tmp_path, nvcc)), spec, pip_args)
    torch = one(findings, "torch")
    assert torch.status == "OK"
    assert torch.detail.startswith(f"the managed environment (not created yet) will have {spec}")
    cuda = one(findings, "torch cuda")
    assert (cuda.status, cuda.detail) == (status, detail)


def test_without_python_an_existing_managed_env_is_inspected(tmp_path: Path,
                                                             bin_dir: Path) -> None:
    from wheelforge.builder.env.buildenv import BASE_REQUIREMENTS, MARKER, env_key

    base = Path(sys.executable)
    root = tmp_path / "cache" / "envs" / env_key(base, "torch==2.9.1", BASE_REQUIREMENTS, ())
    fake_python(root / "bin" / "python")
    (root / MARKER).write_text("{}")
    findings = managed(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), "torch==2.9.1")
    torch = one(findings, "torch")
    assert (torch.status, torch.detail) == (
        "OK", f"torch 2.9.1+cu128 (CUDA 12.8) in the managed environment {root}")
    assert one(findings, "torch cuda").status == "FAIL"


def test_no_torch_requirement_is_skip_not_ok(tmp_path: Path, bin_dir: Path) -> None:
    torch = one(managed(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), None), "torch")
    assert torch.status == "SKIP"


# -- host compiler -----------------------------------------------------------------------------

@pytest.mark.parametrize(("cuda", "compiler", "version", "status", "part"), [
    ("13.0", "gcc", "16.1.0", "FAIL", "gcc 16.1.0 at {bin}/gcc; CUDA 13.0 accepts gcc <= 15"),
    ("13.0", "gcc", "15.2.0", "OK", "CUDA 13.0 accepts gcc <= 15 (CUDA 13.0)"),
    ("12.8", "gcc", "15.2.0", "FAIL", "CUDA 12.8 accepts gcc <= 14"),
    ("12.4", "gcc", "13.3.0", "OK", "accepts gcc <= 13"),
    ("13.1", "gcc", "16.1.0", "WARN", "newer than wheelforge's table, whose CUDA 13.0"),
    ("13.0", "clang", "21.1.0", "FAIL", "CUDA 13.0 accepts clang <= 20"),
    ("12.4", "clang", "17.0.6", "WARN", "no known clang bound for CUDA 12.4"),
])
def test_host_compiler_against_the_table(tmp_path: Path, cuda: str, compiler: str,
                                         version: str, status: str, part: str) -> None:
    bins = tmp_path / "bin"
    if compiler == "gcc":
        fake_gcc(bins, version)
        extra = {}
    else:
        extra = {"CC": str(fake_clang(bins, version))}
    found = one(check(tmp_path, env(bins, fake_cuda(tmp_path, cuda), **extra)), "compiler")
    assert found.status == status
    assert part.format(bin=bins) in found.detail
    if status != "OK":
        assert found.fix


def test_the_toolkits_host_config_wins_over_the_table(tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    fake_gcc(bins, "16.1.0")
    home = fake_cuda(tmp_path, "13.0", host_config="#if __GNUC__ > 16\n#error -- unsupported\n")
    found = one(check(tmp_path, env(bins, home)), "compiler")
    assert found.status == "OK" and "accepts gcc <= 16 (its host_config.h)" in found.detail


def test_cc_selects_the_host_compiler(tmp_path: Path, bin_dir: Path) -> None:
    gcc16 = fake_gcc(tmp_path / "opt", "16.1.0", name="gcc-16")
    found = one(check(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0"), CC=str(gcc16))),
                "compiler")
    assert found.status == "FAIL"
    assert found.detail.startswith(f"gcc 16.1.0 at {gcc16} ($CC)")
    assert "CC=gcc-15 CXX=g++-15" in found.fix


def test_no_host_compiler(tmp_path: Path) -> None:
    found = one(check(tmp_path, env(tmp_path / "empty", fake_cuda(tmp_path, "13.0"))),
                "compiler")
    assert found.status == "FAIL" and "'gcc' (default) was not found" in found.detail


# -- ninja and git -----------------------------------------------------------------------------

def test_ninja_in_the_python_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    python = fake_python(venv / "python", "2.9.1+cu130", "13.0")
    script(venv / "ninja", "echo 1.11.1.git.kitware.jobserver-1\n")
    found = one(check(tmp_path, env(tmp_path / "empty"), python=python), "ninja")
    assert (found.status, found.detail) == (
        "OK", f"1.11.1.git.kitware.jobserver-1 at {venv / 'ninja'}")


def test_no_ninja(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "venv" / "bin" / "python", "2.9.1+cu130", "13.0")
    found = one(check(tmp_path, env(tmp_path / "empty"), python=python), "ninja")
    assert found.status == "WARN" and found.fix == f"{python} -m pip install ninja"
    managed = one(check(tmp_path, env(tmp_path / "empty")), "ninja")
    assert managed.status == "SKIP" and "the first build creates installs it" in managed.detail


def test_objcopy_found_or_missing(tmp_path: Path, bin_dir: Path) -> None:
    found = one(check(tmp_path, env(bin_dir)), "objcopy")
    assert (found.status, found.detail) == (
        "OK", f"GNU objcopy (GNU Binutils for Debian) 2.40 at {bin_dir / 'objcopy'}")
    # only the opt-in nvcc step runner needs it
    off = one(check(tmp_path, env(tmp_path / "empty")), "objcopy")
    assert (off.status, off.detail) == ("SKIP", "not on PATH: only the nvcc step runner needs "
                                                "it (WHEELFORGE_NVCC_STEPS=1), and it is off")
    missing = one(check(tmp_path, env(tmp_path / "empty", WHEELFORGE_NVCC_STEPS="1")),
                  "objcopy")
    assert missing.status == "WARN" and missing.detail.startswith("not on PATH: each CUDA "
                                                                  "unit's host compile runs")
    assert missing.fix == "install binutils (e.g. apt install binutils)"


def test_ninja_of_an_existing_managed_env_is_checked(tmp_path: Path) -> None:
    from wheelforge.builder.env.buildenv import BASE_REQUIREMENTS, MARKER, env_key

    root = tmp_path / "cache" / "envs" / env_key(Path(sys.executable), "torch==2.9.1",
                                                 BASE_REQUIREMENTS, ())
    fake_python(root / "bin" / "python")
    script(root / "bin" / "ninja", "echo 1.13.2\n")
    (root / MARKER).write_text("{}")
    found = one(managed(tmp_path, env(tmp_path / "empty"), "torch==2.9.1"), "ninja")
    assert (found.status, found.detail) == ("OK", f"1.13.2 at {root / 'bin' / 'ninja'}")


def test_git(tmp_path: Path, bin_dir: Path) -> None:
    found = one(check(tmp_path, env(bin_dir)), "git")
    assert (found.status, found.detail) == ("OK", f"git version 2.39.5 at {bin_dir / 'git'}")
    missing = one(check(tmp_path, env(tmp_path / "empty")), "git")
    assert missing.status == "FAIL" and "git apply" in missing.fix


# -- disk and memory ---------------------------------------------------------------------------

@pytest.mark.parametrize(("free", "status"), [(200, "OK"), (19.5, "WARN"), (4.9, "FAIL")])
def test_free_disk(tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch,
                   free: float, status: str) -> None:
    set_disk(monkeypatch, free)
    findings = check(tmp_path, env(bin_dir))
    assert [one(findings, n).status for n in ("disk work", "disk cache", "disk build")] == \
        [status, status, status]
    if status != "OK":
        assert "--work-dir" in one(findings, "disk work").fix
        assert "--cache-dir" in one(findings, "disk cache").fix
        assert "fixed path" in one(findings, "disk build").fix


def test_disk_is_measured_at_the_nearest_existing_parent(tmp_path: Path, bin_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    set_disk(monkeypatch, 50, seen)
    (tmp_path / "cache").mkdir()
    findings = run_checks(archs=(), python=None, work_dir=tmp_path / "a" / "b" / "work",
                          cache_dir=tmp_path / "cache", jobs=1, environ=env(bin_dir),
                          build_root=tmp_path / "cache" / "build-root")
    assert seen == [str(tmp_path), str(tmp_path / "cache"), str(tmp_path / "cache")]
    assert one(findings, "disk work").detail == (
        f"50.0 GiB free at {tmp_path} (for {tmp_path / 'a' / 'b' / 'work'})")
    assert one(findings, "disk cache").detail == f"50.0 GiB free at {tmp_path / 'cache'}"
    assert one(findings, "disk build").detail == (  # the fixed build path: no option moves it
        f"50.0 GiB free at {tmp_path / 'cache'} (for {tmp_path / 'cache' / 'build-root'})")


@pytest.mark.parametrize(("mem", "jobs", "status", "fix"), [
    (128, 16, "OK", ""),
    (16, 8, "WARN", "use --jobs 4 (about 4 GiB per nvcc job)"),
    (3, 1, "WARN", "free memory or add swap: one nvcc job can take about 4 GiB"),
])
def test_memory_per_job(tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch,
                        mem: float, jobs: int, status: str, fix: str) -> None:
    set_memory(monkeypatch, mem)
    found = one(check(tmp_path, env(bin_dir), jobs=jobs), "memory")
    assert (found.status, found.fix) == (status, fix)
    assert f"{jobs} jobs (--jobs)" in found.detail


@pytest.mark.parametrize(("extra", "detail"), [
    ({}, "24.0 GiB available, 6 jobs (auto): 4.0 GiB per job"),
    ({"MAX_JOBS": "12"}, "24.0 GiB available, 12 jobs (MAX_JOBS): 2.0 GiB per job, below 4 GiB"),
])
def test_memory_jobs_when_not_given(tmp_path: Path, bin_dir: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    extra: dict[str, str], detail: str) -> None:
    set_memory(monkeypatch, 24, cores=32)
    found = one(check(tmp_path, {**env(bin_dir), **extra}, jobs=None), "memory")
    assert found.detail == detail


def test_unreadable_memory_warns(tmp_path: Path, bin_dir: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    set_memory(monkeypatch, 0.0)
    assert one(check(tmp_path, env(bin_dir)), "memory").status == "WARN"


# -- the report --------------------------------------------------------------------------------

def test_every_check_is_reported_in_order(tmp_path: Path, bin_dir: Path) -> None:
    python = fake_python(tmp_path / "venv" / "bin" / "python", "2.9.1+cu130", "13.0")
    findings = check(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), arch="10.0;12.0",
                     python=python)
    assert [f.check for f in findings] == [
        "nvcc", "arch 10.0", "arch 12.0", "torch", "torch cuda", "compiler", "ninja",
        "objcopy", "git", "disk work", "disk cache", "disk build", "memory"]
    assert failures(findings) == []
    text = render(findings)
    assert "\x1b" not in text and len(text.splitlines()) == len(findings)
    assert all(line[:6] in ("OK    ", "WARN  ", "FAIL  ") for line in text.splitlines())


def test_a_crashing_check_is_a_finding_not_an_exception(tmp_path: Path, bin_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr("wheelforge.builder.checks.doctor.inspect_env", boom)
    python = fake_python(tmp_path / "venv" / "bin" / "python")
    findings = check(tmp_path, env(bin_dir, fake_cuda(tmp_path, "13.0")), python=python)
    torch = one(findings, "torch")
    assert torch.status == "FAIL" and "RuntimeError: probe exploded" in torch.detail
    assert findings[-1].check == "memory"  # the checks after it still ran


@pytest.mark.unit
def test_render_layout() -> None:
    findings = [Finding("nvcc", "OK", "13.0 at /usr/local/cuda/bin/nvcc ($CUDA_HOME)"),
                Finding("arch 12.0+PTX", "FAIL", "needs CUDA 12.8+, nvcc is 12.4", "upgrade")]
    assert render(findings) == (
        "OK    nvcc         13.0 at /usr/local/cuda/bin/nvcc ($CUDA_HOME)\n"
        "FAIL  arch 12.0+PTX needs CUDA 12.8+, nvcc is 12.4  -> fix: upgrade")


@pytest.mark.unit
def test_failures_keeps_only_fail(tmp_path: Path) -> None:
    findings = [Finding("a", "OK", ""), Finding("b", "WARN", ""), Finding("c", "FAIL", "")]
    assert failures(findings) == [findings[2]]

