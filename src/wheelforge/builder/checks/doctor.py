"""Check the machine before a build: every check runs, none raises.

``run_checks`` returns one finding per check (OK, WARN or FAIL, with the fix
for anything not OK); ``render`` lays them out one per line, without colour.
Compatibility rules are data: the host compilers each CUDA release accepts are
in ``HOST_COMPILER_MAX`` (the toolkit's own crt/host_config.h wins when found),
the architectures in ``arch.MIN_CUDA_FOR_ARCH``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.version import Version

from ... import _proc
from ...arch import Arch, min_cuda
from ...errors import WheelforgeError
from .. import config
from ..artifact import reproducible
from ..compiling import jobserver
from ..compiling.toolchain import Cuda, find_cuda, nvcc_version, supported_sass
from ..env import toolkit
from ..env.buildenv import BASE_REQUIREMENTS, MARKER, env_key, inspect_env

__all__ = [
    "DISK_FAIL_GIB",
    "DISK_WARN_GIB",
    "HOST_COMPILER_MAX",
    "Finding",
    "Status",
    "expected_torch_cuda",
    "failures",
    "render",
    "run_checks",
]

#: SKIP: a check that could not run (what it needs is missing), never reported as OK.
Status = Literal["OK", "WARN", "FAIL", "SKIP"]
Compiler = Literal["gcc", "clang"]

DISK_WARN_GIB = 20.0
DISK_FAIL_GIB = 5.0
#: The newest host compiler major each CUDA release accepts (its include/crt/host_config.h).
#: A release missing here is judged by the closest older row, as a warning only.
HOST_COMPILER_MAX: dict[str, dict[Compiler, int]] = {
    "11.8": {"gcc": 11, "clang": 14},
    "12.0": {"gcc": 12, "clang": 14},
    "12.1": {"gcc": 12},
    "12.2": {"gcc": 12},
    "12.3": {"gcc": 12},
    "12.4": {"gcc": 13},
    "12.5": {"gcc": 13},
    "12.6": {"gcc": 13},
    "12.8": {"gcc": 14, "clang": 19},
    "12.9": {"gcc": 14},
    "13.0": {"gcc": 15, "clang": 20},
}
_TIMEOUT = 60.0


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str
    fix: str = ""


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == "FAIL"]


def render(findings: Iterable[Finding]) -> str:
    """One line per finding: status, check, detail and, when there is one, the fix."""
    lines = []
    for f in findings:
        line = f"{f.status:<6}{f.check:<12} {f.detail}"
        if f.fix:
            line += f"  -> fix: {f.fix}"
        lines.append(line)
    return "\n".join(lines)


def run_checks(
    *,
    archs: tuple[Arch, ...],
    python: Path | None,
    work_dir: Path,
    cache_dir: Path,
    jobs: int | None,
    environ: Mapping[str, str] | None = None,
    check_torch: bool = True,
    managed_torch: str | None = None,
    managed_torch_pip_args: tuple[str, ...] = (),
    managed_python: Path | None = None,
    gib_per_job: float = config.DEFAULT_GIB_PER_JOB,
    build_root: Path = reproducible.BUILD_ROOT,
    toolkit: str = "auto",
    cuda_toolkit: str = config.DEFAULT_CUDA_TOOLKIT,
) -> list[Finding]:
    """Every check, collected; a check that cannot run is a finding, never an exception.

    Without ``python`` the torch check is about the managed environment: its torch
    requirement ``managed_torch`` (with ``managed_torch_pip_args``, created from
    ``managed_python``), inspected when that environment exists in ``cache_dir``, else
    judged from the requirement.  ``toolkit`` (config.TOOLKIT_MODES) and ``cuda_toolkit``:
    which CUDA toolkit a build uses, said in the nvcc line with why."""
    env = dict(os.environ if environ is None else environ)
    findings: list[Finding] = []
    cuda_box: list[Cuda | None] = [None]

    def nvcc() -> list[Finding]:
        finding, cuda_box[0] = _check_nvcc(env, toolkit, cuda_toolkit, cache_dir)
        return [finding]

    _collect(findings, "nvcc", nvcc)
    cuda = cuda_box[0]
    _collect(findings, "arch", lambda: _check_archs(cuda, archs))
    if check_torch:  # the build pipeline has inspected torch already: no second import
        _collect(findings, "torch", lambda: _check_torch(
            python, cuda, managed=(managed_torch, managed_torch_pip_args, managed_python,
                                   cache_dir)))
    _collect(findings, "compiler", lambda: [_check_host_compiler(cuda, env)])
    managed_env = (None if python is not None or managed_torch is None else
                   _existing_managed_env(managed_torch, managed_torch_pip_args, managed_python,
                                         cache_dir))
    _collect(findings, "ninja", lambda: [_check_ninja(python or managed_env, env)])
    _collect(findings, "objcopy", lambda: [_check_objcopy(env)])
    _collect(findings, "git", lambda: [_check_git(env)])
    _collect(findings, "disk work", lambda: [_check_disk("disk work", work_dir, "--work-dir")])
    _collect(findings, "disk cache", lambda: [_check_disk("disk cache", cache_dir, "--cache-dir")])
    # the source tree and its objects: at the fixed build path (docs/reproducible.md)
    _collect(findings, "disk build", lambda: [_check_disk("disk build", build_root, None)])
    _collect(findings, "memory", lambda: [_check_memory(jobs, env, gib_per_job)])
    return findings


def _collect(findings: list[Finding], name: str, check: Callable[[], list[Finding]]) -> None:
    try:
        findings.extend(check())
    except Exception as exc:  # a check must never abort the report
        findings.append(Finding(name, "FAIL", f"the check itself failed: {type(exc).__name__}: "
                                f"{exc}", "report this as a wheelforge bug"))


# -- nvcc and architectures --------------------------------------------------------------------

def _check_nvcc(env: Mapping[str, str], mode: str = "system", requirement: str = "",
                cache_dir: Path | None = None) -> tuple[Finding, Cuda | None]:
    """Which toolkit a build uses (``mode``: config.TOOLKIT_MODES) and why; a managed one
    is looked for in ``cache_dir``, never installed here."""
    why = "toolkit: managed"
    if mode != "managed":
        try:
            cuda = find_cuda(env)
        except WheelforgeError as exc:
            if mode == "system" or any(env.get(v) for v in ("CUDA_HOME", "CUDA_PATH")):
                return Finding("nvcc", "FAIL", _what_why(exc), exc.fix), None
            why = f"toolkit: auto, and no system toolkit ({exc.what})"
        else:
            said = ("; toolkit: auto, and a system toolkit was found (--toolkit managed "
                    "compiles with PyPI's)" if mode == "auto" else "; toolkit: system")
            return Finding("nvcc", "OK", f"{cuda.version} at {cuda.nvcc} ({cuda.origin})"
                           f"{said}"), cuda
    assert cache_dir is not None
    found = toolkit.read(cache_dir / "toolkits" / toolkit.toolkit_key(requirement, ()))
    if found is None:
        return Finding("nvcc", "OK", f"managed {requirement} ({why}); not installed yet: "
                       "the first build installs it from PyPI (about 271 MB, into uv's "
                       f"cache, hard-linked under {cache_dir / 'toolkits'})"), None
    nvcc = found.home / "bin" / "nvcc"
    cuda = Cuda(home=found.home, nvcc=nvcc, version=nvcc_version(nvcc),
                origin=f"managed {requirement}", toolkit=found.versions, choice=why)
    return Finding("nvcc", "OK", f"{cuda.version} at {cuda.nvcc} ({cuda.origin}: "
                   f"{found.describe()}); {why}"), cuda


def _check_archs(cuda: Cuda | None, archs: tuple[Arch, ...]) -> list[Finding]:
    out: list[Finding] = []
    listed = supported_sass(cuda.nvcc) if cuda is not None else frozenset()
    for arch in archs:
        name = f"arch {arch}"
        need = min_cuda(arch)
        base = f"sm_{arch.major}{arch.minor}"
        if cuda is None:
            out.append(Finding(name, "SKIP", "not checked: no usable CUDA toolkit (see nvcc)"))
        elif need is not None and cuda.version < Version(need):
            out.append(Finding(
                name, "FAIL", f"needs CUDA {need}+, nvcc is {cuda.version}",
                f"install CUDA {need} or newer and point CUDA_HOME at it (e.g. "
                f"CUDA_HOME=/usr/local/cuda-13.0), or drop {arch} from --arch"))
        elif listed and arch.sm not in listed and base not in listed:
            out.append(Finding(
                name, "FAIL", f"nvcc {cuda.version} does not list {arch.sm} in --list-gpu-code",
                "use a CUDA toolkit that supports it, or drop it from --arch"))
        elif need is None and not listed:
            out.append(Finding(
                name, "WARN", f"{arch.sm}: unknown to wheelforge and nvcc --list-gpu-code gave "
                "no answer", "check the compute capability (nvidia-smi --query-gpu=compute_cap "
                "--format=csv)"))
        else:
            since = f", needs {need}+" if need else ""
            out.append(Finding(name, "OK", f"{arch.sm}: nvcc {cuda.version}{since}"))
    return out


# -- torch -------------------------------------------------------------------------------------

_Managed = tuple[str | None, tuple[str, ...], Path | None, Path]


def _check_torch(python: Path | None, cuda: Cuda | None,
                 managed: _Managed = (None, (), None, Path())) -> list[Finding]:
    where = str(python)
    if python is None:
        spec, pip_args, base, cache_dir = managed
        if spec is None:
            return [Finding("torch", "SKIP", "no --python and no torch requirement: not checked")]
        existing = _existing_managed_env(spec, pip_args, base, cache_dir)
        if existing is None:
            return _check_torch_spec(spec, pip_args, cuda)
        python, where = existing, f"the managed environment {existing.parent.parent}"
    try:
        env = inspect_env(python)
    except WheelforgeError as exc:
        return [Finding("torch", "FAIL", _what_why(exc), exc.fix)]
    torch = f"torch {env.torch_version}"
    out = [Finding("torch", "OK", f"{torch} (CUDA {env.torch_cuda or 'none'}) in {where}")]
    if env.torch_cuda is None:
        out.append(Finding(
            "torch cuda", "FAIL", f"{torch} is a CPU-only build",
            "install a CUDA build of torch into that environment (e.g. from the cu130 index), "
            "or leave out --python to use the managed environment"))
    elif cuda is None:
        out.append(Finding("torch cuda", "SKIP",
                           f"{torch} is built for CUDA {env.torch_cuda}; not compared: no nvcc"))
    elif Version(env.torch_cuda).major != cuda.version.major:
        major = Version(env.torch_cuda).major
        out.append(Finding(
            "torch cuda", "FAIL",
            f"{torch} is built for CUDA {env.torch_cuda}, nvcc is {cuda.version}",
            f"point CUDA_HOME at a CUDA {major}.x toolkit, or use an environment whose torch is "
            f"built for CUDA {cuda.version.major}"))
    else:
        out.append(Finding("torch cuda", "OK",
                           f"torch CUDA {env.torch_cuda}, nvcc {cuda.version}: same major"))
    return out


def _existing_managed_env(spec: str, pip_args: tuple[str, ...], base: Path | None,
                          cache_dir: Path) -> Path | None:
    """The python of the managed environment a build would use, if it exists already."""
    if base is None:
        return None
    root = cache_dir / "envs" / env_key(base, spec, BASE_REQUIREMENTS, pip_args)
    python = root / "bin" / "python"
    return python if (root / MARKER).is_file() and python.exists() else None


def _check_torch_spec(spec: str, pip_args: tuple[str, ...], cuda: Cuda | None) -> list[Finding]:
    """The managed environment does not exist yet: judge its torch by the requirement."""
    expected, source = expected_torch_cuda(spec, pip_args)
    out = [Finding("torch", "OK", f"the managed environment (not created yet) will have {spec}"
                   + (f" ({' '.join(pip_args)})" if pip_args else "")
                   + (f": CUDA {expected}, {source}" if expected else ""))]
    if expected == "none":
        out.append(Finding("torch cuda", "FAIL", f"{spec} from {source} is a CPU-only build",
                           "use a CUDA index (e.g. https://download.pytorch.org/whl/cu130) in "
                           "torch-pip-args of wheelforge.yaml"))
    elif expected is None:
        out.append(Finding("torch cuda", "SKIP", f"cannot tell the CUDA of {spec} before the "
                           "environment exists",
                           "pin torch (--torch 'torch==2.14.1') or give its index in "
                           "torch-pip-args (e.g. .../whl/cu130); the build checks it again"))
    elif cuda is None:
        out.append(Finding("torch cuda", "SKIP", f"{spec} is built for CUDA {expected}; not "
                           "compared: no nvcc"))
    elif Version(expected).major != cuda.version.major:
        out.append(Finding(
            "torch cuda", "FAIL", f"{spec} is built for CUDA {expected}, nvcc is {cuda.version}",
            f"point CUDA_HOME at a CUDA {Version(expected).major}.x toolkit, or pick a torch "
            f"built for CUDA {cuda.version.major} (--torch, torch-pip-args)"))
    else:
        out.append(Finding("torch cuda", "OK", f"torch CUDA {expected} ({source}), nvcc "
                           f"{cuda.version}: same major"))
    return out


#: The CUDA of the torch wheels on PyPI (Linux x86_64) by torch release, where wheelforge
#: knows it; other releases are judged once their environment exists.
PYPI_TORCH_CUDA: dict[str, str] = {"2.14": "13.0"}
_CU_INDEX = re.compile(r"/whl/(?:(?P<cpu>cpu)|cu(?P<cu>\d{3,}))/?$")
_CU_LOCAL = re.compile(r"^(?:(?P<cpu>cpu)|cu(?P<cu>\d{3,}))$")


def expected_torch_cuda(spec: str, pip_args: tuple[str, ...]) -> tuple[str | None, str]:
    """The CUDA (``"13.0"``, ``"none"`` for a CPU build, None when unknown) that torch
    ``spec`` installed with ``pip_args`` will be built for, and how that is known."""
    from packaging.requirements import InvalidRequirement, Requirement

    def cuda_of(m: re.Match[str]) -> str:
        return "none" if m["cpu"] else f"{m['cu'][:-1]}.{m['cu'][-1]}"

    try:
        req = Requirement(spec)
    except InvalidRequirement:
        return None, ""
    pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if pinned and "+" in pinned[0]:
        m = _CU_LOCAL.match(pinned[0].split("+", 1)[1])
        if m:
            return cuda_of(m), f"its local version +{pinned[0].split('+', 1)[1]}"
    for arg in pip_args:
        m = _CU_INDEX.search(arg)
        if m:
            return cuda_of(m), f"the index {arg}"
    if pinned and not any(a.startswith(("--index-url", "-i")) for a in pip_args):
        release = ".".join(pinned[0].split("+")[0].split(".")[:2])
        if release in PYPI_TORCH_CUDA and not pinned[0].endswith("*"):
            return PYPI_TORCH_CUDA[release], f"PyPI's torch {release} wheels"
    return None, ""


# -- host compiler -----------------------------------------------------------------------------

def _check_host_compiler(cuda: Cuda | None, env: Mapping[str, str]) -> Finding:
    """The compiler nvcc will use: $NVCC_CCBIN, $CC (torch passes it as -ccbin), $CXX, gcc."""
    origin, command = next(((f"${v}", env[v]) for v in ("NVCC_CCBIN", "CC", "CXX")
                            if env.get(v)), ("default", "gcc"))
    argv = shlex.split(command)
    exe = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    if not argv or exe is None:
        return Finding("compiler", "FAIL", f"{command!r} ({origin}) was not found",
                       "install gcc and g++ (e.g. apt install build-essential) or set CC and "
                       "CXX to a compiler")
    done = _proc.run([exe, *argv[1:], "--version"], env=env, check=False, timeout=_TIMEOUT)
    family, version = _compiler_version(done.output)
    if done.returncode != 0 or family is None or version is None:
        return Finding("compiler", "WARN", f"cannot tell the version of {exe} ({origin}): "
                       f"{_first_line(done.output)!r}",
                       "use gcc or clang as the host compiler")
    what = f"{family} {version} at {exe}"
    if origin != "default":
        what += f" ({origin})"
    if cuda is None:
        return Finding("compiler", "WARN", f"{what}; not compared: no nvcc")
    limit, source, exact = _compiler_limit(cuda, family)
    if limit is None:
        return Finding("compiler", "WARN", f"{what}; no known {family} bound for CUDA "
                       f"{cuda.version}", "if nvcc rejects it, use gcc")
    major = int(version.split(".")[0])
    if major <= limit:
        return Finding("compiler", "OK", f"{what}; CUDA {cuda.version} accepts {family} <= "
                       f"{limit} ({source})")
    fix = (f"install {family} {limit} or older and select it with CC and CXX (e.g. "
           f"CC={family}-{limit} CXX={'g++' if family == 'gcc' else 'clang++'}-{limit}), "
           "or use a newer CUDA toolkit")
    if not exact:
        return Finding("compiler", "WARN", f"{what}; CUDA {cuda.version} is newer than "
                       f"wheelforge's table, whose {source} accepts {family} <= {limit}", fix)
    return Finding("compiler", "FAIL", f"{what}; CUDA {cuda.version} accepts {family} <= "
                   f"{limit} ({source})", fix)


def _compiler_version(output: str) -> tuple[Compiler | None, str | None]:
    first = _first_line(output)
    m = re.search(r"clang version (\d+\.\d+(?:\.\d+)?)", first)
    if m:
        return "clang", m.group(1)
    if ("Free Software Foundation" in output or "(GCC)" in first
            or re.match(r"\S*(?:gcc|g\+\+|cc|c\+\+)(?:-[\d.]+)?\s", first)):
        m = re.search(r"\)\s+(\d+\.\d+(?:\.\d+)?)", first) or re.search(
            r"\b(\d+\.\d+\.\d+)\b", first)
        return "gcc", m.group(1) if m else None
    return None, None


def _compiler_limit(cuda: Cuda, family: Compiler) -> tuple[int | None, str, bool]:
    """(newest accepted major, where that comes from, whether it is this exact release)."""
    for header in (cuda.home / "include" / "crt" / "host_config.h",
                   *sorted(cuda.home.glob("targets/*/include/crt/host_config.h"))):
        try:
            text = header.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if family == "gcc":
            m = re.search(r"#if __GNUC__ > (\d+)", text)
            if m:
                return int(m.group(1)), "its host_config.h", True
        else:
            m = re.search(r"clang version must be less than (\d+)", text)
            if m:
                return int(m.group(1)) - 1, "its host_config.h", True
    release = Version(f"{cuda.version.major}.{cuda.version.minor}")
    rows = sorted((Version(k), v) for k, v in HOST_COMPILER_MAX.items())
    exact = dict(rows).get(release, {})
    if family in exact:
        return exact[family], f"CUDA {release}", True
    known = [(v, row[family]) for v, row in rows if family in row]
    if rows and release > rows[-1][0] and known:  # newer than the table: judge by its newest row
        return known[-1][1], f"CUDA {known[-1][0]}", False
    return None, "", False


# -- ninja, objcopy and git --------------------------------------------------------------------

def _check_ninja(python: Path | None, env: Mapping[str, str]) -> Finding:
    candidates = []
    if python is not None:
        candidates.append(str(python.parent / "ninja"))
    found = shutil.which("ninja", path=env.get("PATH"))
    if found:
        candidates.append(found)
    for exe in candidates:
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            done = _proc.run([exe, "--version"], env=env, check=False, timeout=_TIMEOUT)
            if done.returncode == 0:
                return Finding("ninja", "OK", f"{_first_line(done.output)} at {exe}")
    if python is None:
        return Finding("ninja", "SKIP", "not on PATH, and no managed environment yet: the "
                       "managed environment the first build creates installs it")
    return Finding("ninja", "WARN", f"neither in {python.parent} nor on PATH: torch falls back "
                   "to its slow, serial distutils build", f"{python} -m pip install ninja")


def _check_objcopy(env: Mapping[str, str]) -> Finding:
    """binutils' objcopy: the opt-in nvcc step runner (``WHEELFORGE_NVCC_STEPS=1``,
    builder/compiling/nvccsteps.py) needs it for each CUDA unit's host compile beside its
    ptxas; without it nvcc runs its steps itself, one after another, as it does by default."""
    exe = shutil.which("objcopy", path=env.get("PATH"))
    if exe is not None:
        done = _proc.run([exe, "--version"], env=env, check=False, timeout=_TIMEOUT)
        if done.returncode == 0:
            return Finding("objcopy", "OK", f"{_first_line(done.output)} at {exe}")
    if not jobserver.runs_steps(env):
        return Finding("objcopy", "SKIP",
                       ("not on PATH" if exe is None else f"{exe} --version failed")
                       + ": only the nvcc step runner needs it (WHEELFORGE_NVCC_STEPS=1), "
                       "and it is off")
    return Finding("objcopy", "WARN",
                   ("not on PATH" if exe is None else f"{exe} --version failed")
                   + ": each CUDA unit's host compile runs after its ptxas, as nvcc runs it, "
                   "not beside it on a free core",
                   "install binutils (e.g. apt install binutils)")


def _check_git(env: Mapping[str, str]) -> Finding:
    exe = shutil.which("git", path=env.get("PATH"))
    fix = "install git (e.g. apt install git): patches are applied with git apply"
    if exe is None:
        return Finding("git", "FAIL", "git was not found on PATH", fix)
    done = _proc.run([exe, "--version"], env=env, check=False, timeout=_TIMEOUT)
    if done.returncode != 0:
        return Finding("git", "FAIL", f"{exe} --version failed: "
                       f"{_first_line(done.output)!r}", fix)
    return Finding("git", "OK", f"{_first_line(done.output)} at {exe}")


# -- resources ---------------------------------------------------------------------------------

def _check_disk(name: str, path: Path, option: str | None) -> Finding:
    """Free space where ``path`` is (or would be); ``option`` moves it, None: it is fixed."""
    where = _nearest_existing(path)
    free = shutil.disk_usage(where).free / 2**30
    detail = f"{free:.1f} GiB free at {where}"
    if where != path:
        detail += f" (for {path})"
    fix = (f"free space there, or point {option} at a disk with {DISK_WARN_GIB:g} GiB or more "
           "free" if option else
           f"free space there ({DISK_WARN_GIB:g} GiB or more): every build compiles at this "
           "fixed path, so that builders agree (docs/reproducible.md)")
    if free < DISK_FAIL_GIB:
        return Finding(name, "FAIL", f"{detail}, below {DISK_FAIL_GIB:g} GiB", fix)
    if free < DISK_WARN_GIB:
        return Finding(name, "WARN", f"{detail}, below {DISK_WARN_GIB:g} GiB", fix)
    return Finding(name, "OK", detail)


def _nearest_existing(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_memory(jobs: int | None, env: Mapping[str, str],
                  per_job: float = config.DEFAULT_GIB_PER_JOB) -> Finding:
    mem = config.memory_available_gib()
    if mem <= 0:
        return Finding("memory", "WARN", "cannot read the available memory (/proc/meminfo)",
                       f"plan about {per_job:g} GiB per compile job when choosing --jobs")
    if jobs is not None:
        n, origin = jobs, "--jobs"
    elif env.get("MAX_JOBS", "").isdigit() and int(env["MAX_JOBS"]) > 0:
        n, origin = int(env["MAX_JOBS"]), "MAX_JOBS"
    else:
        n, origin = config.auto_jobs(config.cpu_count(), mem, per_job), "auto"
    each = mem / n
    detail = f"{mem:.1f} GiB available, {n} jobs ({origin}): {each:.1f} GiB per job"
    if each >= per_job:
        return Finding("memory", "OK", detail)
    suggested = max(1, int(mem // per_job))
    if suggested < n:
        fix = f"use --jobs {suggested} (about {per_job:g} GiB per nvcc job)"
    else:
        fix = f"free memory or add swap: one nvcc job can take about {per_job:g} GiB"
    return Finding("memory", "WARN", f"{detail}, below {per_job:g} GiB", fix)


# -- helpers -----------------------------------------------------------------------------------

def _what_why(exc: WheelforgeError) -> str:
    return f"{exc.what}: {exc.why}" if exc.why else exc.what


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
