"""text.py: speed-ups and time ratios as the user reads them."""

from __future__ import annotations

from pipeline.core import text


def test_speedups_read_engine_vs_reference_faster_or_slower():
    from pipeline.core.text import speedup, time_ratio_speedup

    assert speedup(2.0, [1.9, 2.1]) == "2.00x faster [1.90, 2.10]"
    assert speedup(0.5, [0.4, 0.8]) == "2.00x slower [1.25, 2.50]"  # interval turned with it
    assert speedup(1 / 1.224) == "1.22x slower"
    # a comparison's time ratio (B time / A time) reads as B's speed-up over A
    assert time_ratio_speedup(0.5, [0.4, 0.625]) == "2.00x faster [1.60, 2.50]"
    assert time_ratio_speedup(1.224, [1.2, 1.25]) == "1.22x slower [1.20, 1.25]"


def test_a_kv_cache_of_sixty_inputs_is_one_entry():
    feed = {"input_ids": [1, 128], "attention_mask": [1, 256],
            **{f"past_key_values.{i}.{kv}": [1, 3, 128, 64] for i in range(30) for kv in ("key", "value")}}
    assert text.shapes(feed) == ("input_ids [1, 128], attention_mask [1, 256], 60 inputs "
                                 "past_key_values.0.key .. past_key_values.29.value [1, 3, 128, 64]")
    assert text.shapes({"x": [1, 3], "y": [1, 3], "z": [2]}) == "x, y [1, 3], z [2]"
