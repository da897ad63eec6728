"""Real tiny SenseVoice runs on the namespace cluster (3 nodes in their own namespaces).

The clean cluster trains: torchrun + FunASR + DeepSpeed (gloo, CPU) across three network stacks,
each rank on its own node. Then the failures that pre-flight catches are launched anyway
(``--force``): the run hangs without a word, and the stall watch's reachability re-run names the
real cause and the node within 2 minutes (the drill's start-up allowance is 45 s instead of the
console's 15 minutes, so that it fits CI).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.netns import MASTER_PORT, NetnsCluster
from console.ssh.pool import Pool
from console.training import runs
from console.training.follow import RunFollower
from console.training.metrics import MetricsStore
from console.training.stacks import StallWatch
from tests import netns as fixtures
from tests.test_launch import _needs_training_stack, tiny_profile, train_rows

netns_cluster_session = fixtures.netns_cluster_session
netns_cluster = fixtures.netns_cluster

pytestmark = pytest.mark.slow
DRILL_ALLOWANCE_S = 45.0
FINDING_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def tiny_set(netns_cluster_session: NetnsCluster):
    from svconsole_scripts import tiny_sensevoice

    return tiny_sensevoice.make(netns_cluster_session.shared_dir / "tiny", samples=8, seconds=1.5)


def launch(cluster: NetnsCluster, tiny, tmp_path: Path, capsys, name: str, *extra: str
           ) -> tuple[int, dict]:
    out = cluster.shared_dir / name
    out.mkdir(exist_ok=True)
    profile = tmp_path / "training.yaml"
    profile.write_text(yaml.safe_dump(tiny_profile(tiny, out, max_epoch=1)))
    cache = os.environ.get("TORCH_EXTENSIONS_DIR",
                           str(Path.home() / ".cache" / "svconsole" / "torch_extensions"))
    code = main(["--config", str(cluster.cluster_yaml), "launch", "--profile", str(profile),
                 "--entry", "cpu-wrapper", "--env", f"TORCH_EXTENSIONS_DIR={cache}", "--yes",
                 "--json", *extra])
    stdout, err = capsys.readouterr()
    assert stdout.startswith("{"), (code, stdout, err)
    return code, json.loads(stdout)


def stop_all(pool: Pool, state: Path) -> None:
    for record in runs.load_index(state):
        runs.stop_run(pool, record, grace=2)


def test_netns_clean_cluster_trains(netns_cluster: NetnsCluster, tiny_set, tmp_path, capsys,
                                    monkeypatch) -> None:
    _needs_training_stack()
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    pool = Pool(load_cluster(netns_cluster.cluster_yaml))
    try:
        code, reply = launch(netns_cluster, tiny_set, tmp_path, capsys, "clean")
        assert code == 0, (reply["message"], [c for c in reply["checks"] if not c["ok"]])
        record = runs.RunRecord.from_dict(reply["run"])
        follower = RunFollower(pool, record, interval=0.5)
        with follower:
            assert follower.wait(600), {n: (f.state, f.error)
                                        for n, f in follower.followers.items()}
        status = runs.run_status(pool, record)
        assert status.state == "finished", [Path(n.log).read_text()[-2000:]
                                            for n in record.nodes]
        rows = train_rows(record)
        nodes = netns_cluster.nodes
        assert {(node, rank) for node, rank, *_ in rows} == {(nodes[i], i) for i in range(3)}
    finally:
        stop_all(pool, state)
        pool.close()


def forced_drill(cluster: NetnsCluster, tiny, tmp_path: Path, capsys, monkeypatch,
                 name: str) -> tuple[str, float]:
    """Launch with --force while the failure is in place; the stall watch's diagnosis text and
    the seconds from the launch to it."""
    _needs_training_stack()
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    pool = Pool(load_cluster(cluster.cluster_yaml))
    try:
        started = time.monotonic()
        code, reply = launch(cluster, tiny, tmp_path, capsys, name, "--force")
        assert code == 0, reply["message"]
        assert [c for c in reply["checks"] if not c["ok"]], "pre-flight did not catch it"
        record = runs.RunRecord.from_dict(reply["run"])
        store = MetricsStore(startup_allowance_s=DRILL_ALLOWANCE_S)
        follower = RunFollower(pool, record, store=store, interval=0.5)
        watch = StallWatch(pool, record, store, interval=2.0)
        with follower:
            watch.start()
            try:
                deadline = started + FINDING_WITHIN_S + 60
                while not watch.diagnosed and time.monotonic() < deadline:
                    time.sleep(1)
            finally:
                watch.stop()
        assert watch.diagnosed, "no stall diagnosed"
        assert not train_rows(record)  # it never trained
        took = time.monotonic() - started
        with capsys.disabled():
            print(f"\n  drill forced {name}: named {took:.0f} s after the launch: "
                  f"{watch.diagnosed[0][1][:200]}")
        return watch.diagnosed[0][1], took
    finally:
        stop_all(pool, state)
        pool.close()


def test_netns_forced_master_port_dropped_is_named(netns_cluster: NetnsCluster, tiny_set,
                                                   tmp_path, capsys, monkeypatch) -> None:
    netns_cluster.drop_port(0, MASTER_PORT)
    text, took = forced_drill(netns_cluster, tiny_set, tmp_path, capsys, monkeypatch, "drop")
    nodes = netns_cluster.nodes
    assert took < FINDING_WITHIN_S, (took, text)
    assert f"{nodes[1]}: {nodes[1]} -> {netns_cluster.node(0).address}:{MASTER_PORT}: " \
           f"timed out" in text, text
    assert f"a firewall on {nodes[0]}" in text and "peer ports" not in text


def test_netns_forced_peer_ports_blocked_is_named(netns_cluster: NetnsCluster, tiny_set,
                                                  tmp_path, capsys, monkeypatch) -> None:
    """The issue's node2, the second node: the third rank's gloo pair connects to it and hangs
    (with the last node firewalled instead, torch 2.13's gloo trains: its pairs connect from the
    higher rank, and replies pass the firewall)."""
    netns_cluster.open_only(1, [22, MASTER_PORT])
    text, took = forced_drill(netns_cluster, tiny_set, tmp_path, capsys, monkeypatch, "peers")
    nodes = netns_cluster.nodes
    assert took < FINDING_WITHIN_S, (took, text)
    assert f"{nodes[1]}: {nodes[1]} ({netns_cluster.node(1).address}) cannot be reached on an " \
           f"ephemeral port" in text, text
    assert "master port" not in text.split("; stacks:")[0]  # reachable: not blamed


def test_netns_forced_private_output_dir_is_named(netns_cluster: NetnsCluster, tiny_set,
                                                  tmp_path, capsys, monkeypatch) -> None:
    """output_dir a private directory on the third node: nothing hangs, the run goes on and
    every node writes its own copy. ``launch --force`` names the node and the cause as it
    launches; the node's log then really lies in a directory only that node sees."""
    _needs_training_stack()
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    out = netns_cluster.shared_dir / "private-out"
    out.mkdir(exist_ok=True)
    private = netns_cluster.private_mount(2, out)
    nodes = netns_cluster.nodes
    pool = Pool(load_cluster(netns_cluster.cluster_yaml))
    try:
        started = time.monotonic()
        code, reply = launch(netns_cluster, tiny_set, tmp_path, capsys, "private-out", "--force")
        assert code == 0, reply["message"]
        failed = {(c["name"], c["node"]): c["message"] for c in reply["checks"] if not c["ok"]}
        assert set(failed) == {("shared output_dir", nodes[2])}, failed
        assert failed[("shared output_dir", nodes[2])].startswith(
            f"{nodes[2]} sees another directory at {out}")
        assert time.monotonic() - started < FINDING_WITHIN_S
        record = runs.RunRecord.from_dict(reply["run"])
        log = Path(record.node(nodes[2]).log).name
        deadline = time.monotonic() + 120
        while not (private / "logs" / log).exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert (private / "logs" / log).exists()  # its log: on the node's own directory
        assert not (out / "logs" / log).exists()  # not where the master and the console look
        # while it runs, the follower's watch names the node and the cause as a finding
        store = MetricsStore()
        watch = StallWatch(pool, record, store)
        assert watch.check_storage()
        (finding,) = [f for f in store.findings() if f.id == "output-dir-not-shared"]
        assert finding.node == nodes[2] and "sees another directory" in finding.detail
        assert time.monotonic() - started < FINDING_WITHIN_S
    finally:
        stop_all(pool, state)
        pool.close()
