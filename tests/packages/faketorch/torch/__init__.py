"""A stand-in for torch, just enough for the recipes' setup.py files (unit tests only).

CUDAExtension records the compile arguments it is given to $FAKE_TORCH_RECORD so
tests can see which sources and -gencode / --threads flags setup.py chose.
"""

from . import utils, version  # noqa: F401

__version__ = "2.14.1+cu130"


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
