"""Measurement: the timing protocol (timing.py) with its clocks, resource monitors, shape
sweeps and plots, the cross-recipe A/B (ab.py) and the decode floor (floor.py); the
statistics it reports are pipeline/core/stats.py."""
