"""attention_with_past: the KV cache's concatenation folded into ONNX's Attention op.

A KV-cache export at opset 23 writes attention as ONNX `Attention` (grouped-query heads
native: q_num_heads / kv_num_heads, no repeated keys) over keys and values that the graph
first concatenates with the past: `present = Concat(past, new, axis=2) -> Attention(K=present)`.
Attention (opset 23) takes the past itself (inputs 4 and 5) and returns the presents
(outputs 1 and 2), so one kernel appends to the cache and attends; the Concat nodes go. The
attention mask already spans past + new tokens, which is what Attention expects with a past.

Only the exact form is rewritten: a two-input Concat on axis 2 feeding Attention's K (or V)
and consumed by nothing else than that Attention and the graph outputs. Anything else is
left alone (and reported); the optimize stage checks the result against its input graph.
"""

from __future__ import annotations


def _axis(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "axis"), None)


def attention_with_past(model):
    import onnx

    graph = model.graph
    producers = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    folded, skipped, drop = 0, [], set()
    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            continue
        inputs = list(node.input) + [""] * (6 - len(node.input))
        concats = [producers.get(inputs[i]) for i in (1, 2)]
        if inputs[4] or inputs[5] or not all(
                c is not None and c.op_type == "Concat" and len(c.input) == 2 and _axis(c) in (2, -2)
                and all(u is node for u in consumers.get(c.output[0], [])) for c in concats):
            skipped.append(node.name)
            continue
        (k_cat, v_cat) = concats
        inputs[1], inputs[4] = k_cat.input[1], k_cat.input[0]
        inputs[2], inputs[5] = v_cat.input[1], v_cat.input[0]
        outputs = list(node.output) + [""] * (3 - len(node.output))
        if outputs[1] or outputs[2]:
            skipped.append(node.name)
            continue
        outputs[1], outputs[2] = k_cat.output[0], v_cat.output[0]
        del node.input[:]
        node.input.extend(inputs)
        del node.output[:]
        node.output.extend(o for o in outputs[:3])
        drop.update({id(k_cat), id(v_cat)})
        folded += 1
    kept = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    onnx.checker.check_model(model)
    return model, {"attention_with_past": folded, **({"left_alone": skipped} if skipped else {})}
