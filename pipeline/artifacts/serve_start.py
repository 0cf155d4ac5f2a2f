"""serve-start-<engine>.json: what `pipeline serve` measured when it brought an engine up as a
service: the time from the command's start to the first correct HTTP response, and each
replica's load time and resident memory at load and at its peak (the serving result of a
load test is the load generator's own artifact)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.artifacts.base import Closed, Count, Device, Sha256

SCHEMA = 1


class ReplicaStart(Closed):
    node_id: str | None = Field(None, description="Ray node the replica ran on.")
    pid: int
    load_s: float = Field(description="Verify + open the engine inside the replica, seconds.")
    rss_at_load_mb: float = Field(description="Resident memory once the engine was open, MiB.")
    rss_mb: float = Field(description="Resident memory when last asked (at stop: the end), MiB.")
    peak_rss_mb: float = Field(description="Peak resident memory of the replica process, MiB.")
    requests: Count


class ServeStart(Closed):
    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    recipe: str
    engine: str = Field(description="Target id served, or `pytorch`.")
    kind: str
    sha256: Sha256 | None = Field(description="The engine file's sha256 (null: pytorch).")
    replicas: Count
    threads: Count | None = Field(None, description="Intra-op threads of each replica's engine "
                                  "(null: on a cluster, replica_cpus; or a record older than this field).")
    cluster: Literal["local", "address"] = Field(description="A Ray started by serve, or joined.")
    ray_start_s: float = Field(description="Command start to Ray up (0 when joined).")
    ready_s: float = Field(description="Command start to every replica loaded.")
    cold_start_s: float = Field(description="Command start to the first correct HTTP response.")
    first_request_ms: float = Field(description="That first request's round trip.")
    checked: str = Field(description="How the first answer was checked against the engine in "
                         "process (e.g. `max |diff| 0 <= 1e-4`, `tokens equal`).")
    replica: list[ReplicaStart]
    started: str
    stopped: str | None = None
    device: Device
    versions: dict[str, str | None]
