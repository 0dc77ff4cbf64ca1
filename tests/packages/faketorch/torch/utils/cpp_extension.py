import json
import os

from setuptools import Extension
from setuptools.command.build_ext import build_ext

# like torch: $CUDA_HOME or $CUDA_PATH (the PATH and /usr/local/cuda guesses are left out)
CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or None
HIP_HOME = None
ROCM_HOME = None
IS_HIP_EXTENSION = False


class BuildExtension(build_ext):
    def run(self):  # compile nothing
        pass


def CppExtension(name, sources, **kw):  # noqa: N802
    return Extension(name, sources=[])


def CUDAExtension(name, sources, extra_compile_args=None, **kw):  # noqa: N802
    record = os.environ.get("FAKE_TORCH_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump({"name": name, "extra_compile_args": extra_compile_args,
                       "sources": [str(s) for s in sources],
                       "torch_cuda_home": CUDA_HOME, "env_cuda_home": os.environ.get("CUDA_HOME"),
                       "env_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST")},
                      f)
    return Extension(name, sources=[])
