"""wheelforge's runner of pyproject_hooks' hook script, in the build environment's
interpreter (builder/compiling/backend.py copies this file into a directory of its own,
so that nothing beside it shadows a module, and runs ``python hookrun.py SCRIPT HOOK
DIR``; only the standard library).

It runs the hook script as ``python SCRIPT HOOK DIR`` would (the script's directory first
on the path), and once the hook has returned (its result written to DIR, its output
flushed, no other thread left) ends with ``os._exit`` instead of the interpreter's
teardown: tearing down an interpreter that imported torch takes about 0.3 s of one core
(bench/hook_exit.py).  Skipped with it: atexit handlers (logging's flush is run first)
and the finalizers of objects still alive; a hook that failed (an exception,
``sys.exit``) or left a thread running ends as it would have.
"""

import os
import runpy
import sys
import threading


def run_hook() -> None:
    sys.argv = sys.argv[1:]
    if not getattr(sys.flags, "safe_path", False):  # Python 3.11+: -P, PYTHONSAFEPATH
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")


def end_early() -> None:
    if threading.active_count() == 1:
        if "logging" in sys.modules:
            sys.modules["logging"].shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    run_hook()
    end_early()
