"""data/feeds.py: seeded feeds in range that cycle the profile points, validation kept apart
from calibration, and feeds saved to and read back from .npz."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import data
from pipeline import recipe as recipe_mod


@pytest.fixture
def standard(project, monkeypatch):
    monkeypatch.chdir(project.path)
    return recipe_mod.load("standard")


def test_feeds_are_seeded_in_range_and_cycle_profile_points(standard):
    a = data.feeds(standard, "validation")
    b = data.feeds(standard, "validation")
    assert len(a) == 8
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    shapes = [f["input_ids"].shape for f in a[:3]]
    assert shapes == [(2, 64), (1, 1), (8, 128)]  # opt, min, max
    assert all(f["input_ids"].dtype == np.int64 for f in a)
    assert all(0 <= f["input_ids"].min() and f["input_ids"].max() < 512 for f in a)


def test_validation_never_overlaps_calibration(standard):
    # with a single possible token, every feed of the same shape is identical: the
    # min-shape validation feeds must then be redrawn... which is impossible, so use 2 tokens
    r = recipe_mod.load("standard", ["inputs.0.range=[0, 2]", "data.validation.shapes=[min]",
                                     "data.calibration.shapes=[min]", "data.calibration.samples=1"])
    calibration = {f["input_ids"].tobytes() for f in data.feeds(r, "calibration")}
    validation = [f["input_ids"].tobytes() for f in data.feeds(r, "validation", samples=8)]
    assert not calibration & set(validation)


def test_feeds_round_trip_through_npz(standard, tmp_path):
    feeds = data.feeds(standard, "validation", samples=2)
    outs = [{"logits": np.ones((1, 2), np.float32) * i} for i in range(2)]
    data.save_feeds(tmp_path / "f.npz", feeds, outs)
    back, back_outs = data.load_feeds(tmp_path / "f.npz")
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(feeds, back))
    assert [o["logits"][0, 0] for o in back_outs] == [0, 1]
