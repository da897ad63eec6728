"""Training runs: their records, finding them again, their state on every node, stopping them.

A launch (:mod:`console.training.launch`) leaves, per node, a detached supervisor process group that runs
torchrun (``scripts/launch_node.py``). A :class:`RunRecord` remembers what was started where:
the plan, the profile, and for every node the supervisor's pid (its process group), the log file
and the byte offset where this run's output starts in it. The record is written atomically to
``<output_dir>/svconsole-run.json`` on the shared storage and copied to the local index
``<state_dir>/runs/<id>.json``.

:func:`find_runs` lists runs with their live state: those in the local index, plus any run that is
alive on the nodes but unknown here (launched from another machine, found through the
``SVCONSOLE_RUN_ID`` in its processes' environment, its record read from the shared storage).
Only runs of this cluster count (:func:`foreign_reason`): another cluster.yaml whose nodes share
these hosts (two loopback clusters on one machine, two clusters on one NFS) starts runs that the
node scan sees too; they are never indexed, asked or stopped from here.
:func:`stop_run` sends SIGTERM to every node's process group and to every process of the run,
SIGKILL after a grace period, and checks that nothing of the run is left.

All node-side work goes through :func:`node_call`: one command per node over the shared pool.
"""

from __future__ import annotations

import base64
import json
import secrets
import shlex
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from console.atomic import atomic_write
from console.cluster.model import Cluster
from console.ssh.pool import Pool, Stream
from console.ssh.remote import script_text

NODE_SCRIPT = "launch_node.py"
RECORD_NAME = "svconsole-run.json"
"""The run record's file name in output_dir."""
PREFIX = "@svc"
"""Lines of the node script's replies start with this; anything else is shell noise."""

RunState = Literal["starting", "running", "finished", "failed", "stopped", "lost"]


class NodeCallError(RuntimeError):
    """A node-side operation could not run or gave no reply; the message names the node."""


# ---------------------------------------------------------------- talking to the node script


def node_python(cluster: Cluster) -> str:
    """The interpreter that runs the node script: the training Python, else ``python3``."""
    return cluster.python or "python3"


def node_command(cluster: Cluster, op: str, args: Mapping[str, Any]) -> str:
    """The shell command that runs ``launch_node.py OP`` (the script itself comes on stdin)."""
    payload = base64.b64encode(json.dumps(dict(args)).encode()).decode()
    return f"exec {shlex.quote(node_python(cluster))} - {op} {payload}"


def node_call(pool: Pool, node: str, op: str, args: Mapping[str, Any], *,
              timeout: float = 60.0) -> Any:
    """Run one node-script operation on ``node`` and return its JSON reply.
    Raises :class:`NodeCallError` (unreachable node, missing Python, no reply)."""
    result = pool.run(node, node_command(pool.cluster, op, args), stdin=script_text(NODE_SCRIPT),
                      timeout=timeout)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(f"{PREFIX}J "):
            return json.loads(line[len(PREFIX) + 2:])
    said = result.stderr.strip().splitlines()
    why = result.error or (said[-1] if said else f"no reply (exit {result.exit})")
    raise NodeCallError(f"{node}: {op} failed: {why}")


def node_calls(pool: Pool, op: str, per_node: Mapping[str, Mapping[str, Any]], *,
               timeout: float = 60.0) -> dict[str, Any]:
    """:func:`node_call` on several nodes in parallel; a failure is the NodeCallError itself."""
    def one(node: str) -> Any:
        try:
            return node_call(pool, node, op, per_node[node], timeout=timeout)
        except NodeCallError as exc:
            return exc

    if not per_node:
        return {}
    with ThreadPoolExecutor(min(pool.cluster.ssh.max_parallel, len(per_node))) as executor:
        return dict(zip(per_node, executor.map(one, per_node), strict=True))


def node_stream(pool: Pool, node: str, op: str, args: Mapping[str, Any]) -> Stream:
    """Start a streaming node-script operation (``follow``)."""
    return pool.stream(node, node_command(pool.cluster, op, args), stdin=script_text(NODE_SCRIPT))


# ---------------------------------------------------------------- records


def new_run_id(now: float | None = None) -> str:
    """``20261130-004512-3fa2``: sortable by start time, unique enough for one cluster."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass
class NodeRun:
    """What was started on one node. ``pid`` is the supervisor's (also the process group id)."""

    node: str
    node_rank: int
    log: str
    pid_file: str
    exit_file: str
    pid: int | None = None
    start_ticks: int | None = None
    child: int | None = None
    """torchrun's pid."""
    log_offset: int = 0
    """Where this run's output starts in the log (a resumed run appends to the same log)."""
    started: float | None = None


@dataclass
class RunRecord:
    """One launched run. ``plan`` and ``profile`` are the plan's and the profile's plain data."""

    id: str
    created: float
    cluster: str
    output_dir: str
    master: str
    """Node through which the record in output_dir is written and read."""
    nodes: list[NodeRun]
    plan: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    resumed_from: str | None = None

    @property
    def record_path(self) -> str:
        """Where the record lives on the shared storage."""
        return f"{self.output_dir.rstrip('/')}/{RECORD_NAME}"

    def node(self, name: str) -> NodeRun:
        for n in self.nodes:
            if n.node == name:
                return n
        raise KeyError(f"run {self.id} has no node {name!r}; it runs on "
                       f"{', '.join(n.node for n in self.nodes)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        values = dict(data)
        values["nodes"] = [NodeRun(**n) for n in values.get("nodes", [])]
        return cls(**values)


class RunNotFound(LookupError):
    """No run with that id (or prefix) is known."""


class ForeignRun(RunNotFound):
    """The record is a run of another cluster (see :func:`foreign_reason`): it is neither asked
    nor stopped from here."""


def foreign_reason(record: RunRecord, cluster: Cluster) -> str | None:
    """Why ``record`` is not a run of ``cluster`` (``None`` when it is): another cluster name, a
    node this cluster does not have, or a node the plan put on another host than this cluster's
    node of that name (the hosts are checked where the record's plan lists them)."""
    if record.cluster != cluster.name:
        return f"it belongs to cluster {record.cluster!r}, not {cluster.name!r}"
    hosts = {n.name: n.host for n in cluster.nodes}
    missing = [n.node for n in record.nodes if n.node not in hosts]
    if missing:
        return f"cluster {cluster.name!r} has no node {', '.join(map(repr, missing))}"
    for planned in record.plan.get("nodes", []):
        name, host = planned.get("node"), planned.get("host")
        if host is not None and hosts.get(name) != host:
            return (f"it ran node {name!r} on {host}, cluster {cluster.name!r} has "
                    f"{name!r} on {hosts.get(name)}")
    return None


def check_own(record: RunRecord, cluster: Cluster) -> None:
    """Raise :class:`ForeignRun` when ``record`` is not a run of ``cluster``."""
    why = foreign_reason(record, cluster)
    if why is not None:
        raise ForeignRun(f"run {record.id} is not a run of this cluster: {why}")


def index_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "runs"


def save_record(pool: Pool, record: RunRecord, state_dir: Path) -> None:
    """Write the record to output_dir (through its master node) and to the local index, both
    atomically. Raises ``console.ssh.pool.RemoteError`` when the shared copy cannot be written."""
    index_record(record, state_dir)
    pool.put(record.master, record.to_json().encode(), record.record_path)


def index_record(record: RunRecord, state_dir: Path) -> None:
    """Add (or update) the record in the local index."""
    directory = index_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / f"{record.id}.json", record.to_json(), backup=False)


def load_index(state_dir: Path) -> list[RunRecord]:
    """Records in the local index, newest first; unreadable files are skipped."""
    records = []
    for path in sorted(index_dir(state_dir).glob("*.json"), reverse=True):
        try:
            records.append(RunRecord.from_dict(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return records


def find_record(state_dir: Path, run: str, cluster: Cluster | None = None) -> RunRecord:
    """The indexed run whose id is ``run`` or starts with it (unique prefix);
    ``latest`` names the newest. With ``cluster``, only that cluster's runs count.
    Raises :class:`RunNotFound` with the known ids."""
    records = load_index(state_dir)
    if cluster is not None:
        records = [r for r in records if foreign_reason(r, cluster) is None]
    if run == "latest" and records:
        return records[0]
    matches = [r for r in records if r.id == run] or [r for r in records if r.id.startswith(run)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(r.id for r in records[:10]) or "none (launch one with svconsole launch)"
    if matches:
        raise RunNotFound(f"run {run!r} is ambiguous: {', '.join(r.id for r in matches)}")
    raise RunNotFound(f"no run {run!r}; known runs: {known}")


def resolve_run(pool: Pool, state_dir: Path, run: str) -> RunRecord:
    """Like :func:`find_record` among the runs of the pool's cluster; a run not in the local
    index is looked for on the nodes (:func:`find_runs`) before giving up."""
    try:
        return find_record(state_dir, run, pool.cluster)
    except RunNotFound:
        find_runs(pool, state_dir, live_only=True)
        return find_record(state_dir, run, pool.cluster)


# ---------------------------------------------------------------- state


@dataclass
class NodeState:
    """A run's state on one node. ``error`` is set when the node could not be asked."""

    node: str
    alive: bool = False
    """The supervisor (and so torchrun) is still running."""
    processes: list[int] = field(default_factory=list)
    """Live processes of the run on this node (supervisor, torchrun, ranks...)."""
    exit: int | None = None
    stop_signal: int | None = None
    log_size: int | None = None
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.alive or bool(self.processes)


@dataclass
class RunStatus:
    """A record and its state on each node."""

    record: RunRecord
    nodes: dict[str, NodeState]

    @property
    def state(self) -> RunState:
        """running (anything alive, or a node that cannot be asked), stopped, failed (a non-zero
        exit), finished (every node exited 0) or lost (gone without an exit code)."""
        states = list(self.nodes.values())
        if any(s.running or s.error for s in states):
            return "running"
        if any(s.stop_signal for s in states):
            return "stopped"
        if any(s.exit not in (None, 0) for s in states):
            return "failed"
        if all(s.exit == 0 for s in states):
            return "finished"
        return "lost"

    @property
    def live(self) -> bool:
        return self.state == "running"

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"id": r.id, "state": self.state, "created": r.created, "cluster": r.cluster,
                "output_dir": r.output_dir, "resumed_from": r.resumed_from,
                "nodes": {n: asdict(s) for n, s in self.nodes.items()}}


def node_args(record: RunRecord, node: NodeRun) -> dict[str, Any]:
    """The node script's view of one node of a run."""
    return {"run_id": record.id, "node": node.node, "pid": node.pid,
            "start_ticks": node.start_ticks, "exit_file": node.exit_file, "log": node.log}


def run_status(pool: Pool, record: RunRecord) -> RunStatus:
    """Ask every node of the run (in parallel) how it stands. Raises :class:`ForeignRun` for
    a run of another cluster."""
    check_own(record, pool.cluster)
    replies = node_calls(pool, "status", {n.node: node_args(record, n) for n in record.nodes},
                         timeout=30)
    nodes = {}
    for name, reply in replies.items():
        if isinstance(reply, Exception):
            nodes[name] = NodeState(name, error=str(reply))
            continue
        exit_info = reply.get("exit") or {}
        nodes[name] = NodeState(name, reply["alive"], reply["processes"], exit_info.get("code"),
                                exit_info.get("stop_signal"), reply.get("log_size"))
    return RunStatus(record, nodes)


def _read_remote_record(pool: Pool, node: str, path: str) -> RunRecord | None:
    result = pool.run(node, f"cat -- {shlex.quote(path)}", timeout=30)
    if not result.ok:
        return None
    try:
        return RunRecord.from_dict(json.loads(result.stdout))
    except (ValueError, TypeError, KeyError):
        return None


def scan_nodes(pool: Pool, nodes: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The runs alive on each node (``[{run_id, pids, record}]``); unreachable nodes are left
    out."""
    replies = node_calls(pool, "scan", {n: {"node": n} for n in nodes}, timeout=30)
    return {n: r for n, r in replies.items() if not isinstance(r, Exception)}


def find_runs(pool: Pool, state_dir: Path, *, limit: int = 20,
              live_only: bool = False) -> list[RunStatus]:
    """Runs of this cluster with their state, newest first: the ``limit`` newest of the local
    index, plus runs alive on the nodes that the index does not know (their record is read from
    output_dir and added to the index: this console reattaches to them). Runs of another cluster
    (:func:`foreign_reason`) are left out, wherever they were found."""
    cluster = pool.cluster
    records = [r for r in load_index(state_dir) if foreign_reason(r, cluster) is None][:limit]
    known = {r.id for r in records}
    foreign: set[str] = set()
    for node, runs in scan_nodes(pool, cluster.names()).items():
        for entry in runs:
            if entry["run_id"] in known | foreign or not entry.get("record"):
                continue
            record = _read_remote_record(pool, node, entry["record"])
            if record is None or record.id != entry["run_id"]:
                continue
            if foreign_reason(record, cluster) is not None:
                foreign.add(record.id)
                continue
            index_record(record, state_dir)
            records.append(record)
            known.add(record.id)
    records.sort(key=lambda r: r.id, reverse=True)
    statuses = [run_status(pool, r) for r in records]
    return [s for s in statuses if s.live] if live_only else statuses


# ---------------------------------------------------------------- stop


@dataclass
class StopResult:
    """What stopping did on one node: processes sent SIGTERM, those that needed SIGKILL, and
    those still alive afterwards (should be none)."""

    node: str
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    remaining: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.remaining


def stop_run(pool: Pool, record: RunRecord, *, grace: float = 20.0) -> dict[str, StopResult]:
    """SIGTERM every node's process group and every process of the run, SIGKILL what is left
    after ``grace`` seconds, and check that every rank is gone on every node (in parallel).
    Raises :class:`ForeignRun` (nothing signalled) for a run of another cluster."""
    check_own(record, pool.cluster)
    per_node = {n.node: {**node_args(record, n), "grace": grace} for n in record.nodes}
    replies = node_calls(pool, "stop", per_node, timeout=grace + 60)
    out = {}
    for name, reply in replies.items():
        if isinstance(reply, Exception):
            out[name] = StopResult(name, error=str(reply))
        else:
            out[name] = StopResult(name, reply["terminated"], reply["killed"], reply["remaining"])
    return out


__all__ = [
    "ForeignRun", "NodeCallError", "NodeRun", "NodeState", "RECORD_NAME", "RunNotFound",
    "RunRecord", "RunState", "RunStatus", "StopResult", "check_own", "find_record", "find_runs",
    "foreign_reason", "load_index",
    "new_run_id", "node_call", "resolve_run", "node_calls", "node_command", "node_stream", "run_status",
    "save_record", "scan_nodes", "stop_run",
]
