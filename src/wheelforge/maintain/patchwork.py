"""A recipe's patch series as a git repository, the way Debian's gbp-pq does it.

:func:`start` unpacks the pinned, verified source into a new repository: a first commit
of the pristine tree, tagged ``upstream``, then one commit per patch (``git am``: author,
date and message from the patch's header).  The maintainer edits, rebases and adds
commits there.  :func:`export` writes ``upstream..HEAD`` back as the recipe's series:
``git format-patch --zero-commit --no-signature`` files named ``NNNN-slug.patch``, the
recipe's ``patches:`` list edited as text, the files the old series had and the new one
has not removed.  A patch whose commit did not change since :func:`start` keeps its file
byte for byte.  Every patch is held to :func:`wheelforge.builder.source.patch.refusals`, and the
series must apply to the pristine tree with :func:`~wheelforge.builder.source.patch.apply_series`
before anything is written.  :func:`rebase` commits a new upstream tree on top of the old
one, moves the tag and replays the series onto it with ``git rebase``, stopping at the
first conflict with the patch and the file and line named.

What the repository came from is kept in ``.git/wheelforge.json`` (so that ``git status``
stays clean): the recipe, the pinned source of the base, and, per patch, its file's
sha256 and the commit it became.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _proc
from .._fs import TMP_PREFIX, atomic_write, sha256_file
from ..builder.source.fetch import extract
from ..builder.source.patch import apply_series, refusals
from ..errors import ConfigError, PatchError
from ..recipe.model import Recipe
from .recipefile import listed_patches, set_patches

STATE_FILE = "wheelforge.json"
TAG = "upstream"
BRANCH = "patches"
#: what wheelforge's own commits are made as (a patch's commit keeps the patch's author)
IDENTITY = {"GIT_COMMITTER_NAME": "wheelforge", "GIT_COMMITTER_EMAIL": "wheelforge@localhost",
            "GIT_AUTHOR_NAME": "wheelforge", "GIT_AUTHOR_EMAIL": "wheelforge@localhost"}
#: bytes in, bytes out: no end-of-line conversion, filter or keyword expansion of the tree's
#: .gitattributes, no export-ignore when the tree is archived again
ATTRIBUTES = "* -text -filter -ident -export-ignore -export-subst\n"
_PATCH_HEADER = re.compile(r"^From [0-9a-f]{40} ", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Started:
    path: Path
    base: str
    commits: tuple[tuple[str, str], ...]  # (patch file name, commit id)


@dataclass(frozen=True, kw_only=True)
class Exported:
    recipe_file: Path
    patches: tuple[str, ...]
    written: tuple[str, ...]  # new or changed files
    kept: tuple[str, ...]  # unchanged files
    removed: tuple[str, ...]
    recipe_changed: bool


@dataclass(frozen=True, kw_only=True)
class Conflict:
    """Where a rebase stopped: the patch (its subject and old file) and the files."""

    patch: str
    subject: str
    places: tuple[str, ...]  # "FILE:LINE" of each conflict marker block, or "FILE"


def git(args: Sequence[str], repo: Path, *, check: bool = True,
        env: dict[str, str] | None = None) -> _proc.Completed:
    """git in ``repo`` with no system or user configuration and no hooks: the bytes it
    writes depend on the repository only (no format.*, diff.* or am.* settings)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full.update(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                GIT_TERMINAL_PROMPT="0", GIT_EDITOR="true",
                GIT_CEILING_DIRECTORIES=str(repo.resolve().parent), **IDENTITY)
    full.update(env or {})
    result = _proc.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=repo, env=full,
                       check=False)
    if check and result.returncode != 0:
        raise PatchError(f"git {' '.join(args[:2])} failed in {repo}",
                         why=" ".join(result.output.split())[-600:],
                         fix="see git's message above; the repository is left as it is")
    return result


def _out(args: Sequence[str], repo: Path) -> str:
    return git(args, repo).output.strip()


def default_dir(name: str) -> Path:
    return Path("patch-work") / name


#: Kernel file systems: a path there is no place for a repository, and /proc/self/... names
#: another directory in each process that opens it (git's is not wheelforge's)
_VIRTUAL = ("/proc", "/sys", "/dev")


def _fresh_dir(dest: Path) -> None:
    if dest.is_symlink():
        target = os.readlink(dest)
        raise ConfigError(
            f"{dest} is a symbolic link (to {target}"
            + ("" if dest.exists() else ", which does not exist") + ")",
            why="start makes the repository at the path given and never follows a link: the "
                "unpacked source and its .git would land wherever the link points",
            fix="pass --to the real directory (or a new path), not a link to it")
    lexical = os.path.normpath(os.path.abspath(dest))
    for path in (lexical, os.path.realpath(lexical)):
        for top in _VIRTUAL:
            if path != top and not path.startswith(top + "/"):
                continue
            raise ConfigError(
                f"{dest} is under {top}",
                why="a kernel's virtual file system (/proc, /sys, /dev) holds no repository, "
                    "and a /proc/self/... path means another directory to each process",
                fix="pass --to a directory on a real file system")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(
            f"{dest} already exists and is not empty",
            why="start unpacks the source into a new repository and never overwrites a "
                "directory that may hold someone's work",
            fix=f"export or remove it first (rm -rf {dest}), or pass --to another directory")


def _commit_tree(repo: Path, tree_dir: Path, message: str, parent: str | None) -> str:
    """Commit every file of ``tree_dir`` (ignored ones too) without touching the index."""
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX) as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(tree_dir),
               "GIT_DIR": str(repo / ".git")}
        git(["add", "-A", "-f", "."], tree_dir, env=env)
        tree = git(["write-tree"], tree_dir, env=env).output.strip()
    args = ["commit-tree", tree, "-m", message, *(["-p", parent] if parent else [])]
    return _out(args, repo)


def start(recipe: Recipe, archive: Path, dest: Path) -> Started:
    """Unpack ``archive`` (the recipe's verified source) into the new repository ``dest``
    and commit the recipe's series onto it, one commit per patch."""
    for patch in recipe.patches:
        _check_file(patch)
    try:
        _fresh_dir(dest)
        dest = Path(os.path.abspath(dest))
        dest.parent.mkdir(parents=True, exist_ok=True)
        existed = dest.exists()
        try:
            return _start(recipe, archive, dest)
        except BaseException:
            # nothing half-made is left: the directory is as it was (absent or empty)
            shutil.rmtree(dest, ignore_errors=True)
            if existed:
                dest.mkdir(exist_ok=True)
            raise
    except OSError as exc:  # the place itself: not writable, replaced meanwhile, disk full
        raise ConfigError(f"cannot make the patch repository at {dest}",
                          why=f"{exc.strerror or exc}: {exc.filename or dest}",
                          fix="pass --to a new or empty directory you can write") from None


def _start(recipe: Recipe, archive: Path, dest: Path) -> Started:
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=dest.parent) as tmp:
        root = extract(archive, Path(tmp) / "src", recipe.extract)
        if dest.exists():
            dest.rmdir()
        os.rename(root, dest)
    git(["init", "--quiet", f"--initial-branch={BRANCH}"], dest)
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "attributes").write_text(ATTRIBUTES)
    git(["config", "core.autocrlf", "false"], dest)
    identity = recipe.sources[0].identity
    base = _commit_tree(dest, dest, f"{recipe.name} {recipe.version}: the pinned source\n\n"
                        f"{identity}\n", None)
    git(["reset", "--quiet", base], dest)
    git(["tag", TAG, base], dest)
    entries = []
    for patch in recipe.patches:
        commit = _apply_commit(dest, patch, recipe)
        entries.append({"file": patch.name, "sha256": sha256_file(patch),
                        "key": _commit_key(dest, commit)})
    status = _out(["status", "--porcelain", "--untracked-files=all"], dest)
    if status:
        raise PatchError(f"the new repository {dest} is not clean after the series",
                         why=status[:600], fix="report this as a wheelforge bug")
    _write_state(dest, {"recipe": str(recipe.name), "recipe_file": str(recipe.path.resolve()),
                        "source": identity, "version": str(recipe.version), "patches": entries})
    commits = _out(["rev-list", "--reverse", f"{TAG}..HEAD"], dest).split()
    return Started(path=dest, base=base,
                   commits=tuple(zip((p.name for p in recipe.patches), commits, strict=True)))


def _check_file(patch: Path) -> None:
    if not patch.is_file():
        raise PatchError(f"patch {patch} does not exist",
                         fix="restore the file or remove it from the recipe")
    text = patch.read_bytes().decode("utf-8", "surrogateescape")
    found = refusals(text)
    if found:
        raise PatchError(f"patch {patch.name} is refused (line {found[0][0]}: {found[0][1]})",
                         why="a patch may not create symlinks or submodules, set special "
                             "modes, or name absolute or '..' paths",
                         fix="rewrite the patch as plain edits of files inside the tree")


def _apply_commit(repo: Path, patch: Path, recipe: Recipe) -> str:
    """One patch as one commit: ``git am`` for a mail (format-patch output), else
    ``git apply`` and a commit named after the file."""
    text = patch.read_bytes().decode("utf-8", "surrogateescape")
    if _PATCH_HEADER.match(text):
        result = git(["am", "--quiet", "--keep-cr", "--whitespace=nowarn",
                      str(patch.resolve())], repo, check=False)
        if result.returncode != 0:
            git(["am", "--abort"], repo, check=False)
    else:
        result = git(["apply", "--index", "--whitespace=nowarn", str(patch.resolve())], repo,
                     check=False)
        if result.returncode == 0:
            git(["commit", "--quiet", "--allow-empty", "-m",
                 patch.stem.split("-", 1)[-1].replace("-", " ")], repo)
    if result.returncode != 0:
        raise PatchError(f"patch {patch.name} does not apply to {recipe.name} "
                         f"{recipe.version}",
                         why=" ".join(result.output.split())[:600],
                         fix="the recipe's series must apply to its pinned source; run "
                             "'wheelforge check' and see README, 'Writing and refreshing a "
                             "patch'")
    return _out(["rev-parse", "HEAD"], repo)


def _commit_key(repo: Path, commit: str) -> str:
    """The identity of a commit's patch: author, date, message and exact diff."""
    head = git(["show", "-s", "--date=raw", "--format=%an%x00%ae%x00%ad%x00%B", commit],
               repo).output
    diff = git(["diff-tree", "-p", "--binary", "--full-index", "--no-commit-id", commit],
               repo).output
    return hashlib.sha256((head + "\0" + diff).encode("utf-8", "surrogateescape")).hexdigest()


def _state_path(repo: Path) -> Path:
    return repo / ".git" / STATE_FILE


def _write_state(repo: Path, state: dict[str, Any]) -> None:
    atomic_write(_state_path(repo), json.dumps(state, indent=1, sort_keys=True) + "\n")


_HEX64 = re.compile(r"[0-9a-f]{64}")


def read_state(repo: Path) -> dict[str, Any]:
    try:
        data = json.loads(_state_path(repo).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("recipe"), str):
            raise ValueError("not a wheelforge state")
    except RecursionError:
        raise ConfigError(f"{repo} is not a patch repository made by 'wheelforge patch start'",
                          why=f"{_state_path(repo)}: its JSON is nested too deep",
                          fix="run 'wheelforge patch NAME start' into a new directory") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{repo} is not a patch repository made by 'wheelforge patch start'",
                          why=f"{_state_path(repo)}: {exc}",
                          fix="run 'wheelforge patch NAME start' first, or pass --from the "
                              "directory it made") from None
    _check_entries(repo, data.get("patches", []))
    return data


def _check_entries(repo: Path, entries: object) -> None:
    """Each patch entry of the state names a bare file of the recipe's patches directory,
    with hex digests: a forged entry (``../``, an absolute path) would have export read
    and write files outside it."""
    problem = "patches is not a list" if not isinstance(entries, list) else next(
        (found for i, entry in enumerate(entries) if (found := _entry_problem(i, entry))), None)
    if problem:
        raise ConfigError(f"{_state_path(repo)} is not a state 'wheelforge patch start' wrote",
                          why=problem + " (a series' files are bare names in patches/NAME/)",
                          fix="do not edit .git/wheelforge.json; run 'wheelforge patch NAME "
                              "start' into a new directory and carry your commits over "
                              "(git cherry-pick)")


def _entry_problem(i: int, entry: object) -> str | None:
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                              for k in ("file", "sha256", "key")):
        return f"patch entry {i} is not a mapping of file, sha256 and key strings"
    if not _bare_patch_name(entry["file"]):
        return f"patch entry {i} names {entry['file'][:200]!r}, not a patch file name"
    if not (_HEX64.fullmatch(entry["sha256"]) and _HEX64.fullmatch(entry["key"])):
        return f"patch entry {i} ({entry['file']}) has a digest that is not 64 hex digits"
    return None


def _bare_patch_name(name: str) -> bool:
    return (name == os.path.basename(name) and name.endswith(".patch")
            and not name.startswith(".") and "\0" not in name and "\\" not in name)


def _busy(repo: Path) -> str | None:
    g = repo / ".git"
    for marker, what in (("rebase-apply", "a 'git am' or 'git rebase'"),
                         ("rebase-merge", "a 'git rebase'"), ("MERGE_HEAD", "a merge"),
                         ("CHERRY_PICK_HEAD", "a cherry-pick")):
        if (g / marker).exists():
            return what
    return None


def _require_clean(repo: Path, action: str) -> None:
    busy = _busy(repo)
    if busy:
        raise PatchError(f"{busy} is in progress in {repo}",
                         why=f"{action} works on finished commits only",
                         fix="finish it (resolve, git add, git rebase --continue or git am "
                             "--continue) or abort it (--abort), then run this again")
    status = _out(["status", "--porcelain", "--untracked-files=all"], repo)
    if status:
        first = status.splitlines()[0]
        raise PatchError(f"{repo} has changes that are not committed ({first.strip()} ...)",
                         why=f"{action} takes the commits after the '{TAG}' tag only; these "
                             "changes would be lost",
                         fix="commit them (git add -A && git commit), or discard them "
                             "(git stash, git checkout .)")


def slugify(subject: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")[:52].rstrip("-")
    return slug or "patch"


def export(repo: Path, recipe: Recipe, patches_dir: Path) -> Exported:
    """Write the commits after the ``upstream`` tag as ``recipe``'s patch series."""
    repo = Path(os.path.abspath(repo))
    state = read_state(repo)
    if state["recipe"] != recipe.name:
        raise ConfigError(f"{repo} holds the series of {state['recipe']}, not {recipe.name}",
                          fix=f"run 'wheelforge patch {state['recipe']} export --from {repo}'")
    _require_clean(repo, "export")
    if state.get("source") != recipe.sources[0].identity:
        raise PatchError(
            f"{repo} is based on {state.get('source')}, but the recipe pins "
            f"{recipe.sources[0].identity}",
            why="the series would be written for another source than the one it is applied "
                "to (after 'patch rebase', the recipe must pin the new upstream first)",
            fix="update the recipe's version and source pin to the new upstream (as "
                "'wheelforge patch rebase' printed), then export again")
    if _out(["rev-list", "--merges", f"{TAG}..HEAD"], repo):
        raise PatchError(f"the commits after '{TAG}' in {repo} hold a merge",
                         why="a patch series is a straight line of commits",
                         fix=f"rebase them into a line: git rebase {TAG}")
    commits = _out(["rev-list", "--reverse", f"{TAG}..HEAD"], repo).split()
    old_names = listed_patches(recipe.path.read_text(encoding="utf-8"))
    pdir = patches_dir / recipe.name
    known = {e["key"]: e for e in state.get("patches", [])
             if (pdir / e["file"]).is_file() and sha256_file(pdir / e["file"]) == e["sha256"]}
    old_slugs = {_subject_of_file(pdir / n): re.sub(r"^[0-9]+-", "", n)[:-len(".patch")]
                 for n in old_names if (pdir / n).is_file()}
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX) as tmp:
        out = Path(tmp) / "series"
        generated: list[Path] = []
        if commits:
            git(["format-patch", "--quiet", "--zero-commit", "--no-signature", "-o", str(out),
                 f"{TAG}..HEAD"], repo)
            generated = sorted(out.iterdir())
        if len(generated) != len(commits):
            raise PatchError(f"git format-patch wrote {len(generated)} files for "
                             f"{len(commits)} commits", fix="report this as a wheelforge bug")
        names, contents, keys, kept = [], [], [], []
        for i, (commit, file) in enumerate(zip(commits, generated, strict=True), start=1):
            key = _commit_key(repo, commit)
            subject = _out(["show", "-s", "--format=%s", commit], repo)
            entry = known.get(key)
            if entry is not None:
                data = (pdir / entry["file"]).read_bytes()
                slug = re.sub(r"^[0-9]+-", "", entry["file"])[:-len(".patch")]
            else:
                data = file.read_bytes()
                slug = old_slugs.get(subject) or slugify(subject)
            name = f"{i:04d}-{slug}.patch"
            if entry is not None and entry["file"] == name:
                kept.append(name)
            names.append(name)
            contents.append(data)
            keys.append(key)
        _check_series(repo, recipe, names, contents, Path(tmp))
    text = recipe.path.read_text(encoding="utf-8")
    new_text = set_patches(text, names, recipe.path) if names != old_names else text
    written = []
    for name, data in zip(names, contents, strict=True):
        target = pdir / name
        if not (target.is_file() and target.read_bytes() == data):
            atomic_write(target, data)
            written.append(name)
    if new_text != text:
        atomic_write(recipe.path, new_text)
    removed = []
    for old in old_names:
        if old not in names and (pdir / old).is_file():
            (pdir / old).unlink()
            removed.append(old)
    state["patches"] = [{"file": n, "sha256": hashlib.sha256(d).hexdigest(), "key": k}
                        for n, d, k in zip(names, contents, keys, strict=True)]
    _write_state(repo, state)
    return Exported(recipe_file=recipe.path, patches=tuple(names), written=tuple(written),
                    kept=tuple(n for n in kept if n not in written), removed=tuple(removed),
                    recipe_changed=new_text != text)


def _subject_of_file(patch: Path) -> str:
    """A format-patch file's subject, unfolded and without its [PATCH n/m] prefix."""
    lines = patch.read_text(encoding="utf-8", errors="replace").split("\n")
    for i, line in enumerate(lines[:40]):
        if line.startswith("Subject: "):
            subject = line[len("Subject: "):]
            for cont in lines[i + 1:]:
                if not cont.startswith((" ", "\t")):
                    break
                subject += cont
            return re.sub(r"^\[[^\]]*\]\s*", "", subject).strip()
    return ""


def _check_series(repo: Path, recipe: Recipe, names: list[str], contents: list[bytes],
                  tmp: Path) -> None:
    """Refuse what the build would refuse: each patch by the rules, then the series as
    apply_series applies it to the pristine tree."""
    problems = []
    for name, data in zip(names, contents, strict=True):
        problems += [f"{name}:{no}: {why}"
                     for no, why in refusals(data.decode("utf-8", "surrogateescape"))]
    if problems:
        raise PatchError(
            f"the series in {repo} breaks the patch rules ({len(problems)} problem(s)); "
            "nothing was written",
            why="a recipe's patch may not create or change symlinks or submodules, set a mode "
                "other than 100644/100755, or name an absolute path or '..':\n    "
                + "\n    ".join(problems),
            fix="change the commits that do it (git rebase -i upstream) into plain edits of "
                "files inside the tree, then export again")
    files = tmp / "check"
    files.mkdir()
    paths = []
    for name, data in zip(names, contents, strict=True):
        (files / name).write_bytes(data)
        paths.append(files / name)
    archive = tmp / "upstream.tar"
    git(["archive", "--format=tar", f"--prefix={recipe.name}/", "-o", str(archive), TAG], repo)
    tree = extract(archive, tmp / "tree", recipe.extract)
    apply_series(tree, paths, project=f"{recipe.name} {recipe.version}")


def rebase(repo: Path, recipe: Recipe, archive: Path, identity: str,
           version: str) -> Conflict | None:
    """Replay the series onto the new upstream tree of ``archive`` (verified by the
    caller against ``identity``).  None when every patch applied; else where it stopped:
    the repository is left mid-rebase for the maintainer to resolve."""
    repo = Path(os.path.abspath(repo))
    state = read_state(repo)
    if state["recipe"] != recipe.name:
        raise ConfigError(f"{repo} holds the series of {state['recipe']}, not {recipe.name}",
                          fix=f"run `wheelforge patch {state['recipe']} rebase` there, or pass "
                              f"--from the repository `wheelforge patch {recipe.name} start` "
                              "made")
    _require_clean(repo, "rebase")
    old = _out(["rev-parse", f"{TAG}^{{commit}}"], repo)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=repo.parent) as tmp:
        root = extract(archive, Path(tmp) / "src", recipe.extract)
        new = _commit_tree(repo, root, f"{recipe.name} {version}: the new upstream\n\n"
                           f"{identity}\n", old)
    git(["tag", f"{TAG}-{state.get('version', 'old')}", old], repo, check=False)
    git(["tag", "-f", TAG, new], repo)
    state.update(source=identity, version=version)
    _write_state(repo, state)
    result = git(["rebase", "--onto", new, old], repo, check=False)
    if result.returncode == 0:
        return None
    if not _busy(repo):
        raise PatchError(f"git rebase onto {version} failed in {repo}",
                         why=" ".join(result.output.split())[-600:],
                         fix="see git's message; 'git rebase --abort' returns to the old base")
    return _conflict(repo, state)


def _conflict(repo: Path, state: dict[str, Any]) -> Conflict:
    commit = _out(["rev-parse", "REBASE_HEAD"], repo)
    subject = _out(["show", "-s", "--format=%s", commit], repo)
    key = _commit_key(repo, commit)
    patch = next((e["file"] for e in state.get("patches", []) if e.get("key") == key),
                 "a commit added after start")
    places = []
    for path in _out(["diff", "--name-only", "--diff-filter=U"], repo).splitlines():
        lines = (repo / path).read_text(encoding="utf-8", errors="replace").split("\n") \
            if (repo / path).is_file() else []
        marks = [str(no) for no, ln in enumerate(lines, 1) if ln.startswith("<<<<<<< ")]
        places += [f"{path}:{m}" for m in marks] or [path]
    return Conflict(patch=patch, subject=subject, places=tuple(places))


__all__ = ["Conflict", "Exported", "Started", "default_dir", "export", "read_state", "rebase",
           "start"]
