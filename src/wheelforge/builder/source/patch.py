"""Apply a recipe's patch series atomically.

Every patch of the series is checked before any is applied (:func:`refusals`): no
symlinks or submodules, no modes but 100644 and 100755, no absolute paths and no ``..``.
The series is applied to a staging copy of the tree; after each patch, no new or changed
symlink and no path resolving outside the tree may appear.  The tree is replaced only
when every patch applied.  A patch that does not apply is named with its hunk and the
file position, and the original tree is left as it was.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import _proc
from ..._fs import escaping_links, symlinks
from ...errors import PatchError

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


_MODES_OK = ("100644", "100755")
# as leniently as git reads them: git skips blanks before a mode (strtoul) and does not
# check the object ids of an index line, so neither may this
_MODE_LINE = re.compile(r"^(?P<kind>old mode|new mode|new file mode|deleted file mode) "
                        r"\s*(?P<mode>\S*)")
_INDEX_LINE = re.compile(r"^index \S*\.\.\S*(?:\s+(?P<mode>\S+))?")
_PATH_LINE = re.compile(r"^(?P<kind>rename from|rename to|copy from|copy to) \s*(?P<path>.*)$")
_HUNK_COUNTS = re.compile(r"^@@ -\d+(?:,(?P<old>\d+))? \+\d+(?:,(?P<new>\d+))? @@")
_BINARY_DATA = re.compile(r"^(?:(?:literal|delta) \d+|[A-Za-z][^ ]*)$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> tuple[str, str]:
    """Split git's C-quoted path (``"a/x\\tb"``) off the front of ``text``."""
    out = bytearray()
    i = 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1:]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567" and i + 3 < len(text):
                out.append(int(text[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt) & 0xFF))
            i += 2
            continue
        out.extend(c.encode("utf-8", "surrogateescape"))
        i += 1
    return out.decode("utf-8", "surrogateescape"), ""


def _path_problem(path: str, *, prefixed: bool) -> str | None:
    """Why ``path`` (as a patch header names it) is refused, or None."""
    if path == "/dev/null":
        return None
    if path.startswith("/"):
        return "an absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "a path with a '..' component"
    if prefixed and "/" in path and path.split("/", 1)[1].startswith("/"):
        return "an absolute path"
    return None


def _header_paths(line: str) -> list[tuple[str, bool]]:
    """The paths a header line names, each with whether it carries an a/ b/ prefix."""
    if line.startswith(("--- ", "+++ ")):
        rest = line[4:].lstrip(" \t")
        path = _unquote(rest)[0] if rest.startswith('"') else rest.split("\t", 1)[0].rstrip()
        return [(path, True)]
    if line.startswith("diff --git "):
        rest, out = line[len("diff --git "):], []
        while rest:
            if rest.startswith('"'):
                path, rest = _unquote(rest)
                out.append((path, True))
            else:  # unquoted names hold no quote; split on spaces (names with spaces: each
                # piece is checked, which can only refuse more)
                token, _, rest = rest.partition(" ")
                if token:
                    out.append((token, True))
            rest = rest.lstrip(" ")
        return out
    m = _PATH_LINE.match(line)
    if m:
        raw = m.group("path")
        return [(_unquote(raw)[0] if raw.startswith('"') else raw, False)]
    return []


def refusals(text: str) -> list[tuple[int, str]]:
    """What a patch may not do, as (line number, reason): create or change a symlink or a
    submodule, set a mode other than 100644/100755, or name an absolute path or ``..``."""
    out: list[tuple[int, str]] = []
    old = new = 0  # lines left in the current hunk
    binary = False
    current = "?"  # the file of the current diff --git section
    # lines as git reads them: split on \n only (str.splitlines also splits on \f, \x1c,
    # \x85, \u2028 ..., which a patch could use to make this reading differ from git's)
    for no, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if old > 0 or new > 0:
            tag = line[:1]
            if tag in (" ", ""):
                old, new = old - 1, new - 1
            elif tag == "-":
                old -= 1
            elif tag == "+":
                new -= 1
            elif tag != "\\":
                old = new = 0  # a short hunk: git apply reports it; read headers again
            else:
                continue
            if old > 0 or new > 0 or tag in (" ", "", "-", "+"):
                continue
        if binary:
            if not line or _BINARY_DATA.match(line):
                continue
            binary = False
        m = _HUNK_COUNTS.match(line)
        if m:
            old = int(m.group("old") or 1)
            new = int(m.group("new") or 1)
            continue
        if line.startswith("GIT binary patch"):
            binary = True
            continue
        mode = _MODE_LINE.match(line) or _INDEX_LINE.match(line)
        if mode and mode.group("mode") is not None and mode.group("mode") not in _MODES_OK:
            value = mode.group("mode")
            what = {"120000": "a symlink", "160000": "a submodule (gitlink)"}.get(
                value, "a special file mode")
            out.append((no, f"mode {value}, {what}, for {current!r}"))
            continue
        paths = _header_paths(line)
        if line.startswith("diff --git ") and paths:
            current = paths[-1][0].split("/", 1)[-1]
        for path, prefixed in paths:
            problem = _path_problem(path, prefixed=prefixed)
            if problem:
                out.append((no, f"{problem} {path!r}"))
    return out


def check_patch(patch: Path) -> None:
    """PatchError naming the patch, the line and the path when :func:`refusals` finds any."""
    try:
        text = patch.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise PatchError(f"cannot read patch {patch}", why=str(exc),
                         fix="restore the file or remove it from the recipe") from exc
    found = refusals(text)
    if found:
        raise PatchError(
            f"patch {patch.name} is refused (line {found[0][0]}: {found[0][1]})",
            why="a recipe's patch may not create or change symlinks or submodules, set a mode "
                "other than 100644/100755, or name an absolute path or '..'; nothing of the "
                "series was applied:\n    " + "\n    ".join(
                    f"{patch.name}:{no}: {reason}" for no, reason in found),
            fix="rewrite the patch as plain edits of files inside the source tree (git diff "
                "of a checkout, paths a/... b/...)",
        )


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
    for patch in patches:
        if not patch.is_file():
            raise PatchError(f"patch {patch} does not exist",
                             fix="restore the file or remove it from the recipe")
        check_patch(patch)
    staging = tree.with_name(tree.name + ".patching")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(tree, staging, symlinks=True)
    try:
        links = symlinks(staging)
        for patch in patches:
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
            links = _check_links(staging, links, patch, project)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = tree.with_name(tree.name + ".unpatched")
    if old.exists():
        shutil.rmtree(old)
    os.rename(tree, old)
    os.rename(staging, tree)
    shutil.rmtree(old)


def _check_links(staging: Path, before: dict[str, str], patch: Path,
                 project: str) -> dict[str, str]:
    """After ``patch``: no symlink new or changed, none resolving outside the tree."""
    after = symlinks(staging)
    changed = sorted(p for p, target in after.items() if before.get(p) != target)
    out = escaping_links(staging)
    if changed or out:
        path, target = (changed[0], after[changed[0]]) if changed else out[0]
        raise PatchError(
            f"patch {patch.name} made {path} a symlink to {target} in {project}" if changed
            else f"after patch {patch.name}, {path} in {project} resolves outside the tree "
                 f"({target})",
            why="a patch may not create symlinks, and no path may lead out of the source tree "
                "(the file it points at would be packaged); nothing of the series was applied",
            fix="rewrite the patch as plain edits of files inside the source tree")
    return after
