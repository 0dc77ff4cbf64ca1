"""The landing page (<index>/index.html) as a browser renders it: headless Chromium.

One index with an extension wheel (channel, CUDA, torch, archs and a recorded test
result), a pure wheel and a yanked one.  Chromium takes a screenshot (checked for its
size and that it shows text, the green test result and the red yanked label) and dumps
the DOM it parsed (checked for the table's headers and every row, cell by cell).

Needs the Debian package `chromium` (skipped without it, except under CI=true).
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import make_wheel, require_tool
from wheelforge import index

WIDTH, HEIGHT = 1400, 900
HEADERS = ["Pin", "Python", "Channel", "Archs", "File", "Built", "Tested", "SHA-256"]
EXTENSION = "causal_conv1d-1.7.0+cu130torch2.14sm120-cp311-cp311-linux_x86_64.whl"


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("landing")
    root, dist = tmp / "index", tmp / "dist"
    ext = make_wheel(dist, {"causal_conv1d/_C.so": b"\x7fELF" + bytes(300)}, name="causal-conv1d",
                     version="1.7.0+cu130torch2.14sm120", tag="cp311-cp311-linux_x86_64")
    assert ext.name == EXTENSION
    index.publish(root, ext, channel="cu130-torch2.14", cuda="13.0", torch="2.14.1",
                  archs=["sm_120", "sm_100"], build_key="key-1")
    index.set_tested(root, ext.name, {"status": "passed", "gpu": "NVIDIA RTX PRO 6000"})
    for version in ("0.5.0", "0.6.0"):
        pure = make_wheel(dist, {"fla/__init__.py": f"V = {version!r}\n"}, name="fla-core",
                          version=version)
        index.publish(root, pure, channel=None, cuda=None, torch=None, archs=[], build_key=None)
    index.yank(root, "fla-core", "0.5.0", "wrong kernels")
    return root / "index.html"


def browse(chromium: str, tmp_path: Path, *action: str, page: Path
           ) -> subprocess.CompletedProcess[bytes]:
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WIDTH},{HEIGHT}", *action, page.as_uri()]
    done = subprocess.run(argv, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


# --------------------------------------------------------------------------- PNG, stdlib only


def _swar_add(a: bytes, b: bytes) -> bytes:
    """Bytewise (a + b) mod 256 of two equal-length strings, in big-integer arithmetic."""
    n = len(a)
    x, y = int.from_bytes(a, "big"), int.from_bytes(b, "big")
    low, high = int.from_bytes(b"\x7f" * n, "big"), int.from_bytes(b"\x80" * n, "big")
    return (((x & low) + (y & low)) ^ ((x ^ y) & high)).to_bytes(n, "big")


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB bytes) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:][:4])[0]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert header is not None
    width, height, depth, color, _compression, _filter, interlace = header
    assert (depth, interlace) == (8, 0) and color in (2, 6), header
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    assert len(raw) == height * (stride + 1), "truncated image data"
    prev, rows = bytes(stride), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if kind == 0:
            row = line
        elif kind == 2:
            row = _swar_add(line, prev)
        else:
            out = bytearray(line)
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                c = prev[i - bpp] if i >= bpp else 0
                pred = a if kind == 1 else (a + prev[i]) // 2 if kind == 3 else _paeth(
                    a, prev[i], c)
                out[i] = (out[i] + pred) & 0xFF
            row = bytes(out)
        rows.append(row)
        prev = row
    pixels = b"".join(rows)
    if bpp == 4:
        pixels = b"".join(pixels[i:i + 3] for i in range(0, len(pixels), 4))
    return width, height, pixels


def test_screenshot_shows_the_table(chromium: str, landing: Path, tmp_path: Path):
    shot = tmp_path / "landing.png"
    browse(chromium, tmp_path, f"--screenshot={shot}", page=landing)
    width, height, rgb = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    dark = red = green = 0
    for r, g, b in zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True):
        if r + g + b < 200:
            dark += 1
        elif r > 120 and g < 70 and b < 90:
            red += 1  # the yanked label (#a40e26)
        elif g > r + 40 and g > b + 30:
            green += 1  # the passed test result (#116329)
    pixels = width * height
    assert 0.002 * pixels < dark < 0.2 * pixels, f"{dark} dark pixels: blank or unreadable?"
    assert red > 20 and green > 20, (red, green)


# --------------------------------------------------------------------------- DOM


class _Table(HTMLParser):
    """Headers, and each body row's class and cell texts (whitespace collapsed)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.headers: list[str] = []
        self.rows: list[tuple[str, list[str]]] = []
        self.links: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "tr" and self.headers:
            self.rows.append((values.get("class") or "", []))
        elif tag in ("th", "td"):
            self._cell = []
        elif tag == "a" and self._cell is not None:
            self.links.append(values.get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            text = " ".join("".join(self._cell).split())
            (self.headers if tag == "th" else self.rows[-1][1]).append(text)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_dom_has_the_headers_and_every_row(chromium: str, landing: Path, tmp_path: Path):
    dom = browse(chromium, tmp_path, "--dump-dom", page=landing).stdout.decode()
    table = _Table()
    table.feed(dom)
    table.close()
    assert table.headers == HEADERS

    records = {r.filename: r for r in index.load_records(landing.parent)}
    ext = records[EXTENSION]
    pure = records["fla_core-0.6.0-py3-none-any.whl"]
    old = records["fla_core-0.5.0-py3-none-any.whl"]

    def built(r: index.WheelRecord) -> str:
        return r.upload_time[:10]

    size = r"\d+ B|\d+\.\d KiB"
    expected = [
        ("", ["causal-conv1d==1.7.0+cu130torch2.14sm120 copy", "cp311", "cu130-torch2.14",
              "sm_100 sm_120", size, built(ext), "passed on RTX PRO 6000",
              ext.sha256[:12]]),
        ("", ["fla-core==0.6.0 copy", "py3", "every", "-", size, built(pure), "untested",
              pure.sha256[:12]]),
        ("yanked-row", ["fla-core==0.5.0 copy yanked", "py3", "every", "-", size, built(old),
                        "untested", old.sha256[:12]]),
    ]
    assert len(table.rows) == len(expected)
    for (row_class, cells), (want_class, want) in zip(table.rows, expected, strict=True):
        assert row_class == want_class
        assert len(cells) == len(want) == len(HEADERS)
        assert cells[:4] + cells[5:] == want[:4] + want[5:]
        assert re.fullmatch(want[4], cells[4]), cells[4]
    assert "cu130-torch2.14/simple/" in table.links  # the channel cell links its sub-index
    files = [link for link in table.links if link.startswith("files/")]
    assert len(files) == 3
    for link in files:
        assert (landing.parent / link.replace("%2B", "+")).is_file(), link
    assert "wrong kernels" in dom  # the yank reason, on the label's title


# --------------------------------------------------------------------------- layout


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A landing page at its widest: long project names, long local versions, many
    archs, several channels, a long test label."""
    tmp = tmp_path_factory.mktemp("crowded")
    root, dist = tmp / "index", tmp / "dist"
    name = "flash-linear-attention-with-a-very-long-project-name-for-testing"
    for torch, cuda in (("2.14.1", "13.0"), ("2.13.0", "12.8"), ("2.12.0", "12.6")):
        label = (f"cu{cuda.replace('.', '')}torch{torch[:4]}"
                 "sm75sm80sm86sm89sm90asm100asm103sm110sm120asm121ptx")
        wheel = make_wheel(dist, {"x/_C.so": b"\x7fELF" + bytes(64)}, name=name,
                           version=f"12.345.6789rc1+{label}", tag="cp313-cp313-linux_x86_64")
        index.publish(root, wheel, channel=f"cu{cuda.replace('.', '')}-torch{torch[:4]}",
                      cuda=cuda, torch=torch, build_key=f"k-{torch}",
                      archs=["sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103",
                             "sm_110", "sm_120a", "sm_121", "compute_121"])
        index.set_tested(root, wheel.name, {"status": "failed", "gpu": "NVIDIA RTX PRO 6000 "
                                            "Blackwell Max-Q Workstation Edition",
                                            "capability": "12.0"})
    return root / "index.html"


@pytest.mark.parametrize("page", ["landing", "crowded"])
def test_fits_1400_px_without_sideways_scrolling(chromium: str, tmp_path: Path, page: str,
                                                 request: pytest.FixtureRequest) -> None:
    from browser import layout

    html: Path = request.getfixturevalue(page)
    found = layout(chromium, html, tmp_path / "profile", width=WIDTH, height=HEIGHT)
    assert found.client_width == WIDTH
    assert not found.overflows, (found.scroll_width, found.wide)
    if page == "landing":  # one line per wheel: every row as tall as a line of text
        assert found.row_heights and max(found.row_heights) <= 40, found.row_heights


def test_crowded_screenshot(chromium: str, crowded: Path, tmp_path: Path) -> None:
    shot = tmp_path / "crowded.png"
    browse(chromium, tmp_path, f"--screenshot={shot}", page=crowded)
    width, height, rgb = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    dark = sum(1 for i in range(0, len(rgb), 3) if rgb[i] + rgb[i + 1] + rgb[i + 2] < 200)
    assert 0.002 * width * height < dark < 0.3 * width * height


# --------------------------------------------------------------------------- the stack's page


@pytest.fixture(scope="module")
def stack_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped stack in miniature: two extension wheels of one channel (mamba-ssm needs
    causal-conv1d) and two pure ones."""
    tmp = tmp_path_factory.mktemp("stack-page")
    root, dist = tmp / "index", tmp / "dist"
    target = {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1",
              "archs": ["sm_120"], "build_key": "k"}
    conv = make_wheel(dist, {"causal_conv1d/_C.so": b"\x7fELF" + bytes(3000)},
                      name="causal-conv1d", version="1.7.0+cu130torch2.14sm120",
                      tag="cp311-cp311-linux_x86_64", metadata_extra="Requires-Dist: torch")
    index.publish(root, conv, **target)
    index.set_tested(root, conv.name, {"status": "passed", "gpu": "NVIDIA H200",
                                       "capability": "9.0"})
    mamba = make_wheel(dist, {"mamba_ssm/_C.so": b"\x7fELF" + bytes(9000)}, name="mamba-ssm",
                       version="2.3.1+cu130torch2.14sm120", tag="cp311-cp311-linux_x86_64",
                       metadata_extra="Provides-Extra: mamba3\nRequires-Dist: causal-conv1d"
                                      ">=1.4\nRequires-Dist: fla-core; extra == \"mamba3\"")
    index.publish(root, mamba, **target)
    for name in ("fla-core", "flash-linear-attention"):
        pure = make_wheel(dist, {f"{name.replace('-', '_')}/__init__.py": ""}, name=name,
                          version="0.6.0+wf")
        index.publish(root, pure, channel=None, cuda=None, torch=None, archs=[],
                      build_key=None)
    return root / "index.html"


def _install_lines(dom: str) -> list[str]:
    codes = re.findall(r'<div class="cmd"><code>(.*?)</code>', dom, re.S)
    return [re.sub(r"<[^>]+>", "", c).replace("&amp;", "&") for c in codes]


def test_the_stack_page_has_one_line_per_wheel_and_pasteable_install_lines(
        chromium: str, stack_page: Path, tmp_path: Path) -> None:
    from browser import layout

    found = layout(chromium, stack_page, tmp_path / "profile", width=WIDTH, height=HEIGHT)
    assert not found.overflows, (found.scroll_width, found.wide)
    assert len(found.row_heights) == 4 and max(found.row_heights) <= 40, found.row_heights
    # a copy of the index elsewhere names where it is read from (the page's script)
    moved = tmp_path / "copy of index"
    import shutil
    shutil.copytree(stack_page.parent, moved)
    dom = browse(chromium, tmp_path, "--virtual-time-budget=3000", "--dump-dom",
                 page=moved / "index.html").stdout.decode()
    wf_line, uv_line = _install_lines(dom)
    assert wf_line == f"wheelforge install --index {moved}/cu130-torch2.14/ --python ~/venvs/stack"
    assert uv_line.startswith("test -d ~/venvs/stack || uv venv --python 3.11 ~/venvs/stack "
                              "&& uv pip install --python "
                              f"~/venvs/stack --index wheelforge={moved.as_uri()}/")
    assert uv_line.endswith("causal-conv1d fla-core flash-linear-attention mamba-ssm")
    assert "mamba-ssm needs causal-conv1d: installed with it" in dom
    assert "<b>sm_120</b>: RTX PRO 6000 Blackwell, RTX 50xx" in dom
    assert 'data-copy="causal-conv1d==1.7.0+cu130torch2.14sm120"' in dom


def test_served_the_install_lines_name_the_url(chromium: str, stack_page: Path,
                                               tmp_path: Path) -> None:
    from test_index_clients import serve_in_thread

    with serve_in_thread(stack_page.parent) as url:
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
                "--dump-dom", f"{url}/index.html"]
        dom = subprocess.run(argv, capture_output=True, timeout=120,
                             stdin=subprocess.DEVNULL).stdout.decode()
    wf_line, uv_line = _install_lines(dom)
    assert wf_line == f"wheelforge install --index {url}/cu130-torch2.14/ --python ~/venvs/stack"
    assert f"--index wheelforge={url}/cu130-torch2.14/simple/ --constraint {url}/" in uv_line


def test_the_stack_page_screenshot(chromium: str, stack_page: Path, tmp_path: Path) -> None:
    """Looked at by a person when the page changes (docs/index.md says how to make it)."""
    shot = tmp_path / "stack.png"
    browse(chromium, tmp_path, f"--screenshot={shot}", page=stack_page)
    width, height, rgb = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    green = sum(1 for i in range(0, len(rgb), 3)
                if rgb[i + 1] > rgb[i] + 40 and rgb[i + 1] > rgb[i + 2] + 30)
    assert green > 20  # the passed test result
