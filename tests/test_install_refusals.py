"""`wheelforge install` refuses what would let an index or a mistake reach outside the
venv: a served constraints file with anything but requirements (an option line was
handed to pip as an option), a served index that drips (a per-read timeout waited for
ever), and an interpreter that is not a venv's (the system's got a pip.conf and an
install).  And the pip.conf it writes works, with real pip, for an index whose path holds
a space."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from hostile_http import body, drip, hostile_server
from test_index_clients import pub
from wheelforge.errors import ConfigError
from wheelforge.index.pins import constraints_text

WF = [sys.executable, "-m", "wheelforge"]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """A user with no pip or uv files, and no index: pip finds only what it is given."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("PIP_", "UV_", "XDG_", "VIRTUAL_ENV"))
           and k != "PYTHONPATH"}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CONFIG_DIRS=str(home / "xdg"), PYTHONPATH=str(REPO / "src"),
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", NO_COLOR="1")
    env.update(extra)
    return env


def wf(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WF, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


# -- the constraints file of a served index: requirements only ---------------------------

def test_what_wheelforge_writes_parses() -> None:
    from wheelforge.index.pins import parse_constraints

    text = constraints_text([("wf-demo", "1.7.0+cu130torch2.14sm120"), ("fla-core", "0.6.0+wf"),
                             ("gone", None)], "simple/")
    assert [str(r) for r in parse_constraints(text, "u")] == [
        "wf-demo==1.7.0+cu130torch2.14sm120", "fla-core==0.6.0+wf"]
    ok = "# a comment\n\nwf-demo==1.0  # trailing comment\nx[extra]==2; python_version>'3'\n"
    assert len(parse_constraints(ok, "u")) == 2


@pytest.mark.parametrize("line", [
    "--log=/tmp/wf-pwned.log==1", "-r other.txt", "-c more.txt", "-e .", "--index-url http://x",
    "-i http://x", "--no-deps", "wf-demo @ https://evil.example/wf_demo-9-py3-none-any.whl",
    "https://evil.example/x.whl", "./local-dir", "wf-demo==1.0 \\", "\x1b[2Jwf-demo==1",
])
def test_anything_else_is_refused_naming_the_line(line: str) -> None:
    from wheelforge.index.pins import parse_constraints

    text = "# wheelforge: pins\nwf-demo==1.0\n" + line + "\n"
    with pytest.raises(ConfigError) as info:
        parse_constraints(text, "http://h/ch/constraints.txt")
    assert info.value.what.startswith("http://h/ch/constraints.txt, line 3: ")
    assert repr(line)[:40] in info.value.what


def test_an_option_line_served_in_constraints_never_reaches_pip(tmp_path: Path) -> None:
    """Before: `--log=PATH==1` has '==', so it was a pin, and pip took it as --log."""
    log = tmp_path / "pwned.log"
    venv = tmp_path / "venv"
    with hostile_server() as server:
        server.routes["/ch/constraints.txt"] = body(
            f"# wheelforge: pins\nwf-demo==1.0+wf\n--log={log}==1\n".encode())
        done = wf("install", "--index", server.url + "/ch/", "--python", str(venv),
                  env=env_for(tmp_path / "home"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{server.url}/ch/constraints.txt, line 3: '--log={log}==1' is refused" in done.stderr
    assert "pip option" in done.stderr
    assert not log.exists() and not venv.exists()  # refused before the venv is made


def test_a_dripping_index_meets_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.1 s never trips a per-read timeout: the whole file has a deadline
    (1 s here; FETCH_TIMEOUT_S, 30 s, by default)."""
    from wheelforge.cli import install as cli_install

    monkeypatch.setattr(cli_install, "FETCH_TIMEOUT_S", 1)
    with hostile_server() as server:
        server.routes["/ch/constraints.txt"] = drip(b"wf-demo==1.0+wf\n", every=0.1)
        with pytest.raises(ConfigError) as info:
            cli_install._served_plan(server.url + "/ch/")
    assert info.value.what == f"cannot read {server.url}/ch/constraints.txt"
    assert "not complete within the deadline of 1 s" in info.value.why
    assert "answers within 1 s" in info.value.fix


def test_a_served_wheelforge_index_still_plans(tmp_path: Path) -> None:
    """The constraints.txt wheelforge's own index writes, served over HTTP, passes."""
    from test_outdated import serve
    from wheelforge.cli import install as cli_install

    root = local_index(tmp_path / "index", tmp_path / "dist")
    pub(root, tmp_path / "dist", "wf-other", "2.0+wf", "local")
    with serve(root) as url:
        plan = cli_install._served_plan(url + "/")
    assert plan.pins == ("wf-other==2.0+wf", "wf-spaced==1.0+wf")
    assert plan.constraints == f"{url}/constraints.txt"


@pytest.mark.parametrize("index", ["http://[::1/ch/", "ftp://127.0.0.1:9/ch/"])
def test_a_malformed_index_url_is_exit_2(tmp_path: Path, index: str) -> None:
    done = wf("install", "--index", index, "--python", str(tmp_path / "v"),
              env=env_for(tmp_path / "home"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"--index {index} cannot be used" in done.stderr


def test_a_huge_constraints_file_is_cut_at_the_cap(tmp_path: Path) -> None:
    with hostile_server() as server:
        server.routes["/ch/constraints.txt"] = body(b"#" * (2 << 20))
        done = wf("install", "--index", server.url + "/ch/", "--python", str(tmp_path / "v"),
                  env=env_for(tmp_path / "home"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"larger than the limit of {1 << 20} bytes" in done.stderr


# -- only a venv -----------------------------------------------------------------------

def local_index(root: Path, dist: Path) -> Path:
    pub(root, dist, "wf-spaced", "1.0+wf", "local")
    return root


def base_interpreter() -> Path:
    return Path(getattr(sys, "_base_executable", sys.executable))


def test_the_base_interpreter_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Before: --python /usr/bin/python3 wrote /usr/pip.conf, then installed into it."""
    base = base_interpreter()
    prefix = Path(subprocess.run([str(base), "-I", "-c", "import sys; print(sys.prefix)"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    conf = prefix / "pip.conf"
    had = conf.read_bytes() if conf.exists() else None
    index = local_index(tmp_path / "index", tmp_path / "dist")
    try:
        done = wf("install", "--index", str(index), "--python", str(base),
                  env=env_for(tmp_path / "home"), cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert f"{base} is not in a virtual environment (its prefix is {prefix})" in done.stderr
        assert "-m venv" in done.stderr
        assert (conf.read_bytes() if conf.exists() else None) == had
        assert not (prefix / "wheelforge-pip-report.json").exists()
    finally:  # never leave a pip.conf in the interpreter's prefix
        if had is None and conf.exists():
            conf.unlink()


def test_a_link_to_a_venvs_interpreter_outside_it_is_not_a_venv(tmp_path: Path) -> None:
    """The interpreter says where it runs: a link to the venv's python placed elsewhere
    runs as the base interpreter, and is refused as one."""
    subprocess.run([str(base_interpreter()), "-m", "venv", "--without-pip",
                    str(tmp_path / "venv")], check=True)
    link = tmp_path / "elsewhere" / "python"
    link.parent.mkdir()
    link.symlink_to(tmp_path / "venv" / "bin" / "python")
    index = local_index(tmp_path / "index", tmp_path / "dist")
    done = wf("install", "--index", str(index), "--python", str(link),
              env=env_for(tmp_path / "home"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "is not in a virtual environment" in done.stderr
    assert not (tmp_path / "pip.conf").exists() and not (tmp_path / "venv" / "pip.conf").exists()


def test_an_interpreter_claiming_a_prefix_without_pyvenv_cfg_is_refused(tmp_path: Path) -> None:
    """A program that says it is a venv's python, naming a prefix that is no venv (no
    pyvenv.cfg there): nothing is written into that prefix."""
    target = tmp_path / "not-a-venv"
    target.mkdir()
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho '[\"{target}\", \"/\"]'\n")
    fake.chmod(0o755)
    index = local_index(tmp_path / "index", tmp_path / "dist")
    done = wf("install", "--index", str(index), "--python", str(fake),
              env=env_for(tmp_path / "home"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"is not in a virtual environment (its prefix is {target})" in done.stderr
    assert list(target.iterdir()) == [] and not (tmp_path / "pip.conf").exists()


# -- a path with a space, with real pip -----------------------------------------------

def test_an_index_path_with_a_space_gives_a_pip_conf_that_pip_reads(tmp_path: Path) -> None:
    """pip splits find-links and constraint values on white space: both are written as
    file:// URLs, percent-encoded.  Then pip itself, in the venv, with no index at all
    (PIP_NO_INDEX), finds the wheel through that pip.conf."""
    index = local_index(tmp_path / "my index", tmp_path / "dist")
    venv = tmp_path / "my venvs" / "stack"
    env = env_for(tmp_path / "home")
    done = wf("install", "--index", str(index), "--python", str(venv), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    conf = (venv / "pip.conf").read_text()
    assert f"find-links = {(index.resolve() / 'files').as_uri()}" in conf
    assert "my%20index" in conf
    python = str(venv / "bin" / "python")
    again = subprocess.run([python, "-m", "pip", "install", "--force-reinstall", "--no-deps",
                            "wf-spaced"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "wf-spaced-1.0+wf" in again.stdout, again.stdout
    assert "WARNING" not in again.stderr, again.stderr
    listed = subprocess.run([python, "-m", "pip", "config", "list"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert "my%20index" in listed.stdout, listed.stdout + listed.stderr
