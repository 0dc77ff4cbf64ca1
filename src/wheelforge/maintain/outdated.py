"""What upstream has beyond each recipe's pin, and whether the series still applies.

Releases come from the package index's PyPI JSON API (``INDEX/pypi/NAME/json``, one
request with a deadline); for a git source, the tags and the default branch from
``git ls-remote`` of the repository or of its configured mirror (with a mirror, the
commits after the pin are counted too).  For each newer release the series is tried in a
scratch directory: the release's sdist (or the tag's tree) is fetched and verified into
a temporary cache, extracted and patched with
:func:`~wheelforge.builder.source.patch.apply_series`.  The recipes, the patches and the cache of
pinned sources are never written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import _proc
from .._fs import TMP_PREFIX
from ..builder.source.fetch import (
    DownloadError,
    NetLimits,
    bare_name,
    check_url,
    extract,
    fetch,
    fetch_bytes,
    is_hex,
    mirror_for,
)
from ..builder.source.patch import apply_series
from ..errors import ConfigError, SourceError, WheelforgeError
from ..recipe.matrix import MAX_CANARY_TIMEOUT
from ..recipe.model import GitSource, Recipe, SdistSource, Source

Progress = Callable[[str], None]
#: the most an index's JSON document of one project may hold
MAX_JSON_BYTES = 32 << 20
#: the most a release's sdist may hold, and its deadline in request deadlines (--timeout)
MAX_SDIST_BYTES = 1 << 30
SDIST_DEADLINE_FACTOR = 10
#: the longest --timeout accepted (the canary's timeout: has the same bound)
MAX_TIMEOUT_S = MAX_CANARY_TIMEOUT
SLOW_INDEX_FIX = ("check the index URL and the network; a slow index needs a longer "
                  "deadline than {timeout:g} s (outdated --timeout, the canary's timeout: "
                  "in wheelforge.yaml)")
#: PEP 625: {normalized name}-{version}.tar.gz
_PEP625 = re.compile(r"(?P<name>[a-z0-9]+(?:_[a-z0-9]+)*)-(?P<version>[^-/\\\s]+)\.tar\.gz")


@dataclass(frozen=True, kw_only=True)
class Newer:
    """A release after the pin: where it was found, its source, and the series on it."""

    version: str
    found: str  # "index" or "tag NAME"
    source: str  # the identity of the source tried (sdist:FILE@sha256:HEX, git:URL@COMMIT)
    series: str  # "applies", "does not apply", "not checked", "no sdist", "fetch failed"
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Report:
    name: str
    pinned: str
    source: str
    newer: tuple[Newer, ...] = ()
    head: str | None = None  # git: the default branch's commit
    commits_after_pin: int | None = None  # git with a mirror: commits from the pin to head
    problems: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def rows(self) -> list[tuple[str, str, str, str]]:
        out: list[tuple[str, str, str, str]] = []
        for n in self.newer:
            out.append((self.name, self.pinned, f"{n.version} ({n.found})",
                        n.series + (f": {n.detail}" if n.detail else "")))
        if self.head is not None:
            ahead = ("" if self.commits_after_pin is None else
                     f", {self.commits_after_pin} commit(s) after the pin")
            out.append((self.name, self.pinned, f"HEAD {self.head[:12]}{ahead}", ""))
        for p in self.problems:
            out.append((self.name, self.pinned, "?", f"error: {p}"))
        if not out:
            out.append((self.name, self.pinned, "up to date", ""))
        return out


def check_recipes(recipes: Sequence[Recipe], *, index_url: str, timeout: float,
                  git_mirrors: Mapping[str, Path], try_patches: bool = True,
                  progress: Progress | None = None) -> list[Report]:
    say = progress or (lambda _m: None)
    return [check_recipe(r, index_url=index_url, timeout=timeout, git_mirrors=git_mirrors,
                         try_patches=try_patches, say=say) for r in recipes]


Candidate = tuple[Version, str, Source | None]  # a release, where found, its source


def releases(recipe: Recipe, *, index_url: str, timeout: float,
             git_mirrors: Mapping[str, Path], say: Progress
             ) -> tuple[list[Candidate], str | None, int | None, list[str]]:
    """The releases after the pin, oldest first, each with the source to try (None: the
    index has no sdist of it); the default branch's head and the commits after the pin
    (git); and the problems met (an unreachable index, a failed ls-remote)."""
    problems: list[str] = []
    candidates: list[Candidate] = []
    head = ahead = None
    git_src = next((s for s in recipe.sources if isinstance(s, GitSource)), None)
    if git_src is None or any(isinstance(s, SdistSource) for s in recipe.sources):
        say(f"{recipe.name}: asking {index_url}")
        try:
            listed, refused = index_releases(index_url, recipe.name, recipe.version, timeout)
            candidates += [(v, "index", s) for v, s in listed]
            problems += refused
        except WheelforgeError as exc:
            problems.append(problem_line(exc))
    if git_src is not None:
        say(f"{recipe.name}: listing {git_src.url}")
        try:
            head, ahead, tags = git_news(git_src, recipe.version, git_mirrors, timeout)
            seen = {v for v, _, _ in candidates}
            candidates += [(v, f"tag {t}", GitSource(url=git_src.url, commit=c, tag=t))
                           for v, t, c in tags if v not in seen]
        except WheelforgeError as exc:
            problems.append(problem_line(exc))
    return sorted(candidates, key=lambda c: c[0]), head, ahead, problems


def problem_line(exc: WheelforgeError) -> str:
    """One line for a report: what failed, why, and what to do."""
    return exc.what + (f" ({exc.why})" if exc.why else "") + (
        f"; fix: {exc.fix}" if exc.fix else "")


def check_recipe(recipe: Recipe, *, index_url: str, timeout: float,
                 git_mirrors: Mapping[str, Path], try_patches: bool, say: Progress) -> Report:
    src = recipe.sources[0]
    candidates, head, ahead, problems = releases(recipe, index_url=index_url, timeout=timeout,
                                                 git_mirrors=git_mirrors, say=say)
    newer = []
    for version, found, source in candidates:
        if source is None:
            refused = [x for x in problems if x.startswith(f"{version}: ")]
            problems = [x for x in problems if x not in refused]
            newer.append(Newer(version=str(version), found=found, source="",
                               series="no sdist", detail="; ".join(refused)
                               or "the release has no sdist"))
            continue
        series, detail = "not checked", ""
        if try_patches:
            say(f"{recipe.name}: trying the series on {version}")
            series, detail = try_series(recipe, version, source, git_mirrors, timeout)
        newer.append(Newer(version=str(version), found=found, source=source.identity,
                           series=series, detail=detail))
    return Report(name=recipe.name, pinned=str(recipe.version), source=src.identity,
                  newer=tuple(newer), head=head, commits_after_pin=ahead,
                  problems=tuple(problems))


def check_index_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; ConfigError (exit 2) saying why not."""
    problem = check_url(url)
    if problem:
        raise ConfigError(f"the index URL {url!r} cannot be used", why=problem,
                          fix="pass the root of an index with the PyPI JSON API, e.g. "
                              "--index-url https://pypi.org")
    return url


def check_timeout(seconds: float) -> float:
    """``seconds`` when it is a finite number above 0 and at most :data:`MAX_TIMEOUT_S`;
    ConfigError (exit 2) saying why not."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ConfigError(f"--timeout {seconds!r} is not a usable deadline",
                          why=f"it must be a number of seconds above 0 and at most "
                              f"{MAX_TIMEOUT_S:g}",
                          fix="pass e.g. --timeout 30")
    return seconds


def _get_json(url: str, timeout: float) -> Any:
    """The JSON document at ``url``, read whole within ``timeout`` seconds (every byte,
    not each read) and :data:`MAX_JSON_BYTES`."""
    limits = NetLimits(connect_timeout=timeout, stall_timeout=timeout, deadline=timeout,
                       retries=1, max_bytes=MAX_JSON_BYTES)
    try:
        data = fetch_bytes(url, limits, fix=SLOW_INDEX_FIX.format(timeout=timeout))
    except DownloadError as exc:
        if exc.status == 404:
            raise WheelforgeError(f"{url}: not on the index (HTTP 404)",
                                  fix="a project the index does not have has no releases "
                                      "to list") from None
        raise
    try:
        return json.loads(data)
    except ValueError as exc:
        raise WheelforgeError(f"{url}: not JSON", why=str(exc)) from None


def index_releases(index_url: str, name: str, pinned: Version, timeout: float
                   ) -> tuple[list[tuple[Version, SdistSource | None]], list[str]]:
    """The releases after ``pinned`` (no pre-releases unless the pin is one; none whose
    files are all yanked), each with its sdist when it has one the checks of
    :func:`sdist_of` accept; and why each sdist it refused was refused."""
    url = f"{check_index_url(index_url).rstrip('/')}/pypi/{urllib.parse.quote(name)}/json"
    doc = _get_json(url, timeout)
    releases = doc.get("releases") if isinstance(doc, dict) else None
    if not isinstance(releases, dict):
        raise WheelforgeError(f"{url}: no 'releases' mapping",
                              why="the index does not speak the PyPI JSON API",
                              fix="pass --index-url the root of an index that does "
                                  "(https://pypi.org)")
    out: list[tuple[Version, SdistSource | None]] = []
    refused: list[str] = []
    for raw, files in releases.items():
        try:
            version = Version(str(raw))
        except InvalidVersion:
            continue
        if version <= pinned or (version.is_prerelease and not pinned.is_prerelease):
            continue
        files = [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []
        if files and all(f.get("yanked") for f in files):
            continue
        sdist = None
        for f in files:
            if f.get("packagetype") != "sdist" or f.get("yanked"):
                continue
            found = sdist_of(name, version, f)
            if isinstance(found, str):
                refused.append(f"{version}: the index's sdist is refused: {found}")
                continue
            sdist = found
            break
        out.append((version, sdist))
    return out, refused


def sdist_of(name: str, version: Version, entry: Mapping[str, Any]) -> SdistSource | str:
    """The sdist an index's file entry describes, or why it is refused: its filename must
    be the bare PEP 625 name of ``name`` ``version`` (``{name}-{version}.tar.gz``, the
    name normalized), its sha256 64 hex digits, its URL http(s)."""
    filename, url = entry.get("filename"), entry.get("url")
    sha = (entry.get("digests") or {}).get("sha256") if isinstance(
        entry.get("digests"), dict) else None
    if not isinstance(filename, str) or not isinstance(url, str) or not isinstance(sha, str):
        return "it lacks a filename, a URL or a sha256"
    match = _PEP625.fullmatch(filename)
    want = str(canonicalize_name(name)).replace("-", "_")
    if not bare_name(filename) or match is None or match["name"] != want:
        return (f"{filename!r} is not a bare sdist file name ({want}-{version}.tar.gz, "
                "PEP 625)")
    try:
        if Version(match["version"]) != version:
            return f"{filename!r} is not a file of version {version}"
    except InvalidVersion:
        return f"{filename!r} does not name a version"
    if not is_hex(sha, 64):
        return f"the sha256 of {filename} is not 64 hex digits: {sha[:80]!r}"
    problem = check_url(url)
    if problem:
        return f"the URL of {filename} ({url[:200]!r}) is refused: {problem}"
    return SdistSource(filename=filename, sha256=sha.lower(), url=url)


def remote_refs(url: str, git_mirrors: Mapping[str, Path],
                timeout: float | None = None) -> dict[str, str]:
    """ref name -> commit (annotated tags peeled) of the repository or its mirror."""
    mirror = mirror_for(url, git_mirrors)
    where = str(mirror.resolve()) if mirror else url
    result = _git(["ls-remote", "--", where], local=mirror is not None, timeout=timeout)
    if result.returncode != 0:
        raise WheelforgeError(f"git ls-remote {where} failed",
                              why=" ".join(result.output.split())[-400:],
                              fix="check the URL or the --git-mirror mapping")
    refs: dict[str, str] = {}
    for line in result.output.splitlines():
        sha, _, ref = line.partition("\t")
        if ref.endswith("^{}"):
            refs[ref[:-3]] = sha
        else:
            refs.setdefault(ref, sha)
    return refs


def _git(args: list[str], *, local: bool, cwd: Path | None = None,
         timeout: float | None = None) -> _proc.Completed:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1")
    if local:
        env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_ALLOW_PROTOCOL="file")
    elif timeout is not None:  # a server that stops sending: git gives up, as a download does
        env.update(GIT_HTTP_LOW_SPEED_LIMIT="1",
                   GIT_HTTP_LOW_SPEED_TIME=str(max(1, round(timeout))))
    # past the timeout: exit status 124, and the output says so
    return _proc.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd, env=env,
                     check=False, timeout=timeout)


def git_news(src: GitSource, pinned: Version, git_mirrors: Mapping[str, Path],
             timeout: float) -> tuple[str | None, int | None, list[tuple[Version, str, str]]]:
    """The default branch's head, the commits from the pin to it (with a mirror), and
    the tags naming versions after ``pinned``."""
    refs = remote_refs(src.url, git_mirrors, timeout)
    head = refs.get("HEAD")
    tags = []
    for ref, commit in refs.items():
        if not ref.startswith("refs/tags/"):
            continue
        tag = ref[len("refs/tags/"):]
        try:
            version = Version(tag[1:] if tag[:1] in "vV" else tag)
        except InvalidVersion:
            continue
        if version > pinned and (not version.is_prerelease or pinned.is_prerelease):
            tags.append((version, tag, commit))
    ahead = None
    mirror = mirror_for(src.url, git_mirrors)
    if mirror is not None and head and head != src.commit:
        with tempfile.TemporaryDirectory(prefix=TMP_PREFIX) as tmp:
            fetched = _git(["clone", "--quiet", "--bare", "--no-tags", str(mirror.resolve()),
                            tmp + "/r.git"], local=True, timeout=timeout)
            if fetched.returncode == 0:
                count = _git(["rev-list", "--count", f"{src.commit}..{head}"], local=True,
                             cwd=Path(tmp) / "r.git", timeout=timeout)
                if count.returncode == 0 and count.output.strip().isdigit():
                    ahead = int(count.output.strip())
    elif head == src.commit:
        ahead = 0
    return head, ahead, sorted(tags)


def try_series(recipe: Recipe, version: Version, source: Source,
               git_mirrors: Mapping[str, Path], timeout: float) -> tuple[str, str]:
    """("applies" | "does not apply" | "fetch failed", detail): the series on ``source``,
    fetched into a scratch cache and patched in a scratch tree."""
    trial = dataclasses.replace(recipe, version=version, sources=(source,))
    limits = NetLimits(connect_timeout=timeout, stall_timeout=timeout, retries=1,
                       deadline=timeout * SDIST_DEADLINE_FACTOR, max_bytes=MAX_SDIST_BYTES)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX) as tmp:
        try:
            fetched = fetch(trial, Path(tmp) / "cache", (), limits=limits,
                            git_mirrors=git_mirrors)
            if not fetched.archive.resolve().is_relative_to(Path(tmp).resolve()):
                raise SourceError(f"{fetched.archive} is outside the scratch directory {tmp}")
            tree = extract(fetched.archive, Path(tmp) / "tree", recipe.extract)
        except WheelforgeError as exc:
            return "fetch failed", exc.what + (f": {exc.why}" if exc.why else "")
        if not recipe.patches:
            return "applies", "no patches"
        try:
            apply_series(tree, recipe.patches, project=f"{recipe.name} {version}")
        except WheelforgeError as exc:
            return "does not apply", exc.what
    return "applies", f"{len(recipe.patches)} patch(es)"
