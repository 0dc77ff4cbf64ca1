"""An honest platform tag: the manylinux policy a wheel's shared objects allow.

A setuptools build tags an extension ``linux_x86_64``: true, but pip on another
distribution cannot know whether the wheel runs there, and PyPI-style tooling refuses it.
auditwheel's analysis (the library behind ``auditwheel show``; nothing is grafted and no
file is changed) reads the glibc, libstdc++ and libgcc symbol versions every shared object
needs and the libraries it links, and names the newest manylinux policy those allow.
torch's and CUDA's libraries are excluded: torch's wheel provides them at run time (as
``auditwheel repair --exclude`` does), so they are neither grafted nor held against the
policy.  A wheel that no manylinux policy allows keeps ``linux_x86_64`` and says so.

The analysis runs in a child interpreter, never in wheelforge's own process: auditwheel
unpacks the wheel into a temporary directory and makes it the *process's* working
directory while it reads it, and the builds of one command run in threads of one process,
where another build reading a relative path at that moment (``recipes/``, ``patches/``)
would look inside auditwheel's directory instead.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from auditwheel.architecture import Architecture
from auditwheel.error import AuditwheelError, NonPlatformWheelError
from auditwheel.libc import Libc
from auditwheel.wheel_abi import analyze_wheel_abi

from ... import _proc

__all__ = ["TORCH_PROVIDES", "PlatformTag", "platform_tag"]

#: What torch's wheel (and the CUDA wheels it depends on) provide at run time; never
#: grafted into an extension wheel, never held against its manylinux policy.
TORCH_PROVIDES = frozenset({
    "libc10*.so", "libtorch*.so", "libshm.so", "libcaffe2*.so", "libgomp*.so*",
    "libcudart.so.*", "libcuda.so.*", "libcublas*.so.*", "libcublasLt.so.*", "libcudnn*.so.*",
    "libcufft*.so.*", "libcurand.so.*", "libcusolver*.so.*", "libcusparse*.so.*",
    "libnccl.so.*", "libnvrtc*.so.*", "libnvToolsExt.so.*", "libnvJitLink.so.*",
    "libcupti.so.*", "libnvshmem*.so*", "libcufile*.so.*",
})
_VERSIONED = re.compile(r"^(?P<name>[A-Z_]+)_(?P<version>[0-9][0-9.]*)$")


@dataclass(frozen=True)
class PlatformTag:
    """The platform tag a wheel gets, why, and the symbol versions that decided it."""

    tag: str  # "manylinux_2_34_x86_64", or "linux_x86_64" when none is allowed
    policy: str  # auditwheel's policy name (the tag, or "linux_x86_64")
    symbols: tuple[str, ...]  # the highest version of each symbol set: "GLIBC_2.32", ...
    note: str = ""

    @property
    def manylinux(self) -> bool:
        return self.tag.startswith("manylinux")


def _highest(versioned: dict[str, set[str]]) -> tuple[str, ...]:
    best: dict[str, tuple[int, ...]] = {}
    for symbols in versioned.values():
        for symbol in symbols:
            m = _VERSIONED.match(symbol)
            if m is None:
                continue
            version = tuple(int(p) for p in m["version"].split(".") if p)
            if version > best.get(m["name"], ()):
                best[m["name"]] = version
    return tuple(f"{n}_{'.'.join(map(str, v))}" for n, v in sorted(best.items()))


#: the line of the child's output that holds its answer
_MARK = "wheelforge-platform-tag: "
#: the child that runs the analysis, by its file path
_CHILD = os.path.abspath(Path(__file__).with_name("_tagchild.py"))


def platform_tag(wheel: Path) -> PlatformTag:
    """The newest manylinux tag ``wheel``'s shared objects allow (torch's and CUDA's
    libraries excluded, nothing grafted), or ``linux_x86_64`` with the reason (a
    ``*.libs/`` directory of grafted libraries is refused by verification:
    :func:`wheelforge.wheel.integrity_problems`).  auditwheel's analysis runs in a child
    interpreter (it changes the working directory of the process that runs it)."""
    wheel = wheel.absolute()
    path = json.dumps([p for p in sys.path if p])
    res = _proc.run([sys.executable, _CHILD, str(wheel), path], cwd=wheel.parent,
                    check=False, timeout=600)
    data = _proc.marked(res.output, _MARK)
    if res.returncode != 0 or not isinstance(data, dict):
        last = (res.output.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        return PlatformTag("linux_x86_64", "linux_x86_64", (),
                           note=f"auditwheel could not analyse it: {last[:300]}")
    return PlatformTag(str(data["tag"]), str(data["policy"]),
                       tuple(str(s) for s in data["symbols"]), str(data["note"]))


def _analyse(wheel: Path) -> PlatformTag:
    """:func:`platform_tag`'s answer, found in this process (the child's side: it changes
    this process's working directory while it runs)."""
    try:
        info = analyze_wheel_abi(Libc.GLIBC, Architecture.x86_64, wheel, TORCH_PROVIDES,
                                 disable_isa_ext_check=False, allow_graft=False)
    except NonPlatformWheelError as exc:
        return PlatformTag("any", "none", (), note=str(exc).strip().splitlines()[0])
    except (AuditwheelError, ValueError, OSError) as exc:
        return PlatformTag("linux_x86_64", "linux_x86_64", (),
                           note=f"auditwheel could not analyse it: {exc}")
    symbols = _highest(dict(info.versioned_symbols))
    policy = info.overall_policy.name
    if not policy.startswith("manylinux"):
        why = []
        if info.sym_policy.name == policy:
            why.append(f"symbol versions {', '.join(symbols)} are newer than any policy")
        if info.ref_policy.name == policy:
            libs = sorted({lib for ref in info.external_refs.values() for lib in ref.libs})
            why.append("it links libraries outside every policy"
                       + (f": {', '.join(libs)}" if libs else ""))
        return PlatformTag("linux_x86_64", policy, symbols,
                           note="no manylinux policy allows it; it keeps linux_x86_64 ("
                                + ("; ".join(why) or "see `auditwheel show`") + ")")
    return PlatformTag(policy, policy, symbols)

