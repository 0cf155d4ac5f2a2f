"""Orchestration of one recipe's run: the stage chain, the content-addressed stage cache, the
checks before any work, the code digests in cache keys, recipe limits, and the timing openers."""
