"""Fetch a recipe's pinned source into a content-addressed cache, verified.

Sources are mirrors of one release, tried in order: the cache first, then any
``--sources`` directories, then the network.  Every candidate is verified (an
sdist by sha256, a git checkout by commit and tag); a mismatch is an error,
never a reason to try the next mirror.  Extraction (safe and bounded) is
:func:`wheelforge.archive.extract`, re-exported here.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
    limits: NetLimits | None = None,
) -> FetchedSource:
    """Return the verified archive for ``recipe``'s source, fetching it if needed
    (downloads within ``limits``, by default :data:`DEFAULT_NET_LIMITS`)."""
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
                return FetchedSource(src, _download(src, cache_dir, limits or DEFAULT_NET_LIMITS),
                                     src.url)
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


@dataclass(frozen=True, kw_only=True)
class NetLimits:
    """Deadlines for a download.

    ``connect_timeout``: to open the connection (and finish TLS).  ``stall_timeout``
    and ``min_rate``: the transfer fails when no byte arrives for ``stall_timeout``
    seconds, or when fewer than ``min_rate`` bytes a second arrive on average over a
    ``stall_timeout`` window (a server that drips a byte every few seconds).
    ``deadline``: the whole download, every attempt and pause included.  A transient
    failure (refused, reset, timed out, stalled, truncated, HTTP 408, 425, 429, 500,
    502, 503, 504) is tried again up to ``retries`` times, after ``backoff`` seconds,
    doubling (or the server's Retry-After, when shorter than what is left).
    """

    connect_timeout: float = 15.0
    stall_timeout: float = 30.0
    min_rate: int = 1024
    deadline: float = 1800.0
    retries: int = 3
    backoff: float = 1.0


DEFAULT_NET_LIMITS = NetLimits()
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _Failed(Exception):
    """One attempt failed: ``transient`` says whether another may succeed."""

    def __init__(self, what: str, *, transient: bool, retry_after: float | None = None):
        super().__init__(what)
        self.transient = transient
        self.retry_after = retry_after


class _Sockets:
    """The socket of the current attempt, so that each read gets the time that is left."""

    sock: socket.socket | None = None


def _connection_classes(
    sockets: _Sockets, limits: NetLimits,
) -> tuple[type[http.client.HTTPConnection], type[http.client.HTTPSConnection]]:
    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()  # within self.timeout, the connect timeout
            assert self.sock is not None
            self.sock.settimeout(limits.stall_timeout)
            sockets.sock = self.sock

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()  # the TCP connect and the TLS handshake
            assert self.sock is not None
            self.sock.settimeout(limits.stall_timeout)
            sockets.sock = self.sock

    return Http, Https


def _opener(sockets: _Sockets, limits: NetLimits) -> urllib.request.OpenerDirector:
    http_class, https_class = _connection_classes(sockets, limits)
    context = ssl.create_default_context()

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(http_class, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(https_class, req, context=context)

    return urllib.request.build_opener(HttpHandler, HttpsHandler)  # proxies from the environment


def _attempt(url: str, out: BinaryIO, h: hashlib._Hash, limits: NetLimits,
             give_up_at: float) -> None:
    """One download of ``url`` into ``out``; raises :class:`_Failed`."""
    sockets = _Sockets()
    opener = _opener(sockets, limits)
    connect = min(limits.connect_timeout, max(0.1, give_up_at - time.monotonic()))
    try:
        resp = opener.open(urllib.request.Request(url, headers={"User-Agent": "wheelforge"}),
                           timeout=connect)
    except urllib.error.HTTPError as exc:
        retry_after = exc.headers.get("Retry-After", "") if exc.headers else ""
        raise _Failed(f"HTTP {exc.code} {exc.reason}", transient=exc.code in _TRANSIENT_STATUS,
                      retry_after=float(retry_after) if retry_after.isdigit() else None) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise _Failed(f"no connection within {limits.connect_timeout:g} s",
                          transient=True) from None
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise _Failed(f"TLS: {reason.verify_message}", transient=False) from None
        transient = isinstance(reason, OSError) and not isinstance(reason, socket.gaierror)
        raise _Failed(f"cannot connect: {getattr(reason, 'strerror', None) or reason}",
                      transient=transient) from None
    except TimeoutError:
        raise _Failed(f"no response within {limits.stall_timeout:g} s", transient=True) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _Failed(f"{type(exc).__name__}: {exc}", transient=True) from None
    got = 0
    window_start, window_got = time.monotonic(), 0
    with resp:
        while True:
            now = time.monotonic()
            if now >= give_up_at:
                raise _Failed(f"not complete within the deadline of {limits.deadline:g} s "
                              f"({got} bytes received)", transient=False)
            if sockets.sock is not None:
                sockets.sock.settimeout(min(limits.stall_timeout, give_up_at - now))
            try:
                chunk = resp.read1(1 << 20)
            except TimeoutError:
                if time.monotonic() >= give_up_at:
                    continue  # reported as the deadline above
                raise _Failed(f"stalled: no data for {limits.stall_timeout:g} s after {got} "
                              "bytes", transient=True) from None
            except (OSError, http.client.HTTPException) as exc:
                raise _Failed(f"transfer broken after {got} bytes: {exc or type(exc).__name__}",
                              transient=True) from None
            if not chunk:
                break
            h.update(chunk)
            out.write(chunk)
            got += len(chunk)
            window_got += len(chunk)
            now = time.monotonic()
            if now - window_start >= limits.stall_timeout:
                rate = window_got / (now - window_start)
                if rate < limits.min_rate:
                    raise _Failed(f"stalled: {window_got} bytes in {now - window_start:.0f} s "
                                  f"({rate:.0f} B/s, the minimum is {limits.min_rate} B/s)",
                                  transient=True)
                window_start, window_got = now, 0
        length = resp.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) != got:
            raise _Failed(f"truncated: {got} of {length} bytes", transient=True)


def _download(src: SdistSource, cache_dir: Path, limits: NetLimits = DEFAULT_NET_LIMITS) -> Path:
    """Download into the cache; the file appears under its final name only once verified.

    Within ``limits``: a connect timeout, a stall timeout and minimum rate, an overall
    deadline, retries with backoff for transient failures.
    """
    assert src.url is not None
    dest = cache_path(cache_dir, src)
    give_up_at = time.monotonic() + limits.deadline
    pause = limits.backoff
    failures: list[str] = []
    for attempt in range(limits.retries + 1):
        h = hashlib.sha256()
        try:
            with atomic_file(dest) as out:
                _attempt(src.url, out, h, limits, give_up_at)
                if h.hexdigest() != src.sha256:
                    raise _mismatch(src.filename, src.sha256, h.hexdigest(), src.url)
            return dest
        except _Failed as exc:
            failures.append(str(exc))
            left = give_up_at - time.monotonic()
            if exc.retry_after is not None and exc.retry_after < left:
                pause = max(pause, exc.retry_after)
            if not exc.transient or attempt == limits.retries or pause >= left:
                break
            time.sleep(pause)
            pause *= 2
    tries = len(failures)
    history = failures[-1] if len(set(failures)) == 1 else "; ".join(
        f"attempt {i}: {f}" for i, f in enumerate(failures, 1))
    raise _Unreachable(f"{src.url}: {history}" + (f" ({tries} attempts)" if tries > 1 else ""))


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
