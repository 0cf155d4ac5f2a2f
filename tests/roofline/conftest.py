"""The builds the roofline tests read: the session's shared ones (one per session, whoever asks
first), so these modules build nothing of their own."""

from __future__ import annotations

import pytest

from tests.conftest import FAST, Project, shared_build
from tests.generation.test_run import LONG


@pytest.fixture(scope="module")
def built_gen(tmp_path_factory) -> Project:
    """The same build as generation/test_run.py's: the tiny GLM decoder with a long point."""
    return shared_build(tmp_path_factory, "standard-gen-long", "standard-gen", "--target", "onnxruntime", *LONG)


@pytest.fixture(scope="module")
def built_standard(tmp_path_factory) -> Project:
    return shared_build(tmp_path_factory, "standard", "standard", *FAST)
