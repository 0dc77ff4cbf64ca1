"""How long cells took: ``CACHE/stats/durations.json``, the plan's estimates."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from .._fs import atomic_write, locked
from ..recipe.matrix import Cell

__all__ = ["DURATIONS", "estimate", "read_durations", "record_durations"]

DURATIONS = "durations.json"


def _signature(cell: Cell) -> str:
    """``recipe|python|torch|archs``, and ``|subset`` for a kernel subset: a subset's
    durations are never a full build's, nor the other way round."""
    parts = [cell.recipe, cell.python or "", cell.torch.spec, cell.archs or "pure"]
    return "|".join([*parts, cell.subset_text] if cell.subset else parts)


def read_durations(cache_dir: Path) -> dict[str, float]:
    try:
        data = json.loads((cache_dir / "stats" / DURATIONS).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, nested too deep
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items()
            if isinstance(v, int | float) and abs(v) < 1e300}  # NaN and 10**400 left out


def record_durations(cache_dir: Path, timed: Iterable[tuple[Cell, float]]) -> None:
    """Remember how long cells took to build (the last build of each counts)."""
    timed = list(timed)
    if not timed:
        return
    path = cache_dir / "stats" / DURATIONS
    with locked(cache_dir / "stats" / f"{DURATIONS}.lock"):
        data = read_durations(cache_dir)
        data.update({_signature(c): round(s, 1) for c, s in timed})
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def estimate(durations: Mapping[str, float], cell: Cell) -> float | None:
    """The cell's last duration; else the mean of the recipe's cells (of the same kernel
    subset) for that arch set, else of all its cells (of that subset); None when never
    timed."""
    if (found := durations.get(_signature(cell))) is not None:
        return found
    parts = [(k.split("|"), v) for k, v in durations.items()]
    same_recipe = [(p, v) for p, v in parts if len(p) in (4, 5) and p[0] == cell.recipe
                   and (p[4] if len(p) == 5 else "") == cell.subset_text]
    same_archs = [v for p, v in same_recipe if p[3] == (cell.archs or "pure")]
    for values in (same_archs, [v for _, v in same_recipe]):
        if values:
            return sum(values) / len(values)
    return None
