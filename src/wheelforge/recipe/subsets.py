"""Kernel subsets of a recipe (its ``subsets:``): what ``--subset`` asks for, checked
against what the recipe declares, and what a chosen subset adds to a build: the label
fragment of the version (``hd128bf16``) and the environment its patch reads."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from ..errors import ConfigError
from .model import Choice, Recipe, Subset


def parse_subset_entries(entries: Sequence[str]) -> Choice:
    """``--subset`` entries (``hdim=64,128``, also several in one, space- or ';'-separated)
    as (dimension, values) pairs in the order given; a dimension named twice is an error."""
    out: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        for item in re.split(r"[;\s]+", entry.strip()):
            if not item:
                continue
            key, sep, raw = item.partition("=")
            values = tuple(v for v in raw.split(",") if v)
            if not sep or not key or not values:
                raise ConfigError(f"--subset {item!r} is not KEY=VALUE[,VALUE...]",
                                  fix="e.g. --subset hdim=128 --subset dtype=bf16 "
                                      "--subset bwd=no; `wheelforge show NAME` lists the keys")
            if key in out:
                raise ConfigError(f"--subset names {key!r} twice",
                                  fix=f"give every value of {key} in one entry: {key}=A,B")
            out[key] = values
    return tuple(out.items())


def subset_problems(recipe: Recipe,
                    chosen: Choice) -> list[str]:
    """What is wrong with ``chosen`` for ``recipe`` (which declares subsets): unknown
    dimensions (with a did-you-mean, else the recipe's), unknown values (with the allowed
    ones), several values for a one-value dimension, a value twice; [] when it is good."""
    dims = {d.name: d for d in recipe.subsets}
    problems = []
    for key, values in dict(chosen).items():
        dim = dims.get(key)
        if dim is None:
            hint = difflib.get_close_matches(key, list(dims), n=1)
            problems.append(f"unknown subset key {key!r}" + (
                f" (did you mean {hint[0]!r}?)" if hint else f" (allowed: {', '.join(dims)})"))
            continue
        unknown = [v for v in values if v not in dim.values]
        if unknown:
            problems.append(f"{key}: unknown value(s) {', '.join(unknown)}; "
                            f"choose from {','.join(dim.values)}")
        elif not dim.multiple and len(values) != 1:
            problems.append(f"{key} takes one value: {' or '.join(dim.values)}")
        elif len(set(values)) != len(values):
            problems.append(f"{key}: a value is given twice")
    return problems


def select_subset(recipe: Recipe, chosen: Choice) -> Subset:
    """The kernel subset of ``recipe`` that ``chosen`` (parse_subset_entries) asks for: every
    dimension of the recipe with its values in the recipe's order, or () for the full build.
    Unknown dimensions or values are a ConfigError naming what the recipe declares."""
    dims = {d.name: d for d in recipe.subsets}
    if chosen and not dims:
        raise ConfigError(f"{recipe.name} declares no kernel subsets; --subset does not apply",
                          fix="build it without --subset")
    picked = dict(chosen)
    problems = subset_problems(recipe, chosen)
    if problems:
        raise ConfigError(f"--subset for {recipe.name}: " + "; ".join(problems),
                          why="its subsets: " + describe_subsets(recipe),
                          fix="e.g. --subset hdim=128 --subset dtype=bf16; "
                              f"`wheelforge show {recipe.name}` lists them")
    subset = tuple((d.name, tuple(v for v in d.values if v in picked[d.name])
                    if d.name in picked else d.default) for d in recipe.subsets)
    if all(values == dims[name].default for name, values in subset):
        return ()
    return subset


def subset_choice(recipe: Recipe, subset: Subset) -> Choice:
    """The shortest choice that asks for ``subset`` (select_subset): its dimensions that
    differ from the full build, in the recipe's order; () for the full build."""
    dims = {d.name: d for d in recipe.subsets}
    return tuple((name, values) for name, values in subset if values != dims[name].default)


def choice_text(chosen: Choice) -> str:
    """``hdim=64,128 dtype=bf16``: a choice as ``--subset`` spells it; '' for the full build."""
    return " ".join(f"{k}={','.join(v)}" for k, v in chosen)


def describe_subsets(recipe: Recipe) -> str:
    """``hdim=32,64,... (head dims); dtype=fp16,bf16; ...``: what ``--subset`` takes."""
    return "; ".join(f"{d.name}={(',' if d.multiple else '|').join(d.values)}"
                     + (f" ({d.help})" if d.help else "") for d in recipe.subsets) or "none"


def subset_label(recipe: Recipe, subset: Subset) -> str:
    """The fragment of the local version that names a subset (``hd128bf16fwd``); '' for the
    full build."""
    dims = {d.name: d for d in recipe.subsets}
    return "".join(dims[name].label(values) for name, values in subset)


def subset_environment(recipe: Recipe, subset: Subset) -> dict[str, str]:
    """The project's switches for a subset: every dimension set explicitly (the full build's
    values for a full build), so a variable in the caller's shell cannot change the kernels a
    wheel labelled as full holds."""
    chosen = dict(subset)
    return {d.env: ",".join(chosen.get(d.name, d.default)) for d in recipe.subsets}
