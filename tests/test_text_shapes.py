"""pipeline.text.shapes: feed shapes in one readable line, however many KV-cache inputs."""

from pipeline import text


def test_a_kv_cache_of_sixty_inputs_is_one_entry():
    feed = {"input_ids": [1, 128], "attention_mask": [1, 256],
            **{f"past_key_values.{i}.{kv}": [1, 3, 128, 64] for i in range(30) for kv in ("key", "value")}}
    assert text.shapes(feed) == ("input_ids [1, 128], attention_mask [1, 256], 60 inputs "
                                 "past_key_values.0.key .. past_key_values.29.value [1, 3, 128, 64]")
    assert text.shapes({"x": [1, 3], "y": [1, 3], "z": [2]}) == "x, y [1, 3], z [2]"
