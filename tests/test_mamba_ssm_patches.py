"""Each mamba-ssm patch, proven: the upstream failure on the unpatched tree, fixed after.

The tree is the pinned commit, fetched from the offline bundle of upstream's repository
(../shared/upstream) as a build fetches it.  setup.py runs for real; torch is a stand-in
(tests/packages/faketorch) that records the compile flags instead of compiling, and a
sitecustomize aborts at the first network access.  The C++20 test compiles upstream's
binding unit against the real torch 2.14.1 headers of the managed build environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import setup_py_runs
from conftest import IN_CI, REPO, require_python311, require_tool
from setup_py_runs import (
    BOOK,
    Recorded,
    gencodes,
    make_fake_cuda,
    nvcc_flags,
    patched_trees,
    pip_toolkit,
    std_flags,
    threads,
)
from wheelforge.builder.config import DEFAULT_TORCH
from wheelforge.builder.env import buildenv
from wheelforge.builder.source.fetch import fetch
from wheelforge.recipe.matrix import TorchPin, load_matrix

MAMBA_URL = "https://github.com/state-spaces/mamba"
BUNDLE = REPO.parent / "shared" / "upstream" / "state-spaces-mamba.bundle"


def mirror() -> Path:
    """The offline mirror of upstream's repository (beside the clone in CI)."""
    for candidate in (BUNDLE, Path("/work/shared/upstream/state-spaces-mamba.bundle")):
        if candidate.is_file():
            return candidate
    if IN_CI:
        pytest.fail(f"{BUNDLE} is required under CI=true")
    pytest.skip(f"no offline mirror of {MAMBA_URL} ({BUNDLE})")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipe = BOOK.load("mamba-ssm")
    fetched = fetch(recipe, tmp_path_factory.mktemp("cache"), git_mirrors={MAMBA_URL: mirror()})
    return patched_trees(recipe, fetched.archive, tmp_path_factory.mktemp("mamba"))


@pytest.fixture
def fake_cuda(tmp_path: Path) -> Path:
    return make_fake_cuda(tmp_path / "cuda")


def run_setup(tree: Path, tmp_path: Path, args: list[str], env: dict[str, str]
              ) -> tuple[subprocess.CompletedProcess[str], Recorded]:
    # the recipe's MAMBA_KEEP_CUDA_BUILD: build the CUDA kernels
    return setup_py_runs.run_setup(tree, tmp_path, args, {"MAMBA_KEEP_CUDA_BUILD": "TRUE", **env},
                                   clear_prefixes=("MAMBA_",))






# -- 0001: find nvcc; bare_metal_version never undefined (both uses) --------------------------



def test_nameerror_upstream_and_fixed(trees: dict[str, Path], tmp_path: Path,
                                      fake_cuda: Path) -> None:
    # torch found no CUDA_HOME: upstream skips the guarded definition and then reads
    # bare_metal_version in the CUDA-major check outside the guard
    env = pip_toolkit(tmp_path, fake_cuda)
    proc, _ = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert proc.returncode != 0
    assert "NameError: name 'bare_metal_version' is not defined" in proc.stderr
    assert "if bare_metal_version.major != torch_cuda_version.major" in proc.stderr
    proc, data = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert data is not None
    assert str(data["torch_cuda_home"]).endswith("site-packages/nvidia/cu13")
    assert data["env_cuda_home"] == data["torch_cuda_home"]
    # the second use (the >= 11.8 / 12.8 / 13.0 gencode choice) sees the toolkit's version
    assert "arch=compute_121,code=sm_121" in gencodes(data)


@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
def test_toolkit_from_environment(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
                                  var: str) -> None:
    proc, data = run_setup(trees["patched"], tmp_path, ["--name"], {var: str(fake_cuda)})
    assert proc.returncode == 0, proc.stderr
    assert data is not None and data["torch_cuda_home"] == str(fake_cuda)


def test_no_toolkit_error_lists_what_was_searched(trees: dict[str, Path], tmp_path: Path) -> None:
    proc, _ = run_setup(trees["patched"], tmp_path, ["--name"],
                        {"CUDA_HOME": str(tmp_path / "nope"), "FAKE_HIDE_PREFIX": "/usr/local/cuda",
                         "PYTHONUSERBASE": str(tmp_path / "empty")})
    assert proc.returncode != 0
    assert "NameError" not in proc.stderr
    assert "mamba_ssm needs nvcc, the CUDA compiler, and none was found" in proc.stderr
    assert f"$CUDA_HOME: {tmp_path / 'nope'}" in proc.stderr


# -- 0002: TORCH_CUDA_ARCH_LIST honoured, never blanked ---------------------------------------

UPSTREAM_CUDA13 = ["arch=compute_75,code=sm_75", "arch=compute_80,code=sm_80",
                   "arch=compute_87,code=sm_87", "arch=compute_90,code=sm_90",
                   "arch=compute_100,code=sm_100", "arch=compute_120,code=sm_120",
                   "arch=compute_103,code=sm_103", "arch=compute_110,code=sm_110",
                   "arch=compute_121,code=sm_121"]


@pytest.mark.parametrize("arch_list", ["12.0", "10.0;12.0+PTX", "9.0a"])
def test_arch_list_honoured(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
                            arch_list: str) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": arch_list}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert gencodes(upstream) == UPSTREAM_CUDA13  # upstream ignores the list: 9 archs
    proc, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert gencodes(patched) == []  # torch turns TORCH_CUDA_ARCH_LIST into -gencode flags
    assert not any("arch" in f for f in nvcc_flags(patched))
    assert patched is not None and patched["env_arch_list"] == arch_list


def test_arch_list_never_blanked(trees: dict[str, Path], tmp_path: Path,
                                 fake_cuda: Path) -> None:
    # nvcc 13.0 against a torch built with CUDA 12.8: upstream empties the variable
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0", "FAKE_TORCH_CUDA": "12.8"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert upstream is not None and upstream["env_arch_list"] == ""
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert patched is not None and patched["env_arch_list"] == "12.0"


def test_upstream_list_when_unset(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
    assert gencodes(patched) == UPSTREAM_CUDA13


# -- 0003: C++20, against the real torch 2.14.1 headers ---------------------------------------



@pytest.fixture(scope="module")
def managed_python(shared_cache: Path) -> Path:
    """The managed torch 2.14.1 build environment (created as `make build` does), with
    what `import mamba_ssm` needs (the recipe's verify.requires)."""
    require_python311()
    env = buildenv.managed_env(shared_cache, base_python=Path(sys._base_executable),  # type: ignore[attr-defined]
                               torch_req=DEFAULT_TORCH,
                               requirements=BOOK.load("mamba-ssm").verify.requires)
    return env.python


def headers_of(python: Path) -> list[str]:
    """-I flags for the torch of a managed environment."""
    paths = json.loads(subprocess.run(
        [str(python), "-c",
         "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))"],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    torch_inc = Path(paths["purelib"]) / "torch" / "include"
    assert (torch_inc / "ATen" / "ATen.h").is_file()
    cuda = Path("/usr/local/cuda/include")
    return [f"-I{torch_inc}", f"-I{torch_inc / 'torch/csrc/api/include'}", f"-I{cuda}",
            f"-I{paths['include']}"]


@pytest.fixture(scope="module")
def torch_headers(managed_python: Path) -> list[str]:
    """-I flags for the managed torch 2.14.1 environment."""
    return headers_of(managed_python)


def compile_binding(tree: Path, std: str, headers: list[str]) -> subprocess.CompletedProcess[str]:
    """upstream's binding unit (the one host-compiled file, all of torch/extension.h),
    parsed by g++ with the given standard and torch's headers."""
    return subprocess.run(
        [require_tool("g++"), "-fsyntax-only", std, *headers,
         f"-I{tree / 'csrc/selective_scan'}", str(tree / "csrc/selective_scan/selective_scan.cpp")],
        capture_output=True, text=True, timeout=600)


def test_cxx17_fails_against_torch_214_and_cxx20_builds(
        trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
        torch_headers: list[str]) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert std_flags(upstream) == ("-std=c++17", "-std=c++17")
    assert std_flags(patched) == ("-std=c++20", "-std=c++20")

    before = compile_binding(trees["unpatched"], std_flags(upstream)[0], torch_headers)
    assert before.returncode != 0
    assert "C++20 or later compatible compiler is required to use ATen" in before.stderr
    after = compile_binding(trees["patched"], std_flags(patched)[0], torch_headers)
    assert after.returncode == 0, after.stderr[-3000:]


#: the shipped matrix's other torches (the default one is the test above's)
OTHER_PINS = [pin for pin in load_matrix(REPO / "wheelforge.yaml").torches
              if pin.spec != DEFAULT_TORCH]


@pytest.mark.parametrize("pin", OTHER_PINS, ids=[p.spec.split(",")[0] for p in OTHER_PINS])
def test_cxx20_builds_against_every_channels_torch(
        trees: dict[str, Path], tmp_path: Path, fake_cuda: Path, shared_cache: Path,
        pin: TorchPin) -> None:
    """Patch 0003's C++20 against the headers of every torch the shipped matrix builds a
    channel for (each torch's managed environment, as the nightly makes it): the binding
    unit parses.  (Measured once: upstream's C++17 parses against 2.11.0's, 2.12.1's and
    2.13.0's headers too, with warnings on 2.13; only 2.14 stops at ATen's #error.  Not
    compiled here again: one compile per torch keeps this ~15 s each.)"""
    require_python311()
    python = buildenv.managed_env(shared_cache, base_python=Path(sys._base_executable),  # type: ignore[attr-defined]
                                  torch_req=pin.spec, requirements=(),
                                  pip_args=pin.pip_args).python
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert std_flags(patched) == ("-std=c++20", "-std=c++20")
    after = compile_binding(trees["patched"], "-std=c++20", headers_of(python))
    assert after.returncode == 0, after.stderr[-3000:]


# -- 0004: no network during the build --------------------------------------------------------

def test_no_network_during_bdist_wheel(trees: dict[str, Path], tmp_path: Path,
                                       fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    out = tmp_path / "dist"
    proc, _ = run_setup(trees["unpatched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 97 and "NETWORK ACCESS: urllib.Request" in proc.stderr
    assert "github.com/state-spaces/mamba/releases" in proc.stderr
    proc, _ = run_setup(trees["patched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 0, proc.stderr
    assert "NETWORK ACCESS" not in proc.stderr
    assert len(list(out.glob("mamba_ssm-2.3.2.post1-*.whl"))) == 1


# -- 0005: NVCC_THREADS -----------------------------------------------------------------------



def test_nvcc_threads(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "NVCC_THREADS": "2"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert threads(upstream) == "4"
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert threads(patched) == "2"
    _, default = run_setup(trees["patched"], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
    assert threads(default) == "4"


# -- 0006: ninja is not a runtime requirement -------------------------------------------------

def requires(tree: Path, tmp_path: Path, fake_cuda: Path) -> list[str]:
    out = tmp_path / f"egg-{tree.parent.name}-{tree.name}"
    out.mkdir()
    proc, _ = run_setup(tree, tmp_path, ["-q", "egg_info", "-e", str(out)],
                        {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"})
    assert proc.returncode == 0, proc.stderr
    (req,) = out.glob("*.egg-info/requires.txt")
    return req.read_text().split("\n\n")[0].split()


def test_ninja_not_required_at_runtime(trees: dict[str, Path], tmp_path: Path,
                                       fake_cuda: Path) -> None:
    upstream = requires(trees["unpatched"], tmp_path, fake_cuda)
    patched = requires(trees["patched"], tmp_path, fake_cuda)
    assert "ninja" in upstream
    assert "ninja" not in patched
    # nothing else changed but 0009's move of the Mamba-3 stack to the extra
    assert sorted(r for r in upstream if r != "ninja" and r not in MAMBA3_UPSTREAM) == \
        sorted(patched)
    # and ninja stays a build requirement
    assert '"ninja"' in (trees["patched"] / "pyproject.toml").read_text().split("[build-system]")[1]


# -- 0007: a broken optional Mamba-3 kernel stack does not break `import mamba_ssm` ----------

def test_broken_mamba3_stack_keeps_import_working(trees: dict[str, Path], tmp_path: Path,
                                                  managed_python: Path) -> None:
    # what upstream's requirements resolve to fails at import in ways other than
    # ImportError: tilelang 0.1.8 with apache-tvm-ffi 0.1.12 (AttributeError inside
    # tvm_ffi), tilelang without z3-solver (OSError); stand-ins raise the same errors
    fake = tmp_path / "fake"
    for pkg, error in (("tilelang", "AttributeError(\"attribute '__dict__' of 'type' objects "
                                    "is not writable\")"),
                       ("cutlass", "OSError('libz3.so: cannot open shared object file')")):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "__init__.py").write_text(f"raise {error}\n")
    code = ("import mamba_ssm, mamba_ssm.modules.mamba3 as m3; "
            "print(m3.mamba3_mimo_combined, m3.mamba3_step_fn, mamba_ssm.Mamba2.__name__)")

    def run(tree: Path) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{fake}"
        return subprocess.run([str(managed_python), "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)

    before = run(trees["unpatched"])
    assert before.returncode != 0
    assert "AttributeError: attribute '__dict__' of 'type' objects is not writable" in before.stderr
    after = run(trees["patched"])
    assert after.returncode == 0, after.stderr[-3000:]
    assert after.stdout.split() == ["None", "None", "Mamba2"]


# -- 0009: the Mamba-3 kernel stack is the extra `mamba3`, with a tvm-ffi bound that imports --

MAMBA3_UPSTREAM = ("tilelang==0.1.8", "apache-tvm-ffi<=0.1.12", "quack-kernels>=0.3.4")


def extras(tree: Path, tmp_path: Path, fake_cuda: Path) -> dict[str, list[str]]:
    out = tmp_path / f"egg-extras-{tree.parent.name}-{tree.name}"
    out.mkdir()
    proc, _ = run_setup(tree, tmp_path, ["-q", "egg_info", "-e", str(out)],
                        {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"})
    assert proc.returncode == 0, proc.stderr
    (req,) = out.glob("*.egg-info/requires.txt")
    sections: dict[str, list[str]] = {"": []}
    name = ""
    for line in req.read_text().splitlines():
        if line.startswith("["):
            name = line.strip("[]")
            sections[name] = []
        elif line.strip():
            sections[name].append(line.strip())
    return sections


def test_mamba3_stack_is_an_extra(trees: dict[str, Path], tmp_path: Path,
                                  fake_cuda: Path) -> None:
    upstream = extras(trees["unpatched"], tmp_path, fake_cuda)
    patched = extras(trees["patched"], tmp_path, fake_cuda)
    assert all(r in upstream[""] for r in MAMBA3_UPSTREAM)
    assert not any(r.startswith(("tilelang", "apache-tvm-ffi", "quack")) for r in patched[""])
    assert patched["mamba3"] == ["tilelang==0.1.8", "apache-tvm-ffi<0.1.12",
                                 "quack-kernels>=0.3.4"]


@pytest.mark.parametrize("which", ["upstream", "patched"])
def test_tilelang_imports_with_what_pip_resolves_for_the_bound(
        which: str, trees: dict[str, Path], tmp_path: Path, managed_python: Path) -> None:
    """The upstream failure, for real: pip resolves upstream's `apache-tvm-ffi<=0.1.12`
    beside `tilelang==0.1.8` to 0.1.12, with which `import tilelang` raises AttributeError
    (and so does `import fla` where fla-core finds tilelang); the patched bound resolves to
    a tvm-ffi that tilelang 0.1.8 imports with.  Real tilelang and tvm-ffi wheels from the
    package index, the managed torch 2.14.1."""
    bound = "apache-tvm-ffi<=0.1.12" if which == "upstream" else "apache-tvm-ffi<0.1.12"
    assert any(bound in line for line in (trees["unpatched" if which == "upstream" else
                                                "patched"] / "pyproject.toml")
               .read_text().splitlines())
    # a venv layered on the managed environment: its torch satisfies tilelang's, pip
    # resolves the rest (z3-solver, psutil, ...) as for a user
    venv = tmp_path / "venv"
    subprocess.run([str(managed_python), "-m", "venv", str(venv)], check=True, timeout=300)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(managed_python), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    own = subprocess.run([str(vpy), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "zz-managed.pth").write_text(site + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = subprocess.run([str(vpy), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "tilelang==0.1.8", bound], capture_output=True, text=True,
                         timeout=1800, env=env)
    assert pip.returncode == 0, pip.stderr[-3000:]
    probe = subprocess.run(
        [str(vpy), "-c", "import importlib.metadata as md; "
         "print(md.version('apache-tvm-ffi')); import tilelang; print('imported')"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    version = probe.stdout.split()[0]
    if which == "upstream":
        assert version == "0.1.12"
        assert probe.returncode != 0
        assert "AttributeError: attribute '__dict__' of 'type' objects is not writable" \
            in probe.stderr
    else:
        assert version.startswith("0.1.") and int(version.split(".")[2].split("post")[0]) < 12
        assert probe.returncode == 0, probe.stderr[-3000:]
        assert probe.stdout.split()[-1] == "imported"
