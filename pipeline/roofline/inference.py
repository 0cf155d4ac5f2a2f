"""ONNX Runtime's symbolic shape inference, run as a library, with the reductions it misses.

SymbolicShapeInference knows the com.microsoft ops, but it infers a standard op by running
ONNX's inference on that node alone, passing the node's constant inputs only for Unsqueeze;
from opset 18 every Reduce* op takes its axes as an input, so a ReduceMax over constant axes
comes out of rank unknown and the next Add stops the whole inference (the tiny GLM's rotary
position graph does exactly this). Here the reductions read their constant axes themselves
(empty axes: all of them, unless `noop_with_empty_axes`); a GroupQueryAttention without a past
gets its present's shape; ONNX's own Attention (opset 23), which the library mistakes for
com.microsoft's, gets its outputs' shapes, as do the int8 products with a float result
(MatMulIntegerToFloat, DynamicQuantizeMatMul), QAttention, FusedMatMul and FusedGemm, which it
does not know. And where inference is incomplete
it returns what it found (the library's own entry point would raise after writing
sym_shape_infer_temp.onnx into the working directory).
"""

from __future__ import annotations

import onnx
from onnx import helper
from onnxruntime.tools import symbolic_shape_infer as ssi

REDUCTIONS = ("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
              "ReduceSumSquare", "ReduceProd", "ReduceMean", "ReduceSum")


class _Inference(ssi.SymbolicShapeInference):
    def __init__(self):
        super().__init__(int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
        for op in REDUCTIONS:
            self.dispatcher_[op] = self._reduce
        self.dispatcher_["GroupQueryAttention"] = self._group_query_attention
        self.dispatcher_["Attention"] = self._attention
        for op in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul"):  # int8 products with a float result
            self.dispatcher_[op] = self._float_matmul
        self.dispatcher_["QAttention"] = self._q_attention
        self.dispatcher_["FusedMatMul"] = self._fused_matmul
        self.dispatcher_["FusedGemm"] = self._fused_gemm

    def _fused_gemm(self, node: onnx.NodeProto) -> None:
        """com.microsoft FusedGemm (ORT's Gemm + activation fusion), unknown to the library
        (digits int8: 12 values after it): Gemm's shape, A [M, K] x B [K, N] -> [M, N], either
        transposed by transA / transB."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        a, b = self._get_shape(node, 0), self._get_shape(node, 1)
        if len(a) != 2 or len(b) != 2:
            return
        rows = a[1] if attrs.get("transA") else a[0]
        cols = b[0] if attrs.get("transB") else b[1]
        elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        self.known_vi_[node.output[0]].CopyFrom(helper.make_tensor_value_info(node.output[0], elem, [rows, cols]))

    def _fused_matmul(self, node: onnx.NodeProto) -> None:
        """com.microsoft FusedMatMul (ORT's MatMulScaleFusion: a MatMul with a scale, and
        transposes folded in), which the library does not know: it stopped there, leaving every
        later value unknown (gpt2-tiny: 192). transA / transB swap the last two dims of A / B;
        transBatchA / transBatchB (the batch dims moved) are left unknown."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transBatchA") or attrs.get("transBatchB"):
            return
        a, b = self._get_shape(node, 0), self._get_shape(node, 1)
        if attrs.get("transA") and len(a) >= 2:
            a = [*a[:-2], a[-1], a[-2]]
        if attrs.get("transB") and len(b) >= 2:
            b = [*b[:-2], b[-1], b[-2]]
        if len(a) < 2 or len(b) < 2:
            return
        shape = [*self._broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1]]
        elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        self.known_vi_[node.output[0]].CopyFrom(helper.make_tensor_value_info(node.output[0], elem, shape))

    def _q_attention(self, node: onnx.NodeProto) -> None:
        """com.microsoft QAttention (int8 input and QKV weights, float result): input [B, S, H],
        weight [H, 3 * hidden] -> output [B, S, hidden] (V's size) in the input scale's type,
        present [2, B, heads, P + S, hidden / heads] where a past is given."""
        x, w = self._get_shape(node, 0), self._get_shape(node, 1)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        sizes = attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3 if isinstance(w[1], int) else None
        if sizes is None:
            return
        elem = self.known_vi_[node.input[3]].type.tensor_type.elem_type
        name = node.output[0]
        self.known_vi_[name].CopyFrom(helper.make_tensor_value_info(name, elem, [x[0], x[1], sizes[2]]))

    def _float_matmul(self, node: onnx.NodeProto) -> None:
        """MatMulIntegerToFloat / DynamicQuantizeMatMul: MatMul's shape, the scales' float type."""
        scale = node.input[2] if len(node.input) > 2 and node.input[2] else node.input[0]
        self._compute_matmul_shape(node, self.known_vi_[scale].type.tensor_type.elem_type)

    def _attention(self, node: onnx.NodeProto) -> None:
        """com.microsoft Attention: the library's. ONNX's own Attention (opset 23), which the
        library takes for it: Q [B, q_heads, S, hd] or [B, S, q_heads*hd], K/V likewise with
        kv heads, past [B, kv_heads, P, hd] -> Y like Q (V's head size), present [B, kv_heads,
        P + L, hd]."""
        if node.domain not in ("", "ai.onnx"):
            return self._infer_Attention(node)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        q, k, v = (self._get_shape(node, i) for i in range(3))
        past = self._try_get_shape(node, 4) if len(node.input) > 4 and node.input[4] else None
        dims = [*q, *k, *v, *(past or [])]
        if not all(isinstance(d, int) for d in dims):
            return None  # symbolic sizes: left unknown (costs count what is known)
        if len(q) == 4:
            batch, heads, new, _ = q
            kv_heads, keys, k_head, v_head = k[1], k[2], k[3], v[3]
            y = [batch, heads, new, v_head]
        else:
            heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
            batch, new, keys, k_head, v_head = q[0], q[1], k[1], k[2] // kv_heads, v[2] // kv_heads
            y = [batch, new, heads * v_head]
        total = keys + (past[2] if past else 0)
        elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        shapes = [y, [batch, kv_heads, total, k_head], [batch, kv_heads, total, v_head], [batch, heads, new, total]]
        for name, shape in zip(node.output, shapes, strict=False):
            if name:
                self.known_vi_[name].CopyFrom(helper.make_tensor_value_info(name, elem, shape))
        return None

    def _group_query_attention(self, node: onnx.NodeProto) -> None:
        """The library's, plus present_key/value without a past (a graph with no KV cache
        inputs): [B, kv_heads, S, head_size], which it leaves unknown."""
        self._infer_GroupQueryAttention(node)
        if self._try_get_shape(node, 3) is not None or len(node.output) < 3:
            return
        query = self._get_shape(node, 0)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
        packed = len(node.input) < 2 or not node.input[1]
        if query is None or not isinstance(query[2], int):
            return
        head = query[2] // (heads + 2 * kv_heads) if packed else query[2] // heads
        elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        for name in node.output[1:3]:
            if name:
                self.known_vi_[name].CopyFrom(helper.make_tensor_value_info(name, elem, [query[0], kv_heads, query[1], head]))

    def _reduce(self, node: onnx.NodeProto) -> None:
        """Output shape of a reduction whose axes are an attribute, a constant input, or absent."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        keep = attrs.get("keepdims", 1)
        if len(node.input) > 1 and node.input[1]:
            axes = self._try_get_value(node, 1)
            if axes is None:  # axes computed at run time: the library's own handling
                return self._onnx_infer_single_node(node)
        else:
            axes = attrs.get("axes")
        shape = self._get_shape(node, 0)
        if not axes and attrs.get("noop_with_empty_axes", 0):
            out = list(shape)
        else:
            chosen = {ssi.handle_negative_axis(a, len(shape)) for a in axes} if axes else set(range(len(shape)))
            out = [1 if i in chosen else d for i, d in enumerate(shape) if keep or i not in chosen]
        elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        self.known_vi_[node.output[0]].CopyFrom(helper.make_tensor_value_info(node.output[0], elem, out))


def infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """(the model with every value's shape it could infer, whether all were inferred)."""
    run = _Inference()
    run._preprocess(model)
    complete = False
    while run.run_:
        complete = run._infer_impl()
    run._update_output_from_vi()
    return run.out_mp_, complete
