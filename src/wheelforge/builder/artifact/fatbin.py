"""Read which CUDA architectures a shared object holds, from its ELF fatbin sections.

Stdlib only (``struct``, ``mmap``): no cuobjdump, no pyelftools.  The device code of a
CUDA ``.so`` sits in the ELF section ``.nv_fatbin`` (and, for objects built with
``-rdc=true``, ``__nv_relfatbin``).  A section holds one or more fatbin *containers*
back to back (one per translation unit, plus one for nvcc's device-link step); zero
padding between them, if a linker adds any, is skipped.  All integers are little-endian.

Container header (16 bytes)::

    0  u32 magic 0xBA55ED50
    4  u16 version (1)
    6  u16 header_size (16)
    8  u64 fat_size: bytes of entries after the header

Entry header (64 bytes or more; the next entry starts at
``entry_start + header_size + payload_size``)::

    0  u16 kind: 1 PTX, 2 ELF cubin (SASS), 8 LTO IR (ignored here)
    2  u16 version (0x0101)
    4  u32 header_size
    8  u64 payload_size (padded to 8 bytes when compressed)
    16 u32 compressed size (0 when stored uncompressed)
    20 u32 offset of an option block inside the header (0 or 0x40)
    24 u16 minor, 26 u16 major: PTX ISA version for PTX (9.0 with CUDA 13.0)
    28 u32 arch: 75, 80, 90, 100, 103, 110, 120, 121, ...
    32 u32 identifier offset, 36 u32 identifier length (source name, ``-G`` builds)
    40 u64 flags (below)
    56 u64 uncompressed size (0 when stored uncompressed)

Flags, as nvcc 13.0 writes them: 0x1 64-bit, 0x2 debug (``-G``), 0x10 Linux host,
0x2000 LZ4-compressed payload (``-compress-mode=speed``), 0x8000 zstd-compressed payload
(the default for PTX; every image with ``-Xfatbin -compress-all``), 0x100000
architecture-specific target (``sm_90a``), 0x200000 family-specific target
(``sm_120f``).  The architecture lives in the header, so compressed entries are
identified without decompressing them.
"""

from __future__ import annotations

import mmap
import pathlib
import struct
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "CudaArchs",
    "FatbinError",
    "cuda_archs",
    "cuda_archs_of_file",
    "elf_sections",
    "format_archs",
    "parse_fatbin",
]

_FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

_Buffer: TypeAlias = "bytes | mmap.mmap"

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # 64 bytes
_ELF64_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SHT_NOBITS = 8
_SHN_LORESERVE = 0xFF00
_SHN_XINDEX = 0xFFFF

_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_MAGIC_BYTES = struct.pack("<I", _FATBIN_MAGIC)
_CONTAINER = struct.Struct("<IHHQ")  # 16 bytes
_CONTAINER_VERSION = 1
_ENTRY = struct.Struct("<HHIQIIHHIIIQ")  # the 48 bytes read here; real headers are >= 64
_KIND_PTX = 1
_KIND_ELF = 2
_FLAG_ARCH_SPECIFIC = 0x0010_0000  # "a": sm_90a, sm_100a, sm_120a
_FLAG_FAMILY_SPECIFIC = 0x0020_0000  # "f": sm_100f, sm_120f (CUDA 12.9+)


class FatbinError(ValueError):
    """The bytes are not a readable ELF64 little-endian file or hold a corrupt fatbin."""


@dataclass(frozen=True)
class CudaArchs:
    """The CUDA code a binary holds: SASS (``sm_120``, ``sm_90a``) and PTX (``compute_120``)."""

    sass: frozenset[str]
    ptx: frozenset[str]

    @property
    def empty(self) -> bool:
        """True when there is no CUDA code at all."""
        return not self.sass and not self.ptx


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int


def _section_table(buf: _Buffer) -> list[_Section]:
    """The section headers of an ELF64 little-endian file; FatbinError when unreadable."""
    if len(buf) < 4 or buf[:4] != _ELF_MAGIC:
        raise FatbinError("not an ELF file: the data does not start with b'\\x7fELF'")
    if len(buf) < _ELF64_HEADER.size:
        raise FatbinError(
            f"truncated ELF file: {len(buf)} bytes, shorter than the "
            f"{_ELF64_HEADER.size}-byte ELF64 header"
        )
    ident, *_, shoff, _flags, _ehsize, _phentsize, _phnum, shentsize, shnum, shstrndx = (
        _ELF64_HEADER.unpack_from(buf, 0)
    )
    if ident[4] != _ELFCLASS64:
        bits = "32-bit" if ident[4] == 1 else f"EI_CLASS={ident[4]}"
        raise FatbinError(f"unsupported ELF file ({bits}): only ELF64 (ELFCLASS64) is read")
    if ident[5] != _ELFDATA2LSB:
        order = "big-endian" if ident[5] == 2 else f"EI_DATA={ident[5]}"
        raise FatbinError(
            f"unsupported ELF file ({order}): only little-endian (ELFDATA2LSB) is read"
        )
    if shoff == 0:
        raise FatbinError("ELF file has no section header table, so its sections cannot be read")
    if shentsize < _ELF64_SHDR.size:
        raise FatbinError(f"corrupt ELF file: section header size {shentsize} < 64")

    def header(index: int) -> tuple[int, ...]:
        start = shoff + index * shentsize
        if start + _ELF64_SHDR.size > len(buf):
            raise FatbinError(
                f"truncated ELF file: section header {index} at offset {start} "
                f"lies beyond the end ({len(buf)} bytes)"
            )
        return _ELF64_SHDR.unpack_from(buf, start)

    if shnum == 0 or shstrndx == _SHN_XINDEX:  # extended numbering: the values sit in header 0
        first = header(0)
        shnum = shnum or first[5]
        shstrndx = first[6] if shstrndx == _SHN_XINDEX else shstrndx
    if shstrndx == 0 or (_SHN_LORESERVE <= shstrndx < _SHN_XINDEX) or shstrndx >= shnum:
        raise FatbinError(f"corrupt ELF file: section name table index {shstrndx} is invalid")

    raw = [header(i) for i in range(shnum)]
    _, _, _, _, str_offset, str_size, *_ = raw[shstrndx]
    if str_offset + str_size > len(buf):
        raise FatbinError("truncated ELF file: the section name table lies beyond the end")
    names = bytes(buf[str_offset : str_offset + str_size])

    sections = []
    for index, (name_at, sh_type, _, _, offset, size, *_) in enumerate(raw):
        if index == 0:
            continue
        if name_at >= len(names):
            raise FatbinError(
                f"corrupt ELF file: section {index} names offset {name_at} "
                f"outside the name table ({len(names)} bytes)"
            )
        end = names.find(b"\0", name_at)
        name = names[name_at : end if end >= 0 else len(names)].decode("utf-8", "replace")
        if sh_type != _SHT_NOBITS and offset + size > len(buf):
            raise FatbinError(
                f"truncated ELF file: section {name or index} (offset {offset}, "
                f"{size} bytes) lies beyond the end ({len(buf)} bytes)"
            )
        sections.append(_Section(name, sh_type, offset, 0 if sh_type == _SHT_NOBITS else size))
    return sections


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Map each named section of an ELF64 little-endian file to its contents.

    SHT_NOBITS sections (``.bss``) map to ``b""``.  Sections sharing a name (possible in
    relocatable objects) are concatenated in table order.  Raises FatbinError for data
    that is not ELF, is truncated, or is 32-bit or big-endian.
    """
    out: dict[str, bytes] = {}
    for section in _section_table(data):
        if section.name:
            chunk = data[section.offset : section.offset + section.size]
            out[section.name] = out.get(section.name, b"") + chunk
    return out


def _arch_name(prefix: str, arch: int, flags: int, where: int) -> str:
    specific = bool(flags & _FLAG_ARCH_SPECIFIC)
    family = bool(flags & _FLAG_FAMILY_SPECIFIC)
    if specific and family:
        raise FatbinError(
            f"corrupt fatbin entry at offset {where}: flags {flags:#x} mark {prefix}{arch} "
            "both architecture-specific ('a') and family-specific ('f')"
        )
    return f"{prefix}{arch}{'a' if specific else 'f' if family else ''}"


def _parse(buf: _Buffer, start: int, end: int) -> tuple[set[str], set[str]]:
    """SASS and PTX names in the containers that fill ``buf[start:end]``."""
    sass: set[str] = set()
    ptx: set[str] = set()
    pos = start
    while pos < end:
        found = buf.find(_FATBIN_MAGIC_BYTES, pos, end)
        gap_end = end if found < 0 else found
        if buf[pos:gap_end].strip(b"\0"):
            raise FatbinError(
                f"corrupt fatbin: expected a container (magic {_FATBIN_MAGIC:#x}) or zero "
                f"padding at offset {pos - start}, found other bytes"
            )
        if found < 0:
            break
        pos = found
        if pos + _CONTAINER.size > end:
            raise FatbinError(f"truncated fatbin: container header at offset {pos - start}")
        _, version, header_size, fat_size = _CONTAINER.unpack_from(buf, pos)
        if version != _CONTAINER_VERSION:
            raise FatbinError(
                f"unsupported fatbin container version {version} at offset {pos - start} "
                f"(only version {_CONTAINER_VERSION} is known)"
            )
        if header_size < _CONTAINER.size:
            raise FatbinError(
                f"corrupt fatbin: container at offset {pos - start} has header size "
                f"{header_size} < {_CONTAINER.size}"
            )
        entry = pos + header_size
        container_end = entry + fat_size
        if container_end > end:
            raise FatbinError(
                f"truncated fatbin: container at offset {pos - start} declares "
                f"{fat_size} bytes of entries, only {max(end - entry, 0)} remain"
            )
        while entry < container_end:
            where = entry - start
            if entry + _ENTRY.size > container_end:
                raise FatbinError(f"truncated fatbin: entry header at offset {where}")
            kind, _, entry_header, payload, *_, arch, _, _, flags = _ENTRY.unpack_from(buf, entry)
            if entry_header < _ENTRY.size:
                raise FatbinError(
                    f"corrupt fatbin: entry at offset {where} has header size {entry_header} "
                    f"< {_ENTRY.size}"
                )
            if entry + entry_header + payload > container_end:
                raise FatbinError(
                    f"corrupt fatbin: entry at offset {where} ({entry_header}-byte header, "
                    f"{payload}-byte payload) runs past its container"
                )
            if kind == _KIND_ELF:
                sass.add(_arch_name("sm_", arch, flags, where))
            elif kind == _KIND_PTX:
                ptx.add(_arch_name("compute_", arch, flags, where))
            entry += entry_header + payload
        pos = container_end
    return sass, ptx


def parse_fatbin(section: bytes) -> CudaArchs:
    """The architectures in a fatbin section's bytes (one or more containers).

    Raises FatbinError on a corrupt or truncated container.  Entries of kinds other
    than PTX and cubin (such as LTO IR) are skipped.
    """
    sass, ptx = _parse(section, 0, len(section))
    return CudaArchs(frozenset(sass), frozenset(ptx))


def _archs_in(buf: _Buffer) -> CudaArchs:
    sass: set[str] = set()
    ptx: set[str] = set()
    for section in _section_table(buf):
        if section.name in _FATBIN_SECTIONS:
            try:
                found_sass, found_ptx = _parse(buf, section.offset, section.offset + section.size)
            except FatbinError as exc:
                raise FatbinError(f"section {section.name}: {exc}") from exc
            sass |= found_sass
            ptx |= found_ptx
    return CudaArchs(frozenset(sass), frozenset(ptx))


def cuda_archs(data: bytes) -> CudaArchs:
    """The architectures in a shared object's bytes, from all its fatbin sections.

    An ELF file without a fatbin section gives an empty CudaArchs.
    """
    return _archs_in(data)


def cuda_archs_of_file(path: pathlib.Path) -> CudaArchs:
    """The architectures in the shared object at ``path``.

    The file is memory-mapped, so only the headers are read, not the whole (often very
    large) file.  FatbinError messages name the path; OSError passes through.
    """
    with path.open("rb") as handle:
        try:
            if path.stat().st_size == 0:
                raise FatbinError("not an ELF file: the file is empty")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return _archs_in(mapped)
        except FatbinError as exc:
            raise FatbinError(f"{path}: {exc}") from exc


def _arch_sort_key(name: str) -> tuple[int, str, str]:
    prefix, _, rest = name.rpartition("_")
    digits = rest.rstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits) if digits.isdigit() else -1, rest[len(digits) :], prefix)


def format_archs(archs: CudaArchs) -> str:
    """One human line, e.g. ``"SASS sm_90, sm_120; PTX compute_120"``."""

    def names(found: frozenset[str]) -> str:
        return ", ".join(sorted(found, key=_arch_sort_key)) or "none"

    return f"SASS {names(archs.sass)}; PTX {names(archs.ptx)}"
