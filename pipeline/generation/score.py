"""The task score of a generation workload (`workload.chat`): answers and perplexity.

`answer` asks every script's questions in one conversation each (chat template, greedy,
stopping at end of sequence or `answer_tokens`), on any runner of runners.py built without
EOS suppression. `perplexity` scores held-out text teacher-forced, in windows that each
start from an empty cache. `compare` scores an engine against PyTorch on the same questions
and tokens: accuracy and perplexity with paired-bootstrap intervals (task_metrics), and the
share of answers identical to PyTorch's token for token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipeline.artifacts.generation import (
    Answer,
    AnswerAccuracy,
    BaselineScore,
    EngineScore,
    IdenticalAnswers,
    PerplexityScore,
    SecondsPerAnswer,
)
from pipeline.data.tokenizer import Tokenizer
from pipeline.generation.chat import Question, correct
from pipeline.metrics import task as task_metrics

BLOCK = 64  # perplexity tokens per bootstrap sample: neighbouring tokens' losses correlate


def answer(runner, tok: Tokenizer, scripts: list[list[Question]], stop: set[int],
           max_tokens: int, max_context: int) -> list[dict]:
    """One row per question, in script order: {id, tokens, reply, correct, seconds}."""
    rows = []
    for script in scripts:
        runner.new(1)
        context: list[int] = []  # every token in the runner's context, + the chosen, unfed one
        messages: list[dict] = []
        for q in script:
            messages.append({"role": "user", "content": q.question})
            ids = tok.conversation(messages)
            if ids[:len(context)] != context or not context:
                # the rendered history differs from what the model produced (a reply cut at
                # max_tokens, a re-tokenization): start the conversation again from its text
                runner.new(1)
                new, context = ids, list(ids)
            else:
                new = ids[len(context):]
                context = list(ids)
            if len(context) + max_tokens > max_context:
                raise ValueError(f"a conversation reaches {len(context) + max_tokens} tokens, past "
                                 f"workload.chat.max_context {max_context}")
            t0 = time.perf_counter()
            reply = [int(runner.prefill(np.asarray([new], np.int64))[0])]
            while reply[-1] not in stop and len(reply) < max_tokens:
                reply.append(int(runner.step()[0]))
            seconds = time.perf_counter() - t0
            context += reply
            text = tok.decode(t for t in reply if t not in stop).strip()
            messages.append({"role": "assistant", "content": text})
            rows.append({"id": q.id, "tokens": reply, "reply": text,
                         "correct": correct(text, q.answers), "seconds": seconds})
    return rows


def token_losses(logits_of, ids: np.ndarray, window: int) -> np.ndarray:
    """Next-token NLL of every scored position [n]: `logits_of(ids [1, T]) -> [1, T, vocab]`
    over consecutive windows (the first token of a window is context only)."""
    out = []
    for start in range(0, ids.size - 1, window):
        chunk = ids[start:start + window][None]  # [1, T]
        if chunk.shape[1] < 2:
            break
        z = np.asarray(logits_of(chunk)[:, :-1], np.float64)[0]  # [T-1, vocab]
        z = z - z.max(-1, keepdims=True)
        log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
        out.append(-np.take_along_axis(log_probs, chunk[0, 1:, None], axis=-1)[:, 0])
    return np.concatenate(out)


@dataclass(frozen=True)
class AnswerScores:
    answer_accuracy: AnswerAccuracy
    identical_answers: IdenticalAnswers


def answer_scores(base: list[dict], mine: list[dict]) -> AnswerScores:
    """Answer accuracy against PyTorch's on the same questions (paired-bootstrap interval of
    the delta), and the answers identical to PyTorch's token for token."""
    b = np.array([r["correct"] for r in base], float)
    e = np.array([r["correct"] for r in mine], float)
    same = [r["tokens"] == s["tokens"] for r, s in zip(base, mine)]
    acc = lambda idx: (float(b[idx].mean()), float(e[idx].mean()))  # noqa: E731
    acc_base, acc_eng = acc(np.arange(b.size))
    return AnswerScores(
        AnswerAccuracy(metric="answer_accuracy", baseline=acc_base, engine=acc_eng,
                       delta=acc_eng - acc_base, ci95=list(task_metrics.paired_bootstrap(acc, b.size)),
                       engine_ci95=_interval(e), baseline_ci95=_interval(b), correct=int(e.sum()),
                       baseline_correct=int(b.sum()), questions=int(b.size)),
        IdenticalAnswers(share=float(np.mean(same)) if same else None, count=int(sum(same)),
                         of=len(same)))


def compare(base: list[dict], mine: list[dict], base_nll: np.ndarray, my_nll: np.ndarray,
            answers: list[Answer] | None = None) -> EngineScore:
    """The engine's score against PyTorch's, on the same questions and tokens; `answers`:
    the engine's own, as the result lists them."""
    blocks = max(1, base_nll.size // BLOCK)
    bb = base_nll[:blocks * BLOCK].reshape(blocks, -1).sum(1)
    eb = my_nll[:blocks * BLOCK].reshape(blocks, -1).sum(1)
    per = blocks and base_nll[:blocks * BLOCK].size // blocks
    ppl = lambda idx: (float(np.exp(bb[idx].sum() / (per * idx.size))),  # noqa: E731
                       float(np.exp(eb[idx].sum() / (per * idx.size))))
    ppl_base, ppl_eng = ppl(np.arange(blocks))
    ratio = lambda idx: (1.0, (lambda p: p[1] / p[0])(ppl(idx)))  # noqa: E731
    answered = answer_scores(base, mine)
    return EngineScore(
        answer_accuracy=answered.answer_accuracy, identical_answers=answered.identical_answers,
        perplexity=PerplexityScore(
            metric="perplexity", baseline=ppl_base, engine=ppl_eng, delta=ppl_eng - ppl_base,
            ci95=list(task_metrics.paired_bootstrap(ppl, blocks)), ratio=ppl_eng / ppl_base,
            ratio_ci95=[1 + d for d in task_metrics.paired_bootstrap(ratio, blocks)],
            tokens=int(blocks * per), blocks=int(blocks)),
        seconds_per_answer=SecondsPerAnswer(engine=float(np.median([r["seconds"] for r in mine])),
                                            baseline=float(np.median([r["seconds"] for r in base]))),
        answers=answers or [])


def summary(rows: list[dict], nll: np.ndarray, answers: list[Answer] | None = None) -> BaselineScore:
    """One runner's own score (the baseline's entry): accuracy with its interval, perplexity;
    `answers`: its own, as the result lists them."""
    ok = np.array([r["correct"] for r in rows], float)
    return BaselineScore(answer_accuracy=float(ok.mean()), answer_accuracy_ci95=_interval(ok),
                         correct=int(ok.sum()), questions=int(ok.size),
                         perplexity=float(np.exp(nll.mean())), perplexity_tokens=int(nll.size),
                         seconds_per_answer=float(np.median([r["seconds"] for r in rows])),
                         answers=answers or [])


def _interval(ok: np.ndarray, rounds: int = task_metrics.ROUNDS) -> list[float]:
    """95% bootstrap interval of a share (the questions resampled)."""
    rng = np.random.default_rng(0)
    draws = ok[rng.integers(0, ok.size, size=(rounds, ok.size))].mean(1)
    return [float(x) for x in np.percentile(draws, [2.5, 97.5])]
