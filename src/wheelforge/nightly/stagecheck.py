"""The publisher's checks of a stage: it trusts no builder.

A stage directory comes back from a builder as a downloaded artifact; before anything of
it is published, ``nightly publish`` checks it here: no symlink and no special file
anywhere in it (a wheel that is a symlink to a file outside the stage is refused, never
followed), the wheel verified again as a file (RECORD hashes and sizes, WHEEL tags,
METADATA name and version, no grafted ``*.libs/``), the recipe's content rules (no
foreign top-level package, no excluded path) and, for an extension cell, its SASS
and PTX against the cell's arch list; and, with ``--require-reproduced N``, N builders
that agree byte for byte.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..arch import parse_arch_list
from ..builder.artifact.verify import code_problems, content_problems
from ..errors import VerifyError
from ..wheel import integrity_problems

__all__ = ["Staged", "open_in_stage", "refuse_links", "reproduced", "stage_file",
           "verify_stage_wheel"]

_FIX_STAGE = "run the cell again; never edit a stage by hand, and publish only stage " \
             "directories as `wheelforge nightly run` wrote them"


def refuse_links(stage: Path) -> None:
    """VerifyError when ``stage`` is, or holds at any depth, a symlink or a file that is
    neither a regular file nor a directory (a FIFO, a device, a socket)."""
    bad: list[str] = []
    if stage.is_symlink():
        bad.append(f"{stage}: the stage directory itself is a symlink")
    else:
        for root, dirs, files in os.walk(stage, followlinks=False):
            for name in sorted([*dirs, *files]):
                path = Path(root) / name
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    bad.append(f"{path}: a symlink (to {os.readlink(path)})")
                elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    bad.append(f"{path}: a special file (mode {oct(mode)})")
    if bad:
        raise VerifyError(f"the stage {stage} holds links or special files; nothing was "
                          "published",
                          why="\n    " + "\n    ".join(bad) + "\n  a stage holds plain "
                              "files only: a link is never followed (its target is outside "
                              "what the builder produced)",
                          fix=_FIX_STAGE)


def _outside(value: str) -> str | None:
    """Why ``value`` (a record's path field) is no file name of the stage, or None."""
    if not value:
        return "an empty name"
    if value.startswith("/"):
        return "an absolute path: the publisher reads nothing outside the stage"
    parts = value.replace("\\", "/").split("/")
    if ".." in parts:
        return "a path with '..': it leaves the stage"
    if len(parts) > 1 or value in (".",) or "\0" in value:
        return "not a plain file name of the stage (a stage's files lie at its top)"
    return None


def stage_file(stage: Path, field: str, value: str) -> Path:
    """The file of ``stage`` that its record's ``field`` names: a plain file name inside
    the stage, a regular file there and no symlink (never followed); else a VerifyError
    naming the field, and the stage is refused."""
    why = _outside(value)
    if why is None:
        try:
            mode = os.lstat(stage / value).st_mode
        except OSError as exc:
            why = f"the stage has no such file ({exc.strerror})"
        else:
            if stat.S_ISLNK(mode):
                why = "a symlink: a stage's files are never followed out of it"
            elif not stat.S_ISREG(mode):
                why = f"not a regular file (mode {oct(mode)})"
    if why is None:
        return stage / value
    raise VerifyError(f"the stage {stage} is refused: its cell.json field {field!r} names "
                      f"{value!r}; nothing was published", why=why, fix=_FIX_STAGE)


def open_in_stage(stage: Path, field: str, value: str) -> BinaryIO:
    """``stage_file`` opened for reading with no-follow semantics (O_NOFOLLOW, then the
    open file checked to be regular), so a link swapped in after the check is refused."""
    path = stage_file(stage, field, value)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise VerifyError(f"the stage {stage} is refused: cannot open {value!r} (its "
                          f"cell.json field {field!r})", why=str(exc), fix=_FIX_STAGE) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise VerifyError(f"the stage {stage} is refused: {value!r} (its cell.json field "
                          f"{field!r}) is not a regular file", fix=_FIX_STAGE)
    return os.fdopen(fd, "rb")


def verify_stage_wheel(stage: Path, wheel_name: str, archs: str | None, *,
                       top_level: tuple[str, ...] = (), excluded: tuple[str, ...] = (),
                       allow: tuple[str, ...] = ()) -> None:
    """The stage's wheel verified as the build verified it, without its build environment:
    VerifyError listing every problem.  ``archs`` is the cell's arch list (None: a pure
    cell, which must hold no shared object); ``top_level``, ``excluded`` and ``allow``
    are the recipe's content rules as the plan recorded them (flash-attn: no ``hopper``;
    every recipe: no ``.pth``, start-up module or command that ``allow`` does not name,
    in ``NAME.data/`` too)."""
    wheel = stage / wheel_name
    problems = integrity_problems(wheel)  # a broken zip or member list raises itself
    requested = parse_arch_list(archs) if archs is not None else ()
    problems += code_problems(wheel, extension=archs is not None, archs=requested)
    problems += content_problems(wheel, top_level, excluded, allow)
    if problems:
        raise VerifyError(
            f"{wheel} failed the publisher's verification ({len(problems)} problem(s)); "
            "nothing was published",
            why="\n    " + "\n    ".join(problems),
            fix="the wheel is not the one its builder verified (changed after the build, or "
                "a builder that does not verify): " + _FIX_STAGE)


@dataclass(frozen=True)
class Staged:
    """One built stage of a cell: where, the builder the publisher verified (the
    allowed-signers principal of its signing key; None: unsigned or not checked, which
    counts as no builder), the wheel's sha256."""

    stage: Path
    builder: str | None
    sha256: str


def _who(s: Staged) -> str:
    return f"signed by {s.builder}" if s.builder else "unsigned or unverified: no builder"


def reproduced(label: str, staged: Sequence[Staged], required: int) -> Staged:
    """The stage to publish when at least ``required`` different verified builders
    staged byte-identical wheels (the first stage of the largest agreeing group); else a
    VerifyError listing each stage's sha256 and signer."""
    by_sha: dict[str, list[Staged]] = {}
    for s in staged:
        by_sha.setdefault(s.sha256, []).append(s)

    def trusted(group: Sequence[Staged]) -> set[str]:
        return {s.builder for s in group if s.builder}

    best = max(by_sha.values(), key=lambda group: len(trusted(group)))
    agree = len(trusted(best))
    if agree >= required:
        return next(s for s in best if s.builder)
    builders = len(trusted(staged))
    lines = [f"{s.stage}: sha256 {s.sha256}, {_who(s)}" for s in staged]
    unsigned = sum(1 for s in staged if not s.builder)
    if len(by_sha) > 1:
        what = (f"{label}: the builders disagree: {len(by_sha)} different wheels from "
                f"{len(staged)} stage(s) of {builders} trusted builder(s); not published")
        fix = ("the build is not reproducible, or a builder is not what it claims: compare "
               "the wheels (unzip both, or `diffoscope A.whl B.whl`) before trusting either")
    else:
        what = (f"{label}: built by {agree} trusted builder(s), --require-reproduced asks "
                f"for {required}; not published")
        fix = (f"run the cell on {required - agree} more trusted builder(s), each signing "
               "its stage with its own key (nightly run --signing-key), then publish again")
    if unsigned:
        what += (f" ({unsigned} stage(s) unsigned or signed by no allowed signer count as "
                 "no builder)")
    raise VerifyError(what, why="\n    " + "\n    ".join(lines), fix=fix)
