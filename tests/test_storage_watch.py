"""The storage check a running run gets once from its watch: on shared storage (the loopback
cluster's nodes share this machine's disk) it finds nothing and leaves nothing behind; the
namespace drill (test_netns_training) shows the node that sees another directory named."""

from __future__ import annotations

from test_follow_contexts import a_record

from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training.metrics import MetricsStore
from console.training.preflight import shared_storage
from console.training.stacks import StallWatch


def loopback_record(loopback, out):
    record = a_record()
    cluster = load_cluster(loopback.cluster_yaml)
    plan = dict(record.plan)
    plan["output_dir"] = str(out)
    plan["master"] = cluster.names()[0]
    plan["nodes"] = [dict(n, node=name) for n, name in zip(plan["nodes"], cluster.names(),
                                                            strict=False)]
    record.plan = plan
    return cluster, record


def test_shared_output_dir_gives_no_finding_and_no_leftover(loopback):
    out = loopback.shared_dir / "storage-watch"
    cluster, record = loopback_record(loopback, out)
    with Pool(cluster) as pool:
        checks = shared_storage(pool, record)
        assert len(checks) == 2 and all(c.ok for c in checks), checks
        store = MetricsStore()
        watch = StallWatch(pool, record, store)
        assert watch.check_storage() and not watch.check_storage()   # once
        assert not [f for f in store.findings() if f.id == "output-dir-not-shared"]
    assert not list((out / "svconsole").glob(".shared-*"))


def test_an_unwritable_output_dir_proves_nothing(loopback, tmp_path):
    cluster, record = loopback_record(loopback, "/proc/no-such-dir")
    with Pool(cluster) as pool:
        assert shared_storage(pool, record) == []
