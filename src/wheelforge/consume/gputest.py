"""Prove a published wheel on a real GPU: install it from the index, run the recipe's test.

The wheel is installed the way a user would install it, through the index, into a fresh
venv layered on the target interpreter (``--system-site-packages``, so its torch is
used).  The recipe's test files run from a scratch directory, never from the source
tree, so they exercise the installed wheel.  The result is recorded with the wheel.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from .. import _proc, index
from ..builder.env.buildenv import BuildEnv, inspect_env, missing_requirements
from ..builder.source.fetch import extract, fetch
from ..builder.source.patch import apply_series
from ..errors import GpuTestError, IncompatibleGpuError, NoGpuError, RecipeError, ToolchainError
from ..recipe.model import Recipe
from ..wheel import interpreter_fits
from . import _gpuprobe

Progress = Callable[[str], None]

#: The GPU probe, run by its file path in the test's interpreter.
GPU_PROBE = os.path.abspath(_gpuprobe.__file__)


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: str  # "9.0"
    driver: str | None


@dataclass(frozen=True)
class TestOutcome:
    status: str  # "passed" | "failed"
    passed: int
    failed: int
    skipped: int
    errors: int
    gpu: str
    capability: str
    driver: str | None
    date: str
    duration_s: float
    python: str
    torch: str

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def probe_gpu(python: Path) -> Gpu:
    try:
        out = _proc.run([str(python), GPU_PROBE]).output
    except _proc.CommandFailed as exc:
        if "No module named 'torch'" in exc.tail:  # not a missing GPU: a missing torch
            raise ToolchainError(f"{python} has no torch",
                                 why="wheelforge test runs the tests with the interpreter's "
                                     "torch (No module named 'torch')",
                                 fix="pass --python an interpreter with a CUDA build of torch "
                                     "(e.g. your training venv's python)") from exc
        raise NoGpuError(f"cannot ask torch in {python} about the GPU",
                         why=exc.tail.strip()[-400:],
                         fix="pass --python an interpreter with a CUDA build of torch") from exc
    info = json.loads(out.strip().splitlines()[-1])
    if not info["available"]:
        raise NoGpuError(
            "no CUDA GPU is visible on this machine",
            why=f"torch {info['torch']} (CUDA {info['torch_cuda'] or 'none'}) in {python} reports "
                "torch.cuda.is_available() == False",
            fix="run `wheelforge test` on a machine with an NVIDIA GPU and its driver; a wheel "
                "without a result stays marked 'untested' in the index",
        )
    return Gpu(info["name"], info["capability"], info.get("driver"))


def _cc(text: str) -> tuple[int, int, str]:
    digits = text.split("_", 1)[1]
    suffix = digits[-1] if digits[-1] in "af" else ""
    digits = digits.rstrip("af")
    return int(digits[:-1]), int(digits[-1]), suffix


def can_run(archs: tuple[str, ...], capability: str) -> bool:
    """Whether code for ``archs`` (sm_XY / compute_XY) can run on a GPU of ``capability``.

    SASS runs on the same major with an equal or higher minor ('a' and 'f' variants only on
    their own arch / family); PTX is JIT-compiled for any GPU at or above its arch.
    """
    major, minor = (int(x) for x in capability.split("."))
    for arch in archs:
        a_major, a_minor, suffix = _cc(arch)
        if arch.startswith("sm_"):
            if suffix == "a" and (a_major, a_minor) == (major, minor):
                return True
            if suffix != "a" and a_major == major and a_minor <= minor:
                return True
        elif arch.startswith("compute_") and not suffix and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _of_recipe(rec: index.WheelRecord, recipe: Recipe) -> bool:
    """Whether ``rec`` is a wheel of ``recipe``: its project's (a variant recipe's wheels
    carry the project's name: causal-conv1d-stable's are causal-conv1d's), from a stable
    channel for a stable-ABI recipe and from any other for the rest."""
    if rec.project != recipe.project_name or rec.yanked is not None:
        return False
    stable = rec.cuda is not None and rec.channel == index.stable_channel_name(rec.cuda)
    return stable == recipe.build.stable_abi


def pick_wheel(records: list[index.WheelRecord], recipe: Recipe, env: BuildEnv
               ) -> index.WheelRecord:
    """The newest published wheel of ``recipe`` that installs into ``env``.  A stable-ABI
    wheel fits every torch from the one it requires on (pip checks that), not only the
    torch it was built with."""
    tags = {str(t) for t in sys_tags()} if env.python_tag == _own_tag() else None
    candidates = []
    for rec in records:
        if not _of_recipe(rec, recipe):
            continue
        _, _, _, wtags = parse_wheel_filename(rec.filename)
        wtag_strs = {str(t) for t in wtags}
        if tags is not None:
            if not wtag_strs & tags:
                continue
        elif not interpreter_fits(rec.filename, env.python_tag):
            continue
        if rec.torch and env.torch_major_minor and not recipe.build.stable_abi and \
                not rec.torch.startswith(env.torch_major_minor + "."):
            continue
        candidates.append(rec)
    if not candidates:
        raise ToolchainError(
            f"no published wheel of {recipe.name} fits {env.python} "
            f"({env.python_tag}, torch {env.torch_version})",
            why="the index has none for this Python and torch",
            fix=f"build one first: wheelforge build {recipe.name} --python {env.python}",
        )
    return max(candidates, key=lambda r: (Version(r.version), r.upload_time))


_SITE_PROBE = (
    "import json, site, sysconfig; p = sysconfig.get_paths();"
    "print(json.dumps([p['purelib'], p['platlib'], *site.getsitepackages()]))"
)


def overlay_venv(python: Path, root: Path, log: Path | None) -> Path:
    """A fresh venv of ``python`` that also sees that interpreter's packages (torch, pytest).

    ``--system-site-packages`` is not enough: when ``python`` is itself a venv, the new
    venv would see the base interpreter's packages, not the venv's.  A .pth file adds the
    given interpreter's site directories after the new venv's own, so the wheel installed
    into the new venv wins and everything else comes from the given environment.
    """
    _proc.run([str(python), "-m", "venv", "--without-pip", str(root)], log=log)
    sites = json.loads(_proc.run([str(python), "-c", _SITE_PROBE]).output.strip()
                       .splitlines()[-1])
    vpy = root / "bin" / "python"
    own = _proc.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                    ).output.strip().splitlines()[-1]
    seen: list[str] = []
    for d in sites:
        if d not in seen and os.path.isdir(d):
            seen.append(d)
    Path(own, "_wheelforge_overlay.pth").write_text("\n".join(seen) + "\n")
    return vpy


def _own_tag() -> str:
    import sys

    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


def _junit_counts(path: Path) -> tuple[int, int, int, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failures = sum(int(s.get("failures", 0)) for s in suites)
    errors = sum(int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failures - errors - skipped, failures, skipped, errors


def collect_tests(recipe: Recipe, tests: Path, src: Path, *, cache_dir: Path,
                  sources_dirs: tuple[Path, ...], git_mirrors: Mapping[str, Path] | None,
                  say: Progress) -> Path:
    """The recipe's test files in ``tests``: those of the pinned, patched source tree
    (unpacked under ``src``) and those shipped beside the recipe."""
    tests.mkdir(parents=True)
    if recipe.test.source_files:
        fetched = fetch(recipe, cache_dir, sources_dirs, say, git_mirrors=git_mirrors)
        tree = extract(fetched.archive, src, recipe.extract)
        apply_series(tree, recipe.patches, project=recipe.name)
        for rel in recipe.test.source_files:
            shutil.copy2(tree / rel, tests / Path(rel).name)
    for f in recipe.test.files:
        if not f.is_file():
            raise RecipeError(f"{recipe.name}'s GPU test file {f} does not exist",
                              why="test.files of the recipe are read from gputests/NAME/ "
                                  "beside the recipes directory",
                              fix=f"copy gputests/{recipe.name}/ from the wheelforge checkout "
                                  "next to your recipes/")
        shutil.copy2(f, tests / f.name)
    return tests


def run_pytest(vpy: Path, tests: Path, junit: Path, *, workers: int, log: Path | None,
               say: Progress, what: str) -> tuple[_proc.Completed, tuple[int, int, int, int]]:
    """pytest over ``tests`` in the venv of ``vpy`` (``-n workers`` when above 1: several
    processes share the one GPU); the result and (passed, failed, skipped, errors)."""
    parallel = ["-n", str(workers)] if workers > 1 else []
    if parallel:
        say(f"pytest-xdist: {workers} workers")
    result = _proc.run([str(vpy), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *parallel, f"--junitxml={junit}", str(tests)], cwd=tests, log=log,
                       check=False, env={**os.environ, "PYTHONNOUSERSITE": "1"},
                       on_line=lambda ln: say(ln) if ("passed" in ln or "failed" in ln)
                       and ln.startswith("=") else None)
    if not junit.exists():
        raise GpuTestError(f"the test of {what} did not run",
                           why=result.output.strip()[-800:],
                           fix="read the log", log=str(log) if log else None)
    return result, _junit_counts(junit)


def run_test(
    recipe: Recipe,
    *,
    index_dir: Path,
    python: Path,
    cache_dir: Path,
    sources_dirs: tuple[Path, ...] = (),
    progress: Progress | None = None,
    log: Path | None = None,
    workers: int = 1,
    git_mirrors: Mapping[str, Path] | None = None,
) -> tuple[index.WheelRecord, TestOutcome]:
    say = progress or (lambda _m: None)
    if recipe.test.empty:
        raise RecipeError(f"recipe {recipe.name} declares no GPU test",
                          why="wheelforge test runs the files of the recipe's 'test:' section, "
                              "and it has none",
                          fix=f"add a 'test:' section to {recipe.path} (docs/recipe-format.md, "
                              "'The test section')")
    gpu = probe_gpu(python)
    say(f"GPU: {gpu.name} (compute capability {gpu.capability}, driver {gpu.driver or '?'})")
    env = inspect_env(python)
    record = pick_wheel(index.load_records(index_dir), recipe, env)
    say(f"wheel: {record.filename}")
    if record.archs and not can_run(record.archs, gpu.capability):
        raise IncompatibleGpuError(
            f"{record.filename} cannot run on {gpu.name} (compute capability {gpu.capability})",
            why=f"the wheel holds code for {', '.join(record.archs)} only, and no PTX that the "
                "driver could compile for this GPU; the test would die with 'no kernel image "
                "is available for execution on the device'",
            fix=f"build for this GPU: wheelforge build {recipe.name} --arch {gpu.capability}",
        )
    missing = missing_requirements(env, recipe.test.requires)
    if missing:
        raise ToolchainError(f"the test of {recipe.name} needs {', '.join(missing)} in {python}",
                             fix=f"{python} -m pip install " + " ".join(missing))
    with tempfile.TemporaryDirectory(prefix="wf-test-") as tmp:
        work = Path(tmp)
        vpy = overlay_venv(python, work / "venv", log)
        simple = (index_dir / "simple").as_uri()
        say(f"installing {recipe.project_name}=={record.version} from {simple}")
        try:
            _proc.run([str(vpy), "-m", "pip", "install",
                       "--disable-pip-version-check", "--no-cache-dir", "--index-url", simple,
                       f"{recipe.project_name}=={record.version}"], log=log,
                      env={**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
                           "PIP_CONFIG_FILE": os.devnull})
        except _proc.CommandFailed as exc:
            raise GpuTestError(f"pip could not install {record.filename} from the index",
                               why=exc.tail.strip()[-800:],
                               fix="check the wheel's requirements against the environment",
                               log=str(log) if log else None) from exc
        tests = collect_tests(recipe, work / "tests", work / "src", cache_dir=cache_dir,
                              sources_dirs=sources_dirs, git_mirrors=git_mirrors, say=say)
        say(f"running {', '.join(sorted(p.name for p in tests.iterdir()))} on {gpu.name}")
        start = time.monotonic()
        xdist = workers > 1 and "pytest-xdist" in dict(env.distributions)
        result, (passed, failed, skipped, errors) = run_pytest(
            vpy, tests, work / "junit.xml", workers=workers if xdist else 1, log=log, say=say,
            what=recipe.name)
        duration = time.monotonic() - start
    outcome = TestOutcome(
        status="passed" if result.returncode == 0 and failed == errors == 0 and passed > 0
        else "failed",
        passed=passed, failed=failed, skipped=skipped, errors=errors, gpu=gpu.name,
        capability=gpu.capability, driver=gpu.driver,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        duration_s=round(duration, 1), python=env.python_version, torch=env.torch_version or "",
    )
    updated = index.set_tested(index_dir, record.filename, outcome.as_record())
    return updated, outcome
