"""The stable-ABI mamba-ssm (recipes/mamba-ssm-stable.yaml, docs/stable-abi.md): its recipe
keys, its copies of mamba-ssm's patches, its companion (the stable causal-conv1d, pinned by
the project name its wheel carries), and its port compiled against torch's real stable
headers: the binding at target 2.10 and not 2.9 (g++, the pinned commit patched).
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO
from wheelforge._log import Reporter
from wheelforge.builder import config as cfg
from wheelforge.builder import pipeline
from wheelforge.builder.artifact.identity import local_label
from wheelforge.recipe.format import RecipeBook, load_recipe
from wheelforge.wheel import read_metadata

RECIPES = REPO / "recipes"
PATCHES = REPO / "patches"
GPUTESTS = REPO / "gputests"
PORT = "0010-stable-abi-bindings.patch"


@pytest.mark.unit
def test_the_stable_recipe_is_mamba_ssm_s_pin_without_a_torch_pin() -> None:
    stable = load_recipe(RECIPES / "mamba-ssm-stable.yaml", PATCHES)
    plain = load_recipe(RECIPES / "mamba-ssm.yaml", PATCHES)
    assert stable.name == "mamba-ssm-stable" and stable.project_name == "mamba-ssm"
    assert stable.build.stable_abi and not stable.build.pin_torch
    assert stable.build.local_version == "cu{cuda_major}stable{sm}"
    assert stable.sources == plain.sources  # the same commit, fetched the same way
    assert stable.version == plain.version
    assert stable.companions == ("causal-conv1d-stable",)
    assert plain.companions == ("causal-conv1d",)
    assert stable.patches[-1].name == PORT
    assert stable.verify.imports == plain.verify.imports
    assert stable.test.source_files == plain.test.source_files


@pytest.mark.unit
def test_the_shared_patches_are_mamba_ssm_s_own() -> None:
    """0001-0009 are copies (a patch series lives beside its recipe): byte for byte; the
    GPU test's files are mamba-ssm's own (a variant without gputests/NAME/ takes its
    project's)."""
    stable = load_recipe(RECIPES / "mamba-ssm-stable.yaml", PATCHES)
    plain = load_recipe(RECIPES / "mamba-ssm.yaml", PATCHES)
    assert [p.name for p in stable.patches[:-1]] == [p.name for p in plain.patches]
    for mine, theirs in zip(stable.patches[:-1], plain.patches, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name
    assert stable.test.files == plain.test.files
    assert all(f.is_file() for f in stable.test.files)


@pytest.mark.unit
def test_the_port_changes_the_kernels_only_in_their_includes() -> None:
    """The .cu and .cuh units: every line the port removes or adds is an #include (or
    the compat header's comment beside it)."""
    text = (PATCHES / "mamba-ssm-stable" / PORT).read_text()
    for part in text.split("diff --git ")[1:]:
        name = part.split()[0].removeprefix("a/")
        if not name.endswith((".cu", ".cuh", "selective_scan_common.h")):
            continue
        changed = [ln[1:] for ln in part.splitlines()[4:]
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        assert changed and all(ln.startswith("#include") for ln in changed), (name, changed)


@pytest.mark.unit
@pytest.mark.parametrize(("cuda", "torch"), [("13.0", "2.14"), ("13.0", "2.11"), ("13.2", "2.15")])
def test_the_label_is_causal_conv1d_stable_s_whatever_the_torch(
        tmp_path: Path, cuda: str, torch: str) -> None:
    conf = cfg.resolve(arch="9.0", cache_dir=tmp_path, index_dir=tmp_path / "index",
                       environ={}, subset=(), project_file=None)
    env = SimpleNamespace(torch_cuda=cuda, torch_major_minor=torch)
    # the commit after the release comes first in mamba-ssm's label (a per-torch build's
    # is ge9594ce1c732.cu130torch2.14sm90)
    for name, label in (("mamba-ssm-stable", "ge9594ce1c732.cu13stablesm90"),
                        ("causal-conv1d-stable", "cu13stablesm90")):
        recipe = load_recipe(RECIPES / f"{name}.yaml", PATCHES)
        assert local_label(recipe, env, conf) == label  # type: ignore[arg-type]


# ---- a variant companion is pinned by its project's name (real pure builds) ----

def _variant_book(root: Path) -> RecipeBook:
    """purea needs pureb-stable, a variant recipe whose wheel is the project pureb."""
    from test_nightly import pure_project

    for name in ("purea", "pureb"):
        pure_project(root, name)
    recipes = root / "recipes"
    variant = (recipes / "pureb.yaml").read_text().replace("name: pureb\n",
                                                           "name: pureb-stable\nproject: pureb\n")
    assert "project: pureb" in variant
    (recipes / "pureb-stable.yaml").write_text(variant)
    (recipes / "purea.yaml").write_text((recipes / "purea.yaml").read_text()
                                        + "companions: [pureb-stable]\n")
    return RecipeBook(recipes, root / "patches")


@pytest.mark.integration
def test_a_variant_companion_is_pinned_by_the_project_its_wheel_carries(
        tmp_path: Path, shared_cache: Path) -> None:
    """mamba-ssm-stable pins causal-conv1d-stable's wheel, whose project is causal-conv1d:
    the pin must name causal-conv1d (before, it named the recipe: `Requires-Dist:
    causal-conv1d-stable==…`, a project no index serves, so the install failed), both when
    the companion is done and when it is built beside (Pending)."""
    book = _variant_book(tmp_path)
    config = cfg.resolve(index_dir=tmp_path / "index", cache_dir=shared_cache,
                         work_dir=tmp_path / "work", sources_dirs=(tmp_path / "sdists",),
                         environ={k: v for k, v in os.environ.items()
                                  if k != "TORCH_CUDA_ARCH_LIST"})
    b = pipeline.build_one(book.load("pureb-stable"), config, Reporter(io.StringIO()))
    assert b.wheel.name.startswith("pureb-0.1.0+wf-")
    out = io.StringIO()
    a = pipeline.build_one(book.load("purea"), config, Reporter(out), {"pureb-stable": b})
    meta = read_metadata(a.wheel).decode()
    assert "Requires-Dist: pureb==0.1.0+wf" in meta and "pureb-stable" not in meta, meta
    assert "requires its companion pureb==0.1.0+wf" in out.getvalue()

    pending = pipeline.Pending(key=lambda: b.build_key, version=lambda: "0.1.0+wf",
                               result=lambda: b, project="pureb")
    beside = dataclasses.replace(config, index_dir=tmp_path / "index2")
    again = pipeline.build_one(book.load("purea"), beside, Reporter(io.StringIO()),
                               {"pureb-stable": pending})
    meta = read_metadata(again.wheel).decode()
    assert "Requires-Dist: pureb==0.1.0+wf" in meta and "pureb-stable" not in meta, meta


# ---- the port against the pinned commit and torch's real stable headers (g++, no nvcc) ----

@pytest.fixture(scope="module")
def stable_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mamba-ssm's pinned commit (the offline mirror) with mamba-ssm-stable's 10 patches."""
    from setup_py_runs import BOOK, patched_trees
    from test_mamba_ssm_patches import MAMBA_URL, mirror
    from wheelforge.builder.source.fetch import fetch

    recipe = BOOK.load("mamba-ssm-stable")
    fetched = fetch(recipe, tmp_path_factory.mktemp("cache"), git_mirrors={MAMBA_URL: mirror()})
    return patched_trees(recipe, fetched.archive, tmp_path_factory.mktemp("mamba"))["patched"]


def _first(paths: list[Path], what: str) -> Path:
    if not paths:  # the e2e set-up makes both; say what is missing rather than skip
        pytest.fail(f"{what} not found: run `wheelforge build mamba-ssm` once first")
    return sorted(paths)[-1]


def torch_include(shared_cache: Path) -> Path:
    """A managed environment's torch headers (whichever torch from 2.10 on it holds)."""
    envs = shared_cache.glob("envs/*/lib/python3*/site-packages/torch/include")
    return _first([p for p in envs if (p / "torch/csrc/stable/version.h").is_file()],
                  "a managed environment with torch's stable headers")


def include_flags(tree: Path, shared_cache: Path) -> list[str]:
    """The port's include flags: its sources, torch's headers, a CUDA toolkit's."""
    torch_inc = torch_include(shared_cache)
    cuda_inc = _first([p.parent for p in [Path("/usr/local/cuda/include/cuda_runtime_api.h"),
                                          *shared_cache.glob("toolkits/*/cuda/include/cuda_runtime_api.h")]
                       if p.is_file()], "a CUDA toolkit's headers")
    return [f"-I{tree / 'csrc' / 'selective_scan'}", f"-I{torch_inc}", f"-I{cuda_inc}"]


def compile_cxx(tree: Path, shared_cache: Path, target: str, source: Path,
                out: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``source`` compiled with g++ against the port's headers at TORCH_TARGET_VERSION
    ``target``: syntax only, or into the object ``out``."""
    cxx = shutil.which("g++") or pytest.fail("g++ is needed to compile the binding")
    what = ["-fsyntax-only"] if out is None else ["-c", "-fPIC", "-O1", "-o", str(out)]
    return subprocess.run(
        [cxx, "-std=c++20", *what, *include_flags(tree, shared_cache),
         f"-I{sysconfig.get_paths()['include']}", "-DPy_LIMITED_API=0x030A0000",
         f"-DTORCH_TARGET_VERSION={target}", str(source)],
        text=True, capture_output=True, timeout=600)


def compile_binding(tree: Path, shared_cache: Path, target: str,
                    out: Path | None = None) -> subprocess.CompletedProcess[str]:
    """selective_scan.cpp compiled against a managed environment's torch headers."""
    return compile_cxx(tree, shared_cache, target,
                       tree / "csrc" / "selective_scan" / "selective_scan.cpp", out)


@pytest.mark.integration
def test_the_ported_binding_needs_torch_2_10_s_stable_api(stable_tree: Path,
                                                           shared_cache: Path) -> None:
    """The floor found by building: the binding compiles against torch's stable headers
    targeting 2.10, and not 2.9 (whose torch/csrc/stable has no to() and cannot return a
    std::vector, the ops' Tensor[])."""
    ok = compile_binding(stable_tree, shared_cache, "0x020a000000000000")
    assert ok.returncode == 0, ok.stderr[-3000:]
    old = compile_binding(stable_tree, shared_cache, "0x0209000000000000")
    assert old.returncode != 0
    assert "‘to’ is not a member of ‘torch::stable’" in old.stderr \
        or "'to' is not a member of 'torch::stable'" in old.stderr, old.stderr[-3000:]
    assert "std::vector<T> requires TORCH_FEATURE_VERSION >= TORCH_VERSION_2_10_0" \
        in old.stderr, old.stderr[-3000:]
    setup = (stable_tree / "setup.py").read_text()
    assert "py_limited_api=True" in setup and 'TORCH_REQUIREMENT = "torch>=2.10"' in setup
    # setuptools writes pyproject.toml's dependencies as Requires-Dist, not install_requires
    assert '"torch>=2.10",' in (stable_tree / "pyproject.toml").read_text()
    interface = (stable_tree / "mamba_ssm" / "ops" / "selective_scan_interface.py").read_text()
    # upstream's pybind calls are gone: the ops are called, in two places
    assert "= selective_scan_cuda." not in interface
    assert interface.count("torch.ops.selective_scan_cuda.fwd(") == 1
    assert interface.count("torch.ops.selective_scan_cuda.bwd(") == 1


@pytest.mark.unit
def test_the_nightly_builds_both_stable_recipes_once_per_cuda_major_and_arch_set() -> None:
    """docs/stable-abi.md, 'Builds per night': with mamba-ssm-stable pinning the stable
    causal-conv1d, five torches of two CUDA majors and two Pythons need 2 cells a recipe
    per CUDA major, the companion's first."""
    from wheelforge.builder.artifact.identity import companion_depth
    from wheelforge.recipe.matrix import Matrix, TorchPin, cells

    torches = tuple(TorchPin(spec=f"torch=={v}", cuda=c) for v, c in (
        ("2.14.1", "13.0"), ("2.12.1", "13.0"), ("2.11.0", "13.0"), ("2.13.0", "12.8"),
        ("2.10.0", "12.8")))
    names = ("mamba-ssm-stable", "causal-conv1d-stable")
    m = Matrix(path=Path("wheelforge.yaml"), recipes=names,
               pythons=("python3.11", "python3.12"), torches=torches,
               arch_sets=("12.0", "10.0;12.0"))
    got = cells(m, dict.fromkeys(names, "stable"))
    for name in names:
        assert [(c.torch.spec, c.archs) for c in got if c.recipe == name] == [
            ("torch==2.14.1", "12.0"), ("torch==2.14.1", "10.0;12.0"),
            ("torch==2.13.0", "12.0"), ("torch==2.13.0", "10.0;12.0")]
    book = RecipeBook(RECIPES, PATCHES)
    assert companion_depth(book.load("mamba-ssm-stable"), book) == 1
    assert companion_depth(book.load("causal-conv1d-stable"), book) == 0


# ---- `wheelforge test` picks a variant recipe's wheel (consume/gputest.py) ----

def _record(filename: str, channel: str, torch: str) -> object:
    from wheelforge.index import WheelRecord

    project, version = filename.split("-")[:2]
    return WheelRecord(filename=filename, project=project.replace("_", "-"),  # type: ignore[arg-type]
                       version=version, sha256="0" * 64, size=1, requires_python=">=3.10",
                       upload_time="2026-12-07T05:41:00Z", channel=channel, cuda="13.0",
                       torch=torch, archs=("sm_90",), build_key="k")


@pytest.mark.unit
def test_wheelforge_test_picks_the_stable_wheel_for_the_variant_and_not_for_the_plain() -> None:
    """`wheelforge test mamba-ssm-stable` on the GPU machine (torch 2.11, Python 3.12):
    before, it looked for wheels of a project named mamba-ssm-stable (none: the wheel is
    mamba-ssm's) built for torch 2.11 (the stable wheel was built with 2.14) and for
    cp312 (it is cp310-abi3), and the per-torch recipe could take the stable wheel (its
    label sorts higher)."""
    import sys

    from wheelforge.builder.env.buildenv import BuildEnv
    from wheelforge.consume.gputest import pick_wheel

    stable = _record("mamba_ssm-2.3.2.post1+ge9594ce1c732.cu13stablesm90-cp310-abi3-"
                     "manylinux_2_34_x86_64.whl", "cu13-stable", "2.14.1+cu130")
    plain = _record("mamba_ssm-2.3.2.post1+ge9594ce1c732.cu130torch2.11sm90-cp312-cp312-"
                    "manylinux_2_34_x86_64.whl", "cu130-torch2.11", "2.11.0+cu130")
    gpu_machine = BuildEnv(python=Path(sys.executable), managed=False, python_version="3.12.3",
                           python_tag="cp312", torch_version="2.11.0+cu130", torch_cuda="13.0",
                           distributions=())
    book = RecipeBook(RECIPES, PATCHES)
    records = [stable, plain]
    assert pick_wheel(records, book.load("mamba-ssm-stable"), gpu_machine) is stable  # type: ignore[arg-type]
    assert pick_wheel(records, book.load("mamba-ssm"), gpu_machine) is plain  # type: ignore[arg-type]
    old_python = dataclasses.replace(gpu_machine, python_tag="cp39")
    from wheelforge.errors import ToolchainError
    with pytest.raises(ToolchainError, match="no published wheel of mamba-ssm-stable"):
        pick_wheel(records, book.load("mamba-ssm-stable"), old_python)  # type: ignore[arg-type]
