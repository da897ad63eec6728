"""Which cluster a run belongs to: an identity that survives renames and tells apart two
clusters on the same hosts.

A cluster's identity is the ``cluster.id`` kept in its cluster.yaml (generated on first use by
:func:`cluster_id` with ``create=True`` and written atomically with the round-trip editor, so
the file's comments stay) together with each node's host, port and host-key fingerprints (the
keys known for that ``host:port`` in svconsole's known_hosts and the system ones; the pool refuses
any other key). Every run record carries the identity of the cluster that launched it
(:meth:`ClusterIdentity.to_dict`), and :func:`mismatch` says why a record's identity is not this
cluster's: another cluster id, a node this cluster does not have, a node on another host or port,
or a node whose host key is not the one known here. Two cluster.yaml files with the same name
and the same addresses on different ports (two loopback clusters on one machine) never match.

The embedded one-node default (no cluster.yaml) has a fixed id derived from this machine.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from console.cluster.model import Cluster, ClusterConfigError, ClusterEditor, load_cluster
from console.ssh.hostkeys import KnownHosts, fingerprint, host_id

_write_lock = threading.Lock()


class IdentityError(RuntimeError):
    """The cluster id could not be written to cluster.yaml; the message names the file."""


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return socket.gethostname()


def cluster_id(cluster: Cluster, *, create: bool = False) -> str | None:
    """This cluster's id: ``cluster.id`` as loaded, else as its cluster.yaml says now (another
    console may have written it since), else, with ``create``, a new one written into the file
    (:class:`IdentityError` when that fails). None when there is none yet and ``create`` is
    false. The embedded default's id is derived from this machine's id."""
    if cluster.id:
        return cluster.id
    if cluster.path is None:
        digest = hashlib.sha256(f"svconsole-local:{_machine_id()}".encode()).hexdigest()
        return f"local-{digest[:24]}"
    path = Path(cluster.path).expanduser()
    with _write_lock:
        try:
            now = load_cluster(path).id
        except (ClusterConfigError, OSError):
            now = None
        if now or not create:
            return now
        try:
            editor = ClusterEditor(path)
            editor.set("cluster.id", uuid.uuid4().hex)
            return editor.save().id
        except (ClusterConfigError, OSError, ValueError) as exc:
            raise IdentityError(f"{path}: cannot write cluster.id (svconsole's identity of "
                                f"this cluster, kept in every run record): {exc}") from None


@dataclass(frozen=True)
class NodeIdentity:
    """One node as the cluster that launched a run knew it."""

    node: str
    host: str
    port: int
    fingerprints: tuple[str, ...] = ()
    """``SHA256:...`` of the host keys known for ``host:port`` (sorted; empty: none known)."""


@dataclass(frozen=True)
class ClusterIdentity:
    """A cluster's id and its nodes' addresses and host keys."""

    cluster_id: str
    nodes: tuple[NodeIdentity, ...]

    def node(self, name: str) -> NodeIdentity | None:
        return next((n for n in self.nodes if n.node == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster_id": self.cluster_id,
                "nodes": [{"node": n.node, "host": n.host, "port": n.port,
                           "fingerprints": list(n.fingerprints)} for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterIdentity:
        """The identity in a run record (:class:`ValueError` naming the field when it is not
        one :meth:`to_dict` makes)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("cluster_id"), str) \
                or not isinstance(data.get("nodes"), list) or set(data) != {"cluster_id", "nodes"}:
            raise ValueError("identity: not {cluster_id, nodes}")
        nodes = []
        for i, n in enumerate(data["nodes"]):
            if not isinstance(n, Mapping) or set(n) != {"node", "host", "port", "fingerprints"} \
                    or not isinstance(n["node"], str) or not isinstance(n["host"], str) \
                    or isinstance(n["port"], bool) or not isinstance(n["port"], int) \
                    or not isinstance(n["fingerprints"], list) \
                    or not all(isinstance(f, str) for f in n["fingerprints"]):
                raise ValueError(f"identity.nodes[{i}]: not {{node, host, port, fingerprints}}")
            nodes.append(NodeIdentity(n["node"], n["host"], n["port"],
                                      tuple(n["fingerprints"])))
        return cls(data["cluster_id"], tuple(nodes))


def known_fingerprints(cluster: Cluster, known_hosts: KnownHosts | None = None
                       ) -> dict[str, tuple[str, ...]]:
    """Per node, the fingerprints of the host keys known for its ``host:port`` (svconsole's
    known_hosts of ``cluster`` and the system ones, or ``known_hosts``, the pool's)."""
    if known_hosts is None:
        known_hosts = KnownHosts(cluster.local_path(cluster.ssh.known_hosts),
                                 cluster.ssh.host_key_policy)
    tables = []
    for path in (*known_hosts.system_paths, known_hosts.path):
        table = paramiko.HostKeys()
        try:
            table.load(str(path))
        except (OSError, ValueError, paramiko.SSHException):
            continue
        tables.append(table)
    out = {}
    for node in cluster.nodes:
        prints: set[str] = set()
        if not node.local:
            for table in tables:
                found = table.lookup(host_id(node.host, node.port))
                prints.update(fingerprint(found[kind]) for kind in (found or {}).keys())
        out[node.name] = tuple(sorted(prints))
    return out


def identity(cluster: Cluster, *, create: bool = False, known_hosts: KnownHosts | None = None
             ) -> ClusterIdentity | None:
    """The identity of ``cluster`` now (None when it has no id yet and ``create`` is false)."""
    cid = cluster_id(cluster, create=create)
    if cid is None:
        return None
    prints = known_fingerprints(cluster, known_hosts)
    return ClusterIdentity(cid, tuple(
        NodeIdentity(n.name, n.host, n.port, prints[n.name])
        for n in cluster.nodes))


def mismatch(theirs: ClusterIdentity, ours: ClusterIdentity | None, name: str = "this cluster"
             ) -> str | None:
    """Why a run of identity ``theirs`` is not a run of ``ours`` (None when it is)."""
    if ours is None:
        return f"{name} has no cluster.id yet, so it has launched no run"
    if theirs.cluster_id != ours.cluster_id:
        return f"it belongs to cluster id {theirs.cluster_id}, {name} is {ours.cluster_id}"
    for node in theirs.nodes:
        here = ours.node(node.node)
        if here is None:
            return f"{name} has no node {node.node!r}"
        if (here.host, here.port) != (node.host, node.port):
            return (f"it ran node {node.node!r} on {node.host}:{node.port}, {name} has it on "
                    f"{here.host}:{here.port}")
        if node.fingerprints and here.fingerprints \
                and not set(node.fingerprints) & set(here.fingerprints):
            return (f"node {node.node!r} had host key {', '.join(node.fingerprints)}, the one "
                    f"known here is {', '.join(here.fingerprints)}")
    return None


__all__ = ["ClusterIdentity", "IdentityError", "NodeIdentity", "cluster_id", "identity",
           "known_fingerprints", "mismatch"]
