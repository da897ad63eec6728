"""Judgement on node facts: tiers on synthetic machines and the real H200 reading, consistency on
real loopback facts with one node altered, readiness verdicts, and ``svconsole check``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from svconsole_scripts import probe as node_probe

from console.cli import main
from console.cluster.inventory import (
    Verdict,
    assess,
    consistency,
    gpu_class,
    gpu_meets,
    tier_of,
)
from console.cluster.model import Cluster, Node, load_cluster
from console.cluster.probe import GPUInfo, NodeFacts, probe_all
from console.ssh.pool import Pool

H200 = Path(__file__).parent / "fixtures" / "h200"


def gpus(n: int, name: str, mib: int, **kw) -> list[GPUInfo]:
    return [GPUInfo(index=i, name=name, memory_total_mb=mib, driver_version="550.54.15",
                    cuda_driver_version="12.4", compute_capability="9.0", **kw) for i in range(n)]


def machine(node: str = "n0", *, cores: int = 128, ram_gb: int = 1024, gpu: list | None = None,
            nvme_tb: float = 15.4, eth_mbps: int | None = 100000, ib_gbps: float | None = 400,
            machine_id: str = "m0", **kw) -> NodeFacts:
    """A synthetic machine; defaults make an 8x H100 80GB high-end box."""
    disks = [{"name": f"nvme{i}n1", "size_gb": nvme_tb * 1000 / 4, "rotational": False,
              "nvme": True} for i in range(4)] if nvme_tb else \
        [{"name": "sda", "size_gb": 4000.0, "rotational": True, "nvme": False}]
    ports = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": ib_gbps,
              "link_layer": "InfiniBand"}] if ib_gbps else []
    py = {"path": "/opt/venv/bin/python", "executable": "/opt/venv/bin/python",
          "version": "3.11.9", "torch": "2.6.0+cu124", "torch_cuda": "12.4", "nccl": "2.21.5",
          "deepspeed": "0.16.4", "funasr": "1.2.6", "numpy": "1.26.4", "error": None,
          "torch_imported": True}
    values = dict(
        node=node, collected_at=1000.0, ok=True, hostname=node, machine_id=machine_id,
        boot_id="b", cpu_cores=cores, cpu_usable=cores, mem_total_mb=int(ram_gb * 1024 * 0.98),
        mem_available_mb=ram_gb * 900,
        gpus=gpus(8, "NVIDIA H100 80GB HBM3", 81559) if gpu is None else gpu,
        gpu_source="nvml", disks=disks, rdma=["mlx5_0"] if ports else [], rdma_ports=ports,
        net=[{"name": "eth0", "kind": "physical", "state": "up", "addrs": [f"10.0.0.{node[-1]}/24"],
              "speed_mbps": eth_mbps, "mtu": 1500}],
        shared={"path": "/data/shared", "exists": True, "fstype": "nfs4", "is_nfs": True,
                "server": "10.0.0.0", "source": "10.0.0.0:/data/shared", "shared_fs": True},
        python=py)
    values.update(kw)
    return NodeFacts(**values)


def test_eight_h100_box_is_high_end():
    t = tier_of(machine())
    assert t.tier == "high end", t.fields
    assert t.unknown == ()


def test_two_3090_with_32gb_ram_is_below_minimum_naming_ram():
    box = machine(cores=16, ram_gb=32, gpu=gpus(2, "NVIDIA GeForce RTX 3090", 24576),
                  nvme_tb=2, eth_mbps=1000, ib_gbps=None)
    t = tier_of(box)
    assert t.tier == "below minimum"
    assert t.limited_by == ("ram",)
    assert t.field("ram").short_of == "64 GB"
    assert t.field("gpu").tier == "minimum"
    cluster = Cluster("c", (Node("n0", "10.0.0.0", role="head"),), shared_dir="/data/shared")
    report = assess(cluster, {"n0": box})
    below = [r for r in report.nodes["n0"].reasons if r.code == "below_minimum"]
    assert len(below) == 1 and re.search(r"ram 3\d GB \(needs 64 GB\)", below[0].message)
    assert "cpu" not in below[0].message


def test_gpu_classes_compare_by_memory_and_model():
    h100 = gpu_class("NVIDIA H100 80GB HBM3")
    h200 = GPUInfo(0, "NVIDIA H200", memory_total_mb=143771)
    a100_40 = GPUInfo(0, "NVIDIA A100-SXM4-40GB", memory_total_mb=40536)
    rtx4090 = GPUInfo(0, "NVIDIA GeForce RTX 4090", memory_total_mb=24564)
    assert gpu_class("NVIDIA GH200 480GB").label == "GH200"
    assert gpu_class("NVIDIA A10G").label == "A10" and gpu_class("NVIDIA A100-PCIE-40GB").label \
        == "A100 40GB"
    assert gpu_meets(h200, h100)          # an H200 beats an H100 80GB
    assert not gpu_meets(a100_40, h100)
    assert gpu_meets(a100_40, gpu_class("A100"))
    assert not gpu_meets(rtx4090, gpu_class("A100"))   # 24 GB < 40 GB
    assert gpu_meets(rtx4090, gpu_class("RTX 3090"))
    assert gpu_meets(GPUInfo(0, "NVIDIA Future X", memory_total_mb=200000), h100)  # by memory
    t = tier_of(machine(gpu=gpus(8, "NVIDIA H200", 143771)))
    assert t.field("gpu").tier == "high end"
    t = tier_of(machine(gpu=gpus(8, "NVIDIA A100-SXM4-80GB", 81920)))
    assert t.field("gpu").tier == "recommended"


def test_real_h200_reading_single_gpu_is_below_minimum_on_gpu_count():
    raw = node_probe.gpus_from_nvml(json.loads((H200 / "nvml.json").read_text()))
    box = machine(gpu=[GPUInfo(**g) for g in raw], cores=16, ram_gb=128)
    t = tier_of(box)
    assert t.field("gpu").level == 0 and "1x NVIDIA H200" in t.field("gpu").value
    assert "gpu" in t.limited_by


def test_configured_gpu_subset_counts_only_those():
    node = Node("n0", "10.0.0.0", gpus=(0, 1))
    assert tier_of(machine(), node).field("gpu").tier == "minimum"
    cluster = Cluster("c", (Node("n0", "10.0.0.0", gpus=(0, 9)),), shared_dir="/data/shared")
    reasons = assess(cluster, {"n0": machine()}).nodes["n0"].reasons
    assert [r.code for r in reasons] == ["gpus_missing", "below_minimum"]  # 1 usable GPU


def test_unknown_network_speed_is_unknown_not_below():
    t = tier_of(machine(eth_mbps=None, ib_gbps=None))
    assert t.field("network").level is None and t.unknown == ("network",)
    assert t.tier == "high end"  # judged on the fields that are known


def test_ready_cluster_and_not_shared_storage():
    head = Node("n0", "10.0.0.0", role="head")
    cluster = Cluster("c", (head, Node("n1", "10.0.0.1")), shared_dir="/data/shared")
    local = {"path": "/data/shared", "exists": True, "fstype": "ext4", "source": "/dev/nvme0n1",
             "is_nfs": False, "server": None, "shared_fs": False}
    nodes = {"n0": machine("n0", shared=local, machine_id="a"),
             "n1": machine("n1", machine_id="b")}  # NFS from 10.0.0.0, the head
    report = assess(cluster, nodes)
    assert report.verdict == Verdict.READY, report.reasons
    nodes["n1"] = machine("n1", machine_id="b", shared=local)
    report = assess(cluster, nodes)
    assert report.verdict == Verdict.DEGRADED
    assert [r.code for r in report.nodes["n1"].reasons] == ["not_shared"]
    nodes["n1"] = machine("n1", machine_id="b", shared={**local, "exists": False})
    report = assess(cluster, nodes)
    assert report.nodes["n1"].verdict == Verdict.NOT_READY
    assert any(m.field == "shared_dir" for m in report.mismatches)


def test_cpu_torch_on_gpu_node_and_missing_stack_are_not_ready():
    cluster = Cluster("c", (Node("n0", "10.0.0.0", role="head"),), shared_dir="/data/shared")
    box = machine()
    box.python = {**box.python, "torch_cuda": None, "torch": "2.6.0+cpu", "funasr": None,
                  "torch_imported": True}
    reasons = assess(cluster, {"n0": box}).nodes["n0"].reasons
    codes = {r.code: r.message for r in reasons}
    assert "funasr not installed in /opt/venv/bin/python" in codes["training_stack"]
    assert "CPU build" in codes["cpu_torch"]


# ---------------------------------------------------------------- on real loopback facts


@pytest.fixture(scope="module")
def loopback_facts(loopback):
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    try:
        yield cluster, probe_all(pool, cluster, torch_timeout=0, master_rtt=False)
    finally:
        pool.close()


def test_real_nodes_are_consistent(loopback_facts):
    cluster, facts = loopback_facts
    assert all(f.ok for f in facts.values())
    assert consistency(facts) == []
    report = assess(cluster, facts)
    # one machine: shared_dir is the same directory for every node
    assert not any(r.code in ("not_shared", "mismatch") for r in report.reasons)


def test_consistency_flags_a_node_reporting_another_torch(loopback_facts):
    cluster, facts = loopback_facts
    data = facts["node3"].to_json()
    data["python"]["torch"] = "2.3.0"
    altered = {**facts, "node3": NodeFacts.from_json(data)}
    mismatches = consistency(altered, prefer="node0")
    assert [m.field for m in mismatches] == ["torch"]
    m = mismatches[0]
    assert m.odd == ("node3",) and m.values["node3"] == "2.3.0"
    assert m.majority == facts["node0"].python["torch"]
    assert "collective communication" in m.note
    report = assess(cluster, altered)
    assert report.verdict == Verdict.NOT_READY
    odd = [r for r in report.nodes["node3"].reasons if r.code == "mismatch"]
    assert len(odd) == 1 and "torch 2.3.0 differs" in odd[0].message
    assert not any(r.code == "mismatch" for r in report.nodes["node0"].reasons)
    assert any(r.code == "mismatch" and "node3=2.3.0" in r.message for r in report.reasons)


def test_check_command_exit_code_follows_the_verdict(loopback, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))
    rc = main(["--config", str(loopback.cluster_yaml), "check", "--json", "--timeout", "60",
               "--no-torch"])
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["nodes"]) == set(loopback.nodes)
    assert rc == (1 if doc["verdict"] == "not ready" else 0)
    assert doc["nodes"]["node0"]["facts"]["ok"] is True
    assert (tmp_path / "facts" / "loopback.json").exists()
    loopback.kill(3)
    rc = main(["--config", str(loopback.cluster_yaml), "check", "--timeout", "15", "--no-torch"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "cluster loopback: NOT READY" in text
    row = next(line for line in text.splitlines() if line.startswith("node3"))
    assert "stale" in row and "not ready" in row
    assert "node3: unreachable:" in text
