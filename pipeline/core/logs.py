"""Log quieting for the libraries the stages call (the ONNX exporters): a stage's concern,
not the command line's, so stages import it from here and never from the UI module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_torch_onnx(verbose: bool) -> Iterator[None]:
    """The ONNX exporters' warnings and torch.onnx's log, kept for -v only."""
    import logging
    import warnings

    if verbose:
        yield
        return
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)

