"""Pre-flight on the namespace cluster: each real multi-host failure is made real and caught.

On the loopback cluster all nodes share one network stack, firewall and set of mounts, so none of
these can fail there. Here (3 nodes in their own namespaces, tests/netns.py) the clean cluster
passes ``launch --dry-run``; a master that drops its master port, a node where only ssh and the
master port are open, an output_dir that is a private directory on one node, audio files that do
not exist, an interface variable that names no interface, and a hostname that resolves to
loopback are each caught, naming the node, with exit code 1 (the hostname: a warning, rc 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.netns import MASTER_PORT, NetnsCluster
from console.ssh.pool import Pool
from console.training.launch import LaunchOptions, prepare
from console.training.preflight import ifname_matches, reachability
from console.training.profile import load_profile
from tests import netns as fixtures
from tests.test_launch import tiny_profile

netns_cluster_session = fixtures.netns_cluster_session
netns_cluster = fixtures.netns_cluster


@pytest.fixture(scope="module")
def tiny_set(netns_cluster_session: NetnsCluster):
    from svconsole_scripts import tiny_sensevoice

    return tiny_sensevoice.make(netns_cluster_session.shared_dir / "tiny", samples=8, seconds=1.5)


@pytest.fixture
def profile_file(netns_cluster: NetnsCluster, tiny_set, tmp_path: Path) -> Path:
    out = netns_cluster.shared_dir / "exp"
    out.mkdir(exist_ok=True)
    path = tmp_path / "training.yaml"
    path.write_text(yaml.safe_dump(tiny_profile(tiny_set, out, max_epoch=1)))
    return path


def dry_run(cluster: NetnsCluster, profile: Path, capsys, *extra: str) -> tuple[int, dict]:
    code = main(["--config", str(cluster.cluster_yaml), "launch", "--profile", str(profile),
                 "--entry", "cpu-wrapper", "--dry-run", "--json", *extra])
    out, err = capsys.readouterr()
    assert out.startswith("{"), (code, out, err)
    return code, json.loads(out)


def failures(reply: dict) -> dict[tuple[str, str | None], str]:
    return {(c["name"], c["node"]): c["message"] for c in reply["checks"] if not c["ok"]}


NEW_CHECKS = ("master port reachable", "peer ports", "shared output_dir", "interface",
              "hostname", "data files")


def test_netns_clean_cluster_passes_every_check(netns_cluster: NetnsCluster, profile_file,
                                                capsys) -> None:
    code, reply = dry_run(netns_cluster, profile_file, capsys)
    assert code == 0 and failures(reply) == {}, failures(reply)
    seen = {(c["name"], c["node"]) for c in reply["checks"]}
    nodes = netns_cluster.nodes
    for name in NEW_CHECKS:
        expected = nodes[1:] if name == "master port reachable" else nodes
        assert {n for check, n in seen if check == name} == set(expected), name
    messages = {(c["name"], c["node"]): c["message"] for c in reply["checks"]}
    assert "through eth0" in messages[("interface", nodes[1])]
    assert messages[("hostname", nodes[2])] == \
        f"{nodes[2]} resolves to {netns_cluster.node(2).address}"
    assert not any(c["warning"] for c in reply["checks"])


def test_netns_master_port_dropped_by_the_masters_firewall(netns_cluster: NetnsCluster,
                                                           profile_file, capsys) -> None:
    netns_cluster.drop_port(0, MASTER_PORT)
    code, reply = dry_run(netns_cluster, profile_file, capsys)
    nodes = netns_cluster.nodes
    failed = failures(reply)
    assert code == 1
    assert set(failed) == {("master port reachable", nodes[1]),
                           ("master port reachable", nodes[2])}, failed
    for worker in nodes[1:]:
        message = failed[("master port reachable", worker)]
        assert message.startswith(f"{worker} -> {netns_cluster.node(0).address}:{MASTER_PORT}: "
                                  f"timed out")
        assert f"a firewall on {nodes[0]}" in message and f"accept TCP {MASTER_PORT}" in message
    # "master port: free" on the master itself still passes: it IS free there
    assert any(c["name"] == "master port" and c["ok"] for c in reply["checks"])


def test_netns_only_ssh_and_master_port_open_on_node2(netns_cluster: NetnsCluster,
                                                      profile_file, capsys) -> None:
    """The issue's node2 is the second node (index 1)."""
    netns_cluster.open_only(1, [22, MASTER_PORT])
    code, reply = dry_run(netns_cluster, profile_file, capsys)
    nodes = netns_cluster.nodes
    failed = failures(reply)
    assert code == 1 and set(failed) == {("peer ports", nodes[1])}, failed
    message = failed[("peer ports", nodes[1])]
    assert message.startswith(f"{nodes[1]} ({netns_cluster.node(1).address}) cannot be reached "
                              f"on an ephemeral port")
    assert f"from {nodes[0]}, {nodes[2]}: timed out" in message
    assert "master port" not in message  # it is not blamed: it was reachable
    assert all(c["ok"] for c in reply["checks"] if c["name"] == "master port reachable")


def test_netns_output_dir_private_on_node3(netns_cluster: NetnsCluster, profile_file,
                                           capsys) -> None:
    out = Path(load_profile(profile_file).output_dir)
    private = netns_cluster.private_mount(2, out)
    code, reply = dry_run(netns_cluster, profile_file, capsys)
    nodes = netns_cluster.nodes
    failed = failures(reply)
    assert code == 1 and set(failed) == {("shared output_dir", nodes[2])}, failed
    message = failed[("shared output_dir", nodes[2])]
    assert message.startswith(f"{nodes[2]} sees another directory at {out}: the token "
                              f"{nodes[0]} wrote there is missing")
    assert "a bind or private mount over it?" in message  # same device, another inode
    assert not list(out.glob(".svconsole-preflight-*"))  # the check left no token behind
    assert not list(private.glob(".svconsole-preflight-*"))


def test_netns_missing_audio_interface_and_hostname(netns_cluster: NetnsCluster, tiny_set,
                                                    profile_file, capsys, tmp_path) -> None:
    rows = [json.loads(line) for line in tiny_set.train_jsonl.read_text().splitlines()]
    rows[-1]["source"] = str(netns_cluster.shared_dir / "gone.wav")
    broken = netns_cluster.shared_dir / "train-missing.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = yaml.safe_load(profile_file.read_text())
    doc["train_data_set_list"] = str(broken)
    profile_file.write_text(yaml.safe_dump(doc))
    netns_cluster.set_hosts(1, f"127.0.0.1 localhost\n127.0.1.1 {netns_cluster.nodes[1]}\n")
    code, reply = dry_run(netns_cluster, profile_file, capsys, "--env", "GLOO_SOCKET_IFNAME=eth1")
    nodes = netns_cluster.nodes
    failed = failures(reply)
    assert code == 1
    assert set(failed) == {("data files", n) for n in nodes} | {("interface", n) for n in nodes}
    assert f"line {len(rows)}: {netns_cluster.shared_dir / 'gone.wav'}" in \
        failed[("data files", nodes[1])]
    assert "GLOO_SOCKET_IFNAME=eth1 selects no interface of" in failed[("interface", nodes[2])]
    (warned,) = [c for c in reply["checks"] if c["warning"]]
    assert (warned["name"], warned["node"], warned["ok"]) == ("hostname", nodes[1], True)
    assert f"hostname {nodes[1]} resolves to 127.0.1.1 (loopback)" in warned["message"]


def test_netns_check_preflight_says_the_same(netns_cluster: NetnsCluster, profile_file,
                                             capsys) -> None:
    netns_cluster.open_only(2, [22, MASTER_PORT])
    code = main(["--config", str(netns_cluster.cluster_yaml), "check", "--preflight",
                 "--profile", str(profile_file), "--entry", "cpu-wrapper"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert f"[FAIL] peer ports: {netns_cluster.nodes[2]}: " in out
    assert f"[ok] master port reachable: {netns_cluster.nodes[1]}: " in out


def test_netns_reachability_of_a_plan(netns_cluster: NetnsCluster, profile_file) -> None:
    """The stall detector's diagnosis: the network checks alone, also while the master port is
    held (there by a listener standing in for the run's store)."""
    store = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
             f"socket.SO_REUSEADDR, 1); s.bind(('', {MASTER_PORT})); s.listen(); "
             "print('up', flush=True); time.sleep(120)")
    pool = Pool(load_cluster(netns_cluster.cluster_yaml))
    holder = subprocess.Popen(netns_cluster.enter_argv(0, [sys.executable, "-c", store]),
                              stdout=subprocess.PIPE, text=True)
    try:
        prep = prepare(pool, load_profile(profile_file), LaunchOptions(entry="cpu-wrapper"))
        assert prep.plan is not None
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        held = reachability(pool, prep.plan)
        netns_cluster.drop_port(0, MASTER_PORT)
        dropped = reachability(pool, prep.plan)
    finally:
        holder.kill()
        holder.wait()
        pool.close()
    assert {c.name for c in held} == {"master port reachable", "peer ports"}
    assert all(c.ok for c in held), [str(c) for c in held]
    assert "in use on the master and what holds it answers" in next(c.message for c in held
                                            if c.name == "master port reachable")
    assert {(c.name, c.node) for c in dropped if not c.ok} == \
        {("master port reachable", n) for n in netns_cluster.nodes[1:]}


def test_ifname_matches_follows_nccl_and_gloo_syntax() -> None:
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert ifname_matches("eth", names, nccl=True) == ["eth0", "eth1"]
    assert ifname_matches("=eth0", names, nccl=True) == ["eth0"]
    assert ifname_matches("^docker,lo", names, nccl=True) == ["eth0", "eth1", "ib0"]
    assert ifname_matches("eth", names, nccl=False) == []
    assert ifname_matches("eth1,ib0", names, nccl=False) == ["eth1", "ib0"]


def test_launch_dialog_text_marks_warnings() -> None:
    from console.training.launch import Check
    from screens.training import plan_text

    text = plan_text(None, [Check("hostname", True, "vm resolves to 127.0.0.1", "n1",
                                  warning=True), Check("peer ports", False, "dropped", "n2"),
                            Check("interface", True, "eth0", "n1")]).plain
    assert text.splitlines()[1:] == ["  warn hostname: n1: vm resolves to 127.0.0.1",
                                     "  FAIL peer ports: n2: dropped", "  ok   interface: n1: eth0"]


def test_netns_master_port_rejected_is_told_from_dropped(netns_cluster: NetnsCluster,
                                                         profile_file, capsys) -> None:
    netns_cluster.firewall(0, "table inet svconsole {\n chain input {\n"
                              "  type filter hook input priority 0; policy accept;\n"
                              f"  tcp dport {MASTER_PORT} reject with tcp reset\n" " }\n}")
    code, reply = dry_run(netns_cluster, profile_file, capsys)
    failed = failures(reply)
    nodes = netns_cluster.nodes
    assert code == 1 and set(failed) == {("master port reachable", n) for n in nodes[1:]}
    assert "connection refused although the check listens on port" in \
        failed[("master port reachable", nodes[1])]
    assert "timed out" not in failed[("master port reachable", nodes[1])]


def test_wrong_master_address_is_told_apart() -> None:
    """A worker whose master_addr resolves to an address the master does not have (a stale
    /etc/hosts entry): the check says so, whatever the connection did there."""
    from console.training.preflight import Target, _master_port_checks

    target = Target("m", "master.example", MASTER_PORT, {"m": "master.example", "w": "w"},
                    {"m": {}, "w": {}})
    up = {"m": {"ports": {str(MASTER_PORT): MASTER_PORT, "0": 40000}, "busy": {},
                "facts": {"interfaces": {"lo": ["127.0.0.1"], "eth0": ["10.1.0.1"]},
                          "master_resolves": ["10.1.0.1"]}}}
    results = {"w": {"probes": [{"id": "master", "host": "master.example", "port": MASTER_PORT,
                                 "resolved": "10.1.0.9", "result": "refused",
                                 "error": "Connection refused"}]}}
    (check,) = _master_port_checks(target, ["m", "w"], up, results)
    assert (check.ok, check.node) == (False, "w")
    assert check.message.startswith("wrong address: master_addr master.example resolves to "
                                    "10.1.0.9 on w, which is not an address of m (it has "
                                    "10.1.0.1, 127.0.0.1)")
