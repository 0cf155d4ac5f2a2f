"""Calibration for Q/DQ: the recipe's calibration feeds, the method, and pre-processing.

ONNX Runtime's calibrators run the graph with every quantizable tensor made an output and
collect ranges (minmax), histograms (percentile, entropy) or distributions (fp8). The
ranges are cached in a JSON file, so sensitivity analysis quantizes the graph many times
from one calibration pass.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from pathlib import Path

from pipeline import data
from pipeline.core.errors import InputError


def reader(feeds: list[dict]):
    """An ORT CalibrationDataReader over a list of feeds (it is consumed once)."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(feeds)

        def get_next(self):
            return next(self._it, None)

        def __len__(self):
            return len(feeds)

    return _Reader()


def method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
            "entropy": CalibrationMethod.Entropy,
            "distribution": CalibrationMethod.Distribution}[name]


# Calibration methods whose ORT calibrator stacks every feed's activations into one array.
HISTOGRAM = {"percentile", "entropy", "distribution"}


def feeds(recipe) -> list[dict]:
    split = data.split(recipe, "calibration")
    if split is None or not split.feeds:
        raise InputError(f"precision.mode {recipe.precision.mode} needs calibration data; "
                         "data.calibration gave none")
    if recipe.precision.calibration in HISTOGRAM:  # text batches differ in length: pad them
        return data.padded_to_longest(split)
    return split.feeds


@contextlib.contextmanager
def quiet(verbose: bool, workdir: Path):
    """ORT's quantization tools print progress, log every node and write temporary files
    into the working directory (quant_pre_process) and into tempfile's folder (its
    calibrators' `ort.quant.*` copies of the graph): keep all of it inside the stage, so a
    kill leaves it in the store's .tmp/ (swept by the next run), never in /tmp."""
    previous, previous_tmp = os.getcwd(), tempfile.tempdir
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")]
    levels = [lg.level for lg in loggers]
    os.chdir(workdir)
    tempfile.tempdir = str(Path(workdir).resolve())
    try:
        if verbose:
            yield
            return
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        os.chdir(previous)
        tempfile.tempdir = previous_tmp
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def preprocess(src: Path, workdir: Path) -> Path:
    """ORT's pre-processing (ONNX shape inference, graph cleanup) that quantization expects.
    Symbolic shape inference fails on both exporters' graphs here, so it is skipped."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = workdir / "preprocessed.onnx"
    quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
    return out


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0
