"""A cluster of nodes that each live in their own Linux namespaces, with a real sshd in each.

The loopback cluster (:mod:`console.ssh.loopback`) is one host: its nodes share one hostname,
one network stack, one firewall and one set of mounts, so the failures that really stop a
multi-node training run cannot happen on it. Here node *i* (0-based) has

- its own **network namespace** (``ip netns``) with one interface, ``eth0``, the end of a veth
  pair whose other end is on a bridge in the root namespace, and the address ``SUBNET.(i+1)/24``;
- its own **UTS namespace** (its hostname is its node name, ``node<i>``) and its own **mount
  namespace** (private propagation), where ``/etc/hosts`` is a bind mount of
  ``DIR/node<i>/hosts`` and ``/sys`` shows the node's own interfaces;
- a real OpenSSH ``sshd`` on ``SUBNET.(i+1):22``, configured exactly as a loopback node's (the
  config, keys, known_hosts and cluster.yaml come from :class:`LoopbackCluster`);
- its own nftables ruleset (:meth:`NetnsCluster.firewall`) and its own mounts
  (:meth:`NetnsCluster.private_mount`).

The console stays in the root namespace, at ``SUBNET.254`` on the bridge. The subnet is
``10.213.0.0/24`` by default, or the next free ``10.213.X.0/24`` when another cluster holds it;
no address outside it is used. **Nothing routes out**: the nodes have no default route (only the
bridge's /24 is reachable), and no forwarding or NAT is set up anywhere. The nodes share this
machine's filesystem, so the repository's ``.venv`` is the training Python on every node and
``DIR/shared`` is the cluster's shared storage. Needs root::

    scripts/netns-cluster up 3 /tmp/nc
    svconsole --config /tmp/nc/cluster.yaml
    scripts/netns-cluster exec /tmp/nc 1 'hostname; ip -brief addr'
    scripts/netns-cluster firewall /tmp/nc 0 'table inet f { chain input { type filter hook
        input priority 0; tcp dport 29500 drop; } }'
    scripts/netns-cluster private-mount /tmp/nc 2 /tmp/nc/shared/out
    scripts/netns-cluster down /tmp/nc

Every namespace, link and process it makes is named in ``DIR/netns.json`` *before* it is made,
so ``down`` removes them from the state directory alone, also after the console or ``up``
crashed: it kills every process left in the nodes' network namespaces (``ip netns pids``),
deletes the namespaces (their veth ends go with them) and the bridge.

Layout (besides the loopback cluster's files)::

    DIR/netns.json                  names of the namespaces, links and holder processes
    DIR/sshd-in-node                runs sshd inside the namespaces of the node whose config it gets
    DIR/node<i>/hosts               the node's /etc/hosts
    DIR/node<i>/private/            what private-mount puts over a path on that node only
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from console.ssh.loopback import (
    LoopbackCluster,
    LoopbackError,
    LoopbackNode,
    _alive,
    _cmdline,
    _stat,
    _write,
    find_sshd,
)

NETNS_FILE = "netns.json"
DEFAULT_SUBNET_PREFIX = "10.213"
"""Subnets are ``10.213.X.0/24``, X = 0 first."""
CONSOLE_HOST = 254
"""The console's (root namespace's) address on the bridge: ``SUBNET.254``."""
SSH_PORT = 22
MASTER_PORT = 29500
IFNAME = "eth0"
"""The node's one interface (its veth end), as on a real machine."""


class NetnsError(LoopbackError):
    """The namespace cluster could not be set up or controlled; the message says what to do."""


def _ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise :class:`NetnsError` with its stderr when it fails (``check``)."""
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise NetnsError("no 'ip' command: install iproute2 (apt-get install iproute2)") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or 'exit ' + str(proc.returncode)}")
    return proc


def namespaces_unavailable() -> str | None:
    """Why this machine cannot run a namespace cluster (None when it can): not root, a tool
    missing, or the kernel refusing network namespaces, veth pairs or bridges (checked by making
    and removing a throwaway namespace and link)."""
    if os.getuid() != 0:
        return "the namespace cluster needs root (network namespaces, veth, bridge, nftables)"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux"),
                          ("nft", "nftables")):
        if not any(os.access(os.path.join(d, tool), os.X_OK)
                   for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
            return f"no {tool!r} command: apt-get install {package}"
    if find_sshd() is None:
        return "no sshd binary: apt-get install openssh-server"
    probe = f"svnprobe{os.getpid() % 100000}"
    try:
        for args in (("netns", "add", probe), ("link", "add", f"{probe}a", "type", "veth",
                                                "peer", "name", f"{probe}b"),
                     ("link", "add", f"{probe}c", "type", "bridge")):
            made = _ip(*args, check=False)
            if made.returncode != 0:
                return f"ip {' '.join(args)} failed: {made.stderr.strip()}"
    except NetnsError as exc:
        return str(exc)
    finally:
        for args in (("link", "del", f"{probe}a"), ("link", "del", f"{probe}c"),
                     ("netns", "del", probe)):
            with contextlib.suppress(NetnsError, OSError, subprocess.SubprocessError):
                _ip(*args, check=False)
    return None


def _used_subnets() -> set[str]:
    """The ``10.213.X`` prefixes that an address or route of the root namespace already uses."""
    text = _ip("-4", "-o", "addr", "show", check=False).stdout
    text += _ip("-4", "route", "show", check=False).stdout
    return set(re.findall(rf"\b({re.escape(DEFAULT_SUBNET_PREFIX)}\.\d+)\.\d+", text))


def pick_subnet() -> str:
    """The first ``10.213.X`` (X = 0..255) that no address or route here uses."""
    used = _used_subnets()
    for x in range(256):
        prefix = f"{DEFAULT_SUBNET_PREFIX}.{x}"
        if prefix not in used:
            return prefix
    raise NetnsError(f"every subnet {DEFAULT_SUBNET_PREFIX}.X.0/24 is in use here")


def _tag(directory: Path) -> str:
    """A short name part unique to the cluster's directory (interface names have 15 chars)."""
    return hashlib.sha1(str(directory).encode()).hexdigest()[:5]


@dataclass(frozen=True)
class NodeNamespaces:
    """The names of what one node is made of."""

    index: int
    netns: str
    """``ip netns`` name (``/run/netns/<netns>``)."""
    veth: str
    """The root namespace's end of the node's veth pair (on the bridge)."""
    address: str


def _pids_in_netns(name: str) -> list[int]:
    out = _ip("netns", "pids", name, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()] if out.returncode == 0 else []


def _kill_netns_processes(name: str, timeout: float = 10) -> None:
    """SIGSTOP then SIGKILL every process in the network namespace until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in _pids_in_netns(name) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} in network namespace {name} do not die")
        time.sleep(0.05)


class NetnsCluster(LoopbackCluster):
    """N nodes in their own network, UTS and mount namespaces, each with a real sshd; the
    console on the bridge in the root namespace. Controlled from Python or from
    ``scripts/netns-cluster`` (another process finds it through ``DIR/netns.json`` and the
    loopback cluster's ``DIR/state.json``).

    ``subnet``: the first three octets of the /24 (default: :func:`pick_subnet`). ``guard``:
    a watchdog process takes the whole cluster down when this process dies (the test fixture's
    protection against a killed test run). ``prefix``: nodes are ``<prefix>0`` .. (also their
    hostnames); the nodes share this machine's ``/proc``, where runs are told apart by node name,
    so a cluster that runs beside loopback clusters (``node0`` ..) takes another prefix."""

    GUARD_MODULE = "console.ssh.netns"

    def __init__(self, directory: str | os.PathLike[str], n: int, subnet: str | None = None, *,
                 prefix: str = "node", guard: bool = False, start_timeout: float = 30.0) -> None:
        super().__init__(directory, n, base_port=SSH_PORT, user="root", guard=guard,
                         start_timeout=start_timeout)
        if subnet is not None:
            net = ipaddress.ip_network(f"{subnet}.0/24")
            if not net.subnet_of(ipaddress.ip_network("10.0.0.0/8")):
                raise NetnsError(f"subnet {subnet}.0/24 is not inside 10.0.0.0/8")
        if n > CONSOLE_HOST - 1:
            raise NetnsError(f"a namespace cluster has at most {CONSOLE_HOST - 1} nodes")
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,20}", prefix):
            raise NetnsError(f"node name prefix {prefix!r}: lowercase letters, digits and '-'")
        self.prefix = prefix
        self.subnet = subnet
        self.tag = _tag(self.directory)
        self.master_port = MASTER_PORT
        self._holders: dict[int, tuple[int, int]] = {}  # index -> (pid, start time)

    # -- names --------------------------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"svn{self.tag}br"

    @property
    def console_address(self) -> str:
        return f"{self.subnet}.{CONSOLE_HOST}"

    @property
    def netns_file(self) -> Path:
        return self.directory / NETNS_FILE

    @property
    def sshd_wrapper(self) -> Path:
        return self.directory / "sshd-in-node"

    @property
    def nodes(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.n)]

    def namespaces(self, i: int) -> NodeNamespaces:
        return NodeNamespaces(i, f"svn{self.tag}-node{i}", f"svn{self.tag}-{i}",
                              f"{self.subnet}.{i + 1}")

    def node(self, which: int | str) -> LoopbackNode:
        i = self.nodes.index(which) if isinstance(which, str) else which
        if not 0 <= i < self.n:
            raise NetnsError(f"no node {which!r} in a cluster of {self.n}")
        return LoopbackNode(i, self.nodes[i], f"{self.subnet}.{i + 1}", SSH_PORT,
                            self.directory / f"node{i}", False)

    def hosts_file(self, i: int) -> Path:
        return self.node(i).directory / "hosts"

    def holder(self, i: int) -> int:
        """Pid of the process that holds node i's UTS and mount namespaces (and is in its
        network namespace); commands enter the node through it."""
        entry = self._holders.get(i)
        if not entry or not _alive(*entry):
            raise NetnsError(f"node{i} of {self.directory} is not up (no namespace holder)")
        return entry[0]

    # -- state --------------------------------------------------------------------------------

    def _save_netns(self) -> None:
        state = {"n": self.n, "subnet": self.subnet, "prefix": self.prefix, "tag": self.tag,
                 "bridge": self.bridge,
                 "netns": [self.namespaces(i).netns for i in range(self.n)],
                 "veths": [self.namespaces(i).veth for i in range(self.n)],
                 "holders": {str(i): list(v) for i, v in self._holders.items()}}
        _write(self.netns_file, json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> NetnsCluster:
        """The cluster that ``up`` made in ``directory`` (possibly from another process that
        has since died); works from ``netns.json`` alone when ``state.json`` is missing."""
        path = Path(directory) / NETNS_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise NetnsError(f"{path}: no namespace cluster state here ({exc})") from None
        cluster = cls(directory, state["n"], state["subnet"], prefix=state.get("prefix", "node"))
        cluster._holders = {int(i): (v[0], v[1]) for i, v in state.get("holders", {}).items()}
        with contextlib.suppress(LoopbackError, KeyError, TypeError, ValueError):
            sshd = LoopbackCluster.load(directory)
            cluster._sshd, cluster._states = sshd._sshd, sshd._states
            cluster._pids = sshd._pids
            guard = json.loads(cluster.state_file.read_text()).get("guard")
            if guard and cluster._is_guard(*guard):
                cluster._guard = (guard[0], guard[1])
        return cluster

    # -- making the nodes ---------------------------------------------------------------------

    def up(self) -> NetnsCluster:
        """Make every node's namespaces and link, start its sshd and wait until each answers.
        What a previous ``up`` left in the directory (also after a crash) is removed first."""
        reason = namespaces_unavailable()
        if reason:
            raise NetnsError(reason)
        if self.netns_file.exists():
            with contextlib.suppress(NetnsError, KeyError, TypeError, ValueError):
                NetnsCluster.load(self.directory).down()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.subnet = self.subnet or pick_subnet()
        self._save_netns()  # every name is on disk before anything is made
        try:
            self._make_network()
            for i in range(self.n):
                self._start_holder(i)
            self._sshd = str(self.sshd_wrapper)
            self._write_wrapper()
            super().up()
            self._rename_cluster()
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        return self

    def _make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.console_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            ns = self.namespaces(i)
            _ip("netns", "add", ns.netns)
            _ip("link", "add", ns.veth, "type", "veth", "peer", "name", f"{ns.veth}p")
            _ip("link", "set", f"{ns.veth}p", "netns", ns.netns)
            _ip("link", "set", ns.veth, "master", self.bridge)
            _ip("link", "set", ns.veth, "up")
            _ip("-n", ns.netns, "link", "set", f"{ns.veth}p", "name", IFNAME)
            _ip("-n", ns.netns, "addr", "add", f"{ns.address}/24", "dev", IFNAME)
            _ip("-n", ns.netns, "link", "set", IFNAME, "up")
            _ip("-n", ns.netns, "link", "set", "lo", "up")

    def _hosts_text(self, i: int) -> str:
        lines = [f"# /etc/hosts of {self.nodes[i]} in the svconsole namespace cluster {self.directory}",
                 "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{self.subnet}.{j + 1}\t{self.nodes[j]}" for j in range(self.n)]
        return "\n".join(lines) + "\n"

    def set_hosts(self, i: int, text: str) -> None:
        """Replace node i's /etc/hosts. Written in place: the bind mount holds the file's inode."""
        with open(self.hosts_file(i), "r+" if self.hosts_file(i).exists() else "w") as f:
            f.write(text)
            f.truncate()

    def reset_hosts(self, i: int) -> None:
        """Node i's /etc/hosts as ``up`` wrote it (every node's name at its bridge address)."""
        self.set_hosts(i, self._hosts_text(i))

    def _start_holder(self, i: int) -> None:
        """Start the process that makes and holds node i's UTS and mount namespaces inside its
        network namespace: hostname, /etc/hosts bind mount, its own /sys; then it sleeps."""
        ns, node = self.namespaces(i), self.node(i)
        node.directory.mkdir(parents=True, exist_ok=True)
        (node.directory / "private").mkdir(exist_ok=True)
        self.reset_hosts(i)
        ready = node.directory / "holder.ready"
        ready.unlink(missing_ok=True)
        script = (f"set -e; hostname {node.name}; "
                  f"mount --bind {shlex.quote(str(self.hosts_file(i)))} /etc/hosts; "
                  "umount -l /sys; mount -t sysfs sysfs /sys; "
                  f": > {shlex.quote(str(ready))}; exec sleep infinity")
        with open(node.directory / "holder.log", "ab") as log:
            proc = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{ns.netns}", "unshare", "--mount", "--uts",
                 "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        st = _stat(proc.pid)
        self._holders[i] = (proc.pid, st[2] if st else 0)
        self._save_netns()
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if proc.poll() is not None:
                raise NetnsError(f"node{i}: making its namespaces failed (exit {proc.returncode});"
                                 f" {node.directory / 'holder.log'}:\n"
                                 + (node.directory / "holder.log").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise NetnsError(f"node{i}: its namespaces were not ready in "
                                 f"{self.start_timeout:g} s")
            time.sleep(0.02)
        st = _stat(proc.pid)  # sh exec'd sleep: same pid, same start time
        self._holders[i] = (proc.pid, st[2] if st else 0)
        self._save_netns()

    def _write_wrapper(self) -> None:
        """The "sshd" that the loopback machinery starts: sshd itself, inside the namespaces of
        the node whose ``-f DIR/node<i>/sshd_config`` it is given."""
        sshd = find_sshd()
        _write(self.sshd_wrapper,
               "#!/bin/sh\n# sshd inside the namespaces of the node whose sshd_config it gets\n"
               'cfg=""; prev=""\n'
               'for a in "$@"; do [ "$prev" = -f ] && cfg="$a"; prev="$a"; done\n'
               f'[ -n "$cfg" ] || exec {sshd} "$@"\n'
               'pid=$(cat "$(dirname "$cfg")/holder.pid")\n'
               f'exec nsenter -t "$pid" -n -u -m -- {sshd} "$@"\n', mode=0o755)
        for i, (pid, _) in self._holders.items():
            _write(self.node(i).directory / "holder.pid", f"{pid}\n")

    def _rename_cluster(self) -> None:
        """cluster.yaml as the loopback machinery wrote it, named and described for this one."""
        text = self.cluster_yaml.read_text()
        header = (f"# svconsole namespace cluster: {self.n} nodes in their own namespaces on "
                  f"{self.subnet}.0/24 (bridge {self.bridge}).\n"
                  f"# Start: scripts/netns-cluster up {self.n} {self.directory}\n"
                  f"# Stop:  scripts/netns-cluster down {self.directory}\n")
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        body = body.replace("  name: loopback\n", f"  name: netns-{self.tag}\n", 1)
        body = body.replace("  master: node0\n", f"  master: {self.nodes[0]}\n", 1)
        _write(self.cluster_yaml, header + body + "\n")

    # -- taking it down -----------------------------------------------------------------------

    def down(self) -> None:
        """Kill every process in the nodes' namespaces, delete the namespaces, their links and
        the bridge. Works from ``netns.json`` alone; safe to call twice."""
        with contextlib.suppress(LoopbackError, OSError):
            super().down()
        try:
            state = json.loads(self.netns_file.read_text())
        except (OSError, ValueError):
            state = {"netns": [self.namespaces(i).netns for i in range(self.n)],
                     "veths": [self.namespaces(i).veth for i in range(self.n)],
                     "bridge": self.bridge, "holders": {}}
        problems = []
        for name in state.get("netns", []):
            if Path(f"/run/netns/{name}").exists():
                try:
                    _kill_netns_processes(name)
                    _ip("netns", "del", name)
                except NetnsError as exc:
                    problems.append(str(exc))
        for pid, start in state.get("holders", {}).values():
            if _alive(pid, start) and "sleep" in " ".join(_cmdline(pid)):
                os.kill(pid, signal.SIGKILL)
        links = _ip("-o", "link", "show", check=False).stdout
        for link in [*state.get("veths", []), state.get("bridge")]:
            if link and re.search(rf"^\d+: {re.escape(link)}[@:]", links, re.M):
                with contextlib.suppress(NetnsError):
                    _ip("link", "del", link)
        self._holders.clear()
        if self.netns_file.parent.exists():
            state["holders"] = {}
            _write(self.netns_file, json.dumps(state, indent=2) + "\n")
        if problems:
            raise NetnsError("; ".join(problems))

    # -- what a node does ---------------------------------------------------------------------

    def enter_argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` inside node i's network, UTS and mount namespaces."""
        return ["nsenter", "-t", str(self.holder(i)), "-n", "-u", "-m", "--", *argv]

    def exec(self, i: int, command: str, *, timeout: float = 60,
             check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a shell command inside node i (as root, no SSH) and collect its output."""
        proc = subprocess.run(self.enter_argv(i, ["sh", "-c", command]), capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NetnsError(f"node{i}: {command!r} exited {proc.returncode}: "
                             f"{proc.stderr.strip()}")
        return proc

    def firewall(self, i: int, ruleset: str) -> None:
        """Replace node i's whole nftables ruleset with ``ruleset`` (nft syntax; empty: none)."""
        proc = subprocess.run(self.enter_argv(i, ["nft", "-f", "-"]),
                              input="flush ruleset\n" + ruleset + "\n", capture_output=True,
                              text=True, timeout=30)
        if proc.returncode != 0:
            raise NetnsError(f"node{i}: nft refused the ruleset: {proc.stderr.strip()}")

    def open_only(self, i: int, ports: Iterable[int]) -> None:
        """Firewall node i so that it accepts new TCP connections on ``ports`` only (replies,
        loopback and ICMP pass; everything else is dropped), like a host with only ssh open."""
        allowed = ", ".join(str(p) for p in sorted(set(ports)))
        self.firewall(i, "table inet svconsole {\n chain input {\n"
                         "  type filter hook input priority 0; policy drop;\n"
                         "  ct state established,related accept\n  iifname lo accept\n"
                         "  meta l4proto { icmp, ipv6-icmp } accept\n"
                         f"  tcp dport {{ {allowed} }} accept\n }}\n}}")

    def drop_port(self, i: int, port: int) -> None:
        """Firewall node i so that it silently drops new TCP connections to ``port``."""
        self.firewall(i, "table inet svconsole {\n chain input {\n"
                         "  type filter hook input priority 0; policy accept;\n"
                         f"  tcp dport {port} drop\n }}\n}}")

    def private_mount(self, i: int, path: str | os.PathLike[str]) -> Path:
        """Mount an empty directory of node i's own over ``path``, on node i only: the node
        then sees another directory there than every other node. Returns the directory."""
        target = Path(path).resolve()
        private = self.node(i).directory / "private" / str(target).strip("/").replace("/", "_")
        private.mkdir(parents=True, exist_ok=True)
        self.exec(i, f"mkdir -p {shlex.quote(str(target))} && mount --bind "
                     f"{shlex.quote(str(private))} {shlex.quote(str(target))}", check=True)
        return private

    def unmount(self, i: int, path: str | os.PathLike[str]) -> None:
        """Undo :meth:`private_mount` of ``path`` on node i."""
        self.exec(i, f"umount {shlex.quote(str(Path(path).resolve()))}", check=True)

    def reset(self, i: int) -> None:
        """Node i as ``up`` left it: no firewall, no extra mount, its /etc/hosts, sshd up."""
        self.firewall(i, "")
        mounts = self.exec(i, "cat /proc/self/mountinfo").stdout
        private = str(self.node(i).directory / "private") + "/"
        for line in mounts.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[3].startswith(private):
                self.exec(i, f"umount -l {shlex.quote(fields[4])}")
        self.reset_hosts(i)
        super().reset(i)


def _guard(directory: Path, owner: int, owner_start_time: int) -> int:
    """The watchdog behind ``guard=True``: wait until the owner is gone, then take it all down."""
    while _alive(owner, owner_start_time):
        time.sleep(0.5)
    cluster = NetnsCluster.load(directory)
    cluster._guard = None  # do not kill ourselves
    cluster.down()
    return 0


# ---------------------------------------------------------------------------------------------
# Command line: scripts/netns-cluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="netns-cluster",
        description="N nodes in their own network, UTS and mount namespaces, each with a real "
                    f"sshd, on a private bridge ({DEFAULT_SUBNET_PREFIX}.X.0/24). Needs root.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("up", help="make N nodes in DIR (what DIR held before is taken down)")
    p.add_argument("n", type=int)
    p.add_argument("dir", type=Path)
    p.add_argument("--subnet", help=f"first three octets of the /24, e.g. "
                                    f"{DEFAULT_SUBNET_PREFIX}.7 (default: the first free)")
    p.add_argument("--prefix", default="node", help="node names and hostnames: PREFIX0 .. "
                                                    "(default node)")
    p = sub.add_parser("down", help="remove every namespace, link and process of DIR")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("status", help="show the nodes")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("exec", help="run CMD inside node I's namespaces (no SSH)")
    p.add_argument("dir", type=Path)
    p.add_argument("node", type=int)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("firewall", help="replace node I's nftables ruleset (text or a file; '' "
                                        "clears it)")
    p.add_argument("dir", type=Path)
    p.add_argument("node", type=int)
    p.add_argument("ruleset")
    for name, helptext in (("private-mount", "mount an empty directory over PATH on node I only"),
                           ("unmount", "undo private-mount of PATH on node I")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("dir", type=Path)
        p.add_argument("node", type=int)
        p.add_argument("path", type=Path)
    p = sub.add_parser("reset", help="node I as up left it (no firewall, no mounts)")
    p.add_argument("dir", type=Path)
    p.add_argument("node", type=int)
    p_guard = sub.add_parser("guard")  # the watchdog of guard=True; not listed in --help
    p_guard.add_argument("dir", type=Path)
    p_guard.add_argument("owner", type=int)
    p_guard.add_argument("owner_start_time", type=int)
    args = parser.parse_args(argv)
    if args.command == "guard":
        return _guard(args.dir, args.owner, args.owner_start_time)
    try:
        if args.command == "up":
            cluster = NetnsCluster(args.dir, args.n, args.subnet, prefix=args.prefix).up()
            print(cluster.cluster_yaml)
            print(f"{args.n} nodes up on {cluster.subnet}.1..{cluster.subnet}.{args.n} (bridge "
                  f"{cluster.bridge}, console {cluster.console_address}).\n"
                  f"  svconsole --config {cluster.cluster_yaml}\n"
                  f"  scripts/netns-cluster exec {cluster.directory} 0 hostname\n"
                  f"  scripts/netns-cluster down {cluster.directory}", file=sys.stderr)
            return 0
        cluster = NetnsCluster.load(args.dir)
        if args.command == "down":
            cluster.down()
        elif args.command == "status":
            for entry in cluster.status():
                ns = cluster.namespaces(cluster.nodes.index(entry["name"]))
                print("{name:8} {address}:{port:<4} {state:7} pid={pid} answers={answers} "
                      "sessions={sessions}".format(**entry) + f" netns={ns.netns}")
        elif args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                parser.error("exec needs a command")
            proc = subprocess.run(cluster.enter_argv(
                args.node, ["sh", "-c", cmd[0]] if len(cmd) == 1 else cmd))
            return proc.returncode
        elif args.command == "firewall":
            path = Path(args.ruleset)
            text = path.read_text() if args.ruleset and path.is_file() else args.ruleset
            cluster.firewall(args.node, text)
        elif args.command == "private-mount":
            print(cluster.private_mount(args.node, args.path))
        elif args.command == "unmount":
            cluster.unmount(args.node, args.path)
        elif args.command == "reset":
            cluster.reset(args.node)
        return 0
    except LoopbackError as exc:
        print(f"netns-cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
