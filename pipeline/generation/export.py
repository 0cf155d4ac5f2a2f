"""KV-cache export: a decoder-only model -> one ONNX graph for prefill and decode.

Inputs input_ids [batch, sequence], attention_mask [batch, total_sequence] and the past
keys/values [batch, kv_heads, past_sequence, head_dim] per layer; outputs logits and the
presents [batch, kv_heads, total_sequence, head_dim] (names: pipeline/recipe/workload.py,
the layout onnxruntime-genai's decoder expects). Every dim is exported dynamic
(torch.export's Dim.DYNAMIC: total = past + sequence is a relation torch.export infers, not
one a plain Dim can state) and renamed to those symbols afterwards.

The parity check runs the graph the way generation does: a prefill with an empty past
(past_sequence = 0, a size the export never saw), then a decode of several tokens fed its
own presents, against the model's full-sequence forward on the same tokens. That proves the
past really is dynamic and the cache really is the model's.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.core.logs import quiet_torch_onnx
from pipeline.core.text import first_line
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape, kv_names

PREFILL, DECODE = 6, 3  # parity: tokens of the prefill, then of the decode step
# Opset 23: scaled_dot_product_attention exports as ONNX Attention (grouped-query heads
# native), which the attention_with_past pass gives the cache to.
OPSET = 23


def kv_model(recipe: Recipe):
    """(KV-cache module to export, full-sequence module ids -> logits) for the recipe's model."""
    model = models.load(recipe)
    if recipe.model.zoo == "glm":
        from pipeline.generation.glm_cache import GLMWithPast

        return GLMWithPast(model).eval(), model
    from pipeline.generation.llama_cache import LlamaWithPast

    lm = model.model  # the causal LM inside pipeline/model/hf.py's wrapper
    return LlamaWithPast(lm).eval(), lambda ids: lm(input_ids=ids, use_cache=False).logits


def _rename_dims(proto, layers: int) -> None:
    """The exporter's s0, s1 ... -> batch, sequence, past_sequence, total_sequence."""
    past, present = kv_names(layers)
    symbols = {"input_ids": ("batch", "sequence"), "attention_mask": ("batch", "total_sequence"),
               "logits": ("batch", "sequence", None)}
    symbols.update({n: ("batch", None, "past_sequence", None) for n in past})
    symbols.update({n: ("batch", None, "total_sequence", None) for n in present})
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim, name in zip(value.type.tensor_type.shape.dim, symbols.get(value.name, ())):
            if name is not None and dim.dim_param:
                dim.dim_param = name


def run(recipe: Recipe, workdir: Path, verbose: bool = False) -> tuple[dict[str, Path], dict]:
    import onnx
    import torch

    module, full = kv_model(recipe)
    layers, kv_heads, head_dim, vocab = decoder_shape(recipe.model)[:4]
    past_names, present_names = kv_names(layers)
    gen = torch.Generator().manual_seed(recipe.data.seed)
    b, t, p = 2, 4, 3  # example sizes > 1, so none is specialized to a constant
    args = (torch.randint(0, vocab, (b, t), generator=gen), torch.ones(b, p + t, dtype=torch.int64),
            *(torch.randn(b, kv_heads, p, head_dim, generator=gen) for _ in past_names))
    dynamic = torch.export.Dim.DYNAMIC
    shapes = ({0: dynamic, 1: dynamic}, {0: dynamic, 1: dynamic},
              tuple({0: dynamic, 2: dynamic} for _ in past_names))
    out_path = workdir / "model.onnx"
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log), quiet_torch_onnx(verbose), torch.no_grad():
            torch.onnx.export(module, args, str(out_path), dynamo=True, dynamic_shapes=shapes,
                              input_names=["input_ids", "attention_mask", *past_names],
                              output_names=["logits", *present_names],
                              opset_version=recipe.export.opset or OPSET, external_data=False)
    except Exception as e:
        raise StageFailed(f"KV-cache export failed: {first_line(e, with_type=True)}",
                          "rerun with --debug for the trace") from e
    seconds = time.perf_counter() - t0
    if verbose:
        print(log.getvalue())
    proto = onnx.load(str(out_path))
    _rename_dims(proto, layers)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(out_path))
    parity = check_parity(recipe, full, out_path, vocab, len(past_names), kv_heads, head_dim)
    return {"model.onnx": out_path}, {
        "exporter": "dynamo", "mode": "kv_cache",
        "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(proto.graph.node), "export_seconds": seconds,
        "kv_cache": {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
                     "inputs": [i.name for i in proto.graph.input]},
        "parity": parity.dump(),
    }


@dataclass(frozen=True)
class CacheParity:
    """The cached graph's logits, prefill then decode, against the full-sequence forward."""

    max_abs: float
    cosine: float
    prefill: int  # tokens prefilled
    decode: int  # tokens decoded one by one

    def dump(self) -> JsonObject:
        """The export meta's `parity`: its one output, logits."""
        return {"logits": {"max_abs": self.max_abs, "cosine": self.cosine, "prefill": self.prefill,
                           "decode": self.decode}}


def check_parity(recipe: Recipe, full, onnx_path: Path, vocab: int, n_past: int,
                 kv_heads: int, head_dim: int) -> CacheParity:
    """Prefill (empty past) + decode through the graph vs the full-sequence forward."""
    import numpy as np
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng([recipe.data.seed, 98])
    b = 2
    ids = rng.integers(0, vocab, size=(b, PREFILL + DECODE), dtype=np.int64)
    with torch.no_grad():
        reference = full(torch.from_numpy(ids)).numpy()  # [B, T, vocab]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the export alone
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()][2:]
    past = {n: np.zeros((b, kv_heads, 0, head_dim), np.float32) for n in names}
    logits = []
    for lo, hi in ((0, PREFILL), (PREFILL, PREFILL + DECODE)):
        out = session.run(None, {"input_ids": ids[:, lo:hi],
                                 "attention_mask": np.ones((b, hi), np.int64), **past})
        logits.append(out[0])
        past = dict(zip(names, out[1:]))
    got = np.concatenate(logits, axis=1)
    diff = float(np.abs(got - reference).max())
    cos = float((got * reference).sum() / (np.linalg.norm(got) * np.linalg.norm(reference)))
    spec = recipe.export.parity
    if not (diff <= spec.max_abs and cos >= spec.cosine_min):
        raise StageFailed(f"KV-cache export parity: prefill + decode logits differ from the full-sequence "
                          f"forward: max_abs {diff:.3g} (allowed {spec.max_abs:g}), cosine {cos:.6f}",
                          "the cached graph does not compute the model; check the cache wrapper")
    return CacheParity(diff, cos, PREFILL, DECODE)
