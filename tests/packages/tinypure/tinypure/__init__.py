"""Tiny pure-Python fixture for wheelforge's tests."""

VALUE = 42
