"""The watchdog of :mod:`wheelforge._proc`, run by its file path as ``python -S -I
_watchdog.py`` (no site, no environment: only the standard library, read from ``/proc``).

It reads lines from stdin: ``+SID`` when a child of wheelforge starts (the leader of a
session of its own), ``-SID`` when that child is done.  At end-of-file (wheelforge is
gone, even by SIGKILL) it kills every process still in a registered session, for at most
5 s, and exits.  It ignores SIGINT: a Ctrl-C at the terminal is wheelforge's to handle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable


def members(sessions: set[int]) -> list[int]:
    """The live (not zombie) processes in ``sessions``, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[3]) in sessions:
                found.append(int(entry))
    return found


def registered(lines: Iterable[str]) -> set[int]:
    """The sessions still registered when ``lines`` end."""
    sessions: set[int] = set()
    for line in lines:
        sid = int(line[1:])
        if line[0] == "+":
            sessions.add(sid)
        else:
            sessions.discard(sid)
    return sessions


def kill_sessions(sessions: set[int]) -> None:
    for _ in range(250):  # at most 5 s
        pids = members(sessions)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kill_sessions(registered(sys.stdin))


if __name__ == "__main__":
    main()
