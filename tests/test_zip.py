"""wheelforge._zip: archives written in one pass, large members deflated on threads."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest

from wheelforge import _zip
from wheelforge.wheel import check_wheel, record_hash


def _info(name: str, compress: int = zipfile.ZIP_DEFLATED, mode: int = 0o644) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=(2024, 5, 6, 7, 8, 10))
    zi.compress_type = compress
    zi.external_attr = mode << 16 if mode else 0
    return zi


def _large(size: int) -> bytes:
    """Data that deflates part way, as an extension's code does."""
    rng = random.Random(5)
    words = [rng.randbytes(rng.randint(2, 40)) for _ in range(3000)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) if rng.random() < 0.8 else rng.randbytes(64)
    return bytes(out[:size])


def test_small_members_are_the_bytes_zipfile_writes(tmp_path: Path) -> None:
    """An archive whose members are at most one chunk: the same bytes as zipfile's (a
    pure wheel rewritten by wheelforge is what it was before the threads)."""
    entries = [(_info("pkg/__init__.py"), b"x = 1\n" * 100),
               (_info("pkg/data.bin", zipfile.ZIP_STORED), bytes(range(256)) * 4),
               (_info("pkg/\u00fcber.txt"), "gr\u00fc\u00dfe\n".encode()),
               (_info("pkg/no-mode.txt", mode=0), b"zipfile gives it 0600\n"),
               (_info("pkg/empty"), b"")]
    ours, theirs = tmp_path / "ours.zip", tmp_path / "theirs.zip"
    _zip.write(ours, entries)
    with zipfile.ZipFile(theirs, "w") as zf:
        for zi, data in entries:
            zf.writestr(zi, data)
    assert ours.read_bytes() == theirs.read_bytes()


def test_a_large_member_is_one_valid_stream_whatever_the_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _large(3 * _zip.CHUNK + 12345)
    entries = [(_info("pkg/ext.so", mode=0o755), data), (_info("pkg/__init__.py"), b"")]
    paths = []
    for cores in (1, 4):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        path = tmp_path / f"{cores}.zip"
        _zip.write(path, entries)
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    with zipfile.ZipFile(paths[1]) as zf:
        assert zf.testzip() is None
        assert zf.read("pkg/ext.so") == data
        zi = zf.getinfo("pkg/ext.so")
        assert zi.external_attr >> 16 == 0o755 and zlib.crc32(data) == zi.CRC
        assert zi.compress_size < 0.9 * len(data)  # deflated, not stored
        raw = paths[1].read_bytes()
        start = zi.header_offset + 30 + len(zi.filename)
        assert zlib.decompress(raw[start:start + zi.compress_size], -15) == data
    # each chunk's flush and fresh block cost bytes against one stream: a few dozen
    whole = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    one = len(whole.compress(data) + whole.flush())
    assert abs(zi.compress_size - one) < 100 * (len(data) // _zip.CHUNK + 1)


@pytest.mark.integration
def test_pip_installs_a_wheel_whose_large_member_was_deflated_on_threads(
        tmp_path: Path) -> None:
    """pip unpacks the member and checks it against RECORD.  (--no-deps --target: what
    is tested is the archive, not a resolution; the wheel depends on nothing.)"""
    data = _large(2 * _zip.CHUNK + 7)
    dist = "demo_zip-1.0.dist-info"
    files = {"demo_zip/__init__.py": b"", "demo_zip/blob.bin": data,
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: demo-zip\nVersion: 1.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items())
    record += f"{dist}/RECORD,,\n"
    wheel = tmp_path / "demo_zip-1.0-py3-none-any.whl"
    _zip.write(wheel, [(_info(n), d) for n, d in files.items()]
               + [(_info(f"{dist}/RECORD"), record.encode())])
    check_wheel(wheel)
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-index", "--target", str(tmp_path / "site"), str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "site" / "demo_zip" / "blob.bin").read_bytes() == data


def test_compression_other_than_stored_or_deflated_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither stored nor deflated"):
        _zip.write(tmp_path / "x.zip", [(_info("a", zipfile.ZIP_LZMA), b"a")])
