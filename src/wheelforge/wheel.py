"""Read and rewrite wheels: local version label, torch pin, dropped requirements, RECORD.

A wheel is rewritten into a new file; the input is never modified.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ._fs import TMP_PREFIX


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    name: str
    version: Version
    tags: tuple[str, ...]
    dist_info: str

    @property
    def pure(self) -> bool:
        return all(t.endswith("-none-any") for t in self.tags)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def inspect_wheel(path: Path) -> WheelInfo:
    """Parse the file name (raises packaging's InvalidWheelFilename) and find .dist-info."""
    name, version, _build, tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as zf:
        dist_infos = {n.split("/", 1)[0] for n in zf.namelist()
                      if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dist_infos) != 1:
        raise ValueError(f"{path.name} has {len(dist_infos)} .dist-info directories, expected 1")
    return WheelInfo(path, str(name), version, tuple(sorted(str(t) for t in tags)),
                     dist_infos.pop())


def read_metadata(path: Path) -> bytes:
    info = inspect_wheel(path)
    with zipfile.ZipFile(path) as zf:
        return zf.read(f"{info.dist_info}/METADATA")


def record_problems(path: Path) -> list[str]:
    """Every file must be in RECORD with the right hash and size, and vice versa."""
    info = inspect_wheel(path)
    problems: list[str] = []
    record_name = f"{info.dist_info}/RECORD"
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        if record_name not in names:
            return [f"{record_name} is missing"]
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
        listed: dict[str, tuple[str, str]] = {}
        for row in rows:
            if not row:
                continue
            if len(row) != 3:
                problems.append(f"RECORD row {row!r} does not have 3 fields")
                continue
            listed[row[0]] = (row[1], row[2])
        for name in names:
            if name == record_name:
                continue
            if name not in listed:
                problems.append(f"{name} is not listed in RECORD")
                continue
            data = zf.read(name)
            want_hash, want_size = listed[name]
            if want_hash != record_hash(data):
                problems.append(f"{name}: hash in RECORD does not match the file")
            if want_size and int(want_size) != len(data):
                problems.append(f"{name}: size in RECORD ({want_size}) is not {len(data)}")
        for name in listed:
            if name not in names:
                problems.append(f"RECORD lists {name}, which the wheel does not contain")
    return problems


def _rewrite_metadata(text: str, version: str, torch_pin: str | None,
                      drop: Iterable[str]) -> str:
    head, sep, body = text.partition("\n\n")
    drop_set = {str(canonicalize_name(d)) for d in drop}
    out: list[str] = []
    saw_torch = False
    for line in head.split("\n"):
        if line.startswith("Version:"):
            out.append(f"Version: {version}")
            continue
        if line.startswith("Requires-Dist:"):
            value = line.split(":", 1)[1].strip()
            try:
                req = Requirement(value)
            except InvalidRequirement:
                out.append(line)
                continue
            cname = canonicalize_name(req.name)
            if cname in drop_set:
                continue
            if cname == "torch" and torch_pin is not None:
                saw_torch = True
                marker = f"; {req.marker}" if req.marker else ""
                out.append(f"Requires-Dist: torch{''.join(f'[{e}]' for e in sorted(req.extras))}"
                           f"{torch_pin}{marker}")
                continue
        out.append(line)
    if torch_pin is not None and not saw_torch:
        out.append(f"Requires-Dist: torch{torch_pin}")
    return "\n".join(out) + sep + body


def _rewrite_build(text: str, build_tag: str | None) -> str:
    """The WHEEL file with its ``Build`` field set to ``build_tag`` (None: no field)."""
    lines = [line for line in text.splitlines() if not line.startswith("Build:")]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join([*lines, *([f"Build: {build_tag}"] if build_tag else [])]) + "\n"


def relabeled_name(wheel_name: str, local: str, build_tag: str | None = None) -> str:
    """The file name :func:`relabel` gives a wheel, without writing anything."""
    _name, version, _build, _tags = parse_wheel_filename(wheel_name)
    new_version = f"{version.public}+{local}" if local else version.public
    tags = wheel_name[:-4].split("-")[-3:]
    build = [build_tag] if build_tag else []
    return f"{wheel_name.split('-', 1)[0]}-{'-'.join([new_version, *build, *tags])}.whl"


def relabel(
    path: Path,
    out_dir: Path,
    *,
    local: str,
    torch_pin: str | None,
    drop_requires: Iterable[str] = (),
    build_tag: str | None = None,
) -> Path:
    """Write a copy of the wheel with version ``V+local``, pins and a fresh RECORD.

    ``build_tag`` (PEP 427, e.g. ``"1"``) goes into the file name and the WHEEL file's
    ``Build`` field: it tells a rebuild of the same version and tags from the first
    build, and installers prefer the highest.
    """
    info = inspect_wheel(path)
    base = info.version.public  # as relabeled_name has it
    new_version = f"{base}+{local}" if local else base
    dist_name = info.dist_info[: -len(".dist-info")].rsplit("-", 1)[0]
    new_dist_info = f"{dist_name}-{new_version}.dist-info"
    old_prefix = info.dist_info + "/"
    entries: list[tuple[zipfile.ZipInfo, bytes]] = []
    with zipfile.ZipFile(path) as zf:
        for zi in zf.infolist():
            if zi.is_dir():
                continue
            data = zf.read(zi)
            name = zi.filename
            if name.startswith(old_prefix):
                rel = name[len(old_prefix):]
                if rel == "RECORD":
                    continue
                name = f"{new_dist_info}/{rel}"
                if rel == "METADATA":
                    data = _rewrite_metadata(data.decode("utf-8"), new_version, torch_pin,
                                             drop_requires).encode("utf-8")
                elif rel == "WHEEL" and (build_tag or b"\nBuild:" in data):
                    data = _rewrite_build(data.decode("utf-8"), build_tag).encode("utf-8")
            new = zipfile.ZipInfo(name, date_time=zi.date_time)
            new.external_attr = zi.external_attr
            new.compress_type = zipfile.ZIP_DEFLATED
            entries.append((new, data))
    # dist-info last, RECORD very last (the conventional order installers expect)
    entries.sort(key=lambda e: (e[0].filename.startswith(new_dist_info + "/"), e[0].filename))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for zi, data in entries:
        writer.writerow([zi.filename, record_hash(data), len(data)])
    record_name = f"{new_dist_info}/RECORD"
    writer.writerow([record_name, "", ""])
    out_name = relabeled_name(path.name, local, build_tag)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / out_name
    tmp = out_dir / f"{TMP_PREFIX}{out_name}"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for zi, data in entries:
            zf.writestr(zi, data)
        rzi = zipfile.ZipInfo(record_name, date_time=entries[0][0].date_time if entries else
                              (1980, 1, 1, 0, 0, 0))
        rzi.external_attr = 0o644 << 16
        rzi.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(rzi, record.getvalue())
    os.replace(tmp, final)
    return final


def retag(path: Path, out_dir: Path, build_tag: str | None) -> Path:
    """A copy of a wheel with another build number (PEP 427 build tag), its version and
    requirements unchanged: the file name, the WHEEL file's ``Build`` field and RECORD."""
    info = inspect_wheel(path)
    return relabel(path, out_dir, local=info.version.local or "", torch_pin=None,
                   build_tag=build_tag)
