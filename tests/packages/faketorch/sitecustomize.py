"""Loaded by the patch tests: stop at the first network access, hide some paths."""

import os
import sys

_hide = os.environ.get("FAKE_HIDE_PREFIX")
if _hide:
    import os.path as _p

    _isfile, _access = _p.isfile, os.access
    _p.isfile = lambda path: False if str(path).startswith(_hide) else _isfile(path)
    os.access = lambda path, mode, **kw: (False if str(path).startswith(_hide)
                                          else _access(path, mode, **kw))


def _audit(event, args):
    if event in ("urllib.Request", "socket.connect", "socket.getaddrinfo"):
        sys.stderr.write(f"NETWORK ACCESS: {event} {args[0]!r}\n")
        sys.stderr.flush()
        os._exit(97)


sys.addaudithook(_audit)
