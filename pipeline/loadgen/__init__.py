"""`pipeline load`: a load generator in its own process, against a served recipe over HTTP.

schedule.py (seeded arrival times) -> client.py (open- or closed-loop async HTTP, every request
timed from its scheduled send time) -> summary.py (one load point: rates, goodput, percentiles
with order-statistic intervals, queue vs compute, batch sizes) -> capacity.py (the highest
Poisson rate whose SLO holds, judged with early_stopping.py, MLPerf LoadGen's rule) and
soak.py (drift over time, leak verdict). The result is an artifacts.serving.LoadResult
written into the recipe's folder through the store (artifact.py) and shown by report.md.
"""
