"""The stack as users install it: the four shipped recipes built as `make build` builds them
(real nvcc, the managed torch 2.14.1; the run's one build, tests/upstream.py), the stack
gate run for real (a fresh venv, pip resolving the dependencies from the package index
users have), and then the install lines
the build printed, pasted into a shell from another directory, and one interpreter that
imports the whole stack.

The causal-conv1d and mamba-ssm end-to-end tests check the same build's wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from upstream import RECIPES, StackBuild
from wheelforge.index import health

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

CHANNEL = "cu130-torch2.14"
IMPORTS = "torch, causal_conv1d, causal_conv1d_cuda, selective_scan_cuda, mamba_ssm, fla, " \
          "fla.layers"


@pytest.fixture(scope="module")
def built(upstream_stack: StackBuild) -> tuple[Path, str]:
    """The run's one build of the four shipped recipes, as `make build` runs it, the stack
    gate on (tests/upstream.py)."""
    return upstream_stack.index, upstream_stack.output


def test_the_gate_finds_the_stack_good_and_names_what_it_resolved(
        built: tuple[Path, str]) -> None:
    index, out = built
    line = next(ln for ln in out.splitlines() if ln.startswith(f"stack {CHANNEL}: "))
    assert line.startswith(f"stack {CHANNEL}: good (with "), out[-4000:]
    assert "torch 2.14.1" in line
    status = health.read_status(index, CHANNEL)
    assert status is not None and status.state == "good", status
    assert status.resolved["torch"] == "2.14.1"
    assert sorted(p.split("==")[0] for p in status.pins) == sorted(RECIPES)
    modules = [o.module for o in status.imports]
    for m in ("torch", "causal_conv1d_cuda", "causal_conv1d", "selective_scan_cuda",
              "mamba_ssm", "fla", "fla.layers", "fla.models"):
        assert m in modules
    assert all(o.ok for o in status.imports)
    assert status.pip_check == ""
    page = (index / "index.html").read_text()
    assert f'<b>{CHANNEL}</b>: <span class="ok">good (with ' in page


def _user_env(home: Path) -> dict[str, str]:
    """A user whose home is ``home``: ~/venvs/stack lies there; pip's and uv's download
    caches stay this machine's (XDG_CACHE_HOME), so torch is not fetched again."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "WHEELFORGE_STACK_CHECK")}
    env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME",
                                           str(Path.home() / ".cache"))
    env["HOME"] = str(home)
    uv = Path(sys.executable).with_name("uv")
    env["PATH"] = f"{uv.parent}:{env['PATH']}"
    return env


def _imports_the_stack(python: Path, cwd: Path, env: dict[str, str]) -> None:
    probe = subprocess.run(
        [str(python), "-c",
         f"import json, {IMPORTS}; import importlib.metadata as md; "
         "print(json.dumps({d: md.version(d) for d in ('causal-conv1d', 'mamba-ssm', "
         "'fla-core', 'flash-linear-attention')}))"],
        cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=600)
    assert probe.returncode == 0, probe.stdout[-6000:]
    versions = json.loads(probe.stdout.strip().splitlines()[-1])
    assert versions["causal-conv1d"].endswith("+cu130torch2.14sm120")
    assert versions["mamba-ssm"].endswith(".cu130torch2.14sm120")
    assert versions["fla-core"].endswith("+wf")
    check = subprocess.run([str(python), "-m", "pip", "check"] if (python.parent / "pip").exists()
                           else [str(Path(sys.executable).with_name("uv")), "pip", "check",
                                 "--python", str(python)],
                           cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=300)
    assert check.returncode == 0, check.stdout


def _printed(out: str) -> list[str]:
    """The command lines (not comments) of the install block `wheelforge build` printed."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("install ("))
    return [ln for ln in lines[start + 1:] if ln and not ln.startswith(("#", "stack "))]


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_printed_install_pasted_from_another_directory_imports_the_stack(
        built: tuple[Path, str], tmp_path: Path, installer: str) -> None:
    """The line `wheelforge build` printed (`wheelforge install ...` with absolute paths,
    or uv's line), run by a shell as printed, from a directory that is not the checkout,
    into ~/venvs/stack of a new user; then one interpreter imports the whole stack."""
    _, out = built
    wf_line, uv_line = _printed(out)
    assert " install --index /" in wf_line and wf_line.endswith(" --python ~/venvs/stack")
    uv = uv_line.split(" ")[4]  # uv's absolute path: the shell's PATH need not hold it
    assert os.path.isabs(uv), uv_line
    assert uv_line.startswith(f"test -d ~/venvs/stack || {uv} venv --python 3.11 ~/venvs/stack "
                              f"&& {uv} pip install ")
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    elsewhere.mkdir(parents=True)
    env = _user_env(home)
    res = subprocess.run(["bash", "-euo", "pipefail", "-c",
                          wf_line if installer == "pip" else uv_line],
                         cwd=elsewhere, env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=3600)
    assert res.returncode == 0, res.stdout[-6000:]
    assert "WARNING: Location" not in res.stdout
    _imports_the_stack(home / "venvs" / "stack" / "bin" / "python", elsewhere, env)
