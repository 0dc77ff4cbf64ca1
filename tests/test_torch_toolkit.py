"""Issue 54, items 2 and 5: the toolkit a torch needs (builder/compiling/torchtoolkit.py).

``wheelforge build --python VENV`` takes the managed toolkit of that venv's torch CUDA; a
CUDA 12 torch (no CUDA 12 nvcc on PyPI) needs a system toolkit named with ``--cuda-home``
or ``toolkit: {cuda-home: PATH}``, else a toolchain error that says what to install; a
matrix pin names one the same way, and its cells go only to the builders that declare it
(a Ray resource, a GitHub Actions runner label and container image).  Unit tests first;
then the command on a venv whose torch is a CUDA 12 build (integration).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from wheelforge.builder import config
from wheelforge.builder.compiling import toolchain, torchtoolkit
from wheelforge.builder.env import toolkit
from wheelforge.errors import ConfigError, ToolchainError
from wheelforge.nightly import fanout, rayexec, state
from wheelforge.recipe.matrix import Cell, TorchPin, parse_matrix

CU13 = toolchain.Cuda(home=Path("/usr/local/cuda"), nvcc=Path("/usr/local/cuda/bin/nvcc"),
                      version=Version("13.0"), origin="standard prefix")
CU12 = toolchain.Cuda(home=Path("/opt/cuda-12.8"), nvcc=Path("/opt/cuda-12.8/bin/nvcc"),
                      version=Version("12.8"), origin="$CUDA_HOME")
TORCH12 = "torch 2.10.0+cu128 in /venv/bin/python"


# -- which toolkit a torch needs ---------------------------------------------------------------

def test_a_cuda_13_torch_picks_the_managed_toolkit_of_its_cuda() -> None:
    default = toolkit.requirement("13.0")
    choice = torchtoolkit.for_torch("auto", default, "13.0", "torch 2.14.1 in /v/bin/python")
    assert (choice.mode, choice.requirement) == ("auto", default)
    newer = torchtoolkit.for_torch("managed", default, "13.2", "torch 2.16.0 in /v")
    assert newer.requirement == "cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]==13.2.*"
    assert "the CUDA 13.2 of torch 2.16.0 in /v" in newer.why
    # a system toolkit (named, or asked for) and a CPU torch are left as they are
    assert torchtoolkit.for_torch("system", default, "13.2", "t") == torchtoolkit.Choice(
        "system", default)
    assert torchtoolkit.for_torch("auto", default, None, "t").requirement == default
    assert torchtoolkit.for_torch("managed", default, "12.8", "t",
                                  Path("/opt/cuda-12.8")).mode == "system"


def test_a_cuda_12_torch_with_a_managed_toolkit_says_what_to_install() -> None:
    with pytest.raises(ToolchainError) as err:
        torchtoolkit.for_torch("managed", toolkit.requirement("13.0"), "12.8", TORCH12)
    e = err.value
    assert e.exit_code == 6
    assert e.what == f"{TORCH12} is a CUDA 12.8 build: there is no managed toolkit for it"
    assert "PyPI has no CUDA 12 nvcc" in e.why and "nvidia-cuda-nvcc-cu12" in e.why
    assert "cuda-toolkit-12-8 package" in e.fix and "--cuda-home /usr/local/cuda-12.8" in e.fix
    assert "toolkit: {cuda-home: /usr/local/cuda-12.8}" in e.fix
    # auto: a system toolkit, the only kind a CUDA 12 torch can have
    auto = torchtoolkit.for_torch("auto", toolkit.requirement("13.0"), "12.8", TORCH12)
    assert auto.mode == "system" and "PyPI has no CUDA 12 nvcc" in auto.why


@pytest.mark.parametrize("cuda", ["abc", "12", 12.8, "12.8; rm -rf /", "9" * 400])
def test_a_torch_whose_cuda_is_no_version_is_named(cuda: Any) -> None:
    """torch/version.py is the venv's own text: what it says is checked, never a
    traceback."""
    with pytest.raises(ToolchainError, match="says its CUDA is"):
        torchtoolkit.for_torch("auto", toolkit.requirement("13.0"), cuda, TORCH12)


def finder(found: toolchain.Cuda | None) -> Any:
    def find(mode: str, **_kw: Any) -> toolchain.Cuda:
        if found is None:
            raise ToolchainError("nvcc, the CUDA compiler, was not found", why="searched ...")
        return found
    return find


def find(choice: torchtoolkit.Choice, torch_cuda: str | None, found: toolchain.Cuda | None,
         tmp_path: Path, cuda_home: Path | None = None) -> toolchain.Cuda:
    return torchtoolkit.find(choice, cache_dir=tmp_path, cuda_home=cuda_home,
                             torch_cuda=torch_cuda, torch=TORCH12, environ={},
                             finder=finder(found))


def test_a_cuda_12_torch_without_a_system_toolkit_is_told_what_to_install(
        tmp_path: Path) -> None:
    choice = torchtoolkit.Choice("system", toolkit.requirement("13.0"))
    with pytest.raises(ToolchainError) as err:
        find(choice, "12.8", None, tmp_path)
    assert err.value.what == (f"{TORCH12} is a CUDA 12.8 build and no CUDA toolkit was found "
                              "(nvcc, the CUDA compiler, was not found)")
    assert "PyPI has no CUDA 12 nvcc" in err.value.why and "searched" in err.value.why
    assert "--cuda-home /usr/local/cuda-12.8" in err.value.fix
    assert find(choice, "12.8", CU12, tmp_path) == CU12  # a CUDA 12 toolkit: fine


def test_the_toolkits_major_must_be_the_torchs(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as err:
        find(torchtoolkit.Choice("system", ""), "12.8", CU13, tmp_path)
    assert err.value.what == (f"{TORCH12} is built for CUDA 12.8 but the toolkit at "
                              "/usr/local/cuda is CUDA 13.0")
    assert "--cuda-home /usr/local/cuda-12.8" in err.value.fix
    with pytest.raises(ToolchainError) as err:  # a CUDA 13 torch, a CUDA 12 system toolkit
        find(torchtoolkit.Choice("system", ""), "13.0", CU12, tmp_path)
    assert "--toolkit managed" in err.value.fix and "==13.0.*" in err.value.fix


# -- a toolkit named by its directory ----------------------------------------------------------

def fake_home(root: Path) -> Path:
    home = root / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (home / "bin" / "nvcc").chmod(0o755)
    (home / "include" / "cuda_runtime.h").write_text("")
    return home


def test_a_toolkit_another_user_owns_or_may_write_is_refused(tmp_path: Path) -> None:
    """The attack: a toolkit under /tmp that another local user made (or may change)
    would run their nvcc as the build's compiler."""
    home = fake_home(tmp_path)
    torchtoolkit.check_cuda_home(home)  # yours: fine
    env = torchtoolkit.toolkit_environ({"CUDA_PATH": "/x"}, home)
    assert env == {"CUDA_HOME": str(home)}
    (home / "bin").chmod(0o777)
    with pytest.raises(ToolchainError, match="is not trusted: .*bin belongs to uid"):
        torchtoolkit.check_cuda_home(home)
    (home / "bin").chmod(0o755)
    if os.geteuid() != 0:
        pytest.skip("giving the toolkit to another user needs root (CI runs as root)")
    os.chown(home / "bin" / "nvcc", 4321, 4321)
    with pytest.raises(ToolchainError, match="nvcc belongs to uid 4321"):
        torchtoolkit.toolkit_environ({}, home)
    os.chown(home / "bin" / "nvcc", 0, 0)
    link = tmp_path / "link"  # a link is judged by what it leads to
    link.symlink_to(home)
    os.chown(home, 4321, 4321)
    with pytest.raises(ToolchainError, match="belongs to uid 4321"):
        torchtoolkit.check_cuda_home(link)


def test_a_toolkit_under_a_directory_another_user_may_write_is_refused(
        tmp_path: Path) -> None:
    """The race: with a parent another user may write (not sticky), they rename your
    toolkit away after the check and put theirs in its place."""
    shared = tmp_path / "shared"
    shared.mkdir()
    home = fake_home(shared)
    shared.chmod(0o777)
    with pytest.raises(ToolchainError, match=f"{shared} belongs to uid"):
        torchtoolkit.check_cuda_home(home)
    shared.chmod(0o1777)  # sticky, as /tmp: no one moves another's entries
    torchtoolkit.check_cuda_home(home)


@pytest.mark.integration
def test_build_refuses_a_toolkit_another_user_made(tmp_path: Path) -> None:
    """Another local user (setpriv) makes a toolkit under a shared directory; build
    --cuda-home there stops in preflight, before its nvcc is run."""
    import shutil
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true runs as root with setpriv")
        pytest.skip("another user needs root and setpriv")
    import tempfile
    shared = Path(tempfile.mkdtemp(prefix="wf-shared-"))  # tmp_path's parents are 0700
    shared.chmod(0o1777)
    try:
        _another_users_toolkit(tmp_path, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _another_users_toolkit(tmp_path: Path, shared: Path) -> None:
    marker = shared / "ran"
    script = (f"mkdir -p {shared}/cuda/bin {shared}/cuda/include && "
              f"printf '#!/bin/sh\\ntouch {marker}\\necho release 13.0\\n' "
              f"> {shared}/cuda/bin/nvcc && chmod 755 {shared}/cuda/bin/nvcc && "
              f"touch {shared}/cuda/include/cuda_runtime.h")
    subprocess.run(["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups", "sh", "-c",
                    script], check=True, timeout=60)
    done = build(tmp_path, "--cuda-home", shared / "cuda")
    assert done.returncode == 6, done.stderr[-3000:]
    assert f"the CUDA toolkit at {shared / 'cuda'} is not trusted" in done.stderr
    assert "belongs to uid 4321" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()  # their nvcc never ran


def test_cuda_home_resolves_from_the_option_or_the_project_file(tmp_path: Path) -> None:
    project = tmp_path / "wheelforge.yaml"
    project.write_text("defaults:\n  toolkit: {cuda-home: tk/cuda-12.8}\n")
    cfg = config.resolve(project_file=project, environ={}, python=sys.executable)
    assert (cfg.toolkit, cfg.cuda_home) == ("system", tmp_path / "tk" / "cuda-12.8")
    assert "at " + str(tmp_path / "tk" / "cuda-12.8") in "\n".join(cfg.summary())
    cfg = config.resolve(project_file=project, environ={}, python=sys.executable,
                         cuda_home="/opt/cuda-12.8")
    assert (cfg.toolkit, cfg.cuda_home, cfg.origin("toolkit")) == (
        "system", Path("/opt/cuda-12.8"), "--cuda-home")
    cfg = config.resolve(project_file=project, environ={}, python=sys.executable,
                         toolkit="managed")  # the option over the file
    assert (cfg.toolkit, cfg.cuda_home) == ("managed", None)
    with pytest.raises(ConfigError, match="--cuda-home and --toolkit managed"):
        config.resolve(environ={}, python=sys.executable, toolkit="managed",
                       cuda_home="/opt/cuda-12.8")
    project.write_text("defaults:\n  toolkit: {cuda-hom: /opt/x}\n")
    with pytest.raises(ConfigError) as err:
        config.load_project_file(project)
    assert "defaults.toolkit: {cuda-home: PATH} takes no other key, got cuda-hom" in err.value.why


# -- the matrix pin and the nightly's routing --------------------------------------------------

def matrix(tmp_path: Path, *pins: dict[str, Any]) -> Any:
    return parse_matrix({"matrix": {"recipes": ["r"], "torch": list(pins),
                                    "archs": ["12.0"]}}, tmp_path / "wheelforge.yaml")


def test_a_pin_names_its_system_toolkit_and_its_builders_label(tmp_path: Path) -> None:
    m = matrix(tmp_path, {"spec": "torch==2.10.0", "cuda": "12.8",
                          "toolkit": {"cuda-home": "/usr/local/cuda-12.8"}},
               {"spec": "torch==2.14.1", "cuda": "13.0",
                "toolkit": {"cuda-home": "/opt/cu13", "label": "cu13-copy",
                            "image": "ghcr.io/me/cuda:13.0"}},
               {"spec": "torch==2.12.1", "cuda": "13.0"})
    a, b, c = m.torches
    assert (a.cuda_home, a.label, a.image) == ("/usr/local/cuda-12.8", "cuda-toolkit-12.8", None)
    assert (b.label, b.image) == ("cu13-copy", "ghcr.io/me/cuda:13.0")
    assert (c.cuda_home, c.label) == (None, None)
    with pytest.raises(ConfigError) as err:
        matrix(tmp_path, {"spec": "torch==2.10.0", "cuda": "12.8",
                          "toolkit": {"cuda-home": "cuda-12.8", "label": "../x",
                                      "imag": "x"}})
    why = err.value.why
    assert "matrix.torch[0].toolkit.cuda-home: is required: the absolute path" in why
    assert "matrix.torch[0].toolkit.label: must be a builder label" in why
    assert "matrix.torch[0].toolkit.imag: unknown key; did you mean 'image'?" in why


def pin_config(pin: TorchPin, mode: str) -> config.BuildConfig:
    cfg = dataclasses_replace(config.resolve(environ={}, python=sys.executable), toolkit=mode)
    return state._pin_toolkit(cfg, Cell(recipe="r", python=None, torch=pin, archs="12.0"))


def dataclasses_replace(cfg: config.BuildConfig, **kw: Any) -> config.BuildConfig:
    import dataclasses
    return dataclasses.replace(cfg, **kw)


def test_a_cuda_12_pin_without_a_toolkit_is_a_clear_error() -> None:
    cu12 = TorchPin(spec="torch==2.10.0", cuda="12.8")
    with pytest.raises(ToolchainError) as err:
        pin_config(cu12, "managed")
    e = err.value
    assert e.exit_code == 6
    assert e.what == ("the matrix pin torch==2.10.0 (CUDA 12.8) is a CUDA 12.8 build: there "
                      "is no managed toolkit for it")
    assert "PyPI has no CUDA 12 nvcc" in e.why
    assert e.fix.startswith("add toolkit: {cuda-home: /usr/local/cuda-12.8} to that pin in "
                            "matrix.torch, for builders that have that toolkit")
    assert pin_config(cu12, "auto").toolkit == "system"  # auto: the system's, checked after
    named = pin_config(TorchPin(spec="torch==2.10.0", cuda="12.8",
                                cuda_home="/usr/local/cuda-12.8", label="cuda-toolkit-12.8"),
                       "managed")
    assert (named.toolkit, named.cuda_home) == ("system", Path("/usr/local/cuda-12.8"))
    cu13 = pin_config(TorchPin(spec="torch==2.12.1", cuda="13.0"), "managed")
    assert (cu13.toolkit, cu13.cuda_toolkit) == ("managed", toolkit.requirement("13.0"))
    # the night's toolkit named in defaults (toolkit: {cuda-home: PATH}) stays for a pin
    # that names none
    night = dataclasses_replace(config.resolve(environ={}, python=sys.executable),
                                toolkit="system", cuda_home=Path("/opt/cuda-12.8"))
    kept = state._pin_toolkit(night, Cell(recipe="r", python=None, torch=cu12, archs="12.0"))
    assert (kept.toolkit, kept.cuda_home) == ("system", Path("/opt/cuda-12.8"))


def planned(i: int, label: str | None = None, image: str | None = None,
            estimate: float = 60.0) -> fanout.PlannedCell:
    return fanout.PlannedCell(
        id=i, recipe="r", version="1", python=None, torch="torch==2.10.0", cuda="12.8",
        pip_args=(), archs="12.0", build_key=f"{i:064x}", toolchain={}, estimate_s=estimate,
        cuda_home="/usr/local/cuda-12.8" if label else None, builder_label=label, image=image)


def plan_of(cells: list[fanout.PlannedCell]) -> fanout.Plan:
    return fanout.Plan(created="", config="w.yaml", index="i", cells=tuple(cells))


def test_the_github_matrix_routes_a_cell_to_its_toolkits_runners() -> None:
    gh = fanout.github_matrix(plan_of([planned(0), planned(1, "cuda-toolkit-12.8",
                                                           "ghcr.io/me/cuda:12.8")]))
    plain, routed = gh["include"]
    assert plain["runs-on"] == list(fanout.RUNNER_LABELS) and plain["container"] == ""
    assert routed["runs-on"] == [*fanout.RUNNER_LABELS, "cuda-toolkit-12.8"]
    assert routed["container"] == "ghcr.io/me/cuda:12.8"
    # batched (above the limit): a batch never mixes builders
    cells = [planned(i, "cuda-toolkit-12.8" if i % 3 == 0 else None) for i in range(30)]
    gh = fanout.github_matrix(plan_of(cells), limit=8)
    assert len(gh["include"]) == 8
    seen = []
    for job in gh["include"]:
        ids = [int(x) for x in job["cells"].split()]
        labelled = {i % 3 == 0 for i in ids}
        assert len(labelled) == 1, job
        assert ("cuda-toolkit-12.8" in job["runs-on"]) == labelled.pop()
        seen += ids
    assert sorted(seen) == list(range(30))


def test_the_plan_keeps_a_cells_toolkit_and_refuses_a_mistyped_one(tmp_path: Path) -> None:
    plan = plan_of([planned(0, "cuda-toolkit-12.8", "img:1")])
    path = tmp_path / "plan.json"
    fanout.write_plan(plan, path)
    back = fanout.load_plan(path).cells[0]
    assert (back.cuda_home, back.builder_label, back.image) == (
        "/usr/local/cuda-12.8", "cuda-toolkit-12.8", "img:1")
    assert back.cell.torch.cuda_home == "/usr/local/cuda-12.8"
    data = json.loads(path.read_text())
    data["cells"][0]["builder_label"] = {"x": 1}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="is not a wheelforge plan"):
        fanout.load_plan(path)


class FakeRay:
    def __init__(self, *resources: dict[str, float]) -> None:
        self.resources = resources

    def nodes(self) -> list[dict[str, object]]:
        return [{"Alive": True, "Resources": r} for r in self.resources]


def test_ray_asks_for_the_toolkits_resource_and_refuses_a_cluster_without_it() -> None:
    cell = planned(0, "cuda-toolkit-12.8")
    assert rayexec.resources_for(cell, 2)["resources"] == {
        rayexec.BUILDER_RESOURCE: 1, "cuda-toolkit-12.8": 1}
    assert rayexec.resources_for(planned(1), 2)["resources"] == {rayexec.BUILDER_RESOURCE: 1}
    plain = {"CPU": 4.0, rayexec.BUILDER_RESOURCE: 1.0}
    with pytest.raises(ConfigError) as err:
        rayexec._check_capacity(FakeRay(plain), plan_of([cell]), 2)
    assert "no builder node declares 'cuda-toolkit-12.8'" in err.value.what
    assert '"cuda-toolkit-12.8": 1' in err.value.fix
    rayexec._check_capacity(FakeRay(plain, {**plain, "cuda-toolkit-12.8": 1.0}),
                            plan_of([cell, planned(1)]), 2)
    with pytest.raises(ConfigError, match="needs 8 CPUs"):  # the labelled nodes' CPUs count
        rayexec._check_capacity(FakeRay({**plain, "CPU": 16.0},
                                        {**plain, "cuda-toolkit-12.8": 1.0}),
                                plan_of([cell]), 8)


# -- the command, on a venv whose torch is a CUDA 12 build -------------------------------------

def cuda12_venv(root: Path) -> Path:
    """A venv whose torch/version.py says 2.10.0+cu128, CUDA 12.8 (PyPI's torch 2.10.0):
    what the probe reads; torch is never imported."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.10.0+cu128'\ncuda = '12.8'\n")
    return venv


def build(root: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    from conftest import tinyext_project
    if not (root / "recipes").exists():
        tinyext_project(root)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    return subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "--no-stack-check",
         "--recipes", root / "recipes", "--sources", root / "sdists", "--index",
         root / "index", "--cache-dir", root / "cache", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_build_for_a_cuda_12_venv_says_what_to_install(tmp_path: Path) -> None:
    venv = cuda12_venv(tmp_path)
    managed = build(tmp_path, "--python", venv, "--toolkit", "managed")
    assert managed.returncode == 6, managed.stderr[-3000:]
    assert "is a CUDA 12.8 build: there is no managed toolkit for it" in managed.stderr
    assert "PyPI has no CUDA 12 nvcc" in managed.stderr
    assert "--cuda-home /usr/local/cuda-12.8" in managed.stderr
    assert "Traceback" not in managed.stderr
    assert not (tmp_path / "cache" / "toolkits").exists()  # nothing downloaded
    if Path("/usr/local/cuda/bin/nvcc").exists():  # auto: the system's CUDA 13 is refused
        auto = build(tmp_path, "--python", venv)
        assert auto.returncode == 6, auto.stderr[-3000:]
        assert "is built for CUDA 12.8 but the toolkit at" in auto.stderr
        assert "--cuda-home /usr/local/cuda-12.8" in auto.stderr
    doctor = subprocess.run([sys.executable, "-m", "wheelforge", "doctor", "--python",
                             str(venv), "--toolkit", "managed"], capture_output=True,
                            text=True, timeout=300)
    assert doctor.returncode == 6 and "there is no managed toolkit for it" in doctor.stderr
    nowhere = build(tmp_path, "--python", venv, "--cuda-home", tmp_path / "no-cuda")
    assert nowhere.returncode == 6, nowhere.stderr[-3000:]
    assert f"CUDA_HOME={tmp_path / 'no-cuda'} is not a CUDA toolkit" in nowhere.stderr
    assert "Traceback" not in nowhere.stderr


# -- wheelforge install into a venv that holds torch -------------------------------------------

def torch_venv(root: Path, version: str, cuda: str) -> Path:
    """A venv (with pip) holding a torch distribution ``version`` of CUDA ``cuda``: its
    metadata and torch/version.py, what install reads (torch is never imported)."""
    venv = root / f"venv-{version}"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda = '{cuda}'\n")
    info = site / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return venv


@pytest.mark.integration
def test_install_picks_the_channel_of_the_venvs_torch_or_names_the_build(
        tmp_path: Path) -> None:
    from test_index_clients import pub
    from test_install_refusals import env_for, wf

    index = tmp_path / "index"
    for torch in ("2.14.1", "2.11.0"):
        tag = torch.rsplit(".", 1)[0]
        pub(index, tmp_path / "dist", "wf-demo", f"1.0+cu130torch{tag}", f"torch {torch}",
            target={"channel": f"cu130-torch{tag}", "cuda": "13.0", "torch": torch,
                    "archs": ["sm_120"], "build_key": f"key-{torch}"})
    env = env_for(tmp_path / "home")
    venv = torch_venv(tmp_path, "2.11.0", "13.0")
    done = wf("install", "--index", str(index), "--python", str(venv), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("channel cu130-torch2.11: built for the venv's torch 2.11.0 (CUDA 13.0) in "
            f"{venv}/bin/python") in done.stderr
    assert "wf-demo==1.0+cu130torch2.11" in done.stdout
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "torch-2.11.0.dist-info").is_dir()  # the venv's torch stays

    other = torch_venv(tmp_path, "2.12.1", "13.0")
    refused = wf("install", "--index", str(index), "--python", str(other), env=env,
                 cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert (f"has no channel for torch 2.12.1 (CUDA 13.0) in {other}/bin/python"
            in refused.stderr)
    assert "cu130-torch2.11, cu130-torch2.14" in refused.stderr
    assert f"wheelforge build wf-demo --python {other}/bin/python" in refused.stderr
    assert "published to cu130-torch2.12" in refused.stderr
    site = next((other / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("wf_demo*"))  # nothing installed

    chosen = wf("install", "--index", str(index), "--channel", "cu130-torch2.14", "--python",
                str(venv), env=env, cwd=tmp_path)
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert "note: channel cu130-torch2.14 is built for another torch than the venv's" in (
        chosen.stderr)
