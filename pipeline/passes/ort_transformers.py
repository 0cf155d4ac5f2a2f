"""ONNX Runtime's transformers optimizer (onnxruntime.transformers.optimize_model).

It fuses well on TorchScript exports of BERT-style models with eager attention and little
on dynamo exports. Known trap (field notes): it fuses Add + Gelu(approximate="tanh") into
BiasGelu, which computes the *exact* GELU, so the graph's numbers change; the stage's check
against the input graph is what catches it.
"""

from __future__ import annotations

import contextlib
import io
import logging


def optimize(model, model_type: str = "bert", num_heads: int = 0, hidden_size: int = 0):
    from onnxruntime.transformers.optimizer import optimize_model

    # It logs a warning per failed shape inference and per fusion miss; keep them out.
    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            # opt_level=0: graph fusions of this tool only; ORT's own session optimizer runs
            # later, in the engine build, at the target's level.
            optimized = optimize_model(model, model_type=model_type, num_heads=int(num_heads),
                                       hidden_size=int(hidden_size), opt_level=0)
    finally:
        logger.setLevel(level)
    stats = optimized.get_fused_operator_statistics()
    return optimized.model, {"fused_operators": {k: v for k, v in stats.items() if v}}
