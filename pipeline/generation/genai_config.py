"""genai_config.json: how onnxruntime-genai drives this pipeline's KV-cache graph.

The graph's names are genai's defaults for a decoder (`past_key_values.%d.key` in,
`present.%d.key` out); the cache grows by concatenation (past_present_share_buffer false:
the graph has no GroupQueryAttention with a preallocated buffer). Greedy search; EOS is
suppressed by min_length = max_length, so every runner generates exactly the asked tokens
(the workload stops each sequence itself).
"""

from __future__ import annotations

import json
from pathlib import Path


def config(*, layers: int, kv_heads: int, heads: int, head_dim: int, hidden: int, vocab: int,
           eos_token_id: int, context_length: int, filename: str = "model.onnx",
           threads: int | None = None) -> dict:
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session["intra_op_num_threads"] = threads
    return {
        "model": {
            "type": "llama",  # genai's decoder-only model with this I/O layout
            "bos_token_id": 0, "pad_token_id": 0, "eos_token_id": eos_token_id,
            "vocab_size": vocab, "context_length": context_length,
            "decoder": {
                "filename": filename, "session_options": session,
                "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_size": head_dim, "num_hidden_layers": layers,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {
            "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "top_k": 1, "top_p": 1.0,
            "temperature": 1.0, "repetition_penalty": 1.0, "length_penalty": 1.0,
            "no_repeat_ngram_size": 0, "diversity_penalty": 0.0, "early_stopping": True,
            "max_length": context_length, "min_length": context_length,
            "past_present_share_buffer": False,
        },
    }


def write_folder(folder: Path, engine: Path, cfg: dict) -> Path:
    """A genai model folder: genai_config.json beside a link to the engine file."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / cfg["model"]["decoder"]["filename"]
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(engine.resolve())
    (folder / "genai_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return folder
