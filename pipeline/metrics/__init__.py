"""Numbers computed from outputs: accuracy against a reference, task metrics with bootstrap
intervals, tune's budget metrics and generation metrics."""
