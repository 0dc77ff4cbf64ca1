"""A read-only HTTP server for the index: PEP 691 content negotiation, nothing hidden
or outside the root served."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import urllib.parse
import warnings
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

from packaging.utils import (
    canonicalize_name,
)

from ..errors import IndexWarning, PublishError
from .records import (
    _WRITING,
    CACHE_DIR,
    HTML_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    METADATA_SUFFIX,
    SIDECAR_SUFFIX,
    SIMPLE_DIR,
)
from .store import repair

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


class _IndexServer(http.server.ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], root: str, quiet: bool) -> None:
        self.root = root
        self.quiet = quiet
        self.marker = os.path.join(root, CACHE_DIR, _WRITING)
        self.unrepairable = False
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _IndexHandler)


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


class _IndexHandler(http.server.BaseHTTPRequestHandler):
    server: _IndexServer
    server_version = "wheelforge-index"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def _not_allowed(self) -> None:
        self.close_connection = True  # the request body, if any, is left unread
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed
    do_PROPFIND = do_PROPPATCH = do_MKCOL = do_COPY = do_MOVE = do_LOCK = do_UNLOCK = _not_allowed

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)

    def _respond(self, *, head: bool) -> None:
        self.server.repair()
        route = _route(self.server.root, self.path, self.headers.get("Accept"))
        if route.status == 301 and route.location is not None:
            self.send_response(301)
            self.send_header("Location", route.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.status != 200 or route.file is None:
            self.send_error(route.status)
            return
        try:
            f = open(route.file, "rb")  # noqa: SIM115 (closed below, after the headers)
        except OSError:
            self.send_error(404)
            return
        with f:
            st = os.fstat(f.fileno())
            self.send_response(200)
            self.send_header("Content-Type", route.content_type or "application/octet-stream")
            self.send_header("Content-Length", str(st.st_size))
            self.send_header("Last-Modified", formatdate(st.st_mtime, usegmt=True))
            if route.vary:
                self.send_header("Vary", "Accept")
            self.end_headers()
            if not head:
                shutil.copyfileobj(f, self.wfile)


def make_server(
    index_dir: Path, host: str = "127.0.0.1", port: int = 0, *, quiet: bool = True
) -> http.server.ThreadingHTTPServer:
    """A read-only HTTP server for the index (bound, not yet serving).

    Call ``serve_forever()``; ``server_address`` has the bound port.  Simple
    pages are negotiated on ``Accept`` (PEP 691); nothing outside the index
    root, hidden files or sidecars are served.  Requests are logged to stderr
    only when ``quiet`` is false.  A change that a killed writer left half-done is
    finished (:func:`repair`) before the request that finds it is answered.
    """
    root = os.path.realpath(index_dir)
    if not os.path.isdir(root):
        raise PublishError(
            f"{index_dir} is not an index directory",
            fix="publish a wheel into it or rebuild it first",
        )
    try:
        return _IndexServer((host, port), root, quiet)
    except OSError as exc:  # address in use, not this machine's, no permission
        raise PublishError(
            f"cannot serve {index_dir} on {host} port {port}",
            why=exc.strerror or str(exc),
            fix="choose another --port (--port 0 takes a free one) or another --host",
        ) from None
