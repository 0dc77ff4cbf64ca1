"""Apply a recipe's patch series atomically.

The series is applied to a staging copy of the tree; the tree is replaced
only when every patch applied.  A patch that does not apply is named with
its hunk and the file position, and the original tree is left as it was.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import _proc
from .errors import PatchError

_FAILED = re.compile(r"patch failed: (?P<file>.+?):(?P<line>\d+)")
_NO_FILE = re.compile(r"error: (?P<file>.+?): No such file or directory")
_HUNK = re.compile(r"^@@ -(?P<start>\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")
_FILE = re.compile(r"^\+\+\+ (?:b/)?(?P<file>\S+)")


@dataclass(frozen=True)
class Hunk:
    file: str
    index: int  # 1-based, counted over the whole patch
    old_start: int


def hunks(patch_text: str) -> list[Hunk]:
    out: list[Hunk] = []
    current = ""
    for line in patch_text.splitlines():
        m = _FILE.match(line)
        if m:
            current = m.group("file")
            continue
        m = _HUNK.match(line)
        if m:
            out.append(Hunk(current, len(out) + 1, int(m.group("start"))))
    return out


def _git_apply(args: list[str], tree: Path) -> _proc.Completed:
    env = dict(os.environ, LC_ALL="C", GIT_CEILING_DIRECTORIES=str(tree.parent.resolve()))
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return _proc.run(["git", "apply", "--whitespace=nowarn", *args], cwd=tree, env=env,
                     check=False)


def describe_failure(patch: Path, output: str) -> str:
    """Turn git apply's complaint into 'hunk N at FILE:LINE'."""
    m = _FAILED.search(output)
    if m:
        file, line = m.group("file"), int(m.group("line"))
        for h in hunks(patch.read_text(encoding="utf-8", errors="replace")):
            if h.file == file and h.old_start == line:
                return f"hunk {h.index} at {file}:{line}"
        return f"at {file}:{line}"
    m = _NO_FILE.search(output)
    if m:
        return f"{m.group('file')} does not exist in the tree"
    first = next((ln for ln in output.splitlines() if ln.startswith("error:")), output.strip())
    return first


def apply_series(tree: Path, patches: Sequence[Path], *, project: str) -> None:
    """Apply ``patches`` in order to ``tree``: all of them, or none."""
    if not patches:
        return
    staging = tree.with_name(tree.name + ".patching")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(tree, staging, symlinks=True)
    try:
        for patch in patches:
            if not patch.is_file():
                raise PatchError(f"patch {patch} does not exist",
                                 fix="restore the file or remove it from the recipe")
            result = _git_apply(["--check", "-v", str(patch.resolve())], staging)
            if result.returncode != 0:
                where = describe_failure(patch, result.output)
                raise PatchError(
                    f"patch {patch.name} does not apply to {project} ({where})",
                    why="the upstream file differs from what the patch expects; no patch of "
                        "the series was applied",
                    fix=f"refresh the patch against the pinned source (see README, 'Writing and "
                        f"refreshing a patch'); git apply said: "
                        f"{' '.join(result.output.split())[:300]}",
                )
            _git_apply([str(patch.resolve())], staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = tree.with_name(tree.name + ".unpatched")
    if old.exists():
        shutil.rmtree(old)
    os.rename(tree, old)
    os.rename(staging, tree)
    shutil.rmtree(old)
