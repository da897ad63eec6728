"""Host-key checking of the pool against real sshd nodes, checked with OpenSSH's own tools."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from pathlib import Path

import paramiko

from console.cluster.model import Cluster, load_cluster
from console.ssh.hostkeys import KnownHosts, fingerprint, host_id
from console.ssh.loopback import LoopbackCluster
from console.ssh.pool import NodeState, NodeStatus, Pool


def cluster_of(lb: LoopbackCluster, known_hosts: Path, policy: str) -> Cluster:
    cluster = load_cluster(lb.cluster_yaml)
    ssh = dataclasses.replace(cluster.ssh, known_hosts=str(known_hosts), host_key_policy=policy)
    return dataclasses.replace(cluster, ssh=ssh)


def openssh_fingerprint(pub: Path) -> str:
    """``ssh-keygen -lf``: '256 SHA256:... comment (ED25519)' -> 'SHA256:...'."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                         check=True, timeout=10)
    return out.stdout.split()[1]


def host_pub(lb: LoopbackCluster, i: int, original: bool = False) -> Path:
    key = lb.node(i).original_host_key if original else lb.node(i).host_key
    return key.with_name(key.name + ".pub")


def test_fingerprint_and_host_id_match_openssh(loopback) -> None:
    pub = host_pub(loopback, 0)
    key = paramiko.PKey.from_path(loopback.node(0).host_key)
    assert fingerprint(key) == openssh_fingerprint(pub)
    assert host_id("10.0.0.1", 22) == "10.0.0.1"
    assert host_id("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_strict_refuses_an_unknown_key(loopback, tmp_path) -> None:
    own = tmp_path / "known_hosts"  # empty: no node is known
    with Pool(cluster_of(loopback, own, "strict")) as pool:
        r = pool.run("node1", "true")
        status = pool.status("node1")
    assert r.exit is None and r.error is not None
    assert status.state == NodeState.HOSTKEY_UNKNOWN
    assert openssh_fingerprint(host_pub(loopback, 1)) in status.reason
    assert openssh_fingerprint(host_pub(loopback, 1)) in r.error
    assert not own.exists()  # strict never writes


def test_accept_new_records_hashed_then_accepts_silently(loopback, tmp_path, caplog) -> None:
    own = tmp_path / "config" / "svconsole" / "known_hosts"  # neither file nor directory exists
    seen: list[NodeStatus] = []
    caplog.set_level(logging.WARNING, logger="console.ssh.hostkeys")
    with Pool(cluster_of(loopback, own, "accept-new")) as pool:
        pool.subscribe(seen.append)
        results = pool.run_all("echo ok")
    assert all(r.ok for r in results.values())
    assert own.stat().st_mode & 0o777 == 0o600
    lines = own.read_text().splitlines()
    assert len(lines) == loopback.n
    assert all(line.startswith("|1|") for line in lines)
    assert "127.0.1." not in own.read_text()  # hashed: no host names in clear
    for i in range(loopback.n):
        fp = openssh_fingerprint(host_pub(loopback, i))
        assert any(s.node == f"node{i}" and fp in s.reason for s in seen)  # shown to subscribers
        assert fp in caplog.text  # and logged
        # OpenSSH itself finds the hashed entry under [host]:port
        name = host_id(loopback.node(i).address, loopback.node(i).port)
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(own)], capture_output=True,
                               text=True, timeout=10)
        assert found.returncode == 0 and "Host " in found.stdout
    # the system ssh client trusts the file svconsole wrote, strictly
    argv = loopback.ssh_argv(3, "echo via-openssh")
    argv[argv.index(f"UserKnownHostsFile={loopback.known_hosts}")] = f"UserKnownHostsFile={own}"
    assert subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.endswith(
        "via-openssh\n")
    # a second pool, strict this time, accepts the recorded keys without a word
    seen.clear()
    before = own.read_text()
    with Pool(cluster_of(loopback, own, "strict")) as pool:
        pool.subscribe(seen.append)
        assert all(r.ok for r in pool.run_all("true").values())
    assert own.read_text() == before
    assert all(s.reason == "" for s in seen)


def test_changed_key_is_refused_with_both_fingerprints(loopback, tmp_path) -> None:
    own = tmp_path / "known_hosts"
    own.write_text(loopback.known_hosts.read_text())  # the keys the nodes were born with
    loopback.change_host_key(2)
    expected = openssh_fingerprint(host_pub(loopback, 2, original=True))
    offered = openssh_fingerprint(host_pub(loopback, 2))
    assert expected != offered
    for policy in ("accept-new", "strict"):  # refused whatever the policy
        with Pool(cluster_of(loopback, own, policy)) as pool:
            results = pool.run_all("true")
            status = pool.status("node2")
        assert status.state == NodeState.HOSTKEY_CHANGED
        assert f"expected ssh-ed25519 {expected}" in status.reason
        assert f"offered ssh-ed25519 {offered}" in status.reason
        assert results["node2"].error == status.reason
        assert all(results[n].ok for n in loopback.nodes if n != "node2")
    assert own.read_text() == loopback.known_hosts.read_text()  # nothing replaced or added


def test_system_files_are_read_only_and_trusted(loopback, tmp_path) -> None:
    """A key found in a system file (here: the harness's known_hosts in that role) is trusted,
    and svconsole's own file stays empty."""
    own = tmp_path / "own_known_hosts"
    store = KnownHosts(own, "strict", system_paths=[loopback.known_hosts])
    node = loopback.node(1)
    keys = store.known(host_id(node.address, node.port))
    assert list(keys) == ["ssh-ed25519"]
    assert fingerprint(keys["ssh-ed25519"]) == openssh_fingerprint(host_pub(loopback, 1))
    assert store.known(node.address) == {}  # [host]:port and host are different entries
    assert not own.exists()
