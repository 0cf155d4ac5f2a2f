"""The Ray Serve application: an ingress deployment (serving/ingress.py: the HTTP routes'
front, a process of its own, so a replica's death is answered in the API's shapes) in front
of the engine deployment, whose replicas each hold a Replica (engine + batcher) and the HTTP
API's FastAPI app over it; plus starting Ray locally or joining a cluster, and an in-process
handle (to the engine deployment) for the load generator and tests.

    with local_ray(num_cpus=2):                      # or ray.init(address=...) by the caller
        server = start(recipe, engines_root, port=8000, replicas=2)
        server.handle.infer({"input_ids": ids, "attention_mask": mask})   # no HTTP
        requests.post(server.url + "/infer", json=...)                    # HTTP
        server.stop()

With several replicas the ingress's calls go where Ray Serve's router sends them: the shorter
queue of two (serve.routing balanced), or the replica caching the longest prefix of the
prompt (serve.routing prefix, routing.py).

`serve.ingress: replica` serves the routes from the engine replicas themselves (Serve's
late-bound ingress, the layout before issue 39): one hop fewer, but a replica that dies
takes its streams with it (cut, no final line) and Serve's proxy answers text/plain 500.
benchmarks/results/ingress-hop-2026-12-05.md measured the hop one stream at a time,
serving-path-2026-12-07.md under 8 concurrent streams (where it costs throughput).

Ray Serve's own `@serve.batch` is not used: it has no preferred batch sizes, no bounded
queue (503) and no length buckets. The replica runs the batcher itself, so Ray must hand it
every request at once: max_ongoing_requests is set far above anything a replica holds
(Ray's default of 5 would cap every batch at 5: ray#43288). Had it been the replica's queue
plus a batch, requests whose answers were still on their way out (or whose bodies were still
arriving) would have filled it, and the rest waited in Ray's unbounded router queue: 500
concurrent requests all got 200 after up to 21.7 s, none 503 (issue 39). So the replica's own
bounded queue is the only place a request waits, and beyond it the answer is a 503.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.json_object import JsonObject

if TYPE_CHECKING:
    from pipeline.serving.replica import InferAnswer

APP = "pipeline"  # the Ray Serve application name (one per Ray cluster)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ray Serve's gRPC data plane between its proxy, the ingress and the replicas (part of what
# Ray's RAY_SERVE_THROUGHPUT_OPTIMIZED mode turns on; the rest of that mode is not taken: its
# router on the replica's own loop refuses the synchronous handle the start-up check uses, and
# its direct ingress listens on a port of Serve's choosing). Every streamed token crosses the
# proxy -> ingress -> replica hops: on 2 cores, SmolLM2 INT4, one run taking turns, the gRPC
# plane served 1.04x the HTTP plane's tokens/s at 1 stream, 1.09x at 8 and 1.11x at 16, the
# ingress process's CPU nearly halved (benchmarks/results/serving-path-2026-12-07.md). Ray's
# constants call the flag test-only outside that mode: the serving tests run with it on.
# Read by every Serve process at import: our node's processes start with it (ray_node.own_ray's
# `environment`); a variable the caller set wins, and a cluster joined with --address keeps its own.
SERVE_DATA_PLANE_ENV = {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"}


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None, address: str | None = None):
    """A Ray node of our own on loopback (serving/ray_node.py: stopped with every process it
    started on exit; yields its Node), or the cluster at `address` (joined, left running;
    yields None). No dashboard; every port Ray picks itself; Serve's gRPC data plane
    (SERVE_DATA_PLANE_ENV) on our own node."""
    import ray

    from pipeline.serving import ray_node

    if not address:
        with ray_node.own_ray(num_cpus, SERVE_DATA_PLANE_ENV, log_to_driver=False,
                              _system_config={"metrics_report_interval_ms": 60_000}) as node:
            yield node
        return
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        yield None
    finally:
        from ray import serve

        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


ONGOING_CAP = 100_000  # requests Ray hands a replica at once: more than it ever holds


def max_ongoing(spec, max_batch: int) -> int:
    """Requests Ray hands one replica at once: all of them, so they wait in the replica's
    bounded queue (503 beyond it), never in Ray's router (see the module docstring)."""
    return ONGOING_CAP


CHUNK_WINDOW_S = 0.0     # the replica sends each body piece once ready (ingress.py's window)


def deployment(recipe, engines_root: Path, engine: str | None, spec, replicas: int,
               max_replicas_per_node: int | None = None, api_key: str | None = None,
               window_s: float = CHUNK_WINDOW_S):
    """The bound Ray Serve application (not yet running): the ingress deployment in front of
    the engine deployment (spec.ingress separate), or the engine deployment as its own ingress."""
    from ray import serve

    from pipeline.recipe.serve import batch_dim

    batch = batch_dim(recipe.inputs)
    most = (spec.max_batch_size or batch.max) if batch else 1
    threads = spec.threads or max(1, int(spec.replica_cpus))
    options = {"num_replicas": replicas, "max_ongoing_requests": max_ongoing(spec, most),
               "ray_actor_options": {"num_cpus": spec.replica_cpus},
               "health_check_period_s": 5}
    if max_replicas_per_node:
        options["max_replicas_per_node"] = max_replicas_per_node
    prefix = spec.routing == "prefix"
    if prefix:  # the ingress's handle routes each request by its prompt (routing.py)
        from ray.serve.config import RequestRouterConfig

        from pipeline.serving.routing import PREFIX_ROUTER

        options["request_router_config"] = RequestRouterConfig(request_router_class=PREFIX_ROUTER)
    engine_class = _engine_server(recipe, Path(engines_root), engine, spec, threads, api_key, window_s)
    if spec.ingress == "replica":  # Ray Serve's late-bound ingress: the app built in each replica
        return serve.deployment(name=f"{recipe.name}", **options)(serve.ingress()(engine_class)).bind()
    engine_server = serve.deployment(name=f"{recipe.name}", **options)(engine_class)
    ingress = serve.deployment(name="ingress", num_replicas=1, max_ongoing_requests=ONGOING_CAP,
                               ray_actor_options={"num_cpus": 0})(serve.ingress()(_ingress(api_key, prefix)))
    return ingress.bind(engine_server.bind())


def _engine_server(recipe, engines_root: Path, engine: str | None, spec, threads: int,
                   api_key: str | None, window_s: float):
    """The engine deployment's class: each replica holds a Replica and http_api's FastAPI
    app over it, built after its engine loaded; the ingress (or Serve's proxy, as its own
    ingress) reaches the routes through `http`."""

    class EngineServer:
        def __init__(self):
            from pipeline.serving import ingress
            from pipeline.serving.ray_node import keep_replica_grpc_home
            from pipeline.serving.replica import Replica

            keep_replica_grpc_home()
            self.replica = Replica(recipe, engines_root, engine, spec, threads)
            self.api = self.__serve_build_asgi_app__()
            if self.replica.engine.generation:  # ready before the first chat request
                self.api.state.openai.preload(self.replica)
            self.forwarded = ingress.ReplicaHttp(self.api, window_s)

        def __serve_build_asgi_app__(self):
            from fastapi import FastAPI

            from pipeline.serving import http_api

            if getattr(self, "api", None) is not None:
                return self.api
            api = FastAPI(title=f"pipeline serve {recipe.name}")
            http_api.routes(api, lambda: self.replica, recipe.name, api_key)
            return api

        async def http(self, request):
            """One HTTP request forwarded by the ingress: its answer's Items (ingress.py)."""
            async for item in self.forwarded.answer(request):
                yield item

        async def body_limit(self) -> int:
            from pipeline.serving import guard

            return guard.body_limit(self.replica)

        async def infer_arrays(self, inputs: dict) -> InferAnswer:
            """The in-process handle's call: arrays in, the same answer as HTTP's."""
            return await self.replica.infer(inputs)

        async def generate_tokens(self, prompt_ids: list[int], max_new_tokens: int, params=None):
            """Replica.generate's items; without `params`, exactly max_new_tokens greedy tokens
            (EOS ignored), as the load generator and the old /generate route ask."""
            from pipeline.generation.sampling import SamplingParams

            params = params or SamplingParams(max_new_tokens, ignore_eos=True)
            async for item in self.replica.generate(prompt_ids, params):
                yield item

        async def replica_stats(self) -> JsonObject:
            return self.replica.stats()

        def __del__(self):
            with contextlib.suppress(Exception):
                self.replica.close()

    return EngineServer


def _ingress(api_key: str | None, with_prompt: bool = False):
    """The ingress deployment's class: ingress.Ingress over a streaming handle to the engine
    deployment, with the engine's body limit (asked once, when Serve builds the app)."""

    class IngressServer:
        def __init__(self, engine_handle):
            from pipeline.serving.ray_node import keep_replica_grpc_home

            keep_replica_grpc_home()
            self.engine = engine_handle.options(stream=True)
            self.limit = 0  # the engine's body limit, asked when the app is built

        async def __serve_build_asgi_app__(self):
            from pipeline.serving import ingress

            self.limit = await self.engine.options(stream=False).body_limit.remote()
            return ingress.Ingress(self.engine.http.remote, lambda: self.limit, api_key, with_prompt)

    return IngressServer


class Handle:
    """The application's DeploymentHandle, with plain calls (no HTTP): `infer(arrays)` ->
    the HTTP answer's dict (outputs as arrays); QueueFull and BadRequest raise as such."""

    def __init__(self, handle):
        self._handle = handle

    def infer(self, inputs: dict, timeout_s: float = 120) -> InferAnswer:
        return self._handle.infer_arrays.remote(inputs).result(timeout_s=timeout_s)

    async def infer_async(self, inputs: dict) -> InferAnswer:
        return await self._handle.infer_arrays.remote(inputs)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params=None):
        """A streaming response of Replica.generate's items; without `params` (a
        SamplingParams), exactly max_new_tokens greedy tokens (EOS ignored)."""
        return self._handle.options(stream=True).generate_tokens.remote(prompt_ids, max_new_tokens, params)

    def stats(self, timeout_s: float = 60) -> JsonObject:
        return self._handle.replica_stats.remote().result(timeout_s=timeout_s)


@dataclass
class Server:
    recipe: str
    host: str
    port: int
    handle: Handle
    owns_serve: bool = True  # Serve was started for this app (not a cluster's shared Serve)
    api_key: str | None = field(default=None, repr=False)  # HTTP's `Authorization: Bearer <key>`

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1/models/{self.recipe}"

    def stop(self) -> None:
        """Delete the application; Serve itself too (its proxy, its port) when it was ours."""
        from ray import serve

        serve.delete(APP)
        if self.owns_serve:
            serve.shutdown()


def start(recipe, engines_root: Path, engine: str | None = None, spec=None, replicas: int | None = None,
          host: str = "127.0.0.1", port: int | None = None, every_node: bool = False,
          max_replicas_per_node: int | None = None, owns_serve: bool = True,
          api_key: str | None = None, window_s: float = CHUNK_WINDOW_S) -> Server:
    """Run the application on the Ray this process is connected to; returns once every
    replica has loaded its engine (serve.run waits for them). `owns_serve`: Serve (its HTTP
    proxy on `port`) is ours, shut down by stop(); False on a cluster whose Serve others use
    (an already running Serve keeps its own port)."""
    from ray import serve

    spec = spec or recipe.serve
    port = port or free_port()
    serve.start(http_options={"host": host, "port": port},
                proxy_location="EveryNode" if every_node else "HeadOnly")
    app = deployment(recipe, Path(engines_root).resolve(), engine, spec, replicas or spec.replicas,
                     max_replicas_per_node, api_key, window_s)
    serve.run(app, name=APP, route_prefix="/", blocking=False)
    engine_handle = serve.get_deployment_handle(recipe.name, app_name=APP)
    return Server(recipe.name, host, port, Handle(engine_handle), owns_serve, api_key)
