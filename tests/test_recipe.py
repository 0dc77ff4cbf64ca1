from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, write_recipe
from wheelforge.errors import RecipeError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import GitSource, SdistSource

SHA = "a" * 64
COMMIT = "b" * 40

GOOD = f"""
format: 1
name: demo
version: "1.2.0"
sources:
  - sdist: {{filename: demo-1.2.0.tar.gz, sha256: {SHA}, url: https://example.org/demo-1.2.0.tar.gz}}
  - git: {{url: https://example.org/demo.git, commit: {COMMIT}, tag: v1.2.0}}
patches: [0001-fix.patch]
build:
  kind: extension
  requires: [setuptools, "ninja>=1.11"]
  env: {{DEMO_FORCE_BUILD: "TRUE"}}
  drop-requires: [Ninja]
verify:
  imports: [demo_cuda, demo.sub]
"""


def book(tmp_path: Path, body: str, name: str = "demo") -> RecipeBook:
    rdir = write_recipe(tmp_path, name, body, {"0001-fix.patch": "--- a/x\n+++ b/x\n"})
    return RecipeBook(rdir, tmp_path / "patches")


def problems(tmp_path: Path, body: str) -> str:
    with pytest.raises(RecipeError) as exc:
        book(tmp_path, body).load("demo")
    return exc.value.why


def test_good_recipe(tmp_path: Path) -> None:
    r = book(tmp_path, GOOD).load("demo")
    assert str(r.version) == "1.2.0"
    assert r.sources[0] == SdistSource(filename="demo-1.2.0.tar.gz", sha256=SHA,
                                       url="https://example.org/demo-1.2.0.tar.gz")
    assert r.sources[1] == GitSource(url="https://example.org/demo.git", commit=COMMIT,
                                     tag="v1.2.0")
    assert r.build.kind == "extension" and r.build.pin_torch
    assert r.build.local_version == "cu{cuda}torch{torch}{sm}"
    assert r.build.env == (("DEMO_FORCE_BUILD", "TRUE"),)
    assert r.build.drop_requires == ("ninja",)
    assert r.verify.imports == ("demo_cuda", "demo.sub")
    assert r.patches[0].name == "0001-fix.patch"


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    body = f"""
format: 1
name: demo
version: 1.2
sources:
  - sdist: {{filename: demo-1.2.0.tar.gz, sha256: {SHA[:10]}}}
  - git: {{url: x, commit: main}}
patches: [missing.patch]
buld: {{}}
build: {{kind: extension, requires: ["not a req !!"], env: {{FLAG: 1}}, lokal-version: x}}
verify: {{imports: ["1bad"]}}
"""
    why = problems(tmp_path, body)
    for expected in [
        "version: must be a string (quote it in YAML: '1.2')",
        "sources[0].sdist.sha256: must be 64 lowercase hex digits",
        "sources[1].git.commit: must be a full 40-hex commit id",
        "patches[0]: patch file",
        "buld: unknown key; did you mean 'build'?",
        "build.requires[0]: not a valid requirement",
        "build.env.FLAG: must be a string (quote it in YAML)",
        "build.lokal-version: unknown key; did you mean 'local-version'?",
        "verify.imports[0]: '1bad' is not a module name",
    ]:
        assert expected in why, expected
    assert str(tmp_path / "recipes" / "demo.yaml") in why


@pytest.mark.parametrize(("snippet", "message"), [
    ("name: Demo_X", "must be the normalized project name 'demo-x'"),
    ("version: '1.2.0+local'", "must not carry a local label"),
    ("sources: []", "is required: a list of one or more pinned sources"),
    ("sources: [{svn: {}}]", "unknown source kind"),
    ("build: {kind: fat}", "must be one of extension, pure"),
    ("build: {kind: pure, local-version: '{gpu}'}", "unknown field(s) gpu"),
    ("format: 2", "must be 1 (the recipe format version)"),
])
def test_single_problems(tmp_path: Path, snippet: str, message: str) -> None:
    body = _drop_block(GOOD, snippet.split(":")[0])
    assert message in problems(tmp_path, body + "\n" + snippet + "\n")


def _drop_block(text: str, key: str) -> str:
    out, skipping = [], False
    for ln in text.splitlines():
        if ln.startswith(key + ":"):
            skipping = True
            continue
        if skipping and ln.startswith(" "):
            continue
        skipping = False
        out.append(ln)
    return "\n".join(out)


def test_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not valid YAML"):
        book(tmp_path, "name: [unclosed").load("demo")


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    with pytest.raises(RecipeError):
        book(tmp_path, "!!python/object/apply:os.system ['echo pwned']").load("demo")


def test_unknown_recipe_suggests(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as exc:
        book(tmp_path, GOOD).load("dem")
    assert "did you mean 'demo'?" in exc.value.fix


def test_shipped_recipes_are_valid() -> None:
    loaded = RecipeBook(REPO / "recipes", REPO / "patches").load_all()
    assert [r.name for r in loaded] == ["causal-conv1d", "causal-conv1d-stable", "fla-core",
                                        "flash-attn", "flash-linear-attention", "mamba-ssm",
                                        "mamba-ssm-stable"]
    cc = loaded[0]
    assert isinstance(cc.sources[0], SdistSource)
    assert cc.sources[0].sha256 == \
        "3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b"
    assert [p.name for p in cc.patches] == [
        "0001-find-nvcc.patch", "0002-honour-torch-cuda-arch-list.patch",
        "0003-no-network-during-build.patch", "0004-nvcc-threads.patch",
        "0005-split-kernels-into-translation-units.patch",
        "0006-binding-unit-without-debug-info.patch", "0007-compress-every-fatbin.patch"]


def test_pure_wheels_get_a_local_label_too(tmp_path: Path) -> None:
    """`fla-core==0.6.0` in a dependent's metadata matches `0.6.0+wf` (PEP 440), and no
    public upload can carry a local version: the label keeps pure wheels apart too."""
    from packaging.specifiers import SpecifierSet

    shipped = RecipeBook(REPO / "recipes", REPO / "patches")
    assert shipped.load("fla-core").build.local_version == "wf"
    assert shipped.load("flash-linear-attention").build.local_version == "wf"
    assert "0.6.0+wf" in SpecifierSet("==0.6.0")
    assert "0.6.0" not in SpecifierSet("==0.6.0+wf")


@pytest.mark.parametrize(("kind", "label", "pin", "needs"), [
    ("pure", "wf", False, False),  # the default: torch is never imported for it
    ("pure", "", False, False),
    ("pure", "wf.torch{torch}", False, True),
    ("pure", "cu{cuda}", False, True),
    ("pure", "wf", True, True),
    ("extension", "cu{cuda}torch{torch}{sm}", False, True),
    ("extension", "", False, True),
])
def test_a_build_needs_torch_only_when_the_wheel_depends_on_it(
        kind: str, label: str, pin: bool, needs: bool) -> None:
    from wheelforge.recipe.model import BuildSpec

    spec = BuildSpec(kind=kind, local_version=label, pin_torch=pin)  # type: ignore[arg-type]
    assert spec.needs_torch is needs


def test_shipped_mamba_ssm_recipe() -> None:
    r = RecipeBook(REPO / "recipes", REPO / "patches").load("mamba-ssm")
    (src,) = r.sources
    assert isinstance(src, GitSource)
    assert (src.commit, src.tag) == ("e9594ce1c732d97440f0332fdc43170a2294dbfa", None)
    assert (src.release_tag, src.release_commit) == (
        "v2.3.2.post1", "a14b1dff0454a3bc27d9eb31355dc01e4b2490ec")
    assert r.untagged_commit == src.commit and str(r.version) == "2.3.2.post1"
    assert r.companions == ("causal-conv1d",)
    assert dict(r.build.env) == {"MAMBA_KEEP_CUDA_BUILD": "TRUE", "MAMBA_FORCE_BUILD": "TRUE"}
    assert len(r.patches) == 9


@pytest.mark.parametrize("companions, message", [
    ("[Causal_Conv1d]", "must be the normalized recipe name 'causal-conv1d'"),
    ("[demo]", "a recipe cannot be its own companion"),
    ("[nope]", "no recipe nope.yaml beside this one"),
    ("[other, other]", "lists a recipe twice"),
])
def test_companions_validated(tmp_path: Path, companions: str, message: str) -> None:
    b = book(tmp_path, GOOD + f"companions: {companions}\n")
    (b.recipes_dir / "other.yaml").write_text(GOOD.replace("name: demo", "name: other"))
    with pytest.raises(RecipeError) as exc:
        b.load("demo")
    assert message in (exc.value.why or "")
