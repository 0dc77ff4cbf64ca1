"""wheelforge: a compile unit's slots from the command's pool (builder/compiling/jobserver.py).

Run as ``python -I -S _gate.py SOCKET SLOTS PRIORITY MAKEFLAGS COMMAND...`` by its file
path, in the build environment's interpreter (stdlib only: wheelforge need not be
installed there).  It asks the pool for SLOTS slots, runs COMMAND once they are granted
(with ``MAKEFLAGS``, the pool's jobserver, where the pool lends: "" where it does not),
forwards the signals it gets to it, and writes the unit's own seconds beside its object
(``OUT`` + :data:`SECONDS_SUFFIX`).
"""

import contextlib
import os
import signal
import socket
import sys
import time

#: The file beside a unit's object where its gate wrote the seconds the unit ran.
SECONDS_SUFFIX = ".wf-seconds"


def ask(address: str, request: str) -> None:
    """Wait for the pool to grant the request (``SLOTS PRIORITY``); a closed pool ends it."""
    pool = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pool.connect(address)
    pool.sendall(request.encode() + b"\n")
    if pool.recv(1) != b"+":
        sys.stderr.write("wheelforge gate: the command's pool of compile slots closed\n")
        sys.exit(1)
    _held.append(pool)  # open until this process ends: the pool then frees the slots


_held: list[socket.socket] = []


def run(command: list[str]) -> tuple[int, float, float]:
    """Run ``command`` with the signals this process gets forwarded to it: its wait
    status, its CPU seconds and its wall seconds."""
    child, stops = 0, []

    def forward(signum: int, _frame: object) -> None:
        if not child:
            stops.append(signum)
            return
        # it ended, and waitpid took it, as the signal came: nothing to forward to
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    started = time.monotonic()
    try:
        child = os.posix_spawnp(command[0], command, os.environ)
    except OSError as exc:
        sys.stderr.write(f"wheelforge gate: cannot run {command[0]}: {exc}\n")
        sys.exit(127)
    for signum in stops:
        os.kill(child, signum)
    status, usage = os.wait4(child, 0)[1:]
    return status, usage.ru_utime + usage.ru_stime, time.monotonic() - started


def record_seconds(command: list[str], slots: str, cpu: float, wall: float) -> None:
    """The unit's own seconds (ninja's log counts its wait here too), on its own slots:
    its wall, or its CPU seconds over its slots where ptxas's threads ran on lent ones
    (the next build packs its units by these: the work, not the luck)."""
    if "-o" not in command[:-1]:
        return
    try:
        with open(command[command.index("-o") + 1] + SECONDS_SUFFIX, "w") as f:
            f.write(f"{max(wall, cpu / max(1, int(slots))):.2f}\n")
    except OSError:
        pass


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # stopped while it waits: it just ends
    address, request, makeflags = sys.argv[1], " ".join(sys.argv[2:4]), sys.argv[4]
    command = sys.argv[5:]
    if makeflags:  # the pool's jobserver, for the ptxas threads past each part's first
        os.environ["MAKEFLAGS"] = makeflags
    ask(address, request)
    status, cpu, wall = run(command)
    record_seconds(command, sys.argv[2], cpu, wall)
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
