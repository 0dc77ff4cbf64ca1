"""The SBOM each wheel carries (PEP 770): CycloneDX 1.6, valid by the library's own JSON
schema validator, with the source, the patches and the toolchain; written into the wheel
with RECORD updated, the same bytes for the same build; shown by `wheelforge inspect`.

The recipes are the shipped ones (a git commit on GitHub with patches; a PyPI sdist)."""

from __future__ import annotations

import json
import shutil
import uuid
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from cyclonedx.schema import OutputFormat, SchemaVersion
from cyclonedx.validation import make_schemabased_validator

from conftest import REPO, make_wheel
from wheelforge.builder.artifact.platform import PlatformTag
from wheelforge.builder.artifact.sbom import SBOM_PATH, Toolchain, add_sbom, read_sbom
from wheelforge.cli.main import cli
from wheelforge.recipe.format import RecipeBook
from wheelforge.wheel import add_files, check_wheel, record_problems, relabel

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
KEY = "0123456789abcdef" * 4
TOOLS = Toolchain(python="3.11.9", nvcc="13.0", cxx="g++ (Debian 12.2.0-14) 12.2.0",
                  torch="2.14.1+cu130", torch_cuda="13.0")
EPOCH = 1767225600  # 2026-01-01T00:00:00Z


def _wheel(tmp_path: Path, name: str, version: str) -> Path:
    return make_wheel(tmp_path / "w", {f"{name.replace('-', '_')}/__init__.py": "X = 1\n"},
                      name=name, version=version, tag="cp311-cp311-linux_x86_64")


def _with_sbom(tmp_path: Path, recipe: str, version: str) -> Path:
    wheel = _wheel(tmp_path, recipe, version)
    return add_sbom(wheel, name=recipe, version=version, recipe=BOOK.load(recipe),
                    archs=("12.0",), build_key=KEY, toolchain=TOOLS, epoch=EPOCH)


@pytest.mark.parametrize("recipe", ["mamba-ssm", "causal-conv1d"])
def test_the_sbom_is_valid_cyclonedx_1_6(tmp_path: Path, recipe: str) -> None:
    wheel = _with_sbom(tmp_path, recipe, "1.0+cu130")
    text = zipfile.ZipFile(wheel).read(f"{recipe.replace('-', '_')}-1.0+cu130.dist-info/"
                                       f"{SBOM_PATH}").decode()
    validator = make_schemabased_validator(OutputFormat.JSON, SchemaVersion.V1_6)
    assert validator.validate_str(text) is None  # None: no validation error
    assert record_problems(wheel) == []
    check_wheel(wheel)


def test_the_sbom_names_package_source_patches_toolchain_and_key(tmp_path: Path) -> None:
    bom = read_sbom(_with_sbom(tmp_path, "mamba-ssm", "2.3.2.post1+ge9594ce1c732.cu130"))
    assert bom is not None
    assert bom["specVersion"] == "1.6"
    assert bom["serialNumber"] == f"urn:uuid:{uuid.uuid5(uuid.UUID('6f1d7c1e-4b7a-5c55-9f0e-77686565c666'), f'build-key:{KEY}')}"  # noqa: E501
    assert bom["metadata"]["timestamp"] == "2026-01-01T00:00:00+00:00"
    package = bom["metadata"]["component"]
    assert package["purl"] == "pkg:pypi/mamba-ssm@2.3.2.post1%2Bge9594ce1c732.cu130"
    (upstream,) = package["pedigree"]["ancestors"]
    assert upstream["purl"] == \
        "pkg:github/state-spaces/mamba@e9594ce1c732d97440f0332fdc43170a2294dbfa"
    patches = package["pedigree"]["patches"]
    recipe = BOOK.load("mamba-ssm")
    assert len(patches) == len(recipe.patches) > 0
    assert {p["type"] for p in patches} == {"unofficial"}
    # every patch's diff, whole (CycloneDX keeps patches as a set: its order is not the series')
    assert sorted(p["diff"]["text"]["content"] for p in patches) == \
        sorted(path.read_text() for path in recipe.patches)
    props = {p["name"]: p["value"] for p in package["properties"]}
    assert props["wheelforge:build-key"] == KEY
    assert props["wheelforge:archs"] == "12.0"
    assert props["wheelforge:cxx"] == TOOLS.cxx
    tools = {t["name"]: t for t in bom["metadata"]["tools"]["components"]}
    assert tools["nvcc"]["version"] == "13.0"
    assert tools["torch"]["version"] == "2.14.1+cu130"
    assert {"name": "cuda", "value": "13.0"} in tools["torch"]["properties"]
    assert set(tools) == {"wheelforge", "python", "nvcc", "c++", "torch"}


def test_an_sdist_source_is_named_with_its_sha256(tmp_path: Path) -> None:
    bom = read_sbom(_with_sbom(tmp_path, "causal-conv1d", "1.7.0+cu130"))
    assert bom is not None
    (upstream,) = bom["metadata"]["component"]["pedigree"]["ancestors"]
    source = BOOK.load("causal-conv1d").sources[0]
    assert upstream["purl"].startswith("pkg:pypi/causal-conv1d@1.7.0?")
    assert upstream["hashes"] == [{"alg": "SHA-256", "content": source.sha256}]  # type: ignore[union-attr]


def test_the_same_build_writes_the_same_bytes(tmp_path: Path) -> None:
    a = _with_sbom(tmp_path / "a", "mamba-ssm", "1.0")
    b = _with_sbom(tmp_path / "b", "mamba-ssm", "1.0")
    assert a.read_bytes() == b.read_bytes()
    (tmp_path / "again").mkdir()
    again = add_sbom(shutil.copy(a, tmp_path / "again" / a.name), name="mamba-ssm",
                     version="1.0",
                     recipe=BOOK.load("mamba-ssm"), archs=("12.0",), build_key=KEY,
                     toolchain=TOOLS, epoch=EPOCH)  # added twice: replaced, not doubled
    assert again.read_bytes() == a.read_bytes()


def test_add_files_keeps_the_members_and_appends_before_record(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, {"demo/__init__.py": "X = 1\n", "demo/b.py": "Y = 2\n"})
    before = [(zi.filename, zi.date_time) for zi in zipfile.ZipFile(wheel).infolist()][:-1]
    add_files(wheel, {"sboms/x.json": b"{}"}, epoch=EPOCH)
    infos = zipfile.ZipFile(wheel).infolist()
    assert [(zi.filename, zi.date_time) for zi in infos[:-2]] == before
    assert [zi.filename for zi in infos[-2:]] == ["demo-1.0.dist-info/sboms/x.json",
                                                   "demo-1.0.dist-info/RECORD"]
    assert infos[-2].date_time == (2026, 1, 1, 0, 0, 0)
    assert record_problems(wheel) == []
    with pytest.raises(Exception, match="cannot add"):
        add_files(wheel, {"../evil": b""}, epoch=EPOCH)


def test_relabel_with_files_writes_the_bytes_of_relabel_then_add_files(
        tmp_path: Path) -> None:
    """The pipeline relabels and adds the SBOM in one pass (every member deflated once,
    not twice: seconds for a large extension); the wheel is byte for byte the one the
    two passes wrote."""
    raw = make_wheel(tmp_path, {"demo/__init__.py": "X = 1\n", "demo/big.bin": "z" * 100000})
    files = {"sboms/x.json": b'{"a": 1}\n', "extra/y.txt": b"y"}
    kw = dict(local="cu130torch2.14sm120", torch_pin="==2.14.*", build_tag="1",
              pins={"other": "1.0+x"}, platform="manylinux_2_34_x86_64")
    two = add_files(relabel(raw, tmp_path / "two", **kw), files, epoch=EPOCH)  # type: ignore[arg-type]
    one = relabel(raw, tmp_path / "one", files=files, epoch=EPOCH, **kw)  # type: ignore[arg-type]
    assert one.name == two.name
    assert one.read_bytes() == two.read_bytes()
    assert record_problems(one) == []
    with pytest.raises(Exception, match="cannot add"):
        relabel(raw, tmp_path / "evil", local="x", torch_pin=None, files={"../e": b""})


def test_inspect_summarises_the_sbom(tmp_path: Path) -> None:
    wheel = _with_sbom(tmp_path, "mamba-ssm", "1.0")
    res = CliRunner().invoke(cli, ["inspect", str(wheel)])
    assert res.exit_code == 0, res.output
    assert f"sbom:      .dist-info/{SBOM_PATH} (CycloneDX 1.6)" in res.output
    assert "  source:    pkg:github/state-spaces/mamba@e9594ce1c732d97440f0332fdc43170a2294dbfa" \
        in res.output
    assert f"  patches:   {len(BOOK.load('mamba-ssm').patches)}" in res.output
    assert "  toolchain: c++ g++ (Debian 12.2.0-14) 12.2.0; nvcc 13.0; python 3.11.9; " \
        "torch 2.14.1+cu130" in res.output
    assert f"  build key: {KEY}" in res.output
    plain = make_wheel(tmp_path / "plain", {"demo/__init__.py": ""})
    res = CliRunner().invoke(cli, ["inspect", str(plain)])
    assert res.exit_code == 0 and "sbom:      none" in res.output
    json.dumps(read_sbom(wheel))


def test_the_platform_analysis_is_recorded_and_shown(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "mamba-ssm", "1.0")
    plat = PlatformTag("manylinux_2_34_x86_64", "manylinux_2_34_x86_64",
                       ("CXXABI_1.3.9", "GCC_3.0", "GLIBC_2.32", "GLIBCXX_3.4.21"))
    add_sbom(wheel, name="mamba-ssm", version="1.0", recipe=BOOK.load("mamba-ssm"),
             archs=("12.0",), build_key=KEY, toolchain=TOOLS, epoch=EPOCH, platform=plat)
    res = CliRunner().invoke(cli, ["inspect", str(wheel)])
    assert res.exit_code == 0, res.output
    assert "  platform:  manylinux_2_34_x86_64 (policy manylinux_2_34_x86_64; highest symbol " \
        "versions CXXABI_1.3.9 GCC_3.0 GLIBC_2.32 GLIBCXX_3.4.21)" in res.output
