"""The software bill of materials each wheel carries (PEP 770): CycloneDX 1.6 JSON at
``.dist-info/sboms/wheelforge.cdx.json``, made with cyclonedx-python-lib.

What it says: the package (``pkg:pypi/NAME@VERSION``); its pedigree: the upstream source
it was built from (a git commit as ``pkg:github/OWNER/REPO@COMMIT``, else
``pkg:generic/...@COMMIT?vcs_url=...``; an sdist as ``pkg:pypi/NAME@VERSION`` with its
sha256) and each patch of the recipe, with its diff, as an ``unofficial`` patch; the
toolchain that built it (nvcc, the host C++ compiler, Python, torch and its CUDA) as
tools; the archs, the build key and the recipe as properties.  The timestamp is
the source's SOURCE_DATE_EPOCH (builder/artifact/reproducible.py) and the serial number a uuid5 of
the build key: the same build writes the same bytes.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cyclonedx.model import (
    AttachedText,
    Encoding,
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import (
    Component,
    ComponentType,
    Diff,
    Patch,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from ... import __version__
from ...recipe.model import GitSource, Recipe, Source
from ...wheel import add_files, read_dist_info_file
from .platform import PlatformTag

__all__ = ["SBOM_PATH", "Toolchain", "add_sbom", "make_sbom", "read_sbom", "summary_lines"]

#: Inside the .dist-info directory (PEP 770).
SBOM_PATH = "sboms/wheelforge.cdx.json"
_NS = uuid.UUID("6f1d7c1e-4b7a-5c55-9f0e-77686565c666")  # wheelforge's uuid5 namespace
_GITHUB = re.compile(r"^(?:https://|git@)github\.com[/:](?P<owner>[^/]+)/(?P<repo>[^/]+?)"
                     r"(?:\.git)?/?$")


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """What built the wheel, as found during the build."""

    python: str  # "3.11.9"
    nvcc: str | None = None  # "13.0.48"
    cxx: str | None = None  # first line of `g++ --version`
    torch: str | None = None  # "2.14.1+cu130"
    torch_cuda: str | None = None  # "13.0"
    #: a managed CUDA toolkit's exact wheels from PyPI (name, version); () for a system one
    cuda_toolkit: tuple[tuple[str, str], ...] = ()


def source_purl(recipe: Recipe, source: Source) -> PackageURL:
    """The upstream source as a package URL."""
    if isinstance(source, GitSource):
        m = _GITHUB.match(source.url)
        if m:
            return PackageURL("github", m["owner"].lower(), m["repo"].lower(), source.commit)
        name = source.url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or recipe.name
        return PackageURL("generic", None, name, source.commit,
                          {"vcs_url": f"git+{source.url}@{source.commit}"})
    qualifiers = {"file_name": source.filename}
    if source.url:
        qualifiers["download_url"] = source.url
    return PackageURL("pypi", None, str(recipe.name), str(recipe.version), qualifiers)


def _ancestor(recipe: Recipe, source: Source) -> Component:
    purl = source_purl(recipe, source)
    refs = []
    hashes = []
    if isinstance(source, GitSource):
        refs.append(ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(source.url),
                                      comment=f"commit {source.commit}"
                                      + (f", tag {source.tag}" if source.tag else "")))
    else:
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=source.sha256))
        if source.url:
            refs.append(ExternalReference(type=ExternalReferenceType.DISTRIBUTION,
                                          url=XsUri(source.url)))
    return Component(name=str(recipe.name), version=str(recipe.version), purl=purl,
                     bom_ref=str(purl), hashes=hashes, external_references=refs,
                     type=ComponentType.LIBRARY, description="the upstream source")


def _patch(path: Path) -> Patch:
    data = path.read_bytes()
    try:
        text = AttachedText(content=data.decode("utf-8"), content_type="text/x-diff")
    except UnicodeDecodeError:
        text = AttachedText(content=base64.b64encode(data).decode(), content_type="text/x-diff",
                            encoding=Encoding.BASE_64)
    return Patch(type=PatchClassification.UNOFFICIAL, diff=Diff(text=text))


def _tool(name: str, version: str | None, purl: PackageURL,
          properties: Mapping[str, str] | None = None) -> Component:
    return Component(name=name, version=version, purl=purl, bom_ref=f"tool:{name}",
                     type=ComponentType.APPLICATION,
                     properties=[Property(name=k, value=v) for k, v in (properties or {}).items()])


def make_sbom(*, name: str, version: str, recipe: Recipe, archs: tuple[str, ...],
              build_key: str, toolchain: Toolchain, epoch: int,
              platform: PlatformTag | None = None) -> bytes:
    """The CycloneDX 1.6 JSON document of one built wheel."""
    purl = PackageURL("pypi", None, name, version)
    pedigree = Pedigree(ancestors=[_ancestor(recipe, s) for s in recipe.sources],
                        patches=[_patch(p) for p in recipe.patches],
                        notes=f"built by wheelforge {__version__} from recipe "
                              f"{recipe.path.name}")
    props = {"wheelforge:build-key": build_key, "wheelforge:recipe": recipe.path.name,
             "wheelforge:archs": " ".join(archs) or "none (pure)",
             "wheelforge:python": toolchain.python}
    for key, value in (("nvcc", toolchain.nvcc), ("cxx", toolchain.cxx),
                       ("torch", toolchain.torch), ("torch-cuda", toolchain.torch_cuda)):
        if value:
            props[f"wheelforge:{key}"] = value
    if toolchain.cuda_toolkit:
        props["wheelforge:cuda-toolkit"] = "managed " + ", ".join(
            f"{n} {v}" for n, v in toolchain.cuda_toolkit)
    if platform is not None:
        props["wheelforge:platform-tag"] = platform.tag
        props["wheelforge:platform-policy"] = platform.policy
        props["wheelforge:symbol-versions"] = " ".join(platform.symbols) or "none"
        if platform.note:
            props["wheelforge:platform-note"] = platform.note
    package = Component(name=name, version=version, purl=purl, bom_ref=str(purl),
                        type=ComponentType.LIBRARY, pedigree=pedigree,
                        description=recipe.summary or None,
                        properties=[Property(name=k, value=v) for k, v in props.items()])
    tools = [_tool("wheelforge", __version__, PackageURL("pypi", None, "wheelforge",
                                                          __version__)),
             _tool("python", toolchain.python, PackageURL("generic", None, "cpython",
                                                         toolchain.python))]
    if toolchain.nvcc:
        tools.append(_tool("nvcc", toolchain.nvcc, PackageURL("generic", "nvidia", "nvcc",
                                                             toolchain.nvcc)))
    tools.extend(_tool(n, v, PackageURL("pypi", None, n, v))
                 for n, v in toolchain.cuda_toolkit)
    if toolchain.cxx:
        tools.append(_tool("c++", toolchain.cxx, PackageURL("generic", None, "cxx")))
    if toolchain.torch:
        tools.append(_tool("torch", toolchain.torch,
                           PackageURL("pypi", None, "torch", toolchain.torch),
                           {"cuda": toolchain.torch_cuda or "none"}))
    bom = Bom(serial_number=uuid.uuid5(_NS, f"build-key:{build_key}"),
              metadata=BomMetaData(component=package,
                                   timestamp=datetime.fromtimestamp(epoch, timezone.utc),
                                   tools=ToolRepository(components=tools)))
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    # canonical bytes: the library's key order is stable, but sets of properties
    # are serialised as they sort; re-dump with sorted keys so equal inputs give equal bytes
    return (json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n").encode("utf-8")


def add_sbom(wheel: Path, *, name: str, version: str, recipe: Recipe,
             archs: tuple[str, ...], build_key: str, toolchain: Toolchain,
             epoch: int, platform: PlatformTag | None = None) -> Path:
    """Write the SBOM into ``wheel`` (in place; RECORD gets its line)."""
    data = make_sbom(name=name, version=version, recipe=recipe, archs=archs,
                     build_key=build_key, toolchain=toolchain, epoch=epoch,
                     platform=platform)
    return add_files(wheel, {SBOM_PATH: data}, epoch=epoch)


def read_sbom(wheel: Path) -> dict[str, Any] | None:
    """The wheel's wheelforge SBOM as JSON, or None when it has none."""
    data = read_dist_info_file(wheel, SBOM_PATH)
    if data is None:
        return None
    try:
        loaded = json.loads(data)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def summary_lines(sbom: Mapping[str, Any] | None) -> list[str]:
    """What `wheelforge inspect` shows of a wheel's SBOM: its sources, patch count,
    toolchain and build key (tolerant of a malformed document)."""
    if sbom is None:
        return [f"sbom:      none (no .dist-info/{SBOM_PATH})"]
    meta = sbom.get("metadata") or {}
    component = meta.get("component") or {}
    pedigree = component.get("pedigree") or {}
    tools = (meta.get("tools") or {}).get("components") or []
    props = {str(p.get("name")): str(p.get("value"))
             for p in component.get("properties") or [] if isinstance(p, dict)}
    sources = [str(a.get("purl", "?")) for a in pedigree.get("ancestors") or []
               if isinstance(a, dict)]
    made_by = [f"{t.get('name', '?')} {t.get('version', '')}".strip() for t in tools
               if isinstance(t, dict) and t.get("name") != "wheelforge"]
    return [f"sbom:      .dist-info/{SBOM_PATH} (CycloneDX {sbom.get('specVersion', '?')})",
            f"  source:    {', '.join(sources) or 'unknown'}",
            f"  patches:   {len(pedigree.get('patches') or [])}",
            f"  toolchain: {'; '.join(made_by) or 'unknown'}",
            f"  archs:     {props.get('wheelforge:archs', 'unknown')}",
            *([f"  platform:  {props['wheelforge:platform-tag']} (policy "
               f"{props.get('wheelforge:platform-policy', '?')}; highest symbol versions "
               f"{props.get('wheelforge:symbol-versions', '?')})"
               + (f": {props['wheelforge:platform-note']}"
                  if "wheelforge:platform-note" in props else "")]
              if "wheelforge:platform-tag" in props else []),
            f"  build key: {props.get('wheelforge:build-key', 'unknown')}"]
