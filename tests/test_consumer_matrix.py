"""The dependency-confusion matrix: what `wheelforge consumer-config` tells users, run
with real pip (the one `python -m venv` bundles and the newest, this checkout's) and real
uv, against a fake public index on 127.0.0.1, for the first install and for the commands
users run later.

The local index holds the shipped layout in miniature: wf-conv (an extension build with
a local label, channel cu130-torch2.14, needs wf-dep from the public index), wf-core and
wf-la (pure, labelled ``+wf``; wf-la needs ``wf-core==0.6.0`` and has an extra ``conv``
that needs wf-conv).  The public index offers every name higher (wf-conv 99.0 as an
sdist that fails to build, 98.0 as a marker wheel; wf-core and wf-la 9.0), the same
public versions with other bytes (wf-conv 1.0, wf-core 0.6.0, wf-la 0.6.0), a build-tagged
wf-core 0.6.0-1, wf-dep, and wf-app, which depends on all three.

A cell's outcome is ``kept``: the command succeeded and every local project is installed
byte for byte as the index's wheel (each file against the wheel's RECORD), or
``refused``: the command failed, naming the constraint, and the venv is unchanged.  Each
cell asserts its expected outcome; every row is printed (``pytest -s`` shows the table
docs/index.md summarizes).

Everything runs in a temporary HOME/XDG_CONFIG_HOME/XDG_CONFIG_DIRS, so neither this
machine's pip and uv configuration nor its global files are read or touched.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib

from conftest import make_wheel
from test_index_clients import fresh_venv, run, serve_in_thread
from wheelforge import index

CHANNEL = "cu130-torch2.14"
CU130: dict[str, Any] = {"channel": CHANNEL, "cuda": "13.0", "torch": "2.14.1",
                         "archs": ["sm_120"], "build_key": "key-1"}
NO_TARGET: dict[str, Any] = {"channel": None, "cuda": None, "torch": None, "archs": [],
                             "build_key": None}
CONV, CORE, LA = "1.0+cu130torch2.14sm120", "0.6.0+wf", "0.6.0+wf"
LOCAL = {"wf-conv": CONV, "wf-core": CORE, "wf-la": LA}
NAMES = list(LOCAL)


# --------------------------------------------------------------------------- the two indexes


def _wheel(dist: Path, name: str, version: str, origin: str, *requires: str,
           tag: str = "py3-none-any") -> Path:
    module = name.replace("-", "_")
    meta = "\n".join(f"Requires-Dist: {r}" for r in requires)
    if any("extra ==" in r for r in requires):
        meta = "Provides-Extra: conv\n" + meta
    return make_wheel(dist, {f"{module}/__init__.py": f"ORIGIN = {origin!r}\n"}, name=name,
                      version=version, tag=tag, metadata_extra=meta)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    root, dist = tmp / "index", tmp / "dist"
    index.publish(root, _wheel(dist, "wf-conv", CONV, "local", "wf-dep"), **CU130)
    index.publish(root, _wheel(dist, "wf-core", CORE, "local"), **NO_TARGET)
    index.publish(root, _wheel(dist, "wf-la", LA, "local", "wf-core==0.6.0",
                               'wf-conv; extra == "conv"'), **NO_TARGET)
    return root


def _failing_sdist(files: Path, name: str, version: str) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    out = files / f"{stem}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        for member, text in {
            "setup.py": f"raise SystemExit('the public {name} {version} sdist was built')\n",
            "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{stem}/{member}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fake public index: a static PEP 503 tree written here (it must hold an sdist,
    which the local index never does), served on 127.0.0.1; its simple/ URL."""
    tmp = tmp_path_factory.mktemp("public")
    root, files = tmp / "index", tmp / "index" / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[Path]] = {
        "wf-conv": [_failing_sdist(files, "wf-conv", "99.0"),
                    _wheel(files, "wf-conv", "98.0", "public", "wf-dep"),
                    _wheel(files / "same", "wf-conv", "1.0", "public", "wf-dep")],
        "wf-core": [_wheel(files, "wf-core", "9.0", "public"),
                    _wheel(files / "same", "wf-core", "0.6.0", "public"),
                    _wheel(files, "wf-core", "0.6.0", "public-build-tag",
                           tag="1-py3-none-any")],
        "wf-la": [_wheel(files, "wf-la", "9.0", "public", "wf-core"),
                  _wheel(files / "same", "wf-la", "0.6.0", "public", "wf-core==0.6.0")],
        "wf-dep": [_wheel(files, "wf-dep", "1.0", "public")],
        "wf-app": [_wheel(files, "wf-app", "1.0", "public", "wf-conv", "wf-core", "wf-la")],
    }
    for project, paths in projects.items():
        links = ""
        for path in paths:
            rel = path.relative_to(files).as_posix()
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            links += f'<a href="../../files/{rel}#sha256={sha}">{path.name}</a><br>\n'
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True)
        page.write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text(
        "<!DOCTYPE html>\n<html><body>\n"
        + "".join(f'<a href="{p}/">{p}</a>\n' for p in projects) + "</body></html>\n")
    with serve_in_thread(root) as url:
        yield f"{url}/simple/"


@pytest.fixture(scope="module")
def served(local: Path) -> Iterator[str]:
    """`wheelforge serve` (the real CLI) on the local index; its base URL.  Its banner is
    the renderer's output for the served top-level simple/."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wheelforge", "serve", "--index", str(local), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_base_env(local.parent),
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.fullmatch(r"serving .+ at (http://127\.0\.0\.1:\d+)/ \(read-only\); "
                             r"Ctrl-C stops\n", first)
        assert match, first
        url = match.group(1)
        banner = [proc.stdout.readline() for _ in range(4)]
        assert banner[0] == f"install channel {CHANNEL}, from any directory:\n"
        assert banner[1].startswith("# install every wheel with its dependencies")
        assert f" install --index {url}/{CHANNEL}/ --python ~/venvs/stack" in banner[3]
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------- environment


def _base_env(home: Path, **extra: str) -> dict[str, str]:
    """No pip/uv settings, proxies or configuration of this machine: HOME, the user's
    config directory and the global one (XDG_CONFIG_DIRS) are under ``home``."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("PIP_", "UV_", "XDG_", "VIRTUAL_ENV"))
           and "proxy" not in k.lower()}
    env.update(HOME=str(home / "home"), XDG_CONFIG_HOME=str(home / "home" / ".config"),
               XDG_CONFIG_DIRS=str(home / "xdg"), XDG_CACHE_HOME=str(home / "home" / ".cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1", UV_CACHE_DIR=str(home / "uv"),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", NO_COLOR="1")
    env.update(extra)
    return env


def wf(*args: str, home: Path) -> str:
    done = run([sys.executable, "-m", "wheelforge", *args], _base_env(home))
    assert done.returncode == 0, done.stderr
    return done.stdout


def instructions(local: Path, served: str, transport: str, pages: str, fmt: str,
                 home: Path) -> str:
    """What `wheelforge consumer-config` prints for this transport and page set."""
    args = ["consumer-config", "--index", str(local), "--format", fmt]
    if pages == "channel":
        args += ["--channel", CHANNEL]
    if transport == "serve":
        args += ["--url", f"{served}/{CHANNEL}/simple/" if pages == "channel"
                 else f"{served}/simple/"]
    return wf(*args, home=home)


def printed_commands(text: str) -> list[list[str]]:
    """The shell commands of the pip instructions (comments dropped, continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    return [shlex.split(line) for line in joined.splitlines()
            if line.strip() and not line.startswith("#")]


def run_printed(argv: list[str], python: Path, env: dict[str, str]
                ) -> subprocess.CompletedProcess[str]:
    """A printed command as a shell runs it: leading VAR=value assignments go into the
    environment, `python` is the venv's interpreter."""
    env = dict(env)
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    assert argv[0] == "python", argv
    return run([str(python), *argv[1:]], env)


# --------------------------------------------------------------------------- venvs, outcomes


PIPS: dict[str, Path] = {}  # client: the site-packages directory its pip is copied from


@pytest.fixture(scope="module", autouse=True)
def _pips(tmp_path_factory: pytest.TempPathFactory) -> None:
    """pip-bundled: what `python -m venv` installs (ensurepip), once; pip-newest: this
    checkout's (`make venv` upgrades it from PyPI)."""
    python = fresh_venv(tmp_path_factory.mktemp("bundled") / "venv", with_pip=True)
    PIPS["pip-bundled"] = _site(python)
    PIPS["pip-newest"] = Path(sysconfig.get_paths()["purelib"])


def pip_venv(path: Path, client: str) -> Path:
    """A venv with that client's pip, copied in as installed files (pip is pure Python)."""
    python = fresh_venv(path)
    site, source = _site(python), PIPS[client]
    shutil.copytree(source / "pip", site / "pip")
    for info in source.glob("pip-*.dist-info"):
        shutil.copytree(info, site / info.name)
    return python


def _site(python: Path) -> Path:
    (site,) = (python.parent.parent / "lib").glob("python*/site-packages")
    return site


def state(python: Path) -> dict[str, tuple[str, bool]]:
    """{local project: (installed version, whether every file is the index wheel's)}."""
    site = _site(python)
    found: dict[str, tuple[str, bool]] = {}
    for meta in site.glob("wf_*.dist-info/METADATA"):
        fields = dict(line.split(": ", 1) for line in meta.read_text().splitlines()
                      if ": " in line)
        name, version = fields["Name"], fields["Version"]
        if name in LOCAL:
            found[name] = (version, version == LOCAL[name] and _same_files(site, name, version))
    return found


def _same_files(site: Path, name: str, version: str) -> bool:
    wheel = LOCAL_FILES[name]
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(zf.read(record).decode().splitlines()))
    for path, digest, _size in rows:
        if not digest:
            continue  # RECORD itself
        algo, _, want = digest.partition("=")
        installed = site / path
        if not installed.is_file():
            return False
        got = base64.urlsafe_b64encode(hashlib.new(algo, installed.read_bytes()).digest())
        if got.rstrip(b"=").decode() != want:
            return False
    return True


LOCAL_FILES: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def _local_files(local: Path) -> None:
    for name, version in LOCAL.items():
        (wheel,) = (local / "files").glob(f"{name.replace('-', '_')}-{version}-*.whl")
        LOCAL_FILES[name] = wheel


KEPT = {name: (version, True) for name, version in LOCAL.items()}
ROWS: list[str] = []


def outcome(cell: str, done: subprocess.CompletedProcess[str], python: Path,
            before: dict[str, tuple[str, bool]], expected: str) -> None:
    """Assert the cell's outcome (kept / refused) and print its row."""
    after = state(python)
    if done.returncode == 0:
        got = "kept" if after == KEPT else f"LOST {after}"
    else:
        clear = any(pin in done.stdout + done.stderr for pin in
                    ("wf-conv==" + CONV, "wf-core==" + CORE, "wf-la==" + LA))
        got = "refused" if after == before and clear else f"BROKEN {after}"
    said = next((line.strip() for line in done.stderr.splitlines()
                 if re.search(r"error|because", line, re.I)), "") if got != "kept" else ""
    ROWS.append(f"{cell}: {got}")
    print(f"\nMATRIX {cell}: {got}" + (f"  [{said}]" if said else ""))
    assert got == expected, (f"{cell}: {got}, expected {expected}\n{shlex.join(done.args)}\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def hostile_pip_config(level: str, home: Path, python: Path, public: str,
                       env: dict[str, str]) -> dict[str, str]:
    """Add the public index as an extra index at ``level``; the environment to use."""
    text = f"[global]\nextra-index-url = {public}\n"
    if level == "venv":  # another section than ours, so `pip config --site set` keeps it
        target = python.parent.parent / "pip.conf"
        text = f"[install]\nextra-index-url = {public}\n"
    elif level == "user":
        target = home / "home" / ".config" / "pip" / "pip.conf"
    elif level == "global":
        target = home / "xdg" / "pip" / "pip.conf"
    elif level == "PIP_CONFIG_FILE":
        target = home / "pip-config-file.conf"
        env = {**env, "PIP_CONFIG_FILE": str(target)}
    else:
        return env
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as f:
        f.write(text)
    return env


# --------------------------------------------------------------------------- pip

PIP_LATER = [
    ("pip install -U", ["install", "-U", *NAMES]),
    ("pip install -U --upgrade-strategy eager wf-app (depends on all three)",
     ["install", "-U", "--upgrade-strategy", "eager", "wf-app"]),
    ("pip install --force-reinstall", ["install", "--force-reinstall", *NAMES]),
]
PIP_CELLS = [
    (client, transport, pages, level)
    for client in ("pip-bundled", "pip-newest")
    for transport, pages in (("file", "channel"), ("file", "top"), ("serve", "channel"),
                             ("serve", "top"))
    for level in ("none", "venv", "user", "global", "PIP_CONFIG_FILE")
    if level == "none" or (transport, pages) == ("file", "channel")
    or (client, transport, pages) == ("pip-newest", "serve", "top")
]


@pytest.mark.parametrize(("client", "transport", "pages", "level"), PIP_CELLS,
                         ids=["-".join(c) for c in PIP_CELLS])
def test_pip(local: Path, public: str, served: str, tmp_path: Path, client: str,
             transport: str, pages: str, level: str):
    """The printed pip set-up and install, with the public index as the usual index
    (PIP_INDEX_URL) and, at ``level``, also as an extra index in a pip config file; then
    the later commands."""
    python = pip_venv(tmp_path / "venv", client)
    env = hostile_pip_config(level, tmp_path, python, public,
                             _base_env(tmp_path, PIP_INDEX_URL=public))
    text = instructions(local, served, transport, pages, "pip", tmp_path)
    (info,) = PIPS[client].glob("pip-*.dist-info")
    cell = f"{client} {info.name[4:-10]} | {transport} {pages} | config {level}"
    commands = printed_commands(text)
    assert [c[:4] for c in commands[:2]] == [["python", "-m", "pip", "config"]] * 2
    assert len(commands) == 4 and "--isolated" in commands[2]
    for argv in commands[:2]:
        done = run_printed(argv, python, env)
        assert done.returncode == 0, (argv, done.stderr)
    outcome(f"{cell} | first install (printed, isolated)", run_printed(commands[2], python, env),
            python, {}, "kept")
    outcome(f"{cell} | its dependencies (printed)", run_printed(commands[3], python, env),
            python, KEPT, "kept")
    for what, args in PIP_LATER:
        # an extra-index-url of higher precedence than the venv's [global] one (its [install]
        # section, PIP_CONFIG_FILE) replaces the local index: a reinstall then has nothing
        # the constraints allow, and fails
        replaced = level in ("venv", "PIP_CONFIG_FILE") and "--force-reinstall" in args
        before = state(python)
        outcome(f"{cell} | {what}", run([str(python), "-m", "pip", *args], env), python,
                before, "refused" if replaced else "kept")


def test_pip_without_the_local_index_refuses_the_public_versions(
        local: Path, public: str, served: str, tmp_path: Path):
    """The local index unreachable later (the server down, or another extra-index-url
    replacing ours): the constraints alone keep the installed wheels, and a reinstall
    fails instead of taking the public bytes."""
    python = pip_venv(tmp_path / "venv", "pip-newest")
    env = _base_env(tmp_path, PIP_INDEX_URL=public)
    text = instructions(local, served, "file", "channel", "pip", tmp_path)
    for argv in printed_commands(text):
        assert run_printed(argv, python, env).returncode == 0
    ok = run([str(python), "-m", "pip", "config", "--site", "set", "global.extra-index-url",
              public], env)
    assert ok.returncode == 0, ok.stderr
    cell = "pip-newest | local index gone"
    for what, args, expected in [
        ("pip install -U", ["install", "-U", *NAMES], "kept"),
        ("pip install wf-app", ["install", "wf-app"], "kept"),
        ("pip install --force-reinstall", ["install", "--force-reinstall", *NAMES], "refused"),
    ]:
        before = state(python)
        outcome(f"{cell} | {what}", run([str(python), "-m", "pip", *args], env), python,
                before, expected)


def test_the_first_command_alone_ignores_every_pip_config_file(
        local: Path, public: str, served: str, tmp_path: Path):
    """`--isolated` alone reads the venv's pip.conf, the global one and PIP_CONFIG_FILE
    (the old docs said otherwise); the printed first command does not: here each of
    those names the public index as the only index and sets `no-index` nowhere."""
    python = pip_venv(tmp_path / "venv", "pip-newest")
    (python.parent.parent / "pip.conf").write_text(f"[global]\nindex-url = {public}\n")
    env = _base_env(tmp_path)
    for level in ("venv", "global", "PIP_CONFIG_FILE"):
        env = hostile_pip_config(level, tmp_path, python, public, env)
    first = next(c for c in printed_commands(
        instructions(local, served, "file", "top", "pip", tmp_path)) if "--isolated" in c)
    pins = [a for a in first if "==" in a]
    bare = run([str(python), "-m", "pip", "install", "--isolated", "--no-deps", *pins], env)
    # it read those files: it saw the public index alone, which has no such versions
    assert bare.returncode != 0
    assert "(from versions: 1.0, 98.0, 99.0)" in bare.stderr, bare.stderr
    outcome("pip-newest | hostile config everywhere | the printed first command alone",
            run_printed(list(first), python, env), python, {}, "kept")


# --------------------------------------------------------------------------- uv pip

UV_PIP_LATER = [
    ("uv pip install -U", ["-U", *NAMES]),
    ("uv pip install -U wf-app (depends on all three)", ["-U", "wf-app"]),
    ("uv pip install --reinstall", ["--reinstall", *NAMES]),
]
UV_PIP_CELLS = [
    (transport, pages, hostile)
    for transport in ("file", "serve") for pages in ("channel", "top")
    for hostile in ("none", "UV_INDEX=public", "unsafe-best-match")
]


def uv_toml(text: str) -> str:
    """The uv.toml the instructions show, commented, for `uv pip`."""
    lines = [line[4:] for line in text.splitlines() if line.startswith("#   ")]
    return "\n".join(lines) + "\n"


def hostile_uv(hostile: str, public: str) -> dict[str, str]:
    if hostile == "UV_INDEX=public":  # consulted before every configured index
        return {"UV_INDEX": f"public={public}"}
    if hostile == "unsafe-best-match":
        return {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    return {}


@pytest.mark.parametrize(("transport", "pages", "hostile"), UV_PIP_CELLS,
                         ids=["-".join(c) for c in UV_PIP_CELLS])
def test_uv_pip(local: Path, public: str, served: str, uv: str, tmp_path: Path,
                transport: str, pages: str, hostile: str):
    """The printed `uv pip install` first, then later `uv pip` commands with the printed
    uv.toml in the user's config directory; the public index is uv's default index."""
    text = instructions(local, served, transport, pages, "uv", tmp_path)
    config = tmp_path / "home" / ".config" / "uv" / "uv.toml"
    config.parent.mkdir(parents=True)
    config.write_text(uv_toml(text))
    env = _base_env(tmp_path, UV_DEFAULT_INDEX=public, **hostile_uv(hostile, public))
    (first,) = [shlex.split(line[2:]) for line in text.splitlines()
                if line.startswith("# uv pip install")]
    python = fresh_venv(tmp_path / "venv")
    cell = f"uv | {transport} {pages} | {hostile}"
    outcome(f"{cell} | first install (the printed uv pip install)",
            run([uv, *first[1:], "--python", str(python)], env), python, {}, "kept")
    for what, args in UV_PIP_LATER:
        before = state(python)
        expected = "refused" if hostile == "UV_INDEX=public" and "--reinstall" in args \
            else "kept"
        outcome(f"{cell} | {what}", run([uv, "pip", "install", "--python", str(python),
                                         *args], env), python, before, expected)


# --------------------------------------------------------------------------- uv projects

UV_PROJECTS = {
    "direct": '"wf-conv", "wf-core", "wf-la"',
    "transitive (wf-app)": '"wf-app"',
    "extra (wf-la[conv])": '"wf-la[conv]"',
}
UV_PROJECT_CELLS = [
    (transport, pages, deps, hostile)
    for transport in ("file", "serve") for pages in ("channel", "top")
    for deps in UV_PROJECTS for hostile in ("none", "UV_INDEX=public")
    if hostile == "none" or (transport, pages) == ("file", "channel")
]


@pytest.mark.parametrize(("transport", "pages", "deps", "hostile"), UV_PROJECT_CELLS,
                         ids=["-".join(c) for c in UV_PROJECT_CELLS])
def test_uv_project(local: Path, public: str, served: str, uv: str, tmp_path: Path,
                    transport: str, pages: str, deps: str, hostile: str):
    """A uv project with the printed pyproject.toml fragment verbatim, reaching the
    index's projects directly, only transitively, or through an extra: uv sync, then uv
    lock --upgrade and uv sync again, with the public index as uv's default index."""
    text = instructions(local, served, transport, pages, "uv", tmp_path)
    tomllib.loads(text)  # the fragment is valid TOML as printed
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "consumer"\nversion = "0"\nrequires-python = ">=3.10"\n'
        f"dependencies = [{UV_PROJECTS[deps]}]\n\n{text}")
    python = fresh_venv(tmp_path / "venv")
    env = _base_env(tmp_path, UV_DEFAULT_INDEX=public,
                    UV_PROJECT_ENVIRONMENT=str(python.parent.parent),
                    **hostile_uv(hostile, public))
    cell = f"uv project | {transport} {pages} | {deps} | {hostile}"
    expected = "refused" if hostile == "UV_INDEX=public" else "kept"
    for what, args in [("uv sync", ["sync"]),
                       ("uv lock --upgrade && uv sync", ["lock", "--upgrade"])]:
        before = state(python)
        done = run([uv, *args, "--python", str(python)], env, cwd=project)
        if done.returncode == 0 and args[0] == "lock":
            done = run([uv, "sync", "--no-build", "--python", str(python)], env, cwd=project)
        outcome(f"{cell} | {what}", done, python, before, expected)


# --------------------------------------------------------------------------- controls

PUBLIC_WON = {"wf-conv": ("98.0", False), "wf-core": ("9.0", False), "wf-la": ("9.0", False)}


def test_controls_without_the_lasting_set_up_the_public_versions_win(
        local: Path, public: str, served: str, uv: str, tmp_path: Path):
    """The matrix is not vacuous: after only the first install (the old instructions: no
    venv pip.conf, no uv.toml), and in a uv project that pins the index's projects with
    [tool.uv.sources] only, the same later commands install the public marker wheels
    (binary only, so the failing sdists do not stop them first)."""
    env = _base_env(tmp_path, PIP_INDEX_URL=public, UV_DEFAULT_INDEX=public)
    pip_text = instructions(local, served, "file", "channel", "pip", tmp_path)
    first = next(c for c in printed_commands(pip_text) if "--isolated" in c)
    python = pip_venv(tmp_path / "pip", "pip-newest")
    assert run_printed(list(first), python, env).returncode == 0 and state(python) == KEPT
    done = run([str(python), "-m", "pip", "install", "-U", "--only-binary", ":all:", *NAMES],
               env)
    assert done.returncode == 0, done.stderr
    assert state(python) == PUBLIC_WON

    uv_text = instructions(local, served, "file", "channel", "uv", tmp_path)
    (uv_first,) = [shlex.split(line[2:]) for line in uv_text.splitlines()
                   if line.startswith("# uv pip install")]
    python = fresh_venv(tmp_path / "uv-venv")  # (tmp_path / "uv" is the uv cache)
    assert run([uv, *uv_first[1:], "--python", str(python)], env).returncode == 0
    assert state(python) == KEPT
    done = run([uv, "pip", "install", "--python", str(python), "--only-binary", ":all:", "-U",
                *NAMES], env)
    assert done.returncode == 0, done.stderr
    assert state(python) == PUBLIC_WON

    project = tmp_path / "consumer"
    project.mkdir()
    url = f"{local.resolve().as_uri()}/{CHANNEL}/simple/"
    sources = "".join(f'{name} = {{ index = "wheelforge" }}\n' for name in NAMES)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "consumer"\nversion = "0"\nrequires-python = ">=3.10"\n'
        'dependencies = ["wf-app"]\n\n[[tool.uv.index]]\nname = "wheelforge"\n'
        f'url = "{url}"\nexplicit = true\n\n[tool.uv.sources]\n{sources}')
    python = fresh_venv(tmp_path / "uv-project")
    done = run([uv, "sync", "--no-build", "--python", str(python)],
               {**env, "UV_PROJECT_ENVIRONMENT": str(python.parent.parent)}, cwd=project)
    assert done.returncode == 0, done.stderr
    assert state(python) == PUBLIC_WON  # sources bind direct dependencies only


# --------------------------------------------------------------------------- consumer-config


def test_unknown_channel_is_a_config_error_listing_the_channels(local: Path, tmp_path: Path):
    done = run([sys.executable, "-m", "wheelforge", "consumer-config", "--index", str(local),
                "--channel", "cu999-torch9.9"], _base_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "has no channel 'cu999-torch9.9'" in done.stderr
    assert f"its channels are: {CHANNEL}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_project_left_out_of_the_pins_says_why(tmp_path: Path):
    root, dist = tmp_path / "index", tmp_path / "dist"
    index.publish(root, _wheel(dist, "wf-conv", CONV, "local"), **CU130)
    index.publish(root, _wheel(dist, "wf-other", "1.0+cu128torch2.14sm120", "local"),
                  **{**CU130, "channel": "cu128-torch2.14", "cuda": "12.8"})
    index.publish(root, _wheel(dist, "wf-gone", "1.0+wf", "local"), **NO_TARGET)
    assert wf("yank", "wf-gone==1.0+wf", "--index", str(root), home=tmp_path)
    done = run([sys.executable, "-m", "wheelforge", "consumer-config", "--index", str(root),
                "--channel", CHANNEL, "--format", "pip"], _base_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "# not pinned: wf-gone: every version is yanked\n"
        "# not pinned: wf-other: not on channel cu130-torch2.14's pages (built for "
        "cu128-torch2.14)\n")
    assert "warning: not pinned: wf-gone: every version is yanked" in done.stderr
    constraints = (root / CHANNEL / "constraints.txt").read_text()
    assert f"wf-conv=={CONV}\n" in constraints
    assert "# wf-gone: not pinned, every version is yanked\n" in constraints
    assert "wf-other" not in constraints
    top = (root / "constraints.txt").read_text()
    assert "wf-other==1.0+cu128torch2.14sm120\n" in top
    # the pins printed and the constraints file agree (one from the records, one from the
    # index's summary cache)
    from wheelforge.consume import install as consumer

    records = index.load_records(root)
    for channel, text in [(CHANNEL, constraints), (None, top)]:
        plan = consumer.plan(records, index_dir=root, url=None, channel=channel)
        assert list(plan.pins) == [line for line in text.splitlines()
                                   if not line.startswith("#")]


@pytest.fixture(autouse=True, scope="module")
def _print_table() -> Iterator[None]:
    yield
    if ROWS:
        print("\n" + "\n".join(["MATRIX SUMMARY", *ROWS]))



def test_the_readmes_uv_line_is_the_printed_one(tmp_path: Path):
    """README's uv block is what build and the landing page print for an index of the
    shipped recipes' wheels at $PWD/index (the checkout), continuations aside; its pip
    line is `wheelforge install` from the checkout."""
    from wheelforge.cli._options import install_lines

    root, dist = tmp_path.resolve() / "index", tmp_path / "dist"
    for name, version, target, tag in [
            ("causal-conv1d", "1.7.0+cu130torch2.14sm120", CU130, "cp311-cp311-linux_x86_64"),
            ("fla-core", "0.6.0+wf", NO_TARGET, "py3-none-any"),
            ("flash-linear-attention", "0.6.0+wf", NO_TARGET, "py3-none-any"),
            ("mamba-ssm", "2.3.2+cu130torch2.14sm120", CU130, "cp311-cp311-linux_x86_64")]:
        index.publish(root, _wheel(dist, name, version, "local", tag=tag), **target)
    from wheelforge.cli._options import uv_command

    text = install_lines(root, None, None).replace(f"file://{root.parent}", "file://$PWD")
    text = text.replace(f"{uv_command()} ", ".venv/bin/uv ")  # the checkout's, as README says
    (printed,) = [ln for ln in text.splitlines() if " .venv/bin/uv venv " in ln]
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    install = readme[readme.index("## Install the stack"):]
    blocks = [b.split("```", 1)[0] for b in install.split("```sh\n")[1:3]]
    assert blocks[0] == ".venv/bin/wheelforge install --python ~/venvs/stack\n"
    assert " ".join(blocks[1].replace("\\\n", " ").split()) == printed


def test_a_channel_that_goes_takes_its_constraints_along(tmp_path: Path):
    root, dist = tmp_path / "index", tmp_path / "dist"
    wheel = _wheel(dist, "wf-conv", CONV, "local")
    index.publish(root, wheel, **CU130)
    index.publish(root, _wheel(dist, "wf-core", CORE, "local"), **NO_TARGET)
    assert (root / CHANNEL / "constraints.txt").is_file()
    index.remove(root, [wheel.name])
    assert not (root / CHANNEL).exists()
    assert (root / "constraints.txt").read_text().endswith(f"\nwf-core=={CORE}\n")
    # a crash that left only a gone channel's constraints: the next rebuild removes them
    (root / CHANNEL).mkdir()
    (root / CHANNEL / "constraints.txt").write_text("wf-conv==1.0\n")
    index.rebuild(root)
    assert not (root / CHANNEL).exists()
