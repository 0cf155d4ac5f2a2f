"""The names of a KV-cache decoder's cache inputs and outputs, one home for every layer.

PAST<layer>.key / .value [B, KV heads, past, head dim] go in; PRESENT<layer>.key / .value
[B, KV heads, past + sequence, head dim] come out: the names Hugging Face's ONNX exports and
onnxruntime-genai's configs use (recipe.workload.kv_names lists them for a model).
"""

PAST = "past_key_values."
PRESENT = "present."
