"""Accuracy of an engine's outputs against reference (PyTorch) outputs.

Per output, over all validation feeds:
  max_abs   largest |engine - ref| element
  mean_abs  mean |engine - ref| over all elements
  max_rel   largest |engine - ref| / max(|ref|, 1e-3 * max|ref| of that feed): the floor keeps
            near-zero reference elements from turning rounding noise into huge ratios
  cosine    cosine similarity of the flattened outputs, worst feed (float64)
  cosine_worst_sample  cosine of each sample (row of the leading batch axis: one sentence's
            embedding, one sequence's logits), worst row over all feeds; None for outputs
            without a batch axis
  top1_agreement  share of positions whose argmax over the last axis agrees (logit outputs)
  nonfinite count of NaN/Inf elements in the engine's outputs
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipeline.artifacts.report import OutputAccuracy
from pipeline.core.json_object import JsonObject
from pipeline.data.feeds import Feed

OutputAccuracies = dict[str, OutputAccuracy]  # an output's name -> its accuracy


@dataclass(frozen=True)
class Drift:
    """How far one output of a graph moved from its reference's: the two figures a graph
    check holds it to (export parity, an optimize pass, the optimized graph vs the export)."""

    max_abs: float
    cosine: float

    def dump(self) -> JsonObject:
        return asdict(self)


Drifts = dict[str, Drift]  # an output's name -> its drift


def drifts(accuracies: OutputAccuracies) -> Drifts:
    return {name: Drift(m.max_abs, m.cosine) for name, m in accuracies.items()}


def compare(reference: list[Feed], actual: list[Feed], top1_outputs: list[str]) -> OutputAccuracies:
    """Each output of `actual` against `reference`'s, worst over the feeds."""
    if len(reference) != len(actual):
        raise ValueError(f"{len(actual)} output sets for {len(reference)} references")
    result = {}
    for name in reference[0]:
        max_abs = max_rel = 0.0
        abs_sum = count = nonfinite = 0
        cosines, row_cosines, agree, positions = [], [], 0, 0
        for ref_feed, act_feed in zip(reference, actual):
            ref = np.asarray(ref_feed[name], dtype=np.float64)
            act = np.asarray(act_feed[name], dtype=np.float64)
            if ref.shape != act.shape:
                raise ValueError(f"output `{name}`: shape {act.shape} differs from reference {ref.shape}")
            nonfinite += int(act.size - np.isfinite(act).sum())
            err = np.abs(act - ref)
            max_abs = max(max_abs, float(err.max(initial=0.0)))
            abs_sum += float(err.sum())
            count += err.size
            floor = max(1e-3 * float(np.abs(ref).max(initial=0.0)), 1e-12)
            max_rel = max(max_rel, float((err / np.maximum(np.abs(ref), floor)).max(initial=0.0)))
            cosines.append(cosine(ref, act))
            if ref.ndim >= 2:
                row_cosines += [cosine(r, a) for r, a in zip(ref, act)]
            if name in top1_outputs and ref.ndim >= 1 and ref.shape[-1] > 1:
                agree += int((ref.argmax(-1) == act.argmax(-1)).sum())
                positions += ref[..., 0].size
        result[name] = OutputAccuracy(
            max_abs=max_abs, mean_abs=abs_sum / max(count, 1), max_rel=max_rel, cosine=min(cosines),
            cosine_worst_sample=min(row_cosines) if row_cosines else None,
            top1_agreement=agree / positions if positions else None, nonfinite=nonfinite)
    return result


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel(), b.ravel()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))
