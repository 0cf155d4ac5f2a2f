"""`pipeline serve` on a Ray cluster: a local two-node cluster (Ray's own cluster_utils), one
CPU per node and one per replica, so two replicas can only be placed one on each node; both
answer, and each reports the node it runs on."""

from __future__ import annotations

import pytest

from tests.serving.test_serve import _sample, tiny  # noqa: F401  (the module-scoped build fixture)

pytestmark = pytest.mark.slow


def test_two_replicas_are_placed_on_both_nodes_of_a_two_node_cluster(tiny, tmp_path):  # noqa: F811
    pytest.importorskip("ray.serve")
    import numpy as np
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.serving import app
    from tests.serving.test_serve import _recipe

    cluster, why = None, None
    for _ in range(3):  # Ray gives a raylet a fixed 30 s to register: a busy machine may miss it
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            cluster.add_node(num_cpus=1)
            break
        except Exception as e:  # noqa: BLE001 - the reason is shown
            why = f"{type(e).__name__}: {e}"
            if cluster is not None:
                cluster.shutdown()
            cluster = None
    if cluster is None:
        pytest.skip(f"Ray cannot start a two-node cluster here (3 tries): {why}")
    try:
        cluster.wait_for_nodes()
        with app.local_ray(address=cluster.address):
            nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            assert len(nodes) == 2
            recipe = _recipe(tiny, max_queue_delay_us=0, replica_cpus=1.0)
            server = app.start(recipe, tiny.engines, replicas=2)
            # the replicas are actors of the cluster: where each one runs, Ray's state says
            from ray._private import state

            # the engine's replicas (the ingress deployment in front of them is another actor)
            replicas = [a for a in state.actors().values() if a["State"] == "ALIVE"
                        and a["ActorClassName"] == f"ServeReplica:{app.APP}:{recipe.name}"]
            placed = {a["Address"]["NodeID"] for a in replicas}
            assert len(replicas) == 2 and placed == nodes
            answer = server.handle.infer(_sample(np.random.default_rng(0), 8))
            assert answer.batch_size == 1 and answer.outputs["hidden"].shape == (1, 8, 32)
            assert server.handle.stats()["node_id"] in nodes
            server.stop()
    finally:
        cluster.shutdown()
