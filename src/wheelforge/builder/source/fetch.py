"""Fetch a recipe's pinned source into a content-addressed cache, verified.

Sources are mirrors of one release, tried in order: the cache first, then any
``--sources`` directories, then the network.  Every candidate is verified (an
sdist by sha256, a git checkout by commit and tag); a mismatch is an error,
never a reason to try the next mirror.  Extraction (safe and bounded) is
:func:`wheelforge.builder.source.archive.extract`, re-exported here.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import os
import socket
import ssl
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from ... import _proc
from ..._fs import TMP_PREFIX, atomic_copy, atomic_file, atomic_write, discard, sha256_file
from ...errors import SourceError
from ...recipe.model import GitSource, Recipe, SdistSource, Source
from .archive import extract

Progress = Callable[[str], None]

__all__ = ["DownloadError", "FetchedSource", "NetLimits", "cache_path", "check_url",
           "extract", "fetch", "fetch_bytes"]

#: the only URL schemes wheelforge downloads from (never file://, ftp:// or data:)
SCHEMES = ("http", "https")


@dataclass(frozen=True)
class FetchedSource:
    source: Source
    archive: Path
    origin: str


def cache_path(cache_dir: Path, source: Source) -> Path:
    """Where the cache keeps ``source``: always inside ``cache_dir`` (SourceError for a
    file name that is not one bare name, or a hash or commit that is not hex: a source
    from an index's JSON is not trusted to name a path)."""
    if isinstance(source, SdistSource):
        name, sha = source.filename, source.sha256
        if not bare_name(name):
            raise SourceError(f"the source file name {name!r} is not a bare file name",
                              why="it holds a path separator, '..' or a control character",
                              fix="a source is named by its file name alone "
                                  "(NAME-VERSION.tar.gz)")
        if not is_hex(sha, 64):
            raise SourceError(f"the sha256 {sha!r} of {name} is not 64 hex digits",
                              fix="give the file's sha256 (sha256sum FILE)")
        path = cache_dir / "sources" / "sha256" / sha / name
        if not Path(os.path.normpath(path)).is_relative_to(os.path.normpath(cache_dir)):
            raise SourceError(f"{name} would land outside the cache {cache_dir}")
        return path
    if not is_hex(source.commit, 40) and not is_hex(source.commit, 64):
        raise SourceError(f"the commit {source.commit!r} is not a full commit id",
                          fix="pin the full 40-hex commit")
    return cache_dir / "sources" / "git" / f"{source.commit}.tar"


def bare_name(name: str) -> bool:
    """``name`` is one path component: no separator, not ``.``/``..``, no control
    character, not empty."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and all(ch.isprintable() for ch in name))


def is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text.lower())


def manifest_path(archive: Path) -> Path:
    """Beside a cached git archive: the raw commit object and the submodule entries, from
    which the archive is re-verified on every use (see :func:`verify_git_archive`)."""
    return archive.with_suffix(".json")


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
    git_mirrors: Mapping[str, Path] | None = None,
) -> FetchedSource:
    """Return the verified archive for ``recipe``'s source, fetching it if needed
    (downloads within ``limits``, by default :data:`DEFAULT_NET_LIMITS`).

    ``git_mirrors`` maps git URLs to local mirrors (a bundle file or a repository);
    a git source whose URL is mapped is fetched from the mirror only, never the network.
    """
    say = progress or (lambda _m: None)
    for src in recipe.sources:
        cached = cache_path(cache_dir, src)
        if cached.is_file():
            if isinstance(src, SdistSource):
                actual = sha256_file(cached)
                if actual != src.sha256:
                    cached.unlink()
                    raise _mismatch(src.filename, src.sha256, actual, f"the cache ({cached})")
            else:
                problem = verify_git_archive(cached, src.commit)
                if problem:
                    # heal: drop what the cache holds for this commit and fetch it again
                    say(f"WARN cached archive of {src.commit[:12]} failed verification "
                        f"({problem}); removed, fetching again")
                    discard(cached)
                    discard(manifest_path(cached))
                    continue
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
            mirror = mirror_for(src.url, git_mirrors or {})
            origin = f"{mirror} (mirror of {src.url})" if mirror else src.url
            say(f"fetching {origin} at {src.commit[:12]}")
            return FetchedSource(src, _git_archive(recipe, src, cache_dir, mirror,
                                                   limits or DEFAULT_NET_LIMITS), origin)
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
    ``deadline``: the whole download, every attempt and pause included.  ``max_bytes``:
    the most a response may hold (a server that never stops sending).  A transient
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
    max_bytes: int = 4 << 30


DEFAULT_NET_LIMITS = NetLimits()
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _Failed(Exception):
    """One attempt failed: ``transient`` says whether another may succeed."""

    def __init__(self, what: str, *, transient: bool, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(what)
        self.transient = transient
        self.retry_after = retry_after
        self.status = status


class DownloadError(SourceError):
    """:func:`fetch_bytes` could not read a URL; ``status`` is the HTTP status when the
    server answered with an error."""

    status: int | None = None


def check_url(url: str) -> str | None:
    """None when ``url`` is an http(s) URL with a host, else what is wrong with it."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError as exc:
        return f"it is not a URL ({exc})"
    if parts.scheme.lower() not in SCHEMES:
        return (f"its scheme is {parts.scheme + '://' if parts.scheme else 'missing'}; "
                "only http:// and https:// URLs are followed")
    if not parts.hostname:
        return "it names no host"
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        return "it holds white space or a control character"
    return None


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are followed to http(s) URLs only: a server cannot send the download to
    file:///dev/zero or to ftp://."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: http.client.HTTPMessage, newurl: str
                         ) -> urllib.request.Request | None:
        problem = check_url(urllib.parse.urljoin(req.full_url, newurl))
        if problem:
            raise _Failed(f"HTTP {code} redirect to {newurl!r} refused: {problem}",
                          transient=False)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Sockets:
    """The socket of the current attempt, so that each read gets the time that is left,
    and so that the deadline can cut it wherever the attempt waits (a server dripping its
    status line and headers never trips a per-read timeout)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.cut = False
        self._lock = threading.Lock()

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self.sock = sock
            if self.cut:
                self._shutdown()

    def cut_now(self) -> None:
        with self._lock:
            self.cut = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)


def _connection_classes(
    sockets: _Sockets, limits: NetLimits,
) -> tuple[type[http.client.HTTPConnection], type[http.client.HTTPSConnection]]:
    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()  # within self.timeout, the connect timeout
            assert self.sock is not None
            self.sock.settimeout(limits.stall_timeout)
            sockets.opened(self.sock)

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()  # the TCP connect and the TLS handshake
            assert self.sock is not None
            self.sock.settimeout(limits.stall_timeout)
            sockets.opened(self.sock)

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

    # no FileHandler, FTPHandler or DataHandler: only http(s) is ever opened
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), _HttpOnlyRedirects(),
                    urllib.request.HTTPErrorProcessor(), HttpHandler(), HttpsHandler()):
        opener.add_handler(handler)  # proxies from the environment
    return opener


def _attempt(url: str, out: BinaryIO, h: hashlib._Hash, limits: NetLimits,
             give_up_at: float) -> None:
    """One download of ``url`` into ``out``; raises :class:`_Failed`.  A timer cuts the
    connection at ``give_up_at``, whatever the attempt is waiting for."""
    problem = check_url(url)
    if problem:
        raise _Failed(f"refused: {problem}", transient=False)
    sockets = _Sockets()
    timer = threading.Timer(max(0.0, give_up_at - time.monotonic()), sockets.cut_now)
    timer.daemon = True
    timer.start()
    try:
        _attempt_on(url, out, h, limits, give_up_at, sockets)
    except _Failed:
        if not sockets.cut:
            raise
    finally:
        timer.cancel()
    if sockets.cut:
        raise _Failed(f"not complete within the deadline of {limits.deadline:g} s",
                      transient=False)


def _attempt_on(url: str, out: BinaryIO, h: hashlib._Hash, limits: NetLimits,
                give_up_at: float, sockets: _Sockets) -> None:
    opener = _opener(sockets, limits)
    connect = min(limits.connect_timeout, max(0.1, give_up_at - time.monotonic()))
    try:
        resp = opener.open(urllib.request.Request(url, headers={"User-Agent": "wheelforge"}),
                           timeout=connect)
    except urllib.error.HTTPError as exc:
        retry_after = exc.headers.get("Retry-After", "") if exc.headers else ""
        raise _Failed(f"HTTP {exc.code} {exc.reason}", transient=exc.code in _TRANSIENT_STATUS,
                      retry_after=float(retry_after) if retry_after.isdigit() else None,
                      status=exc.code) from None
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
        declared = resp.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
            raise _Failed(f"larger than the limit of {limits.max_bytes} bytes ({declared} "
                          "declared)", transient=False)
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
            if got + len(chunk) > limits.max_bytes:
                raise _Failed(f"larger than the limit of {limits.max_bytes} bytes",
                              transient=False)
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


def fetch_bytes(url: str, limits: NetLimits, *, fix: str) -> bytes:
    """The body of ``url`` (http(s) only; redirects too), read whole within ``limits``:
    the overall ``deadline``, ``max_bytes``, the stall and rate limits, ``retries`` for a
    transient failure.  DownloadError (``fix``: what to do) naming the URL and why."""
    give_up_at = time.monotonic() + limits.deadline
    pause = limits.backoff
    for attempt in range(limits.retries + 1):
        out = io.BytesIO()
        try:
            _attempt(url, out, hashlib.sha256(), limits, give_up_at)
            return out.getvalue()
        except _Failed as exc:
            left = give_up_at - time.monotonic()
            if not exc.transient or attempt == limits.retries or pause >= left:
                err = DownloadError(f"{url}: cannot be read", why=str(exc), fix=fix)
                err.status = exc.status
                raise err from None
            _proc.pause(pause)
            pause *= 2
    raise AssertionError("unreachable")  # pragma: no cover


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
            _proc.pause(pause)  # Ctrl-C (or --timeout) ends the back-off at once
            pause *= 2
    tries = len(failures)
    history = failures[-1] if len(set(failures)) == 1 else "; ".join(
        f"attempt {i}: {f}" for i, f in enumerate(failures, 1))
    raise _Unreachable(f"{src.url}: {history}" + (f" ({tries} attempts)" if tries > 1 else ""))


def normalize_git_url(url: str) -> str:
    """The form mirror mappings are matched in: no trailing ``/`` or ``.git``."""
    url = url.strip().rstrip("/")
    return url[:-4] if url.endswith(".git") else url


def mirror_for(url: str, mirrors: Mapping[str, Path]) -> Path | None:
    """The local mirror mapped to ``url`` (an exact match after normalizing), if any."""
    want = normalize_git_url(url)
    for base, path in mirrors.items():
        if normalize_git_url(base) == want:
            return path
    return None


#: Configuration for every git command: nothing from the system config, no hooks, no
#: submodules, every received object checked, no credential prompt.
_GIT_CONFIG = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "transfer.fsckObjects=true",
               "fetch.recurseSubmodules=false", "submodule.recurse=false",
               "protocol.ext.allow=never", "credential.interactive=never")


_GIT_REMOTE_ENV = ("GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "GIT_CONFIG_GLOBAL")


def _git(args: list[str], cwd: Path | None = None, *, local_only: bool = False,
         strip: bool = True, limits: NetLimits | None = None) -> str:
    # no GIT_DIR, GIT_OBJECT_DIRECTORY, GIT_TEMPLATE_DIR, ... from the caller; only what
    # says how to reach a remote (ssh, askpass, the user's config file) is kept
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") or (k in _GIT_REMOTE_ENV and not local_only)}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_CONFIG_NOSYSTEM="1")
    if local_only:
        # a mirror is bytes on disk: the user's config (insteadOf, proxies, ...) is not
        # read, and no transport but a local file may be used
        env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_ALLOW_PROTOCOL="file")
    elif limits is not None:
        # git over http(s) gives up, as a download does, on a transfer slower than
        # min_rate bytes a second for stall_timeout seconds (a server that stops sending)
        env.update(GIT_HTTP_LOW_SPEED_LIMIT=str(max(1, limits.min_rate)),
                   GIT_HTTP_LOW_SPEED_TIME=str(max(1, round(limits.stall_timeout))))
    config = [a for c in _GIT_CONFIG for a in ("-c", c)]
    out = _proc.run(["git", *config, *args], cwd=cwd, env=env).output
    return out.strip() if strip else out


def _resolve(repo: Path, rev: str, local_only: bool) -> str | None:
    try:
        return _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo,
                    local_only=local_only)
    except _proc.CommandFailed:
        return None


def _git_archive(recipe: Recipe, src: GitSource, cache_dir: Path,
                 mirror: Path | None = None, limits: NetLimits | None = None) -> Path:
    """Fetch ``src`` (from ``mirror`` when given) into a fresh bare repository, verify the
    commit and its tags, and write the commit's archive and manifest into the cache."""
    dest = cache_path(cache_dir, src)
    dest.parent.mkdir(parents=True, exist_ok=True)
    where = f"{mirror} (mirror of {src.url})" if mirror else src.url
    if mirror is not None and not mirror.exists():
        raise SourceError(
            f"the git mirror {mirror} of {src.url} does not exist",
            why="a mirror is configured for this URL (--git-mirror, WHEELFORGE_GIT_MIRRORS or "
                "git-mirrors in wheelforge.yaml), so the network is not tried",
            fix="correct the mirror's path, or remove the mapping to fetch from the URL")
    local = mirror is not None
    remote = str(mirror.resolve()) if mirror else src.url
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=dest.parent) as tmp:
        repo = Path(tmp) / "repo.git"
        template = Path(tmp) / "template"  # empty: no sample hooks, no info/exclude
        template.mkdir()
        try:
            _git(["init", "--quiet", "--bare", f"--template={template}", str(repo)],
                 local_only=True)
            _git(["fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
                  "--no-write-fetch-head", "--", remote,
                  "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"],
                 repo, local_only=local, limits=limits)
        except _proc.CommandFailed as exc:
            if local:
                raise SourceError(f"cannot fetch from the git mirror {mirror}",
                                  why=exc.tail.strip()[-600:],
                                  fix="the mirror must be a git bundle or a git repository "
                                      f"holding {src.commit}") from exc
            raise _Unreachable(f"{src.url}: git fetch failed: {exc.tail.strip()}") from exc
        resolved = _resolve(repo, src.commit, local)
        if resolved != src.commit:
            raise SourceError(
                f"commit {src.commit} of {recipe.name} is not in {where}",
                why="the pinned commit does not exist in the repository (force-pushed away, "
                    "a mirror of another repository, or a typo in the recipe)",
                fix="check the commit id in the recipe against the upstream repository")
        _check_tags(recipe, src, repo, where, local)
        # $GIT_DIR/info/attributes overrides the tree's .gitattributes: the archive holds
        # the commit's bytes, never export-subst substitutions or export-ignore omissions
        (repo / "info").mkdir(exist_ok=True)
        (repo / "info" / "attributes").write_text("* -export-subst -export-ignore\n")
        out = Path(tmp) / "archive.tar"
        _git(["archive", "--format=tar", f"--prefix={archive_prefix(recipe, src)}",
              "-o", str(out), resolved], repo, local_only=True)
        raw_commit = _git(["cat-file", "commit", resolved], repo, local_only=True, strip=False)
        tree = _git(["rev-parse", f"{resolved}^{{tree}}"], repo, local_only=True)
        gitlinks = {}
        for line in _git(["ls-tree", "-r", "-z", "--full-tree", resolved], repo,
                         local_only=True).split("\0"):
            meta, _, path = line.partition("\t")
            if meta.startswith("160000 "):
                gitlinks[path] = meta.split()[2]
        # the commit object's bytes tie the tree to the pinned commit id; one that does not
        # survive a text round trip (not UTF-8) is left out and the tree id recorded instead
        manifest = {"commit": src.commit, "tree": tree, "gitlinks": gitlinks,
                    "object": (raw_commit if _git_object_id("commit", raw_commit.encode())
                               == src.commit else None)}
        atomic_write(manifest_path(dest), json.dumps(manifest, indent=1, sort_keys=True))
        problem = verify_git_archive(out, src.commit, manifest_path(dest))
        if problem:
            raise SourceError(f"git archive of {src.commit[:12]} does not reproduce its tree",
                              why=problem, fix="report this as a wheelforge bug")
        os.replace(out, dest)
    return dest


def archive_prefix(recipe: Recipe, src: GitSource) -> str:
    return f"{recipe.name}-{src.commit[:12]}/"


def _check_tags(recipe: Recipe, src: GitSource, repo: Path, where: str, local: bool) -> None:
    """``tag`` must name the commit; ``release-tag`` must name ``release-commit``, an
    ancestor of the commit."""
    if src.tag:
        tagged = _resolve(repo, f"refs/tags/{src.tag}", local)
        if tagged is None:
            raise SourceError(f"tag {src.tag} of {recipe.name} is not in {where}",
                              why="the recipe names a tag the repository does not have",
                              fix="correct or remove 'tag' in the recipe")
        if tagged != src.commit:
            raise SourceError(
                f"tag {src.tag} of {recipe.name} points at {tagged}, not at the pinned "
                f"commit {src.commit}",
                why="the tag was moved upstream, or the recipe pins the wrong commit",
                fix="verify which commit is the release and update the recipe deliberately")
    if src.release_tag:
        tagged = _resolve(repo, f"refs/tags/{src.release_tag}", local)
        if tagged is None:
            raise SourceError(f"release tag {src.release_tag} of {recipe.name} is not in {where}",
                              why="the recipe says the commit descends from a tag the "
                                  "repository does not have",
                              fix="correct 'release-tag' in the recipe, or use a mirror that "
                                  "holds the tags")
        if tagged != src.release_commit:
            raise SourceError(
                f"release tag {src.release_tag} of {recipe.name} points at {tagged}, not at "
                f"{src.release_commit} (release-commit in the recipe)",
                why="the tag was moved upstream, or the recipe records the wrong release",
                fix="verify which commit is the release and update the recipe deliberately")
        try:
            _git(["merge-base", "--is-ancestor", tagged, src.commit], repo, local_only=local)
        except _proc.CommandFailed as exc:
            raise SourceError(
                f"commit {src.commit[:12]} of {recipe.name} does not descend from its release "
                f"tag {src.release_tag} ({tagged[:12]})",
                why="the pinned commit is not in the release's history: its version would "
                    "claim a release it does not contain",
                fix="pin a commit on the branch after the release, or record the release it "
                    "really descends from") from exc


def _git_object_id(kind: str, data: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data,
                        usedforsecurity=False).hexdigest()


def verify_git_archive(archive: Path, commit: str, manifest: Path | None = None) -> str | None:
    """Re-derive the git tree of a cached archive and compare it with the pinned commit's.

    The manifest beside the archive holds the raw commit object (its hash must be the
    pinned commit, so it cannot be swapped) and the submodule entries the archive cannot
    hold.  Every file's blob id, mode and path are recomputed from the archive, the tree
    ids built from them, and the root must be the commit's tree.  Returns None when the
    archive is the commit's tree, else what differs.
    """
    manifest = manifest or manifest_path(archive)
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        obj = data.get("object")
        want_tree = str(data["tree"])
        gitlinks = {str(k): str(v) for k, v in dict(data.get("gitlinks") or {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"its manifest {manifest.name} is missing or unreadable ({exc})"
    if obj is not None:
        raw = str(obj).encode()
        if _git_object_id("commit", raw) != commit:
            return "its manifest's commit object is not the pinned commit"
        if not raw.startswith(f"tree {want_tree}\n".encode()):
            return "its manifest's tree is not the tree of the pinned commit"
    entries: dict[str, tuple[str, str]] = {p: ("160000", sha) for p, sha in gitlinks.items()}
    dirs: set[str] = set()
    try:
        with tarfile.open(archive) as tf:
            prefix = None
            for m in tf:
                if m.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                    continue
                top, _, rel = m.name.rstrip("/").partition("/")
                prefix = prefix or top
                if top != prefix:
                    return f"member {m.name!r} is outside the archive's single directory"
                if not rel:
                    continue
                if m.isdir():
                    dirs.add(rel)
                elif m.isreg():
                    f = tf.extractfile(m)
                    assert f is not None
                    h = hashlib.sha1(f"blob {m.size}\0".encode(), usedforsecurity=False)
                    for chunk in iter(lambda: f.read(1 << 20), b""):  # noqa: B023
                        h.update(chunk)
                    mode = "100755" if m.mode & 0o100 else "100644"
                    entries[rel] = (mode, h.hexdigest())
                elif m.issym():
                    entries[rel] = ("120000", _git_object_id("blob", m.linkname.encode()))
                else:
                    return f"member {m.name!r} is neither a file, a directory nor a link"
    except (tarfile.TarError, OSError, EOFError) as exc:
        return f"the archive cannot be read ({exc})"
    tree = _tree_id(entries, dirs - set(gitlinks))
    if tree is None:
        return "it holds an empty directory the commit does not have"
    if tree != want_tree:
        return f"its files hash to tree {tree}, the commit's tree is {want_tree}"
    return None


def _tree_id(entries: Mapping[str, tuple[str, str]], dirs: set[str]) -> str | None:
    """The git tree id of ``entries`` (path -> (mode, object id)); None if a directory in
    ``dirs`` holds nothing (git trees have no empty directories)."""
    root: dict[str, object] = {}
    for path, (mode, sha) in entries.items():
        node = root
        *parents, name = path.split("/")
        for part in parents:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[name] = (mode, sha)
    for d in dirs:
        node = root
        for part in d.split("/"):
            child = node.get(part)
            if not isinstance(child, dict):
                return None
            node = child

    def build(node: Mapping[str, object]) -> str:
        items = []
        for name, value in node.items():
            if isinstance(value, dict):
                items.append((name + "/", b"40000 " + name.encode() + b"\0" +
                              bytes.fromhex(build(value))))
            else:
                assert isinstance(value, tuple)
                mode, sha = value
                items.append((name, f"{mode} ".encode() + name.encode() + b"\0" +
                              bytes.fromhex(sha)))
        items.sort(key=lambda kv: kv[0].encode())
        return _git_object_id("tree", b"".join(data for _, data in items))

    return build(root)


def iter_git_mirrors(text: str) -> Iterator[tuple[str, str]]:
    """Parse ``URL=PATH`` entries separated by ``;`` or newlines (WHEELFORGE_GIT_MIRRORS)."""
    for part in text.replace("\n", ";").split(";"):
        part = part.strip()
        if part:
            url, sep, path = part.partition("=")
            yield url.strip(), (path.strip() if sep else "")


