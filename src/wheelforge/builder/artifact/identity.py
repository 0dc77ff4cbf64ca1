"""A build's identity, computed before anything is built: its build key (a content hash
of everything that changes the binary), the keys of its companions, the toolchain that
goes into it, its local version label and build number, and the lock a build of a key
holds.  ``wheelforge build``, the nightly and its fan-out parts all plan with these."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ... import __version__, index
from ...arch import label as arch_label
from ...errors import RecipeError
from ...recipe.format import RecipeBook
from ...recipe.model import Recipe, Subset
from ...recipe.subsets import select_subset, subset_label
from ..compiling import jobserver, toolchain
from ..config import BuildConfig
from ..env import buildenv
from ..env.buildenv import BuildEnv
from . import reproducible


def build_key(recipe: Recipe, config: BuildConfig, toolchain_identity: dict[str, str],
              companion_keys: dict[str, str] | None = None) -> str:
    """A content hash of everything that changes the binary.

    How the build is made reproducible (``reproducible.SCHEME``), the recipe file (hence
    its pinned sources), every patch's bytes, the toolchain
    (Python tag, the torch requirement or installed version, nvcc), the arch list, the
    recipe's build environment, the wheelforge version and the build keys of the recipe's
    companions.  Computable before any environment exists, so an up-to-date build is
    skipped at no cost.
    """
    h = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("wheelforge", __version__.encode())
    add("reproducible", reproducible.SCHEME.encode())  # fixed paths, the source's date
    add("recipe", recipe.path.read_bytes())
    for p in recipe.patches:
        add(f"patch:{p.name}", p.read_bytes())
    add("toolchain", json.dumps(toolchain_identity, sort_keys=True).encode())
    add("env", json.dumps(sorted(recipe.build.env)).encode())
    if recipe.build.kind == "extension":
        add("archs", config.arch_list.encode())
    else:  # pure wheels gained the default label "wf": a build of the old, unlabelled
        add("local-version", recipe.build.local_version.encode())  # one is not skipped
    if companion_keys:  # the companions' own build keys for the same configuration
        add("companions", json.dumps(sorted(companion_keys.items())).encode())
    subset = recipe_subset(recipe, config)
    if subset:  # a full build's key is what it was before subsets existed
        add("subset", json.dumps(subset).encode())
    return h.hexdigest()


def tree_id(recipe: Recipe) -> str:
    """What the compiled source tree is made of (a hash): the recipe's version, its
    pinned sources and every patch's name and bytes.  A unit-cost record of another
    tree names files that may no longer exist, or cost otherwise (``unitcosts``)."""
    h = hashlib.sha256()
    for part in (str(recipe.version), *(s.identity for s in recipe.sources)):
        h.update(part.encode() + b"\0")
    for p in recipe.patches:
        h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def recipe_subset(recipe: Recipe, config: BuildConfig) -> Subset:
    """The kernel subset ``config`` asks of ``recipe`` (() for the full build, and for a
    recipe that declares no subsets)."""
    return select_subset(recipe, config.subset) if recipe.subsets and config.subset else ()


def without_subset(config: BuildConfig) -> BuildConfig:
    """``config`` for a companion: ``--subset`` is for the recipes named, companions are
    built whole."""
    return dataclasses.replace(config, subset=()) if config.subset else config


def planned_key(recipe: Recipe, config: BuildConfig, book: RecipeBook,
                cuda: toolchain.Cuda | None) -> str:
    """The build key :func:`scheduler.build_with_companions` gives ``recipe`` for ``config``, its
    companions' keys included, computed without building or creating anything."""
    companion_keys: dict[str, str] = {}
    for cname in recipe.companions:
        companion = book.load(cname)
        companion_keys[cname] = planned_key(
            companion, without_subset(config), book,
            cuda if companion.build.kind == "extension" else None)
    return build_key(recipe, config, toolchain_identity(recipe, config, cuda), companion_keys)


def companion_depth(recipe: Recipe, book: RecipeBook, _chain: tuple[str, ...] = ()) -> int:
    """0 for a recipe without companions, else one more than its deepest companion: cells
    built in this order find their companions published."""
    if recipe.name in _chain:
        raise RecipeError(f"companions of {recipe.name} form a cycle",
                          why=" -> ".join([*_chain, recipe.name]),
                          fix="a companion cannot (indirectly) name the recipe itself")
    return max((1 + companion_depth(book.load(c), book, (*_chain, recipe.name))
                for c in recipe.companions), default=0)


def toolchain_identity(recipe: Recipe, config: BuildConfig,
                       cuda: toolchain.Cuda | None,
                       inspect: buildenv.Inspect = buildenv.inspect_env) -> dict[str, str]:
    """What of the toolchain goes into the build key, found without creating anything."""
    if config.python is not None:
        env = inspect(config.python, with_torch=recipe.build.kind == "extension")
        torch = f"{env.torch_version} (cuda {env.torch_cuda})" if env.torch_version else ""
        tag = env.python_tag
    else:
        tag = buildenv.python_tag(config.base_python)
        torch = " ".join([config.torch, *config.torch_pip_args])
    if recipe.build.kind == "pure":
        return {"python": "py3"}
    # the host compiler decides the glibc/libstdc++ symbol versions, hence the manylinux tag;
    # the pool's lending puts ptxas's options into each cubin (builder/compiling/jobserver.py)
    lent = jobserver.lent_flags(cuda.nvcc, config.compile_cache.backend) if cuda else ()
    found = {"python": tag, "torch": torch, "nvcc": str(cuda.version) if cuda else "",
             "cxx": toolchain.host_compiler(), "nvcc-options": " ".join(lent)}
    if cuda is not None and cuda.toolkit:  # a managed toolkit: its exact wheels (a system
        found["cuda-toolkit"] = cuda.describe_toolkit()  # one's keys stay as they were)
    return found


def published_with_key(index_dir: Path, key: str) -> index.WheelRecord | None:
    for rec in index.load_records(index_dir):
        if rec.build_key == key and (index_dir / "files" / rec.filename).is_file():
            return rec
    return None


def local_label(recipe: Recipe, env: BuildEnv, config: BuildConfig) -> str:
    """The local version label; a build of a commit after a release starts with
    ``g`` + the commit's first 12 hex digits, so it never shares a version with a build
    of the release itself."""
    commit = recipe.untagged_commit
    parts = [f"g{commit[:12]}"] if commit else []
    if recipe.build.local_version:
        cuda = (env.torch_cuda or "").replace(".", "")
        parts.append(recipe.build.local_version.format(
            cuda=cuda, cuda_major=(env.torch_cuda or "").split(".")[0],
            torch=env.torch_major_minor or "", sm=arch_label(config.archs)))
    # a kernel subset is named right after the template's label (cu130torch2.14sm120hd128),
    # added by wheelforge so that no recipe can publish a subset under a full build's version
    fragment = subset_label(recipe, recipe_subset(recipe, config))
    if fragment:
        if parts:
            parts[-1] += fragment
        else:
            parts.append(fragment)
    return ".".join(parts)


def next_build_tag(index_dir: Path, wheel_name: str) -> str | None:
    """None when no wheel with this name, version and tags is published, else the next
    build number (PEP 427 build tag): a rebuild with another build key (a patch changed)
    must not reuse a published file name, and installers prefer the highest build."""
    name, version, _build, tags = parse_wheel_filename(wheel_name)
    taken = []
    for path in (index_dir / "files").glob("*.whl"):
        try:
            other = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if (other[0], other[1], other[3]) == (name, version, tags):
            taken.append(other[2][0] if other[2] else 0)
    return str(max(taken) + 1) if taken else None


def key_lock_path(cache_dir: Path, key: str) -> Path:
    """The lock a build of ``key`` holds from before the fetch to the end of its publish
    (`wheelforge build` and `wheelforge nightly` alike)."""
    return cache_dir / "locks" / f"{key}.lock"


@dataclass(frozen=True)
class Identity:
    """Who a build is, computed once before anything is fetched: its build key, the lock a
    build of the key holds (:func:`key_lock_path`), the key's label in messages (its first
    16 hex digits) and the index it is looked up in (:meth:`published`)."""

    key: str
    lock: Path
    label: str
    index_dir: Path

    def published(self) -> index.WheelRecord | None:
        """The wheel published with this build key, or None (asked under the lock)."""
        return published_with_key(self.index_dir, self.key)


def identify(recipe: Recipe, config: BuildConfig, cuda: toolchain.Cuda | None,
             companion_keys: dict[str, str],
             inspect: buildenv.Inspect = buildenv.inspect_env) -> Identity:
    """The identity of the build of ``recipe`` for ``config`` with the toolchain ``cuda``
    (None for a pure wheel) and its companions' build keys."""
    key = build_key(recipe, config, toolchain_identity(recipe, config, cuda, inspect),
                    companion_keys)
    return Identity(key=key, lock=key_lock_path(config.cache_dir, key), label=key[:16],
                    index_dir=config.index_dir)
