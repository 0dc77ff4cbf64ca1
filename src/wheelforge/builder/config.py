"""The resolved, frozen build configuration.

Resolved once, in order: built-in defaults, the project file
(``wheelforge.yaml``), the environment (TORCH_CUDA_ARCH_LIST, MAX_JOBS,
NVCC_THREADS), then command-line options.  Each value remembers where it came
from so the summary printed before a build says why it is what it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from .._fs import atomic_write
from .._yaml import read_yaml
from ..arch import Arch, parse_arch_list, torch_arch_list
from ..errors import ConfigError
from ..recipe.fields import Problems
from ..recipe.matrix import PROJECT_KEYS, not_a_project_file
from ..recipe.model import Choice
from .compiling import compilecache
from .compiling.diagnose import DEFAULT_GIB_PER_JOB as DEFAULT_GIB_PER_JOB
from .env.toolkit import requirement as toolkit_requirement
from .source.fetch import iter_git_mirrors, normalize_git_url

DEFAULT_ARCH = "12.0"
DEFAULT_TORCH = "torch==2.14.1"
PROJECT_FILE = "wheelforge.yaml"
_DEFAULT_KEYS = ("arch", "torch", "torch-pip-args", "python", "index", "gib-per-job",
                 "git-mirrors", "toolkit", "cuda-toolkit")
#: The CUDA toolkit a build compiles with (``toolkit:`` in wheelforge.yaml's defaults,
#: ``--toolkit``, ``WHEELFORGE_TOOLKIT``): ``auto`` (a system toolkit where one is found,
#: else the managed one), ``managed`` (PyPI's, builder/env/toolkit.py), ``system``.
TOOLKIT_MODES = ("auto", "managed", "system")
TOOLKIT_ENV = "WHEELFORGE_TOOLKIT"
#: The managed toolkit of the default torch (torch 2.14.1 is a CUDA 13.0 build).
DEFAULT_CUDA_TOOLKIT = toolkit_requirement("13.0")
#: ``URL=PATH;URL=PATH``: local mirrors of git repositories (see docs/recipe-format.md)
GIT_MIRRORS_ENV = "WHEELFORGE_GIT_MIRRORS"


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
    gib_per_job: float = DEFAULT_GIB_PER_JOB
    origins: tuple[tuple[str, str], ...] = ()
    #: git URL -> local mirror (a bundle file or a repository); never the network for these
    git_mirrors: tuple[tuple[str, Path], ...] = ()
    compile_cache: compilecache.Settings = compilecache.Settings()
    #: ``--subset``: (dimension, values) asked for; applied to the recipes named on the
    #: command line that declare kernel subsets (recipe.subsets.select_subset); () = full
    subset: Choice = ()
    #: the requirements of every recipe built beside this one into the same managed
    #: environment: whichever build prepares the environment first installs them all,
    #: so that no build installs into it while another one's setup.py imports from it
    shared_requirements: tuple[str, ...] = ()
    #: which CUDA toolkit (one of TOOLKIT_MODES) and the managed one's requirement
    toolkit: str = "auto"
    cuda_toolkit: str = DEFAULT_CUDA_TOOLKIT
    #: a system toolkit named by its directory (``--cuda-home``, ``toolkit: {cuda-home:
    #: PATH}``): the build's ``CUDA_HOME``, with ``toolkit`` "system"
    cuda_home: Path | None = None

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
            f"CUDA toolkit   {self.toolkit}"
            + (f" ({self.cuda_toolkit} where managed)" if self.toolkit != "system" else "")
            + (f" at {self.cuda_home}" if self.cuda_home else "")
            + f"  [{self.origin('toolkit')}]",
            f"jobs           MAX_JOBS={self.jobs} NVCC_THREADS={self.nvcc_threads}  "
            f"[{self.origin('jobs')}]",
            f"index          {self.index_dir}",
            f"cache          {self.cache_dir}",
            "sources        " + (", ".join(map(str, self.sources_dirs)) or "(network, cache)"),
            *(f"git mirror     {url} -> {path}  [{self.origin('git-mirror:' + url)}]"
              for url, path in self.git_mirrors),
            f"compile cache  {self.compile_cache.describe()}  [{self.compile_cache.origin}]",
            *([f"kernel subset  {' '.join(k + '=' + ','.join(v) for k, v in self.subset)}"
               "  [--subset]"] if self.subset else []),
        ]


def load_project_file(path: Path | None) -> dict[str, Any]:
    """The ``defaults`` mapping of wheelforge.yaml (empty if there is no file)."""
    if path is None:
        candidate = Path(PROJECT_FILE)
        if not candidate.is_file():
            return {}
        path = candidate
    data = read_yaml(path, ConfigError, str(path), read_fix="pass the project file with "
                     "--config") or {}
    if not isinstance(data, dict):
        raise not_a_project_file(path, data, "pass --config a wheelforge.yaml (the "
                                 "checkout's is an example; docs/usage.md lists the "
                                 "settings of defaults:)")
    p = Problems(path)  # every problem at once, each key's with a did-you-mean
    p.unknown_keys("", data, PROJECT_KEYS)  # a typo (default:) would be silently ignored
    defaults = data.get("defaults", {}) or {}
    if not isinstance(defaults, dict):
        p.add("defaults", f"must be a mapping, got {type(defaults).__name__}")
        defaults = {}
    p.unknown_keys("defaults", defaults, _DEFAULT_KEYS)
    _check_default_values(p, defaults)
    if p.items:
        raise ConfigError(f"{path} has {len(p.items)} problem(s)",
                          why="\n    " + "\n    ".join(p.items),
                          fix="correct the keys above; docs/usage.md lists the settings of "
                              "defaults:, docs/nightly.md the matrix")
    return defaults


def _check_default_values(p: Problems, defaults: Mapping[Any, Any]) -> None:
    """The values of defaults: that need nothing but themselves to check."""
    mode = defaults.get("toolkit")
    if isinstance(mode, dict):
        problem = cuda_home_problem(mode)
        if problem:
            p.add("defaults.toolkit", problem)
    elif mode is not None and str(mode).strip().lower() not in TOOLKIT_MODES:
        p.add("defaults.toolkit", f"{mode!r} is not one of {', '.join(TOOLKIT_MODES)}, nor "
                                  "{cuda-home: PATH}")
    for name in ("cuda-toolkit", "torch"):
        spec = defaults.get(name)
        if spec is None:
            continue
        try:
            if Requirement(str(spec)).name != name:
                p.add(f"defaults.{name}", f"{spec!r} is not a {name} requirement")
        except InvalidRequirement as exc:
            p.add(f"defaults.{name}", f"{spec!r} is not a requirement: {exc}")
    try:
        project_gib_per_job(defaults)
    except ConfigError:
        p.add("defaults.gib-per-job", "must be a positive number of GiB, got "
              f"{defaults.get('gib-per-job')!r} (e.g. gib-per-job: 4)")
    pip_args = defaults.get("torch-pip-args")
    if pip_args is not None and not isinstance(pip_args, list):
        p.add("defaults.torch-pip-args", "must be a list of pip arguments")


def find_python(value: str | os.PathLike[str], origin: str,
                environ: Mapping[str, str] | None = None) -> Path:
    """An interpreter as users name it: a path (``~/venvs/train/bin/python``,
    ``./python3``) as given, or a bare command name (``python3``, ``python3.12``), as uv
    accepts it, looked up on PATH.  Returns an absolute path; raises ConfigError when a
    bare name is not on PATH."""
    text = os.path.expanduser(os.fspath(value))
    if not text.strip():
        raise ConfigError(f"{origin} is empty", fix="give an interpreter, e.g. --python python3 "
                          "or --python ~/venvs/train/bin/python")
    if os.sep in text or text in (".", ".."):
        path = Path(os.path.abspath(text))
        if path.is_dir():  # a venv, as uv takes it: its interpreter
            inside = path / "bin" / "python"
            if not inside.is_file():
                raise ConfigError(f"{origin} {text} is a directory without bin/python",
                                  fix="give the interpreter (e.g. ~/venvs/train/bin/python) "
                                      "or a venv directory")
            return inside
        return path
    env = os.environ if environ is None else environ
    found = shutil.which(text, path=env.get("PATH"))
    if found is None:
        raise ConfigError(f"{origin} {text}: no {text!r} on PATH",
                          why="a name without a '/' is looked up on PATH, as uv does",
                          fix=f"give the interpreter's path (e.g. ./{text} or "
                              "~/venvs/train/bin/python), or put it on PATH")
    return Path(os.path.abspath(found))


def project_index(index_dir: Path | None, project_file: Path | None = None) -> Path:
    """The index directory: the option, else ``defaults.index`` of wheelforge.yaml, else
    ./index (absolute)."""
    if index_dir is None:
        index_dir = Path(str(load_project_file(project_file).get("index") or "index"))
    return Path(os.path.abspath(index_dir))


def project_python(python: str | os.PathLike[str] | None,
                   project_file: Path | None = None) -> Path | None:
    """--python, else ``defaults.python`` of wheelforge.yaml, resolved by find_python."""
    if python is not None:
        return find_python(python, "--python")
    configured = load_project_file(project_file).get("python")
    if configured:
        return find_python(str(configured), f"defaults.python of {PROJECT_FILE}")
    return None


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


#: the variable that tells a split patch how many jobs to size its units for
UNIT_JOBS = "WHEELFORGE_UNIT_JOBS"


def unit_jobs(config: BuildConfig) -> int:
    """The job count a source's split patches size its translation units for
    (``WHEELFORGE_UNIT_JOBS``; causal-conv1d 0005, mamba-ssm 0008): the MAX_JOBS the user
    chose (--jobs, $MAX_JOBS), else the cores.  Never the memory available now nor a peak
    an earlier build recorded, which move the automatic MAX_JOBS: other units are other
    object code, and the bytes must not depend on a machine's history
    (docs/reproducible.md)."""
    return cpu_count() if config.origin("jobs").startswith("auto") else config.jobs


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


def record_gib_per_job(cache_dir: Path, name: str, gib: float, *,
                       keep_higher: bool = False) -> float:
    """Record ``gib`` as the peak memory of one compile job of ``name``; return what is
    recorded.  ``keep_higher``: a build some of whose units the compile cache served
    (their compiles, perhaps the heaviest, did not run) replaces the record only when
    it peaked higher."""
    if keep_higher:
        gib = max(gib, recorded_gib_per_job(cache_dir, name) or 0.0)
    atomic_write(_stats_file(cache_dir, name), json.dumps({"peak_job_gib": round(gib, 3)}))
    return gib


def job_memory_gib(recorded: float | None, declared: float | None) -> tuple[float, str] | None:
    """The memory to plan per compile job, and why: the recipe's declared peak (measured
    over all its units, so no headroom), or the peak recorded on this machine when it is
    higher; without a declared peak, the recorded one with 25% headroom (one build's peak,
    which a build of other units can exceed).  None: neither is known."""
    if declared is not None:
        if recorded is not None and recorded > declared:
            return recorded, f"last build peaked at {recorded:.1f} GiB per job (the recipe " \
                             f"states {declared:g})"
        return declared, f"the recipe states a peak of {declared:g} GiB per job"
    if recorded is not None:
        return max(1.0, recorded * 1.25), f"last build peaked at {recorded:.1f} GiB per job"
    return None


def jobs_for(config: BuildConfig, name: str, units: int | None = None,
             declared_gib: float | None = None) -> tuple[int, int, str]:
    """MAX_JOBS and NVCC_THREADS for one recipe whose source has ``units`` translation
    units: the configured ones, unless chosen automatically; then the slots (cores,
    bounded by memory: the recipe's stated peak per job (``build.job-memory``) or the
    peak recorded by an earlier build, see job_memory_gib) are shared between jobs and
    nvcc threads by plan_jobs."""
    if not config.origin("jobs").startswith("auto"):
        return config.jobs, config.nvcc_threads, config.origin("jobs")
    slots, why = config.jobs, config.origin("jobs")
    planned = job_memory_gib(recorded_gib_per_job(config.cache_dir, name), declared_gib)
    if planned is not None:
        per_job, because = planned
        mem = memory_available_gib()
        slots = auto_jobs(cpu_count(), mem, per_job)
        why = f"auto: {cpu_count()} cores, {mem:.0f} GiB available, {because}"
    jobs, threads = plan_jobs(slots, len(config.archs), units)
    if config.origin("threads") == "NVCC_THREADS":
        threads = config.nvcc_threads
    if units:
        why += f", {units} translation units"
    return jobs, threads, why


def project_gib_per_job(defaults: Mapping[str, Any]) -> float:
    """``defaults.gib-per-job`` of wheelforge.yaml, else DEFAULT_GIB_PER_JOB."""
    value = defaults.get("gib-per-job")
    if value is None or value == "":
        return DEFAULT_GIB_PER_JOB
    try:
        gib = float(value)
    except (TypeError, ValueError):
        gib = 0.0
    if not gib > 0:
        raise ConfigError(f"defaults.gib-per-job of {PROJECT_FILE} must be a positive number of "
                          f"GiB, got {value!r}", fix="e.g. gib-per-job: 4")
    return gib


def _positive_int(value: str, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}",
                          fix=f"set {what} to a whole number of 1 or more (e.g. {what}=2), "
                              "or unset it: wheelforge sizes it from the cores and memory")
    return n


def _resolve_archs(arch: str | None, defaults: dict[str, Any], env: Mapping[str, str],
                   origins: dict[str, str]) -> tuple[Arch, ...]:
    """The arch list: --arch, else $TORCH_CUDA_ARCH_LIST, else the project file's, else
    the default; a bad one names where it came from."""
    arch_text, origins["arch"] = DEFAULT_ARCH, "default"
    if "arch" in defaults:
        value = defaults["arch"]  # a YAML list is an arch list too
        arch_text = ";".join(map(str, value)) if isinstance(value, list) else str(value or "")
        origins["arch"] = PROJECT_FILE
    if env.get("TORCH_CUDA_ARCH_LIST", "").strip():  # empty: unset, as torch reads it
        arch_text, origins["arch"] = env["TORCH_CUDA_ARCH_LIST"], "TORCH_CUDA_ARCH_LIST"
    if arch is not None:  # --arch '' is a mistake, never the default
        arch_text, origins["arch"] = arch, "--arch"
    try:
        return parse_arch_list(arch_text)
    except ConfigError as exc:
        if origins["arch"] != "--arch":
            where = ("defaults.arch of " + PROJECT_FILE if origins["arch"] == PROJECT_FILE
                     else "$TORCH_CUDA_ARCH_LIST")
            exc.what = f"{where}: {exc.what}"
        raise


def _resolve_torch(torch: str | None, defaults: dict[str, Any]) -> str:
    """The torch requirement of managed environments: --torch, else the project file's."""
    torch_req = str(defaults.get("torch") or DEFAULT_TORCH)
    if torch:
        torch_req = torch
    try:
        if not Requirement(torch_req).name == "torch":
            raise InvalidRequirement("not a torch requirement")
    except InvalidRequirement as exc:
        raise ConfigError(f"{torch_req!r} is not a torch requirement", why=str(exc),
                          fix="e.g. --torch 'torch==2.14.1'") from exc
    return torch_req


def _resolve_python(python: str | os.PathLike[str] | None, defaults: dict[str, Any],
                    env: Mapping[str, str], origins: dict[str, str]) -> Path | None:
    """Your interpreter (--python, else the project file's), found; None: a managed one."""
    if python is None and defaults.get("python"):
        given, origins["python"] = str(defaults["python"]), PROJECT_FILE
        found = find_python(given, f"defaults.python of {PROJECT_FILE}", env)
    elif python is not None:
        given, origins["python"] = os.fspath(python), "--python"
        found = find_python(python, "--python", env)
    else:
        return None
    if given != str(found):
        origins["python"] += f" {given}"  # the summary shows the name and what it resolved to
    return found


def _resolve_jobs(jobs: int | None, env: Mapping[str, str], n_archs: int, gib_per_job: float,
                  origins: dict[str, str]) -> tuple[int, int]:
    """MAX_JOBS (--jobs, $MAX_JOBS, else what the cores and the memory allow) and
    NVCC_THREADS ($NVCC_THREADS, else the cores left over)."""
    cores = cpu_count()
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
        threads = _leftover_threads(cores, n_jobs, n_archs)
    return n_jobs, threads


def resolve(
    *,
    arch: str | None = None,
    python: str | os.PathLike[str] | None = None,
    torch: str | None = None,
    jobs: int | None = None,
    index_dir: Path | None = None,
    cache_dir: Path | None = None,
    work_dir: Path | None = None,
    sources_dirs: tuple[Path, ...] = (),
    force: bool = False,
    project_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    git_mirrors: tuple[str, ...] = (),
    subset: Choice = (),
    toolkit: str | None = None,
    cuda_home: str | os.PathLike[str] | None = None,
) -> BuildConfig:
    env = os.environ if environ is None else environ
    defaults = load_project_file(project_file)
    origins: dict[str, str] = {}
    mirrors = resolve_git_mirrors(defaults.get("git-mirrors"),
                                  (project_file or Path(PROJECT_FILE)).parent,
                                  env.get(GIT_MIRRORS_ENV, ""), git_mirrors, origins)

    archs = _resolve_archs(arch, defaults, env, origins)
    torch_req = _resolve_torch(torch, defaults)
    pip_args = tuple(str(a) for a in (defaults.get("torch-pip-args") or []))
    python = _resolve_python(python, defaults, env, origins)
    gib_per_job = project_gib_per_job(defaults)
    n_jobs, threads = _resolve_jobs(jobs, env, len(archs), gib_per_job, origins)

    toolkit_mode, home = _resolve_toolkit(toolkit, defaults, env, origins, cuda_home,
                                          (project_file or Path(PROJECT_FILE)).parent)
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
        gib_per_job=gib_per_job,
        origins=tuple(sorted(origins.items())),
        git_mirrors=tuple(mirrors.items()),
        compile_cache=compilecache.resolve_settings(project_file, env),
        subset=subset,
        toolkit=toolkit_mode,
        cuda_toolkit=str(defaults.get("cuda-toolkit") or DEFAULT_CUDA_TOOLKIT),
        cuda_home=home,
    )


def cuda_home_problem(value: Mapping[Any, Any]) -> str:
    """What is wrong with a ``toolkit: {cuda-home: PATH}`` mapping ("" when nothing)."""
    extra = sorted(str(k) for k in value if k != "cuda-home")
    home = value.get("cuda-home")
    if extra:
        return f"{{cuda-home: PATH}} takes no other key, got {', '.join(extra)}"
    if not isinstance(home, str) or not home.strip():
        return f"cuda-home must be the directory of a CUDA toolkit, got {home!r}"
    return ""


def _resolve_toolkit(toolkit: str | None, defaults: Mapping[str, Any],
                     env: Mapping[str, str], origins: dict[str, str],
                     cuda_home: str | os.PathLike[str] | None = None,
                     base: Path = Path(".")) -> tuple[str, Path | None]:
    """--cuda-home (a system toolkit), else --toolkit, else $WHEELFORGE_TOOLKIT, else the
    project file's (a mode, or ``{cuda-home: PATH}``, relative to the file), else auto."""
    if cuda_home is not None:
        if toolkit not in (None, "system"):
            raise ConfigError(f"--cuda-home and --toolkit {toolkit} ask for two toolkits",
                              why="--cuda-home names a system toolkit",
                              fix="leave out --toolkit, or --cuda-home")
        origins["toolkit"] = "--cuda-home"
        return "system", Path(os.path.abspath(os.path.expanduser(os.fspath(cuda_home))))
    from_file = defaults.get("toolkit")
    if isinstance(from_file, dict) and not toolkit and not env.get(TOOLKIT_ENV):
        origins["toolkit"] = "wheelforge.yaml"
        home = os.path.expanduser(str(from_file["cuda-home"]))
        return "system", Path(os.path.abspath(base / home))
    for value, origin in ((toolkit, "--toolkit"), (env.get(TOOLKIT_ENV), TOOLKIT_ENV),
                          (None if isinstance(from_file, dict) else from_file,
                           "wheelforge.yaml")):
        if value:
            mode = str(value).strip().lower()
            if mode not in TOOLKIT_MODES:
                raise ConfigError(f"{origin}: {value!r} is not a toolkit choice",
                                  fix="use " + ", ".join(TOOLKIT_MODES))
            origins["toolkit"] = origin
            return mode, None
    return "auto", None


def resolve_git_mirrors(from_file: Any, base: Path, from_env: str, from_cli: tuple[str, ...],
                        origins: dict[str, str]) -> dict[str, Path]:
    """git URL -> mirror path: wheelforge.yaml's ``git-mirrors`` (paths relative to the
    file), then $WHEELFORGE_GIT_MIRRORS, then ``--git-mirror URL=PATH``; later ones win."""
    out: dict[str, Path] = {}

    def add(url: str, path: str, origin: str, rel_to: Path) -> None:
        if not url or not path:
            raise ConfigError(f"bad git mirror {url}={path} ({origin})",
                              why="a mapping is URL=PATH: the repository URL a recipe names, "
                                  "then a git bundle file or a repository on disk",
                              fix="e.g. https://github.com/state-spaces/mamba="
                                  "/srv/mirrors/state-spaces-mamba.bundle")
        key = normalize_git_url(url)
        out[key] = Path(os.path.abspath(rel_to / os.path.expanduser(path)))
        origins["git-mirror:" + key] = origin

    if from_file is not None:
        if not isinstance(from_file, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in from_file.items()):
            raise ConfigError(f"{PROJECT_FILE}: defaults.git-mirrors must map git URLs to paths",
                              fix="e.g. git-mirrors: {https://github.com/state-spaces/mamba: "
                                  "mirrors/state-spaces-mamba.bundle}")
        for url, path in from_file.items():
            add(url, path, PROJECT_FILE, base)
    for url, path in iter_git_mirrors(from_env):
        add(url, path, GIT_MIRRORS_ENV, Path.cwd())
    for entry in from_cli:
        url, _, path = entry.partition("=")
        add(url.strip(), path.strip(), "--git-mirror", Path.cwd())
    return out
