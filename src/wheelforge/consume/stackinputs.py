"""What a channel's stack check would install and import, as one digest; and whether the
channel's last passing check was of exactly that (then a night or a build that published
nothing there need not run it again: issue 53).

The digest (:func:`digest`) covers everything the check reads from this machine: the
channel's pins and the name and sha256 of each wheel they choose, its constraints file,
the modules the check imports (the recipes' ``verify`` lists), the interpreter the venv is
made from (its path, and the size and date of the binary it resolves to), the
``--deps-dir`` listing, the ``PIP_*``/``UV_*`` settings of the environment, and this
wheelforge's version.  What it cannot cover is a dependency's new release on the usual
index: a skip says so (:func:`skip_line`), and ``wheelforge stack check`` (or
``WHEELFORGE_STACK_CHECK=always``) runs the check whatever the digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from .. import __version__, index
from ..errors import WheelforgeError
from ..index import health
from ..index.health import StackStatus
from ..index.pins import CONSTRAINTS_FILE
from ..recipe.format import RecipeBook
from ..wheel import reading
from .install import plan as install_plan

#: changes when what the digest covers changes, so that older digests never match
SCHEME = "stack-inputs-1"


def modules_to_import(book: RecipeBook | None, wheels: Sequence[Path]) -> list[str]:
    """torch first, then per wheel its recipe's verify.imports and verify.stack-imports,
    else its top-level packages (from the wheel's RECORD)."""
    out = ["torch"]
    for wheel in wheels:
        project = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        named: tuple[str, ...] = ()
        if book is not None and project in book.names():
            recipe = book.load(project)
            named = (*recipe.verify.imports, *recipe.verify.stack_imports)
        for module in named or _top_level(wheel):
            if module not in out:
                out.append(module)
    return out


def _top_level(wheel: Path) -> list[str]:
    tops: list[str] = []
    with reading(wheel) as zf:
        names = zf.namelist()
    for name in names:
        first = name.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")) or first.startswith("_"):
            continue
        module = first[:-3] if first.endswith(".py") else first.split(".", 1)[0]
        if module.isidentifier() and module not in tops and ("/" in name or first.endswith(
                (".py", ".so"))):
            tops.append(module)
    return tops


def _stat(path: Path) -> list[object]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _deps_listing(deps_dir: Path | None) -> list[list[object]]:
    if deps_dir is None:
        return []
    try:
        names = sorted(os.listdir(deps_dir))
    except OSError:
        return [[str(deps_dir), None]]
    return [_stat(deps_dir / n) for n in names]


def digest(index_dir: Path, channel: str | None, book: RecipeBook | None, python: Path,
           deps_dir: Path | None, environ: Mapping[str, str]) -> str:
    """The digest of what the check of ``channel`` would install and import now; "" when
    the channel cannot be planned (the check itself says why)."""
    try:
        records = index.load_records(index_dir)
        p = install_plan(records, index_dir=index_dir, url=None, channel=channel)
        chosen = sorted((r.filename, r.sha256) for r in records
                        if f"{r.project}=={r.version}" in p.pins)
        root = index_dir.resolve() / channel if channel else index_dir.resolve()
        constraints = (root / CONSTRAINTS_FILE).read_bytes()
        modules = modules_to_import(book, [index_dir / index.FILES_DIR / f for f, _ in chosen])
    except (WheelforgeError, OSError, ValueError):
        return ""
    settings = sorted((k, v) for k, v in environ.items() if k.startswith(("PIP_", "UV_")))
    data = {"scheme": SCHEME, "wheelforge": __version__, "channel": channel,
            "pins": list(p.pins), "wheels": chosen,
            "constraints": hashlib.sha256(constraints).hexdigest(), "modules": modules,
            "python": [str(python), _stat(Path(os.path.realpath(python)))],
            "deps": _deps_listing(deps_dir), "environ": settings}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def unchanged(index_dir: Path, channel: str | None, inputs: str) -> StackStatus | None:
    """The channel's recorded status when it passed (``good``) with exactly ``inputs``;
    None when the check must run (never checked, not passing, other inputs, or no
    digest)."""
    if not inputs:
        return None
    before = health.read_status(index_dir, channel)
    if before is None or before.state != "good" or before.inputs != inputs:
        return None
    return before


def skip_line(before: StackStatus, deps_dir: Path | None) -> str:
    """What a skipped check prints."""
    name = before.channel or "simple/"
    moved = ("" if deps_dir is not None else
             "; its dependencies come from the usual index, whose new releases that check "
             "did not see")
    return (f"stack {name}: check skipped: the channel is unchanged since the check of "
            f"{before.checked_at} (passed){moved}; `wheelforge stack check` reruns it")
