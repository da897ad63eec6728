"""Nodes named by their ~/.ssh/config alias: the plan's MASTER_ADDR and every node's address are
the HostName the alias stands for, never the alias (a name only this console's ssh knows)."""

from __future__ import annotations

from pathlib import Path

from test_launch import info
from test_sshconfig import write_cluster

from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training.launch import build_plan, network_view
from console.training.profile import parse_profile


def test_aliases_become_their_hostnames_in_the_plan(tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text(
        "Host sv-n0\n  HostName 10.20.0.10\n  Port 2200\n"
        "Host sv-n1\n  HostName 10.20.0.11\n")
    cluster = load_cluster(write_cluster(tmp_path, [("node0", "sv-n0"), ("node1", "sv-n1")],
                                         "config_file: ssh_config\n"))
    pool = Pool(cluster)
    try:
        view = network_view(pool)
        assert [n.host for n in view.nodes] == ["10.20.0.10", "10.20.0.11"]
        assert [n.host for n in pool.cluster.nodes] == ["sv-n0", "sv-n1"]   # untouched
        profile = parse_profile("model: /m\ntrain_data_set_list: /d/train.jsonl\n"
                                "valid_data_set_list: /d/valid.jsonl\noutput_dir: /out\n",
                                "training.yaml")
        plan = build_plan(view, profile, {n: info(n, gpus=[0]) for n in ("node0", "node1")})
        assert plan.master_addr == "10.20.0.10"
        assert all("sv-n" not in " ".join(n.argv) for n in plan.nodes)
        assert [n.host for n in plan.nodes] == ["10.20.0.10", "10.20.0.11"]
    finally:
        pool.close()
