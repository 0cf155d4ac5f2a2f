"""Explanations: where the time went (profile.py) and where the error came from (layers.py)."""
