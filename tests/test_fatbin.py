"""wheelforge.builder.artifact.fatbin: synthetic ELF and fatbin bytes first, then real nvcc
output."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from wheelforge.builder.artifact.fatbin import (
    CudaArchs,
    FatbinError,
    cuda_archs,
    cuda_archs_of_file,
    elf_sections,
    format_archs,
    parse_fatbin,
)

# --------------------------------------------------------------------------------------
# Synthetic bytes: fatbin entries and containers, and a minimal ELF64 around them.

PTX, CUBIN, LTO_IR = 1, 2, 8
BASE = 0x11  # 64-bit, Linux host: what nvcc 13.0 sets on every entry
LZ4, ZSTD = 0x2000, 0x8000
ARCH_SPECIFIC, FAMILY_SPECIFIC = 0x10_0000, 0x20_0000
MAGIC = 0xBA55ED50


def entry(
    kind: int,
    arch: int,
    flags: int = BASE,
    *,
    payload: bytes = b"\x7fELF....",
    header_size: int = 64,
    payload_size: int | None = None,
) -> bytes:
    """One fatbin entry: header (layout as nvcc 13.0 writes it) and payload."""
    size = len(payload) if payload_size is None else payload_size
    version = (9, 0) if kind == PTX else (1, 8)  # (major, minor) at offsets 26 and 24
    head = struct.pack(
        "<HHIQIIHHIIIQ",
        kind,
        0x0101,
        header_size,
        size,
        0,
        0,
        version[1],
        version[0],
        arch,
        0,
        0,
        flags,
    )
    return head.ljust(header_size, b"\0") + payload


def container(
    *entries: bytes, version: int = 1, header_size: int = 16, fat_size: int | None = None
) -> bytes:
    body = b"".join(entries)
    size = len(body) if fat_size is None else fat_size
    head = struct.pack("<IHHQ", MAGIC, version, header_size, size)
    return head.ljust(header_size, b"\0") + body


def elf64(
    sections: Sequence[tuple[str, bytes]] = (),
    *,
    nobits: Sequence[str] = (),
    ei_class: int = 2,
    ei_data: int = 1,
) -> bytes:
    """A minimal ELF64 shared object: header, section contents, name table, section table."""
    names = b"\0"
    name_at: list[int] = []
    for name in [*(n for n, _ in sections), *nobits, ".shstrtab"]:
        name_at.append(len(names))
        names += name.encode() + b"\0"
    body = bytearray(b"\0" * 64)
    placed: list[tuple[int, int, int]] = []  # (type, offset, size)
    for _, data in sections:
        body += b"\0" * (-len(body) % 8)
        placed.append((1, len(body), len(data)))  # SHT_PROGBITS
        body += data
    placed += [(8, len(body), 4096) for _ in nobits]  # SHT_NOBITS: nothing in the file
    placed.append((3, len(body), len(names)))  # SHT_STRTAB
    body += names
    body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    body += b"\0" * 64  # section 0, SHT_NULL
    for at, (sh_type, offset, size) in zip(name_at, placed, strict=True):
        body += struct.pack("<IIQQQQIIQQ", at, sh_type, 2, 0, offset, size, 0, 0, 8, 0)
    ident = b"\x7fELF" + bytes([ei_class, ei_data, 1]) + b"\0" * 9
    shnum = len(placed) + 1
    body[:64] = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum, shnum - 1
    )
    return bytes(body)


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def section_header(data: bytes, index: int) -> int:
    """File offset of section header ``index`` in an ELF64 built by ``elf64``."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    return int(shoff) + 64 * index


def archs(sass: Sequence[str] = (), ptx: Sequence[str] = ()) -> CudaArchs:
    return CudaArchs(frozenset(sass), frozenset(ptx))


SM120 = entry(CUBIN, 120)
SIMPLE_ELF = elf64([(".text", b"\x90" * 16), (".nv_fatbin", container(SM120))])

# --------------------------------------------------------------------------------------
# CudaArchs and format_archs


@pytest.mark.parametrize(
    ("value", "empty"),
    [
        (archs(), True),
        (archs(sass=["sm_120"]), False),
        (archs(ptx=["compute_120"]), False),
        (archs(["sm_90a"], ["compute_90a"]), False),
    ],
    ids=["nothing", "sass", "ptx", "both"],
)
def test_empty(value: CudaArchs, empty: bool) -> None:
    assert value.empty is empty


def test_cuda_archs_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        archs().sass = frozenset({"sm_120"})  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (archs(), "SASS none; PTX none"),
        (archs(["sm_120"]), "SASS sm_120; PTX none"),
        (archs(ptx=["compute_120"]), "SASS none; PTX compute_120"),
        (
            archs(
                ["sm_120", "sm_90", "sm_100a", "sm_100", "sm_120f"], ["compute_120", "compute_90"]
            ),
            "SASS sm_90, sm_100, sm_100a, sm_120, sm_120f; PTX compute_90, compute_120",
        ),
    ],
    ids=["empty", "sass-only", "ptx-only", "numeric-order"],
)
def test_format_archs(value: CudaArchs, line: str) -> None:
    assert format_archs(value) == line


# --------------------------------------------------------------------------------------
# parse_fatbin


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (b"", archs()),
        (container(SM120), archs(["sm_120"])),
        (container(entry(CUBIN, 90), SM120), archs(["sm_90", "sm_120"])),
        (container(SM120, entry(PTX, 120, BASE | ZSTD)), archs(["sm_120"], ["compute_120"])),
        (container(entry(PTX, 120)), archs(ptx=["compute_120"])),
        (container(entry(CUBIN, 90, BASE | ARCH_SPECIFIC)), archs(["sm_90a"])),
        (container(entry(CUBIN, 120, BASE | FAMILY_SPECIFIC)), archs(["sm_120f"])),
        (
            container(entry(PTX, 100, BASE | ZSTD | ARCH_SPECIFIC)),
            archs(ptx=["compute_100a"]),
        ),
        (
            container(entry(PTX, 120, BASE | ZSTD | FAMILY_SPECIFIC)),
            archs(ptx=["compute_120f"]),
        ),
        # compressed payloads are not valid images; the header alone names the arch
        (
            container(entry(CUBIN, 120, BASE | ZSTD, payload=b"\x28\xb5\x2f\xfd" + b"?" * 12)),
            archs(["sm_120"]),
        ),
        (container(entry(CUBIN, 90, BASE | LZ4, payload=b"\xa2garbage")), archs(["sm_90"])),
        # a longer header (nvcc writes 64 to 120 bytes) and odd payload sizes
        (container(entry(CUBIN, 100, header_size=112, payload=b"x" * 13)), archs(["sm_100"])),
        (container(entry(LTO_IR, 90), SM120), archs(["sm_120"])),
        (container(SM120) + container(entry(PTX, 90)), archs(["sm_120"], ["compute_90"])),
        (container() + container(SM120), archs(["sm_120"])),
        (container(entry(CUBIN, 90)) + b"\0" * 8 + container(SM120), archs(["sm_90", "sm_120"])),
        (container(SM120) + b"\0" * 24, archs(["sm_120"])),
        (container(SM120, header_size=24), archs(["sm_120"])),
        (container(SM120, SM120) + container(SM120), archs(["sm_120"])),
    ],
    ids=[
        "empty-section",
        "sm_120",
        "sm_90+sm_120",
        "sass+ptx",
        "ptx-only",
        "arch-specific-a",
        "family-specific-f",
        "ptx-a",
        "ptx-f",
        "zstd-compressed",
        "lz4-compressed",
        "long-header",
        "lto-ir-ignored",
        "two-containers",
        "empty-container-first",
        "zero-padding-between",
        "zero-padding-after",
        "container-header-24",
        "duplicates-merged",
    ],
)
def test_parse_fatbin(section: bytes, expected: CudaArchs) -> None:
    assert parse_fatbin(section) == expected


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (b"\x01\x02\x03\x04" + container(SM120), "expected a container"),
        (container(SM120) + b"\0\0junk", "expected a container"),
        (container(SM120)[:10], "truncated fatbin: container header"),
        (container(SM120, fat_size=len(SM120) + 8), "declares"),
        (container(SM120, header_size=8), "header size 8 < 16"),
        (container(SM120, version=2), "unsupported fatbin container version 2"),
        (container(SM120[:40], fat_size=40), "truncated fatbin: entry header"),
        (container(entry(CUBIN, 120, header_size=32)), "header size 32 < 48"),
        (container(entry(CUBIN, 120, payload_size=4096)), "runs past its container"),
        (
            container(entry(CUBIN, 120, BASE | ARCH_SPECIFIC | FAMILY_SPECIFIC)),
            "both architecture-specific ('a') and family-specific ('f')",
        ),
    ],
    ids=[
        "bad-magic",
        "garbage-after",
        "container-header-cut",
        "fat-size-past-end",
        "container-header-too-small",
        "unknown-version",
        "entry-header-cut",
        "entry-header-too-small",
        "payload-past-container",
        "a-and-f",
    ],
)
def test_parse_fatbin_rejects(section: bytes, message: str) -> None:
    with pytest.raises(FatbinError, match=re.escape(message)):
        parse_fatbin(section)


def test_fatbin_error_is_a_value_error() -> None:
    assert issubclass(FatbinError, ValueError)


# --------------------------------------------------------------------------------------
# elf_sections


def test_elf_sections_maps_names_to_contents() -> None:
    data = elf64(
        [(".text", b"\x90" * 5), (".nv_fatbin", b"fatbin!"), (".note", b"")], nobits=[".bss"]
    )
    assert elf_sections(data) == {
        ".text": b"\x90" * 5,
        ".nv_fatbin": b"fatbin!",
        ".note": b"",
        ".bss": b"",
        ".shstrtab": b"\0.text\0.nv_fatbin\0.note\0.bss\0.shstrtab\0",
    }


def test_elf_sections_concatenates_same_named_sections() -> None:
    data = elf64([("__nv_relfatbin", b"one"), ("__nv_relfatbin", b"two")])
    assert elf_sections(data)["__nv_relfatbin"] == b"onetwo"


NAME_TABLE = 3  # .text, .nv_fatbin, then .shstrtab in SIMPLE_ELF


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not an ELF file"),
        (b"MZ\x90\x00" + b"\0" * 100, "not an ELF file"),
        (b"!<arch>\n" + b"\0" * 100, "not an ELF file"),
        (SIMPLE_ELF[:40], "truncated ELF file: 40 bytes"),
        (elf64([(".nv_fatbin", b"")], ei_class=1), "32-bit"),
        (elf64([(".nv_fatbin", b"")], ei_data=2), "big-endian"),
        (SIMPLE_ELF[:-10], "truncated ELF file: section header 3"),
        (SIMPLE_ELF[: section_header(SIMPLE_ELF, 0)], "truncated ELF file: section header 0"),
        (
            patched(SIMPLE_ELF, section_header(SIMPLE_ELF, 2) + 32, "<Q", 1 << 20),
            "section .nv_fatbin (offset",
        ),
        (
            patched(SIMPLE_ELF, section_header(SIMPLE_ELF, NAME_TABLE) + 24, "<Q", 1 << 20),
            "the section name table lies beyond the end",
        ),
        (patched(SIMPLE_ELF, 0x28, "<Q", 0), "no section header table"),
        (patched(SIMPLE_ELF, 0x3A, "<H", 40), "section header size 40 < 64"),
        (patched(SIMPLE_ELF, 0x3E, "<H", 99), "section name table index 99 is invalid"),
        (patched(SIMPLE_ELF, 0x3E, "<H", 0), "section name table index 0 is invalid"),
        (
            patched(SIMPLE_ELF, section_header(SIMPLE_ELF, 1), "<I", 10_000),
            "names offset 10000 outside the name table",
        ),
    ],
    ids=[
        "empty",
        "pe-file",
        "ar-archive",
        "header-cut",
        "elf32",
        "big-endian",
        "section-table-cut",
        "section-table-missing",
        "section-past-end",
        "name-table-past-end",
        "no-section-table",
        "section-header-size",
        "name-table-index-out-of-range",
        "name-table-index-undef",
        "name-offset-out-of-range",
    ],
)
def test_elf_sections_rejects(data: bytes, message: str) -> None:
    with pytest.raises(FatbinError, match=re.escape(message)):
        elf_sections(data)


def test_elf_sections_extended_numbering() -> None:
    """e_shnum 0 and e_shstrndx SHN_XINDEX: the real values sit in section header 0."""
    shnum = 4
    data = patched(SIMPLE_ELF, 0x3C, "<H", 0)
    data = patched(data, 0x3E, "<H", 0xFFFF)
    data = patched(data, section_header(data, 0) + 32, "<Q", shnum)  # sh_size
    data = patched(data, section_header(data, 0) + 40, "<I", shnum - 1)  # sh_link
    assert elf_sections(data) == elf_sections(SIMPLE_ELF)


# --------------------------------------------------------------------------------------
# cuda_archs and cuda_archs_of_file


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (elf64([(".text", b"\x90")]), archs()),
        (elf64([(".nv_fatbin", b"")]), archs()),
        (SIMPLE_ELF, archs(["sm_120"])),
        (
            elf64(
                [
                    (".nv_fatbin", container(entry(CUBIN, 90)) + container(SM120)),
                    ("__nv_relfatbin", container(entry(PTX, 90, BASE | ZSTD))),
                ]
            ),
            archs(["sm_90", "sm_120"], ["compute_90"]),
        ),
        (
            elf64([("__nv_relfatbin", container(entry(CUBIN, 90, BASE | ARCH_SPECIFIC)))]),
            archs(["sm_90a"]),
        ),
        (elf64([(".rodata", container(SM120))]), archs()),
    ],
    ids=[
        "no-fatbin-section",
        "empty-fatbin-section",
        "nv_fatbin",
        "nv_fatbin-and-relfatbin",
        "relfatbin-only",
        "fatbin-outside-the-sections-is-not-read",
    ],
)
def test_cuda_archs(data: bytes, expected: CudaArchs, tmp_path: Path) -> None:
    assert cuda_archs(data) == expected
    so = tmp_path / "k.so"
    so.write_bytes(data)
    assert cuda_archs_of_file(so) == expected


def test_cuda_archs_names_the_corrupt_section() -> None:
    data = elf64([("__nv_relfatbin", container(SM120)[:-8])])
    with pytest.raises(FatbinError, match=r"^section __nv_relfatbin: truncated fatbin"):
        cuda_archs(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not an ELF file: the file is empty"),
        (b"#!/bin/sh\n", "not an ELF file"),
        (elf64([(".nv_fatbin", b"junk")]), "section .nv_fatbin: corrupt fatbin"),
    ],
    ids=["empty-file", "script", "corrupt-fatbin"],
)
def test_cuda_archs_of_file_names_the_path(data: bytes, message: str, tmp_path: Path) -> None:
    so = tmp_path / "broken.so"
    so.write_bytes(data)
    with pytest.raises(FatbinError, match=re.escape(f"{so}: {message}")):
        cuda_archs_of_file(so)


def test_cuda_archs_of_file_missing_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cuda_archs_of_file(tmp_path / "missing.so")


# --------------------------------------------------------------------------------------
# Real nvcc output.  Skipped without nvcc, except under CI=true, where that is a failure.


def find_nvcc() -> Path | None:
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(variable)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return Path(root) / "bin" / "nvcc"
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    default = Path("/usr/local/cuda/bin/nvcc")
    return default if default.is_file() else None


def require_nvcc(found: Path | None, ci: str | None) -> Path:
    """The nvcc to use; skip without one, but fail under CI=true, where it must be there."""
    if found is not None:
        return found
    if ci == "true":
        pytest.fail(
            "nvcc not found, and CI=true requires the nvcc tests to run: install the CUDA "
            "toolkit and put nvcc on PATH or set CUDA_HOME",
            pytrace=False,
        )
    pytest.skip("nvcc not found")


@pytest.mark.parametrize(
    ("found", "ci", "outcome"),
    [
        (Path("/opt/cuda/bin/nvcc"), None, "found"),
        (Path("/opt/cuda/bin/nvcc"), "true", "found"),
        (None, None, "skip"),
        (None, "false", "skip"),
        (None, "1", "skip"),
        (None, "true", "fail"),
    ],
    ids=["found", "found-in-ci", "missing", "missing-ci-false", "missing-ci-1", "missing-in-ci"],
)
def test_require_nvcc(found: Path | None, ci: str | None, outcome: str) -> None:
    if outcome == "found":
        assert require_nvcc(found, ci) == found
    elif outcome == "skip":
        with pytest.raises(pytest.skip.Exception, match="^nvcc not found$"):
            require_nvcc(found, ci)
    else:
        with pytest.raises(pytest.fail.Exception, match="CI=true"):
            require_nvcc(found, ci)


@pytest.fixture(scope="session")
def nvcc() -> Path:
    return require_nvcc(find_nvcc(), os.environ.get("CI"))


@pytest.fixture(scope="session")
def nvcc_release(nvcc: Path) -> tuple[int, int]:
    out = subprocess.run(
        [str(nvcc), "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    assert found, f"cannot read the CUDA release from `{nvcc} --version`:\n{out}"
    return int(found[1]), int(found[2])


KERNEL = """\
__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
void launch_add_one(float* x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
"""

ZSTD_FRAME = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class NvccCase:
    id: str
    gencode: tuple[str, ...]
    sass: frozenset[str]
    ptx: frozenset[str]
    mode: tuple[str, ...] = ("-shared",)
    extra: tuple[str, ...] = ()
    needs: tuple[int, int] = (12, 8)  # first CUDA release with sm_120
    zstd: bool = False  # a zstd frame must appear in .nv_fatbin


def case(
    id: str,
    codes: Sequence[str],
    sass: Sequence[str],
    ptx: Sequence[str] = (),
    *,
    mode: tuple[str, ...] = ("-shared",),
    extra: tuple[str, ...] = (),
    needs: tuple[int, int] = (12, 8),
    zstd: bool = False,
) -> NvccCase:
    gencode = tuple(arg for code in codes for arg in ("-gencode", code))
    return NvccCase(id, gencode, frozenset(sass), frozenset(ptx), mode, extra, needs, zstd)


NVCC_CASES = [
    case("sm_120", ["arch=compute_120,code=sm_120"], ["sm_120"]),
    case(
        "sm_90+sm_120",
        ["arch=compute_90,code=sm_90", "arch=compute_120,code=sm_120"],
        ["sm_90", "sm_120"],
    ),
    case(
        "sm_120+compute_120",
        ["arch=compute_120,code=[sm_120,compute_120]"],
        ["sm_120"],
        ["compute_120"],
        zstd=True,
    ),  # nvcc compresses PTX by default
    case("compute_120-only", ["arch=compute_120,code=compute_120"], [], ["compute_120"]),
    case("sm_90a", ["arch=compute_90a,code=sm_90a"], ["sm_90a"]),
    case(
        "sm_120f+compute_120f",
        ["arch=compute_120f,code=[sm_120f,compute_120f]"],
        ["sm_120f"],
        ["compute_120f"],
        needs=(12, 9),
    ),
    case(
        "sm_120-compress-all",
        ["arch=compute_120,code=sm_120"],
        ["sm_120"],
        extra=("-Xfatbin", "-compress-all"),
        zstd=True,
    ),
    case(
        "rdc-object",
        ["arch=compute_90,code=[sm_90,compute_90]"],
        ["sm_90"],
        ["compute_90"],
        mode=("-rdc=true", "-c"),
    ),  # an object file: only __nv_relfatbin
]


@pytest.fixture(scope="module", params=NVCC_CASES, ids=[c.id for c in NVCC_CASES])
def built(
    request: pytest.FixtureRequest,
    nvcc: Path,
    nvcc_release: tuple[int, int],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[NvccCase, Path]:
    """Compile the kernel once per case; the path of the shared object (or object)."""
    spec: NvccCase = request.param
    if nvcc_release < spec.needs:
        pytest.skip(
            f"{spec.id} needs CUDA >= {spec.needs[0]}.{spec.needs[1]}, "
            f"nvcc is {nvcc_release[0]}.{nvcc_release[1]}"
        )
    work = tmp_path_factory.mktemp(spec.id.replace("+", "_"))
    source = work / "k.cu"
    source.write_text(KERNEL)
    output = work / ("k.o" if "-c" in spec.mode else "k.so")
    argv = [
        str(nvcc),
        *spec.mode,
        "-Xcompiler",
        "-fPIC",
        "-o",
        str(output),
        str(source),
        *spec.gencode,
        *spec.extra,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=work)
    if done.returncode != 0:
        pytest.fail(
            f"nvcc failed ({done.returncode}): {' '.join(argv)}\n"
            f"{(done.stdout + done.stderr)[-4000:]}",
            pytrace=False,
        )
    return spec, output


@pytest.mark.nvcc
def test_nvcc_archs(built: tuple[NvccCase, Path]) -> None:
    spec, output = built
    assert cuda_archs_of_file(output) == CudaArchs(spec.sass, spec.ptx)


@pytest.mark.nvcc
def test_nvcc_bytes_and_sections(built: tuple[NvccCase, Path]) -> None:
    spec, output = built
    data = output.read_bytes()
    assert cuda_archs(data) == CudaArchs(spec.sass, spec.ptx)
    sections = elf_sections(data)
    fatbin = sections.get(".nv_fatbin", b"") + sections.get("__nv_relfatbin", b"")
    assert fatbin.startswith(struct.pack("<I", MAGIC))
    if spec.zstd:
        assert ZSTD_FRAME in fatbin, "expected a compressed (zstd) entry"
