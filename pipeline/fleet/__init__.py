"""Fleet builds: a matrix of (recipe, device kind) pairs spread over a Ray cluster.

Each pair is one Ray task that runs the ordinary `pipeline run` on a node advertising that
device kind (kinds.py), in a private folder seeded with the engines already accepted for the
kind (so the stage cache reuses them); the result travels back through Ray's object store
(transfer.py), is verified against its manifest and only then accepted into
engines/fleet/<kind>/<recipe>/ (jobs.py schedules, retries and accepts; worker.py runs on
the node; summary.py writes fleet.json and the tables; pipeline/cli/fleet.py is `pipeline fleet`).
Nothing here imports ray at module level except worker.py and jobs.py, which only the
command imports.
"""
