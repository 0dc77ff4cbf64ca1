from __future__ import annotations

from pathlib import Path

import pytest

from wheelforge.config import auto_jobs, resolve
from wheelforge.errors import ConfigError


@pytest.mark.parametrize(("cores", "mem", "per_job", "jobs"), [
    (2, 23.0, 4.0, 2), (16, 23.0, 4.0, 5), (16, 2.0, 4.0, 1), (8, 0.0, 4.0, 8)])
def test_auto_jobs(cores: int, mem: float, per_job: float, jobs: int) -> None:
    assert auto_jobs(cores, mem, per_job) == jobs


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
    with pytest.raises(ConfigError, match="unknown key"):
        resolve(project_file=pf, environ={})
    with pytest.raises(ConfigError, match="not a torch requirement"):
        resolve(project_file=None, torch="jax==1", environ={})
