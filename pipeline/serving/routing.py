"""How the ingress picks an engine replica for a request (serve.routing).

`balanced` is Ray Serve's default request router (power of two choices on queue length).
`prefix` is Ray Serve LLM's PrefixCacheAffinityRouter: a tree of the prompt texts each
replica served; while the replicas' queues are balanced, a request goes to the replica that
served the longest prefix of its text (at least 10% of it), else to the replica holding the
least text, and on imbalance back to power of two choices (as vLLM's production stack and
SGLang's router route a conversation's turns to the cache that holds it). The ingress hands
each request to the router with its prompt text (ingress.Forwarded.prompt: a chat's message
contents in order, a completion's prompt).

Ray 2.60 ships the router under ray.llm._internal: the public `ray.serve.llm` import asks for
vLLM or SGLang, which this project does not use. Ray is pinned (pyproject.toml), and
tests/serving/test_routing.py fails if the class moves. Its one change here: a request that
carries no prompt (the in-process handle's arrays and token ids, /stats, /metrics) is routed
as `balanced` would, where Ray's class raises.

This module is imported only by Ray, in the ingress process, when it builds the router from
PREFIX_ROUTER's import path.
"""

from __future__ import annotations

from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)

PREFIX_ROUTER = "pipeline.serving.routing:PrefixAffinity"


class PrefixAffinity(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request) -> str | None:
        """The request's prompt text, or None (no prompt: routed by queue length alone)."""
        for arg in pending_request.args or ():
            prompt = getattr(arg, "prompt", None)
            if prompt:
                return prompt
        return None
