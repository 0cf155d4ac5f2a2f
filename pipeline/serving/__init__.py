"""Serving: built engines behind Ray Serve, with a dynamic batcher of Triton's semantics.

    batcher.py    the batching rules: a pure core with an injected clock
    collate.py    request checks, length buckets, padding, stacking, splitting
    engine.py     the engine folder checked as `verify` does, opened through its backend
    replica.py    one replica: engine + batcher on an asyncio loop, its own measurements
    scheduler.py  continuous batching's rules (generation): admission, KV budget, finishing
    generation_loop.py  those rules driven on the replica's engine thread, per-row sampling
    http_api.py   the HTTP routes (FastAPI)
    openai_api.py the OpenAI API for generation engines (chat/completions, completions, models)
    openai_protocol.py  its request, answer, stream-chunk and error shapes
    app.py        the Ray Serve deployment, local Ray or a cluster, the in-process handle
    coldstart.py  the first request, checked in process, and serve-start-<engine>.json
    launch.py     what `pipeline serve` (pipeline/cli/serve.py) does: start, check, record, serve

Nothing here is imported by `import pipeline` or `pipeline --help`; ray, fastapi and the
runtimes load when a command runs.
"""
