"""generation/runners.py: every decoder runner keeps one contract (DecoderRunner), as every
engine backend's runner keeps Polygraphy's; a runner missing a call cannot be made."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.generation import runners


def test_every_runner_keeps_the_decoder_contract():
    for cls in (runners.GenaiRunner, runners.OrtLoopRunner, runners.TorchStaticRunner):
        assert issubclass(cls, runners.DecoderRunner) and isinstance(cls.name, str)
        assert isinstance(cls.turns, bool)
    assert not runners.GenaiRunner.turns and runners.OrtLoopRunner.turns


def test_a_runner_without_step_cannot_be_made_and_a_whole_one_closes_itself():
    class NoStep(runners.DecoderRunner):
        name, turns = "no-step", False

        def new(self, batch):
            pass

        def prefill(self, tokens):
            return tokens[:, -1]

        def close(self):
            pass

    with pytest.raises(TypeError, match="step"):
        NoStep()

    class Echo(NoStep):
        closed = False

        def step(self):
            return np.zeros(1, np.int64)

        def close(self):
            self.closed = True

    with Echo() as runner:
        assert runner.prefill(np.array([[3, 4]])).tolist() == [4]
    assert runner.closed
