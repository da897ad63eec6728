"""~/.ssh/config as operators have it: aliases, per-host users and keys, ProxyJump through two
real sshd jump hosts (console/ssh/sshconfig.py and the pool), no mocks."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from console import cli
from console.cluster.model import ClusterConfigError, load_cluster, parse_cluster, parse_jump_host
from console.commands.check import render_connections
from console.ssh.loopback import LoopbackCluster
from console.ssh.pool import NodeState, Pool
from console.ssh.sshconfig import Resolver
from screens.node_detail import detail_text


def write_cluster(directory: Path, nodes: list[tuple[str, str]], ssh: str = "") -> Path:
    """A cluster.yaml with ``(name, host)`` nodes and extra ``ssh:`` lines."""
    text = "ssh:\n" + "".join(f"  {line}\n" for line in ssh.strip().splitlines() if line)
    text += "nodes:\n" + "".join(f"  - name: {n}\n    host: {h}\n" for n, h in nodes)
    path = directory / "cluster.yaml"
    path.write_text(text)
    return path


def resolve(tmp_path: Path, config: str, nodes: list[tuple[str, str]], ssh: str = ""):
    (tmp_path / "ssh_config").write_text(config)
    cluster = load_cluster(write_cluster(tmp_path, nodes, f"config_file: ssh_config\n{ssh}"))
    resolver = Resolver(cluster)
    return {n.name: resolver.node(n) for n in cluster.nodes}


# ----------------------------------------------------------------------------- resolution


def test_host_blocks_apply_and_cluster_yaml_wins(tmp_path: Path) -> None:
    (tmp_path / "k1").write_text("")
    (tmp_path / "k2").write_text("")
    found = resolve(tmp_path, f"""# operator's config
Host gpu*
    HostName %h.cluster.internal
    User alice
    Port 2200
    IdentityFile {tmp_path}/k1
    IdentityFile {tmp_path}/k2
    ConnectTimeout 3
Host gpu2
    User ignored-first-value-wins
Host *
    User bob
""", [("a", "gpu1"), ("b", "other")], ssh="port: 2222\nconnect_timeout: 7")
    a, b = found["a"], found["b"]
    assert (a.host, a.user, a.port) == ("gpu1.cluster.internal", "alice", 2222)  # port: yaml
    assert a.identity_files == (f"{tmp_path}/k1", f"{tmp_path}/k2")
    assert a.connect_timeout == 7
    assert a.host_key_name == "[gpu1.cluster.internal]:2222"  # HostName, not the alias
    assert a.origin("host") == "ssh_config:2 (Host gpu*)"
    assert a.origin("user") == "ssh_config:2 (Host gpu*)"
    yaml = "cluster.yaml"
    assert a.origin("port") == f"{yaml}:3 ssh.port"
    assert a.origin("connect_timeout") == f"{yaml}:4 ssh.connect_timeout"
    assert (b.host, b.user, b.origin("user")) == ("other", "bob", "ssh_config:11 (Host *)")
    assert b.origin("host") == f"{yaml}:9 nodes[1].host"
    assert b.describe() == "bob@other:2222"


def test_missing_files(tmp_path: Path, monkeypatch) -> None:
    """An IdentityFile that does not exist is skipped as ssh skips it (named when none exists);
    a config_file that cluster.yaml names and that does not exist is an error, the default one
    (~/.ssh/config) may be absent."""
    (tmp_path / "present").write_text("")
    found = resolve(tmp_path, f"Host a\n    IdentityFile {tmp_path}/gone\n"
                              f"    IdentityFile {tmp_path}/present\n"
                              f"Host b\n    IdentityFile {tmp_path}/gone\n",
                    [("a", "a"), ("b", "b")])
    assert found["a"].identity_files == (f"{tmp_path}/present",)
    assert found["b"].identity_files == (f"{tmp_path}/gone",)
    cluster = parse_cluster("ssh:\n  config_file: nowhere/config\nnodes:\n  - name: a\n"
                            "    host: h\n", path=tmp_path / "cluster.yaml")
    error = Resolver(cluster).node(cluster.nodes[0]).error
    assert error == f"cluster.yaml:2 ssh.config_file: no such file {tmp_path}/nowhere/config"
    monkeypatch.setenv("HOME", str(tmp_path / "home-without-ssh"))
    default = parse_cluster("nodes:\n  - name: a\n    host: h\n")
    assert Resolver(default).node(default.nodes[0]).error is None


def test_alias_key_name_port_and_strictness(tmp_path: Path) -> None:
    found = resolve(tmp_path, """Host a1
    HostKeyAlias gpu-a
    StrictHostKeyChecking no
Host a2
    Port 2201
    StrictHostKeyChecking yes
Host a3
    StrictHostKeyChecking accept-new
    UserKnownHostsFile /x/known /y/known
""", [("one", "a1"), ("two", "a2"), ("three", "a3")], ssh="host_key_policy: accept-new")
    assert found["one"].host_key_name == "gpu-a"
    assert found["one"].policy == "accept-new"  # "no" never weakens cluster.yaml's policy
    assert found["two"].host_key_name == "[a2]:2201" and found["two"].policy == "strict"
    assert found["three"].known_hosts == (Path("/x/known"), Path("/y/known"),
                                          Path("/etc/ssh/ssh_known_hosts"))
    strict = resolve(tmp_path, "Host *\n    StrictHostKeyChecking no\n", [("x", "h")],
                     ssh="host_key_policy: strict")
    assert strict["x"].policy == "strict"


def test_unsupported_options_are_refused_naming_the_block(tmp_path: Path) -> None:
    (tmp_path / "more.conf").write_text("Host gpu2\n    ProxyJump none\n")
    found = resolve(tmp_path, f"""Include {tmp_path}/more.conf
Host gpu1
    ProxyCommand ssh -W %h:%p bastion
Host gpu2
    ProxyCommand none
Host gpu3
    ForwardAgent yes
    ControlMaster auto
""", [("a", "gpu1"), ("b", "gpu2"), ("c", "gpu3")])
    assert found["a"].error == (
        "ssh_config:2 (Host gpu1) sets ProxyCommand, which svconsole does not support for "
        "gpu1: use ProxyJump instead")
    assert found["b"].error is None and found["c"].error is None  # off, or harmless
    assert found["b"].origin("jumps") == "default"  # the included "ProxyJump none"
    exec_ = resolve(tmp_path, "Match exec \"true\"\n    User x\n", [("a", "h")])
    assert "ssh_config:1 (Match exec \"true\"): Match exec is not supported" in exec_["a"].error


def test_use_ssh_config_false_and_fabric_reads_nothing(tmp_path: Path, monkeypatch) -> None:
    """Neither svconsole nor fabric behind its back applies ~/.ssh/config when it is off."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host h1\n    HostName 10.9.9.9\n    ProxyJump bastion\n    User mallory\n")
    monkeypatch.setenv("HOME", str(home))
    on = load_cluster(write_cluster(tmp_path, [("a", "h1")]))
    assert Resolver(on).node(on.nodes[0]).describe() == "mallory@10.9.9.9:22 via bastion"
    off = load_cluster(write_cluster(tmp_path, [("a", "h1")], "use_ssh_config: false"))
    with Pool(off) as pool:
        endpoint = pool.endpoint("a")
        assert endpoint is not None and endpoint.describe().endswith("@h1:22")
        assert pool._peers["a"].gateway is None


def test_fabric_never_applies_the_users_ssh_config(loopback, tmp_path, monkeypatch) -> None:
    """A ~/.ssh/config that would send node1 elsewhere through a jump host changes nothing when
    svconsole's reading is off (fabric's own reading made it fail: "jump host is not
    connected"), and, when on, is what svconsole applies, visibly."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    node1, node3 = loopback.node(1), loopback.node(3)
    (home / ".ssh" / "config").write_text(
        f"Host {node1.address}\n    HostName {node3.address}\n    ProxyJump nowhere.invalid\n")
    monkeypatch.setenv("HOME", str(home))
    with Pool(load_cluster(loopback.cluster_yaml)) as pool:  # loopback: use_ssh_config: false
        result = pool.run("node1", 'echo "$SSH_CONNECTION"')
        assert result.ok, result
        assert result.stdout.split()[2] == node1.address
    text = loopback.cluster_yaml.read_text().replace("use_ssh_config: false", "use_ssh_config: true")
    (tmp_path / "cluster.yaml").write_text(text)
    with Pool(load_cluster(tmp_path / "cluster.yaml")) as pool:
        endpoint = pool.endpoint("node1")
        assert endpoint is not None and endpoint.host == node3.address
        assert endpoint.describe().endswith(" via nowhere.invalid")
        assert "jump host nowhere.invalid unreachable" in (pool.run("node1", "true").error or "")


def test_ipv6_jump_hosts_parse_once_the_same_everywhere(tmp_path: Path) -> None:
    for text, host, port, user in (("[fd00::1]:2222", "fd00::1", 2222, None),
                                   ("ops@[fd00::1]", "fd00::1", 22, "ops"),
                                   ("fd00::2", "fd00::2", 22, None),
                                   ("ssh://root@10.0.0.1:2200", "10.0.0.1", 2200, "root")):
        spec = parse_jump_host(text)
        assert (spec.host, spec.port, spec.user) == (host, port, user)
        cluster = parse_cluster(f"ssh:\n  use_ssh_config: false\n  jump_host: '{text}'\n"
                                "nodes:\n  - name: a\n    host: 10.1.1.1\n")
        with Pool(cluster) as pool:
            endpoint = pool.endpoint("a")
            assert endpoint is not None
            (hop,) = endpoint.jumps
            assert (hop.host, hop.port) == (host, port)
            assert hop.address.startswith(f"{user or hop.user}@")
            if ":" in host:
                assert f"@[{host}]:{port}" in hop.address
    # a node's host goes through the same parser: brackets off, a port in it is the node's port
    cluster = parse_cluster("ssh:\n  use_ssh_config: false\nnodes:\n"
                            "  - name: a\n    host: '[fd00::1]:2222'\n"
                            "  - name: b\n    host: '[fd00::2]'\n  - name: c\n    host: fd00::3\n")
    with Pool(cluster) as pool:
        a, b, c = (pool.endpoint(n) for n in "abc")
        assert a is not None and (a.host, a.port, a.host_key_name) == ("fd00::1", 2222,
                                                                       "[fd00::1]:2222")
        assert a.describe().endswith("@[fd00::1]:2222")
        assert b is not None and (b.host, b.port, b.host_key_name) == ("fd00::2", 22, "fd00::2")
        assert c is not None and (c.host, c.port) == ("fd00::3", 22)
    for host, message in (("'[fd00::1]:22'\n    port: 23", "nodes[0].port: 23 contradicts"),
                          ("'[fd00::1'", "nodes[0].host: must be a host name or IP address")):
        with pytest.raises(ClusterConfigError, match=re.escape(message)):
            parse_cluster(f"nodes:\n  - name: a\n    host: {host}\n")
    bad = "ssh:\n  jump_host: '[fd00::1'\nnodes:\n  - name: a\n    host: h\n"
    with pytest.raises(ClusterConfigError, match=r"cluster.yaml:2:\d+: ssh.jump_host: must be"):
        parse_cluster(bad)


# ----------------------------------------------------------------------------- real sshd


def two_hop_setup(lb: LoopbackCluster, tmp_path: Path, timeout: float = 5) -> tuple[Path, Path]:
    """node0 = jump1, node1 = jump2 (behind jump1), node2/node3 = nodes behind both; node3 takes
    only its own key, named only in its Host block. Returns (cluster.yaml, own known_hosts)."""
    key2 = tmp_path / "id_node3"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key2)], check=True)
    (lb.node(3).directory / "authorized_keys").write_text((tmp_path / "id_node3.pub").read_text())
    port, user, key = lb.port, lb.user, lb.identity_file
    config = f"""Host jump1
    HostName 127.0.1.1
    User {user}
    IdentityFile {key}
Host jump2
    HostName 127.0.1.2
    User {user}
    IdentityFile {key}
    ProxyJump jump1
Host n2
    HostName 127.0.1.3
    User {user}
    IdentityFile {key}
    ProxyJump jump2
Host n3
    HostName 127.0.1.4
    User {user}
    IdentityFile {key2}
    ProxyJump jump1,jump2
Host n2-default-user
    HostName 127.0.1.3
    IdentityFile {key}
    ProxyJump jump2
Host *
    Port {port}
    User nobody-svconsole
    UserKnownHostsFile {lb.known_hosts}
    StrictHostKeyChecking yes
"""
    (tmp_path / "ssh_config").write_text(config)
    own = tmp_path / "own_known_hosts"
    path = write_cluster(tmp_path, [("n2", "n2"), ("n3", "n3"), ("n2b", "n2-default-user")],
                         f"config_file: {tmp_path / 'ssh_config'}\nknown_hosts: {own}\n"
                         f"connect_timeout: {timeout}")
    return path, own


def test_two_jump_hosts_aliases_per_host_user_and_key(fresh_loopback, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the keys the config names
    lb = fresh_loopback(4)
    path, own = two_hop_setup(lb, tmp_path)
    with Pool(load_cluster(path)) as pool:
        results = pool.run_all('echo "$SSH_CONNECTION"', nodes=["n2", "n3"], timeout=30)
        for name, i in (("n2", 2), ("n3", 3)):
            assert results[name].ok, results[name]
            assert results[name].stdout.split()[2:] == [f"127.0.1.{i + 1}", str(lb.port)]
            endpoint = pool.endpoint(name)
            assert endpoint is not None
            assert endpoint.describe() == f"{lb.user}@127.0.1.{i + 1}:{lb.port} via jump1,jump2"
        n3 = pool.endpoint("n3")
        assert n3 is not None and n3.origin("identity_file").endswith("(Host n3)")
        assert n3.origin("user") == f"{tmp_path / 'ssh_config'}:15 (Host n3)"
        # tunnelled: the nodes' transports ride on channels; one connection per jump host
        for name in ("n2", "n3"):
            assert isinstance(pool._peers[name].conn.transport.sock, paramiko.Channel)
        assert pool.connection_count("jump1") == 1 and pool.connection_count("jump2") == 1
        assert isinstance(pool._peers["jump2"].conn.transport.sock, paramiko.Channel)
        # the default User of "Host *" applies where no block before it set one
        wrong = pool.run("n2b", "true", timeout=30)
        assert pool.status("n2b").state == NodeState.AUTH_FAILED, wrong
        assert "nobody-svconsole@127.0.1.3" in (wrong.error or "")
    assert not own.exists()  # every key was found under its HostName: nothing new recorded


def test_effective_connection_is_shown_with_its_origins(fresh_loopback, tmp_path, monkeypatch,
                                                        capsys):
    """`nodes` (text and JSON), `check`'s connection list and the Nodes detail pane all show
    user@host:port via jump1,jump2 and where each value came from."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lb = fresh_loopback(4)
    path, _ = two_hop_setup(lb, tmp_path)
    via = f"{lb.user}@127.0.1.4:{lb.port} via jump1,jump2"
    block = f"{tmp_path / 'ssh_config'}:15 (Host n3)"
    assert cli.main(["--config", str(path), "nodes", "--json", "--no-facts"]) == 1  # n2b: auth
    data = json.loads(capsys.readouterr().out)
    assert data["n3"]["connection"] == via and data["n3"]["via"] == ["jump1", "jump2"]
    assert data["n3"]["origins"]["user"] == block and data["n3"]["state"] == "up"
    assert data["n3"]["origins"]["port"] == f"{tmp_path / 'ssh_config'}:24 (Host *)"
    cli.main(["--config", str(path), "nodes"])
    table = capsys.readouterr().out
    assert via in table and f"user {block}; identity {block}" in table
    cluster = load_cluster(path)
    with Pool(cluster) as pool:
        out = io.StringIO()
        render_connections(pool, cluster, out)
        assert f"n3   {via}" in out.getvalue() and f"identity {block}" in out.getvalue()
        text = detail_text(cluster.node("n3"), None, pool.status("n3"), None, [], time.time(),
                           pool.endpoint("n3")).plain
    assert f"ssh: {via}" in text and f"user: {lb.user} ({block})" in text
    assert f"via: jump1,jump2 ({tmp_path / 'ssh_config'}:15 (Host n3))" in text
    assert "defaults: connect timeout" not in text  # cluster.yaml sets it here


def test_jump_host_down_is_named_not_auth_failed(fresh_loopback, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lb = fresh_loopback(4)
    path, _ = two_hop_setup(lb, tmp_path)
    lb.kill(0)
    with Pool(load_cluster(path)) as pool:
        results = pool.run_all("true", nodes=["n2", "n3"], timeout=30)
        for name in ("n2", "n3"):
            error = results[name].error or ""
            assert "jump host jump1 unreachable" in error, error
            assert "auth" not in error, error
            assert pool.status(name).state == NodeState.DOWN
        assert pool.status("jump1").state == NodeState.DOWN
        lb.restart(0)
        assert pool.ping("n2", deadline=10).state == NodeState.UP


def test_hung_jump_host_costs_one_timeout(fresh_loopback, tmp_path, monkeypatch):
    """A SIGSTOPped bastion: the first call behind it waits connect_timeout, the next ones fail at
    once naming it; once it answers again, the nodes behind it are reached."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lb = fresh_loopback(4)
    path, _ = two_hop_setup(lb, tmp_path, timeout=2)
    lb.hang(0)
    with Pool(load_cluster(path)) as pool:
        first = pool.run("n2", "true", timeout=20)
        assert "jump host jump1 unreachable" in (first.error or ""), first
        assert first.seconds < 2 + 2, first
        for name in ("n2", "n3", "n2"):
            later = pool.run(name, "true", timeout=20)
            assert later.seconds < 0.5, later
            assert "jump host jump1 unreachable: jump1 down since" in (later.error or ""), later
        lb.resume(0)
        assert pool.ping("n3", deadline=10).state == NodeState.UP


def test_system_ssh_agrees_with_the_effective_connection(fresh_loopback, tmp_path, monkeypatch):
    """OpenSSH itself, given the same config, reaches the same node through the same hops."""
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lb = fresh_loopback(4)
    path, _ = two_hop_setup(lb, tmp_path)
    out = subprocess.run(["ssh", "-F", str(tmp_path / "ssh_config"), "-o", "BatchMode=yes",
                          "n3", 'echo "$SSH_CONNECTION"'], capture_output=True, text=True,
                         timeout=60, env={**os.environ})
    assert out.returncode == 0, out.stderr
    with Pool(load_cluster(path)) as pool:
        mine = pool.run("n3", 'echo "$SSH_CONNECTION"', timeout=30)
    assert out.stdout.split()[2:] == mine.stdout.split()[2:]
