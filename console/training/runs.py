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
import logging
import posixpath
import re
import secrets
import shlex
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from console.atomic import atomic_write
from console.cluster.identity import ClusterIdentity, identity, mismatch
from console.cluster.model import Cluster
from console.ssh.pool import Pool, Stream
from console.ssh.remote import script_text

log = logging.getLogger(__name__)

NODE_SCRIPT = "launch_node.py"
RECORD_NAME = "svconsole-run.json"
"""The run record's file name in output_dir."""
PREFIX = "@svc"
"""Lines of the node script's replies start with this; anything else is shell noise."""

RunState = Literal["starting", "running", "unknown", "finished", "failed", "stopped", "lost"]


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


RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4,16}")
"""What :func:`new_run_id` makes; any other id in a record is refused (it names files)."""
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A node name as cluster.yaml allows it."""


def new_run_id(now: float | None = None) -> str:
    """``20261130-004512-3fa2``: sortable by start time, unique enough for one cluster."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


def run_dir(output_dir: str, run_id: str) -> str:
    """svconsole's own directory of one run in output_dir (pid and exit files, shipped
    configuration)."""
    return f"{output_dir.rstrip('/')}/svconsole/{run_id}"


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
    identity: dict[str, Any] | None = None
    """The launching cluster's :class:`console.cluster.identity.ClusterIdentity` (its
    ``to_dict``); a run without one belongs to no cluster."""

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


class BadRecord(ValueError):
    """A run record that svconsole cannot have written (records read from the nodes and from
    the index are untrusted input); the message names where it came from and the field."""


_NUMBER = (int, float)
_RECORD_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "id": (str, True), "created": (_NUMBER, True), "cluster": (str, True),
    "output_dir": (str, True), "master": (str, True), "nodes": (list, True),
    "plan": (dict, False), "profile": (dict, False), "resumed_from": ((str, type(None)), False),
    "identity": ((dict, type(None)), False),
}
"""Field -> (allowed types, required) of a record's JSON."""
_NODE_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "node": (str, True), "node_rank": (int, True), "log": (str, True),
    "pid_file": (str, True), "exit_file": (str, True), "pid": ((int, type(None)), False),
    "start_ticks": ((int, type(None)), False), "child": ((int, type(None)), False),
    "log_offset": (int, False), "started": ((*_NUMBER, type(None)), False),
}


def _fields(data: Any, spec: Mapping[str, tuple[Any, bool]], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRecord(f"{where}: not a JSON object")
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise BadRecord(f"{where}.{unknown[0]}: unknown field")
    for name, (types, required) in spec.items():
        if name not in data:
            if required:
                raise BadRecord(f"{where}.{name}: missing")
            continue
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise BadRecord(f"{where}.{name}: {type(value).__name__} {value!r:.60} is not "
                            f"of the right type")
    return dict(data)


def is_clean_path(path: str) -> bool:
    """An absolute path without ``..``, ``.``, doubled slashes, a trailing slash or control
    characters (so that a prefix test on it means what it says)."""
    return (path.startswith("/") and path != "/" and posixpath.normpath(path) == path
            and not path.startswith("//") and not any(ord(c) < 32 for c in path))


def check_record(data: Any, source: str) -> RunRecord:
    """The record in ``data`` (a record's parsed JSON) if svconsole could have written it, else
    :class:`BadRecord` naming ``source`` and the field: only the record's own fields, each of
    its type; the id as :data:`RUN_ID`; node names as :data:`NODE_NAME`, unique, the master
    one of them; output_dir a clean absolute path (not ``/``); every node's pid and exit files
    exactly in the run's :func:`run_dir` and its log exactly ``<output_dir>/logs/<node>.log``,
    where the launch puts them; pids above 1."""
    values = _fields(data, _RECORD_FIELDS, source)
    run_id = values["id"]
    if not RUN_ID.fullmatch(run_id):
        raise BadRecord(f"{source}: id: {run_id!r:.60} is not a run id (like 20261130-004512-3fa2)")
    where = f"{source} (run {run_id})"
    if values.get("resumed_from") is not None and not RUN_ID.fullmatch(values["resumed_from"]):
        raise BadRecord(f"{where}: resumed_from: {values['resumed_from']!r:.60} is not a run id")
    out = values["output_dir"]
    if not is_clean_path(out):
        raise BadRecord(f"{where}: output_dir: {out!r:.80} is not a clean absolute path")
    if not values["nodes"]:
        raise BadRecord(f"{where}: nodes: empty")
    nodes, seen = [], set()
    for i, raw in enumerate(values["nodes"]):
        n = _fields(raw, _NODE_FIELDS, f"{where}: nodes[{i}]")
        name = n["node"]
        if not NODE_NAME.fullmatch(name) or name in seen:
            raise BadRecord(f"{where}: nodes[{i}].node: {name!r:.60} is not a node name, or "
                            f"is there twice")
        seen.add(name)
        own = run_dir(out, run_id)
        expected = {"pid_file": f"{own}/{name}.pid", "exit_file": f"{own}/{name}.exit",
                    "log": f"{out}/logs/{name}.log"}
        for key, want in expected.items():
            if n[key] != want:
                raise BadRecord(f"{where}: nodes[{i}].{key}: {n[key]!r:.80} is not {want}, "
                                f"where svconsole puts it")
        for key in ("pid", "child"):
            if n.get(key) is not None and n[key] <= 1:
                raise BadRecord(f"{where}: nodes[{i}].{key}: {n[key]} is not a process of a run")
        if n.get("node_rank", 0) < 0 or n.get("log_offset", 0) < 0 \
                or (n.get("start_ticks") or 0) < 0:
            raise BadRecord(f"{where}: nodes[{i}]: a negative rank, offset or start time")
        nodes.append(NodeRun(**n))
    if values["master"] not in seen:
        raise BadRecord(f"{where}: master: {values['master']!r:.60} is not one of its nodes")
    if values.get("identity") is not None:
        try:
            ClusterIdentity.from_dict(values["identity"])
        except ValueError as exc:
            raise BadRecord(f"{where}: {exc}") from None
    values["nodes"] = nodes
    return RunRecord(**values)


def parse_record(text: str, source: str) -> RunRecord:
    """:func:`check_record` of a record file's text (BadRecord for bad JSON too)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadRecord(f"{source}: not JSON ({exc})") from None
    return check_record(data, source)


class RunNotFound(LookupError):
    """No run with that id (or prefix) is known."""


class ForeignRun(RunNotFound):
    """The record is a run of another cluster (see :func:`foreign_reason`): it is neither asked
    nor stopped from here."""


_HERE: Any = object()


def own_identity(pool_or_cluster: Pool | Cluster) -> ClusterIdentity | None:
    """The identity runs must carry to be this cluster's (None: the cluster has no id yet, so
    no run is its). With a pool, host keys are those its known_hosts holds."""
    if isinstance(pool_or_cluster, Cluster):
        return identity(pool_or_cluster)
    return identity(pool_or_cluster.cluster, known_hosts=pool_or_cluster.known_hosts)


def foreign_reason(record: RunRecord, cluster: Cluster, here: ClusterIdentity | None = _HERE
                   ) -> str | None:
    """Why ``record`` is not a run of ``cluster`` (``None`` when it is): no identity, another
    cluster id, a node this cluster does not have, a node on another host or port, or with
    another host key (:func:`console.cluster.identity.mismatch`). The cluster's name does not
    count (it may have been renamed). ``here``: :func:`own_identity`, when already known."""
    name = f"cluster {cluster.name!r}"
    if record.identity is None:
        return "it carries no cluster identity (launched by an older svconsole)"
    if here is _HERE:
        here = identity(cluster)
    names = set(cluster.names())
    missing = [n.node for n in record.nodes if n.node not in names]
    if missing:
        return f"{name} has no node {', '.join(map(repr, missing))}"
    try:
        theirs = ClusterIdentity.from_dict(record.identity)
    except ValueError as exc:
        return f"its {exc}"
    return mismatch(theirs, here, name)


def check_own(record: RunRecord, cluster: Cluster, here: ClusterIdentity | None = _HERE) -> None:
    """Raise :class:`ForeignRun` when ``record`` is not a run of ``cluster``, and
    :class:`BadRecord` when it is not a record svconsole could have written (its pids, log and
    exit files are never handed to a node then)."""
    check_record(record.to_dict(), f"run {record.id!r:.60}")
    why = foreign_reason(record, cluster, here)
    if why is not None:
        raise ForeignRun(f"run {record.id} is not a run of this cluster: {why}")


def index_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "runs"


def put_record(pool: Pool, record: RunRecord) -> None:
    """Write the record to output_dir through its master node, atomically. Raises
    ``console.ssh.pool.RemoteError`` when it cannot be written."""
    check_record(record.to_dict(), f"run {record.id!r:.60}")
    # mode 0600: the record holds the run's environment, secrets (--env HF_TOKEN=...) included
    pool.put(record.master, record.to_json().encode(), record.record_path, mode=0o600)


def save_record(pool: Pool, record: RunRecord, state_dir: Path) -> None:
    """Write the record to output_dir (:func:`put_record`), then to the local index: the
    index never holds a run whose shared record could not be written."""
    put_record(pool, record)
    index_record(record, state_dir)


def index_record(record: RunRecord, state_dir: Path) -> None:
    """Add (or update) the record in the local index (:class:`BadRecord`, nothing written,
    for a record :func:`check_record` refuses)."""
    check_record(record.to_dict(), f"run {record.id!r:.60}")
    directory = index_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / f"{record.id}.json", record.to_json(), backup=False,
                 mode=0o600)  # it holds the run's environment, secrets included


def relocate_runs(state_dir: Path, cluster: Cluster, old: str, new: str) -> list[str]:
    """A launch with ``--fresh`` moved output_dir ``old`` aside to ``new``: the indexed runs of
    this cluster that were in it are pointed at their files' new place (log, pid and exit files),
    so that a finished run stays finished rather than lost. Returns their ids."""
    old, new = old.rstrip("/"), new.rstrip("/")
    here = identity(cluster)

    def moved(path: str) -> str:
        return new + path[len(old):] if path == old or path.startswith(old + "/") else path

    done = []
    for record in load_index(state_dir):
        if record.output_dir.rstrip("/") != old or foreign_reason(record, cluster, here):
            continue
        record.output_dir = new
        for node in record.nodes:
            node.log, node.pid_file = moved(node.log), moved(node.pid_file)
            node.exit_file = moved(node.exit_file)
        index_record(record, state_dir)
        done.append(record.id)
    return done


def load_index(state_dir: Path) -> list[RunRecord]:
    """Records in the local index, newest first; unreadable files, and records that
    :func:`check_record` refuses or that are not in the file their id names, are skipped."""
    records = []
    for path in sorted(index_dir(state_dir).glob("*.json"), reverse=True):
        try:
            record = parse_record(path.read_text(encoding="utf-8"), str(path))
        except (OSError, BadRecord):
            continue
        if path.name == f"{record.id}.json":
            records.append(record)
    return records


def find_record(state_dir: Path, run: str, cluster: Cluster | None = None) -> RunRecord:
    """The indexed run whose id is ``run`` or starts with it (unique prefix);
    ``latest`` names the newest. With ``cluster``, only that cluster's runs count.
    Raises :class:`RunNotFound` with the known ids."""
    records = load_index(state_dir)
    if cluster is not None:
        here = identity(cluster)
        records = [r for r in records if foreign_reason(r, cluster, here) is None]
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
    since: float | None = None
    """With ``error``: since when the node has been unreachable (the pool's view)."""

    @property
    def running(self) -> bool:
        return self.alive or bool(self.processes)

    @property
    def part(self) -> str:
        """This node's part of the run, as the operator reads it: ``running``, ``exited N``,
        ``killed by signal N``, ``unknown (node unreachable since HH:MM:SS: why)`` or ``lost (no
        process, no exit file)``."""
        if self.error is not None:
            when = time.strftime("%H:%M:%S", time.localtime(self.since or time.time()))
            return f"unknown (node unreachable since {when}: {self.error})"
        if self.running:
            return "running"
        if self.stop_signal or (self.exit is not None and self.exit < 0):
            return f"killed by signal {self.stop_signal or -(self.exit or 0)}"
        if self.exit is not None:
            return f"exited {self.exit}"
        return "lost (no process, no exit file)"


@dataclass
class RunStatus:
    """A record and its state on each node."""

    record: RunRecord
    nodes: dict[str, NodeState]

    @property
    def state(self) -> RunState:
        """Derived from the nodes' parts: running (something alive on a node that answered),
        unknown (nothing alive where asked, but a node could not be asked), stopped (a stop
        signal), failed (a non-zero exit), finished (every node exited 0) or lost (gone
        without an exit code). Never running merely because a node could not be asked."""
        states = list(self.nodes.values())
        if any(s.error is None and s.running for s in states):
            return "running"
        if any(s.error is not None for s in states):
            return "unknown"
        if any(s.stop_signal for s in states):
            return "stopped"
        if any(s.exit not in (None, 0) for s in states):
            return "failed"
        if all(s.exit == 0 for s in states):
            return "finished"
        return "lost"

    @property
    def live(self) -> bool:
        """Running, or perhaps running (``unknown``: a node could not be asked): worth following
        and stopping."""
        return self.state in ("running", "unknown")

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"id": r.id, "state": self.state, "created": r.created, "cluster": r.cluster,
                "output_dir": r.output_dir, "resumed_from": r.resumed_from,
                "nodes": {n: {**asdict(s), "part": s.part} for n, s in self.nodes.items()}}


def node_args(record: RunRecord, node: NodeRun) -> dict[str, Any]:
    """The node script's view of one node of a run."""
    return {"run_id": record.id, "node": node.node, "pid": node.pid,
            "start_ticks": node.start_ticks, "exit_file": node.exit_file, "log": node.log,
            "record": record.record_path}


def run_status(pool: Pool, record: RunRecord, *, here: ClusterIdentity | None = _HERE
               ) -> RunStatus:
    """Ask every node of the run (in parallel) how it stands. Raises :class:`ForeignRun` for
    a run of another cluster (``here``: :func:`own_identity`, when already known)."""
    check_own(record, pool.cluster, own_identity(pool) if here is _HERE else here)
    replies = node_calls(pool, "status", {n.node: node_args(record, n) for n in record.nodes},
                         timeout=30)
    nodes = {}
    for name, reply in replies.items():
        if isinstance(reply, Exception):
            seen = pool.status(name)
            nodes[name] = NodeState(name, error=str(reply),
                                    since=seen.since if seen.state != "up" else time.time())
            continue
        exit_info = reply.get("exit") or {}
        nodes[name] = NodeState(name, reply["alive"], reply["processes"], exit_info.get("code"),
                                exit_info.get("stop_signal"), reply.get("log_size"))
    return RunStatus(record, nodes)


def read_remote_record(pool: Pool, node: str, path: str, run_id: str) -> RunRecord:
    """The record of run ``run_id`` at ``path`` on ``node`` (a path a process there named:
    untrusted). :class:`BadRecord` unless the path is a clean ``.../svconsole-run.json``, the
    file (at most 1 MiB) is a record :func:`check_record` accepts, its id is ``run_id`` and
    its output_dir the directory it was found in; :class:`NodeCallError` when it cannot be
    read."""
    source = f"{node}:{path!r:.120}"
    if not RUN_ID.fullmatch(run_id):
        raise BadRecord(f"{source}: run id {run_id!r:.60} named by a process there is not a run id")
    if not is_clean_path(path) or posixpath.basename(path) != RECORD_NAME:
        raise BadRecord(f"{source}: not a clean absolute path to a {RECORD_NAME}")
    result = pool.run(node, f"head -c 1048577 -- {shlex.quote(path)}", timeout=30)
    if not result.ok:
        raise NodeCallError(f"{source}: cannot read: "
                            f"{result.error or result.stderr.strip() or result.exit}")
    if len(result.stdout) > 1 << 20:
        raise BadRecord(f"{source}: larger than 1 MiB")
    record = parse_record(result.stdout, source)
    if record.id != run_id:
        raise BadRecord(f"{source}: id: {record.id} is not the run {run_id} the process names")
    if record.record_path != path:
        raise BadRecord(f"{source}: output_dir: {record.output_dir} is not the directory the "
                        f"record was found in")
    return record


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
    here = own_identity(pool)
    records = [r for r in load_index(state_dir)
               if foreign_reason(r, cluster, here) is None][:limit]
    known = {r.id for r in records}
    foreign: set[str] = set()
    for node, runs in scan_nodes(pool, cluster.names()).items():
        for entry in runs:
            if entry["run_id"] in known | foreign or not entry.get("record"):
                continue
            try:
                record = read_remote_record(pool, node, str(entry["record"]),
                                            str(entry["run_id"]))
            except (BadRecord, NodeCallError) as exc:
                log.warning("run record ignored: %s", exc)
                foreign.add(str(entry["run_id"]))
                continue
            if foreign_reason(record, cluster, here) is not None:
                foreign.add(record.id)
                continue
            index_record(record, state_dir)
            records.append(record)
            known.add(record.id)
    records.sort(key=lambda r: r.id, reverse=True)
    statuses = [run_status(pool, r, here=here) for r in records]
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
    save_waited: float | None = None
    """Seconds the stop waited for a checkpoint save in progress on the node (None: none was)."""
    save_cut: bool = False
    """The save was still going when the wait ended: model.pt may be cut short."""
    save_stalled: bool = False
    """... because nothing of it moved for a minute (a rank frozen inside the save)."""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.remaining


SAVE_WAIT = 300.0
"""How long a stop waits, by default, for a checkpoint save in progress to end."""
SAVE_STALL = 60.0
"""... and how long once nothing of the save moves (the node script's own default too)."""


def stop_run(pool: Pool, record: RunRecord, *, grace: float = 20.0,
             save_wait: float = SAVE_WAIT, save_stall: float = SAVE_STALL) -> dict[str, StopResult]:
    """SIGTERM every node's process group and every process of the run, SIGKILL what is left
    after ``grace`` seconds, and check that every rank is gone on every node (in parallel).
    A node whose ranks are saving a checkpoint (FunASR's ``Save checkpoint:`` line without
    its ``Checkpoint saved to``) is signalled once the save ends, or after ``save_wait``
    seconds (0: at once), or once nothing of the save moved for ``save_stall`` seconds: a
    SIGTERM in the middle leaves a model.pt the resume cannot load.
    Raises :class:`ForeignRun` (nothing signalled) for a run of another cluster."""
    check_own(record, pool.cluster, own_identity(pool))
    per_node = {n.node: {**node_args(record, n), "grace": grace, "save_wait": save_wait,
                         "save_stall": save_stall, "log_offset": n.log_offset,
                         "output_dir": record.output_dir}
                for n in record.nodes}
    replies = node_calls(pool, "stop", per_node, timeout=save_wait + grace + 60)
    out = {}
    for name, reply in replies.items():
        if isinstance(reply, Exception):
            out[name] = StopResult(name, error=str(reply))
        else:
            save = reply.get("save") or {}
            out[name] = StopResult(name, reply["terminated"], reply["killed"], reply["remaining"],
                                   save_waited=save.get("waited"), save_cut=bool(save.get("cut")),
                                   save_stalled=bool(save.get("stalled")))
    return out


__all__ = [
    "ForeignRun", "NodeCallError", "NodeRun", "NodeState", "RECORD_NAME", "RunNotFound",
    "SAVE_STALL", "SAVE_WAIT",
    "RunRecord", "RunState", "RunStatus", "StopResult", "check_own", "find_record", "find_runs",
    "foreign_reason", "load_index",
    "new_run_id", "node_call", "resolve_run", "node_calls", "node_command", "node_stream", "run_status",
    "save_record", "scan_nodes", "stop_run",
]
