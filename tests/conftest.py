"""Loaded for every test under tests/; as a rootless conftest its folder is on sys.path, so the
test files share helpers kept here (ports.py)."""
