"""The managed CUDA toolkit (builder/env/toolkit.py, toolchain.find_toolkit): PyPI's
cuda-toolkit wheels laid out as CUDA_HOME, chosen by the ``toolkit`` setting, in the build
key and the SBOM; and for real, the CUDA fixture built with it where no system toolkit is
visible, byte for byte the wheel built where /usr/local/cuda is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import built_wheel, hidden_cuda_prefix, tinyext_project, wheel_differences
from wheelforge import _fs
from wheelforge.builder import config
from wheelforge.builder.artifact import identity
from wheelforge.builder.checks import doctor
from wheelforge.builder.compiling import jobserver, toolchain
from wheelforge.builder.env import buildenv, toolkit
from wheelforge.errors import ConfigError, ToolchainError

VERSIONS = (("cuda-toolkit", "13.0.3.0"), ("nvidia-cuda-nvcc", "13.0.88"))


def fake_wheels(site: Path, tree: str = "cu13") -> Path:
    """What ``uv pip install --target site cuda-toolkit[...]`` leaves, in miniature."""
    root = site / "nvidia" / tree
    for rel in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h",
                "include/cccl/cub/cub.cuh", "lib/libcudart.so.13", "lib/libcudart_static.a"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / "bin" / "nvcc").chmod(0o755)
    for name, version in VERSIONS:
        (site / f"{name.replace('-', '_')}-{version}.dist-info").mkdir(parents=True)
    return root


def test_the_layout_is_what_torch_and_nvcc_read(tmp_path: Path) -> None:
    tree = fake_wheels(tmp_path / "site")
    toolkit.make_layout(tmp_path / "site", tmp_path / "cuda")
    home = tmp_path / "cuda"
    assert (home / "bin" / "nvcc").resolve() == (tree / "bin" / "nvcc").resolve()
    assert (home / "include" / "cuda_runtime.h").is_file()
    assert (home / "nvvm" / "bin" / "cicc").is_file()  # nvcc.profile: $(TOP)/nvvm/bin
    # torch links -L CUDA_HOME/lib64 -lcudart: the wheel holds libcudart.so.13 only
    assert os.readlink(home / "lib64" / "libcudart.so") == "libcudart.so.13"
    assert (home / "lib64" / "libcudart.so").read_text() == "lib/libcudart.so.13"
    assert (home / "lib64" / "libcudart_static.a").is_file()
    assert all(not os.path.isabs(os.readlink(p)) for p in home.iterdir() if p.is_symlink())


def test_the_layout_survives_a_rename_of_its_directory(tmp_path: Path) -> None:
    fake_wheels(tmp_path / "tmp-1" / "site")
    toolkit.make_layout(tmp_path / "tmp-1" / "site", tmp_path / "tmp-1" / "cuda")
    os.rename(tmp_path / "tmp-1", tmp_path / "final")
    assert (tmp_path / "final" / "cuda" / "bin" / "nvcc").is_file()
    assert (tmp_path / "final" / "cuda" / "lib64" / "libcudart.so").is_file()


def test_a_cuda_12_toolkit_from_pypi_has_no_nvcc_and_says_so(tmp_path: Path) -> None:
    # nvidia-cuda-nvcc-cu12 12.8.93 / 12.9.86: ptxas, libnvvm and libdevice, no nvcc
    ptxas = tmp_path / "site" / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    ptxas.parent.mkdir(parents=True)
    ptxas.write_text("")
    with pytest.raises(ToolchainError) as err:
        toolkit.make_layout(tmp_path / "site", tmp_path / "cuda")
    assert "CUDA 12" in err.value.why and "--toolkit system" in err.value.fix


def test_versions_are_read_from_the_installed_distributions(tmp_path: Path) -> None:
    fake_wheels(tmp_path / "site")
    assert toolkit.installed_versions(tmp_path / "site") == VERSIONS
    assert toolkit.requirement("13.0") == "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.0.*"


def fake_install(calls: list[str]):  # type: ignore[no-untyped-def]
    def install(req: str, target: Path, *_a: object) -> None:
        calls.append(req)
        fake_wheels(target)
    return install


def test_ensure_installs_once_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(toolkit, "_install", fake_install(calls))
    req = toolkit.requirement("13.0")
    first = toolkit.ensure(tmp_path, req)
    again = toolkit.ensure(tmp_path, req)
    assert calls == [req] and first == again
    assert first.versions == VERSIONS and first.requirement == req
    assert first.home == tmp_path / "toolkits" / toolkit.toolkit_key(req, ()) / "cuda"
    assert [p.name for p in (tmp_path / "toolkits").iterdir() if p.name.startswith(".")] == []
    # its files dated at the zip epoch, not when they were unpacked: nvcc's -lineinfo
    # writes each header's date into the device code (docs/reproducible.md)
    assert os.stat(first.home / "include" / "cuda_runtime.h").st_mtime == _fs.ZIP_EPOCH


def test_an_unfinished_toolkit_is_never_trusted(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill -9 mid-install leaves a directory without its marker, or a marker whose
    layout is gone: installed again, never used."""
    calls: list[str] = []
    monkeypatch.setattr(toolkit, "_install", fake_install(calls))
    req = toolkit.requirement("13.0")
    final = tmp_path / "toolkits" / toolkit.toolkit_key(req, ())
    (final / "site").mkdir(parents=True)  # no marker
    toolkit.ensure(tmp_path, req)
    shutil.rmtree(final / "site" / "nvidia")  # a marker, but no nvcc behind the layout
    assert toolkit.read(final) is None
    toolkit.ensure(tmp_path, req)
    assert calls == [req, req] and toolkit.read(final) is not None


def test_a_link_in_the_toolkits_place_is_not_followed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A complete-looking toolkit elsewhere, linked in as CACHE/toolkits/KEY: never used
    (its nvcc would run in every build); replaced by a real install, the link removed,
    its target untouched."""
    calls: list[str] = []
    monkeypatch.setattr(toolkit, "_install", fake_install(calls))
    req = toolkit.requirement("13.0")
    elsewhere = tmp_path / "elsewhere"
    fake_wheels(elsewhere / "site")
    toolkit.make_layout(elsewhere / "site", elsewhere / "cuda")
    (elsewhere / toolkit.MARKER).write_text(json.dumps({"requirement": req,
                                                        "versions": [["evil", "1"]]}))
    final = tmp_path / "cache" / "toolkits" / toolkit.toolkit_key(req, ())
    final.parent.mkdir(parents=True)
    final.symlink_to(elsewhere)
    assert toolkit.read(final) is None
    found = toolkit.ensure(tmp_path / "cache", req)
    assert calls == [req] and found.versions == VERSIONS and not final.is_symlink()
    assert (elsewhere / toolkit.MARKER).is_file()


def test_a_failed_install_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(req: str, target: Path, *_a: object) -> None:
        target.mkdir(parents=True)
        raise ToolchainError("could not install the CUDA toolkit")

    monkeypatch.setattr(toolkit, "_install", broken)
    with pytest.raises(ToolchainError):
        toolkit.ensure(tmp_path, toolkit.requirement("13.0"))
    assert [p for p in (tmp_path / "toolkits").iterdir() if not p.name.endswith(".lock")] == []


# -- which toolkit a build uses ----------------------------------------------------------------

SYSTEM = toolchain.Cuda(home=Path("/usr/local/cuda"), nvcc=Path("/usr/local/cuda/bin/nvcc"),
                        version=Version("13.0"), origin="standard prefix")


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """find_cuda finds SYSTEM while state["system"]; the managed toolkit is faked."""
    state = {"system": True}

    def find_cuda(environ: object = None) -> toolchain.Cuda:
        if state["system"]:
            return SYSTEM
        raise ToolchainError("nvcc, the CUDA compiler, was not found", why="searched ...")

    monkeypatch.setattr(toolchain, "find_cuda", find_cuda)
    monkeypatch.setattr(toolkit, "_install", fake_install([]))
    monkeypatch.setattr(toolchain, "nvcc_version", lambda nvcc: Version("13.0"))
    return state


def find(tmp_path: Path, mode: str, **environ: str) -> toolchain.Cuda:
    return toolchain.find_toolkit(mode, cache_dir=tmp_path, environ=environ,
                                  requirement=toolkit.requirement("13.0"))


def test_auto_uses_a_system_toolkit_where_there_is_one(tmp_path: Path,
                                                       fakes: dict[str, bool]) -> None:
    cuda = find(tmp_path, "auto")
    assert cuda.home == SYSTEM.home and cuda.toolkit == ()
    assert "a system toolkit was found" in cuda.choice
    assert not (tmp_path / "toolkits").exists()  # nothing downloaded


def test_auto_uses_the_managed_toolkit_where_there_is_none(tmp_path: Path,
                                                           fakes: dict[str, bool]) -> None:
    fakes["system"] = False
    cuda = find(tmp_path, "auto")
    assert cuda.toolkit == VERSIONS and str(cuda.home).startswith(str(tmp_path / "toolkits"))
    assert "no system toolkit" in cuda.choice
    assert cuda.describe_toolkit() == "managed cuda-toolkit 13.0.3.0, nvidia-cuda-nvcc 13.0.88"


def test_managed_is_used_even_beside_a_system_toolkit(tmp_path: Path,
                                                      fakes: dict[str, bool]) -> None:
    cuda = find(tmp_path, "managed")
    assert cuda.toolkit == VERSIONS and cuda.choice == "toolkit: managed"


def test_system_and_a_given_cuda_home_never_fall_back(tmp_path: Path,
                                                      fakes: dict[str, bool]) -> None:
    fakes["system"] = False
    with pytest.raises(ToolchainError):
        find(tmp_path, "system")
    with pytest.raises(ToolchainError):  # $CUDA_HOME that is no toolkit stays an error
        find(tmp_path, "auto", CUDA_HOME="/nowhere")
    assert not (tmp_path / "toolkits").exists()


def test_the_setting_resolves_option_then_environment_then_file(tmp_path: Path) -> None:
    project = tmp_path / "wheelforge.yaml"
    project.write_text("defaults:\n  toolkit: managed\n")
    resolved = config.resolve(project_file=project, environ={}, python=sys.executable)
    assert (resolved.toolkit, resolved.origin("toolkit")) == ("managed", "wheelforge.yaml")
    resolved = config.resolve(project_file=project, environ={config.TOOLKIT_ENV: "system"},
                              python=sys.executable)
    assert resolved.toolkit == "system"
    resolved = config.resolve(project_file=project, toolkit="auto", environ={},
                              python=sys.executable)
    assert (resolved.toolkit, resolved.origin("toolkit")) == ("auto", "--toolkit")
    assert config.resolve(environ={}, python=sys.executable).toolkit == "auto"


def test_a_bad_setting_is_named(tmp_path: Path) -> None:
    project = tmp_path / "wheelforge.yaml"
    project.write_text("defaults:\n  toolkit: sometimes\n  cuda-toolkit: 'torch==2.1'\n")
    with pytest.raises(ConfigError) as err:
        config.load_project_file(project)
    assert "defaults.toolkit" in err.value.why and "defaults.cuda-toolkit" in err.value.why
    with pytest.raises(ConfigError):
        config.resolve(environ={config.TOOLKIT_ENV: "sometimes"}, python=sys.executable)


def test_the_build_key_holds_a_managed_toolkits_exact_wheels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "host_compiler", lambda: "g++ 13")
    monkeypatch.setattr(jobserver, "lent_flags", lambda nvcc, backend: ())
    monkeypatch.setattr(buildenv, "python_tag", lambda python: "cp311")

    class Recipe:
        class build:  # noqa: N801
            kind = "extension"

    cfg = config.resolve(environ={}, python=None, arch="12.0")
    system = identity.toolchain_identity(Recipe, cfg, SYSTEM)  # type: ignore[arg-type]
    assert "cuda-toolkit" not in system  # a system toolkit's keys stay as they were
    managed = toolchain.Cuda(home=Path("/c/cuda"), nvcc=Path("/c/cuda/bin/nvcc"),
                             version=SYSTEM.version, origin="managed", toolkit=VERSIONS)
    ident = identity.toolchain_identity(Recipe, cfg, managed)  # type: ignore[arg-type]
    assert ident["cuda-toolkit"] == "managed cuda-toolkit 13.0.3.0, nvidia-cuda-nvcc 13.0.88"
    newer = toolchain.Cuda(home=Path("/c/cuda"), nvcc=Path("/c/cuda/bin/nvcc"),
                           version=SYSTEM.version, origin="managed",
                           toolkit=(("cuda-toolkit", "13.0.3.0"), ("nvidia-cuda-nvcc", "13.0.99")))
    assert identity.toolchain_identity(Recipe, cfg, newer) != ident  # type: ignore[arg-type]


def test_doctor_says_which_toolkit_and_why(tmp_path: Path, fakes: dict[str, bool],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "find_cuda", toolchain.find_cuda)
    monkeypatch.setattr(doctor, "nvcc_version", lambda nvcc: Version("13.0"))
    req = toolkit.requirement("13.0")
    finding, cuda = doctor._check_nvcc({}, "auto", req, tmp_path)
    assert finding.status == "OK" and "a system toolkit was found" in finding.detail
    fakes["system"] = False
    finding, cuda = doctor._check_nvcc({}, "auto", req, tmp_path)
    assert finding.status == "OK" and cuda is None and "not installed yet" in finding.detail
    assert not (tmp_path / "toolkits").exists()  # doctor installs nothing
    toolkit.ensure(tmp_path, req)
    finding, cuda = doctor._check_nvcc({}, "auto", req, tmp_path)
    assert cuda is not None and cuda.toolkit == VERSIONS
    assert "nvidia-cuda-nvcc 13.0.88" in finding.detail and "no system toolkit" in finding.detail


# -- for real ----------------------------------------------------------------------------------

def _wheelforge(argv: list[str | Path], *,
                prefix: Sequence[str | Path] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["WHEELFORGE_COMPILE_CACHE"] = "off"  # every unit compiled by this build's nvcc
    return subprocess.run([*map(str, prefix), sys.executable, "-m", "wheelforge",
                           *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=1200)


@pytest.mark.nvcc
def test_the_managed_toolkit_builds_without_a_system_toolkit_and_the_same_bytes_with_one(
        tmp_path: Path, shared_cache: Path, nvcc: str) -> None:
    """Issue 54: the CUDA fixture built where no toolkit is visible (a mount namespace
    hides /usr/local/cuda, CUDA_HOME unset, no cuda on PATH): ``toolkit: auto`` takes
    PyPI's; then built with ``--toolkit managed`` where /usr/local/cuda is: the same build
    key and the same bytes.  Downloads the toolkit once, into uv's cache."""
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = hidden_cuda_prefix(empty)
    tinyext_project(tmp_path)
    common: list[str | Path] = [
        "build", "tinyext", "--arch", "12.0", "--no-stack-check", "--recipes",
        tmp_path / "recipes", "--sources", tmp_path / "sdists", "--cache-dir", shared_cache,
        "--work-dir", tmp_path / "work"]
    hidden = _wheelforge([*common, "--index", tmp_path / "hidden"],
                         prefix=hide)
    assert hidden.returncode == 0, hidden.stderr[-3000:]
    assert "toolkit: auto, and no system toolkit" in hidden.stderr
    assert f"nvcc 13.0 at {shared_cache / 'toolkits'}" in hidden.stderr
    assert "CUDA toolkit managed cuda-toolkit 13.0." in hidden.stderr

    present = _wheelforge([*common, "--toolkit", "managed", "--index", tmp_path / "present"])
    assert present.returncode == 0, present.stderr[-3000:]
    assert "(toolkit: managed)" in present.stderr
    stem = "tinyext-0.1.0+cu130torch2.14sm120-cp311-cp311"
    a = built_wheel(tmp_path / "hidden" / "files", stem)
    b = built_wheel(tmp_path / "present" / "files", stem)
    assert wheel_differences(a, b) == []
    with zipfile.ZipFile(a) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".cdx.json"))
        sbom = json.loads(zf.read(name))
    props = {p["name"]: p["value"] for p in sbom["metadata"]["component"]["properties"]}
    assert "nvidia-cuda-nvcc 13.0." in props["wheelforge:cuda-toolkit"]
    tools = {t["name"] for t in sbom["metadata"]["tools"]["components"]}
    assert {"cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-nvvm"} <= tools
