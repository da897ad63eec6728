"""The node probe: GPU parsing on real H200 readings, payload extraction, and facts read from the
loopback cluster's real sshd nodes compared with this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest
from svconsole_scripts import probe as node_probe

from console.cluster.inventory import assess
from console.cluster.model import load_cluster
from console.cluster.probe import (
    FactsCache,
    NodeFacts,
    ProbeError,
    extract_payload,
    probe_all,
    probe_node,
)
from console.ssh.pool import Pool
from console.ssh.remote import script_text

H200 = Path(__file__).parent / "fixtures" / "h200"
# The columns of fixtures/h200/query-gpu.csv (see /work/shared/fixtures/h200/README.md).
H200_QUERY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total",
                     "memory.used", "utilization.gpu", "utilization.memory", "temperature.gpu",
                     "power.draw", "power.limit", "clocks.sm", "clocks.mem", "pstate",
                     "compute_cap")


# ---------------------------------------------------------------- GPU parsing (real readings)


def _check_h200(gpu: dict) -> None:
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["compute_capability"] == "9.0"
    assert abs(gpu["memory_total_mb"] - 143771) <= 1
    assert gpu["driver_version"] == "580.159.04"
    assert gpu["cuda_driver_version"] == "13.0"
    assert gpu["uuid"] == "GPU-6a6cead0-ea07-7520-cae2-b62c198dfdea"


def test_gpus_from_nvml_readings():
    gpus = node_probe.gpus_from_nvml(json.loads((H200 / "nvml.json").read_text()))
    assert len(gpus) == 1
    _check_h200(gpus[0])
    assert gpus[0]["persistence"] is True and gpus[0]["ecc"] is True
    assert (gpus[0]["pcie_gen"], gpus[0]["pcie_width"]) == (5, 16)
    assert gpus[0]["nvlink_up"] is None  # every link answered NotSupported on that VM


def test_gpus_from_nvidia_smi_query_and_xml():
    cuda = node_probe.cuda_version_from_smi_xml((H200 / "nvidia-smi-q.xml").read_text())
    gpus = node_probe.gpus_from_query_csv((H200 / "query-gpu.csv").read_text(),
                                          H200_QUERY_FIELDS, cuda)
    assert len(gpus) == 1
    _check_h200(gpus[0])
    assert gpus[0]["index"] == 0
    assert gpus[0]["persistence"] is None  # not among that file's columns


def test_query_csv_not_available_values_are_none():
    line = "1, GPU-x, Tesla T4, 470.1, 15360, [N/A], Disabled, [N/A], 3, 16\n"
    gpu = node_probe.gpus_from_query_csv(line)[0]
    assert gpu["compute_capability"] is None and gpu["ecc"] is None
    assert gpu["persistence"] is False and gpu["pcie_gen"] == 3


def test_nvlink_status_counts_active_links():
    text = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-a)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n"
            "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-b)\n\t Link 0: 25 GB/s\n\t Link 1: 25 GB/s\n")
    assert node_probe.nvlink_from_status(text) == {0: 1, 1: 2}
    assert node_probe.nvlink_from_status("") == {}  # the H200 VM printed nothing


# ---------------------------------------------------------------- other parsers


def test_shared_dir_on_nfs_names_its_server(tmp_path):
    mounts = (f"/dev/vda / ext4 rw 0 0\n10.0.0.1:/export/shared {tmp_path} nfs4 rw,vers=4.2 0 0\n"
              f"/dev/sdb {tmp_path}/with\\040space ext4 rw 0 0\n")
    facts = node_probe.shared_dir_facts(str(tmp_path), mounts)
    assert facts["exists"] and facts["is_nfs"] and facts["server"] == "10.0.0.1"
    assert facts["source"] == "10.0.0.1:/export/shared" and facts["mountpoint"] == str(tmp_path)
    assert node_probe.mount_of(f"{tmp_path}/with space/x", mounts)["source"] == "/dev/sdb"
    missing = node_probe.shared_dir_facts(str(tmp_path / "absent"), mounts)
    assert missing["exists"] is False and missing["fstype"] is None


def test_payload_found_among_noise_and_old_payloads():
    good = {"version": node_probe.PAYLOAD_VERSION, "hostname": "h"}
    old = node_probe.BEGIN.format(nonce="old") + '\n{"version": 1, "hostname": "stale"}\n' + \
        node_probe.END.format(nonce="old")
    text = (f"Welcome banner\n{old}\nconda init...\n{node_probe.BEGIN.format(nonce='n1')}\n"
            f"{json.dumps(good)}\n{node_probe.END.format(nonce='n1')}\ntrailing noise\n")
    assert extract_payload(text, "n1")["hostname"] == "h"
    with pytest.raises(ProbeError, match="no probe payload"):
        extract_payload("bash: python3: command not found\n", "n1")
    with pytest.raises(ProbeError, match="cut off"):
        extract_payload(f"{node_probe.BEGIN.format(nonce='n1')}\n{{\"ver", "n1")


def test_probe_runs_locally_and_reports_every_fact():
    out = subprocess.run([sys.executable, "-", "--nonce", "x", "--shared-dir", "/nonexistent",
                          "--torch-timeout", "0", "--python", "/nonexistent/bin/python"],
                         input=script_text("probe.py"),
                         capture_output=True, text=True, timeout=60, check=True)
    payload = extract_payload(out.stdout, "x")
    assert payload["errors"] == {}
    assert payload["python"]["error"] == "training Python /nonexistent/bin/python not found"
    assert payload["shared"]["exists"] is False
    assert payload["gpu"]["gpus"] or payload["gpu"]["error"].startswith("no NVIDIA GPU")


# ---------------------------------------------------------------- loopback cluster


@pytest.fixture(scope="module")
def probed(loopback):
    """One probe round of the loopback cluster, torch imported (its CUDA/NCCL versions)."""
    cluster = load_cluster(loopback.cluster_yaml)
    with_pool = Pool(cluster)
    try:
        t0 = time.time()
        # generous limits: four torch imports at once on a busy 2-core machine take a while
        facts = probe_all(with_pool, cluster, timeout=280, torch_timeout=240)
        yield cluster, facts, time.time() - t0
    finally:
        with_pool.close()


@pytest.fixture
def pool(loopback):
    p = Pool(load_cluster(loopback.cluster_yaml))
    yield p
    p.close()


def _meminfo_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no MemTotal")


def _torch_cuda() -> str | None:
    """torch.version.cuda read from torch/version.py (importing torch here would cost seconds)."""
    text = (Path(find_spec("torch").origin).parent / "version.py").read_text()
    m = re.search(r"^cuda(?:: [^=]+)? = '?([^'\n]*?)'?$", text, re.M)
    return None if m is None or m.group(1) == "None" else m.group(1)


def test_facts_match_this_machine(probed):
    cluster, facts, _ = probed
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    py_version = subprocess.run(
        [cluster.python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, check=True).stdout.strip()
    from importlib.metadata import version

    assert set(facts) == set(cluster.names())
    for f in facts.values():
        assert f.ok and f.error is None and not f.stale, f.error
        assert f.fact_errors == {}
        assert f.hostname == socket.gethostname()
        assert f.cpu_usable == nproc and f.cpu_cores == os.cpu_count()
        assert abs(f.mem_total_mb - _meminfo_total_mb()) <= 0.03 * _meminfo_total_mb()
        assert 0 < f.mem_available_mb <= f.mem_total_mb
        assert f.python["version"] == py_version
        assert f.python["executable"] == cluster.python and f.python["error"] is None
        assert f.python["torch"] == version("torch")
        assert f.python["deepspeed"] == version("deepspeed")
        assert f.python["funasr"] == version("funasr")
        assert f.python["torch_imported"] is True
        assert f.python["torch_cuda"] == _torch_cuda()
        assert abs(f.disk_root["total_gb"] - shutil.disk_usage("/").total / 1e9) < 1
        assert f.shared["exists"] and f.shared["path"] == cluster.shared_dir
        assert any(i["name"] == "lo" and "127.0.0.1/8" in i["addrs"] for i in f.net)
        assert f.rtt_ms is not None and f.rtt_ms > 0
        assert f.master_rtt_ms is not None, f.master_rtt_note
        assert f.master_rtt_note.startswith(f"TCP connect from {cluster.master}")
        # same machine: the offset is zero within what the round trip can tell
        assert abs(f.clock_offset_s) <= f.clock_uncertainty_s + 0.05
        assert NodeFacts.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_banner_node_probes_cleanly(loopback, pool, probed):
    banner = loopback.node(2)
    noisy = pool.run(banner.name, "echo hello", timeout=120)
    assert banner.banner_text in noisy.stdout  # the noise really is there
    _, facts, _ = probed
    assert facts[banner.name].ok and facts[banner.name].hostname == socket.gethostname()
    again = probe_node(pool, load_cluster(loopback.cluster_yaml), banner.name, torch_timeout=0)
    assert again.ok, again.error
    assert again.cpu_cores == facts[banner.name].cpu_cores


def test_missing_training_python_is_a_reason_not_a_dead_probe(loopback, pool):
    cluster = replace(load_cluster(loopback.cluster_yaml), python="/nonexistent/bin/python")
    f = probe_node(pool, cluster, "node0", torch_timeout=0)
    assert f.ok, f.error
    assert f.python["error"] == "training Python /nonexistent/bin/python not found"
    assert f.cpu_cores == os.cpu_count()


def test_killed_node_keeps_stale_facts_while_others_refresh(loopback, pool, tmp_path):
    cluster = load_cluster(loopback.cluster_yaml)
    cache = FactsCache(tmp_path, cluster.name)
    first = probe_all(pool, cluster, cache=cache, torch_timeout=0, master_rtt=False)
    assert all(f.ok for f in first.values())
    loopback.kill(1)
    second = probe_all(pool, cluster, cache=cache, torch_timeout=0, timeout=15)
    dead = second["node1"]
    assert not dead.ok and dead.stale and dead.error
    assert dead.collected_at == first["node1"].collected_at
    assert dead.cpu_cores == first["node1"].cpu_cores  # last known facts kept
    for name in ("node0", "node2", "node3"):
        assert second[name].ok and not second[name].stale
        assert second[name].collected_at > first[name].collected_at
    # the cache on disk still holds node1's last good facts
    assert cache.load()["node1"].collected_at == first["node1"].collected_at
    report = assess(cluster, second)
    assert report.nodes["node1"].verdict.value == "not ready"
    assert report.nodes["node1"].reasons[0].code == "unreachable"
    assert "facts from" in report.nodes["node1"].reasons[0].message
    # without a cache the dead node is simply unreachable, with no facts
    bare = probe_all(pool, cluster, nodes=["node1"], torch_timeout=0, timeout=15)
    assert not bare["node1"].ok and not bare["node1"].stale and bare["node1"].cpu_cores is None
