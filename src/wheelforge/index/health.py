"""The stack status of a channel: whether the channel's wheels, installed together with
their dependencies as users install them, import together.

The check itself is :mod:`wheelforge.consume.stack`'s; this module owns its record,
``<index>/<channel>/stack.json`` (or ``<index>/stack.json`` for the top-level pages),
written atomically under the index lock (:func:`wheelforge.index.record_stack`) and
shown on the landing page.  A status is one
of ``good`` (every import worked and ``pip check`` was clean), ``broken`` (what failed,
and the package that caused it) or ``not checked`` (why: never "good" for what could not
be checked).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, cast, get_args

from .._fs import atomic_write
from ..errors import PublishError
from .records import _CHANNEL_RE, _RESERVED_CHANNELS

StackState = Literal["good", "broken", "not checked"]
STACK_FILE = "stack.json"
SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class ImportOutcome:
    module: str
    ok: bool
    error: str = ""  # "Type: message" of the exception
    #: the distributions the failing import went through, outermost first (the last one
    #: raised), e.g. ["fla-core", "tilelang", "apache-tvm-ffi"]
    through: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StackStatus:
    channel: str | None  # None: the top-level simple/ pages
    state: StackState
    checked_at: str  # UTC, ISO 8601
    reason: str = ""  # one line: why broken, or why not checked
    pins: tuple[str, ...] = ()  # the channel's projects, NAME==VERSION, installed together
    #: the dependencies the check resolved from the public index: name -> version
    resolved: Mapping[str, str] = field(default_factory=dict)
    imports: tuple[ImportOutcome, ...] = ()
    pip_check: str = ""  # pip check's output when it found a problem
    #: why a culprit is installed: requirement chains from a pinned project, e.g.
    #: ["mamba-ssm -> tilelang"]
    culprit_chains: tuple[str, ...] = ()
    python: str = ""  # the interpreter the venv was made from, and its version
    dependencies_from: str = ""  # "the public index (pip's configuration)" or a directory
    #: the digest of what the check installed and imported (consume/stackinputs.py): a
    #: good status with the digest of now need not be checked again
    inputs: str = ""

    @property
    def label(self) -> str:
        return self.state if not self.reason else f"{self.state}: {self.reason}"


def stack_file(index_dir: Path, channel: str | None) -> Path:
    return index_dir / channel / STACK_FILE if channel else index_dir / STACK_FILE


def to_json(status: StackStatus) -> str:
    data = asdict(status)
    data["schema"] = SCHEMA
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def from_json(text: str) -> StackStatus:
    """A status read back; ValueError for anything that is not one this module wrote."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError("not a stack status of this schema")
    state = data.get("state")
    if state not in get_args(StackState):
        raise ValueError(f"state {state!r}")
    state = cast(StackState, state)
    channel = data.get("channel")
    if channel is not None and not (isinstance(channel, str) and _CHANNEL_RE.match(channel)):
        raise ValueError(f"channel {channel!r}")

    def strs(key: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} is not a list of strings")
        return tuple(value)

    def text_of(key: str) -> str:
        value = data.get(key, "")
        if not isinstance(value, str):
            raise ValueError(f"{key} is not a string")
        return value

    resolved = data.get("resolved", {})
    if not isinstance(resolved, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in resolved.items()):
        raise ValueError("resolved is not a mapping of names to versions")
    imports = []
    for item in data.get("imports", []):
        if not isinstance(item, dict) or not isinstance(item.get("module"), str):
            raise ValueError("an import outcome without a module")
        through = item.get("through", [])
        if not isinstance(through, list) or not all(isinstance(t, str) for t in through):
            raise ValueError("through is not a list of strings")
        imports.append(ImportOutcome(module=item["module"], ok=bool(item.get("ok")),
                                     error=str(item.get("error", "")), through=tuple(through)))
    return StackStatus(
        channel=channel, state=state, checked_at=text_of("checked_at"),
        reason=text_of("reason"), pins=strs("pins"), resolved=dict(resolved),
        imports=tuple(imports), pip_check=text_of("pip_check"),
        culprit_chains=strs("culprit_chains"), python=text_of("python"),
        dependencies_from=text_of("dependencies_from"), inputs=text_of("inputs"))


def read_status(index_dir: Path, channel: str | None) -> StackStatus | None:
    """The channel's last recorded status; None when never checked or unreadable."""
    try:
        return from_json(stack_file(index_dir, channel).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def read_statuses(index_dir: Path, channels: Sequence[str]) -> dict[str | None, StackStatus]:
    """The recorded status of each channel and of the top-level pages, where there is one."""
    out: dict[str | None, StackStatus] = {}
    for channel in [None, *channels]:
        found = read_status(index_dir, channel)
        if found is not None:
            out[channel] = found
    return out


def write_status(index_dir: Path, status: StackStatus) -> Path:
    """Record ``status`` atomically; return the file written.  The caller holds the index
    lock and refreshes the landing page (:func:`wheelforge.index.record_stack` does both)."""
    channel = status.channel
    if channel is not None and (not _CHANNEL_RE.match(channel) or channel in _RESERVED_CHANNELS):
        raise PublishError(f"cannot record the stack status of channel {channel!r}",
                           why="that is not a channel name",
                           fix="pass a channel of the index (wheelforge consumer-config lists "
                               "them)")
    path = stack_file(index_dir, channel)
    if channel is not None and not (index_dir / channel).is_dir():
        raise PublishError(f"the index {index_dir} has no channel {channel}",
                           why=f"{index_dir / channel} does not exist",
                           fix="publish a wheel of that channel first")
    try:
        atomic_write(path, to_json(status))
    except OSError as exc:
        raise PublishError(f"cannot write {path}", why=os.strerror(exc.errno or 0) or str(exc),
                           fix="free space or fix the permissions of the index") from None
    return path


def summary_line(status: StackStatus | None) -> str:
    """One line for people: the landing page, the nightly report, the build's last lines."""
    if status is None:
        return "not checked yet (wheelforge stack check)"
    if status.state == "good":
        deps = ", ".join(f"{k} {v}" for k, v in sorted(status.resolved.items())
                         if k in _NOTABLE)
        return "good" + (f" (with {deps})" if deps else "")
    return status.label


#: dependencies named in a good status's one-line summary (the rest are in stack.json)
_NOTABLE = frozenset({"torch", "triton", "transformers", "tilelang", "apache-tvm-ffi",
                      "quack-kernels", "einops", "nvidia-cutlass-dsl"})
