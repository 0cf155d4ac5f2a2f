"""Markdown for the precision stage's meta and an engine's effective precision (report.md).

Rendered from report.json alone, like the rest of the report.
"""

from __future__ import annotations

from pipeline.core import text
from pipeline.core.text import fmt


def markdown(p: dict) -> list[str]:
    """report.md's Precision section from the precision stage's meta: how the graph was
    quantized, which nodes and which not, parity vs the FP32 graph, the sensitivity analysis."""
    lines = ["", "## Precision", "", f"- mode: **{p['mode']}**"]
    lines += _method_lines(p)
    lines += _node_lines(p)
    lines += _kv_cache_lines(p)
    lines += _parity_lines(p)
    sens = p.get("sensitivity")
    if sens:
        lines += _sensitivity_markdown(sens)
    return lines


def _kv_cache_lines(p: dict) -> list[str]:
    """precision.kv_cache: the cache's type and, for int8, what its scales were calibrated on."""
    kind = p.get("kv_cache")
    if kind in (None, "float32"):
        return []
    line = f"- KV cache: **{kind}** ({p['bytes_per_element']} bytes an element, float32's 4)"
    cal = p.get("kv_calibration")
    if cal:
        line += (f"; per-channel scales calibrated on {cal['tokens']} tokens in {cal['sequences']} "
                 f"sequence(s) (scales {cal['scale_range'][0]:.2e} to {cal['scale_range'][1]:.2e})")
    return [line]


def _method_lines(p: dict) -> list[str]:
    """Calibration, scheme, weight range and smoothing, each when the mode has it."""
    lines = []
    cal = p.get("calibration")
    if cal:
        lines.append(f"- calibration: {cal['method']} on {cal['samples']} feeds ({cal['source']}), "
                     f"{cal['seconds']:.1f} s (calibration + quantization)")
    if p.get("scheme") == "dynamic":
        lines.append("- scheme: **dynamic** (int8 weights; activations quantized at run time, "
                     "uint8 per tensor)")
    wr = p.get("weight_range")
    if wr:
        lines.append(f"- weights: {wr['bits']}-bit range (weight_range {wr['setting']}; CPU VNNI: "
                     f"{'yes' if wr['cpu']['vnni'] else 'no'})")
    if "gptq_nodes" in p:
        e = p["relative_output_error"]
        lines.append(f"- GPTQ: {p['gptq_nodes']} nodes on {p['calibration_tokens']:,} calibration tokens "
                     f"({p['calibration_feeds']} feeds); the layers' output error on them, relative "
                     f"to their output: {e['rtn']} with round-to-nearest, {e['gptq']} with GPTQ")
    if "autoround_nodes" in p:
        ratios = sorted(f["autoround"] / f["rtn"] for f in p["layer_output_error"] if f["rtn"] > 0)
        kept = p["rounded_to_nearest"]
        lines.append(f"- AutoRound: {p['autoround_nodes']} nodes fitted to their decoder layer's output on "
                     f"{p['calibration_tokens']:,} calibration tokens ({p['autoround']['iters']} steps a layer); "
                     f"each layer's output error x{ratios[len(ratios) // 2]:.2f} of the same layer rounded to "
                     f"nearest on the same inputs (median; worst layer x{ratios[-1]:.2f})"
                     + (f"; round-to-nearest (no decoder layer's): {', '.join(kept)}" if kept else ""))
    sm = p.get("smoothing")
    if sm:
        lines.append(f"- SmoothQuant smoothing: alpha {sm['alpha']:g} on {sm['nodes']} nodes "
                     f"({sm['activations']} activations"
                     + (f"; largest outlier ratio {sm['outlier_ratio_max']:g}" if "outlier_ratio_max" in sm else "")
                     + ")")
    return lines


def _node_lines(p: dict) -> list[str]:
    """Which nodes were quantized (or taken from the checkpoint's blocks), which kept in FP32
    or out of the int8 kernels."""
    lines = []
    if p.get("source") == "checkpoint":  # INT4 from a GGUF's own blocks (precision/checkpoint.py)
        w = p["weights_vs_baseline"]
        lines.append(f"- quantized nodes: {p['quantized_nodes']} MatMuls from the checkpoint's own blocks "
                     f"({', '.join(f'{n} {t.upper()}' for t, n in p['by_block_type'].items() if n)}; "
                     f"block size {p['block_size']}), not quantized a second time; weights vs the "
                     f"baseline's: max |diff| {w['max_abs']:.2e}, bit-exact share {fmt(w['bit_exact_share'], '.4f')}; "
                     f"activations int8 per block at run time (accuracy_level {p['accuracy_level']})"
                     + (f"; left float: {', '.join(p['left_float'])}" if p["left_float"] else ""))
        for e in p.get("embeddings") or []:  # Gather of a Q8_0 table -> GatherBlockQuantized
            lines.append(f"- embedding {e['node']}: {e['rows']} {e['blocks'].upper()} rows gathered in 8 bits "
                         + ("from the LM head's own initializer (stored once)" if e["shares_head"] else "(a table of its own)")
                         + f"; rows vs the baseline's: max |diff| {e['max_abs']:.2e}, bit-exact share "
                         f"{fmt(e['bit_exact_share'], '.4f')}")
    elif "quantized_nodes" in p:
        symmetric = ("symmetric (zero point 0)" if p.get("symmetric", True) else
                     "asymmetric weights (integer zero points)" if p.get("weight_only") else "asymmetric activations")
        lines.append(f"- quantized nodes: {p['quantized_nodes']} of {p['quantizable_nodes']} "
                     f"({', '.join(p.get('op_types') or ['MatMul'])}); {symmetric}"
                     + (", per-channel weights" if p.get("per_channel") else "")
                     + (f", block size {p['block_size']}" if p.get("block_size") else ""))
    if "fp32_nodes" in p:
        lines.append(f"- kept in FP32: {p['fp32_nodes']} nodes (block list: "
                     f"{', '.join(p['block_list'])}); keep_io_types: {p['keep_io_types']}")
    excluded = p.get("excluded") or []
    if excluded:
        lines.append("- kept out of the int8 kernels: " + ", ".join(
            f"`{e['node']}` ({e['why']}; runs as {e.get('runs_as', 'float')})" for e in excluded))
    return lines


def _parity_lines(p: dict) -> list[str]:
    lines = []
    parity = p.get("parity_vs_fp32_graph") or {}
    if "error" in parity:
        lines.append(f"- parity vs the FP32 graph: not run in ONNX Runtime here ({parity['error']})")
    elif parity:
        lines.append(f"- parity vs the FP32 graph (calibration feeds): cosine {fmt(parity['cosine'], '.6f')}, "
                     f"top-1 {fmt(parity['top1_agreement'], '.4f')}"
                     + (f" (**caveat**: {parity['caveat']})" if parity.get("caveat") else ""))
    if not p.get("cpu_latency_meaningful", True):
        lines.append("- CPU latency of this precision is **not meaningful** (emulated)")
    return lines


def _sensitivity_markdown(sens: dict) -> list[str]:
    """The budget, what auto_exclude kept in float and what that reached, the per-node ranking,
    and the time each node kept out of the integer kernels costs."""
    b = sens["budget"]
    lines = ["", f"### Sensitivity ({sens['measured_on']})", "",
             f"Budget: cosine >= {b['cosine_min']:g}"
             + (f", top-1 >= {b['top1_min']:g}" if b.get("top1_min") is not None else "")
             + f". Fully quantized: cosine {fmt(sens['fully_quantized']['cosine'], '.6f')}, top-1 "
             f"{fmt(sens['fully_quantized']['top1_agreement'], '.4f')}. Kept in float by "
             f"auto_exclude: {', '.join(f'`{n}`' for n in sens['auto_excluded']) or 'none'}. "
             f"Reached: cosine {fmt(sens['reached']['cosine'], '.6f')}, top-1 "
             f"{fmt(sens['reached']['top1_agreement'], '.4f')} "
             f"({'meets' if sens['met'] else 'MISSES'} the budget).",
             "", "| rank | node quantized alone | cosine | top-1 |", "|---|---|---|---|"]
    for i, r in enumerate(sens["ranking"], 1):
        lines.append(f"| {i} | `{r['node']}` | {fmt(r['cosine'], '.6f')} | {fmt(r['top1_agreement'], '.4f')} |")
    cost = sens.get("speed_cost")
    if cost:
        lines += ["", f"Time each node kept out of the integer kernels costs ({cost['method']}; "
                  f"{text.shapes(cost['feed_shapes'])}): {fmt(cost['total_ms'], '.3f')} ms in all.", "",
                  "| node | runs as | ms | as integer ms (est.) | cost ms |", "|---|---|---|---|---|"]
        for r in cost["nodes"]:
            lines.append(f"| `{r['node']}` | {r.get('op') or '—'} | {fmt(r['kept_ms'], '.4f')} | "
                         f"{fmt(r['integer_ms_estimate'], '.4f')} | {fmt(r['cost_ms'], '.4f')} |")
    return lines


def effective_markdown(e: dict) -> list[str]:
    m = e["mflops"]
    if "attention" in m:  # since attention products are counted (effective.SCOPE)
        scope = ("of matrix-multiply FLOPs in integer kernels, attention's QK^T and PV products "
                 "included")
        attention = f", attention products (float) {m['attention']:g}"
    else:  # a report written before: projection MatMul/Gemm only
        scope, attention = "of projection MatMul/Gemm FLOPs in integer kernels (attention products excluded)", ""
    lines = ["", f"Effective precision (ONNX Runtime, after its graph optimization): "
             f"**{e['integer_share']:.1%}** {scope} "
             f"(integer {m['integer']:g}, fake-quantized float {m['fake_quantized']:g}, float "
             f"{m['float']:g}{attention} MFLOP per request at {text.shapes(e['feed_shapes'])}); by kernel: "
             + ", ".join(f"{k} {v:g}" for k, v in e["by_op_mflops"].items()) + "."]
    nbits = e.get("matmulnbits")
    if nbits:
        lines.append(f"MatMulNBits kernels ({nbits['nodes']}, accuracy_level read from the engine's "
                     f"graph): {nbits['compute']}.")
    if e["largest_non_integer"]:
        lines.append("Largest non-integer kernels: " + ", ".join(
            f"`{n['node']}` ({n['op']}, {n['kind']}, {n['mflops']:g} MFLOP)"
            for n in e["largest_non_integer"]) + ".")
    return lines
