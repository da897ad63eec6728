"""The follower tells the store's fault scanner what the run's plan says, so a worker's
``local_rank`` in a followed log becomes its global rank (the node's rank offset added)."""

from __future__ import annotations

from console.cluster.model import Cluster, Node
from console.ssh.pool import Pool
from console.training.follow import RunFollower, give_contexts
from console.training.launch import LaunchPlan, NodePlan
from console.training.logparse import parse_line
from console.training.metrics import MetricsStore
from console.training.runs import NodeRun, RunRecord

OOM = ("E1201 10:00:05.000000 1 torch/distributed/elastic/multiprocessing/api.py:984] "
       "failed (exitcode: -9) local_rank: 1 (pid: 8812) of binary: /opt/venv/bin/python")


def a_record() -> RunRecord:
    nodes = [NodePlan(node=f"node{i}", host=f"10.99.0.{i + 1}", node_rank=i, nproc=2, argv=[],
                      env={}, cwd="/", log=f"/out/logs/node{i}.log") for i in range(3)]
    plan = LaunchPlan(run_id="20261201-100000-abcd", cluster="c", master="node0",
                      master_addr="10.99.0.1", master_port=29500, output_dir="/out",
                      entry="train_ds", overrides=[], nodes=nodes)
    return RunRecord(id=plan.run_id, created=0.0, cluster="c", output_dir="/out",
                     master="node0",
                     nodes=[NodeRun(f"node{i}", i, f"/out/logs/node{i}.log",
                                    f"/out/svconsole/node{i}.pid", f"/out/svconsole/node{i}.exit")
                            for i in range(3)],
                     plan=plan.to_dict())


def test_a_followed_local_rank_is_reported_as_its_global_rank():
    cluster = Cluster(name="c", nodes=tuple(Node(name=f"node{i}", host=f"10.99.0.{i + 1}",
                                                 port=22, user=None, identity_file=None)
                                            for i in range(3)), master="node0")
    pool = Pool(cluster)
    try:
        follower = RunFollower(pool, a_record())
        follower._take("node2", [parse_line(OOM)])
        (oom,) = [f for f in follower.store.findings(now=0.0) if f.id == "host-oom-kill"]
        assert (oom.node, oom.rank) == ("node2", 5)
    finally:
        pool.close()


def test_read_run_stores_get_the_contexts_too():
    store = MetricsStore()
    give_contexts(store, a_record())
    assert {n: c.rank_offset for n, c in store.scan_contexts.items()} == \
        {"node0": 0, "node1": 2, "node2": 4}
