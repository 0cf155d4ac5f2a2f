"""INT8 and FP8 E4M3 post-training quantization as Q/DQ nodes (ONNX Runtime's quantizer).

Weights and activations are quantized symmetrically (zero point 0: TensorRT accepts only
that), weights per output channel (int8); calibrated activation ranges come from the
recipe's calibration feeds; Q/DQ sit on the inputs of quantized ops, never on their outputs.
The Q/DQ graph is what TensorRT builds a strongly typed INT8 engine from and what ONNX
Runtime fuses into integer kernels (see cpu_pairs.py). GEMMs with a dimension under 16 stay
float (nodes.too_small).

`scheme: dynamic` swaps the quantizer for dynamic.Quantizer (run-time activation ranges);
`smoothing` rewrites the graph first (smooth.py); both share the exclusions, sensitivity
analysis and report below. Weights use 7 bits where the CPU needs it (isa.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from pipeline.core.errors import StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.precision import (
    calibrate,
    cpu_pairs,
    dynamic,
    evaluate,
    isa,
    key_mask,
    nodes,
    sensitivity,
    smooth,
)

# ONNX Runtime fuses a Q/DQ Conv into an integer kernel only as QLinearConv, which needs a Q
# on the Conv's output (there is no "ConvIntegerToFloat"); without it the Conv runs in float
# between DQ and Q (measured on a tiny CNN: FusedConv, 0% integer). Convs keep their output Q.
_OUTPUT_QUANTIZED = {"Conv"}


class Quantizer:
    """Quantizes one pre-processed graph repeatedly from a single calibration pass."""

    def __init__(self, recipe, pre: Path, workdir: Path, feeds: list[dict], reduce_range: bool):
        self.recipe, self.spec, self.pre, self.workdir, self.feeds = (
            recipe, recipe.precision, pre, workdir, feeds)
        self.reduce_range = reduce_range
        self.cache = workdir / "calibration.json"
        self.count = 0

    def __call__(self, exclude: list[str], only: list[str] | None = None,
                 out: Path | None = None) -> Path:
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

        self.count += 1
        out = out or self.workdir / f"trial-{self.count}.onnx"
        fp8 = self.spec.mode == "fp8"
        qtype = QuantType.QFLOAT8E4M3FN if fp8 else QuantType.QInt8
        # Q/DQ on the inputs of each quantized op only, not on its output (TensorRT's own
        # placement): a quantized output is rounded a second time for nothing and costs a Q
        # and a DQ per MatMul. Measured on flash-int8: cosine 0.99955 -> 0.99982, top-1
        # 0.949 -> 0.967, and ORT runs MatMulIntegerToFloat instead of QLinearMatMul + DQ.
        extra = {"ActivationSymmetric": True, "WeightSymmetric": True,
                 "OpTypesToExcludeOutputQuantization": [
                     t for t in self.spec.op_types if fp8 or t not in _OUTPUT_QUANTIZED]}
        if self.spec.method == "percentile":
            extra["CalibPercentile"] = self.spec.percentile
        try:
            quantize_static(
                str(self.pre), str(out), calibrate.reader(self.feeds),
                quant_format=QuantFormat.QDQ, op_types_to_quantize=list(self.spec.op_types),
                per_channel=self.spec.per_channel and not fp8, reduce_range=self.reduce_range,
                activation_type=qtype, weight_type=qtype,
                nodes_to_quantize=only, nodes_to_exclude=exclude,
                calibrate_method=calibrate.method(self.spec.method),
                extra_options=extra, calibration_cache_path=str(self.cache),
            )
        except Exception as e:  # ORT raises plain exceptions (e.g. entropy: "Too many bins")
            raise StageFailed(
                f"quantization ({self.spec.mode}, {self.spec.method}) failed: {type(e).__name__}: {e}",
                "try precision.calibration: minmax or percentile, or fewer op_types",
            ) from e
        if not fp8:
            model = onnx.load(str(out))
            cpu_pairs.rewire(model)
            onnx.save(model, str(out))
        return out


def apply(recipe, src: Path, workdir: Path, verbose: bool = False) -> tuple[Path, dict]:
    """Quantizes `src` as recipe.precision says into workdir/typed.onnx; returns it and the
    report's precision section (scheme, calibration, which nodes were quantized, which stayed
    float and why)."""
    spec = recipe.precision
    dynamic_scheme = spec.mode == "int8" and spec.scheme == "dynamic"
    feeds = calibrate.feeds(recipe) if spec.needs_calibration or spec.sensitivity.enabled else []
    reduce_range = spec.mode == "int8" and isa.reduce_range(spec.weight_range)
    with calibrate.quiet(verbose, workdir):
        pre = calibrate.preprocess(src, workdir)
        split, key_masked = [], []
        if dynamic_scheme and "Attention" in spec.op_types:
            # QAttention where the bias is a padding mask; the projection split out elsewhere
            pre, key_masked = key_mask.to_key_mask(pre, workdir / "key-mask.onnx")
            pre, split = dynamic.split_attention(pre, workdir / "split.onnx")
        model = onnx.load(str(pre))
        candidates = _candidates(model, spec, split)
        by_recipe = nodes.excluded(candidates, spec.exclude)
        small = [n for n in nodes.too_small(model, candidates) if n not in by_recipe]
        excluded = by_recipe + small
        smoothing = None
        if spec.smoothing is not None:
            pre, smoothing = smooth.apply(pre, [c for c in candidates if c not in excluded], feeds,
                                          spec.smoothing.alpha, workdir / "smoothed.onnx")
        kind = dynamic.Quantizer if dynamic_scheme else Quantizer
        quantize = kind(recipe, pre, workdir, feeds, reduce_range)
        # The first call calibrates (and caches the ranges); later calls reuse them.
        first, calibration_seconds = calibrate.timed(quantize, excluded)
        report = None
        if spec.sensitivity.enabled:
            report = _sensitivity(recipe, quantize, pre, feeds,
                                  [c for c in candidates if c not in excluded], excluded)
            excluded = excluded + report.auto_excluded
        out = quantize(excluded, out=workdir / "typed.onnx") if report else first
        if out != workdir / "typed.onnx":
            out = out.rename(workdir / "typed.onnx")
        if report and report.auto_excluded:
            report = report.with_speed_cost(sensitivity.speed_cost(out, feeds[0], report.auto_excluded,
                                                                   workdir))
    skipped = dynamic.unquantized(out, [c for c in candidates if c not in excluded]) if dynamic_scheme else []
    counts, blockwise = _typed_graph_facts(out)
    return out, {
        "scheme": spec.scheme if spec.mode == "int8" else "static",
        "calibration": _calibration(recipe, feeds, calibration_seconds).dump()
                       if spec.needs_calibration else None,
        "symmetric": not dynamic_scheme,
        "per_channel": spec.per_channel and spec.mode != "fp8",
        "weight_range": {"setting": spec.weight_range,
                         "bits": 7 if reduce_range else 8, "cpu": isa.describe().dump()},
        "smoothing": smoothing,
        "attention_key_mask": len(key_masked),
        "attention_split": len(split),
        "op_types": list(spec.op_types),
        "quantizable_nodes": len(candidates),
        "quantized_nodes": len(candidates) - len(excluded) - len(skipped),
        "fallback": spec.fallback,
        "excluded": _exclusions(excluded, by_recipe, small, blockwise, skipped),
        "qdq_nodes": counts,
        "sensitivity": report.dump() if report else None,
    }


def _candidates(model: onnx.ModelProto, spec, split: list[str]) -> list[str]:
    """The nodes of the recipe's op types; with attention split out (dynamic scheme), its
    projection MatMuls too, but no other MatMul unless the recipe names MatMul."""
    op_types = list(spec.op_types) + (["MatMul"] if split and "MatMul" not in spec.op_types else [])
    candidates = nodes.quantizable(model, op_types)
    if split and "MatMul" not in spec.op_types:  # only the attention projections
        candidates = [c for c in candidates if c in split or c not in nodes.quantizable(model, ["MatMul"])]
    if not candidates:
        raise StageFailed(f"precision.mode {spec.mode}: the graph has no node of op types "
                          f"{spec.op_types} to quantize")
    return candidates


def _sensitivity(recipe, quantize, pre: Path, feeds: list[dict], quantized: list[str],
                 excluded: list[str]) -> sensitivity.SensitivityReport:
    """sensitivity.analyse's report: each quantized node scored against the float graph `pre`
    on the first sensitivity.samples feeds."""
    spec = recipe.precision
    fp8 = spec.mode == "fp8"
    sens_feeds = feeds[: spec.sensitivity.samples]
    reference = evaluate.run(pre, sens_feeds, recipe.outputs)

    def score(path: Path) -> evaluate.Parity:
        return evaluate.compare(reference, evaluate.run(path, sens_feeds, recipe.outputs, fp8),
                                recipe.top1_outputs())

    return sensitivity.analyse(quantize, quantized, excluded, score, spec.sensitivity)


def _typed_graph_facts(out: Path) -> tuple[dict[str, int], set[str]]:
    """The quantized graph's Q/DQ node counts, and the nodes that run as blockwise int8
    (MatMulNBits, named after the node they replace)."""
    typed = onnx.load(str(out), load_external_data=False)
    counts = {op: sum(n.op_type == op for n in typed.graph.node)
              for op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")}
    blockwise = {n.name.removesuffix(dynamic.BLOCKWISE_SUFFIX) for n in typed.graph.node
                 if n.op_type == "MatMulNBits"}
    return counts, blockwise


@dataclass(frozen=True)
class Calibration:
    """How the Q/DQ scales were calibrated: method, samples, their source, seconds taken."""

    method: str
    samples: int
    source: str
    seconds: float

    def dump(self) -> JsonObject:
        return asdict(self)


def _calibration(recipe, feeds: list[dict], seconds: float) -> Calibration:
    return Calibration(recipe.precision.method, len(feeds), _source(recipe), round(seconds, 3))


def _exclusions(excluded: list[str], by_recipe: list[str], small: list[str],
                blockwise: set[str], skipped: list[str]) -> list[dict]:
    """Each node left unquantized: why, and how it runs instead."""
    return ([{"node": n, "why": "recipe" if n in by_recipe else
              f"small (a dimension < {nodes.MIN_CHANNELS})" if n in small else "sensitivity",
              "runs_as": "blockwise int8 (MatMulNBits)" if n in blockwise else "float"}
             for n in excluded]
            + [{"node": n, "why": "no ONNX Runtime integer kernel for its inputs"} for n in skipped])


def _source(recipe) -> str:
    c = recipe.data.calibration
    return f"file {c.file}" if c.file else f"loader {c.loader}" if c.loader else "random (seeded)"
