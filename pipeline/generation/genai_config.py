"""genai_config.json: how onnxruntime-genai drives this pipeline's KV-cache graph.

The graph's names are genai's defaults for a decoder (`past_key_values.%d.key` in,
`present.%d.key` out). When every present comes out of a GroupQueryAttention that reads the
past straight from the graph's input (`in_place_cache`), the cache is one preallocated buffer
per layer that the kernel writes into (past_present_share_buffer true); otherwise (ONNX
Attention, decomposed attention) it grows by concatenation, which copies the whole cache every
step: at 5,152 tokens of SmolLM2 ~237 MB a step, 2.4x the decode time. Greedy search that stops
at the model's end of sequence: the folder works with onnxruntime-genai as written (the
engine file by its own name, the tokenizer files beside it). The timed runner asks for
min_length = max_length per generator (runners.GenaiRunner), not here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from pipeline.core.cache_io import PAST, PRESENT
from pipeline.core.json_object import JsonObject


def config(*, layers: int, kv_heads: int, heads: int, head_dim: int, hidden: int, vocab: int,
           eos_token_id: int, context_length: int, filename: str,
           bos_token_id: int | None = None, pad_token_id: int | None = None,
           threads: int | None = None, in_place: bool = False) -> JsonObject:
    """filename: the engine file's name in the deployed folder (onnxruntime.onnx, not the
    raw export model.onnx); bos/pad default to the end-of-sequence id (genai needs both);
    in_place: the graph writes its presents into the pasts' buffers (`in_place_cache`)."""
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session["intra_op_num_threads"] = threads
    return {
        "model": {
            "type": "llama",  # genai's decoder-only model with this I/O layout
            "bos_token_id": eos_token_id if bos_token_id is None else bos_token_id,
            "pad_token_id": eos_token_id if pad_token_id is None else pad_token_id,
            "eos_token_id": eos_token_id,
            "vocab_size": vocab, "context_length": context_length,
            "decoder": {
                "filename": filename, "session_options": session,
                "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_size": head_dim, "num_hidden_layers": layers,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": f"{PAST}%d.key",
                           "past_value_names": f"{PAST}%d.value"},
                "outputs": {"logits": "logits", "present_key_names": f"{PRESENT}%d.key",
                            "present_value_names": f"{PRESENT}%d.value"},
            },
        },
        "search": {
            "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "top_k": 1, "top_p": 1.0,
            "temperature": 1.0, "repetition_penalty": 1.0, "length_penalty": 1.0,
            "no_repeat_ngram_size": 0, "diversity_penalty": 0.0, "early_stopping": True,
            "max_length": context_length, "min_length": 0,
            "past_present_share_buffer": in_place,
        },
    }


# What onnxruntime-genai would do with a key this module never writes: `custom_ops_library`
# loads a shared library into the process (its constructor runs), provider options name
# libraries and paths. A config read from a folder may hold only the keys config() writes.
LOADS_CODE = ("custom_ops_library",)


@functools.cache
def _written() -> JsonObject:
    """config()'s shape: every key it can write (threads included)."""
    return config(layers=1, kv_heads=1, heads=1, head_dim=1, hidden=1, vocab=1, eos_token_id=0,
                  context_length=1, filename="x.onnx", threads=1)


def foreign_keys(cfg: object, shape: object = None, where: str = "") -> list[str]:
    """The dotted keys of `cfg` that config() never writes (a key that loads code named so)
    and list entries it never writes; [] for a config of config()'s shape."""
    shape = _written() if shape is None else shape
    if not isinstance(cfg, dict):
        return [f"{where or 'the file'} (not an object)"]
    found = []
    for key, value in cfg.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key in LOADS_CODE or key not in shape:
            found.append(f"{dotted} ({'loads a shared library' if key in LOADS_CODE else 'never written'})")
        elif isinstance(shape[key], dict):
            found += foreign_keys(value, shape[key], dotted)
        elif isinstance(shape[key], list) and value != []:
            found.append(f"{dotted} (entries never written)")
    return found


def engine_name(cfg: JsonObject) -> object:
    """The decoder's file name as a config of config()'s shape (foreign_keys: []) holds it."""
    return cfg["model"]["decoder"].get("filename")


def present_of(past: str) -> str:
    """The output a past input's cache comes back as: past_key_values.3.key -> present.3.key."""
    return past.replace(PAST, PRESENT, 1)


def in_place_cache(graph: Path) -> bool:
    """True when each present.* output is written by a GroupQueryAttention (ONNX Runtime's
    contrib op) that reads its own past (`present_of`) straight from the graph's inputs: the
    kernel then takes a preallocated [B, KV, capacity, hd] buffer as past and present at once
    and appends in place (seqlens_k from the mask says how much of it is filled)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    inputs = {i.name for i in model.graph.input}
    outputs = [o.name for o in model.graph.output if o.name.startswith(PRESENT)]
    producer = {o: n for n in model.graph.node for o in n.output}
    for name in outputs:
        node = producer.get(name)
        if node is None or node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
            return False
        # GroupQueryAttention: inputs 3, 4 are past_key, past_value; outputs 1, 2 the presents
        pairs = list(zip(node.input[3:5], node.output[1:3]))
        if not any(present == name and past in inputs and present_of(past) == name for past, present in pairs):
            return False
    return bool(outputs)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def tokenizer_files(model_folder: Path | None) -> list[Path]:
    """The tokenizer files genai's og.Tokenizer reads, from the model's transformers folder."""
    if model_folder is None:
        return []
    return [model_folder / n for n in TOKENIZER_FILES if (model_folder / n).is_file()]


def write_folder(folder: Path, engine: Path, cfg: dict, extra: list[Path] = ()) -> Path:
    """A genai model folder: genai_config.json beside links to the engine file and `extra`
    (tokenizer files)."""
    folder.mkdir(parents=True, exist_ok=True)
    for target, name in ((engine, cfg["model"]["decoder"]["filename"]), *((p, p.name) for p in extra)):
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(target).resolve())
    (folder / "genai_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return folder
