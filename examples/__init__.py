"""Runnable examples. Each folder is a package: ``python -m examples.<name>.run``."""
