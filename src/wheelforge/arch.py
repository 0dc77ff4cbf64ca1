"""CUDA architecture lists, as TORCH_CUDA_ARCH_LIST spells them.

``12.0`` is SASS for sm_120; ``9.0a`` is the arch-specific sm_90a;
``12.0+PTX`` adds PTX (compute_120) for forward compatibility.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

_ENTRY = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$")


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "", "a" (arch-specific) or "f" (family-specific)
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


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """Parse ``"10.0;12.0+PTX"`` (``;``, ``,`` or spaces between entries)."""
    entries = [e for e in re.split(r"[;,\s]+", text.strip()) if e]
    if not entries:
        raise ConfigError("the CUDA architecture list is empty",
                          fix="give e.g. --arch 12.0 (RTX PRO 6000 / RTX 50xx) or "
                              "--arch '10.0;12.0' (B200 and RTX PRO 6000)")
    archs: list[Arch] = []
    for entry in entries:
        m = _ENTRY.match(entry)
        if not m:
            raise ConfigError(
                f"{entry!r} is not a CUDA architecture",
                why="entries are compute capabilities as in TORCH_CUDA_ARCH_LIST: MAJOR.MINOR, "
                    "optionally with an 'a' or 'f' suffix and '+PTX'",
                fix="e.g. --arch 12.0, --arch '9.0a;10.0', --arch '12.0+PTX'",
            )
        arch = Arch(int(m["major"]), int(m["minor"]), m["suffix"], bool(m["ptx"]))
        if arch not in archs:
            archs.append(arch)
    return tuple(sorted(archs))


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
