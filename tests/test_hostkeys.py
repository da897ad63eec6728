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


def pub_line(lb: LoopbackCluster, i: int) -> str:
    """``ssh-ed25519 AAAA...`` of node i's current host key."""
    return " ".join(host_pub(lb, i).read_text().split()[:2])


def test_known_hosts_written_by_openssh_is_accepted(loopback, tmp_path) -> None:
    """ssh itself records node1 (hashed) and node2 (plain) on first use; svconsole, strict, trusts
    exactly those and refuses the node ssh never saw."""
    own = tmp_path / "written_by_ssh"
    for i, hashed in ((1, "yes"), (2, "no")):
        argv = loopback.ssh_argv(i, "true")
        argv[argv.index(f"UserKnownHostsFile={loopback.known_hosts}")] = f"UserKnownHostsFile={own}"
        argv[argv.index("StrictHostKeyChecking=yes")] = "StrictHostKeyChecking=accept-new"
        argv[1:1] = ["-o", f"HashKnownHosts={hashed}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    text = own.read_text()
    assert text.count("|1|") == 1 and f"[127.0.1.3]:{loopback.port}" in text
    with Pool(cluster_of(loopback, own, "strict")) as pool:
        results = pool.run_all("true", nodes=["node1", "node2", "node3"])
    assert results["node1"].ok and results["node2"].ok, results
    assert "unknown host key" in (results["node3"].error or "")
    assert own.read_text() == text


def test_host_key_alias_is_the_name_both_ways(loopback, tmp_path) -> None:
    """With HostKeyAlias, svconsole records the key under the alias, and ssh -o
    StrictHostKeyChecking=yes with the same config accepts what svconsole recorded."""
    node = loopback.node(1)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu-one\n    HostName {node.address}\n    Port {node.port}\n"
                      f"    HostKeyAlias gpu-one-key\n    User {loopback.user}\n"
                      f"    IdentityFile {loopback.identity_file}\n")
    own = tmp_path / "known_hosts"
    yaml = tmp_path / "cluster.yaml"
    yaml.write_text(f"ssh:\n  config_file: {config}\n  known_hosts: {own}\n"
                    "nodes:\n  - name: one\n    host: gpu-one\n")
    with Pool(load_cluster(yaml)) as pool:
        assert pool.run("one", "true").ok
    found = subprocess.run(["ssh-keygen", "-F", "gpu-one-key", "-f", str(own)],
                           capture_output=True, text=True, timeout=10)
    assert found.returncode == 0 and pub_line(loopback, 1).split()[1] in found.stdout
    done = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes",
                           "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={own}",
                           "-o", "GlobalKnownHostsFile=/dev/null", "gpu-one", "echo alias-ok"],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout == "alias-ok\n", done.stderr


def test_revoked_key_is_refused_with_its_line(loopback, tmp_path) -> None:
    name = host_id(loopback.node(1).address, loopback.port)
    for policy in ("accept-new", "strict"):
        own = tmp_path / f"revoked-{policy}"
        own.write_text(f"# ours\n{name} {pub_line(loopback, 1)}\n@revoked * {pub_line(loopback, 1)}\n")
        before = own.read_text()
        with Pool(cluster_of(loopback, own, policy)) as pool:
            result = pool.run("node1", "true")
            status = pool.status("node1")
        assert status.state == NodeState.HOSTKEY_CHANGED, status
        assert f"host key for {name} is revoked" in status.reason
        assert f"@revoked in {own}:3" in status.reason and result.error == status.reason
        assert own.read_text() == before  # never recorded as new
    only = tmp_path / "only-revoked"
    only.write_text(f"@revoked {name} {pub_line(loopback, 1)}\n")
    with Pool(cluster_of(loopback, only, "accept-new")) as pool:
        assert f"@revoked in {only}:1" in (pool.run("node1", "true").error or "")
    assert only.read_text().count("\n") == 1


def test_cert_authority_lines_are_not_taken_for_host_keys(loopback, tmp_path) -> None:
    """A CA key (same key type as the host's) neither counts as the host's known key (which would
    read as "host key changed") nor trusts the host by itself."""
    ca = pub_line(loopback, 3)  # any other ed25519 key
    name = host_id(loopback.node(1).address, loopback.port)
    both = tmp_path / "with-ca"
    both.write_text(f"@cert-authority * {ca}\n{name} {pub_line(loopback, 1)}\n")
    with Pool(cluster_of(loopback, both, "strict")) as pool:
        assert pool.run("node1", "true").ok
    alone = tmp_path / "ca-only"
    alone.write_text(f"@cert-authority *.example.org,{name} {ca}\n")
    with Pool(cluster_of(loopback, alone, "strict")) as pool:
        pool.run("node1", "true")
        assert pool.status("node1").state == NodeState.HOSTKEY_UNKNOWN


def test_relative_paths_are_taken_from_the_cluster_yaml_directory(loopback, tmp_path,
                                                                 monkeypatch) -> None:
    """known_hosts and identity_file written relative in cluster.yaml: started from another
    directory, svconsole uses the same files, so accept-new's first-use trust is kept."""
    home = tmp_path / "cluster"
    home.mkdir()
    key = home / "keys" / "id"
    key.parent.mkdir()
    key.write_bytes(loopback.identity_file.read_bytes())
    key.chmod(0o600)
    node = loopback.node(1)
    (home / "cluster.yaml").write_text(
        f"ssh:\n  user: {loopback.user}\n  port: {node.port}\n  identity_file: keys/id\n"
        "  known_hosts: state/known_hosts\n  host_key_policy: accept-new\n"
        f"  use_ssh_config: false\nnodes:\n  - name: one\n    host: {node.address}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with Pool(load_cluster(home / "cluster.yaml")) as pool:
        assert pool.run("one", "true").ok
    recorded = (home / "state" / "known_hosts").read_text()
    assert recorded.count("\n") == 1 and not (elsewhere / "state").exists()
    monkeypatch.chdir(tmp_path)  # again from yet another directory: the same trust, nothing new
    with Pool(load_cluster(home / "cluster.yaml")) as pool:
        assert pool.run("one", "true").ok
    assert (home / "state" / "known_hosts").read_text() == recorded
