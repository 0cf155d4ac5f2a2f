"""Peak arithmetic of this CPU per data type, each from the kernel that would run it.

fp32 and int8 are timed in ONNX Runtime (the engines' runtime): one large MatMul [N, N] x
[N, N] (MLAS's float GEMM) and one MatMulInteger uint8 x int8 (MLAS's u8s8 GEMM: AMX tiles,
AVX-512 VNNI or AVX-VNNI dot products where the CPU has them, else AVX2's saturating
vpmaddubsw). bf16 and fp16 are timed in PyTorch (oneDNN) only where the CPU has native
instructions for them (avx512_bf16 / amx_bf16, avx512_fp16 / amx_fp16); elsewhere they are
"not present": a bf16 matmul there is converted to fp32 and is no faster than fp32. Int4 has
no arithmetic of its own on a CPU: its weights are unpacked to int8 or fp32 first.

2 N^3 operations per product (a multiply and an add count two); the best of REPEATS timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pipeline.hardware.entry import Peak

N = 1536  # 7.2 G operations: ~40-80 ms per fp32 product per core here, far from any overhead
REPEATS = 5


def _best(run: Callable[[], object], repeats: int = REPEATS) -> float:
    run()  # warm-up: packing, thread pool start, first-touch pages
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def _ort_matmul(op: str, a: np.ndarray, b: np.ndarray, threads: int) -> float:
    """Seconds of one ONNX Runtime `op` (MatMul / MatMulInteger) on a and b, best of REPEATS."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.uint8): TensorProto.UINT8,
             np.dtype(np.int8): TensorProto.INT8}
    out = TensorProto.INT32 if op == "MatMulInteger" else TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node(op, ["A", "B"], ["Y"])], "peak",
        [helper.make_tensor_value_info("A", types[a.dtype], a.shape),
         helper.make_tensor_value_info("B", types[b.dtype], b.shape)],
        [helper.make_tensor_value_info("Y", out, [a.shape[0], b.shape[1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _best(lambda: session.run(None, {"A": a, "B": b}))


def fp32_isa(flags: frozenset[str]) -> str:
    if "avx512f" in flags:
        return "AVX-512F FMA (MLAS sgemm)"
    return "AVX2 FMA (MLAS sgemm)" if {"avx2", "fma"} <= flags else "SSE (MLAS sgemm)"


def int8_isa(flags: frozenset[str]) -> str:
    """The u8 x s8 kernel MLAS dispatches to on these flags, best first."""
    for flag, name in (("amx_int8", "AMX-INT8 tiles (tdpbusd)"), ("avx512_vnni", "AVX-512 VNNI (vpdpbusd)"),
                       ("avx_vnni", "AVX-VNNI (vpdpbusd, 256-bit)"),
                       ("avx512bw", "AVX-512BW (vpmaddubsw, int16 saturating)"),
                       ("avx2", "AVX2 (vpmaddubsw, int16 saturating)")):
        if flag in flags:
            return name
    return "SSE (no int8 dot product)"


def _torch_matmul(dtype_name: str, threads: int) -> float:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dtype = getattr(torch, dtype_name)
        a, b = torch.rand(N, N, dtype=dtype), torch.rand(N, N, dtype=dtype)
        with torch.inference_mode():
            return _best(lambda: a @ b)
    finally:
        torch.set_num_threads(before)


def half_peaks(flags: frozenset[str], thread_counts: list[int]) -> list[Peak]:
    """bf16 and fp16: timed in PyTorch where the CPU has the instructions, else not present."""
    from pipeline.core import deps

    rows = []
    for dtype, torch_name, units in (
            ("bf16", "bfloat16", (("amx_bf16", "AMX-BF16 tiles (tdpbf16ps)"), ("avx512_bf16", "AVX-512 BF16 (vdpbf16ps)"))),
            ("fp16", "float16", (("amx_fp16", "AMX-FP16 tiles (tdpfp16ps)"), ("avx512_fp16", "AVX-512 FP16 (vfmadd*ph)")))):
        isa = next((name for flag, name in units if flag in flags), None)
        if isa is None:
            rows.append(Peak(dtype=dtype, isa="not present", note=f"no {' / '.join(f for f, _ in units)}: "
                             f"{dtype} products are converted or emulated, never faster than fp32"))
            continue
        if not deps.has("torch"):
            rows.append(Peak(dtype=dtype, isa=isa, note="present but not measured: PyTorch is not installed"))
            continue
        for threads in thread_counts:
            seconds = _torch_matmul(torch_name, threads)
            rows.append(Peak(dtype=dtype, ops_per_s=2 * N**3 / seconds, isa=isa, threads=threads,
                             method=f"PyTorch (oneDNN) {dtype} matmul {N}x{N}x{N}, best of {REPEATS}"))
    return rows


def measure(flags: frozenset[str], thread_counts: list[int]) -> list[Peak]:
    """fp32, int8 (ONNX Runtime), bf16, fp16 (PyTorch where present), int4 (not present)."""
    rng = np.random.default_rng(0)
    a32, b32 = rng.random((N, N), np.float32), rng.random((N, N), np.float32)
    au8 = rng.integers(0, 256, (N, N), dtype=np.uint8)
    bs8 = rng.integers(-128, 128, (N, N), dtype=np.int8)
    rows = []
    for threads in thread_counts:
        rows.append(Peak(dtype="fp32", ops_per_s=2 * N**3 / _ort_matmul("MatMul", a32, b32, threads),
                         isa=fp32_isa(flags), threads=threads,
                         method=f"ONNX Runtime MatMul float32 {N}x{N}x{N}, best of {REPEATS}"))
        rows.append(Peak(dtype="int8", ops_per_s=2 * N**3 / _ort_matmul("MatMulInteger", au8, bs8, threads),
                         isa=int8_isa(flags), threads=threads,
                         method=f"ONNX Runtime MatMulInteger uint8 x int8 {N}x{N}x{N}, best of {REPEATS}"))
    rows += half_peaks(flags, thread_counts)
    rows.append(Peak(dtype="int4", isa="not present", note="no int4 arithmetic on CPUs: int4 weights "
                     "(MatMulNBits) are unpacked to int8 (accuracy_level 4) or fp32 before multiplying"))
    return rows
