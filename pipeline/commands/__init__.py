"""Commands other than `run`: deploy, verify, tune, bench, compare and the CI helpers. Each is
called by cli.py and chains stages or reads recorded artifacts; none is a cached stage."""
