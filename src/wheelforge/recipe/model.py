"""What a recipe is: frozen dataclasses, read by every part that builds, publishes or
tests (:mod:`.format` reads recipes/NAME.yaml into them and says what is wrong with one).

Pure data: no parsing, no I/O.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from packaging.utils import NormalizedName
from packaging.version import Version

FORMAT_VERSION = 1

BuildKind = Literal["extension", "pure"]
BUILD_KINDS: tuple[str, ...] = get_args(BuildKind)

#: Placeholders a local-version template may use; see docs/recipe-format.md.
LOCAL_VERSION_FIELDS = ("cuda", "cuda_major", "torch", "sm")
DEFAULT_LOCAL_VERSION = {"extension": "cu{cuda}torch{torch}{sm}", "pure": "wf"}


@dataclass(frozen=True, kw_only=True)
class SdistSource:
    """A source archive pinned by file name and sha256; ``url`` is where to fetch it."""

    filename: str
    sha256: str
    url: str | None = None

    @property
    def identity(self) -> str:
        return f"sdist:{self.filename}@sha256:{self.sha256}"


@dataclass(frozen=True, kw_only=True)
class GitSource:
    """A git repository pinned by a full commit; ``tag``, if given, must name it.

    A commit that is not a release names instead the release it descends from:
    ``release-tag`` must point at ``release-commit``, an ancestor of ``commit``.
    """

    url: str
    commit: str
    tag: str | None = None
    release_tag: str | None = None
    release_commit: str | None = None

    @property
    def identity(self) -> str:
        return f"git:{self.url}@{self.commit}"


Source = SdistSource | GitSource


@dataclass(frozen=True, kw_only=True)
class ExtractLimits:
    """Bounds on extracting a source archive (``extract:`` of a recipe); the defaults fit
    flash-attn's sdist with CUTLASS (~100 MB, ~10k files unpacked) with a wide margin."""

    max_bytes: int = 2 << 30  # bytes written in all
    max_members: int = 100_000  # files, directories and links
    max_member_bytes: int = 512 << 20  # bytes of any one file


@dataclass(frozen=True, kw_only=True)
class BuildSpec:
    kind: BuildKind
    requires: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    local_version: str = ""
    pin_torch: bool = False
    drop_requires: tuple[str, ...] = ()
    #: the known peak memory (GiB) of one compile job, measured: sizes the jobs of a build
    #: before one was recorded on this machine (builder/config.jobs_for)
    job_memory_gib: float | None = None
    #: the wheel uses torch's stable ABI only (docs/stable-abi.md): verify audits its
    #: shared objects, and it is published to the CUDA major's stable channel
    stable_abi: bool = False

    @property
    def cell_kind(self) -> str:
        """How the nightly plans this recipe's cells (recipe/matrix.py ``cells``):
        "stable" for a stable-ABI extension (one cell per CUDA major and arch set), else
        ``kind``."""
        return "stable" if self.stable_abi else self.kind

    @property
    def needs_torch(self) -> bool:
        """Whether the wheel depends on the build environment's torch: an extension, a
        pinned torch, or a local version that names torch or its CUDA."""
        named = {f for _, f, _, _ in string.Formatter().parse(self.local_version) if f}
        return self.kind == "extension" or self.pin_torch or bool(named & {"cuda", "torch"})


@dataclass(frozen=True, kw_only=True)
class VerifySpec:
    imports: tuple[str, ...] = ()  # imported by the build's check, in the build environment
    requires: tuple[str, ...] = ()
    #: imported only by the stack check, with the whole channel installed (modules that need
    #: another recipe's wheel, e.g. fla.layers of flash-linear-attention needs fla-core)
    stack_imports: tuple[str, ...] = ()
    #: the wheel's top-level modules and packages, all of them: any other (a foreign
    #: package such as flash-attn's `hopper`) fails verification; empty: not checked
    top_level: tuple[str, ...] = ()
    #: paths the wheel must not hold (a file, or a directory and all below it)
    excluded: tuple[str, ...] = ()
    #: what may run without being imported, by name: a top-level ``NAME.pth``, the
    #: ``sitecustomize`` / ``usercustomize`` module, a command (console or gui script, a
    #: file of ``.data/scripts``); every other one fails verification, for every recipe
    allow: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TestSpec:
    """The GPU test of a recipe, run by ``wheelforge test`` against the installed wheel."""

    source_files: tuple[str, ...] = ()  # test files from the pinned source tree
    files: tuple[Path, ...] = ()  # test files shipped beside the recipe (gputests/NAME/)
    requires: tuple[str, ...] = ()  # must be importable in the test environment

    @property
    def empty(self) -> bool:
        return not (self.source_files or self.files)


@dataclass(frozen=True, kw_only=True)
class SubsetDimension:
    """One dimension of a recipe's kernel subsets (``subsets:``): the values a build may
    hold, the project's environment variable that selects them, and the label fragment of
    each value, which goes into the wheel's local version when the build leaves values out."""

    name: str
    env: str
    values: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]  # value -> label fragment
    multiple: bool = True  # several values at once (head dims), else exactly one (backward)
    help: str = ""

    @property
    def default(self) -> tuple[str, ...]:
        """The full build: every value, or the first one of a one-value dimension."""
        return self.values if self.multiple else self.values[:1]

    def label(self, chosen: tuple[str, ...]) -> str:
        if chosen == self.default:
            return ""
        return "".join(dict(self.labels).get(v, v) for v in chosen)


#: A kernel subset chosen for one build: (dimension, chosen values) for each dimension, in
#: the recipe's order.  Empty: the full build.
Subset = tuple[tuple[str, tuple[str, ...]], ...]

#: A kernel subset as asked for (``--subset`` or ``matrix.subsets``): (dimension, values)
#: for the dimensions named, the same shape as a :data:`Subset`; () is the full build.
#: ``recipe.subsets.select_subset`` turns it into the recipe's Subset.
Choice = Subset


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: NormalizedName
    version: Version
    summary: str
    sources: tuple[Source, ...]
    patches: tuple[Path, ...]
    build: BuildSpec
    verify: VerifySpec
    test: TestSpec = field(default_factory=TestSpec)
    extract: ExtractLimits = field(default_factory=ExtractLimits)
    path: Path = field(compare=False)
    homepage: str | None = None
    #: recipes built for the same Python, torch and archs, pinned exactly at runtime
    companions: tuple[NormalizedName, ...] = ()
    #: the kernel subsets a build may ask for (``--subset``); empty: none
    subsets: tuple[SubsetDimension, ...] = ()
    #: the wheel's project name, when this recipe is a variant of another project's
    #: (causal-conv1d-stable builds causal-conv1d); empty: the recipe's name
    project: NormalizedName | None = None

    @property
    def project_name(self) -> NormalizedName:
        """The project name the wheel carries."""
        return self.project or self.name

    @property
    def untagged_commit(self) -> str | None:
        """The pinned commit when the source is a commit after a release, not the release."""
        for src in self.sources:
            if isinstance(src, GitSource) and src.release_tag:
                return src.commit
        return None
