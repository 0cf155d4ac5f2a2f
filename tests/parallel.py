"""The suite under pytest-xdist.

`make test` runs it in two parts: every test not marked `timing` across one worker more
than the cores (`pytest -n 3 --dist loadfile -m "not timing"` on 2), then the `timing`
tests one at a time (`pytest -m timing`). A `timing` test asserts what a wall-clock
measurement showed (a verdict, an interval, the harness overhead), so it must not share
the CPUs with other tests; under `pytest -n` it is skipped, saying so. `--dist loadfile` keeps a module on one
worker, so a module-scoped fixture (a real `pipeline run`, 10-30 s) is built once; a build
that several modules read is made once for all the workers (conftest.shared_build), and
under `make test` once for both parts (PIPELINE_TEST_BUILDS, a folder the Makefile makes).
"""

from __future__ import annotations

import os

import pytest

ALONE = ("a timing test measures wall-clock time and runs alone: `make test` runs the timing "
         "tests after the parallel part (or run `pytest -m timing` without -n)")


# The modules that take the most of one worker, longest first (seconds summed over each
# module's tests with --junitxml, three workers on 2 cores beside a model build, 2026-12-06:
# fleet 1,787 (its 4-node cluster suffered most from the build), serving 476, interrupt 296,
# task load 228, cli 217, every recipe 212, tune 211, load command 199, torch 190, tampered 190).
# Under --dist loadfile a module runs whole on one worker, so these go first and the short
# modules fill in around them; started last, one of them was the run's tail. `make test`
# passes --no-loadscope-reorder, which keeps this order (xdist's own sorts by test count).
FIRST = ("tests/fleet/test_cluster.py", "tests/serving/test_serve.py", "tests/e2e/test_interrupt.py",
         "tests/loadgen/test_tasks.py", "tests/e2e/test_cli.py", "tests/stages/test_every_recipe.py",
         "tests/commands/test_tune.py", "tests/loadgen/test_command.py", "tests/backends/test_torch.py",
         "tests/e2e/test_tampered.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(FIRST)))  # stable
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # set in xdist's workers only
        return
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.skip(reason=ALONE))
