"""builder/env/bytecode.py: the build's imports keep their bytecode where the caller's
environment says to write none; a given environment is never written to."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from wheelforge.builder.env import bytecode

BASE = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture
def env(tmp_path: Path) -> Path:
    """A venv holding a package ``torch`` without bytecode (as uv installs it)."""
    root = tmp_path / "env"
    venv.create(root, with_pip=False)
    site = next(root.glob("lib/python*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("x = 1\n")
    return root / "bin" / "python"


def _import(python: Path, environ: dict[str, str]) -> None:
    subprocess.run([str(python), "-c", "import torch"], env=environ, check=True,
                   timeout=120)


def test_a_given_environment_keeps_its_bytecode_in_wheelforges_cache(
        env: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    environ = bytecode.environ(BASE, python=env, managed=False, cache_dir=cache)
    assert "PYTHONDONTWRITEBYTECODE" not in environ
    assert environ["PYTHONPYCACHEPREFIX"] == str(cache / bytecode.PYCACHE)
    _import(env, environ)
    site = next(env.parent.parent.glob("lib/python*/site-packages"))
    assert not (site / "torch" / "__pycache__").exists()  # the user's, untouched
    assert list((cache / bytecode.PYCACHE).rglob("torch/__init__*.pyc"))


def test_a_managed_environment_gets_its_bytecode_beside_its_modules(
        env: Path, tmp_path: Path) -> None:
    environ = bytecode.environ(BASE, python=env, managed=True, cache_dir=tmp_path / "c")
    assert "PYTHONDONTWRITEBYTECODE" not in environ and "PYTHONPYCACHEPREFIX" not in environ
    _import(env, environ)
    site = next(env.parent.parent.glob("lib/python*/site-packages"))
    assert list((site / "torch" / "__pycache__").glob("__init__*.pyc"))
    assert not (tmp_path / "c").exists()


@pytest.mark.unit
def test_nothing_changes_where_bytecode_may_be_written_or_is_there(
        env: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    written = {"PATH": BASE["PATH"]}
    assert bytecode.environ(written, python=env, managed=False, cache_dir=cache) == written
    own = {**BASE, "PYTHONPYCACHEPREFIX": str(tmp_path / "mine")}  # the caller's: kept
    assert bytecode.environ(own, python=env, managed=True, cache_dir=cache) == own
    site = next(env.parent.parent.glob("lib/python*/site-packages"))
    (site / "torch" / "__pycache__").mkdir()  # installed by pip, compiled: read as it is
    assert bytecode.environ(BASE, python=env, managed=False, cache_dir=cache) == BASE


def test_the_backend_puts_no_bytecode_in_the_wheel(tmp_path: Path) -> None:
    """With the variable dropped, bdist_wheel still writes no .pyc into the wheel."""
    import zipfile

    tree = tmp_path / "proj"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("x = 1\n")
    (tree / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='bc', version='0.1', packages=['pkg'])\n")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "setup.py", "-q", "bdist_wheel", "-d", str(tmp_path / "d")],
                   cwd=tree, env=environ, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "d").glob("*.whl")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".pyc")]


def _unpacked(tmp_path: Path) -> Path:
    """An unpacked 'wheel' whose module imports the environment's torch."""
    where = tmp_path / "wf-verify-x"
    (where / "pkg").mkdir(parents=True)
    (where / "pkg" / "__init__.py").write_text("import torch\nVALUE = torch.x\n")
    return where


def test_the_import_check_keeps_the_environments_bytecode_and_forgets_the_wheels(
        env: Path, tmp_path: Path) -> None:
    """A given environment's import check, cold and warm: torch's bytecode stays in the
    cache for the next check; what the wheel's modules left in the mirror of their
    temporary directory is removed; the user's environment gets nothing."""
    from wheelforge.builder.artifact.importcheck import WarmImports, cold_problems

    cache = tmp_path / "cache"
    environ = bytecode.environ({**os.environ, **BASE}, python=env, managed=False,
                               cache_dir=cache)
    prefix = cache / bytecode.PYCACHE
    where = _unpacked(tmp_path)
    assert cold_problems(env, where, ("pkg",), False, None, environ) == []
    assert list(prefix.rglob("torch/__init__*.pyc"))
    mirror = prefix / str(where.resolve()).lstrip(os.sep)
    assert list(mirror.rglob("*.pyc"))  # the wheel's, until forgotten
    bytecode.forget(environ, where)
    assert not mirror.exists() and list(prefix.rglob("torch/__init__*.pyc"))

    for pyc in prefix.rglob("*.pyc"):
        pyc.unlink()
    with WarmImports(preload="torch") as warm:
        warm.start(env, environ)
        assert warm.problems(env, where, ("pkg",), None) == []
    assert list(prefix.rglob("torch/__init__*.pyc"))  # the warm interpreter's import
    bytecode.forget(environ, where)
    assert not mirror.exists()
    site = next(env.parent.parent.glob("lib/python*/site-packages"))
    assert not (site / "torch" / "__pycache__").exists()
    assert not (where / "pkg" / "__pycache__").exists()


@pytest.mark.unit
def test_forget_removes_only_the_mirror_of_its_directory(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    mirrors = [prefix / str(p).lstrip(os.sep) for p in (link, real)]
    other = prefix / str(tmp_path / "other").lstrip(os.sep)
    for d in (*mirrors, other):
        d.mkdir(parents=True)
        (d / "m.cpython-311.pyc").write_bytes(b"")
    bytecode.forget({}, link)  # no prefix: nothing to do
    assert all(d.exists() for d in mirrors)
    bytecode.forget({"PYTHONPYCACHEPREFIX": str(prefix)}, link)
    assert not any(d.exists() for d in mirrors) and other.exists()
