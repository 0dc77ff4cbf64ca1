"""The build matrix of the nightly job: the ``matrix:`` section of wheelforge.yaml.

Pure data, validated like recipes: every problem is reported at once with the file
and the key path, and unknown keys get a did-you-mean.  :func:`cells` expands the
matrix into the builds it stands for::

    matrix:
      recipes: [causal-conv1d, fla-core, flash-linear-attention]
      python: [python3.11]            # interpreters managed build envs are made from
      torch:
        - {spec: "torch==2.14.1", cuda: "13.0"}
        - {spec: "torch==2.10.0", cuda: "12.8",   # no CUDA 12 nvcc on PyPI: a system one,
           toolkit: {cuda-home: /usr/local/cuda-12.8}}  # its cells only on builders with it
      archs: ["12.0", "10.0;12.0"]    # TORCH_CUDA_ARCH_LIST values
      retention: {keep: 5}            # newest builds kept per project and channel
      subsets:                        # kernel subsets built instead of the full build
        flash-attn:
          - {hdim: "128", dtype: bf16}
          - full                      # the full build too ({} says the same)
      canary: {recipes: [causal-conv1d]}  # opt-in: also try the newest upstream release

An extension recipe gives one cell per (python, torch, arch set).  A pure recipe
builds one ``py3-none-any`` wheel whatever the interpreter, torch or arch list (its
build key holds none of them), so it gives a single cell, built in the first python
and torch environment.  A recipe listed under ``subsets:`` gives one cell per entry
(per python, torch and arch set) instead of one: the full build is a cell only when
``full`` (or ``{}``) is an entry.  The entries are checked against the recipe's own
``subsets:`` (:mod:`.subsets`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .._yaml import read_yaml
from ..arch import parse_arch_list, torch_arch_list
from ..errors import ConfigError, WheelforgeError
from .fields import Problems, join
from .model import Choice, Recipe
from .subsets import choice_text, select_subset, subset_choice, subset_problems

__all__ = ["DEFAULT_KEEP", "FULL", "Canary", "Cell", "Matrix", "TorchPin", "cells",
           "load_matrix", "parse_matrix", "retention_keep"]

#: Builds kept per project and channel when the matrix names no retention.
DEFAULT_KEEP = 5

#: the top-level keys of wheelforge.yaml
PROJECT_KEYS = ("defaults", "matrix", "compile-cache")


def not_a_project_file(path: Path | str, data: object, fix: str) -> ConfigError:
    """The error for a project file whose top level is not a mapping of sections."""
    return ConfigError(f"{path} is not a project file",
                       why=("it is empty" if data is None else
                            f"its top level is a {type(data).__name__}") + ", not a mapping "
                           "of sections (defaults:, matrix:, ...)",
                       fix=fix)
_MATRIX_KEYS = ("recipes", "python", "torch", "archs", "retention", "subsets", "canary")
_CANARY_KEYS = ("recipes", "index-url", "timeout")
#: the longest deadline of a request to the canary's index (and outdated --timeout)
MAX_CANARY_TIMEOUT = 3600.0
#: where a canary looks for the newest release (``wheelforge outdated --index-url``)
DEFAULT_CANARY_INDEX = "https://pypi.org"
DEFAULT_CANARY_TIMEOUT = 30.0
_TORCH_KEYS = ("spec", "cuda", "pip-args", "toolkit")
_TOOLKIT_KEYS = ("cuda-home", "label", "image")
#: a builder's label (a Ray resource, a GitHub Actions runner label)
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_RETENTION_KEYS = ("keep",)
_CUDA = re.compile(r"^\d+\.\d+$")
#: the entry of ``matrix.subsets`` that asks for the full build ({} says the same)
FULL = "full"


@dataclass(frozen=True, kw_only=True)
class TorchPin:
    """A torch requirement for managed build environments, and its CUDA flavour."""

    spec: str
    cuda: str
    pip_args: tuple[str, ...] = ()
    #: ``toolkit: {cuda-home: PATH, label: NAME, image: IMAGE}``: the system toolkit its
    #: cells compile with, present only on the builders that declare ``label`` (default
    #: ``cuda-toolkit-<cuda>``: a Ray resource, a GitHub Actions runner label), or that
    #: run in ``image`` (an Actions job's container)
    cuda_home: str | None = None
    label: str | None = None
    image: str | None = None

    def __str__(self) -> str:
        extra = f" {' '.join(self.pip_args)}" if self.pip_args else ""
        home = f" toolkit at {self.cuda_home} [{self.label}]" if self.cuda_home else ""
        return f"{self.spec} (CUDA {self.cuda}){extra}{home}"


@dataclass(frozen=True, kw_only=True)
class Canary:
    """The opt-in ``canary:`` of the matrix: recipes whose newest upstream release the
    nightly also tries (patched, built and verified in scratch, never published)."""

    recipes: tuple[str, ...]
    index_url: str = DEFAULT_CANARY_INDEX  # a PyPI JSON API (as `wheelforge outdated`)
    timeout: float = DEFAULT_CANARY_TIMEOUT  # seconds per request to it


@dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path
    recipes: tuple[str, ...]
    pythons: tuple[str, ...]  # empty: the interpreter wheelforge runs on
    torches: tuple[TorchPin, ...]
    arch_sets: tuple[str, ...]  # canonical TORCH_CUDA_ARCH_LIST spellings
    keep: int = DEFAULT_KEEP
    #: recipe -> the kernel subsets built of it (() the full build); a recipe not named
    #: here gets its full build only
    subsets: tuple[tuple[str, tuple[Choice, ...]], ...] = ()
    canary: Canary | None = None  # None: no canary section (the default)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One build of the matrix.  ``archs`` is None for a pure recipe."""

    recipe: str
    python: str | None  # None: the interpreter wheelforge runs on
    torch: TorchPin
    archs: str | None
    subset: Choice = ()  # the kernel subset asked of the recipe; () the full build

    @property
    def subset_text(self) -> str:
        """``hdim=128 dtype=bf16``; '' for the full build."""
        return choice_text(self.subset)

    @property
    def label(self) -> str:
        parts = [self.recipe]
        if self.archs is not None:
            parts += [self.python or "python", self.torch.spec, f"cu{self.torch.cuda}"]
            if self.torch.pip_args:
                parts.append(" ".join(self.torch.pip_args))
            parts.append(f"arch {self.archs}")
        return " | ".join(parts) + (f" [{self.subset_text}]" if self.subset else "")


def _strings(p: Problems, data: Mapping[str, Any], key: str, where: str, *,
             required: bool) -> list[tuple[int, str]]:
    """A list of non-empty strings (a lone string is a list of one)."""
    value = data.get(key)
    at = join(where, key)
    if value is None:
        if required:
            p.add(at, "is required: a list")
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        p.add(at, f"must be a list of strings, got {type(value).__name__}")
        return []
    if not value and required:
        p.add(at, "must not be empty")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            p.add(join(at, i), f"must be a non-empty string, got {item!r} (quote numbers in "
                                "YAML: \"12.0\")")
        else:
            out.append((i, item.strip()))
    return out


def _torch(p: Problems, entry: Any, where: str) -> TorchPin | None:
    if isinstance(entry, str):
        p.add(where, f"must be a mapping such as {{spec: {entry!r}, cuda: \"13.0\"}}: the CUDA "
                     "flavour is part of the pin")
        return None
    if not isinstance(entry, dict):
        p.add(where, f"must be a mapping with spec and cuda, got {type(entry).__name__}")
        return None
    p.unknown_keys(where, entry, _TORCH_KEYS)
    ok = True
    spec = entry.get("spec")
    if not isinstance(spec, str) or not spec.strip():
        p.add(join(where, "spec"), "is required: a torch requirement, e.g. \"torch==2.14.1\"")
        ok = False
    else:
        try:
            if Requirement(spec).name != "torch":
                p.add(join(where, "spec"), f"{spec!r} is not a requirement on torch")
                ok = False
        except InvalidRequirement as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            p.add(join(where, "spec"), f"{spec!r} is not a valid requirement: {first}")
            ok = False
    cuda = entry.get("cuda")
    if isinstance(cuda, float):
        p.add(join(where, "cuda"), f"must be a string (quote it in YAML: \"{cuda}\")")
        ok = False
    elif not isinstance(cuda, str) or not _CUDA.match(cuda):
        p.add(join(where, "cuda"), f"is required: the CUDA version of that torch build as "
                                    f"MAJOR.MINOR, e.g. \"13.0\"; got {cuda!r}")
        ok = False
    pip_args = _strings(p, entry, "pip-args", where, required=False)
    home, label, image = _toolkit(p, entry.get("toolkit"), join(where, "toolkit"))
    if not ok or (entry.get("toolkit") is not None and home is None):
        return None
    assert isinstance(spec, str) and isinstance(cuda, str)
    return TorchPin(spec=spec.strip(), cuda=cuda, pip_args=tuple(a for _, a in pip_args),
                    cuda_home=home, label=(label or f"cuda-toolkit-{cuda}") if home else None,
                    image=image)


def _toolkit(p: Problems, raw: Any, where: str) -> tuple[str | None, str | None, str | None]:
    """A pin's ``toolkit: {cuda-home: PATH[, label: NAME][, image: IMAGE]}``."""
    if raw is None:
        return None, None, None
    if not isinstance(raw, dict):
        p.add(where, f"must be a mapping such as {{cuda-home: /usr/local/cuda-12.8}}, got "
                     f"{raw!r}")
        return None, None, None
    p.unknown_keys(where, raw, _TOOLKIT_KEYS)
    home, label, image = raw.get("cuda-home"), raw.get("label"), raw.get("image")
    if not isinstance(home, str) or not home.startswith("/") or "\n" in home:
        p.add(join(where, "cuda-home"), f"is required: the absolute path of the CUDA toolkit "
                                        f"on the builders, got {home!r}")
        home = None
    if label is not None and (not isinstance(label, str) or not _LABEL.match(label)):
        p.add(join(where, "label"), f"must be a builder label of letters, digits, '.', '_' and "
                                    f"'-' (e.g. cuda-toolkit-12.8), got {label!r}")
        home = None
    if image is not None and (not isinstance(image, str) or not image.strip()
                              or any(c.isspace() for c in image)):
        p.add(join(where, "image"), f"must be a container image name, got {image!r}")
        home = None
    return home, label, image


def _choice(p: Problems, entry: Any, where: str) -> Choice | None:
    """One entry of ``matrix.subsets.NAME``: ``full``, ``{}``, or {dimension: values}, the
    values a string (``"64,128"`` for several) or a list of strings."""
    if entry == FULL or entry == {}:
        return ()
    if not isinstance(entry, dict):
        p.add(where, f"must be a mapping of subset keys to values, e.g. {{hdim: \"128\", "
                     f"dtype: bf16}}, or {FULL!r} for the full build; got {entry!r}")
        return None
    out: list[tuple[str, tuple[str, ...]]] = []
    ok = True
    for key, raw in entry.items():
        at = join(where, str(key))
        items = raw if isinstance(raw, list) else [raw]
        values: list[str] = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int):
                p.add(at, f"must be a string or a list of strings, got {item!r} (quote "
                          "values in YAML: bwd: \"no\", hdim: \"128\")")
                ok = False
                break
            values += [v.strip() for v in str(item).split(",") if v.strip()]
        else:
            if not values:
                p.add(at, "names no value")
                ok = False
        out.append((str(key), tuple(values)))
    return tuple(out) if ok else None


def _subsets(p: Problems, raw: Any, recipes: Sequence[str],
             load: Callable[[str], Recipe] | None) -> tuple[tuple[str, tuple[Choice, ...]], ...]:
    """``matrix.subsets``: recipe -> entries, each checked against the recipe's declared
    subsets when ``load`` gives the recipe (a recipe that does not load is left to its
    cells, which report why) and stored as the shortest choice that asks for it."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        p.add("matrix.subsets", "must be a mapping of recipe names to lists of subsets, e.g. "
                                "{flash-attn: [{hdim: \"128\", dtype: bf16}]}")
        return ()
    out: list[tuple[str, tuple[Choice, ...]]] = []
    for name, entries in raw.items():
        where = join("matrix.subsets", str(name))
        normal = str(canonicalize_name(str(name)))
        if normal not in recipes:
            hint = difflib.get_close_matches(normal, recipes, n=1)
            p.add(where, f"{name!r} is not in matrix.recipes" + (
                f"; did you mean '{hint[0]}'?" if hint else "; add it there to build subsets "
                                                            "of it"))
            continue
        if not isinstance(entries, list) or not entries:
            p.add(where, "must be a non-empty list of subsets, e.g. [{hdim: \"128\"}, full]")
            continue
        recipe: Recipe | None = None
        if load is not None:
            try:
                recipe = load(normal)
            except WheelforgeError:
                recipe = None  # the recipe's cells report what is wrong with it
            if recipe is not None and not recipe.subsets:
                p.add(where, f"{normal} declares no kernel subsets (no subsets: in its recipe); "
                             "remove it from matrix.subsets")
                continue
        choices: dict[Choice, int] = {}  # -> the entry's index
        for i, entry in enumerate(entries):
            at = join(where, i)
            choice = _choice(p, entry, at)
            if choice is None:
                continue
            if recipe is not None:
                problems = subset_problems(recipe, choice)
                if problems:
                    declared = "; ".join(f"{d.name}={','.join(d.values)}"
                                         for d in recipe.subsets)
                    for problem in problems:
                        p.add(at, f"{problem} ({normal} declares {declared})")
                    continue
                choice = subset_choice(recipe, select_subset(recipe, choice))
            if choice in choices:
                p.add(at, f"is the same build as entry [{choices[choice]}]" + (
                    " (the full build: it asks for what the full build holds)"
                    if not choice and isinstance(entry, dict) and entry else ""))
                continue
            choices[choice] = i
        if normal in dict(out):
            p.add(where, f"{normal!r} is listed twice")
        elif choices:
            out.append((normal, tuple(choices)))
    return tuple(out)


def parse_matrix(data: Any, path: Path, known_recipes: Collection[str] | None = None,
                 recipes: Callable[[str], Recipe] | None = None) -> Matrix:
    """Validate the raw project-file data; raise ConfigError listing every problem.

    ``recipes`` loads a recipe by name (RecipeBook.load): with it, ``matrix.subsets`` is
    checked against the subsets each recipe declares."""
    p = Problems(path)
    fix = "correct the keys above; the matrix is described in docs/nightly.md"
    if not isinstance(data, dict):
        raise not_a_project_file(path, data, "pass --config a wheelforge.yaml with a matrix: "
                                 "section (the checkout's is an example; docs/nightly.md "
                                 "describes it)")
    p.unknown_keys("", data, PROJECT_KEYS)
    raw = data.get("matrix")
    if not isinstance(raw, dict):
        p.add("matrix", "is required: a mapping with recipes, python, torch, archs, retention"
              if raw is None else f"must be a mapping, got {type(raw).__name__}")
        raise ConfigError(f"{path} has no usable build matrix", why="\n    " + "\n    ".join(
            p.items), fix=fix)
    p.unknown_keys("matrix", raw, _MATRIX_KEYS)

    names: list[str] = []
    for i, name in _strings(p, raw, "recipes", "matrix", required=True):
        normal = str(canonicalize_name(name))
        where = join("matrix.recipes", i)
        if known_recipes is not None and normal not in known_recipes:
            hint = difflib.get_close_matches(normal, sorted(known_recipes), n=1)
            p.add(where, f"no recipe named {name!r}" + (
                f"; did you mean '{hint[0]}'?" if hint else
                f"; known: {', '.join(sorted(known_recipes)) or '(none)'}"))
        elif normal in names:
            p.add(where, f"{name!r} is listed twice")
        else:
            names.append(normal)
    subsets = _subsets(p, raw.get("subsets"), names, recipes)

    pythons: list[str] = []
    for i, py in _strings(p, raw, "python", "matrix", required=False):
        if py in pythons:
            p.add(join("matrix.python", i), f"{py!r} is listed twice")
        pythons.append(py)

    torches: list[TorchPin] = []
    raw_torch = raw.get("torch")
    if raw_torch is None:
        p.add("matrix.torch", "is required: a list of {spec, cuda[, pip-args]}")
    elif not isinstance(raw_torch, list) or not raw_torch:
        p.add("matrix.torch", "must be a non-empty list of {spec, cuda[, pip-args]}")
    else:
        for i, entry in enumerate(raw_torch):
            pin = _torch(p, entry, join("matrix.torch", i))
            if pin is not None and pin in torches:
                p.add(join("matrix.torch", i), "repeats an earlier entry")
            elif pin is not None:
                torches.append(pin)

    arch_sets: list[str] = []
    for i, text in _strings(p, raw, "archs", "matrix", required=True):
        try:
            canonical = torch_arch_list(parse_arch_list(text))
        except WheelforgeError as exc:
            p.add(join("matrix.archs", i), exc.what + (f" ({exc.why})" if exc.why else ""))
            continue
        if canonical in arch_sets:
            p.add(join("matrix.archs", i), f"{text!r} is the same arch set as an earlier entry")
        else:
            arch_sets.append(canonical)

    keep = DEFAULT_KEEP
    retention = raw.get("retention")
    if retention is not None:
        if not isinstance(retention, dict):
            p.add("matrix.retention", "must be a mapping, e.g. {keep: 5}")
        else:
            p.unknown_keys("matrix.retention", retention, _RETENTION_KEYS)
            value = retention.get("keep", DEFAULT_KEEP)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                p.add("matrix.retention.keep", f"must be a positive integer, got {value!r}")
            else:
                keep = value

    canary = _canary(p, raw.get("canary"), names, known_recipes)

    if p.items:
        raise ConfigError(f"the build matrix in {path} has {len(p.items)} problem(s)",
                          why="\n    " + "\n    ".join(p.items), fix=fix)
    return Matrix(path=path, recipes=tuple(names), pythons=tuple(pythons),
                  torches=tuple(torches), arch_sets=tuple(arch_sets), keep=keep,
                  subsets=subsets, canary=canary)


def _canary(p: Problems, raw: Any, matrix_recipes: Sequence[str],
            known_recipes: Collection[str] | None) -> Canary | None:
    """``canary: [names]`` or ``canary: {recipes: [names], index-url: URL, timeout: S}``;
    every name is a recipe of ``matrix.recipes`` (the canary sits beside its pinned cell)."""
    if raw is None:
        return None
    where = "matrix.canary"
    data: Mapping[str, Any]
    if isinstance(raw, (list, str)):  # canary: [names]
        data, at = {}, where
        entries = _strings(p, {"canary": raw}, "canary", "matrix", required=True)
    elif isinstance(raw, dict):
        p.unknown_keys(where, raw, _CANARY_KEYS)
        data, at = raw, join(where, "recipes")
        entries = _strings(p, raw, "recipes", where, required=True)
    else:
        p.add(where, f"must be a list of recipe names or a mapping with recipes, got "
                     f"{type(raw).__name__}, e.g. {{recipes: [causal-conv1d]}}")
        return None
    names: list[str] = []
    for i, name in entries:
        normal = str(canonicalize_name(name))
        item = join(at, i)
        if normal not in matrix_recipes:
            pool = sorted(matrix_recipes)
            hint = difflib.get_close_matches(normal, pool, n=1)
            unknown = known_recipes is not None and normal not in known_recipes
            p.add(item, f"{name!r} is not " + ("a recipe" if unknown else "in matrix.recipes")
                  + (f"; did you mean '{hint[0]}'?" if hint else
                     f"; a canary is one of matrix.recipes: {', '.join(pool) or '(none)'}"))
        elif normal in names:
            p.add(item, f"{name!r} is listed twice")
        else:
            names.append(normal)
    index_url = data.get("index-url", DEFAULT_CANARY_INDEX)
    if not isinstance(index_url, str) or not re.match(r"^https?://[^/\s]+", index_url):
        p.add(join(where, "index-url"), f"must be an http(s) URL of an index with the PyPI "
                                         f"JSON API (e.g. {DEFAULT_CANARY_INDEX}), got "
                                         f"{index_url!r}")
    timeout = data.get("timeout", DEFAULT_CANARY_TIMEOUT)
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout <= MAX_CANARY_TIMEOUT):  # NaN fails both comparisons
        p.add(join(where, "timeout"), f"must be a number of seconds above 0 and at most "
                                       f"{MAX_CANARY_TIMEOUT:g}, got {timeout!r}")
    if not names:
        return None
    return Canary(recipes=tuple(names), index_url=str(index_url).rstrip("/"),
                  timeout=float(timeout) if isinstance(timeout, (int, float)) else 0.0)


def load_matrix(path: Path, known_recipes: Collection[str] | None = None,
                recipes: Callable[[str], Recipe] | None = None) -> Matrix:
    """Read and validate the ``matrix:`` of a project file.

    With ``known_recipes`` (the names in the recipes directory), an unknown recipe
    name is a problem, with a did-you-mean; with ``recipes`` (RecipeBook.load), the
    kernel subsets asked of each recipe are checked against the ones it declares.
    """
    data = read_yaml(path, ConfigError, str(path), read_fix="pass the project file with --config")
    return parse_matrix(data, path, known_recipes, recipes)


def retention_keep(path: Path | None) -> int:
    """``matrix.retention.keep`` of the project file (./wheelforge.yaml when None), or
    DEFAULT_KEEP when there is no file or no matrix."""
    path = path or Path("wheelforge.yaml")
    if not path.is_file():
        return DEFAULT_KEEP
    data = read_yaml(path, ConfigError, str(path))
    if not isinstance(data, dict) or data.get("matrix") is None:
        return DEFAULT_KEEP
    return parse_matrix(data, path).keep


def cells(matrix: Matrix, kinds: Mapping[str, str] | None = None) -> list[Cell]:
    """The builds the matrix stands for, in a stable order.

    ``kinds`` maps recipe names to their build kind ("extension" or "pure", or "stable"
    for a stable-ABI extension); a recipe not in it counts as an extension.  Pure recipes
    give one cell each.  A stable-ABI recipe gives one cell per CUDA major and arch set,
    built with the first python and the first torch of that major (its abi3 wheel serves
    every Python and torch: docs/stable-abi.md).  A recipe with ``subsets`` gives one
    cell per subset (its full build only if listed) per python, torch and arch set, the
    subsets innermost.
    """
    kinds = kinds or {}
    pythons: tuple[str | None, ...] = matrix.pythons or (None,)
    subsets = dict(matrix.subsets)
    out: list[Cell] = []
    for recipe in matrix.recipes:
        if kinds.get(recipe) == "pure":
            out.append(Cell(recipe=recipe, python=pythons[0], torch=matrix.torches[0],
                            archs=None))
            continue
        if kinds.get(recipe) == "stable":
            firsts: dict[str, TorchPin] = {}
            for pin in matrix.torches:
                firsts.setdefault(pin.cuda.split(".")[0], pin)
            out.extend(Cell(recipe=recipe, python=pythons[0], torch=pin, archs=archs)
                       for pin in firsts.values() for archs in matrix.arch_sets)
            continue
        for python in pythons:
            for pin in matrix.torches:
                for archs in matrix.arch_sets:
                    out.extend(Cell(recipe=recipe, python=python, torch=pin, archs=archs,
                                    subset=subset) for subset in subsets.get(recipe, ((),)))
    return out
