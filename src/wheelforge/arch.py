"""CUDA architecture lists, as TORCH_CUDA_ARCH_LIST spells them.

``12.0`` is SASS for sm_120; ``9.0a`` is the arch-specific sm_90a;
``12.0+PTX`` adds PTX (compute_120) for forward compatibility.  What people write
instead (``sm_120``, ``120``, ``12``) gets a did-you-mean; CUDA 12.9's family form
(``12.0f``) is refused with the reason (torch's extension builder does not know it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

_ENTRY = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$")

#: The compute capabilities wheelforge knows, with the oldest CUDA release whose nvcc
#: emits SASS for each.  An entry outside this table is refused as unknown.
MIN_CUDA_FOR_ARCH: dict[tuple[int, int], str] = {
    (6, 0): "8.0",
    (6, 1): "8.0",
    (7, 0): "9.0",
    (7, 2): "10.0",
    (7, 5): "10.0",
    (8, 0): "11.0",
    (8, 6): "11.1",
    (8, 7): "11.4",
    (8, 9): "11.8",
    (9, 0): "11.8",
    (10, 0): "12.8",
    (10, 1): "12.8",
    (10, 3): "12.9",
    (11, 0): "13.0",
    (12, 0): "12.8",
    (12, 1): "12.9",
}
#: Capabilities with an arch-specific variant (``9.0a``: wgmma, tcgen05 ...), and the
#: oldest CUDA that compiles it where that is newer than for the plain arch.
ARCH_SPECIFIC = frozenset({(9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)})
MIN_CUDA_FOR_ARCH_SPECIFIC: dict[tuple[int, int], str] = {(9, 0): "12.0"}
#: torch's names for arch sets (torch.utils.cpp_extension), expanded as torch expands them.
NAMED_ARCHES: dict[str, str] = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX", "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX", "Turing": "7.5+PTX", "Ampere+Tegra": "8.7", "Ampere": "8.0;8.6+PTX",
    "Ada": "8.9+PTX", "Hopper": "9.0+PTX", "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}
#: What GPUs each compute capability means, for people reading a page (the usual
#: data-centre and desktop parts; not a complete list).
GPUS: dict[tuple[int, int], str] = {
    (7, 5): "T4, RTX 20xx", (8, 0): "A100, A30", (8, 6): "A10, A40, RTX 30xx",
    (8, 7): "Jetson Orin", (8, 9): "L4, L40, RTX 40xx", (9, 0): "H100, H200, GH200",
    (10, 0): "B200, GB200", (10, 3): "B300, GB300", (11, 0): "Jetson Thor",
    (12, 0): "RTX PRO 6000 Blackwell, RTX 50xx", (12, 1): "DGX Spark (GB10)",
}


def gpus_of(name: str) -> str | None:
    """The GPUs an arch name of a wheel (``sm_120``, ``sm_90a``, ``compute_120``) runs on;
    None for a name this table does not know."""
    match = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)a?", name)
    if not match:
        return None
    return GPUS.get((int(match.group(1)), int(match.group(2))))


_EXAMPLES = ("e.g. --arch 12.0 (RTX PRO 6000, RTX 50xx), --arch '10.0;12.0' (B200 and RTX "
             "PRO 6000), --arch 9.0a, --arch '12.0+PTX'")
_WHY = ("entries are compute capabilities as TORCH_CUDA_ARCH_LIST spells them: MAJOR.MINOR, "
        "optionally with an 'a' suffix and '+PTX', separated by ';', ',' or spaces")


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "" or "a" (arch-specific); "f" (family-specific) is refused
    ptx: bool = False

    @property
    def sm(self) -> str:
        """The SASS name, e.g. ``sm_120`` or ``sm_90a``."""
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}{'+PTX' if self.ptx else ''}"


def min_cuda(arch: Arch) -> str | None:
    """The oldest CUDA release whose nvcc compiles ``arch`` (None: unknown)."""
    base = (arch.major, arch.minor)
    if arch.suffix == "a" and base in MIN_CUDA_FOR_ARCH_SPECIFIC:
        return MIN_CUDA_FOR_ARCH_SPECIFIC[base]
    return MIN_CUDA_FOR_ARCH.get(base)


def _known() -> str:
    return ", ".join(f"{a}.{b}" for a, b in sorted(MIN_CUDA_FOR_ARCH))


def did_you_mean(entry: str) -> str | None:
    """The TORCH_CUDA_ARCH_LIST spelling of what people write for an arch: ``sm_120``,
    ``sm120``, ``compute_120`` (PTX), ``120``, ``12``, ``12.0+ptx`` -> ``12.0``..."""
    m = re.fullmatch(r"(?i)(?P<kind>sm_?|compute_?)?(?P<num>\d{2,3})(?P<suffix>[af]?)"
                     r"(?P<ptx>\+ptx)?", entry)
    if m:
        num = m["num"]
        major, minor = (num[:-1], num[-1]) if len(num) == 3 or m["kind"] else (num, "0")
        if not m["kind"] and len(num) == 2 and (int(num), 0) not in MIN_CUDA_FOR_ARCH:
            major, minor = num[0], num[1]  # "90", "86": the digits of sm_90, sm_86
        ptx = bool(m["ptx"]) or (m["kind"] or "").lower().startswith("compute")
        return f"{int(major)}.{minor}{m['suffix'].lower()}{'+PTX' if ptx else ''}"
    m = re.fullmatch(r"(?i)(?P<major>\d{1,2})(?:\.(?P<minor>\d))?(?P<suffix>[af]?)"
                     r"(?P<ptx>\+ptx)?", entry)
    if m:
        return (f"{int(m['major'])}.{m['minor'] or 0}{m['suffix'].lower()}"
                f"{'+PTX' if m['ptx'] else ''}")
    return None


def _expand(text: str) -> list[str]:
    """Entries as torch reads TORCH_CUDA_ARCH_LIST: spaces are separators like ';' (and
    wheelforge takes ',' too), named arch sets expand (``Hopper`` -> ``9.0+PTX``)."""
    out: list[str] = []
    for entry in (e for e in re.split(r"[;,\s]+", text.strip()) if e):
        if entry == "+PTX" and out:
            raise ConfigError(f"'+PTX' stands alone in {text!r}",
                              why="'+PTX' belongs to the arch before it, without a space "
                                  "(torch reads a space as a separator)",
                              fix=f"write --arch '{out[-1]}+PTX'")
        out.extend(NAMED_ARCHES[entry].split(";") if entry in NAMED_ARCHES else [entry])
    return out


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """Parse ``"10.0;12.0+PTX"`` (``;``, ``,`` or spaces between entries, torch's named
    arch sets expanded); every entry a known compute capability."""
    entries = _expand(text)
    if not entries:
        raise ConfigError("the CUDA architecture list is empty", fix="give " + _EXAMPLES)
    archs: list[Arch] = []
    for entry in entries:
        archs.append(_parse_entry(entry))
    return tuple(sorted(set(archs)))


def _parse_entry(entry: str) -> Arch:
    m = _ENTRY.match(entry)
    if not m:
        if entry.lower() == "native":
            raise ConfigError("'native' is not accepted as an architecture",
                              why="a wheel is built for named architectures, not for the GPUs "
                                  "of the build machine (which may have none)",
                              fix="name the arch: nvidia-smi --query-gpu=compute_cap "
                                  "--format=csv on the target machine says it; " + _EXAMPLES)
        hint = did_you_mean(entry)
        if hint is not None and hint != entry and _ENTRY.match(hint):
            hint_arch = Arch(int(hint.split(".")[0]), int(hint.split(".")[1][0]))
            if (hint_arch.major, hint_arch.minor) in MIN_CUDA_FOR_ARCH:
                raise ConfigError(f"{entry!r} is not a CUDA architecture; did you mean "
                                  f"'{hint}'?", why=_WHY, fix=f"--arch '{hint}'")
        raise ConfigError(f"{entry!r} is not a CUDA architecture", why=_WHY, fix=_EXAMPLES)
    arch = Arch(int(m["major"]), int(m["minor"]), m["suffix"], bool(m["ptx"]))
    base = (arch.major, arch.minor)
    if base not in MIN_CUDA_FOR_ARCH:
        raise ConfigError(f"{arch.major}.{arch.minor} is not a known CUDA compute capability",
                          why=f"wheelforge knows {_known()}",
                          fix="check the GPU's compute capability (nvidia-smi "
                              "--query-gpu=compute_cap --format=csv), e.g. 12.0 for RTX PRO "
                              "6000 and RTX 50xx, 10.0 for B200, 9.0 for H100")
    if arch.suffix == "f":
        raise ConfigError(
            f"{entry!r} is a family-specific target (CUDA 12.9+), which wheelforge does not "
            "build",
            why="CUDA 12.9's family form (sm_120f) is unknown to torch's extension builder "
                "(torch.utils.cpp_extension accepts MAJOR.MINOR and MAJOR.MINORa only), so the "
                "build would stop with 'Unknown CUDA arch'",
            fix=f"use --arch {arch.major}.{arch.minor}: sm_{arch.major}{arch.minor} SASS runs on "
                f"compute capability {arch.major}.{arch.minor} and the later {arch.major}.x "
                "GPUs too")
    if arch.suffix == "a" and base not in ARCH_SPECIFIC:
        raise ConfigError(
            f"{entry!r}: compute capability {arch.major}.{arch.minor} has no arch-specific "
            "variant",
            why="'a' targets exist for " + ", ".join(
                f"{a}.{b}a" for a, b in sorted(ARCH_SPECIFIC)),
            fix=f"use --arch {arch.major}.{arch.minor}")
    return arch


def torch_arch_list(archs: tuple[Arch, ...]) -> str:
    """The value for TORCH_CUDA_ARCH_LIST."""
    return ";".join(str(a) for a in archs)


def label(archs: tuple[Arch, ...]) -> str:
    """The arch part of a local version label: ``sm120``, ``sm100sm120``, ``sm120ptx``."""
    return "".join(f"sm{a.major}{a.minor}{a.suffix}{'ptx' if a.ptx else ''}" for a in archs)


def expected_sass(archs: tuple[Arch, ...]) -> frozenset[str]:
    return frozenset(a.sm for a in archs)


def expected_ptx(archs: tuple[Arch, ...]) -> frozenset[str]:
    return frozenset(a.compute for a in archs if a.ptx)
