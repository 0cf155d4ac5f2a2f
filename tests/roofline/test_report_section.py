"""Every built report's "where the time goes against the floor" (roofline/report_section.py,
written by the validate stage): on the session's shared builds of `standard` (a forward
recipe) and the tiny GLM decoder (standard-gen with a long point), the figures agree with
each other and report.md shows them."""

from __future__ import annotations

import json
import math

from tests.conftest import Project


def _section(project: Project) -> dict:
    report = json.loads((project.built / "report.json").read_text())
    (engine,) = [e for e in report["engines"] if e["kind"] == "onnxruntime"]
    section = engine["roofline"]
    assert section.get("reason") is None, section["reason"]
    return section


def _consistent(point: dict) -> None:
    """Efficiency = floor / measured; the categories' floors sum to the step's; the floor, a
    lower bound, is not above the measured step (a margin for timer noise). The categories'
    measured times are each a median over requests, so they need not add up to the step's
    median: on a busy machine a preempted thread's delay lands in another category each
    request (1.02 against 2.49 ms with three xdist workers on 2 cores, 2026-12-06)."""
    cats = point["categories"]
    assert point["measured_ms"] > 0 and point["floor_ms"] > 0
    assert math.isclose(point["efficiency"], point["floor_ms"] / point["measured_ms"], rel_tol=1e-6)
    assert math.isclose(sum(c["floor_ms"] for c in cats), point["floor_ms"], rel_tol=1e-6)
    assert point["floor_ms"] <= 1.1 * point["measured_ms"]
    assert all(c["measured_ms"] >= 0 for c in cats) and any(c["measured_ms"] > 0 for c in cats)
    assert point["compute_floor_ms"] <= point["floor_ms"] * (1 + 1e-9)
    for c in cats:
        assert c["bound"] in ("compute", "memory")
        assert math.isclose(c["above_floor_ms"], c["measured_ms"] - c["floor_ms"], abs_tol=1e-9)
        if c["measured_ms"] > 0:
            assert math.isclose(c["efficiency"], c["floor_ms"] / c["measured_ms"], rel_tol=1e-6)
    above = [c["above_floor_ms"] for c in cats]
    assert above == sorted(above, reverse=True)  # the place to look first comes first


def test_a_forward_recipe_reports_its_request_against_the_floor(built_standard: Project):
    section = _section(built_standard)
    assert "pipeline hw" in section["hardware_source"] or "measured now" in section["hardware_source"]
    assert section["bandwidth_gb_s"] > 0 and section["peaks"]["fp32"] > 0
    (point,) = section["points"]  # the request shape: every dim at its opt
    assert point["phase"] == "forward" and point["dims"]["batch"] >= 1
    assert point["report_p50_ms"] > 0  # the workload's own wall-clock p50 beside the profile
    _consistent(point)
    assert section.get("long_prefill") is None
    assert section["furthest"] and section["furthest"][0].startswith(point["point"] + ": " +
                                                                     point["categories"][0]["category"])
    md = (built_standard.built / "report.md").read_text()
    assert "### Where the time goes against the floor" in md
    assert f"| {point['point']} | **whole step**" in md and "Furthest from their floors" in md


def test_a_decoder_reports_prefill_decode_and_its_longest_prefill(built_gen: Project):
    section = _section(built_gen)
    prefill, decode = section["points"]
    assert (prefill["phase"], prefill["dims"]["sequence"]) == ("prefill", 8)
    assert (decode["phase"], decode["dims"]["sequence"], decode["dims"]["past_sequence"]) == ("decode", 1, 10)
    for point in (prefill, decode):
        _consistent(point)
        assert point["report_p50_ms"] > 0  # TTFT, TPOT p50 of the same point
    long = section["long_prefill"]  # the long point's 24-token prompt, costed, beside its p50 TTFT
    assert long["tokens"] == 24 and long["measured_ms"] > 0
    assert math.isclose(long["times_floor"], long["measured_ms"] / long["floor_ms"], rel_tol=1e-6)
    assert math.isclose(long["times_compute_floor"], long["measured_ms"] / long["compute_floor_ms"], rel_tol=1e-6)
    md = (built_gen.built / "report.md").read_text()
    assert "The longest prefill (24 tokens) took" in md and "x its compute floor" in md
    assert "| decode @10 | **whole step**" in md


def test_predict_here_names_the_categories_furthest_from_their_floors(built_gen: Project):
    """`pipeline predict` on this machine points at the report's worst categories, where to look."""
    section = _section(built_gen)
    result = built_gen.run("predict", built_gen.built.name)
    assert result.code == 0, result.err
    assert "furthest from their floors on this machine (the report's profile):" in result.out
    worst = section["furthest"][0]
    assert worst.split(" above ")[0] in " ".join(result.out.split())  # "prefill 8: cast/reformat 0.119 ms"
