"""Real clients against the local index: pip and uv, in fresh venvs, over file:// and
over `wheelforge serve`.

Every install goes into a fresh venv (``python -m venv``) and runs in an environment
stripped of this machine's pip/uv configuration (PIP_CONFIG_FILE=/dev/null, no PIP_*
or UV_* variables, no proxies, no shared caches), so only the indexes named here are seen.
The wheels are tiny pure wheels built from a dict of files: no torch, no network.

The dependency-confusion tests run against a second, fake "public" index (a static
index served by make_server on 127.0.0.1) that offers the same project names at
higher versions.  They run the configuration that `wheelforge consumer-config`
prints, parsed from its output, so they prove what users are told.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel
from wheelforge import index
from wheelforge._fs import sha256_file

CHANNEL = "cu130-torch2.14"
CU130: dict[str, Any] = {"channel": CHANNEL, "cuda": "13.0", "torch": "2.14.1",
                         "archs": ["sm_120"], "build_key": "key-1"}
NO_TARGET: dict[str, Any] = {"channel": None, "cuda": None, "torch": None, "archs": [],
                             "build_key": None}
DEMO_LOCAL = "1.0+cu130torch2.14"
TIMEOUT = 180


# --------------------------------------------------------------------------- helpers


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without pip/uv settings or proxies, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("PIP_", "UV_")) and "proxy" not in k.lower()}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", NO_COLOR="1")
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{shlex.join(done.args)}\n{done.stdout}\n{done.stderr}"
    return done


def fresh_venv(path: Path, *, with_pip: bool = False) -> Path:
    """A new venv at ``path``; returns its interpreter."""
    argv = [sys.executable, "-m", "venv", str(path)]
    if not with_pip:
        argv.insert(3, "--without-pip")
    ok(run(argv, clean_env()))
    return path / "bin" / "python"


def pip(python: Path, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """This checkout's pip, installing into the venv of ``python`` (pip --python)."""
    return run([sys.executable, "-m", "pip", "--python", str(python), *args],
               env or clean_env())


def installed(python: Path) -> dict[str, tuple[str, str]]:
    """{normalized name: (version, ORIGIN of its module)} of what the venv holds."""
    found = {}
    for site in (python.parent.parent / "lib").glob("python*/site-packages"):
        for meta in site.glob("*.dist-info/METADATA"):
            headers = BytesHeaderParser().parsebytes(meta.read_bytes())
            module = site / headers["Name"].replace("-", "_") / "__init__.py"
            text = module.read_text() if module.is_file() else ""
            origin = re.search(r"ORIGIN = '(\w+)'", text)
            found[headers["Name"]] = (headers["Version"], origin.group(1) if origin else "")
    return found


def wf(*args: str) -> str:
    """Run the real CLI; its stdout."""
    return ok(run([sys.executable, "-m", "wheelforge", *args], clean_env())).stdout


def pub(root: Path, dist: Path, name: str, version: str, origin: str, *, requires: str = "",
        target: dict[str, Any] | None = None) -> Path:
    module = name.replace("-", "_")
    wheel = make_wheel(dist, {f"{module}/__init__.py": f"ORIGIN = '{origin}'\n"}, name=name,
                       version=version,
                       metadata_extra=f"Requires-Dist: {requires}" if requires else "")
    index.publish(root, wheel, **(target or NO_TARGET))
    return wheel


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local index: wf-demo (a CUDA build, channel cu130-torch2.14, needs wf-dep from
    the public index) and wf-helper (a pure, channel-less wheel)."""
    tmp = tmp_path_factory.mktemp("local")
    root = tmp / "index"
    pub(root, tmp / "dist", "wf-demo", DEMO_LOCAL, "local", requires="wf-dep", target=CU130)
    pub(root, tmp / "dist", "wf-helper", "0.6.0", "local")
    return root


@contextlib.contextmanager
def serve_in_thread(root: Path) -> Iterator[str]:
    """make_server in a thread; its base URL."""
    httpd = index.make_server(root)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fake public index on 127.0.0.1: the local names at higher versions, and wf-dep."""
    tmp = tmp_path_factory.mktemp("public")
    root = tmp / "index"
    pub(root, tmp / "dist", "wf-demo", "99.0", "public")
    pub(root, tmp / "dist", "wf-helper", "9.0", "public")
    pub(root, tmp / "dist", "wf-dep", "1.0", "public")
    with serve_in_thread(root) as url:
        yield url + "/simple/"


@pytest.fixture(scope="module")
def served(local: Path) -> Iterator[str]:
    """``wheelforge serve --index LOCAL --port 0``, the real CLI; its printed base URL.

    Yields the URL the command prints on its first line and checks the second line's
    pip command names the same server.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "wheelforge", "serve", "--index", str(local), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        SERVE_BANNER[:] = [proc.stdout.readline() for _ in range(6)]  # the one-command install
        match = re.fullmatch(r"serving (.+) at (http://127\.0\.0\.1:(\d+))/ \(read-only\); "
                             r"Ctrl-C stops\n", first)
        assert match, (first, proc.stderr.read() if proc.poll() is not None else "")
        assert match.group(1) == str(local) and int(match.group(3)) != 0
        url = match.group(2)
        assert second == f"install channel {CHANNEL}, from any directory:\n"
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def uv_run(uv: str, *args: str, cache: Path, cwd: Path | None = None,
           **env: str) -> subprocess.CompletedProcess[str]:
    return run([uv, *args], clean_env(UV_CACHE_DIR=str(cache), **env), cwd=cwd)


def channel_url(base: str) -> str:
    return f"{base}/{CHANNEL}/simple/"


def file_base(root: Path) -> str:
    return root.resolve().as_uri()


# --------------------------------------------------------------------------- plain installs


def test_pip_installs_over_file_url(local: Path, tmp_path: Path):
    python = fresh_venv(tmp_path / "venv")
    ok(pip(python, "install", "--no-cache-dir", "--index-url", channel_url(file_base(local)),
           "--no-deps", "wf-demo", "wf-helper"))
    assert installed(python) == {"wf-demo": (DEMO_LOCAL, "local"),
                                 "wf-helper": ("0.6.0", "local")}


def test_venv_pip_installs_over_wheelforge_serve(served: str, public: str, tmp_path: Path):
    """The pip that `python -m venv` bundles, with the one-command install `serve` prints
    for its channel, pasted as printed (the venv's path put in), from another directory;
    the dependency wf-dep comes from the user's usual index (the fake public one, which
    also offers wf-demo higher: the pins keep the local one)."""
    venv = tmp_path / "venv"
    python = fresh_venv(venv, with_pip=True)
    (line,) = [ln for ln in SERVE_BANNER if " install --index " in ln]
    assert f"--index {served}/{CHANNEL}/ --python ~/venvs/stack" in line
    argv = shlex.split(line.replace("~/venvs/stack", str(venv)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run(argv, clean_env(PIP_INDEX_URL=public), cwd=elsewhere)
    ok(done)
    got = installed(python)
    assert got["wf-demo"] == (DEMO_LOCAL, "local") and got["wf-helper"] == ("0.6.0", "local")
    assert got["wf-dep"] == ("1.0", "public")
    assert "WARNING" not in done.stdout + done.stderr


@pytest.mark.parametrize("transport", ["file", "http"])
def test_uv_pip_installs_from_the_index(local: Path, served: str, uv: str, tmp_path: Path,
                                        transport: str):
    base = file_base(local) if transport == "file" else served
    python = fresh_venv(tmp_path / "venv")
    ok(uv_run(uv, "pip", "install", "--python", str(python), "--index-url", channel_url(base),
              "--no-deps", "wf-demo", "wf-helper", cache=tmp_path / "uv-cache"))
    assert installed(python) == {"wf-demo": (DEMO_LOCAL, "local"),
                                 "wf-helper": ("0.6.0", "local")}


# --------------------------------------------------------------------------- hashes


def published_hash(root: Path, project: str) -> tuple[str, str]:
    """(version, sha256) of the project's only file, as its PEP 691 page states it."""
    (entry,) = json.loads((root / "simple" / project / "index.json").read_text())["files"]
    return entry["filename"].split("-")[1], entry["hashes"]["sha256"]


def test_pip_and_uv_install_with_require_hashes(local: Path, uv: str, tmp_path: Path):
    version, sha = published_hash(local, "wf-helper")
    assert sha == sha256_file(local / "files" / f"wf_helper-{version}-py3-none-any.whl")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"wf-helper=={version} --hash=sha256:{sha}\n")
    url = channel_url(file_base(local))

    python = fresh_venv(tmp_path / "pip-venv")
    ok(pip(python, "install", "--no-cache-dir", "--require-hashes", "--index-url", url,
           "-r", str(requirements)))
    assert installed(python) == {"wf-helper": ("0.6.0", "local")}

    python = fresh_venv(tmp_path / "uv-venv")
    ok(uv_run(uv, "pip", "install", "--python", str(python), "--require-hashes", "--index-url",
              url, "-r", str(requirements), cache=tmp_path / "uv-cache"))
    assert installed(python) == {"wf-helper": ("0.6.0", "local")}


@pytest.fixture
def tampered(local: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the local index whose wf-helper wheel has one byte flipped, in the first
    local header's modification time: the zip stays valid (CRCs intact), so only the
    sha256 tells.  Returns (index, the published sha256)."""
    root = tmp_path / "tampered"
    shutil.copytree(local, root)
    wheel = root / "files" / "wf_helper-0.6.0-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    assert data[:4] == b"PK\x03\x04"
    data[10] ^= 0x01
    wheel.write_bytes(bytes(data))
    with zipfile.ZipFile(wheel) as zf:
        assert zf.testzip() is None
    return root, published_hash(root, "wf-helper")[1]


PIP_HASH_ERROR = "THESE PACKAGES DO NOT MATCH THE HASHES"


@pytest.mark.parametrize("require_hashes", [False, True])
def test_pip_refuses_a_tampered_wheel(tampered: tuple[Path, str], tmp_path: Path,
                                      require_hashes: bool):
    root, sha = tampered
    python = fresh_venv(tmp_path / "venv")
    args = ["install", "--no-cache-dir", "--index-url", channel_url(file_base(root))]
    if require_hashes:
        (tmp_path / "req.txt").write_text(f"wf-helper==0.6.0 --hash=sha256:{sha}\n")
        args += ["--require-hashes", "-r", str(tmp_path / "req.txt")]
    else:
        args.append("wf-helper")
    done = pip(python, *args)
    assert done.returncode != 0
    assert PIP_HASH_ERROR in done.stderr and f"Expected sha256 {sha}" in done.stderr
    assert installed(python) == {}


@pytest.mark.parametrize("transport", ["file", "http"])
def test_uv_refuses_a_tampered_wheel(tampered: tuple[Path, str], uv: str, tmp_path: Path,
                                     transport: str):
    root, sha = tampered
    python = fresh_venv(tmp_path / "venv")
    with contextlib.ExitStack() as stack:
        base = file_base(root) if transport == "file" else stack.enter_context(
            serve_in_thread(root))
        done = uv_run(uv, "pip", "install", "--python", str(python), "--index-url",
                      channel_url(base), "wf-helper", cache=tmp_path / "uv-cache")
    assert done.returncode != 0
    assert "Hash mismatch" in done.stderr and f"sha256:{sha}" in done.stderr
    assert installed(python) == {}


# --------------------------------------------------------------------------- yanking


@pytest.fixture(scope="module")
def yanked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("yanked")
    root = tmp / "index"
    pub(root, tmp / "dist", "wf-yank", "1.0", "local")
    pub(root, tmp / "dist", "wf-yank", "2.0", "local")
    out = wf("yank", "wf-yank==2.0", "--reason", "broken ABI", "--index", str(root))
    assert out == "yanked wf_yank-2.0-py3-none-any.whl\n"
    return root


@pytest.mark.parametrize(("requirement", "expected"), [("wf-yank", "1.0"),
                                                       ("wf-yank==2.0", "2.0")])
def test_pip_skips_yanked_files_unless_pinned(yanked: Path, tmp_path: Path, requirement: str,
                                              expected: str):
    python = fresh_venv(tmp_path / "venv")
    done = ok(pip(python, "install", "--no-cache-dir", "--index-url",
                  f"{file_base(yanked)}/simple/", requirement))
    assert installed(python) == {"wf-yank": (expected, "local")}
    if expected == "2.0":  # pip says so, with the reason
        assert "yanked" in done.stderr and "broken ABI" in done.stderr


def test_uv_skips_yanked_files_unless_pinned(yanked: Path, uv: str, tmp_path: Path):
    for requirement, expected in [("wf-yank", "1.0"), ("wf-yank==2.0", "2.0")]:
        python = fresh_venv(tmp_path / f"venv-{expected}")
        ok(uv_run(uv, "pip", "install", "--python", str(python), "--index-url",
                  f"{file_base(yanked)}/simple/", requirement, cache=tmp_path / "uv-cache"))
        assert installed(python) == {"wf-yank": (expected, "local")}


# --------------------------------------------------------------------------- dependency confusion

# What consumer-config prints, run with real pip and uv against a public index for the
# first install and for the commands users run later: tests/test_consumer_matrix.py.


def test_the_trap_a_bare_extra_index_url_installs_the_public_upload(
    local: Path, public: str, tmp_path: Path
):
    python = fresh_venv(tmp_path / "venv")
    ok(pip(python, "install", "--no-cache-dir", "--index-url", public,
           "--extra-index-url", channel_url(file_base(local)), "wf-demo", "wf-helper"))
    assert installed(python) == {"wf-demo": ("99.0", "public"), "wf-helper": ("9.0", "public")}


def consumer_config(local: Path, fmt: str, url: str | None) -> str:
    args = ["consumer-config", "--index", str(local), "--channel", CHANNEL, "--format", fmt]
    return wf(*args, *(["--url", url] if url else []))


def commands(text: str, prefix: str) -> list[list[str]]:
    """The commands in ``text`` that start with ``prefix`` (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    return [shlex.split(line.removeprefix("# "))
            for line in joined.splitlines() if line.startswith(prefix)]


SERVE_BANNER: list[str] = []  # the install lines `serve` printed (the served fixture)


# --------------------------------------------------------------------------- regressions


def test_consumer_config_for_a_channel_pins_only_what_the_channel_serves(tmp_path: Path):
    """A channel-less *platform* wheel is listed in simple/ only, never in a channel's
    pages; pinning it in the channel's configuration makes the first pip command fail."""
    root = tmp_path / "index"
    pub(root, tmp_path / "dist", "wf-demo", DEMO_LOCAL, "local", target=CU130)
    native = make_wheel(tmp_path / "dist", {"wf_native/__init__.py": "ORIGIN = 'local'\n"},
                        name="wf-native", version="1.0", tag="cp311-cp311-linux_x86_64")
    index.publish(root, native, **NO_TARGET)
    (first,) = commands(consumer_config(root, "pip", None), "PIP_CONFIG_FILE=/dev/null")
    python = fresh_venv(tmp_path / "venv")
    ok(pip(python, *first[4:], "--no-cache-dir"))  # after "python -m pip install"
    assert installed(python) == {"wf-demo": (DEMO_LOCAL, "local")}


def test_serve_on_a_port_in_use_is_an_error_not_a_crash(local: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run([sys.executable, "-m", "wheelforge", "serve", "--index", str(local),
                    "--port", str(port)], clean_env())
    assert done.returncode == 2, done.stderr  # a usage error, not a "publish error"
    assert done.stderr.startswith(f"config error: cannot serve {local} on 127.0.0.1 port ")
    assert "internal error" not in done.stderr and "--port 0" in done.stderr
