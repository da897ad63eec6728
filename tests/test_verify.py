"""Environment verification against the loopback cluster (real sshd): the all_reduce benchmark
over gloo between two nodes, and ``svconsole verify`` measuring latency, iperf3, storage and the
master port with a banner-printing node among them."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from console.bringup import Runner, SetupOptions, StepState
from console.bringup.measure import MASTER_PORT, STEPS
from console.bringup.model import nccl_env_file
from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.pool import Pool


def test_collective_bandwidth_over_gloo_between_two_nodes(loopback, tmp_path) -> None:
    pytest.importorskip("torch")
    cluster = load_cluster(loopback.cluster_yaml)
    step = next(s for s in STEPS if s.id == "collective")
    options = SetupOptions(bench_mb=2, bench_iters=3)
    env_file = Path(nccl_env_file(cluster, "node1"))  # as the nccl-env step writes it
    env_file.parent.mkdir(parents=True, exist_ok=True)
    saved = env_file.read_text() if env_file.exists() else None
    env_file.write_text('export GLOO_SOCKET_IFNAME="lo"\necho "sourced $GLOO_SOCKET_IFNAME"\n')
    try:
        with Pool(cluster) as pool:
            summary = Runner(pool, cluster, [step], state_dir=tmp_path, options=options,
                             nodes=["node1", "node2"]).run()
    finally:
        if saved is None:
            env_file.unlink()
        else:
            env_file.write_text(saved)
    assert {c.node: c.state for c in summary.cells} == {"node1": StepState.DONE,
                                                         "node2": StepState.DONE}
    report = summary.measurements["collective"]["report"]
    assert report["backend"] == "gloo" and report["world_size"] == 2
    assert report["size_bytes"] == 2 * 2**20 and report["iters"] == 3
    assert report["algbw_gbps"] > 0
    # all_reduce over 2 ranks: busbw = algbw * 2 (n - 1) / n = algbw
    assert report["busbw_gbps"] == pytest.approx(report["algbw_gbps"])
    assert re.match(r"all_reduce of 2 MiB over gloo, 2 ranks on 2 nodes: algbw [\d.]+ GB/s, "
                    r"busbw [\d.]+ GB/s$", summary.notes["collective"][0])
    log = (tmp_path / "runs" / summary.run_id / "node1" / "collective.log").read_text()
    assert "SVBENCH {" in log and "sourced lo" in log


def test_verify_cli_measures_latency_iperf_storage_and_master_port(
        loopback, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    steps = "latency,storage,master-port" + (",iperf3" if shutil.which("iperf3") else "")
    code = main(["--config", str(loopback.cluster_yaml), "verify", "--json", "--steps", steps,
                 "--nodes", "node0,node2", "--latency-count", "50", "--storage-mb", "8",
                 "--iperf-seconds", "1"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result
    assert {c["state"] for c in result["cells"]} == {"done"}
    pair = result["measurements"]["latency"]["pairs"][0]
    assert (pair["server"], pair["client"]) == ("node0", "node2")
    assert 0 < pair["min_us"] <= pair["median_us"] <= pair["p99_us"]
    note = result["notes"]["latency"][0]
    assert "< 20 us" in note and "RDMA" in note and "TCP" in note
    storage = result["measurements"]["storage"]["nodes"]
    for node in ("node0", "node2"):
        assert storage[node]["bytes_read"] == 8 * 2**20 and storage[node]["write_mb_s"] > 0
    cluster = load_cluster(loopback.cluster_yaml)
    assert not list((cluster.local_path(cluster.shared_dir) / ".svconsole-io").glob("*.bin"))
    assert result["measurements"]["master-port"]["workers"] == {"node2": "ok"}
    if "iperf3" in steps:
        link = result["measurements"]["iperf3"]["links"][0]
        assert link["client"] == "node2" and link["gbit_s"] > 0
    assert result["message"].startswith("measured:")


def test_master_port_in_use_is_reported(loopback, tmp_path) -> None:
    cluster = load_cluster(loopback.cluster_yaml)
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # earlier tests' TIME_WAIT
        busy.bind((cluster.master_node.host, cluster.master_port))
        busy.listen(1)
        with Pool(cluster) as pool:
            summary = Runner(pool, cluster, [MASTER_PORT], state_dir=tmp_path,
                             nodes=["node0", "node1"]).run()
    cell = summary.cell("master-port", "node1")
    assert cell.state == StepState.FAILED
    assert f"cannot listen on port {cluster.master_port}" in cell.detail
