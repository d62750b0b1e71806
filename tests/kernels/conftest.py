"""Kernel tests use the session `device` fixture of tests/conftest.py."""
