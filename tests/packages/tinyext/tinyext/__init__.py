"""Tiny CUDA extension fixture for wheelforge's tests."""

__version__ = "0.1.0"
