"""Measurement: the timing protocol (timing.py) and its statistics (stats.py)."""
