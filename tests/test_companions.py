"""Companion recipes (mamba-ssm needs causal-conv1d built for the same target) and the
version of a build from a commit after a release."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import make_wheel, write_recipe
from test_nightly import pure_project, write_matrix
from wheelforge import index, nightly
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.config import BuildConfig, resolve
from wheelforge.builder.env.buildenv import BuildEnv
from wheelforge.errors import BuildError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import load_matrix
from wheelforge.recipe.model import Recipe
from wheelforge.wheel import read_metadata, relabel

COMMIT = "e9594ce1c732d97440f0332fdc43170a2294dbfa"


def untagged_recipe(tmp_path: Path, kind: str = "extension") -> Recipe:
    body = ("format: 1\nname: demo\nversion: '2.3.2.post1'\nsources:\n"
            f"  - git: {{url: https://example.org/demo, commit: {COMMIT}, "
            f"release-tag: v2.3.2.post1, release-commit: {'a' * 40}}}\n"
            f"build: {{kind: {kind}}}\n")
    rdir = write_recipe(tmp_path / kind, "demo", body)
    return RecipeBook(rdir, tmp_path / kind / "patches").load("demo")


def env(torch: str = "2.14.1+cu130", cuda: str = "13.0") -> BuildEnv:
    return BuildEnv(python=Path(sys.executable), managed=True, python_version="3.11.7",
                    python_tag="cp311", torch_version=torch, torch_cuda=cuda,
                    distributions=())


def test_untagged_commit_in_the_local_label(tmp_path: Path) -> None:
    config = resolve(arch="12.0", environ={})
    label = identity.local_label(untagged_recipe(tmp_path), env(), config)
    assert label == "ge9594ce1c732.cu130torch2.14sm120"
    assert identity.local_label(untagged_recipe(tmp_path, "pure"), env(), config) == \
        "ge9594ce1c732.wf"
    git_build = Version(f"2.3.2.post1+{label}")
    release_build = Version("2.3.2.post1+cu130torch2.14sm120")  # the release sdist's build
    assert git_build != release_build and git_build.public == release_build.public
    assert git_build not in SpecifierSet(f"=={release_build}")
    assert release_build not in SpecifierSet(f"=={git_build}")


META = ("Requires-Dist: torch\nRequires-Dist: einops\nRequires-Dist: ninja\n"
        "Provides-Extra: causal-conv1d\n"
        "Requires-Dist: causal-conv1d>=1.2.0; extra == \"causal-conv1d\"\n")


def test_companions_pinned_exactly(tmp_path: Path) -> None:
    src = make_wheel(tmp_path / "in", {"mamba_ssm/__init__.py": ""}, name="mamba-ssm",
                     version="2.3.2.post1", tag="cp311-cp311-linux_x86_64", metadata_extra=META)
    out = relabel(src, tmp_path / "out", local="ge9594ce1c732.cu130torch2.14sm120",
                  torch_pin="==2.14.*", drop_requires=["ninja"],
                  pins={"causal-conv1d": "1.7.0+cu130torch2.14sm120"})
    meta = read_metadata(out).decode()
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert requires == [
        "Requires-Dist: torch==2.14.*", "Requires-Dist: einops",
        'Requires-Dist: causal-conv1d==1.7.0+cu130torch2.14sm120; extra == "causal-conv1d"',
        "Requires-Dist: causal-conv1d==1.7.0+cu130torch2.14sm120"]
    assert "Version: 2.3.2.post1+ge9594ce1c732.cu130torch2.14sm120" in meta


# -- building: companions first, once, reused; the nightly orders cells by them ---------------

def companion_book(root: Path) -> RecipeBook:
    for name in ("purea", "pureb", "purec"):
        pure_project(root, name)
    path = root / "recipes" / "purea.yaml"
    path.write_text(path.read_text() + "companions: [pureb]\n")
    return RecipeBook(root / "recipes", root / "patches")


def fake_build(calls: list[str]):  # type: ignore[no-untyped-def]
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        calls.append(recipe.name)
        key = identity.planned_key(recipe, config, RecipeBook(
            recipe.path.parent, recipe.path.parent.parent / "patches"), None)
        wheel = make_wheel(config.work_dir / "dist", {f"{recipe.name}/__init__.py": ""},
                           name=recipe.name, version=str(recipe.version))
        res = index.publish(config.index_dir, wheel, channel=None, cuda=None, torch=None,
                            archs=(), build_key=key)
        return pipeline.BuildResult(recipe, res.path, (), None, key)
    return build


@pytest.mark.integration
def test_nightly_builds_companions_first(tmp_path: Path) -> None:
    book = companion_book(tmp_path)
    path = write_matrix(tmp_path, ["purec", "purea", "pureb"],
                        [{"spec": "torch==2.14.1", "cuda": "13.0"}], ["12.0"])
    settings = nightly.Settings(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache",
                                work_dir=tmp_path / "work", project_file=path)
    calls: list[str] = []
    report = nightly.run(load_matrix(path, book.names()), book, settings,
                         reporter=Reporter(io.StringIO()), build=fake_build(calls))
    # the cells build at once: the independent purec at any time, pureb before the
    # recipe that names it
    assert sorted(calls) == ["purea", "pureb", "purec"]
    assert calls.index("pureb") < calls.index("purea")
    assert [r.recipe for r in report.results] == ["purec", "pureb", "purea"]  # plan order


def test_a_matrix_without_a_companion_is_a_config_error(tmp_path: Path) -> None:
    """A cell is built in a stage and only its own wheel leaves it: a companion that is not
    in the matrix would never be published, and the wheel that pins it could not be
    installed. Said before anything is built, for the nightly and for `nightly plan`."""
    from wheelforge.errors import ConfigError
    from wheelforge.nightly import fanout

    book = companion_book(tmp_path)
    path = write_matrix(tmp_path, ["purec", "purea"],
                        [{"spec": "torch==2.14.1", "cuda": "13.0"}], ["12.0"])
    settings = nightly.Settings(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache",
                                work_dir=tmp_path / "work", project_file=path)
    calls: list[str] = []
    with pytest.raises(ConfigError, match="lacks companion recipe") as exc:
        nightly.run(load_matrix(path, book.names()), book, settings,
                    reporter=Reporter(io.StringIO()), build=fake_build(calls))
    assert "pureb (a companion of purea)" in exc.value.what
    assert exc.value.fix == "add pureb to matrix.recipes"
    assert calls == []
    with pytest.raises(ConfigError, match="lacks companion recipe"):
        fanout.make_plan(load_matrix(path, book.names()), book, settings,
                         reporter=Reporter(io.StringIO()))


@pytest.mark.integration
def test_build_makes_and_then_reuses_the_companion(tmp_path: Path, shared_cache: Path) -> None:
    companion_book(tmp_path)
    args = [sys.executable, "-m", "wheelforge", "build", "purea", "--recipes",
            str(tmp_path / "recipes"), "--sources", str(tmp_path / "sdists"), "--index",
            str(tmp_path / "index"), "--cache-dir", str(shared_cache), "--work-dir",
            str(tmp_path / "work")]
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST",)}
    first = subprocess.run(args, capture_output=True, text=True, timeout=1200, env=environ)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[:2] == [
        "published: pureb-0.1.0+wf-py3-none-any.whl  [pure Python]",
        "published: purea-0.1.0+wf-py3-none-any.whl  [pure Python]"]
    assert "requires its companion pureb==0.1.0+wf" in first.stderr
    meta = read_metadata(tmp_path / "index" / "files" / "purea-0.1.0+wf-py3-none-any.whl").decode()
    assert "Requires-Dist: pureb==0.1.0+wf" in meta
    again = subprocess.run(args, capture_output=True, text=True, timeout=1200, env=environ)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[:2] == [
        "already published: pureb-0.1.0+wf-py3-none-any.whl  [pure Python]",
        "already published: purea-0.1.0+wf-py3-none-any.whl  [pure Python]"]


@pytest.mark.integration
def test_a_build_verifies_beside_its_companion_and_never_publishes_before_it(
        tmp_path: Path, shared_cache: Path) -> None:
    """Real builds of the pure fixtures (build_one).  pureb says its exact version once
    its build environment is known, and it is the version its wheel is published with.
    purea, given that version while pureb is still pending, pins it, post-processes and
    verifies its wheel, and then waits for pureb's published wheel: when pureb fails
    there, purea publishes nothing (its wheel would pin an unpublished one)."""
    book = companion_book(tmp_path)
    config = resolve(index_dir=tmp_path / "index", cache_dir=shared_cache,
                     work_dir=tmp_path / "work", sources_dirs=(tmp_path / "sdists",),
                     environ={k: v for k, v in os.environ.items()
                              if k != "TORCH_CUDA_ARCH_LIST"})
    said: list[str] = []
    b = pipeline.build_one(book.load("pureb"), config, Reporter(io.StringIO()),
                           on_version=said.append)
    assert said == [str(Version("0.1.0+wf"))]
    assert b.wheel.name.startswith(f"pureb-{said[0]}-")

    def failed() -> pipeline.BuildResult:
        raise BuildError("purea was not built: its companion pureb failed")

    out = io.StringIO()
    pending = pipeline.Pending(key=lambda: b.build_key, version=lambda: said[0],
                               result=failed)
    with pytest.raises(BuildError, match="its companion pureb failed"):
        pipeline.build_one(book.load("purea"), config, Reporter(out), {"pureb": pending})
    lines = out.getvalue()
    assert lines.index("requires its companion pureb==0.1.0+wf") < \
        lines.index("ok verify") < lines.index("waiting for its companion pureb")
    assert not list((tmp_path / "index" / "files").glob("purea-*"))

    wrong = pipeline.Pending(key=lambda: b.build_key, version=lambda: "0.1.0+other",
                             result=lambda: b)
    with pytest.raises(BuildError, match="pins pureb==0.1.0\\+other, but pureb was "
                                         "published as pureb-0.1.0\\+wf"):
        pipeline.build_one(book.load("purea"), config, Reporter(io.StringIO()),
                           {"pureb": wrong})
    assert not list((tmp_path / "index" / "files").glob("purea-*"))
