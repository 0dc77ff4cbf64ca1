"""The stable-ABI variant (docs/stable-abi.md): its recipe keys, its channel and label, and
the ABI audit (torch-abi-audit) that refuses a wheel linking torch outside the stable ABI.

The audit's fixtures are real shared objects compiled here with g++ (no torch, no nvcc):
one calls an ``at::`` function, one calls only stable C shims.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO
from wheelforge.builder import config as cfg
from wheelforge.builder.artifact import abiaudit
from wheelforge.builder.artifact.identity import local_label
from wheelforge.errors import RecipeError
from wheelforge.index import channel_name, stable_channel_name
from wheelforge.recipe.format import load_recipe, parse_recipe
from wheelforge.recipe.matrix import Matrix, TorchPin, cells

RECIPES = REPO / "recipes"
PATCHES = REPO / "patches"

AT_SOURCE = """
namespace at { struct Tensor; Tensor& zeros_like_fixture(const Tensor&); }
extern "C" void* fixture_entry(const at::Tensor& t) { return &at::zeros_like_fixture(t); }
"""
STABLE_SOURCE = """
extern "C" int aoti_torch_get_dim(void*, long*);
extern "C" int torch_call_dispatcher(const char*, const char*, void*, unsigned long);
extern "C" long fixture_entry(void* t) { long d = 0; aoti_torch_get_dim(t, &d);
    torch_call_dispatcher("aten::sum", "dim_IntList", nullptr, 0); return d; }
"""


@pytest.mark.unit
def test_the_stable_recipe_builds_causal_conv1d_without_a_torch_pin() -> None:
    r = load_recipe(RECIPES / "causal-conv1d-stable.yaml", PATCHES)
    assert r.name == "causal-conv1d-stable" and r.project_name == "causal-conv1d"
    assert r.build.stable_abi and not r.build.pin_torch
    assert r.build.local_version == "cu{cuda_major}stable{sm}"
    assert r.patches[-1].name == "0008-stable-abi-bindings.patch"
    plain = load_recipe(RECIPES / "causal-conv1d.yaml", PATCHES)
    assert plain.project_name == "causal-conv1d" and not plain.build.stable_abi


@pytest.mark.unit
def test_the_shared_patches_are_causal_conv1d_s_own() -> None:
    """0001-0007 are copies (a patch series lives beside its recipe): byte for byte."""
    stable = load_recipe(RECIPES / "causal-conv1d-stable.yaml", PATCHES)
    plain = load_recipe(RECIPES / "causal-conv1d.yaml", PATCHES)
    assert [p.name for p in stable.patches[:-1]] == [p.name for p in plain.patches]
    for mine, theirs in zip(stable.patches[:-1], plain.patches, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name


def _recipe(tmp_path: Path, build: dict[str, object], **top: object) -> None:
    data = {"format": 1, "name": "demo", "version": "1.0",
            "sources": [{"sdist": {"filename": "demo-1.0.tar.gz", "sha256": "0" * 64}}],
            "build": {"kind": "extension", **build}, **top}
    parse_recipe(data, tmp_path / "demo.yaml", tmp_path / "patches")


@pytest.mark.unit
@pytest.mark.parametrize(("build", "top", "said"), [
    ({"stable-abi": True}, {}, "set 'pin-torch: false'"),
    ({"stable-abi": True, "pin-torch": False, "local-version": "cu{cuda}torch{torch}{sm}"},
     {}, "name {cuda_major}, not {torch} or {cuda}"),
    ({"stable-abi": "yes", "pin-torch": False}, {}, "stable-abi: must be true or false"),
    ({}, {"project": "demo"}, "names the recipe itself"),
    ({}, {"project": "Causal_Conv1d"}, "must be the normalized project name"),
    ({"local-version": "cu{cudamajor}"}, {}, "use {cuda}, {cuda_major}, {torch}, {sm}"),
])
def test_bad_stable_keys_are_refused_by_name(tmp_path: Path, build: dict[str, object],
                                             top: dict[str, object], said: str) -> None:
    with pytest.raises(RecipeError) as exc:
        _recipe(tmp_path, build, **top)
    assert said in exc.value.why, exc.value.why


@pytest.mark.unit
def test_one_channel_per_cuda_major() -> None:
    assert stable_channel_name("13.0") == stable_channel_name("13.2") == "cu13-stable"
    assert stable_channel_name("12.8") == "cu12-stable"
    assert channel_name("13.0", "2.14.1") == "cu130-torch2.14"  # never the same name


@pytest.mark.unit
def test_the_torch_floor_is_read_from_requires_dist() -> None:
    assert str(abiaudit.torch_floor(["packaging", "torch>=2.10"])) == "2.10"
    assert abiaudit.torch_floor(["torch==2.14.*"]) is None
    assert abiaudit.requires_of("Name: x\nRequires-Dist: torch>=2.11\nRequires-Dist: a\n") \
        == ["torch>=2.11", "a"]


def _shared_object(tmp_path: Path, name: str, source: str) -> Path:
    cxx = shutil.which("g++")
    if cxx is None:  # the image has g++ (nvcc needs it); say so rather than skip quietly
        pytest.fail("g++ is needed to compile the audit's fixtures")
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    so = tmp_path / f"{name}.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(so), str(src)], check=True,
                   timeout=120)
    return so


def _wheel(tmp_path: Path, so: Path) -> Path:
    wheel = tmp_path / f"fixture_{so.stem}-1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(so, f"fixture_{so.stem}.abi3.so")
    return wheel


@pytest.mark.integration
def test_the_audit_refuses_a_wheel_that_links_at_symbols(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, _shared_object(tmp_path, "unstable", AT_SOURCE))
    issues = abiaudit.stable_abi_problems(wheel, ["torch>=2.10"])
    assert len(issues) == 1, issues
    assert "fixture_unstable.abi3.so links 1 torch symbol(s) outside the stable ABI" \
        in issues[0]
    assert "at::zeros_like_fixture(at::Tensor const&)" in issues[0]
    assert "port the code to torch/csrc/stable" in issues[0]


@pytest.mark.integration
def test_the_audit_passes_stable_shims_and_checks_the_torch_floor(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, _shared_object(tmp_path, "stable", STABLE_SOURCE))
    audit = abiaudit.audit_wheel(wheel)
    assert audit.unstable == (("fixture_stable.abi3.so", ()),)
    assert audit.min_torch is not None
    assert abiaudit.stable_abi_problems(wheel, ["torch>=2.10"]) == []
    missing = abiaudit.stable_abi_problems(wheel, ["torch"])
    assert missing and "must require 'torch>=2.N'" in missing[0]
    too_old = abiaudit.stable_abi_problems(wheel, ["torch>=2.0"])
    assert too_old and "raise its Requires-Dist" in too_old[0], too_old


@pytest.mark.unit
def test_the_nightly_builds_a_stable_recipe_once_per_cuda_major_and_arch_set() -> None:
    """docs/stable-abi.md, 'Builds per night': five torches of two CUDA majors, two
    Pythons, two arch sets."""
    torches = tuple(TorchPin(spec=f"torch=={v}", cuda=c) for v, c in (
        ("2.14.1", "13.0"), ("2.12.1", "13.0"), ("2.11.0", "13.0"), ("2.13.0", "12.8"),
        ("2.10.0", "12.8")))
    m = Matrix(path=Path("wheelforge.yaml"), recipes=("causal-conv1d-stable", "mamba-ssm"),
               pythons=("python3.11", "python3.12"), torches=torches,
               arch_sets=("12.0", "10.0;12.0"))
    got = cells(m, {"causal-conv1d-stable": "stable", "mamba-ssm": "extension"})
    stable = [c for c in got if c.recipe == "causal-conv1d-stable"]
    assert [(c.python, c.torch.spec, c.archs) for c in stable] == [
        ("python3.11", "torch==2.14.1", "12.0"), ("python3.11", "torch==2.14.1", "10.0;12.0"),
        ("python3.11", "torch==2.13.0", "12.0"), ("python3.11", "torch==2.13.0", "10.0;12.0")]
    assert len([c for c in got if c.recipe == "mamba-ssm"]) == 2 * 5 * 2


@pytest.mark.unit
@pytest.mark.parametrize(("cuda", "torch"), [("13.0", "2.14"), ("13.0", "2.11"), ("13.2", "2.15")])
def test_the_label_is_the_same_whatever_the_torch_of_the_cuda_major(
        tmp_path: Path, cuda: str, torch: str) -> None:
    recipe = load_recipe(RECIPES / "causal-conv1d-stable.yaml", PATCHES)
    conf = cfg.resolve(arch="12.0", cache_dir=tmp_path, index_dir=tmp_path / "index",
                       environ={}, subset=(), project_file=None)
    env = SimpleNamespace(torch_cuda=cuda, torch_major_minor=torch)
    assert local_label(recipe, env, conf) == "cu13stablesm120"  # type: ignore[arg-type]


@pytest.mark.unit
def test_install_takes_an_abi3_wheel_for_a_newer_python() -> None:
    """`wheelforge install` checks the venv's Python against the wheels: a cp310-abi3
    wheel runs on 3.10 and newer, a cp311-cp311 wheel on 3.11 only."""
    from packaging.tags import Tag

    from wheelforge.wheel import tag_runs_on  # what install's check asks

    abi3 = Tag("cp310", "abi3", "manylinux_2_34_x86_64")
    assert tag_runs_on(abi3, "cp310") and tag_runs_on(abi3, "cp311") and \
        tag_runs_on(abi3, "cp313")
    assert not tag_runs_on(abi3, "cp39")
    plain = Tag("cp311", "cp311", "manylinux_2_34_x86_64")
    assert tag_runs_on(plain, "cp311") and not tag_runs_on(plain, "cp312")


# ---- the port against the real sdist and torch's real stable headers (g++, no nvcc) ----

def _first(paths: list[Path], what: str) -> Path:
    if not paths:  # the e2e set-up makes both; say what is missing rather than skip
        pytest.fail(f"{what} not found: run `wheelforge build causal-conv1d` once first")
    return sorted(paths)[-1]


@pytest.fixture(scope="module")
def stable_tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """causal-conv1d's sdist with causal-conv1d-stable's 8 patches applied."""
    from setup_py_runs import BOOK, patched_trees
    from wheelforge.builder.source.fetch import fetch

    recipe = BOOK.load("causal-conv1d-stable")
    return patched_trees(recipe, fetch(recipe, shared_cache).archive,
                         tmp_path_factory.mktemp("stable"))["patched"]


def _compile_binding(tree: Path, shared_cache: Path,
                     target: str) -> subprocess.CompletedProcess[str]:
    """The binding compiled (syntax only) against a managed environment's torch headers,
    whichever torch from 2.10 on it holds."""
    import sysconfig

    envs = shared_cache.glob("envs/*/lib/python3*/site-packages/torch/include")
    torch_inc = _first([p for p in envs if (p / "torch/csrc/stable/version.h").is_file()],
                       "a managed environment with torch's stable headers")
    cuda_inc = _first([p.parent for p in [Path("/usr/local/cuda/include/cuda_runtime_api.h"),
                                          *shared_cache.glob("toolkits/*/cuda/include/cuda_runtime_api.h")]
                       if p.is_file()], "a CUDA toolkit's headers")
    cxx = shutil.which("g++") or pytest.fail("g++ is needed to compile the binding")
    return subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", f"-I{tree / 'csrc'}", f"-I{torch_inc}",
         f"-I{cuda_inc}", f"-I{sysconfig.get_paths()['include']}", "-DPy_LIMITED_API=0x030A0000",
         f"-DTORCH_TARGET_VERSION={target}", str(tree / "csrc" / "causal_conv1d.cpp")],
        text=True, capture_output=True, timeout=600)


@pytest.mark.integration
def test_the_ported_binding_needs_torch_2_10_s_stable_api(stable_tree: Path,
                                                           shared_cache: Path) -> None:
    """The floor found by building: the binding compiles against torch's stable headers
    targeting 2.10, and not 2.9 (whose stable ops lack contiguous, sum and subtract)."""
    ok = _compile_binding(stable_tree, shared_cache, "0x020a000000000000")
    assert ok.returncode == 0, ok.stderr[-3000:]
    old = _compile_binding(stable_tree, shared_cache, "0x0209000000000000")
    assert old.returncode != 0
    for op in ("contiguous", "sum", "subtract"):
        assert f"‘{op}’ is not a member of ‘torch::stable’" in old.stderr \
            or f"'{op}' is not a member of 'torch::stable'" in old.stderr, old.stderr[-3000:]
    setup = (stable_tree / "setup.py").read_text()
    assert "py_limited_api=True" in setup and '"torch>=2.10"' in setup
    assert (stable_tree / "csrc" / "causal_conv1d_stable_compat.h").is_file()
