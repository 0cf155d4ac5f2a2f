"""Routes to carry a GGUF's Q4_1 blocks into ONNX Runtime, built and timed side by side (issue 37).

    PYTHONPATH=. python benchmarks/int4_routes.py --fp32 ENGINE_DIR/optimized.onnx \
        --builder builder-int4=FOLDER [--routes blocksum,dup_k,...] [--rounds 8] [--answers 10]

Q4_1 stores w = d*q + m per block of 32 (q 4-bit, d and m fp16). ONNX Runtime's MatMulNBits
computes w = (q - zp) * scale, fast (MLAS' fused int4 kernels) only with uint8 zero points.
Each route below rewrites the same FP32 graph (the precision stage's input, `optimized.onnx`)
with the checkpoint's blocks (pipeline.precision.checkpoint's content lookup), then ONNX
Runtime optimizes it as the build stage does (extended level, saved). For each route:
- exactness: each rewritten MatMul run on the identity by ONNX Runtime (float path), the
  weights it multiplies with against the GGUF's de-quantized floats (max |diff|, bit-exact share);
- speed: TPOT at the short point (chat question, 32 new tokens, batch 1, greedy, EOS
  suppressed), every route and the builder's int4 taking turns in one process
  (pipeline.generation.timed_requests.measure), ratios vs the builder's int4 with 95%
  sign-test intervals (pipeline.core.stats), load average beside each round set;
- answers: data/chat scripts scored as the pipeline scores an engine, against PyTorch on the
  de-quantized weights (benchmarks/peer_smollm2.chat_answers), plus greedy token agreement.
`--reuse` times routes already built under --work; `--answer-for` limits the (slow, untimed)
answers to some runners. Results: benchmarks/results/int4-routes-<date>.json/.md (one run;
2026-12-05's file gathers three runs by hand). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = 32


@dataclass
class Route:
    """How one MatMul's Q4_1 blocks become ONNX nodes; `prelude` nodes are per input x."""

    name: str
    what: str
    exact: str  # what the route promises about the weights
    accuracy_level: int = 4
    head4: bool = False  # the Q8_0 LM head requantized to symmetric 4-bit RTN (the builder's head)
    made: dict = field(default_factory=dict)


def _pack4(q: np.ndarray) -> np.ndarray:
    """[N, nb, 32] 4-bit values -> MatMulNBits' [N, nb, 16] (byte j: q[2j] | q[2j+1] << 4)."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _pack_zero4(z: np.ndarray) -> np.ndarray:
    """[N, nb] 4-bit zero points -> [N, ceil(nb/2)] bytes, two a byte (low nibble first)."""
    n, nb = z.shape
    padded = np.zeros((n, nb + nb % 2), np.uint8)
    padded[:, :nb] = z
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)


def _nbits(x: str, base: str, b, scales, zero, k: int, n: int, bits: int, level: int, out: str):
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(b, f"{base}/B_nbits"),
             numpy_helper.from_array(np.ascontiguousarray(scales, np.float32).reshape(-1), f"{base}/scales")]
    if zero is not None:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(zero).reshape(n, -1), f"{base}/zero_points"))
    node = helper.make_node("MatMulNBits", [x, *(i.name for i in inits)], [out], name=f"{base}_Q{bits}",
                            domain="com.microsoft", K=k, N=n, bits=bits, block_size=BLOCK, accuracy_level=level)
    return [node], inits


def q4_1_nodes(route: Route, node, q, d, m, k: int, n: int, ranks: dict):
    """(prelude nodes for x, nodes, initializers) replacing MatMul(x, W) for one route."""
    from onnx import helper, numpy_helper

    x, base, level = node.input[0], node.output[0], route.accuracy_level
    if route.name == "float_zp":  # w = (q - (-m/d)) * d; a d == 0 block: q 0, scale m, zp -1
        zero_d = d == 0
        scale = np.where(zero_d, m, d)
        zp = np.where(zero_d, -1.0, -m / np.where(zero_d, 1.0, d)).astype(np.float32)
        qq = np.where(zero_d[..., None], 0, q).astype(np.uint8)
        nodes, inits = _nbits(x, base, _pack4(qq), scale, zp, k, n, 4, level, base)
        return ([], []), nodes, inits
    if route.name == "u8_zp":  # the nearest integer zero point: exact only where -m/d is one in [0, 15]
        z = np.clip(np.rint(-m / np.where(d == 0, 1.0, d)), 0, 15).astype(np.uint8)
        route.made["exact_blocks"] = route.made.get("exact_blocks", 0) + int(((-d * z.astype(np.float32)) == m).sum())
        route.made["blocks"] = route.made.get("blocks", 0) + int(d.size)
        nodes, inits = _nbits(x, base, _pack4(q), d, _pack_zero4(z), k, n, 4, level, base)
        return ([], []), nodes, inits
    if route.name == "q8_near":  # 8 bits, scale d/16: q8 = 16q, zp = round(-16 m / d): |error| <= d/32
        z = np.clip(np.rint(-16 * m / np.where(d == 0, 1.0, d)), 0, 255).astype(np.uint8)
        nodes, inits = _nbits(x, base, (16 * q).astype(np.uint8), d / 16, z, k, n, 8, level, base)
        return ([], []), nodes, inits
    if route.name == "dup_k":  # [x, x] @ [d*q ; m]: the minimums as blocks of ones scaled by m
        qq = np.concatenate([q, np.ones_like(q)], axis=1)
        scales = np.concatenate([d, m], axis=1)
        zero = _pack_zero4(np.zeros(scales.shape, np.uint8))
        nodes, inits = _nbits(f"{x}/twice", base, _pack4(qq), scales, zero, 2 * k, n, 4, level, base)
        return prelude(route, x, k, ranks), nodes, inits
    if route.name == "digits":  # [x, x @ E16] @ [d*q ; digits of m]: m / 2^e as balanced base-16 digits
        digits, scale = minimum_digits(m)
        qq = np.concatenate([q, (digits + 8).astype(np.uint8)], axis=1)
        scales = np.concatenate([d, np.repeat(scale[:, None], digits.shape[1], axis=1)], axis=1)
        zero = _pack_zero4(np.concatenate([np.zeros(d.shape, np.uint8), np.full(scale.shape + (digits.shape[1],), 8, np.uint8)], axis=1))
        kk = k + digits.shape[1] * BLOCK
        nodes, inits = _nbits(f"{x}/with_digits{digits.shape[1] // _per_digit(k)}", base, _pack4(qq), scales, zero, kk, n, 4, level, base)
        return prelude(route, x, k, ranks, digits.shape[1] // _per_digit(k)), nodes, inits  # J digits
    # block sums (today's route): x @ (d*q) + blocksum(x) @ M
    sums = f"{x}/block_sums"
    nodes, inits = _nbits(x, base, _pack4(q), d, _pack_zero4(np.zeros(d.shape, np.uint8)), k, n, 4, level, f"{base}/scaled")
    inits.append(numpy_helper.from_array(np.ascontiguousarray(m.T.astype(np.float32)), f"{base}/minimums"))
    nodes += [helper.make_node("MatMul", [sums, f"{base}/minimums"], [f"{base}/offset"], name=f"{base}/offset"),
              helper.make_node("Add", [f"{base}/scaled", f"{base}/offset"], [base], name=f"{base}/add_offset")]
    return prelude(route, x, k, ranks), nodes, inits


DIGITS = 6  # at most: balanced base-16 digits of m / 2^e (SmolLM2's columns need 4 or 5)


def _per_digit(k: int) -> int:
    """Blocks of 32 one digit of the K/32 block sums fills."""
    return -(-(k // BLOCK) // BLOCK)


def minimum_digits(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_1's minimums [N, nb] (fp16 values) as integers I * 2^e per column, I in balanced base
    16: digits [N, DIGITS * per, 32] in [-8, 7] laid out digit j's block sums in blocks
    j*per.., and the column scales 2^e [N]. Exact: fp16 has 11 significant bits."""
    n, nb = m.shape
    per = _per_digit(nb * BLOCK)
    mant, exp = np.frexp(m.astype(np.float64))  # m = mant * 2^exp, |mant| in [0.5, 1)
    low = np.where(m != 0, exp, np.iinfo(np.int32).max).min(axis=1)
    low = np.where(low == np.iinfo(np.int32).max, 0, low) - 11  # the column's smallest ulp
    scale = np.ldexp(1.0, low)
    ints = np.rint(m / scale[:, None]).astype(np.int64)
    assert (ints * scale[:, None] == m).all(), "a minimum is not a multiple of its column's ulp"
    columns, rest = [], ints.copy()
    while (rest != 0).any():
        dj = ((rest + 8) % 16) - 8
        columns.append(dj)
        rest = (rest - dj) // 16
    assert len(columns) <= DIGITS, f"minimums span {len(columns)} base-16 digits"
    digits = np.zeros((n, max(len(columns), 1), per * BLOCK), np.int64)
    for j, dj in enumerate(columns):
        digits[:, j, :nb] = dj
    return digits.reshape(n, -1, BLOCK), scale.astype(np.float32)


def prelude(route: Route, x: str, k: int, ranks: dict, digits: int = 0):
    """The nodes and initializers every MatMul reading x shares: Concat(x, x) for dup_k; x's
    block sums by Reshape+ReduceSum ("blocksum") or one MatMul with a 0/1 E [K, K/32]."""
    from onnx import helper, numpy_helper

    if route.name == "dup_k":
        return [helper.make_node("Concat", [x, x], [f"{x}/twice"], name=f"{x}/twice", axis=-1)], []
    if route.name == "digits":  # features S_b * 16^j, digit j in blocks j*per..: x @ E16, then Concat
        per, nb = _per_digit(k), k // BLOCK
        e = np.zeros((k, digits * per * BLOCK), np.float32)
        for j in range(digits):
            e[:, j * per * BLOCK:j * per * BLOCK + nb] = np.kron(np.eye(nb, dtype=np.float32), np.ones((BLOCK, 1), np.float32)) * 16.0 ** j
        sums, both = f"{x}/digit_sums{digits}", f"{x}/with_digits{digits}"
        return ([helper.make_node("MatMul", [x, f"{sums}/E16"], [sums], name=sums),
                 helper.make_node("Concat", [x, sums], [both], name=both, axis=-1)],
                [numpy_helper.from_array(e, f"{sums}/E16")])
    sums = f"{x}/block_sums"
    if route.name == "blocksum_matmul":
        e = np.kron(np.eye(k // BLOCK, dtype=np.float32), np.ones((BLOCK, 1), np.float32))
        return [helper.make_node("MatMul", [x, f"{x}/E"], [sums], name=sums)], [numpy_helper.from_array(e, f"{x}/E")]
    shape = numpy_helper.from_array(np.array([0] * (ranks[x] - 1) + [k // BLOCK, BLOCK], np.int64), f"{x}/bs")
    axis = numpy_helper.from_array(np.array([-1], np.int64), f"{x}/ba")
    return ([helper.make_node("Reshape", [x, shape.name], [f"{x}/blocks"], name=f"{x}/blocks"),
             helper.make_node("ReduceSum", [f"{x}/blocks", axis.name], [sums], name=sums, keepdims=0)],
            [shape, axis])


def rtn4_nodes(node, w: np.ndarray, k: int, n: int, level: int):
    """W [K, N] requantized: symmetric 4-bit blocks of 32, scale absmax/7, zero point 8 (the default)."""
    blocks = w.T.reshape(n, k // BLOCK, BLOCK)
    scale = np.abs(blocks).max(axis=-1) / 7
    q = np.clip(np.rint(blocks / np.where(scale == 0, 1, scale)[..., None]), -8, 7).astype(np.int16) + 8
    return _nbits(node.input[0], node.output[0], _pack4(q.astype(np.uint8)), scale, None, k, n, 4, level, node.output[0])


def q8_0_nodes(node, q, d, zero, k: int, n: int, level: int):
    """The Q8_0 LM head as the pipeline builds it: 8-bit MatMulNBits, zero point 128."""
    return _nbits(node.input[0], node.output[0], q, d, zero, k, n, 8, level, node.output[0])


def dequantized(prelude, nodes, inits, x: str, y: str, k: int) -> np.ndarray:
    """What ONNX Runtime multiplies with (float path, accuracy_level dropped): the nodes run
    on the identity [1, K, K] -> [K, N]."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    probe = [helper.make_node(nd.op_type, list(nd.input), list(nd.output), name=nd.name, domain=nd.domain,
                              **{a.name: helper.get_attribute_value(a) for a in nd.attribute if a.name != "accuracy_level"})
             for nd in [*prelude, *nodes]]
    names = {i.name for i in inits}
    graph = helper.make_graph(probe, "probe", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, k, k])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
                              [i for i in inits if i.name in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {x: np.eye(k, dtype=np.float32)[None]})[0][0]


def rewrite(model, rows, route: Route, ranks: dict) -> dict:
    """Rewrite `model` in place with `route`; returns the weights' exactness over every node."""
    from onnx import numpy_helper

    from pipeline.precision.checkpoint import replace_nodes

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    kept, new_inits, worst, exact, total, nodes_done, shared = [], [], 0.0, 0, 0, 0, set()
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        found = None
        if weight is not None and len(weight.dims) == 2 and weight.dims[0] % BLOCK == 0:
            w = numpy_helper.to_array(weight).astype(np.float32)
            found = rows.columns(w)
        if found is None:
            kept.append(node)
            continue
        kind, q, scale, extra = found
        k, n = w.shape
        if kind == "q4_1":
            (pre, pre_inits), nodes, parts = q4_1_nodes(route, node, q, scale, extra, k, n, ranks)
        elif route.head4:
            (pre, pre_inits), (nodes, parts) = ([], []), rtn4_nodes(node, w, k, n, route.accuracy_level)
        else:
            (pre, pre_inits), (nodes, parts) = ([], []), q8_0_nodes(node, q, scale, extra, k, n, route.accuracy_level)
        got = dequantized(pre, nodes, [*parts, *pre_inits], node.input[0], node.output[0], k)
        worst = max(worst, float(np.abs(got - w).max()))
        exact, total = exact + int((got == w).sum()), total + w.size
        if pre and pre[-1].output[0] not in shared:  # x's shared nodes once, before their first reader
            shared.add(pre[-1].output[0])
            kept += pre
            new_inits += pre_inits
        kept += nodes
        new_inits += parts
        nodes_done += 1
    replace_nodes(model, kept, new_inits)
    return {"nodes": nodes_done, "max_abs": worst, "bit_exact_share": exact / total if total else None}


ROUTES = {
    "blocksum": Route("blocksum", "today's: MatMulNBits(scale d, zp 0) + Reshape/ReduceSum block sums @ minimums + Add",
                      "exact"),
    "blocksum_head4": Route("blocksum_head4", "today's, with the Q8_0 LM head requantized to 4-bit RTN (as the builder's)",
                            "exact but the LM head", head4=True),
    "blocksum_matmul": Route("blocksum_matmul", "block sums by one MatMul x @ E (0/1 [K, K/32]) instead of Reshape+ReduceSum",
                             "exact"),
    "dup_k": Route("dup_k", "MatMulNBits on Concat(x, x), K doubled: second half blocks of ones scaled by m (zp 0)",
                   "exact"),
    "digits": Route("digits", "MatMulNBits on Concat(x, x @ E16): the minimums as balanced base-16 digits "
                    "(scale 2^e per column, zp 8) of the block sums times 16^j", "exact"),
    "float_zp": Route("float_zp", "MatMulNBits with float zero points -m/d (scale d)", "exact up to -m/d rounding"),
    "u8_zp": Route("u8_zp", "MatMulNBits with uint8 zero points round(-m/d): one fused op", "exact where -m/d is an integer"),
    "q8_near": Route("q8_near", "8-bit MatMulNBits, scale d/16, q8 = 16q, zp round(-16m/d)", "|w error| <= d/32"),
}


def _ranks(model) -> dict[str, int]:
    """The rank of every tensor whose shape ONNX's inference knows (the Reshape of the block sums)."""
    import onnx

    g = onnx.shape_inference.infer_shapes(model, data_prop=False).graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.input, *g.value_info, *g.output]
            if v.type.tensor_type.HasField("shape")}


def build(fp32: Path, rows, route: Route, out: Path) -> dict:
    """typed.onnx (the route's graph) and onnxruntime.onnx (ORT's extended optimizations, saved
    as the build stage does) under `out`; the weights' exactness and the build's figures."""
    import onnx
    import onnxruntime as ort

    from pipeline.precision.int4 import untranspose_weights

    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(fp32))
    untranspose_weights(model)
    t0 = time.perf_counter()
    facts = rewrite(model, rows, route, _ranks(model))
    onnx.save(model, str(out / "typed.onnx"))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out / "onnxruntime.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(out / "typed.onnx"), options, providers=["CPUExecutionProvider"])
    engine = onnx.load(str(out / "onnxruntime.onnx"), load_external_data=False)
    return {**facts, "seconds": round(time.perf_counter() - t0, 1), "graph_nodes": len(model.graph.node),
            "engine_nodes": len(engine.graph.node), "engine_bytes": (out / "onnxruntime.onnx").stat().st_size,
            **{k: v for k, v in route.made.items() if k in ("exact_blocks", "blocks")}}


def genai_folder(engine: Path, hf_config, context: int, threads: int, work: Path) -> Path:
    from pipeline.generation import genai_config

    c = hf_config
    eos = int(c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
    cfg = genai_config.config(layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads, heads=c.num_attention_heads,
                              head_dim=c.hidden_size // c.num_attention_heads, hidden=c.hidden_size, vocab=c.vocab_size,
                              eos_token_id=eos, context_length=context, filename=engine.name, threads=threads,
                              in_place=genai_config.in_place_cache(engine))
    return genai_config.write_folder(work, engine, cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, required=True, help="the FP32 graph the precision stage reads (optimized.onnx)")
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--builder", action="append", default=[], help="NAME=FOLDER of a genai builder output")
    parser.add_argument("--engine", action="append", default=[], help="NAME=PATH of an already built engine to time too")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--answers", type=int, default=10)
    parser.add_argument("--answer-for", default="", help="comma-separated runners to score (default: all timed)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/int4-routes"))
    parser.add_argument("--reuse", action="store_true", help="time the routes already built under --work")
    args = parser.parse_args()
    import transformers

    from benchmarks import peer_smollm2 as peer
    from pipeline.model.gguf import folder, smollm2_instruct
    from pipeline.precision.checkpoint import CheckpointRows

    gguf = args.gguf or Path(smollm2_instruct())
    hf_dir = folder(str(gguf), "int4-routes")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    names = [r for r in args.routes.split(",") if r]
    built = {}
    rows = None if args.reuse else CheckpointRows(gguf)
    for name in names:
        out = args.work / name
        if args.reuse and (out / "build.json").exists():
            built[name] = json.loads((out / "build.json").read_text())
            continue
        built[name] = build(args.fp32, rows, ROUTES[name], out)
        (out / "build.json").write_text(json.dumps(built[name], indent=2))
        print(name, built[name], flush=True)
    del rows
    engines = {f"route-{n}": args.work / n / "onnxruntime.onnx" for n in names}
    engines.update({n: Path(p) for n, p in (e.partition("=")[::2] for e in args.engine)})
    timing = time_routes(args, hf, hf_dir, engines)
    args.no_llama_cpp = True
    onnx_paths = {**engines, **{n: Path(f) / "model.onnx" for n, f in (b.partition("=")[::2] for b in args.builder)}}
    wanted = [n for n in args.answer_for.split(",") if n] or list(onnx_paths)
    onnx_paths = {n: p for n, p in onnx_paths.items() if n in wanted}
    try:  # untimed, after the timing
        answers = peer.chat_answers(args, onnx_paths, hf)
    except Exception as e:  # noqa: BLE001 - recorded in the results
        print(f"answers failed: {type(e).__name__}: {e}")
        answers = {"error": f"{type(e).__name__}: {e}"}
    write(args, {"routes": {n: {"what": ROUTES[n].what, "promise": ROUTES[n].exact,
                                "accuracy_level": ROUTES[n].accuracy_level, **built[n]} for n in names},
                 **timing, "answers": answers})


def time_routes(args, hf, hf_dir: Path, engines: dict[str, Path]) -> dict:
    """Every engine and builder folder taking turns in this process at the short point."""
    from benchmarks import peer_smollm2 as peer
    from pipeline.artifacts import dump
    from pipeline.core import stats
    from pipeline.generation import figures as gm
    from pipeline.generation import runners
    from pipeline.generation.llama_cache import StaticCacheLlama
    from pipeline.generation.timed_requests import Request, generate, measure
    from pipeline.recipe.workload import WorkloadSpec

    prompt = peer.prompts(hf_dir, 16)["short"]
    context = prompt.shape[1] + peer.NEW + 8
    folders = {n: genai_folder(p, hf.config, context, args.threads, args.work / "genai" / n) for n, p in engines.items()}
    for item in args.builder:
        name, _, path = item.partition("=")
        cfg = json.loads((Path(path) / "genai_config.json").read_text())
        cfg["model"]["context_length"] = context
        cfg["search"]["max_length"] = cfg["search"]["min_length"] = context
        cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = args.threads
        (Path(path) / "genai_config.json").write_text(json.dumps(cfg, indent=2))
        folders[name] = Path(path)
    timed = {n: runners.GenaiRunner(f, context) for n, f in folders.items()}
    import torch

    torch.set_num_threads(args.threads)
    c = hf.config
    eos = int(c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
    reference = runners.TorchStaticRunner(StaticCacheLlama(hf, context), eos)
    request = Request("short", "point", 1, ((prompt, peer.NEW),))
    want = generate(reference, request).tokens
    load_before = os.getloadavg()
    spec = WorkloadSpec(kind="generation", rounds=args.rounds, warmup=1)
    traces = measure(timed, request, spec)
    load_after = os.getloadavg()
    figures = {n: {"tpot_ms": dump(gm.summarize(request, t)).get("tpot_ms"),
                   "token_agreement": dump(gm.agreement(want, t[0].tokens))} for n, t in traces.items()}
    versus = {}
    for ref in [b.partition("=")[0] for b in args.builder] + ["route-blocksum"]:
        for n in traces:
            if n != ref and ref in traces:
                versus[f"{n} vs {ref}"] = stats.compare(gm.tpot_blocks(traces[ref]), gm.tpot_blocks(traces[n]), noise=0.02)
    return {"figures": figures, "versus": versus, "load_average": {"before": load_before, "after": load_after},
            "context": context, "prompt_tokens": int(prompt.shape[1])}


def write(args, body: dict) -> None:
    from pipeline.core import deps
    from pipeline.store.recipe_folder import now

    result = {"created": now(), "machine": platform.processor() or platform.machine(),
              "versions": {"onnxruntime": deps.version("onnxruntime"), "onnxruntime-genai": deps.version("onnxruntime-genai")},
              "workload": {"batch": 1, "new_tokens": 32, "threads": args.threads, "rounds": args.rounds,
                           "method": "one process; warm-up 1 generation per runner, then rounds taking turns (order alternating)"},
              **body}
    day = result["created"][:10]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"int4-routes-{day}.json").write_text(json.dumps(result, indent=2, default=list) + "\n")
    (RESULTS / f"int4-routes-{day}.md").write_text("\n".join(markdown(result)) + "\n")
    print(json.dumps({k: result[k] for k in ("figures", "versus", "load_average")}, indent=1, default=list))


def markdown(r: dict) -> list[str]:
    """The routes table: exactness, TPOT p50, ratio vs the builder's int4 and vs today's route
    (95% sign-test interval), greedy tokens = PyTorch, answers."""
    builder = next((n for n in r["figures"] if not n.startswith("route-")), None)
    load = r["load_average"]
    md = [f"## Run {r['created']} (load average 1/5/15 min before {', '.join(f'{x:.2f}' for x in load['before'])}, "
          f"after {', '.join(f'{x:.2f}' for x in load['after'])})", "",
          f"{r['workload']['rounds']} rounds, {r['workload']['threads']} threads, batch 1, {r['prompt_tokens']}-token "
          f"chat prompt + 32 new tokens; {r['workload']['method']}.", "",
          f"| runner | weights vs GGUF: max abs / bit-exact share | engine nodes | engine MB | TPOT p50 ms | vs {builder} | "
          "vs route-blocksum | tokens = PyTorch | answers (PyTorch "
          f"{r['answers'].get('pytorch', {}).get('correct', '-')}/{r['answers'].get('questions', '-')}) | identical answers |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in r["figures"].items():
        route = r["routes"].get(name.removeprefix("route-"), {})
        exact = f"{route['max_abs']:.2g} / {route['bit_exact_share']:.4f}" if route else "(requantized RTN)"
        ratio = []
        for ref in (builder, "route-blocksum"):
            v = r["versus"].get(f"{name} vs {ref}")
            ratio.append(f"{v['time_ratio']:.2f}x [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]" if v else "-")
        a = r["answers"].get(name, {})
        acc = f"{a['answer_accuracy']['correct']}/{a['answer_accuracy']['questions']}" if a else "-"
        same = f"{a['identical_answers']['count']}/{a['identical_answers']['of']}" if a else "-"
        t = f["token_agreement"]
        md.append(f"| {name} | {exact} | {route.get('engine_nodes', '-')} | "
                  f"{route['engine_bytes'] / 1e6:.0f} | " if route else f"| {name} | {exact} | - | - | ")
        md[-1] += (f"{f['tpot_ms']['p50']:.2f} | {ratio[0]} | {ratio[1]} | {t['share'] * t['tokens']:.0f}/{t['tokens']} | "
                   f"{acc} | {same} |")
    return md


if __name__ == "__main__":
    main()
