"""Tests with no process, no socket and no sleep (tests/unit/conftest.py fails one that tries): `pytest tests/unit`."""
