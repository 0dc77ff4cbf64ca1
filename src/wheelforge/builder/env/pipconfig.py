"""pip's configuration and arguments as uv's: what a managed build environment's installer
must honour when uv installs it instead of pip.

uv reads no ``pip.conf`` and no ``PIP_*`` variable.  A user whose pip configuration adds
an index, a find-links directory or a constraints file (a mirror, an air-gapped wheel
directory, a cap on torch) must get the same environment from uv as from pip, so the
settings that decide *what* is installed and *from where* are carried over:

==========================  ========================================================
pip (option / config key)   uv
==========================  ========================================================
index-url, -i               ``--index-url``
extra-index-url             ``--extra-index-url`` (each)
find-links, -f              ``--find-links`` (each)
no-index                    ``--no-index``
constraint, -c              ``--constraint`` (each; ``file://`` URLs as paths)
pre                         ``--prerelease allow``
only-binary, no-binary      the same options
trusted-host                ``--allow-insecure-host``
timeout, default-timeout    ``UV_HTTP_TIMEOUT``
retries                     ``UV_HTTP_RETRIES``
cert                        ``SSL_CERT_FILE``
proxy                       ``HTTPS_PROXY`` and ``HTTP_PROXY``
==========================  ========================================================

Settings that change neither (progress bars, the version check, pip's own cache, ...)
are dropped.  Any other setting (``--no-deps``, ``--user``, ``--require-hashes``,
``--use-feature``, ``--config-settings``, ...) could change the environment in a way uv
would not reproduce: :attr:`UvArgs.unsupported` names it, and the environment is made by
pip as before.  pip merges every index it is given and takes the highest version; uv
stops at the first index that has a package unless told ``--index-strategy
unsafe-best-match``, which :func:`to_uv` always passes, so both resolve the same.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import _proc

__all__ = ["CARRIED", "UvArgs", "config_args", "parse_config_list", "read_pip_config",
           "to_uv"]

#: pip options that take a value, to the uv option (None: an environment variable below).
_VALUED: dict[str, str | None] = {
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "--find-links": "--find-links",
    "--constraint": "--constraint",
    "--only-binary": "--only-binary",
    "--no-binary": "--no-binary",
    "--trusted-host": "--allow-insecure-host",
    "--timeout": None,
    "--default-timeout": None,
    "--retries": None,
    "--cert": None,
    "--proxy": None,
}
_SHORT = {"-i": "--index-url", "-f": "--find-links", "-c": "--constraint"}
#: pip options that take a value, to the environment variable that tells uv the same.
_ENVIRON: dict[str, tuple[str, ...]] = {
    "--timeout": ("UV_HTTP_TIMEOUT",), "--default-timeout": ("UV_HTTP_TIMEOUT",),
    "--retries": ("UV_HTTP_RETRIES",), "--cert": ("SSL_CERT_FILE",),
    "--proxy": ("HTTPS_PROXY", "HTTP_PROXY"),
}
#: pip flags (no value) with a uv equivalent.
_FLAGS: dict[str, tuple[str, ...]] = {
    "--no-index": ("--no-index",),
    "--pre": ("--prerelease", "allow"),
}
#: pip options that change nothing about what is installed, with whether they take a value.
_HARMLESS: dict[str, bool] = {
    "--disable-pip-version-check": False, "--progress-bar": True, "--no-cache-dir": False,
    "--cache-dir": True, "--quiet": False, "-q": False, "--verbose": False, "-v": False,
    "--no-input": False, "--no-color": False, "--no-python-version-warning": False,
    "--root-user-action": True, "--log": True, "--exists-action": True,
    "--keyring-provider": True,
    "--config-file": True,  # PIP_CONFIG_FILE: the files it names were read already
}
#: The pip options whose effect uv is given.
CARRIED = frozenset({*_VALUED, *_FLAGS})
#: config sections pip reads for `pip install`, lowest priority first.
_SECTIONS = ("global", "install", ":env:")
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, kw_only=True)
class UvArgs:
    """What ``uv pip install`` needs to install what pip would: ``args`` (options),
    ``environ`` (variables to set), ``unsupported`` (pip settings uv cannot honour: when
    not empty, pip must install)."""

    args: tuple[str, ...]
    environ: tuple[tuple[str, str], ...]
    unsupported: tuple[str, ...]


def parse_config_list(text: str) -> dict[str, str]:
    """The effective ``pip install`` settings from ``pip config list``: each key once,
    ``:env:`` (PIP_* variables) over ``install`` over ``global``, as pip resolves them."""
    raw: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot or section not in _SECTIONS:
            continue
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            parsed = value.strip()
        raw.setdefault(name, {})[section] = str(parsed)
    out: dict[str, str] = {}
    for name, by_section in raw.items():
        for section in _SECTIONS:
            if section in by_section:
                out[name] = by_section[section]
    return out


def read_pip_config(*pythons: Path,
                    environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The pip configuration ``python -m pip`` would install with (its configuration files
    and PIP_* variables), from ``pip config list`` of the first of ``pythons`` that has
    pip (a Debian python3 may have none: a venv made from it gets pip from ensurepip, which
    reads the same files as any other pip); None when none has."""
    for python in pythons:
        try:
            out = _proc.run([str(python), "-m", "pip", "config", "list"], env=environ,
                            timeout=60).output
        except _proc.CommandFailed:
            continue
        return parse_config_list(out)
    return None


def config_args(settings: Mapping[str, str]) -> list[str]:
    """pip configuration settings as the pip command-line options they stand for
    (a list value such as ``extra-index-url`` is split on white space, as pip does)."""
    args: list[str] = []
    for name, value in settings.items():
        option = "--" + name
        if option in _VALUED or _HARMLESS.get(option):
            for item in (value.split() if option in ("--extra-index-url", "--find-links",
                                                     "--constraint", "--trusted-host")
                         else [value]):
                args += [option, item]
        elif value.strip().lower() not in _FALSE:
            args.append(option)  # a flag; "false" in a config file turns it off
    return args


def _split(args: Sequence[str]) -> list[tuple[str, str | None]]:
    """pip options as (long option, value or None); ``--opt=value`` and short forms."""
    out: list[tuple[str, str | None]] = []
    it = iter(args)
    for arg in it:
        opt, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        opt = _SHORT.get(opt, opt)
        takes_value = opt in _VALUED or _HARMLESS.get(opt, False)
        if takes_value and not eq:
            value = next(it, "")
        out.append((opt, value if takes_value or eq else None))
    return out


def to_uv(config: Mapping[str, str], args: Sequence[str]) -> UvArgs:
    """``uv pip install`` options for pip's ``config`` (from :func:`read_pip_config`)
    followed by command-line ``args`` (wheelforge's and a user's torch-pip-args), as pip
    combines them: list options add up, a single value on the command line wins."""
    pairs = _split([] if "--isolated" in args else config_args(config)) + _split(args)
    uv: list[str] = ["--index-strategy", "unsafe-best-match"]
    environ: dict[str, str] = {}
    unsupported: list[str] = []
    index_url: str | None = None
    for opt, value in pairs:
        if opt == "--isolated" or opt in _HARMLESS:
            continue
        if opt in _FLAGS and value is None:
            if not set(_FLAGS[opt]) <= set(uv):
                uv += _FLAGS[opt]
        elif opt in _ENVIRON and value is not None:
            for var in _ENVIRON[opt]:
                environ[var] = value
        elif opt == "--index-url" and value is not None:
            index_url = value
        elif opt in _VALUED and value is not None:
            if opt == "--constraint" and value.startswith("file://"):
                value = value[len("file://"):]
            uv += [str(_VALUED[opt]), value]
        elif opt.startswith("-"):
            unsupported.append(opt if value is None else f"{opt} {value}")
        else:
            unsupported.append(shlex.quote(opt))  # a requirement among the options
    if index_url is not None:
        uv = ["--index-url", index_url, *uv]
    return UvArgs(args=tuple(uv), environ=tuple(sorted(environ.items())),
                  unsupported=tuple(unsupported))
