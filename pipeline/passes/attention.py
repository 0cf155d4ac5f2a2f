"""attention_with_past: the KV cache's concatenation folded into ONNX's Attention op.

A KV-cache export at opset 23 writes attention as ONNX `Attention` (grouped-query heads
native: q [B, H, S, hd] over k/v [B, KV, T, hd], no repeated keys) over keys and values that
the graph first concatenates with the past: `present = Concat(past, new, axis=2) ->
Attention(K=present)`. Attention (opset 23) takes the past itself (inputs 4 and 5) and
returns the presents (outputs 1 and 2), so one kernel appends to the cache and attends; the
Concat nodes go. The attention mask already spans past + new tokens, which is what
Attention expects with a past.

transformers' Llama family repeats the K/V heads for the query heads before SDPA
(`repeat_kv`: [B, KV, T, hd] -> Unsqueeze(2) -> Expand [B, KV, G, T, hd] -> Reshape
[B, KV*G, T, hd]), so its Attention reads the repeated copy, not the Concat. ONNX Attention
maps query head h to K/V head h // G, which is what the repetition spells out: the chain is
dropped first and Attention reads the grouped tensor (GQA native), then the Concat folds.

Only the exact forms are rewritten: a two-input Concat on axis 2 feeding Attention's K (or V),
directly or through one such repetition, and consumed by nothing else than that Attention (and
its repetition) and the graph outputs. Anything else is left alone (and reported); a graph
where nothing matched comes back unchanged (the stage records "no match"); the optimize stage
checks every other result against its input graph.
"""

from __future__ import annotations


def _axis(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "axis"), None)


def _ints(graph, name: str) -> list[int] | None:
    """The integer values of a constant input (an initializer or a Constant node's output)."""
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init).reshape(-1).tolist()
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t).reshape(-1).tolist()
    return None


def _repeated_source(graph, producers: dict, name: str) -> str | None:
    """x when `name` is Reshape(Expand(Unsqueeze(x, axes=[2]))): repeat_kv's K/V heads."""
    reshape = producers.get(name)
    expand = reshape is not None and reshape.op_type == "Reshape" and producers.get(reshape.input[0])
    unsqueeze = expand and expand.op_type == "Expand" and producers.get(expand.input[0])
    if not unsqueeze or unsqueeze.op_type != "Unsqueeze" or len(unsqueeze.input) != 2:
        return None
    return unsqueeze.input[0] if _ints(graph, unsqueeze.input[1]) == [2] else None


def ungroup_repeated_kv(graph) -> int:
    """Attention reads K/V before repeat_kv (ONNX Attention groups heads itself); returns how
    many inputs were rewired. The repetition's nodes are left for dead-node removal."""
    producers = {out: n for n in graph.node for out in n.output}
    rewired = 0
    for node in graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            continue
        for i in (1, 2):
            source = _repeated_source(graph, producers, node.input[i]) if len(node.input) > i else None
            if source is not None:
                node.input[i] = source
                rewired += 1
    return rewired


def drop_dead(graph) -> None:
    """Remove nodes none of whose outputs is read (repeat_kv chains left behind)."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for n in graph.node for name in n.input} | outputs
        live = [n for n in graph.node if any(o in read for o in n.output)]
        if len(live) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(live)


def attention_with_past(model):
    import onnx

    original = model.SerializeToString()
    graph = model.graph
    ungrouped = ungroup_repeated_kv(graph)
    if ungrouped:
        drop_dead(graph)  # the repetitions read the Concat too: gone before it is judged
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
    if not folded:  # nothing to fold: the input graph as it came (the stage says "no match")
        model.ParseFromString(original)
        return model, {"attention_with_past": 0, **({"left_alone": skipped} if skipped else {})}
    kept = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    drop_dead(graph)
    onnx.checker.check_model(model)
    return model, {"attention_with_past": folded, **({"kv_heads_ungrouped": ungrouped} if ungrouped else {}),
                   **({"left_alone": skipped} if skipped else {})}
