"""`wheelforge install`: a channel's wheels and their dependencies into a venv in one
command, from another directory, with real pip and real uv, against a fake public index
on 127.0.0.1 that offers the local names higher (and the dependency).  Then the commands
users run later in that venv.

Everything runs in a temporary HOME/XDG_CONFIG_HOME/XDG_CONFIG_DIRS (this machine's pip
and uv configuration is neither read nor touched), except where a test writes a "global"
pip file there on purpose.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import test_index_clients
from conftest import make_wheel
from test_index_clients import (
    CHANNEL,
    CU130,
    DEMO_LOCAL,
    fresh_venv,
    installed,
    pub,
)
from wheelforge import index

WF = [sys.executable, "-m", "wheelforge"]
#: the fixtures of tests/test_index_clients.py: the local index and the fake public one
local = test_index_clients.local
public = test_index_clients.public


def home_env(home: Path, public: str, **extra: str) -> dict[str, str]:
    """A user whose usual index is the fake public one, with no pip or uv files."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("PIP_", "UV_", "XDG_", "VIRTUAL_ENV"))
           and "proxy" not in k.lower() and k not in ("PYTHONPATH",)}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CONFIG_DIRS=str(home / "xdg"), XDG_CACHE_HOME=str(home / ".cache"),
               PIP_INDEX_URL=public, UV_DEFAULT_INDEX=public, UV_PYTHON_DOWNLOADS="never",
               PIP_DISABLE_PIP_VERSION_CHECK="1", NO_PROXY="127.0.0.1", NO_COLOR="1")
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir(exist_ok=True)
    return d


def kept(python: Path) -> bool:
    got = installed(python)
    return (got.get("wf-demo") == (DEMO_LOCAL, "local")
            and got.get("wf-helper") == ("0.6.0", "local")
            and got.get("wf-dep") == ("1.0", "public"))


def test_one_command_makes_the_venv_installs_and_later_pip_commands_keep_the_wheels(
        local: Path, public: str, tmp_path: Path) -> None:
    env = home_env(tmp_path / "home", public)
    venv = tmp_path / "home" / "venvs" / "stack"
    done = run([*WF, "install", "--index", str(local), "--python", str(venv)], env,
               elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    assert kept(python), installed(python)
    assert "WARNING" not in done.stdout + done.stderr
    assert f"installed into {venv}: wf-demo=={DEMO_LOCAL} wf-helper==0.6.0" in done.stdout
    conf = (venv / "pip.conf").read_text()
    assert f"find-links = {(local.resolve() / 'files').as_uri()}" in conf
    assert f"constraint = {(local.resolve() / CHANNEL / 'constraints.txt').as_uri()}" in conf
    # later commands, as users type them in that venv: the public index offers both higher
    for later in (["install", "-U", "wf-demo", "wf-helper"],
                  ["install", "--force-reinstall", "wf-demo"]):
        again = run([str(python), "-m", "pip", *later], env, elsewhere(tmp_path))
        assert again.returncode == 0, again.stderr
        assert kept(python), (later, installed(python))
        assert "WARNING" not in again.stdout + again.stderr, again.stderr


def test_uv_installs_in_one_command(local: Path, public: str, uv: str, tmp_path: Path) -> None:
    env = home_env(tmp_path / "home", public, PATH=f"{Path(uv).parent}:{os.environ['PATH']}")
    venv = tmp_path / "uv-venv"
    done = run([*WF, "install", "--installer", "uv", "--index", str(local), "--python",
                str(venv)], env, elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    assert kept(venv / "bin" / "python"), installed(venv / "bin" / "python")
    assert not (venv / "pip.conf").exists()
    assert "later uv pip commands need the same --index and --constraint" in done.stdout


def test_the_printed_uv_line_pasted_as_printed(local: Path, public: str, uv: str,
                                               tmp_path: Path) -> None:
    """build and serve print `uv venv ... && uv pip install ...`: run by a shell, from
    another directory, with ~ the user's home."""
    from wheelforge.cli._options import install_lines

    text = install_lines(local, None, None)
    (line,) = [ln for ln in text.splitlines() if " pip install --python " in ln]
    words = shlex.split(line)
    assert words[4].startswith("/") and words[5] == "venv"  # uv's absolute path
    env = home_env(tmp_path / "home", public, PATH="/usr/bin:/bin")  # no uv on PATH
    done = run(["bash", "-euo", "pipefail", "-c", line], env, elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    assert kept(tmp_path / "home" / "venvs" / "stack" / "bin" / "python")


def test_the_printed_uv_line_pasted_again_or_after_the_pip_line(
        local: Path, public: str, uv: str, tmp_path: Path) -> None:
    """The printed uv line ran once: pasted again (after a new build), or after the pip
    line above it into the same ~/venvs/stack, `uv venv` refused the venv that existed
    ("A virtual environment already exists"), and nothing was installed.  It runs each
    time, and leaves the venv's interpreter as it was."""
    from wheelforge.cli._options import install_lines

    text = install_lines(local, None, None)
    (uv_line,) = [ln for ln in text.splitlines() if " pip install --python " in ln]
    (wf_line,) = [ln for ln in text.splitlines() if " install --index " in ln]
    home = tmp_path / "home"
    env = home_env(home, public, PATH="/usr/bin:/bin")
    for line in (uv_line, uv_line):  # pasted twice
        done = run(["bash", "-euo", "pipefail", "-c", line], env, elsewhere(tmp_path))
        assert done.returncode == 0, done.stderr
    assert kept(home / "venvs" / "stack" / "bin" / "python")
    other = home_env(tmp_path / "home2", public, PATH="/usr/bin:/bin")
    done = run(["bash", "-euo", "pipefail", "-c", wf_line], other, elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    cfg = (tmp_path / "home2" / "venvs" / "stack" / "pyvenv.cfg").read_text()
    done = run(["bash", "-euo", "pipefail", "-c", uv_line], other, elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "home2" / "venvs" / "stack" / "pyvenv.cfg").read_text() == cfg
    assert kept(tmp_path / "home2" / "venvs" / "stack" / "bin" / "python")


def test_the_venv_keeps_a_global_constraint_and_runs_with_pip_config_file_devnull(
        local: Path, public: str, tmp_path: Path) -> None:
    """A machine-wide torch cap in the global pip file stays in force in the venv (the
    venv's own file would hide it), and PIP_CONFIG_FILE=/dev/null, which made
    `pip config --site set` crash, is no obstacle."""
    home = tmp_path / "home"
    cap = tmp_path / "cap.txt"
    cap.write_text("wf-dep<2\n")
    (home / "xdg" / "pip").mkdir(parents=True)
    (home / "xdg" / "pip" / "pip.conf").write_text(f"[global]\nconstraint = {cap}\n")
    venv = tmp_path / "venv"
    fresh_venv(venv, with_pip=True)
    done = run([*WF, "install", "--index", str(local), "--python", str(venv)],
               home_env(home, public, PIP_CONFIG_FILE=os.devnull), elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    conf = (venv / "pip.conf").read_text()
    assert f" {cap}" in conf.split("constraint = ", 1)[1].splitlines()[0]
    assert kept(venv / "bin" / "python")


def test_an_active_venv_is_the_default_target_and_pip_conf_sections_are_kept(
        local: Path, public: str, tmp_path: Path) -> None:
    venv = tmp_path / "active"
    fresh_venv(venv, with_pip=True)
    (venv / "pip.conf").write_text("[install]\nno-compile = true\n")
    env = home_env(tmp_path / "home", public, VIRTUAL_ENV=str(venv))
    done = run([*WF, "install", "--index", str(local)], env, elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "[install]\nno-compile = true" in (venv / "pip.conf").read_text()
    assert kept(venv / "bin" / "python")


def test_one_project_brings_only_itself_and_its_dependencies(
        local: Path, public: str, tmp_path: Path) -> None:
    venv = tmp_path / "one"
    done = run([*WF, "install", "wf_Demo", "--index", str(local), "--python", str(venv)],
               home_env(tmp_path / "home", public), elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    got = installed(venv / "bin" / "python")
    assert got["wf-demo"] == (DEMO_LOCAL, "local") and "wf-helper" not in got


@pytest.mark.parametrize(("args", "code", "said"), [
    (["wf-demoo"], 2, "did you mean wf-demo?"),
    (["--channel", "cu999"], 2, "has no channel 'cu999'"),
    ([], 2, "which venv?"),
    (["--index", "{tmp}/nowhere", "--python", "{tmp}/v"], 2, "no index at"),
    (["--index", "http://127.0.0.1:9/ch/", "--python", "{tmp}/v"], 2, "cannot read "
     "http://127.0.0.1:9/ch/constraints.txt"),
    (["--python", "{tmp}/afile"], 2, "is neither a venv nor a Python interpreter"),
    (["--python", "{tmp}/notavenv"], 2, "is not a virtual environment"),
    (["--python", "{tmp}/badconf"], 2, "cannot read {tmp}/badconf/pip.conf"),
])
def test_mistakes_are_clear_errors(local: Path, public: str, tmp_path: Path, args: list[str],
                                   code: int, said: str) -> None:
    (tmp_path / "afile").write_text("not a venv")
    (tmp_path / "notavenv").mkdir()
    fresh_venv(tmp_path / "badconf")
    (tmp_path / "badconf" / "pip.conf").mkdir()  # unreadable as a file
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--index" not in argv:
        argv += ["--index", str(local)]
    done = run([*WF, "install", *argv], home_env(tmp_path / "home", public),
               elsewhere(tmp_path))
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert said.replace("{tmp}", str(tmp_path)) in done.stderr, done.stderr


def test_a_venv_of_another_python_is_refused_before_anything_is_written(
        local: Path, public: str, tmp_path: Path) -> None:
    fake = tmp_path / "py" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho cp39\n")
    fake.chmod(0o755)
    root = tmp_path / "index"
    native = make_wheel(tmp_path / "dist", {"wf_native/__init__.py": ""}, name="wf-native",
                        version="1.0+cu130torch2.14", tag="cp311-cp311-linux_x86_64")
    index.publish(root, native, **CU130)
    done = run([*WF, "install", "--index", str(root), "--python", str(fake)],
               home_env(tmp_path / "home", public), elsewhere(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "is cp39; the wheels are for cp311" in done.stderr
    assert not (tmp_path / "py" / "pip.conf").exists()


def test_several_channels_need_one_named(public: str, tmp_path: Path) -> None:
    root = tmp_path / "index"
    pub(root, tmp_path / "dist", "wf-demo", DEMO_LOCAL, "local", target=CU130)
    other = dict(CU130, channel="cu128-torch2.13", build_key="key-2")
    pub(root, tmp_path / "dist2", "wf-demo", "1.0+cu128torch2.13", "local", target=other)
    done = run([*WF, "install", "--index", str(root), "--python", str(tmp_path / "v")],
               home_env(tmp_path / "home", public), elsewhere(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "its channels are: cu128-torch2.13, cu130-torch2.14" in done.stderr
    assert not (tmp_path / "v").exists()


def test_a_failed_dependency_install_is_exit_14_with_pips_reason(
        local: Path, tmp_path: Path) -> None:
    empty = tmp_path / "deps"
    empty.mkdir()
    done = run([*WF, "install", "--index", str(local), "--python", str(tmp_path / "v"),
                "--deps-dir", str(empty)], home_env(tmp_path / "home", "http://127.0.0.1:9/"),
               elsewhere(tmp_path))
    assert done.returncode == 14, done.stderr
    assert "install failed: pip could not install their dependencies" in done.stderr
    assert "wf-dep" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.unit
def test_the_help_example_and_printed_line_name_absolute_paths(local: Path) -> None:
    from wheelforge.cli._options import install_lines

    text = install_lines(local, None, None)
    (line,) = [ln for ln in text.splitlines() if " install --index " in ln]
    argv = shlex.split(line.replace("~/venvs/stack", "VENV"))
    assert os.path.isabs(argv[0]) and argv[1] == "install"
    assert argv[argv.index("--index") + 1] == str(local.resolve())
    assert index.load_records(local)


def test_a_channel_directory_names_the_index_and_the_channel(
        local: Path, public: str, tmp_path: Path) -> None:
    """The landing page's line: --index INDEX/CHANNEL/."""
    venv = tmp_path / "v"
    done = run([*WF, "install", "--index", f"{local}/{CHANNEL}/", "--python", str(venv)],
               home_env(tmp_path / "home", public), elsewhere(tmp_path))
    assert done.returncode == 0, done.stderr
    assert kept(venv / "bin" / "python")


def test_the_readmes_install_block_runs_as_printed_in_a_checkout(
        local: Path, public: str, tmp_path: Path) -> None:
    """README's pip block, run by a shell in a checkout after `make build` (.venv holds
    wheelforge, ./index the wheels: here the fake stack), for a new user whose home holds
    ~/venvs/stack; then a later pip command there keeps the wheels.  (The real stack goes
    through the same command in tests/test_e2e_stack.py, from build's printed line.)"""
    from conftest import REPO

    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("## Install the stack"):].split("```sh\n", 1)[1]
    block = block.split("```", 1)[0]
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "wheelforge").symlink_to(
        Path(sys.executable).with_name("wheelforge"))
    (checkout / "index").symlink_to(local)
    home = tmp_path / "home"
    env = home_env(home, public)
    done = run(["bash", "-euo", "pipefail", "-c", block], env, checkout)
    assert done.returncode == 0, done.stderr
    python = home / "venvs" / "stack" / "bin" / "python"
    assert kept(python), installed(python)
    later = run([str(python), "-m", "pip", "install", "-U", "wf-demo"], env, tmp_path)
    assert later.returncode == 0 and kept(python), later.stderr
