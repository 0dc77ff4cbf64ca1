"""A stand-in for torch, just enough for causal-conv1d's setup.py (unit tests only).

CUDAExtension records the compile arguments it is given to $FAKE_TORCH_RECORD so
tests can see which -gencode / --threads flags setup.py chose.
"""

from . import utils, version  # noqa: F401

__version__ = "2.14.1+cu130"


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
