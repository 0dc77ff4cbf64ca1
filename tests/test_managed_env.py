"""Managed build environments made by uv, with pip's configuration carried over.

The unit tests map pip settings to uv's options; the end-to-end tests create real torch
environments with the real uv and the real pip and compare what they hold.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import broken_torch, make_wheel
from wheelforge.builder.env import buildenv, pipconfig
from wheelforge.errors import ToolchainError

BASE = Path(getattr(sys, "_base_executable", sys.executable))

CONFIG_LIST = """\
:env:.find-links='/opt/wheels'
:env:.default-timeout='180'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/other'
install.index-url='https://mirror.example/simple'
global.index-url='https://ignored.example/simple'
download.index-url='https://not-install.example/simple'
"""


def test_pip_config_list_resolves_as_pip_does() -> None:
    """PIP_* variables (:env:) over [install] over [global]; other commands' sections
    ignored."""
    settings = pipconfig.parse_config_list(CONFIG_LIST)
    assert settings == {
        "find-links": "/opt/wheels", "default-timeout": "180",
        "cert": "/etc/ssl/certs/ca-certificates.crt",
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "index-url": "https://mirror.example/simple",
    }


def test_this_machines_kind_of_configuration_carries_over() -> None:
    uv = pipconfig.to_uv(pipconfig.parse_config_list(CONFIG_LIST),
                         ["--timeout", "30", "--retries", "5"])
    assert uv.unsupported == ()
    assert uv.args == (
        "--index-url", "https://mirror.example/simple",
        "--index-strategy", "unsafe-best-match",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
    )
    # the command line's timeout wins over the configuration's, as in pip
    assert dict(uv.environ) == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
                                "UV_HTTP_TIMEOUT": "30", "UV_HTTP_RETRIES": "5"}


@pytest.mark.parametrize(("pip", "uv"), [
    (["--index-url", "https://d.example/whl/cu130"], ["--index-url", "https://d.example/whl/cu130"]),
    (["-i", "https://d.example/a", "-i", "https://d.example/b"], ["--index-url", "https://d.example/b"]),
    (["--extra-index-url=https://x.example/simple"], ["--extra-index-url", "https://x.example/simple"]),
    (["-f", "/w", "--find-links", "/v"], ["--find-links", "/w", "--find-links", "/v"]),
    (["--no-index", "-f", "/w"], ["--no-index", "--find-links", "/w"]),
    (["-c", "file:///etc/c.txt"], ["--constraint", "/etc/c.txt"]),
    (["--pre"], ["--prerelease", "allow"]),
    (["--only-binary", ":all:"], ["--only-binary", ":all:"]),
    (["--trusted-host", "h.example"], ["--allow-insecure-host", "h.example"]),
    (["--progress-bar", "off", "--disable-pip-version-check", "-q"], []),
])
def test_pip_options_become_uv_options(pip: list[str], uv: list[str]) -> None:
    mapped = pipconfig.to_uv({}, pip)
    assert mapped.unsupported == ()
    assert [a for a in mapped.args if a not in ("--index-strategy", "unsafe-best-match")] == uv


@pytest.mark.parametrize("pip", [
    ["--no-deps"], ["--user"], ["--require-hashes"], ["--use-feature", "truststore"],
    ["--config-settings", "k=v"],
])
def test_an_option_uv_cannot_honour_is_named(pip: list[str]) -> None:
    assert pipconfig.to_uv({}, pip).unsupported[0].startswith(pip[0])


def test_isolated_drops_the_configuration() -> None:
    config = {"find-links": "/opt/wheels"}
    assert "--find-links" not in pipconfig.to_uv(config, ["--isolated"]).args
    assert "--find-links" in pipconfig.to_uv(config, []).args


def test_a_false_flag_in_a_config_file_is_off() -> None:
    assert "--no-index" not in pipconfig.to_uv({"no-index": "false"}, []).args
    assert "--no-index" in pipconfig.to_uv({"no-index": "yes"}, []).args


@pytest.mark.integration
def test_the_installer_falls_back_to_pip_and_says_why(tmp_path: Path) -> None:
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    assert pipconfig.read_pip_config(tmp_path / "no-python", environ=env) is None
    assert buildenv.choose_installer(BASE, ["--no-deps"], env).kind == "pip"
    assert "--no-deps" in buildenv.choose_installer(BASE, ["--no-deps"], env).why
    pip = buildenv.choose_installer(BASE, [], dict(env, WHEELFORGE_INSTALLER="pip"))
    assert (pip.kind, pip.why) == ("pip", "WHEELFORGE_INSTALLER=pip")
    with pytest.raises(ToolchainError):
        buildenv.choose_installer(BASE, [], dict(env, WHEELFORGE_INSTALLER="conda"))
    assert buildenv.choose_installer(BASE, [], env).kind == "uv"


def _probe_index(root: Path) -> tuple[Path, Path]:
    """A find-links directory with wf-probe 1.0 and 2.0, and a constraints file < 2."""
    links = root / "links"
    for version in ("1.0", "2.0"):
        make_wheel(links, {"wf_probe/__init__.py": f"V = {version!r}\n"}, name="wf-probe",
                   version=version)
    constraints = root / "constraints.txt"
    constraints.write_text("wf-probe<2\n")
    return links, constraints


def _inode_shared(env: buildenv.BuildEnv) -> bool:
    lib = next((env.python.parent.parent / "lib").glob("python*/site-packages/torch/lib"))
    big = max(lib.glob("libtorch_cuda*.so"), key=lambda p: p.stat().st_size)
    return big.stat().st_nlink > 1


@pytest.mark.e2e
def test_uv_and_pip_make_the_same_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The real uv and the real pip, the machine's pip configuration plus PIP_FIND_LINKS
    and PIP_CONSTRAINT: both environments hold the same distributions (pip itself aside:
    uv's venv has none), the probe only pip's configuration can find, at the version its
    constraint allows; uv's torch is hard-linked from uv's cache, and the marker says which
    installer made the environment.  Both have the same key (directory name)."""
    links, constraints = _probe_index(tmp_path)
    pip_links = " ".join([os.environ.get("PIP_FIND_LINKS", ""), str(links)]).strip()
    monkeypatch.setenv("PIP_FIND_LINKS", pip_links)
    monkeypatch.setenv("PIP_CONSTRAINT", str(constraints))
    made: dict[str, buildenv.BuildEnv] = {}
    for kind in ("uv", "pip"):
        monkeypatch.setenv(buildenv.INSTALLER_ENV, kind)
        made[kind] = buildenv.managed_env(tmp_path / kind, base_python=BASE,
                                          torch_req="torch==2.14.1",
                                          requirements=["wf-probe"], log=tmp_path / "log")
        marker = (made[kind].python.parent.parent / buildenv.MARKER).read_text()
        assert f'"installer": "{kind}' in marker
    uv_dists, pip_dists = (dict(made[k].distributions) for k in ("uv", "pip"))
    pip_dists.pop("pip", None)
    assert uv_dists == pip_dists
    assert uv_dists["wf-probe"] == "1.0" and uv_dists["torch"].startswith("2.14.1")
    assert made["uv"].python.parent.parent.name == made["pip"].python.parent.parent.name
    assert _inode_shared(made["uv"]) and not _inode_shared(made["pip"])


@pytest.mark.integration
def test_an_interpreter_is_inspected_once_per_command_until_it_changes(
        tmp_path: Path, uv: str) -> None:
    """buildenv.Inspections, as one `wheelforge build` of several recipes uses it: the
    second question about an unchanged interpreter is answered without running it; an
    install into its environment makes it asked again; another venv of the same base
    interpreter is another interpreter."""
    import subprocess

    venvs = [tmp_path / "a", tmp_path / "b"]
    for venv in venvs:
        subprocess.run([uv, "venv", "--no-config", "--python", str(BASE), str(venv)],
                       check=True, capture_output=True)
    seen = buildenv.Inspections()
    first = seen.inspect(venvs[0] / "bin" / "python", with_torch=False)
    assert seen.inspect(venvs[0] / "bin" / "python", with_torch=False) is first
    assert seen.asked == 1
    wheel = make_wheel(tmp_path / "w", {"wf_probe/__init__.py": ""}, name="wf-probe")
    subprocess.run([uv, "pip", "install", "--no-config", "--python",
                    str(venvs[0] / "bin" / "python"), str(wheel)], check=True,
                   capture_output=True)
    again = seen.inspect(venvs[0] / "bin" / "python", with_torch=False)
    assert seen.asked == 2 and dict(again.distributions).get("wf-probe") == "1.0"
    seen.inspect(venvs[1] / "bin" / "python", with_torch=False)
    assert seen.asked == 3


@pytest.mark.integration
def test_an_install_into_a_managed_environment_does_not_import_its_torch_again(
        tmp_path: Path, uv: str) -> None:
    """After managed_env installs a recipe's requirements (torch pinned), the environment's
    distributions are asked again without importing torch, and that answer serves the
    next build's question with torch: the venv here has no torch at all, so an answer
    with torch can only come from the command's memory, never from running it."""
    import dataclasses
    import subprocess

    venv = tmp_path / "env"
    subprocess.run([uv, "venv", "--no-config", "--python", str(BASE), str(venv)],
                   check=True, capture_output=True)
    python = venv / "bin" / "python"
    seen = buildenv.Inspections()
    before = dataclasses.replace(seen.inspect(python, with_torch=False, managed=True),
                                 torch_version="2.14.1+cu130", torch_cuda="13.0")
    wheel = make_wheel(tmp_path / "w", {"wf_probe/__init__.py": ""}, name="wf-probe")
    subprocess.run([uv, "pip", "install", "--no-config", "--python", str(python), str(wheel)],
                   check=True, capture_output=True)
    after = seen.installed(python, before)
    assert dict(after.distributions).get("wf-probe") == "1.0"
    assert (after.torch_version, after.torch_cuda) == ("2.14.1+cu130", "13.0")
    asked = seen.asked
    assert seen.inspect(python, managed=True) is after  # torch not imported: not run
    assert seen.asked == asked


@pytest.mark.integration
def test_torch_is_read_from_its_version_file_or_imported(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """import_torch=False reads torch/version.py without importing torch (a torch whose
    import fails still answers); the import names it; no torch at all is named either way."""
    monkeypatch.setenv("PYTHONPATH", str(broken_torch(tmp_path)))
    python = Path(sys.executable)
    env = buildenv.inspect_env(python, import_torch=False)
    assert (env.torch_version, env.torch_cuda) == ("2.14.1+cu130", "13.0")
    with pytest.raises(ToolchainError, match="torch cannot be imported") as err:
        buildenv.check_torch_imports(python)
    assert "libcudnn.so.9" in (err.value.why or "")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing"))
    with pytest.raises(ToolchainError, match="torch is not installed"):
        buildenv.inspect_env(python, import_torch=False)
