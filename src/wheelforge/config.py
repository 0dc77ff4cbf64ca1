"""The resolved, frozen build configuration.

Resolved once, in order: built-in defaults, the project file
(``wheelforge.yaml``), the environment (TORCH_CUDA_ARCH_LIST, MAX_JOBS,
NVCC_THREADS), then command-line options.  Each value remembers where it came
from so the summary printed before a build says why it is what it is.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from . import compilecache
from .arch import Arch, parse_arch_list, torch_arch_list
from .errors import ConfigError

DEFAULT_ARCH = "12.0"
DEFAULT_TORCH = "torch==2.14.1"
#: Memory one nvcc job may take at its peak (cicc on heavy templates).
DEFAULT_GIB_PER_JOB = 4.0
PROJECT_FILE = "wheelforge.yaml"
_DEFAULT_KEYS = ("arch", "torch", "torch-pip-args", "python", "index", "gib-per-job")


def default_cache_dir() -> Path:
    if os.environ.get("WHEELFORGE_CACHE"):
        return Path(os.environ["WHEELFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wheelforge"


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    archs: tuple[Arch, ...]
    python: Path | None  # an existing interpreter (--python), else a managed env
    base_python: Path  # the interpreter a managed env is created from
    torch: str  # torch requirement of a managed env
    torch_pip_args: tuple[str, ...]
    jobs: int
    nvcc_threads: int
    index_dir: Path
    cache_dir: Path
    work_dir: Path
    sources_dirs: tuple[Path, ...]
    force: bool = False
    origins: tuple[tuple[str, str], ...] = ()
    compile_cache: compilecache.Settings = compilecache.Settings()

    @property
    def arch_list(self) -> str:
        return torch_arch_list(self.archs)

    def origin(self, key: str) -> str:
        return dict(self.origins).get(key, "default")

    def summary(self) -> list[str]:
        env = (f"{self.python} (as-is)" if self.python
               else f"managed venv from {self.base_python} with {self.torch}")
        return [
            f"arch list      {self.arch_list}  [{self.origin('arch')}]",
            f"build env      {env}  [{self.origin('python')}]",
            f"jobs           MAX_JOBS={self.jobs} NVCC_THREADS={self.nvcc_threads}  "
            f"[{self.origin('jobs')}]",
            f"index          {self.index_dir}",
            f"cache          {self.cache_dir}",
            "sources        " + (", ".join(map(str, self.sources_dirs)) or "(network, cache)"),
            f"compile cache  {self.compile_cache.describe()}  [{self.compile_cache.origin}]",
        ]


def load_project_file(path: Path | None) -> dict[str, Any]:
    """The ``defaults`` mapping of wheelforge.yaml (empty if there is no file)."""
    if path is None:
        candidate = Path(PROJECT_FILE)
        if not candidate.is_file():
            return {}
        path = candidate
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}", why=str(exc),
                          fix="fix the file (YAML, saved as UTF-8)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping")
    defaults = data.get("defaults", {}) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}: defaults must be a mapping")
    unknown = sorted(set(defaults) - set(_DEFAULT_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) under defaults: {', '.join(unknown)}",
                          fix=f"allowed: {', '.join(_DEFAULT_KEYS)}")
    return defaults


def memory_available_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def auto_jobs(cores: int, mem_gib: float, gib_per_job: float) -> int:
    """One job per core, but no more than memory allows (at least 1)."""
    by_mem = int(mem_gib // gib_per_job) if mem_gib > 0 else cores
    return max(1, min(cores, by_mem))


def plan_jobs(slots: int, archs: int, units: int | None = None) -> tuple[int, int]:
    """MAX_JOBS and NVCC_THREADS for ``slots`` compiler processes at once (the cores,
    fewer if memory is short).  One job per translation unit, up to ``slots``; slots no
    unit can take go to nvcc's --threads, which compiles the architectures of one unit
    in parallel (a process per -gencode target).  So jobs x threads <= slots: every
    core busy, memory never oversubscribed.  ``units`` None: unknown, one job a slot."""
    jobs = max(1, min(slots, units) if units else slots)
    return jobs, _leftover_threads(slots, jobs, archs)


def _leftover_threads(slots: int, jobs: int, archs: int) -> int:
    """nvcc threads per job: the slots ``jobs`` leave over, at most one per arch (nvcc
    --threads parallelizes over the -gencode targets of one file), at least one."""
    return max(1, min(archs, slots // jobs))


def compile_units(tree: Path) -> int:
    """How many C/C++/CUDA sources a project could compile: an upper bound on the
    ninja jobs its build can run at once (tests, docs, examples and build output
    left out; anything else counted, so the bound errs high, never low)."""
    skip = {".git", "build", "dist", "docs", "doc", "examples", "tests", "test",
            "benchmarks"}
    n = 0
    for _root, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in skip]
        n += sum(1 for f in files if f.endswith((".cu", ".cpp", ".cc", ".cxx", ".c")))
    return n


def _stats_file(cache_dir: Path, name: str) -> Path:
    return cache_dir / "stats" / f"{name}.json"


def recorded_gib_per_job(cache_dir: Path, name: str) -> float | None:
    """The peak memory of one compile job seen in the last build of ``name``."""
    try:
        data = json.loads(_stats_file(cache_dir, name).read_text())
        return float(data["peak_job_gib"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_gib_per_job(cache_dir: Path, name: str, gib: float) -> None:
    from ._fs import atomic_write

    atomic_write(_stats_file(cache_dir, name), json.dumps({"peak_job_gib": round(gib, 3)}))


def jobs_for(config: BuildConfig, name: str, units: int | None = None) -> tuple[int, int, str]:
    """MAX_JOBS and NVCC_THREADS for one recipe whose source has ``units`` translation
    units: the configured ones, unless chosen automatically; then the slots (cores,
    bounded by memory: the recipe's recorded peak per job when an earlier build left
    one) are shared between jobs and nvcc threads by plan_jobs."""
    if not config.origin("jobs").startswith("auto"):
        return config.jobs, config.nvcc_threads, config.origin("jobs")
    slots, why = config.jobs, config.origin("jobs")
    peak = recorded_gib_per_job(config.cache_dir, name)
    if peak is not None:
        per_job = max(1.0, peak * 1.25)  # headroom over the last peak
        mem = memory_available_gib()
        slots = auto_jobs(cpu_count(), mem, per_job)
        why = (f"auto: {cpu_count()} cores, {mem:.0f} GiB available, last build peaked at "
               f"{peak:.1f} GiB per job")
    jobs, threads = plan_jobs(slots, len(config.archs), units)
    if config.origin("threads") == "NVCC_THREADS":
        threads = config.nvcc_threads
    if units:
        why += f", {units} translation units"
    return jobs, threads, why


def _positive_int(value: str, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return n


def resolve(
    *,
    arch: str | None = None,
    python: Path | None = None,
    torch: str | None = None,
    jobs: int | None = None,
    index_dir: Path | None = None,
    cache_dir: Path | None = None,
    work_dir: Path | None = None,
    sources_dirs: tuple[Path, ...] = (),
    force: bool = False,
    project_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> BuildConfig:
    env = os.environ if environ is None else environ
    defaults = load_project_file(project_file)
    origins: dict[str, str] = {}

    arch_text, origins["arch"] = DEFAULT_ARCH, "default"
    if defaults.get("arch"):
        arch_text, origins["arch"] = str(defaults["arch"]), PROJECT_FILE
    if env.get("TORCH_CUDA_ARCH_LIST", "").strip():
        arch_text, origins["arch"] = env["TORCH_CUDA_ARCH_LIST"], "TORCH_CUDA_ARCH_LIST"
    if arch:
        arch_text, origins["arch"] = arch, "--arch"
    archs = parse_arch_list(arch_text)

    torch_req = str(defaults.get("torch") or DEFAULT_TORCH)
    if torch:
        torch_req = torch
    try:
        if not Requirement(torch_req).name == "torch":
            raise InvalidRequirement("not a torch requirement")
    except InvalidRequirement as exc:
        raise ConfigError(f"{torch_req!r} is not a torch requirement", why=str(exc),
                          fix="e.g. --torch 'torch==2.14.1'") from exc
    pip_args = tuple(str(a) for a in (defaults.get("torch-pip-args") or []))

    if python is None and defaults.get("python"):
        python = Path(str(defaults["python"]))
        origins["python"] = PROJECT_FILE
    elif python is not None:
        origins["python"] = "--python"
    if python is not None:
        python = Path(os.path.abspath(python))

    cores = cpu_count()
    gib_per_job = float(defaults.get("gib-per-job") or DEFAULT_GIB_PER_JOB)
    if jobs is not None:
        n_jobs, origins["jobs"] = jobs, "--jobs"
    elif env.get("MAX_JOBS"):
        n_jobs, origins["jobs"] = _positive_int(env["MAX_JOBS"], "MAX_JOBS"), "MAX_JOBS"
    else:
        mem = memory_available_gib()
        n_jobs = auto_jobs(cores, mem, gib_per_job)
        origins["jobs"] = f"auto: {cores} cores, {mem:.0f} GiB available, {gib_per_job:g} GiB/job"
    if env.get("NVCC_THREADS"):
        threads = _positive_int(env["NVCC_THREADS"], "NVCC_THREADS")
        origins["threads"] = "NVCC_THREADS"
    else:
        # once the build's translation units are known, jobs_for shares the cores out again
        threads = _leftover_threads(cores, n_jobs, len(archs))

    cache = cache_dir or default_cache_dir()
    index = index_dir or Path(str(defaults.get("index") or "index"))
    return BuildConfig(
        archs=archs,
        python=python,
        base_python=Path(getattr(sys, "_base_executable", sys.executable)),
        torch=torch_req,
        torch_pip_args=pip_args,
        jobs=n_jobs,
        nvcc_threads=threads,
        index_dir=Path(os.path.abspath(index)),
        cache_dir=Path(os.path.abspath(cache)),
        work_dir=Path(os.path.abspath(work_dir or cache / "work")),
        sources_dirs=tuple(Path(os.path.abspath(d)) for d in sources_dirs),
        force=force,
        origins=tuple(sorted(origins.items())),
        compile_cache=compilecache.resolve_settings(project_file, env),
    )
