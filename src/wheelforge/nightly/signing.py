"""Builder identity: a stage signed with its builder's SSH key, checked by the publisher.

A builder (``nightly run --signing-key KEY``) writes ``stage.manifest`` (the sha256 of
every file of the stage, cell.json and the wheel included) and signs it with
``ssh-keygen -Y sign`` in the namespace ``wheelforge-stage``: ``stage.manifest.sig``.
The publisher (``nightly publish --allowed-signers FILE``) computes the manifest again
from the files it was given, asks ``ssh-keygen -Y find-principals`` which principal of
its allowed-signers file holds the signing key, and has ``ssh-keygen -Y verify`` check
the signature over its own manifest.  The builder's identity is that principal: a
name the publisher gave a key, never a field the stage writes (``host``).  The trust
model and its limits: docs/trust.md.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import _proc
from .._fs import atomic_write, read_file, sha256_file
from ..errors import ConfigError, VerifyError

__all__ = ["MANIFEST", "NAMESPACE", "SIGNATURE", "SIGNING_KEY_ENV", "Signer", "check_key",
           "manifest", "sign_stage", "verify_stage"]

NAMESPACE = "wheelforge-stage"
MANIFEST = "stage.manifest"
SIGNATURE = "stage.manifest.sig"
SIGNING_KEY_ENV = "WHEELFORGE_SIGNING_KEY"
ALLOWED_SIGNERS_ENV = "WHEELFORGE_ALLOWED_SIGNERS"
TIMEOUT_S = 60.0
_HEADER = "wheelforge stage manifest 1\n"
_FIX = ("run the cell again on a trusted builder (`wheelforge nightly run --signing-key`); "
        "never edit or copy a stage by hand")

SignerState = Literal["verified", "unsigned", "unchecked"]


@dataclass(frozen=True)
class Signer:
    """Who signed a stage: ``verified`` (``identity``: the allowed-signers principals of
    the key, comma separated), ``unsigned``, or ``unchecked`` (signed, intact, but the
    publisher holds no allowed-signers file to say by whom)."""

    state: SignerState
    identity: str | None = None

    def describe(self) -> str:
        if self.state == "verified":
            return f"signed by {self.identity}"
        if self.state == "unchecked":
            return "signed, signer not checked (no --allowed-signers)"
        return "unsigned stage"


def manifest(stage: Path) -> str:
    """The manifest of ``stage``: one ``SHA256  PATH`` line per file (every file below
    it but the manifest and its signature), sorted by path."""
    lines = []
    for root, dirs, files in os.walk(stage):
        dirs.sort()
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(stage).as_posix()
            if any(ord(c) < 0x20 or c == "\x7f" for c in rel):
                raise _refuse(stage, f"it holds a file named {rel!r}",
                              "a control character in a file name (a manifest line each)")
            if rel not in (MANIFEST, SIGNATURE):
                lines.append(f"{sha256_file(path)}  {rel}\n")
    return _HEADER + "".join(sorted(lines, key=lambda line: line[66:]))


def _keygen(args: list[str | Path], what: str, stdin: Path | None = None) -> _proc.Completed:
    done = _proc.run(["ssh-keygen", *args], check=False, timeout=TIMEOUT_S, stdin=stdin)
    if done.returncode == 127:  # _proc's "cannot run": not installed
        raise ConfigError(f"cannot {what}: ssh-keygen did not run", why=done.output.strip(),
                          fix="install OpenSSH's ssh-keygen (8.5 or later)")
    return done


def _sign(directory: Path, text: str, key: Path) -> Path:
    """``text`` written to DIRECTORY/MANIFEST and signed with ``key``: the signature."""
    target = directory / MANIFEST
    atomic_write(target, text)
    done = _keygen(["-Y", "sign", "-n", NAMESPACE, "-f", key, target], f"sign with {key}")
    sig = directory / (MANIFEST + ".sig")
    if done.returncode != 0 or not sig.is_file():
        raise ConfigError(f"cannot sign with the key {key}",
                          why=done.output.strip() or f"ssh-keygen exited {done.returncode}",
                          fix=f"pass --signing-key (or ${SIGNING_KEY_ENV}) a private key "
                              "readable by you alone (chmod 600), without a passphrase, or "
                              "its .pub with the key loaded in ssh-agent")
    return sig


def check_key(key: Path) -> None:
    """Sign a scratch text with ``key`` (before a build of hours, not after it)."""
    with tempfile.TemporaryDirectory(prefix="wf-sign-") as tmp:
        _sign(Path(tmp), _HEADER, key)


def sign_stage(stage: Path, key: Path) -> None:
    """Write the stage's manifest and its signature with ``key`` into ``stage``."""
    text = manifest(stage)
    with tempfile.TemporaryDirectory(prefix="wf-sign-") as tmp:
        sig = _sign(Path(tmp), text, key)
        atomic_write(stage / MANIFEST, text)
        atomic_write(stage / SIGNATURE, read_file(sig))


def _differences(recorded: str, now: str) -> str:
    def parse(text: str) -> dict[str, str]:
        return {line[66:]: line[:64] for line in text.splitlines()[1:] if len(line) > 66}

    old, new = parse(recorded), parse(now)
    lines = [f"{p}: changed after signing" for p in sorted(old.keys() & new.keys())
             if old[p] != new[p]]
    lines += [f"{p}: added after signing" for p in sorted(new.keys() - old.keys())]
    lines += [f"{p}: removed after signing" for p in sorted(old.keys() - new.keys())]
    return "\n    ".join(lines) or "the manifest itself was changed"


def _refuse(stage: Path, what: str, why: str, fix: str = _FIX) -> VerifyError:
    return VerifyError(f"the stage {stage} is refused: {what}; nothing was published",
                       why=why, fix=fix)


def verify_stage(stage: Path, allowed_signers: Path | None) -> Signer:
    """Who signed ``stage`` (its links and special files already refused): a VerifyError
    for a stage changed after signing, a half-signed one, a signature that does not
    verify or a signer ``allowed_signers`` does not list."""
    has_manifest, has_sig = (stage / MANIFEST).is_file(), (stage / SIGNATURE).is_file()
    if not has_manifest and not has_sig:
        return Signer("unsigned")
    if not (has_manifest and has_sig):
        missing = SIGNATURE if has_manifest else MANIFEST
        raise _refuse(stage, f"it lacks {missing}", "a signed stage holds both the manifest "
                      "and its signature")
    recorded = read_file(stage / MANIFEST).decode("utf-8", "replace")
    now = manifest(stage)
    if recorded != now:
        raise _refuse(stage, "its files are not the ones its builder signed",
                      "\n    " + _differences(recorded, now))
    if allowed_signers is None:
        return Signer("unchecked")
    return Signer("verified", _verified_signer(stage, allowed_signers, now))


def _verified_signer(stage: Path, allowed: Path, text: str) -> str:
    sig = stage / SIGNATURE
    found = _keygen(["-Y", "find-principals", "-s", sig, "-f", allowed],
                    f"check the signature of {stage}")
    principals = sorted({p.strip() for p in found.output.splitlines() if p.strip()})
    if found.returncode != 0 or not principals:
        raise _refuse(stage, "its signer is not one the publisher trusts",
                      f"the key that signed {SIGNATURE} is not in {allowed} "
                      f"({found.output.strip() or 'no principal matched'})",
                      fix=f"add the builder's public key to {allowed} (a line `NAME "
                          f'namespaces="{NAMESPACE}" KEY`) if you trust it; else do not '
                          "publish this stage")
    with tempfile.TemporaryDirectory(prefix="wf-verify-") as tmp:
        mine = Path(tmp) / MANIFEST
        atomic_write(mine, text)  # the publisher's own manifest, not the stage's file
        for principal in principals:
            ok = _keygen(["-Y", "verify", "-f", allowed, "-I", principal, "-n", NAMESPACE,
                          "-s", sig], f"verify the signature of {stage}", stdin=mine)
            if ok.returncode != 0:
                raise _refuse(stage, f"its signature does not verify for {principal}",
                              ok.output.strip() or f"ssh-keygen exited {ok.returncode}")
    return ",".join(principals)
