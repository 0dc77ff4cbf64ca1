"""Write a zip archive (a wheel) in one pass, its large members deflated on every core.

:mod:`zipfile` deflates a member as one stream on one core: mamba-ssm's 49 MiB extension
takes ~1.2 s of a build's end here, a one-core step after a compile that kept every
core busy.  A deflate stream can be cut at byte boundaries: each :data:`CHUNK` of a large
member is deflated on a thread of its own, with the 32 KiB before it as its dictionary
(``zdict``) and ended by a sync flush (an empty stored block), and the parts joined are
one valid stream, as pigz makes them.  zlib leaves the GIL while it deflates, so threads
are enough.  The chunk size is a constant: the bytes depend on the data, never on the
machine's cores.  A member of at most :data:`CHUNK` bytes is one stream, and the headers
are those :mod:`zipfile` writes, so an archive of small members is the same bytes as
:mod:`zipfile`'s (tests/test_zip.py compares); archives of 2 GiB or more, which need
zip64, are left to :mod:`zipfile`.

Readers see an ordinary archive: :mod:`zipfile`, pip, uv and ``unzip -t`` read it
(tests/test_zip.py, and every wheel the tests install).
"""

from __future__ import annotations

import contextlib
import os
import struct
import zipfile
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["CHUNK", "write"]

#: The part of a member each thread deflates (a constant: the bytes never depend on the
#: cores).  pigz uses 128 KiB; 1 MiB keeps the cost of each part's flush (a few bytes)
#: and of handing it to a thread small against the deflate.
CHUNK = 1 << 20
_WINDOW = 1 << 15  # deflate's window: each part's dictionary
_LEVEL = zlib.Z_DEFAULT_COMPRESSION  # zipfile's
_UTF8 = 0x800
_LIMIT = (1 << 31) - 1  # zipfile's ZIP64_LIMIT: at or past it, zipfile writes zip64


def _deflate_part(data: memoryview, start: int) -> bytes:
    end = min(start + CHUNK, len(data))
    z = (zlib.compressobj(_LEVEL, zlib.DEFLATED, -15, zdict=bytes(data[start - _WINDOW:start]))
         if start else zlib.compressobj(_LEVEL, zlib.DEFLATED, -15))
    out = z.compress(data[start:end])
    return out + z.flush(zlib.Z_FINISH if end == len(data) else zlib.Z_SYNC_FLUSH)


def _deflate(data: bytes, pool: ThreadPoolExecutor | None) -> bytes:
    if pool is None or len(data) <= CHUNK:
        z = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15)
        return z.compress(data) + z.flush()
    view = memoryview(data)
    return b"".join(pool.map(lambda start: _deflate_part(view, start),
                             range(0, len(data), CHUNK)))


def _dos(date_time: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return h << 11 | mi << 5 | s // 2, (y - 1980) << 9 | mo << 5 | d


def write(path: Path, entries: Sequence[tuple[zipfile.ZipInfo, bytes]]) -> None:
    """Write ``entries`` to a new file at ``path``, in the order given: the headers
    :mod:`zipfile` writes from each ZipInfo (name, date, compression, versions, modes,
    extra field, comment), its data deflated or stored as the ZipInfo says."""
    if sum(len(data) for _, data in entries) * 1.05 >= _LIMIT:  # zipfile's own estimate
        with zipfile.ZipFile(path, "w") as zf:
            for zi, data in entries:
                zf.writestr(zi, data)
        return
    big = any(len(data) > CHUNK for _, data in entries)
    with ThreadPoolExecutor(os.cpu_count() or 1) if big else contextlib.nullcontext() as pool, \
            open(path, "wb") as f:
        central = []
        for zi, data in entries:
            if zi.compress_type == zipfile.ZIP_DEFLATED:
                packed = _deflate(data, pool)
            elif zi.compress_type == zipfile.ZIP_STORED:
                packed = data
            else:
                raise ValueError(f"{zi.filename}: compression {zi.compress_type} is neither "
                                 "stored nor deflated")
            try:
                name, flags = zi.filename.encode("ascii"), 0
            except UnicodeEncodeError:
                name, flags = zi.filename.encode("utf-8"), _UTF8
            time, date = _dos(zi.date_time)
            crc = zlib.crc32(data)
            mode = zi.external_attr or 0o600 << 16  # zipfile's default
            offset = f.tell()
            f.write(struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", zi.extract_version,
                                zi.reserved, flags, zi.compress_type, time, date, crc,
                                len(packed), len(data), len(name), len(zi.extra)))
            f.write(name + zi.extra)
            f.write(packed)
            central.append(struct.pack(
                "<4s4B4HL2L5H2L", b"PK\x01\x02", zi.create_version, zi.create_system,
                zi.extract_version, zi.reserved, flags, zi.compress_type, time, date, crc,
                len(packed), len(data), len(name), len(zi.extra), len(zi.comment), 0,
                zi.internal_attr, mode, offset) + name + zi.extra + zi.comment)
        start = f.tell()
        f.write(b"".join(central))
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(central), len(central),
                            f.tell() - start, start, 0))

