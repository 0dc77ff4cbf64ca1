"""wheelforge's child for the platform tag (builder/artifact/platform.py: auditwheel's
analysis changes the working directory of the process that runs it), run by its file
path in wheelforge's own interpreter: ``python _tagchild.py WHEEL PATHS`` (PATHS: the
JSON list of the parent's ``sys.path``).  Its first act puts ``''`` where the interpreter
put this file's directory (whose ``platform.py`` would shadow the standard library's), as
``python -c`` has it.  Prints one marked JSON line: the analysis.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):  # 3.11+: -P
    sys.path[0] = ""

import dataclasses  # noqa: E402  (after the path is python -c's)
import json  # noqa: E402
from pathlib import Path  # noqa: E402

if __name__ == "__main__":
    sys.path[:0] = json.loads(sys.argv[2])  # what the parent imports from

from wheelforge.builder.artifact.platform import _MARK, _analyse  # noqa: E402


def main(wheel: str) -> None:
    print(_MARK + json.dumps(dataclasses.asdict(_analyse(Path(wheel)))))


if __name__ == "__main__":
    main(sys.argv[1])
