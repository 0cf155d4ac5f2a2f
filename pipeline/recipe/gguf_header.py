"""A GGUF checkpoint as a recipe names it (`model.transformers.gguf`: a file or `module:function`),
and the decoder sizes its header declares: what a recipe needs to derive its KV-cache signature
without converting the checkpoint (pipeline/model/gguf.py converts it, for the stages)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pipeline.core import user_code
from pipeline.core.errors import InputError

HfConfig = dict[str, Any]  # transformers config name (config.json's keys) -> value


def resolve(ref: str, where: str) -> Path:
    """The GGUF file `ref` names: a path, or `module:function` returning one."""
    if user_code.is_function_ref(ref) and not Path(ref).exists():
        path = Path(user_code.call_ref(ref, f"{where}: model.transformers.gguf", "a .gguf file"))
    else:
        path = Path(ref)
    if not path.is_file():
        raise InputError(f"{where}: model.transformers.gguf: {path}: no such file",
                         "give a .gguf file, or `module:function` returning its path")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError(f"{where}: model.transformers.gguf: {path} is not a GGUF file "
                             "(no GGUF magic)")
    return path


def header_config(ref: str, where: str) -> HfConfig:
    """The decoder's sizes under transformers' config names, read from the GGUF header alone
    (metadata `<arch>.block_count` etc.; tensors are not read): what a recipe needs to derive
    its KV-cache signature, without the minute-long conversion. A model transform prunes FFN
    channels only, which none of these names."""
    path = resolve(ref, where)
    stat = path.stat()
    # GGUFReader parses every field, the tokenizer's ~50k strings too (~2 s here), and
    # every recipe on the file asks: read once per file version in a process.
    return dict(_header_config(str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, where))


@functools.lru_cache(maxsize=8)
def _header_config(path: str, inode: int, size: int, mtime_ns: int, where: str) -> HfConfig:
    """header_config of the file at PATH as it is (its inode, size and mtime are the key)."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key: str):
        field = fields.get(key)
        if field is None or not field.data:
            return None
        part = field.parts[field.data[0]]
        return bytes(part).decode() if key == "general.architecture" else part.tolist()[0]

    arch = value("general.architecture")
    sizes = {"num_hidden_layers": "block_count", "hidden_size": "embedding_length",
             "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
             "head_dim": "attention.key_length", "vocab_size": "vocab_size"}
    config = {name: value(f"{arch}.{key}") for name, key in sizes.items()}
    if config["vocab_size"] is None and "tokenizer.ggml.tokens" in fields:
        config["vocab_size"] = len(fields["tokenizer.ggml.tokens"].data)
    missing = [f"{arch}.{sizes[k]}" for k, v in config.items() if v is None and k != "head_dim"]
    if missing:
        raise InputError(f"{where}: model.transformers.gguf: the header lacks {', '.join(missing)}",
                         "give a GGUF of a Llama-family decoder written by llama.cpp's converter")
    return {k: v for k, v in config.items() if v is not None}
