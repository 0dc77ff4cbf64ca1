from __future__ import annotations

from pathlib import Path

import pytest

from wheelforge.builder.config import (
    auto_jobs,
    compile_units,
    jobs_for,
    plan_jobs,
    record_gib_per_job,
    recorded_gib_per_job,
    resolve,
    unit_jobs,
)
from wheelforge.errors import ConfigError


@pytest.mark.parametrize(("cores", "mem", "per_job", "jobs"), [
    (2, 23.0, 4.0, 2), (16, 23.0, 4.0, 5), (16, 2.0, 4.0, 1), (8, 0.0, 4.0, 8)])
def test_auto_jobs(cores: int, mem: float, per_job: float, jobs: int) -> None:
    assert auto_jobs(cores, mem, per_job) == jobs


@pytest.mark.parametrize(("slots", "archs", "units", "jobs", "threads"), [
    (2, 1, 21, 2, 1),      # 2 cores: a job per core
    (16, 1, 21, 16, 1),    # split causal-conv1d, one arch: a job per core
    (16, 9, 4, 4, 4),      # upstream causal-conv1d, 9 archs: 4 units x 4 nvcc threads
    (16, 2, 4, 4, 2),      # 2 archs: threads never exceed the arch count
    (16, 9, 21, 16, 1),    # more units than cores: no threads left over
    (16, 1, None, 16, 1),  # units unknown
    (5, 9, 1, 1, 5),       # one unit: its archs in parallel
    (1, 9, 4, 1, 1),
])
def test_plan_jobs(slots: int, archs: int, units: int | None, jobs: int, threads: int) -> None:
    assert plan_jobs(slots, archs, units) == (jobs, threads)
    assert jobs * threads <= slots


def test_compile_units(tmp_path: Path) -> None:
    for name in ("csrc/a.cu", "csrc/b.cpp", "csrc/sub/c.cc", "csrc/h.h", "csrc/k.cuh",
                 "tests/t.cpp", "build/temp/x.cu", "setup.py", "docs/d.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert compile_units(tmp_path) == 3


def test_jobs_for_shares_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pf = tmp_path / "none.yaml"
    pf.write_text("{}")
    monkeypatch.setattr("wheelforge.builder.config.cpu_count", lambda: 16)
    monkeypatch.setattr("wheelforge.builder.config.memory_available_gib", lambda: 100.0)
    c = resolve(project_file=pf, arch="8.0 9.0 10.0 12.0", cache_dir=tmp_path, environ={})
    assert (c.jobs, c.nvcc_threads) == (16, 1)
    jobs, threads, why = jobs_for(c, "x", units=4)
    assert (jobs, threads) == (4, 4) and "4 translation units" in why
    # what the user sets is kept
    c = resolve(project_file=pf, arch="8.0 9.0", cache_dir=tmp_path, environ={"MAX_JOBS": "3"})
    assert jobs_for(c, "x", units=4)[:2] == (3, 2)
    c = resolve(project_file=pf, arch="8.0 9.0", cache_dir=tmp_path,
                environ={"NVCC_THREADS": "1"})
    assert jobs_for(c, "x", units=4)[:2] == (4, 1)


def test_units_are_sized_without_the_machines_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 53: an earlier build's recorded peak (and the memory free now) move the
    automatic MAX_JOBS, never WHEELFORGE_UNIT_JOBS, which sizes the split patches' units:
    two builders of one build key, one with a history, group the kernels alike."""
    pf = tmp_path / "none.yaml"
    pf.write_text("{}")
    monkeypatch.setattr("wheelforge.builder.config.cpu_count", lambda: 16)
    monkeypatch.setattr("wheelforge.builder.config.memory_available_gib", lambda: 40.0)
    fresh, seasoned = tmp_path / "fresh", tmp_path / "seasoned"
    record_gib_per_job(seasoned, "causal-conv1d", 9.0)  # a heavy earlier build
    picked = []
    for cache in (fresh, seasoned):
        c = resolve(project_file=pf, arch="12.0", cache_dir=cache, environ={})
        jobs, _, _ = jobs_for(c, "causal-conv1d", units=21)
        picked.append((jobs, unit_jobs(c)))
    assert picked == [(10, 16), (3, 16)]  # MAX_JOBS moved; the units' jobs did not
    c = resolve(project_file=pf, arch="12.0", cache_dir=seasoned, environ={"MAX_JOBS": "2"})
    assert unit_jobs(c) == 2  # what the user sets sizes them


def test_precedence(tmp_path: Path) -> None:
    pf = tmp_path / "wheelforge.yaml"
    pf.write_text("defaults:\n  arch: '9.0'\n  torch: torch==2.11.0\n")
    c = resolve(project_file=pf, environ={})
    assert (c.arch_list, c.origin("arch"), c.torch) == ("9.0", "wheelforge.yaml", "torch==2.11.0")
    c = resolve(project_file=pf, environ={"TORCH_CUDA_ARCH_LIST": "10.0 12.0"})
    assert (c.arch_list, c.origin("arch")) == ("10.0;12.0", "TORCH_CUDA_ARCH_LIST")
    c = resolve(project_file=pf, arch="12.0+PTX", environ={"TORCH_CUDA_ARCH_LIST": "10.0"})
    assert (c.arch_list, c.origin("arch")) == ("12.0+PTX", "--arch")


def test_jobs_and_threads(tmp_path: Path) -> None:
    pf = tmp_path / "none.yaml"
    pf.write_text("{}")
    c = resolve(project_file=pf, environ={"MAX_JOBS": "3", "NVCC_THREADS": "2"})
    assert (c.jobs, c.nvcc_threads, c.origin("jobs")) == (3, 2, "MAX_JOBS")
    assert resolve(project_file=pf, jobs=1, environ={"MAX_JOBS": "3"}).jobs == 1
    with pytest.raises(ConfigError, match="MAX_JOBS must be a positive integer"):
        resolve(project_file=pf, environ={"MAX_JOBS": "lots"})


def test_defaults(tmp_path: Path) -> None:
    pf = tmp_path / "none.yaml"
    pf.write_text("{}")
    c = resolve(project_file=pf, environ={}, index_dir=tmp_path / "idx")
    assert c.arch_list == "12.0" and c.torch == "torch==2.14.1"
    assert c.index_dir == tmp_path / "idx" and c.python is None
    assert any(line.startswith("arch list      12.0") for line in c.summary())


def test_bad_project_file(tmp_path: Path) -> None:
    pf = tmp_path / "wheelforge.yaml"
    pf.write_text("defaults:\n  archs: '9.0'\n")
    with pytest.raises(ConfigError) as info:
        resolve(project_file=pf, environ={})
    assert "defaults.archs: unknown key; did you mean 'arch'?" in (info.value.why or "")
    with pytest.raises(ConfigError, match="not a torch requirement"):
        resolve(project_file=None, torch="jax==1", environ={})


def test_a_partly_cached_build_only_raises_the_recorded_peak(tmp_path: Path) -> None:
    """A build whose heaviest unit the compile cache served peaks lower than that unit
    needs: it must not lower the record the next build sizes its jobs by."""
    assert recorded_gib_per_job(tmp_path, "x") is None
    assert record_gib_per_job(tmp_path, "x", 3.0) == 3.0  # a cold build
    assert record_gib_per_job(tmp_path, "x", 1.2, keep_higher=True) == 3.0  # partly cached
    assert recorded_gib_per_job(tmp_path, "x") == 3.0
    assert record_gib_per_job(tmp_path, "x", 3.5, keep_higher=True) == 3.5  # it peaked higher
    assert record_gib_per_job(tmp_path, "x", 1.0) == 1.0  # a whole compile is the truth
    assert recorded_gib_per_job(tmp_path, "x") == 1.0
