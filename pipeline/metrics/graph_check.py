"""Judge a pass: run its output graph and its input graph on the same feeds, compare.

Graphs run in ONNX Runtime on the CPU with ORT's own graph optimizations disabled, so the
numbers are those of the graph the pass wrote, not of whatever ORT would rewrite it into.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core import heap
from pipeline.data.feeds import Feed
from pipeline.metrics import accuracy as metrics


@dataclass
class Verdict:
    accepted: bool
    reason: str | None  # why it was rejected: invalid model, or which output moved how far
    accuracy: dict[str, dict]  # output -> {max_abs, cosine} vs the input graph
    outputs: list[Feed] | None  # the new graph's outputs (the next pass's reference)


def session(model_bytes: bytes | str, optimize: bool = False, threads: int | None = None,
            spin: bool = True, keep_qdq: bool = False, arena: bool = True):
    """A CPU session over a graph (bytes, or a path as str). `keep_qdq` runs Q/DQ pairs as
    they are (the CPU provider has no FP8 kernels for fused Q/DQ groups: emulated FP8).
    `arena` False: no ORT memory arena, each tensor allocated and freed on its own (a lower
    peak for long feeds, measured 2.4 vs 3.1 GB for a 5,120-token SmolLM2 prefill, ~30% slower)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 4  # fatal only: a graph that fails is reported as a verdict
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if threads:
        options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if keep_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


# A long prefill's logits [B, S, vocab] are kept (and compared) at their last positions only:
# SmolLM2's at 5,120 tokens are 1 GB a copy, and a chain of checks held several (issue 37's
# build memory). The last positions are the ones generation reads, at the longest context.
LAST_POSITIONS = 64


def last_positions(outputs: Feed, names: Sequence[str], keep: int = LAST_POSITIONS) -> Feed:
    """`outputs` with each named [B, S, ...] output longer than `keep` positions cut to its
    last `keep` (a copy, so the whole array can be freed)."""
    return {k: np.array(v[:, -keep:]) if k in names and v.ndim >= 3 and v.shape[1] > keep
            else v for k, v in outputs.items()}


def _owned(outputs: Feed) -> Feed:
    """Each output in memory of its own. ONNX Runtime's numpy outputs are views of its session's
    buffers: a kept one pins the whole arena of the run that made it, the session gone or not
    (measured, a SmolLM2 5,120-token prefill: 3.6 GB kept by the presents alone, 1.5 GB as copies)."""
    return {k: v if v.flags["OWNDATA"] else np.array(v) for k, v in outputs.items()}


def run(model_bytes: bytes | str, feeds: list[Feed], output_names: list[str],
        optimize: bool = False, keep_qdq: bool = False, trim: Sequence[str] = (),
        arena: bool = True) -> list[Feed]:
    """Outputs by name for each feed (graph as bytes, or a path as str), each in memory of its
    own; the outputs named in `trim` at their last positions (last_positions). The session's
    memory goes back to the system when it ends (heap.trim)."""
    sess = session(model_bytes, optimize=optimize, keep_qdq=keep_qdq, arena=arena)
    outputs = [_owned(last_positions(dict(zip(output_names, sess.run(output_names, feed))), trim))
               for feed in feeds]
    del sess
    heap.trim()
    return outputs


def judge(model, feeds: list[Feed], output_names: list[str], reference: list[Feed],
          max_abs: float, cosine_min: float, trim: Sequence[str] = (), arena: bool = True) -> Verdict:
    """Is `model` (a pass's output: the graph, its serialized bytes or its path as str) valid,
    and do its outputs match `reference` (its input's, cut as `trim` says)?"""
    # Validity is judged by ONNX Runtime loading and running the graph: onnx.checker does not
    # know ORT's contrib ops that fusions put in the default domain (SimplifiedLayerNorm...).
    try:
        data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
        outputs = run(data, feeds, output_names, trim=trim, arena=arena)
    except Exception as e:  # session creation or a kernel refusing the graph
        return Verdict(False, f"invalid model: {_ort_message(e)}", {}, None)
    result = metrics.compare(reference, outputs, top1_outputs=[])
    accuracy = {k: d.dump() for k, d in metrics.drifts(result).items()}
    for name, m in result.items():
        if m.nonfinite or not (m.max_abs <= max_abs and m.cosine >= cosine_min):
            reason = (f"output `{name}` moved: max |diff| {m.max_abs:.3g} (allowed {max_abs:g}), "
                      f"cosine {m.cosine:.7f} (allowed >= {cosine_min:g})"
                      + (f", {m.nonfinite} NaN/Inf" if m.nonfinite else ""))
            return Verdict(False, reason, accuracy, None)
    return Verdict(True, None, accuracy, outputs)


class Timed:
    """A graph in an ORT session behind the runner interface bench.timing drives."""

    def __init__(self, model_bytes: bytes | str, output_names: list[str], threads: int | None,
                 spin: bool):
        # ORT's own optimizer on (extended), as an engine built from this graph would run it.
        self.session = session(model_bytes, optimize=True, threads=threads, spin=spin)
        self.output_names = output_names

    def infer(self, feed: Feed, check_inputs: bool = False) -> list[np.ndarray]:
        return self.session.run(self.output_names, feed)


def _ort_message(error: Exception) -> str:
    """ORT's message without its prefix, source paths and C++ signatures."""
    text = " ".join(str(error).split()) or type(error).__name__
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"\S*onnxruntime_src\S*:\d+ (onnxruntime::[\w:]+\([^)]*\) )?", "", text)
    return text[:400]
