"""Task metrics: how well the model does its job on real data, for PyTorch and an engine on
the same samples, and the engine's delta with a 95% paired-bootstrap interval.

Small pure functions over arrays (no model, no runtime):
  perplexity            exp(mean next-token NLL) over unpadded positions of causal-LM logits
  accuracy              share of samples whose argmax is the label
  embedding_similarity  Spearman correlation of pair cosines with gold scores; besides it,
                        retrieval top-1 agreement with PyTorch (each first sentence's nearest
                        second sentence, engine vs PyTorch embeddings)

Each metric splits into per-sample parts and an aggregate over a sample index, so the
bootstrap resamples samples (sentences, images, pairs) once and scores baseline and engine
on the same draw: the interval is of the paired delta, not of two independent figures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.artifacts.report import TaskMetric
from pipeline.data.feeds import Feed

HIGHER_IS_BETTER = {"perplexity": False, "accuracy": True, "embedding_similarity": True}
ROUNDS = 2000


# ------------------------------------------------------------------ per-sample parts
def token_nll(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next-token NLL summed per sequence and the number of positions scored.

    logits [B, T, V], ids [B, T], mask [B, T] (1 = real token). Position t predicts token
    t+1; it counts when both are real. Returns (nll [B], count [B]).
    """
    z = np.asarray(logits[:, :-1], dtype=np.float64)  # [B, T-1, V]
    z = z - z.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    target = ids[:, 1:]  # [B, T-1]
    picked = np.take_along_axis(log_probs, target[..., None], axis=-1)[..., 0]  # [B, T-1]
    scored = (mask[:, 1:] * mask[:, :-1]).astype(np.float64)
    return -(picked * scored).sum(1), scored.sum(1)


def perplexity(nll: np.ndarray, count: np.ndarray) -> float:
    return float(np.exp(nll.sum() / max(count.sum(), 1.0)))


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    return float((predicted == labels).mean())


def pair_cosines(embeddings: np.ndarray) -> np.ndarray:
    """Rows a0 b0 a1 b1 ... [2P, d] -> cosine of each pair [P]."""
    a, b = _unit(embeddings[0::2]), _unit(embeddings[1::2])
    return (a * b).sum(-1)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def retrieval_agreement(reference: np.ndarray, actual: np.ndarray) -> float:
    """Share of first sentences whose nearest second sentence (by cosine) is the same under
    the engine's embeddings as under PyTorch's. reference, actual: [2P, d]."""
    def nearest(e):
        return (_unit(e[0::2]) @ _unit(e[1::2]).T).argmax(1)  # [P]
    return float((nearest(reference) == nearest(actual)).mean())


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ------------------------------------------------------------------ the interval
def paired_bootstrap(score: Callable[[np.ndarray], tuple[float, float]], n: int,
                     rounds: int = ROUNDS, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of engine - baseline. score(idx) -> (baseline, engine) on the
    samples idx; each round draws n samples with replacement, the same for both."""
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(rounds):
        base, eng = score(rng.integers(0, n, size=n))
        deltas.append(eng - base)
    deltas = np.asarray(deltas)
    deltas = deltas[np.isfinite(deltas)]
    if deltas.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    return float(lo), float(hi)


# ------------------------------------------------------------------ one engine
def rows(outputs: list[Feed], name: str) -> np.ndarray:
    """One output's rows over all feeds, in order: [samples, ...]."""
    return np.concatenate([np.asarray(o[name]) for o in outputs], axis=0)


def score(metric: str, feeds: list[Feed], reference: list[Feed], actual: list[Feed],
          output: str, labels: np.ndarray | None, masks: list[np.ndarray] | None) -> TaskMetric:
    """The engine against PyTorch on the task: baseline, engine, delta and its paired-bootstrap
    ci95 (+ retrieval_top1_agreement for embeddings)."""
    if metric == "perplexity":
        def parts(outs):
            pieces = [token_nll(o[output], f["input_ids"], m if m is not None else np.ones_like(f["input_ids"]))
                      for o, f, m in zip(outs, feeds, masks or [None] * len(feeds))]
            return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
        (bn, bc), (en, ec) = parts(reference), parts(actual)
        n = bn.size
        fn = lambda idx: (perplexity(bn[idx], bc[idx]), perplexity(en[idx], ec[idx]))  # noqa: E731
    elif metric == "accuracy":
        if labels is None:
            raise ValueError("accuracy needs labels")
        bp, ep = rows(reference, output).argmax(-1), rows(actual, output).argmax(-1)
        if bp.shape != labels.shape:
            raise ValueError(f"output `{output}` gives {bp.shape} predictions for {labels.shape} labels")
        n = labels.size
        fn = lambda idx: (accuracy(bp[idx], labels[idx]), accuracy(ep[idx], labels[idx]))  # noqa: E731
    elif metric == "embedding_similarity":
        if labels is None:
            raise ValueError("embedding_similarity needs sentence pairs with scores")
        be, ee = rows(reference, output), rows(actual, output)
        bcos, ecos = pair_cosines(be), pair_cosines(ee)
        n = labels.size
        fn = lambda idx: (spearman(bcos[idx], labels[idx]), spearman(ecos[idx], labels[idx]))  # noqa: E731
    else:
        raise ValueError(f"unknown task metric {metric}")
    baseline, engine = fn(np.arange(n))
    extra = ({"retrieval_top1_agreement": retrieval_agreement(be, ee)}
             if metric == "embedding_similarity" else {})
    return TaskMetric(metric=metric, baseline=baseline, engine=engine, delta=engine - baseline,
                      ci95=list(paired_bootstrap(fn, n)), **extra)


def loss(task: TaskMetric) -> float:
    """How much worse the engine is than PyTorch (positive = worse), in the metric's units."""
    sign = -1.0 if HIGHER_IS_BETTER[task.metric] else 1.0
    return sign * task.delta
