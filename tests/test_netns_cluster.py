"""The namespace cluster itself: each node really is its own host, and nothing is left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.ssh.netns import NETNS_FILE, NetnsCluster
from tests import netns as fixtures
from tests.netns import require_namespaces

netns_cluster_session = fixtures.netns_cluster_session
netns_cluster = fixtures.netns_cluster

ROOT = Path(__file__).resolve().parents[1]


def ssh(cluster: NetnsCluster, i: int, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cluster.ssh_argv(i, command), capture_output=True, text=True, timeout=60)


def test_netns_each_node_is_its_own_host(netns_cluster: NetnsCluster) -> None:
    seen = {}
    for i in range(netns_cluster.n):
        out = ssh(netns_cluster, i, "hostname; ip -o -4 addr show; ip route; "
                                    "getent hosts $(hostname); ls /sys/class/net")
        assert out.returncode == 0, out.stderr
        seen[i] = out.stdout
        lines = out.stdout.splitlines()
        name = netns_cluster.nodes[i]
        assert lines[0] == name
        address = netns_cluster.node(i).address
        assert f"inet {address}/24" in out.stdout
        assert "default" not in out.stdout  # nothing routes out
        assert re.search(rf"^{re.escape(address)}\s+{name}$", out.stdout, re.M)  # its /etc/hosts
        assert sorted(lines[-2:]) == ["eth0", "lo"]  # its own /sys shows its own interfaces
    assert len({s.splitlines()[0] for s in seen.values()}) == netns_cluster.n
    no_route = netns_cluster.exec(1, "ip route get 192.0.2.1")
    assert no_route.returncode != 0 and "unreachable" in no_route.stderr
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != netns_cluster.nodes[0]


def test_netns_firewall_and_private_mount_are_per_node(netns_cluster: NetnsCluster,
                                                       tmp_path: Path) -> None:
    listen = ("import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,"
              "socket.SO_REUSEADDR,1); s.bind(('0.0.0.0',29511)); s.listen(); print('up',"
              "flush=True); time.sleep(30)")
    server = subprocess.Popen(netns_cluster.enter_argv(0, [sys.executable, "-c", listen]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        probe = (f"{sys.executable} -c \"import socket; socket.create_connection(("
                 f"'{netns_cluster.node(0).address}', 29511), timeout=3); print('ok')\"")
        assert netns_cluster.exec(1, probe).stdout.strip() == "ok"
        netns_cluster.drop_port(0, 29511)
        dropped = netns_cluster.exec(1, probe)
        assert "timed out" in dropped.stderr
        assert ssh(netns_cluster, 0, "true").returncode == 0  # ssh still passes
    finally:
        server.kill()
        server.wait()
    shared = netns_cluster.shared_dir / "out"
    shared.mkdir(exist_ok=True)
    (shared / "token").write_text("shared")
    netns_cluster.private_mount(2, shared)
    assert netns_cluster.exec(2, f"ls -A {shared}").stdout == ""
    assert netns_cluster.exec(1, f"cat {shared}/token").stdout == "shared"
    assert (shared / "token").read_text() == "shared"  # the console's view is untouched


def test_netns_down_from_state_dir_after_owner_killed(tmp_path: Path) -> None:
    """A process that made a cluster dies by SIGKILL; ``down`` from the state directory alone
    removes every namespace, link and process it made."""
    require_namespaces()
    directory = tmp_path / "crash"
    code = ("import sys, time; from console.ssh.netns import NetnsCluster; "
            f"c = NetnsCluster({str(directory)!r}, 2).up(); print('up', flush=True); "
            "time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "up"
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    state = json.loads((directory / NETNS_FILE).read_text())
    assert all(Path(f"/run/netns/{n}").exists() for n in state["netns"])
    holders = [pid for pid, _ in state["holders"].values()]
    sshd = [n["pid"] for n in json.loads((directory / "state.json").read_text())["nodes"]]
    assert len(holders) == len(sshd) == 2 and all(sshd)
    down = subprocess.run([str(ROOT / "scripts" / "netns-cluster"), "down", str(directory)],
                          capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(Path(f"/run/netns/{n}").exists() for n in state["netns"])
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert state["bridge"] not in links and not any(v in links for v in state["veths"])
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in holders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{p}").exists() for p in holders)
    assert not any(Path(f"/proc/{p}").exists() for p in sshd)


def test_netns_script_commands(netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    """scripts/netns-cluster exec, firewall (a ruleset file), private-mount, unmount, status."""
    script = str(ROOT / "scripts" / "netns-cluster")
    d = str(netns_cluster.directory)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)

    out = run("exec", d, "1", "hostname; ip -o -4 addr show eth0")
    assert out.returncode == 0 and out.stdout.splitlines()[0] == netns_cluster.nodes[1]
    assert f"inet {netns_cluster.node(1).address}/24" in out.stdout
    assert run("exec", d, "2", "exit 3").returncode == 3
    rules = tmp_path / "rules.nft"
    rules.write_text("table inet t {\n chain input {\n  type filter hook input priority 0;\n"
                     "  tcp dport 29999 drop\n }\n}\n")
    assert run("firewall", d, "0", str(rules)).returncode == 0
    assert "tcp dport 29999 drop" in netns_cluster.exec(0, "nft list ruleset").stdout
    assert netns_cluster.exec(1, "nft list ruleset").stdout.strip() == ""  # node 0's only
    bad = run("firewall", d, "0", "table inet t { nonsense }")
    assert bad.returncode == 1 and "netns-cluster: node0: nft refused the ruleset" in bad.stderr
    target = netns_cluster.shared_dir / "cli-private"
    target.mkdir(exist_ok=True)
    (target / "seen-by-all").write_text("x")
    made = run("private-mount", d, "1", str(target))
    assert made.returncode == 0, made.stderr
    assert netns_cluster.exec(1, f"ls -A {target}").stdout == ""
    assert run("unmount", d, "1", str(target)).returncode == 0
    assert netns_cluster.exec(1, f"ls -A {target}").stdout.strip() == "seen-by-all"
    status = run("status", d)
    assert status.returncode == 0 and status.stdout.count("answers=True") == netns_cluster.n


def test_netns_tests_fail_under_ci_and_skip_elsewhere(monkeypatch) -> None:
    """No namespaces: CI=true fails the netns tests (they must prove what they prove there),
    elsewhere they are skipped with the reason."""
    monkeypatch.setattr(fixtures, "namespaces_unavailable", lambda: "no netns here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but the namespace cluster cannot "
                                                    "be made: no netns here"):
        fixtures.require_namespaces()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="namespace cluster unavailable: no netns"):
        fixtures.require_namespaces()
