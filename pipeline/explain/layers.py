"""Where the error came from: intermediate tensors of a changed graph (quantized, cast,
optimized) against the float graph it came from, on the same feeds.

Both graphs get every shared float intermediate tensor exposed as an extra output and run
unoptimized in ONNX Runtime (so tensor names survive). Tensors are walked in the float
graph's topological order; a node whose output error jumps well above the error of its own
inputs is where accuracy was lost, named by node and module (where the exporter recorded
one). The first such nodes are the first diverging layers.

Why not ONNX Runtime's `onnxruntime.quantization.qdq_loss_debug` (checked against ORT 1.32):
- Its pairing (`create_activation_matching`) finds tensors by the names ORT's own quantizer
  gives Q/DQ outputs (`<x>_QuantizeLinear_Input`, `<x>_DequantizeLinear_Output`), so it
  pairs int8/fp8 activations only. Our int4 is weight-only (DequantizeLinear on weights, no
  activation Q/DQ; its `create_weight_matching` gives weight error, not propagated error),
  fp16/bf16 are casts, and optimized graphs have no Q/DQ at all: nothing to pair.
- What it reports per activation is the local Q/DQ noise (pre vs post Q/DQ) and float vs
  Q/DQ; not where error *grows* relative to a node's inputs (the jump named here).
- Its error (`compute_signal_to_quantization_noice_ratio`, 20 log10 ||x|| / ||x - y||) runs
  over every element: an attention mask's -inf makes it NaN and a -3.4e38 sentinel swamps it;
  `_relative_error` skips those.
- Its tensor selection (`modify_model_output_intermediate_tensors`, through
  `CalibraterBase.select_tensors_to_calibrate`) takes FLOAT and FLOAT16 only, so a bf16
  graph's intermediates are skipped; it also goes through files on disk and flattens each
  tensor. What would remain to reuse is exposing outputs and running a session: the ~20
  lines of `_with_outputs` and `_run`.
tests/explain/test_layers.py checks these points against the installed ORT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.json_object import JsonObject

# tensor -> (position, producing node, op type, module, node inputs)
FloatTensors = dict[str, tuple[int, str, str, str, list[str]]]



@dataclass(frozen=True)
class TensorError:
    """One shared float intermediate: its relative error, and the largest of its inputs'."""

    tensor: str
    node: str
    op: str
    module: str
    rel_error: float
    input_error: float

    def dump(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class LayerErrors:
    """Every shared float intermediate in graph order, the first jumps, how it was measured;
    compare names the two graphs (`float_graph`, `typed_graph`)."""

    tensors: list[TensorError]
    jumps: list[TensorError]
    method: str
    float_graph: str | None = None
    typed_graph: str | None = None

    def dump(self) -> JsonObject:
        out = {"tensors": [t.dump() for t in self.tensors], "jumps": [j.dump() for j in self.jumps],
               "method": self.method}
        if self.float_graph is not None:
            out.update(float_graph=self.float_graph, typed_graph=self.typed_graph)
        return out


_FLOAT_TYPES = (1, 10, 16)  # FLOAT, FLOAT16, BFLOAT16 (onnx.TensorProto)


def _float_tensors(model) -> FloatTensors:
    """tensor -> (position, producing node, op type, module, node inputs), float tensors only."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    out = {}
    for position, node in enumerate(model.graph.node):
        scope = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
        for name in node.output:
            if name and types.get(name) in _FLOAT_TYPES:
                out[name] = (position, node.name, node.op_type, _module(scope), list(node.input))
    return out


def _module(scopes: str) -> str:
    """The innermost module from the dynamo exporter's name scopes, e.g.
    "['', 'blocks.0', 'blocks.0.attn', 'blocks.0.attn.q', 'linear']" -> 'blocks.0.attn.q'
    (the last entry names the op itself)."""
    parts = [p.strip(" '\"") for p in scopes.strip("[]").split(",") if p.strip(" '\"")]
    return parts[-2] if len(parts) >= 2 else ""


def _with_outputs(model, names: list[str]):
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return model


def _run(model, feeds: list[dict], names: list[str]) -> list[dict[str, np.ndarray]]:
    from pipeline.metrics import graph_check

    # unoptimized, so tensor names survive; Q/DQ kept as written (FP8 on CPU)
    return graph_check.run(model.SerializeToString(), feeds, names, keep_qdq=True)


def _relative_error(ref: list[np.ndarray], act: list[np.ndarray]) -> float | None:
    """||act - ref|| / ||ref|| over the elements that are values, not mask sentinels
    (attention masks use -inf or -3.4e38, which would swamp the norm)."""
    num = den = 0.0
    for r, a in zip(ref, act):
        r, a = r.astype(np.float64), a.astype(np.float64)
        keep = np.isfinite(r) & (np.abs(r) < 1e30)
        num += float(np.sum((a[keep] - r[keep]) ** 2))
        den += float(np.sum(r[keep] ** 2))
    return (num / den) ** 0.5 if den > 0 else None


def layer_errors(float_path: Path, changed_path: Path, feeds: list[dict],
                 jump: float = 4.0, floor: float = 1e-4, top: int = 5) -> LayerErrors:
    """Relative error of every shared float intermediate, and the first nodes where it jumps.

    relative error = ||changed - float|| / ||float|| over all feeds (a tensor of zeros is skipped).
    A jump: a node's output error > `jump` x the largest error of its inputs, and > `floor`.
    The jumps are the first `top`, in graph order.
    """
    import onnx

    float_model = onnx.load(str(float_path))
    changed_model = onnx.load(str(changed_path))
    ours = _float_tensors(float_model)
    theirs = {n for node in changed_model.graph.node for n in node.output}
    shared = sorted((n for n in ours if n in theirs), key=lambda n: ours[n][0])
    ref = _run(_with_outputs(float_model, shared), feeds, shared)
    act = _run(_with_outputs(changed_model, shared), feeds, shared)
    rows, errors, jumps = [], {}, []
    for name in shared:
        err = _relative_error([r[name] for r in ref], [a[name] for a in act])
        if err is None:
            continue
        errors[name] = err
        _, node, op, module, inputs = ours[name]
        # graph inputs and initializers are identical in both graphs: error 0
        input_err = max((errors.get(i, 0.0) for i in inputs), default=0.0)
        row = TensorError(name, node, op, module, err, input_err)
        rows.append(row)
        if err > floor and err > jump * input_err:
            jumps.append(row)
    return LayerErrors(
        tensors=rows, jumps=jumps[:top],
        method=f"{len(rows)} float intermediates exposed in both graphs, run unoptimized in ONNX "
               f"Runtime on {len(feeds)} feeds; rel error = ||changed - float|| / ||float||; a jump "
               f"is a node whose output error is > {jump:g}x its inputs' and > {floor:g}")
