"""Shared fixtures: tiny projects packed as sdists, recipe books, tool checks."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import tiers
import workers
from wheelforge.builder.config import default_cache_dir

PACKAGES = Path(__file__).parent / "packages"
REPO = Path(__file__).parent.parent
IN_CI = os.environ.get("CI") == "true"
# The stack gate (a fresh venv with every wheel of a channel and its dependencies, after each
# build) is off for the tests whose subject is something else: they build fixture wheels by
# the hundred.  tests/test_stack.py and tests/test_e2e_stack.py run it for real.
os.environ["WHEELFORGE_STACK_CHECK"] = "off"
#: the platform tag an extension built here gets (builder/artifact/platform.py: the newest manylinux
#: policy its symbols allow, which the host's compiler and glibc decide)
MANYLINUX = r"manylinux_2_[0-9]+_x86_64"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's cost tier as its marker (tests/tiers.py), before ``-m`` selects; under
    ``--dist loadgroup``, in the order its groups go to the workers (tests/workers.py)."""
    tiers.mark_tiers(items)
    if workers.on_a_grouping_worker(config):
        workers.order_for_workers(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the groups of tests/workers.py (a module, or the modules that
    share the upstream builds), longest first."""
    if config.getoption("dist") == "loadgroup":
        return workers.ModuleGroups(config, log)
    return None


#: a unit-tier test runs with no process allowed (tests/tiers.py)
pytest_runtest_protocol = tiers.pytest_runtest_protocol


def built_wheel(files: Path, stem: str) -> Path:
    """The one wheel ``STEM-manylinux_X_Y_x86_64.whl`` in ``files``."""
    found = sorted(files.glob(f"{stem}-manylinux_*_x86_64.whl"))
    assert len(found) == 1, f"expected one {stem}-manylinux_*.whl in {files}: {found}"
    return found[0]


def wheel_differences(a: Path, b: Path) -> list[str]:
    """What differs between two wheels, member by member (bytes, date, mode, order); empty
    when the files are byte for byte the same.  The comparison the reproducibility tests
    use (docs/reproducible.md has diffoscope's view of the same)."""
    if a.read_bytes() == b.read_bytes():
        return []
    out = [f"{a.name}: sha256 {hashlib.sha256(a.read_bytes()).hexdigest()} != "
           f"{hashlib.sha256(b.read_bytes()).hexdigest()}"]
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia, ib = za.infolist(), zb.infolist()
        if [i.filename for i in ia] != [i.filename for i in ib]:
            out.append(f"member order or names: {[i.filename for i in ia]} != "
                       f"{[i.filename for i in ib]}")
        other = {i.filename: i for i in ib}
        for x in ia:
            y = other.get(x.filename)
            if y is None:
                continue
            for field in ("date_time", "external_attr", "compress_type", "create_system"):
                if getattr(x, field) != getattr(y, field):
                    out.append(f"{x.filename}: {field} {getattr(x, field)} != "
                               f"{getattr(y, field)}")
            if za.read(x) != zb.read(y):
                out.append(f"{x.filename}: content differs ({x.file_size} and {y.file_size} "
                           "bytes)")
    return out


#: runs a command where no CUDA toolkit is visible (in a mount namespace of its own)
HIDE_CUDA = Path(__file__).with_name("hide_cuda.sh")


def hidden_cuda_prefix(empty: Path) -> list[str]:
    """The command prefix that runs a command on this machine as if it had no CUDA
    toolkit (tests/hide_cuda.sh under ``unshare -m``; ``empty``: an empty directory to
    mount over the toolkit).  Skips where that cannot be done; fails under CI=true."""
    prefix = ["unshare", "-m", str(HIDE_CUDA), str(empty)]
    can_hide = os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        [*prefix, "true"], capture_output=True).returncode == 0
    if not can_hide:
        why = ("hiding /usr/local/cuda needs root, unshare and the right to mount in a "
               "mount namespace (a container without CAP_SYS_ADMIN has none)")
        if IN_CI:
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    return prefix


def require_tool(name: str, path: str | None = None) -> str:
    """Return the tool's path; skip with a reason when absent, but fail under CI=true."""
    found = path if path and os.access(path, os.X_OK) else shutil.which(name)
    if found:
        return found
    if IN_CI:
        pytest.fail(f"{name} is required under CI=true and was not found")
    pytest.skip(f"{name} not found on this machine")


def require_python311() -> None:
    """Skip unless this is Python 3.11 (the local torch 2.14.1 CUDA wheel, and so the managed
    build environment, is for 3.11 only); fail instead under CI=true, which runs 3.11."""
    if sys.version_info[:2] == (3, 11):
        return
    why = (f"the local torch 2.14.1 CUDA wheel is for Python 3.11, this is "
           f"{sys.version_info[0]}.{sys.version_info[1]}")
    if IN_CI:
        pytest.fail(f"CI=true runs Python 3.11: {why}")
    pytest.skip(why)


@pytest.fixture
def nvcc() -> str:
    return require_tool("nvcc", "/usr/local/cuda/bin/nvcc")


@contextlib.contextmanager
def ctrl_c_when(ready: Callable[[], bool]) -> Iterator[None]:
    """Ctrl-C as at a terminal: SIGINT to the main thread once ``ready()`` (and 0.3 s
    more).  Python's SIGINT handler is installed for the duration: a test run started
    in the background from a shell that is not interactive inherits SIGINT ignored, and
    Python keeps it ignored."""
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        while not ready():
            time.sleep(0.05)
        time.sleep(0.3)
        signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def make_sdist(src: Path, dest_dir: Path, name: str, version: str) -> tuple[Path, str]:
    """Pack ``src`` as ``name-version.tar.gz`` with a single top-level directory."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname=f"{name}-{version}",
               filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def write_recipe(root: Path, name: str, body: str,
                 patches: Mapping[str, str] | None = None) -> Path:
    """Write recipes/NAME.yaml (and patches/NAME/*) under ``root``; return the recipes dir."""
    rdir = root / "recipes"
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / f"{name}.yaml").write_text(body)
    for pname, text in (patches or {}).items():
        pdir = root / "patches" / name
        pdir.mkdir(parents=True, exist_ok=True)
        (pdir / pname).write_text(text)
    return rdir


def make_wheel(path: Path, files: Mapping[str, bytes | str], *, name: str = "demo",
               version: str = "1.0", tag: str = "py3-none-any",
               metadata_extra: str = "") -> Path:
    """Build a valid wheel from a dict of files (dist-info and RECORD generated)."""
    from wheelforge.wheel import record_hash

    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    content = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
    content[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"{metadata_extra}\n").encode()
    content[f"{dist}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                f"{'true' if tag.endswith('any') else 'false'}\nTag: {tag}\n"
                                ).encode()
    record = "".join(f"{k},{record_hash(v)},{len(v)}\n" for k, v in content.items())
    record += f"{dist}/RECORD,,\n"
    fname = path / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    path.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in content.items():
            zf.writestr(k, v)
        zf.writestr(f"{dist}/RECORD", record)
    fname.write_bytes(buf.getvalue())
    return fname


TINYEXT_RECIPE = """format: 1
name: tinyext
version: "0.1.0"
sources:
  - sdist: {{filename: tinyext-0.1.0.tar.gz, sha256: "{sha}"}}
patches: {patches}
build:
  kind: extension
  requires: [setuptools, wheel, ninja]
  drop-requires: [ninja]
verify:
  imports: [{imports}]
"""


def tinyext_project(root: Path, *, patches: Mapping[str, str] | None = None,
                    imports: str = "tinyext_cuda, tinyext") -> Path:
    """The CUDA fixture as an sdist in ROOT/sdists and its recipe in ROOT/recipes; returns
    the sdists directory."""
    sdists = root / "sdists"
    _, sha = make_sdist(PACKAGES / "tinyext", sdists, "tinyext", "0.1.0")
    names = "[" + ", ".join(patches or {}) + "]"
    write_recipe(root, "tinyext", TINYEXT_RECIPE.format(sha=sha, patches=names, imports=imports),
                 patches)
    return sdists


def pure_recipe(name: str, sha: str, *, imports: Sequence[str] | None = None,
                requires: Sequence[str] = (), env: Mapping[str, str] | None = None,
                version: str = "0.1.0") -> str:
    """A pure recipe: the sdist NAME-VERSION.tar.gz with ``sha``, built as a pure wheel
    (``requires`` and ``env`` in its build section when given), its import check
    ``imports`` (by default the name as a module).  Flow-style lists, as a person writes
    them: tests edit the text (``imports: [pureb]``)."""
    build = "".join([
        f"  requires: [{', '.join(requires)}]\n" if requires else "",
        "  env: {" + ", ".join(f'{k}: "{v}"' for k, v in (env or {}).items()) + "}\n"
        if env else ""])
    return (f'format: 1\nname: {name}\nversion: "{version}"\nsources:\n'
            f'  - sdist: {{filename: {name}-{version}.tar.gz, sha256: "{sha}"}}\n'
            f"build:\n  kind: pure\n{build}"
            f"verify:\n  imports: [{', '.join(imports or [name.replace('-', '_')])}]\n")


def tinypure_as(root: Path, name: str) -> Path:
    """tests/packages/tinypure copied to ROOT/pkgs/NAME as the project NAME (its package
    directory and its pyproject's name renamed); returns the copy."""
    src = root / "pkgs" / name
    shutil.copytree(PACKAGES / "tinypure", src)
    (src / "tinypure").rename(src / name)
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "tinypure"', f'name = "{name}"'))
    return src


def tinypure_project(root: Path) -> Path:
    """The pure fixture (tests/packages/tinypure) as an sdist in ROOT/sdists and its recipe
    in ROOT/recipes; returns the sdists directory."""
    sdists = root / "sdists"
    _, sha = make_sdist(PACKAGES / "tinypure", sdists, "tinypure", "0.1.0")
    write_recipe(root, "tinypure", pure_recipe("tinypure", sha))
    return sdists


@pytest.fixture
def wheel_factory(tmp_path: Path) -> Callable[..., Path]:
    def factory(files: Mapping[str, bytes | str], **kw: str) -> Path:
        return make_wheel(tmp_path / "wheels", files, **kw)
    return factory


@pytest.fixture(scope="module", autouse=True)
def _free_module_dirs(request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Remove the directories a test module made with ``tmp_path_factory.mktemp`` when the
    module ends with no failure (pytest's retention policy covers ``tmp_path`` only).  Each
    e2e module leaves several GB of venvs and wheels; kept to the end of the session they
    filled CI's disk.  A session-scoped fixture's directory (``session-*``) is left to it:
    other modules use it; a module with a failure keeps its directories."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed != failed:
        return
    for entry in set(base.iterdir()) - before:
        if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("session-"):
            shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture(scope="session")
def tinyext_cold(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 shared_cache: Path) -> Iterator[Any]:
    """The CUDA fixture (and tinypure) built once per run, every unit compiled
    (tests/fixture_build.py): the build fixture test's first build and the reproducibility
    test's first builder.  Removed at the session's end unless a test failed."""
    import fixture_build

    base = tmp_path_factory.getbasetemp() / "session-tinyext"
    base.mkdir()
    failed = request.session.testsfailed
    yield fixture_build.build_cold(base / "p", shared_cache)
    if request.session.testsfailed == failed:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def upstream_cold(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  shared_cache: Path) -> Iterator[Any]:
    """causal-conv1d, fla-core and flash-linear-attention compiled for real, once per run
    (tests/upstream.py, step 1); removed at the session's end unless a test failed.  A
    failed build fails each test that asks for it, without building again."""
    import upstream

    base = tmp_path_factory.getbasetemp() / "session-upstream"
    base.mkdir()
    failed = request.session.testsfailed
    yield upstream.build_cold(base, shared_cache)
    if request.session.testsfailed == failed:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def upstream_stack(upstream_cold: Any, shared_cache: Path) -> Any:
    """The four shipped recipes as `make build` builds them, into ``upstream_cold``'s index,
    once per run (tests/upstream.py, step 2)."""
    import upstream

    return upstream.build_stack(upstream_cold, shared_cache)


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """A temporary directory short enough for a compile-slot pool's socket (pytest's own
    can be too deep, and jobserver.pools_dir then puts the pool in /tmp), removed after."""
    path = Path(tempfile.mkdtemp(prefix="wf-short-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """The user's wheelforge cache: managed torch environments are shared with `make build`."""
    return default_cache_dir()


@pytest.fixture(scope="session")
def uv() -> str:
    """The uv binary; installed from PyPI into this venv when missing (it belongs in the
    `test` extra).  Skipped when it cannot be had, except under CI=true."""
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", "uv"],
                              capture_output=True, text=True, timeout=600)
        found = str(beside) if beside.is_file() else None
        if found is None:
            why = f"uv is not installed and `pip install uv` failed: {done.stderr[-500:]}"
            if IN_CI:
                pytest.fail(f"uv is required under CI=true: {why}")
            pytest.skip(why)
    return found


def setup_py_function(tree: Path, name: str, **scope: Any) -> Callable[[], list[str]]:
    """The function ``name`` of ``tree``'s setup.py, compiled on its own with ``scope`` as
    its globals (setup.py as a whole needs torch): the unit generators of the split
    patches (causal-conv1d's bwd_units, mamba-ssm's selective_scan_units)."""
    module = ast.parse((tree / "setup.py").read_text())
    (fn,) = [n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == name]
    namespace: dict[str, Any] = {"os": os, "this_dir": str(tree), **scope}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]  # type: ignore[no-any-return]


def tree_files(tree: Path) -> dict[str, bytes]:
    """Every file under ``tree`` by its relative path: the split patches' tests compare the
    trees before and after a patch with it."""
    return {p.relative_to(tree).as_posix(): p.read_bytes()
            for p in tree.rglob("*") if p.is_file()}


def assert_units_stable(units: Callable[[], list[str]], root: Path,
                        expected: Mapping[int, int]) -> None:
    """A second run of a unit generator (pip runs setup.py twice) returns the same units
    and rewrites none of them under ``root``, so ninja does not compile them again; with
    MAX_JOBS unset it makes ``expected[cores]`` units (one job per usable core)."""
    first = units()
    jobs = len(os.sched_getaffinity(0))
    if jobs in expected:
        assert len(first) == expected[jobs]
    stamps = {u: (root / u).stat().st_mtime_ns for u in first}
    time.sleep(0.01)
    assert units() == first
    assert {u: (root / u).stat().st_mtime_ns for u in first} == stamps


def broken_torch(root: Path) -> Path:
    """A torch package whose version file reads well and whose import fails, as a torch
    with a missing CUDA library does: the directory to put on PYTHONPATH."""
    pkg = root / "broken-torch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise ImportError('libcudnn.so.9: cannot open shared object file')\n")
    (pkg / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")
    info = pkg.parent / "torch-2.14.1+cu130.dist-info"  # installed, as far as pip knows
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1+cu130\n")
    return pkg.parent



def uv_torch_venv(uv: str, venv: Path, torch: str, *more: str) -> Path:
    """A venv of this Python at ``venv`` with ``torch==TORCH`` and ``more`` installed by
    uv as a user would; its interpreter.  (The stable-ABI e2e modules load one wheel under
    several torches this way.)"""
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True,
                   timeout=300)
    py = venv / "bin" / "python"
    install = subprocess.run([uv, "pip", "install", "-q", "-p", str(py), f"torch=={torch}",
                              *more], text=True, capture_output=True, timeout=1800)
    assert install.returncode == 0, install.stderr[-3000:]
    return py
