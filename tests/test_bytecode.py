"""builder/bytecode.py: the build's imports keep their bytecode where the caller's
environment says to write none; a given environment is never written to."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from wheelforge.builder import bytecode

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
