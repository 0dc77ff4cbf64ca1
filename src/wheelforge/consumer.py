"""Consumer configuration that installs wheelforge's wheels even when a public index
offers the same names at higher versions (dependency confusion).

With a bare ``--extra-index-url`` pip merges every index and takes the highest version
it sees, so a newer public upload of the same name wins.  The configurations here make
the local index the only source of the projects it holds:

* pip: two commands.  The first can see only the local index (``--index-url``, no
  extra index, ``--no-deps``), so it installs exactly the pinned local wheels; the
  second resolves their dependencies from the usual index, and pip keeps the already
  installed, pinned versions.
* uv: the local index declared ``explicit`` and every project it holds pinned to it in
  ``[tool.uv.sources]``; for ``uv pip``, the local index as ``--extra-index-url``, which
  uv consults first, and uv's default ``first-index`` strategy stops at the first index
  that has a name.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from .index import WheelRecord


def newest(records: Sequence[WheelRecord], channel: str | None) -> list[WheelRecord]:
    """The newest non-yanked wheel per project, within ``channel`` (plus pure wheels)."""
    best: dict[str, WheelRecord] = {}
    for rec in records:
        if rec.yanked is not None:
            continue
        if channel is not None and rec.channel != channel and not (
            rec.channel is None and _is_pure(rec.filename)
        ):
            continue  # not on the channel's pages: those hold its wheels and pure ones
        cur = best.get(rec.project)
        if cur is None or Version(rec.version) > Version(cur.version):
            best[rec.project] = rec
    return [best[k] for k in sorted(best)]


def _is_pure(filename: str) -> bool:
    return all(t.abi == "none" and t.platform == "any" for t in parse_wheel_filename(filename)[3])


def index_url(index_dir: Path | None, url: str | None, channel: str | None) -> str:
    if url:
        return url.rstrip("/") + "/"
    assert index_dir is not None
    base = index_dir.resolve() / channel if channel else index_dir.resolve()
    return (base / "simple").as_uri() + "/"


def pins(records: Sequence[WheelRecord]) -> list[str]:
    return [f"{r.project}=={r.version}" for r in records]


def pip_config(url: str, records: Sequence[WheelRecord]) -> str:
    p = " ".join(shlex.quote(x) for x in pins(records))
    return "\n".join([
        "# pip: install the wheelforge wheels from the local index only, then their",
        "# dependencies from your usual index (pip keeps the pinned, installed versions).",
        "# Never rely on a bare --extra-index-url: pip would take a newer public upload.",
        "pip install --isolated --no-deps --only-binary :all: \\",
        f"    --index-url {shlex.quote(url)} \\",
        f"    {p}",
        f"pip install {p}",
        "",
    ])


def uv_config(url: str, records: Sequence[WheelRecord]) -> str:
    lines = [
        "# uv, in pyproject.toml: the local index is explicit, and each project it holds",
        "# is taken from it alone, whatever versions other indexes offer.",
        "[[tool.uv.index]]",
        'name = "wheelforge"',
        f"url = {json.dumps(url)}",  # a JSON string is a valid TOML basic string
        "explicit = true",
        "",
        "[tool.uv.sources]",
    ]
    lines += [f'{r.project} = {{ index = "wheelforge" }}' for r in records]
    p = " ".join(shlex.quote(x) for x in pins(records))
    lines += [
        "",
        "# uv pip: an --extra-index-url is consulted before the default index, and uv's",
        "# default first-index strategy never mixes versions of one name across indexes.",
        f"# uv pip install --index-strategy first-index --extra-index-url {shlex.quote(url)} {p}",
        "",
    ]
    return "\n".join(lines)
