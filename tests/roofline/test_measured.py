"""Floors against ONNX Runtime's profile on a tiny graph: every category the floor names is
measured, efficiency = floor / measured, the spread's median and worst."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.roofline.test_costs import _model, _vi
from tests.roofline.test_model import _entry


def test_a_profiled_graph_beside_its_floor(tmp_path):
    from pipeline.recipe import load
    from pipeline.roofline import measured, shapes
    from pipeline.roofline.points import Point

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                   [_vi("x", ["rows", 64]), _vi("ids", ["rows"], TensorProto.INT64)], [_vi("y", ["rows", 64])], [w])
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    recipe = load("standard")
    feed = measured.feed(shapes.skeleton(path), {"rows": 16}, recipe)
    assert feed["x"].shape == (16, 64) and feed["ids"].dtype == np.int64 and feed["ids"].max() < 256
    checks = measured.check(recipe, "onnxruntime", path, _entry(peaks={"fp32": 1e11}, bandwidth=1e10),
                            [Point("rows 16", "forward", {"rows": 16}), Point("rows 64", "forward", {"rows": 64})],
                            threads=1, runs=3, warmup=1)
    first = checks[0]
    assert {c.category for c in first.categories} == {"matmul/conv", "elementwise"}
    assert first.measured_us > 0 and first.floor_us > 0 and first.efficiency == first.floor_us / first.measured_us
    median, worst = measured.spread(checks)
    assert worst <= median and worst == min(c.efficiency for c in checks)
    table = measured.markdown(checks)
    assert "**whole step**" in table and "| rows 64 |" in table
