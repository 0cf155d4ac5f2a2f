"""serve.routing prefix (issue 38: past one replica): with two replicas, each conversation's
next turn goes to the replica that served its earlier turns, so it finds them in that
replica's prefix cache: the `openai` client's usage says how many prompt tokens came from the
cache (prompt_tokens_details.cached_tokens, as OpenAI and vLLM report them). A real local Ray
Serve, the ingress's handle routed by Ray Serve LLM's PrefixCacheAffinityRouter, the tiny GQA Llama
(its KV cache in place, so finished sequences' prefixes are kept; byte-level prompts)."""

from __future__ import annotations

import pytest

from pipeline.serving.ingress import prompt_text
from tests.conftest import FAST_OPT
from tests.serving.test_prefix_reuse import gqa  # noqa: F401  (tiny Llama, GQA: the cache in place)

openai = pytest.importorskip("openai")


def test_the_prompt_text_the_router_reads():
    chat = b'{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ' \
           b'[{"type": "text", "text": " there"}]}, {"role": "user", "content": "!"}]}'
    assert prompt_text("/v1/chat/completions", chat) == "Hi there!"
    assert prompt_text("/v1/completions", b'{"prompt": "ROMEO:"}') == "ROMEO:"
    assert prompt_text("/v1/completions", b'{"prompt": [1, 23]}') == "1,23,"  # "1,2" is no prefix
    assert prompt_text("/v1/completions", b"[" * 100_000) is None  # the replica's 400, not ours
    assert prompt_text("/infer", b'{"prompt": "x"}') is None


@pytest.mark.slow
def test_prefix_routing_sends_each_next_turn_to_the_replica_holding_its_conversation(gqa):  # noqa: F811
    pytest.importorskip("ray.serve")
    from pipeline.serving import app
    from pipeline.store.folder_names import load

    sets = tuple(FAST_OPT[i + 1] for i in range(0, len(FAST_OPT), 2))
    recipe = load(str(gqa.path / "recipes" / "tiny-llama-gqa.yaml"), sets, gqa.engines)
    spec = recipe.serve.model_copy(update={"routing": "prefix", "threads": 1})
    with app.local_ray(num_cpus=2):
        server = app.start(recipe, gqa.engines, spec=spec, replicas=2)
        client = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused",
                               max_retries=0, timeout=120)
        try:
            # four conversations, each opening with its own letter (no token shared across them)
            for opening in ("ROMEO:", "JULIET:", "MERCUTIO:", "NURSE:"):
                prompt, before = opening, None
                for _turn in range(3):
                    reply = client.completions.create(model=recipe.name, prompt=prompt,
                                                      max_tokens=6, temperature=0)
                    cached = reply.usage.prompt_tokens_details.cached_tokens
                    if before is not None:  # the whole earlier prompt, and more, from the cache
                        assert cached >= before, (opening, cached, before)
                    before = reply.usage.prompt_tokens
                    prompt += reply.choices[0].text + "\nFRIAR:"
        finally:
            server.stop()
