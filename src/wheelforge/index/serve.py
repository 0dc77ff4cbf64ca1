"""A read-only HTTP server for the index: PEP 691 content negotiation, nothing hidden
or outside the root served; an asyncio server with a listen backlog, bounded
connections, keep-alive and one timeout for idle and slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import http
import ipaddress
import os
import resource
import socket
import sys
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

from packaging.utils import (
    canonicalize_name,
)

from ..errors import ConfigError, IndexWarning, PublishError
from .records import (
    _WRITING,
    CACHE_DIR,
    HTML_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    METADATA_SUFFIX,
    SIDECAR_SUFFIX,
    SIMPLE_DIR,
)
from .recovery import repair

# --------------------------------------------------------------------------- HTTP server

_NEGOTIABLE = {
    JSON_CONTENT_TYPE: JSON_CONTENT_TYPE,
    "application/vnd.pypi.simple.latest+json": JSON_CONTENT_TYPE,
    HTML_CONTENT_TYPE: HTML_CONTENT_TYPE,
    "application/vnd.pypi.simple.latest+html": HTML_CONTENT_TYPE,
    "text/html": "text/html; charset=utf-8",
    "text/*": "text/html; charset=utf-8",
    "*/*": "text/html; charset=utf-8",
}
_FILE_TYPES = {
    ".whl": "application/octet-stream",
    METADATA_SUFFIX: "application/octet-stream",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".log": "text/plain; charset=utf-8",  # the build logs beside the nightly reports
    ".txt": "text/plain; charset=utf-8",  # constraints.txt
}


def _negotiate(accept: str | None) -> str | None:
    """The Content-Type to answer with for a simple page, or None (406)."""
    if accept is None or not accept.strip():
        return "text/html; charset=utf-8"
    best, best_q = None, 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        content_type = _NEGOTIABLE.get(media.strip().lower())
        if content_type is None:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if q > best_q:
            best, best_q = content_type, q
    return best


@dataclass(frozen=True)
class _Route:
    status: int
    file: str | None = None
    content_type: str | None = None
    location: str | None = None
    vary: bool = False


def _inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(root: str, real: str) -> bool:
    rel = os.path.relpath(real, root)
    parts = [] if rel == "." else rel.split(os.sep)
    return any(p.startswith(".") or p.endswith(SIDECAR_SUFFIX) for p in parts)


def _route(root: str, raw: str, accept: str | None) -> _Route:
    """Map a request target to a file under ``root`` (a real path), or an error.

    Refuses '.' and '..' segments (also percent-encoded), encoded '/' or '\\',
    NUL bytes, empty segments, hidden names (.lock, .records, temp files),
    sidecars, and anything whose real path leaves the root.
    """
    if not raw.startswith("/") or "\x00" in raw:
        return _Route(404)
    path, _, query = raw.partition("#")[0].partition("?")
    trailing = path.endswith("/")
    segments = path[1:].split("/")
    if trailing:
        segments.pop()
    parts: list[str] = []
    for segment in segments:
        try:
            part = urllib.parse.unquote(segment, errors="strict")
        except UnicodeDecodeError:
            return _Route(404)
        if part in ("", ".", "..") or any(c in part for c in "/\\\x00") or part.startswith("."):
            return _Route(404)
        parts.append(part)
    if parts and parts[-1].endswith(SIDECAR_SUFFIX):
        return _Route(404)
    project_url = (len(parts) == 2 and parts[0] == SIMPLE_DIR) or (
        len(parts) == 3 and parts[1] == SIMPLE_DIR
    )
    if project_url and parts[-1] not in ("index.html", "index.json"):
        normalized = canonicalize_name(parts[-1])
        if normalized != parts[-1] or not trailing:
            location = "/" + "/".join(urllib.parse.quote(p) for p in [*parts[:-1], normalized])
            location += "/"
            return _Route(301, location=location + ("?" + query if query else ""))
    real = os.path.realpath(os.path.join(root, *parts))
    if not _inside(root, real):
        return _Route(403)
    if _hidden(root, real):
        return _Route(404)
    if os.path.isdir(real):
        if not trailing and parts:
            location = "/" + "/".join(urllib.parse.quote(p) for p in parts) + "/"
            return _Route(301, location=location + ("?" + query if query else ""))
        html_page, json_page = os.path.join(real, "index.html"), os.path.join(real, "index.json")
        if os.path.isfile(json_page):
            content_type = _negotiate(accept)
            if content_type is None:
                return _Route(406, vary=True)
            chosen = json_page if content_type == JSON_CONTENT_TYPE else html_page
            vary = True
        else:
            content_type, chosen, vary = "text/html; charset=utf-8", html_page, False
        chosen = os.path.realpath(chosen)
        if not _inside(root, chosen):
            return _Route(403)
        if not os.path.isfile(chosen) or _hidden(root, chosen):
            return _Route(404)
        return _Route(200, file=chosen, content_type=content_type, vary=vary)
    if trailing or not os.path.isfile(real):
        return _Route(404)
    suffix = os.path.splitext(real)[1]
    return _Route(200, file=real, content_type=_FILE_TYPES.get(suffix, "application/octet-stream"))


# --------------------------------------------------------------------------- the server
#
# One asyncio event loop reads every connection, so a client that is slow, idle or
# malicious costs a socket and a few kilobytes, never a thread.  Requests are small
# (GET and HEAD, no body) and the pages are files, so one thread answers thousands per
# second; the listen backlog absorbs a burst of connects, and connections beyond
# ``max_connections`` wait in it rather than being refused.

MAX_HEAD = 16384  # bytes of request line and headers; more gets 431
CHUNK = 256 * 1024  # a response body is written in chunks of this size, each within the timeout


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """How much the server gives one client.

    ``idle_timeout``: a connection is closed when a complete request head has not
    arrived within this many seconds, counted from the connect or the end of the
    previous response (an idle keep-alive connection, and a request sent slowly or
    never finished, are both closed), or when a chunk of a response has not been
    taken within it.  ``max_connections``: open connections at most; more wait in
    the listen queue of ``backlog``.
    """

    idle_timeout: float = 10.0
    max_connections: int = 1024
    backlog: int = 1024


_ALLOWED = ("GET", "HEAD")
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))


class _BadRequest(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens


def _parse(head: bytes) -> _Request:
    """The request line and headers (strictly: CRLF lines, token names, no folding)."""
    text = head[:-4].decode("latin-1")
    if any(c in _CONTROL for c in text.replace("\r\n", "").replace("\t", "")):
        raise _BadRequest(400)  # a bare CR or LF, NUL, DEL: never echoed into a header
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _BadRequest(400)
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400)
    if not set(method) <= _TOKEN:
        raise _BadRequest(400)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise _BadRequest(400)  # also obsolete line folding (leading whitespace)
        key = name.lower()
        value = value.strip(" \t")
        if key in headers:
            if key in ("host", "content-length", "transfer-encoding"):
                raise _BadRequest(400)
            headers[key] += ", " + value
        else:
            headers[key] = value
    return _Request(method, target, version, headers)


class IndexServer:
    """The index over HTTP: bound on creation, serving in :meth:`serve_forever`.

    The interface of :class:`socketserver.BaseServer` that callers use:
    ``server_address``, ``serve_forever()``, ``shutdown()`` (from another thread;
    returns once serving stopped) and ``server_close()``.
    """

    def __init__(self, sock: socket.socket, root: str, quiet: bool, limits: ServeLimits):
        self.socket = sock
        self.server_address: tuple[Any, ...] = sock.getsockname()
        self.root = root
        self.quiet = quiet
        self.limits = limits
        #: called once the event loop serves (``wheelforge serve`` prints its banner there)
        self.on_ready: Callable[[], None] | None = None
        self.marker = os.path.join(root, CACHE_DIR, _WRITING)
        self.unrepairable = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._done = threading.Event()
        self._done.set()
        self._transports: set[asyncio.WriteTransport] = set()

    def repair(self) -> None:
        """Before a request: when a writer died half-way (the marker is there and no
        writer holds the lock), finish its change first, so that no request is answered
        from an index that lies.  One stat when there is nothing to do."""
        if not os.path.exists(self.marker):
            return
        try:
            repair(Path(self.root), wait=False)
        except PublishError as exc:
            if not self.unrepairable:  # say it once, then serve the valid, older pages
                self.unrepairable = True
                warnings.warn(IndexWarning(f"{exc.what} ({exc.why}); serving the pages as "
                                           f"they are; {exc.fix}"), stacklevel=1)

    # ---------------------------------------------------------------- life cycle

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown` (``poll_interval`` is accepted and unused)."""
        del poll_interval
        with self._lock:
            if self._stopping:
                return
            self._done.clear()
        serving = self._serve()
        try:
            asyncio.run(serving)
        finally:
            serving.close()  # a Ctrl-C before the loop ran it: no "never awaited" warning
            with self._lock:
                self._loop = self._stop = None
            self._done.set()

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
        self._done.wait()

    def server_close(self) -> None:
        self.socket.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        with self._lock:
            if self._stopping:
                return
            self._loop, self._stop = loop, stop
        if self.on_ready is not None:  # the loop runs: a Ctrl-C from now on stops it cleanly
            self.on_ready()
        limit = min(self.limits.max_connections, _fd_budget())
        slots = asyncio.Semaphore(limit)
        clients: set[asyncio.Task[None]] = set()

        async def accept() -> None:
            while True:
                await slots.acquire()
                try:
                    conn, _ = await loop.sock_accept(self.socket)
                except OSError:  # EMFILE, ECONNABORTED: the queue keeps the client
                    slots.release()
                    await asyncio.sleep(0.05)
                    continue
                task = loop.create_task(self._connection(conn))
                clients.add(task)

                def finished(t: asyncio.Task[None]) -> None:
                    clients.discard(t)
                    slots.release()

                task.add_done_callback(finished)

        acceptor = loop.create_task(accept())
        try:
            await stop.wait()
        finally:
            acceptor.cancel()
            await asyncio.gather(acceptor, return_exceptions=True)
            # end every connection by closing its socket: each task then finishes on its own
            # (cancelling a task inside wait_for can leave it pending on Python 3.11)
            for transport in list(self._transports):
                transport.abort()
            if clients:
                _, pending = await asyncio.wait(list(clients), timeout=2)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=2)

    # ---------------------------------------------------------------- one connection

    async def _connection(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_HEAD)
        except OSError:
            conn.close()
            return
        self._transports.add(writer.transport)
        peer = writer.get_extra_info("peername") or ("?",)
        timeout = self.limits.idle_timeout
        clean = False  # closed in order (everything sent), not on a timeout or an error
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
                except asyncio.IncompleteReadError:
                    clean = True  # the client closed
                    return
                except TimeoutError:
                    return  # idle, or too slow: close without a word
                except asyncio.LimitOverrunError:
                    await self._error(writer, 431, None, close=True)
                    clean = True
                    return
                try:
                    request = _parse(head)
                except _BadRequest as exc:
                    await self._error(writer, exc.status, None, close=True)
                    clean = True
                    return
                keep = await self._answer(request, writer)
                if not keep:
                    clean = True
                    return
        except (OSError, TimeoutError):
            pass
        except Exception as exc:  # a bug: this connection ends, the server goes on
            print(f"wheelforge serve: {peer[0]}: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
        finally:
            self._transports.discard(writer.transport)
            if clean:
                writer.close()
            else:
                writer.transport.abort()  # nothing left to flush to a client that stalls

    async def _answer(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection may carry another."""
        has_body = "transfer-encoding" in request.headers or request.headers.get(
            "content-length", "0") not in ("", "0")
        if request.method not in _ALLOWED:
            await self._error(writer, 405, request, close=True, extra=[("Allow", "GET, HEAD")])
            return False
        if has_body:  # a GET with a body: its end is not ours to find
            await self._error(writer, 400, request, close=True)
            return False
        keep = request.keep_alive
        self.repair()
        route = _route(self.root, request.target, request.headers.get("accept"))
        if route.status == 301 and route.location is not None:
            await self._send(writer, request, 301, [("Location", route.location),
                                                    ("Content-Length", "0")], keep)
            return keep
        if route.status != 200 or route.file is None:
            await self._error(writer, route.status, request, close=not keep,
                              extra=[("Vary", "Accept")] if route.vary else [])
            return keep
        try:
            f = open(route.file, "rb")  # noqa: SIM115 (closed below)
        except OSError:
            await self._error(writer, 404, request, close=not keep)
            return keep
        with f:
            st = os.fstat(f.fileno())
            headers = [("Content-Type", route.content_type or "application/octet-stream"),
                       ("Content-Length", str(st.st_size)),
                       ("Last-Modified", formatdate(st.st_mtime, usegmt=True))]
            if route.vary:
                headers.append(("Vary", "Accept"))
            body = b"" if request.method == "HEAD" else f.read(CHUNK)
            await self._send(writer, request, 200, headers, keep, body)
            if request.method == "GET":
                sent = len(body)
                while sent < st.st_size:
                    chunk = f.read(CHUNK)
                    if not chunk:  # the file shrank: the length is a lie, so close
                        return False
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), self.limits.idle_timeout)
                    sent += len(chunk)
        return keep

    async def _send(self, writer: asyncio.StreamWriter, request: _Request | None, status: int,
                    headers: list[tuple[str, str]], keep: bool, body: bytes = b"") -> None:
        version = "HTTP/1.1"
        lines = [f"{version} {status} {http.HTTPStatus(status).phrase}",
                 "Server: wheelforge-index", f"Date: {formatdate(usegmt=True)}",
                 *(f"{k}: {v}" for k, v in headers)]
        if not keep:
            lines.append("Connection: close")
        elif request is not None and request.version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        if not self.quiet:
            length = dict(headers).get("Content-Length", "-")
            self._log(writer, request, status, length)
        await asyncio.wait_for(writer.drain(), self.limits.idle_timeout)

    async def _error(self, writer: asyncio.StreamWriter, status: int, request: _Request | None,
                     *, close: bool, extra: Sequence[tuple[str, str]] = ()) -> None:
        phrase = http.HTTPStatus(status).phrase
        body = f"{status} {phrase}\n".encode()
        head = request is not None and request.method == "HEAD"
        await self._send(writer, request, status,
                         [*extra, ("Content-Type", "text/plain; charset=utf-8"),
                          ("Content-Length", str(len(body)))], not close,
                         b"" if head else body)

    def _log(self, writer: asyncio.StreamWriter, request: _Request | None, status: int,
             length: str) -> None:
        host = (writer.get_extra_info("peername") or ("-",))[0]
        stamp = time.strftime("%d/%b/%Y %H:%M:%S")
        line = (f"{request.method} {request.target} {request.version}" if request is not None
                else "(unparsable request)")
        print(f'{host} - - [{stamp}] "{line}" {status} {length}', file=sys.stderr, flush=True)


def _fd_budget() -> int:
    """Connections this process can hold: the soft open-files limit, raised to the hard
    one, less a margin for the files being served."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = 65536 if hard == resource.RLIM_INFINITY else hard
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    return max(16, soft - 64)


#: addresses that bind every interface: never a URL another machine can use
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_PROBES = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}  # TEST-NETs


def _outward(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local)


def _addresses(family: socket.AddressFamily) -> list[str]:
    """This machine's outward addresses of ``family``: those its name resolves to, and
    the one a datagram to a documentation address would leave from (nothing is sent)."""
    found: list[str] = []
    with contextlib.suppress(OSError, UnicodeError):
        for *_, addr in socket.getaddrinfo(socket.gethostname(), None, family,
                                           socket.SOCK_STREAM):
            found.append(str(addr[0]))
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((_PROBES[family], 9))
        found.append(str(probe.getsockname()[0]))
    return list(dict.fromkeys(a for a in found if _outward(a)))


def reachable_hosts(host: str) -> list[str]:
    """The names other machines may reach a server bound to ``host`` by, best first: for
    a wildcard address (0.0.0.0, ::), this machine's name when it resolves to an outward
    address, then those addresses (IPv6 ones bracketed); [] when none is found (no
    network); else ``host`` itself."""
    if host not in WILDCARD_HOSTS:
        return [f"[{host}]" if ":" in host else host]
    families = [socket.AF_INET] + ([socket.AF_INET6] if ":" in host else [])
    addresses = [a for family in families for a in _addresses(family)]
    names = []
    with contextlib.suppress(OSError, UnicodeError):
        name = socket.getfqdn()
        if any(_outward(str(info[4][0])) for info in socket.getaddrinfo(name, None)):
            names.append(name)
    return names + [f"[{a}]" if ":" in a else a for a in addresses]


def make_server(
    index_dir: Path, host: str = "127.0.0.1", port: int = 0, *, quiet: bool = True,
    limits: ServeLimits | None = None,
) -> IndexServer:
    """A read-only HTTP server for the index (bound, not yet serving).

    Call ``serve_forever()``; ``server_address`` has the bound port.  Simple
    pages are negotiated on ``Accept`` (PEP 691); nothing outside the index
    root, hidden files or sidecars are served.  Requests are logged to stderr
    only when ``quiet`` is false.  ``limits`` bounds what one client can hold.  A change
    that a killed writer left half-done is finished (:func:`repair`) before the request
    that finds it is answered.
    """
    limits = limits or ServeLimits()
    root = os.path.realpath(index_dir)
    if not os.path.isdir(root):
        raise ConfigError(  # serving publishes nothing: a wrong path or port is usage
            f"no index at {index_dir}",
            fix="publish a wheel into it or rebuild it first",
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(limits.backlog)
    except OSError as exc:  # address in use, not this machine's, no permission
        sock.close()
        raise ConfigError(
            f"cannot serve {index_dir} on {host} port {port}",
            why=exc.strerror or str(exc),
            fix="choose another --port (--port 0 takes a free one) or another --host",
        ) from None
    sock.setblocking(False)
    return IndexServer(sock, root, quiet, limits)
