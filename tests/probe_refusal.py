"""Shared by the probes that run in a venv of their own (tests/stable_abi_probe.py,
tests/stable_abi_mamba_probe.py; a script's own directory is on its sys.path)."""

from __future__ import annotations

from collections.abc import Callable


def refusal(call: Callable[[], object]) -> str:
    """The message of the RuntimeError ``call`` raises; "" when it raises none."""
    try:
        call()
    except RuntimeError as exc:
        return str(exc)
    return ""
