"""recipe/gguf_header.py: a GGUF's decoder sizes from its header alone, read once per file version."""

from __future__ import annotations

import os

import pytest

from pipeline.core.errors import InputError
from pipeline.recipe import gguf_header


def _write(path, layers: int) -> None:
    """A GGUF holding only the metadata a Llama header carries (no tensors)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_token_list(["<s>", "a", "b"])  # no vocab_size key: the token count stands in
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_header_names_the_decoders_sizes_and_a_rewritten_file_is_read_again(tmp_path):
    path = tmp_path / "model.gguf"
    _write(path, layers=2)
    first = gguf_header.header_config(str(path), "recipes/x.yaml")
    assert first == {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 3}
    first["num_hidden_layers"] = 99  # the caller's copy: the next read is not changed
    assert gguf_header.header_config(str(path), "recipes/x.yaml")["num_hidden_layers"] == 2
    stat = path.stat()
    _write(path, layers=5)  # rewritten in place: the same inode and size
    # its mtime moves on, as a rewrite's does (set here: two writes may share a clock tick)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert gguf_header.header_config(str(path), "recipes/x.yaml")["num_hidden_layers"] == 5


def test_a_header_without_the_decoders_sizes_is_one_input_error(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "bare.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InputError, match=r"recipes/x.yaml: model.transformers.gguf: the header lacks "
                                         r"llama.block_count"):
        gguf_header.header_config(str(path), "recipes/x.yaml")
