"""Fetch a recipe's pinned source into a content-addressed cache, verified.

Sources are mirrors of one release, tried in order: the cache first, then any
``--sources`` directories, then the network.  Every candidate is verified (an
sdist by sha256, a git checkout by commit and tag); a mismatch is an error,
never a reason to try the next mirror.  Extraction (safe and bounded) is
:func:`wheelforge.archive.extract`, re-exported here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import _proc
from ._fs import TMP_PREFIX, atomic_copy, atomic_file, sha256_file
from .archive import extract
from .errors import SourceError
from .recipe import GitSource, Recipe, SdistSource, Source

Progress = Callable[[str], None]

__all__ = ["FetchedSource", "cache_path", "extract", "fetch"]


@dataclass(frozen=True)
class FetchedSource:
    source: Source
    archive: Path
    origin: str


def cache_path(cache_dir: Path, source: Source) -> Path:
    if isinstance(source, SdistSource):
        return cache_dir / "sources" / "sha256" / source.sha256 / source.filename
    return cache_dir / "sources" / "git" / f"{source.commit}.tar"


def _mismatch(what: str, expected: str, actual: str, origin: str) -> SourceError:
    return SourceError(
        f"{what} from {origin} does not match the recipe",
        why=f"expected sha256 {expected}, got {actual}",
        fix="the file was corrupted or replaced upstream; do not change the recipe's hash "
            "unless you have verified the new file independently",
    )


def fetch(
    recipe: Recipe,
    cache_dir: Path,
    sources_dirs: Sequence[Path] = (),
    progress: Progress | None = None,
) -> FetchedSource:
    """Return the verified archive for ``recipe``'s source, fetching it if needed."""
    say = progress or (lambda _m: None)
    for src in recipe.sources:
        cached = cache_path(cache_dir, src)
        if cached.is_file():
            if isinstance(src, SdistSource):
                actual = sha256_file(cached)
                if actual != src.sha256:
                    cached.unlink()
                    raise _mismatch(src.filename, src.sha256, actual, f"the cache ({cached})")
            return FetchedSource(src, cached, "cache")

    for src in recipe.sources:
        if not isinstance(src, SdistSource):
            continue
        for d in sources_dirs:
            candidate = d / src.filename
            if candidate.is_file():
                actual = sha256_file(candidate)
                if actual != src.sha256:
                    raise _mismatch(src.filename, src.sha256, actual, str(candidate))
                dest = cache_path(cache_dir, src)
                atomic_copy(candidate, dest)
                return FetchedSource(src, dest, str(candidate))

    attempts: list[str] = []
    for src in recipe.sources:
        try:
            if isinstance(src, SdistSource):
                if not src.url:
                    attempts.append(f"{src.filename}: no url in the recipe")
                    continue
                say(f"downloading {src.url}")
                return FetchedSource(src, _download(src, cache_dir), src.url)
            say(f"cloning {src.url} at {src.commit[:12]}")
            return FetchedSource(src, _git_archive(recipe, src, cache_dir), src.url)
        except _Unreachable as exc:
            attempts.append(str(exc))
    where = ", ".join(str(d) for d in sources_dirs) or "none given"
    files = [s.filename for s in recipe.sources if isinstance(s, SdistSource)]
    raise SourceError(
        f"no source of {recipe.name} {recipe.version} could be fetched",
        why="tried: " + "; ".join(attempts) + f"; --sources directories: {where}",
        fix=(f"put {' or '.join(files)} in a directory and pass --sources DIR" if files
             else "make the git repository reachable, or pre-fill the cache"),
    )


class _Unreachable(Exception):
    """A mirror could not be reached: the next one may be tried."""


def _download(src: SdistSource, cache_dir: Path) -> Path:
    """Download into the cache; the file appears under its final name only once verified."""
    assert src.url is not None
    dest = cache_path(cache_dir, src)
    h = hashlib.sha256()
    with atomic_file(dest) as out:
        try:
            with urllib.request.urlopen(src.url, timeout=60) as resp:  # noqa: S310
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise _Unreachable(f"{src.url}: {exc}") from exc
        if h.hexdigest() != src.sha256:
            raise _mismatch(src.filename, src.sha256, h.hexdigest(), src.url)
    return dest


def _git(args: list[str], cwd: Path | None = None) -> str:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return _proc.run(["git", *args], cwd=cwd, env=env).output.strip()


def _git_archive(recipe: Recipe, src: GitSource, cache_dir: Path) -> Path:
    dest = cache_path(cache_dir, src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=dest.parent) as tmp:
        repo = Path(tmp) / "repo"
        try:
            _git(["clone", "--quiet", "--no-checkout", src.url, str(repo)])
        except _proc.CommandFailed as exc:
            raise _Unreachable(f"{src.url}: git clone failed: {exc.tail.strip()}") from exc
        try:
            resolved = _git(["rev-parse", "--verify", "--quiet", f"{src.commit}^{{commit}}"], repo)
        except _proc.CommandFailed as exc:
            raise SourceError(
                f"commit {src.commit} of {recipe.name} is not in {src.url}",
                why="the pinned commit does not exist in the repository (force-pushed away, "
                    "or a typo in the recipe)",
                fix="check the commit id in the recipe against the upstream release",
            ) from exc
        if src.tag:
            try:
                tagged = _git(["rev-parse", "--verify", "--quiet",
                               f"refs/tags/{src.tag}^{{commit}}"], repo)
            except _proc.CommandFailed as exc:
                raise SourceError(f"tag {src.tag} of {recipe.name} is not in {src.url}",
                                  why="the recipe names a tag the repository does not have",
                                  fix="correct or remove 'tag' in the recipe") from exc
            if tagged != resolved:
                raise SourceError(
                    f"tag {src.tag} of {recipe.name} points at {tagged}, not at the pinned "
                    f"commit {resolved}",
                    why="the tag was moved upstream, or the recipe pins the wrong commit",
                    fix="verify which commit is the release and update the recipe deliberately",
                )
        out = Path(tmp) / "archive.tar"
        _git(["archive", "--format=tar", f"--prefix={recipe.name}-{src.commit[:12]}/",
              "-o", str(out), resolved], repo)
        os.replace(out, dest)
    return dest
