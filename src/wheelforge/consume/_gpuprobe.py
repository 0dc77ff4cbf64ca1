"""wheelforge's question to torch about the GPU (consume/gputest.py: probe_gpu), run by its
file path in the interpreter the GPU test uses; only the standard library and that
interpreter's torch (it may lack wheelforge).  Its first act puts ``''`` where the
interpreter put this file's directory, as ``python -c`` has it: nothing beside this file
shadows a module torch imports.

``python _gpuprobe.py``: prints one JSON line: whether CUDA is available, torch's version
and CUDA, and with a GPU its name, compute capability, the number of GPUs and the driver's
version (nvidia-smi's, None where it cannot tell).  Without torch it fails with
``No module named 'torch'``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not getattr(sys.flags, "safe_path", False):  # 3.11+: -P
    sys.path[0] = ""

import json  # noqa: E402  (after the path is python -c's)
import subprocess  # noqa: E402
from typing import Any  # noqa: E402


def driver() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.split()[0]
    except Exception:
        return None


def main() -> None:
    import torch  # type: ignore[import-not-found, unused-ignore]

    out: dict[str, Any] = {"available": torch.cuda.is_available(),
                           "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if out["available"]:
        p = torch.cuda.get_device_properties(0)
        out.update(name=p.name, capability=f"{p.major}.{p.minor}",
                   count=torch.cuda.device_count(), driver=driver())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
