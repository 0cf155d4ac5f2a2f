"""INT4 weight-only, block-wise: the 4-bit case of flash models.

Form chosen: DequantizeLinear with int4 weights and `block_size` (opset 21) feeding the
float MatMul, i.e. ONNX Runtime's MatMulNBitsQuantizer with quant_format=QDQ, rather than
its com.microsoft MatMulNBits op. Reasons: the QDQ form is standard ONNX, which TensorRT
parses (INT4 weight-only GEMM from block-quantized DequantizeLinear) while it has no
MatMulNBits; and ONNX Runtime runs it anyway, fusing DequantizeLinear -> MatMul into its
MatMulNBits kernel during graph optimization (checked by effective.py on the engine).
Symmetric blocks (zero point 0), one FP32 scale per `block_size` weights along K.
Activations stay float in this graph, but not necessarily in the engine: ORT's fusion writes
MatMulNBits with accuracy_level 4 by default (session config
`session.qdq_matmulnbits_accuracy_level`), which quantizes each MatMul's activations to int8
per block at run time. effective.py reads the level from the engine and reports it.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.errors import StageFailed
from pipeline.precision import calibrate, nodes


def apply(recipe, src: Path, workdir: Path, verbose: bool = False) -> tuple[Path, dict]:
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    spec = recipe.precision
    op_types = [op for op in spec.op_types if op in ("MatMul", "Gemm")] or ["MatMul"]
    model = onnx.load(str(src))
    candidates = nodes.quantizable(model, op_types, weight_only=True)
    if not candidates:
        raise StageFailed(f"precision.mode int4: no {'/'.join(op_types)} node with a constant weight")
    excluded = nodes.excluded(candidates, spec.exclude)
    with calibrate.quiet(verbose, workdir):
        quantizer = MatMulNBitsQuantizer(
            model, block_size=spec.block_size, is_symmetric=True, nodes_to_exclude=excluded,
            quant_format=QuantFormat.QDQ, op_types_to_quantize=tuple(op_types),
        )
        _, seconds = calibrate.timed(quantizer.process)
        out = workdir / "typed.onnx"
        quantizer.model.save_model_to_file(str(out))
    typed = onnx.load(str(out), load_external_data=False)
    blocked = [n for n in typed.graph.node if n.op_type == "DequantizeLinear"]
    return out, {
        "form": "DequantizeLinear int4, block-wise (opset 21) -> MatMul",
        "block_size": spec.block_size,
        "symmetric": True,
        "weight_only": True,
        "quantizable_nodes": len(candidates),
        "quantized_nodes": len(blocked),
        "excluded": [{"node": n, "why": "recipe"} for n in excluded],
        "seconds": round(seconds, 3),
    }
