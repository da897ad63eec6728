"""Launching a training run on every node: the plan, the pre-flight checks, the detached start.

:func:`prepare` asks every node (in parallel, one round trip each, through
``scripts/launch_node.py inspect``) what the launch needs: the training Python's torch /
deepspeed / funasr versions, where ``funasr/bin/train_ds.py`` is for that interpreter (resolved on
the node itself: SenseVoice's ``which funasr`` lookup breaks for some installs), ``torchrun``, the
GPUs, the NCCL environment file written by setup, whether output_dir is writable, the data lists,
the master port and the runs already alive. From that it builds the :class:`LaunchPlan` and runs
the pre-flight :class:`Check` s.

The plan is exact and shown in full before launch (:meth:`LaunchPlan.describe`): per node the
``torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr M --master-port P ENTRY
++overrides...`` command line, its environment (CUDA_VISIBLE_DEVICES from the node's ``gpus``, the
NCCL file's variables, PYTHONUNBUFFERED=1, OMP_NUM_THREADS), its working directory and its log
file ``<output_dir>/logs/<node>.log`` on the shared storage. ENTRY is ``train_ds.py``, or with
``entry="cpu-wrapper"`` svconsole's ``sv_train_cpu.py`` (FunASR's trainer on machines without
CUDA; it adds ``++device=cpu ++backend=gloo``), copied to ``<output_dir>/svconsole/``.

:func:`launch` writes the run record, then starts every node's process group detached (it
outlives the console and the SSH connection) and returns the :class:`console.training.runs.RunRecord`.
:func:`resume_profile` gives a finished or stopped run's profile with ``train_conf.resume=true``:
launched again, FunASR continues from ``output_dir/model.pt``.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from console.bringup.model import nccl_env_file
from console.cluster.identity import IdentityError, identity
from console.cluster.model import Cluster
from console.cluster.redact import is_secret, redact, redact_env
from console.ssh.pool import Pool, RemoteError
from console.ssh.remote import script_text
from console.training import dsconfig
from console.training.flightrec import recorder_env
from console.training.profile import TrainingProfile, parse_profile
from console.training.runs import (
    BadRecord,
    NodeCallError,
    NodeRun,
    RunRecord,
    foreign_reason,
    new_run_id,
    node_calls,
    own_identity,
    put_record,
    read_remote_record,
    relocate_runs,
    run_dir,
    save_record,
    stop_run,
)

Entry = Literal["train_ds", "cpu-wrapper"]
log = logging.getLogger(__name__)

CheckpointChoice = Literal["refuse", "resume", "fresh"]
ENTRIES: tuple[Entry, ...] = ("train_ds", "cpu-wrapper")
CPU_WRAPPER = "sv_train_cpu.py"
CPU_OVERRIDES = {"device": "cpu", "backend": "gloo"}
"""Overrides the CPU entry adds unless the profile's ``extra`` sets them."""
STACK = ("torch", "deepspeed", "funasr")


class LaunchError(RuntimeError):
    """The run could not be started; the message names the nodes and why."""


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch, beyond the training profile."""

    entry: Entry = "train_ds"
    """``train_ds`` (FunASR's ``funasr/bin/train_ds.py``) or ``cpu-wrapper`` (no CUDA)."""
    nproc_per_node: int | None = None
    """Processes per node; default: the node's GPUs (``gpus`` in cluster.yaml, else all it
    has), and 1 with the CPU entry."""
    omp_num_threads: int | None = None
    """OMP_NUM_THREADS; default: the node's usable CPUs divided by its processes."""
    master_port: int | None = None
    """Default: the cluster's ``master_port``."""
    env: dict[str, str] = field(default_factory=dict)
    deepspeed_json: str | None = None
    """The DeepSpeed JSON edited in svconsole (its text). The launch validates it, writes it to
    every node as ``<output_dir>/svconsole/<run>/ds_config.json`` and points
    ``train_conf.deepspeed_config`` there; None: the profile's path, as it is on the nodes."""
    """More environment for the training (e.g. TORCH_EXTENSIONS_DIR), on every node."""
    cwd: str | None = None
    """Working directory on the nodes; default output_dir."""
    checkpoint: CheckpointChoice = "refuse"
    """What to do when output_dir already holds a checkpoint (``model.pt``): ``refuse`` (the
    pre-flight check fails: the operator must choose), ``resume`` from it, or ``fresh``: move
    the old output_dir aside (``<output_dir>.<time>``, never deleted) and start anew."""


# ---------------------------------------------------------------- what the nodes say


@dataclass
class NodeInfo:
    """One node's answer to ``launch_node.py inspect``; ``error`` when it could not be asked."""

    node: str
    error: str | None = None
    python: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    train_ds: str | None = None
    train_ds_error: str | None = None
    torchrun: str | None = None
    gpus: list[int] | None = None
    cpus: int = 1
    output_dir_error: str | None = None
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    port_error: str | None = None
    env_file: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None
    """FunASR's model.pt in output_dir: path, saved (mtime), name, epoch, step (None: none)."""
    extension_locks: dict[str, Any] | None = None
    """torch's JIT extension build locks there (``locks``: path and age_s each) and the build
    tools running (``building``)."""
    ssh_client: str | None = None
    """The address this console connected from, as the node routes to it (SSH_CONNECTION)."""

    @classmethod
    def from_reply(cls, node: str, reply: Mapping[str, Any]) -> NodeInfo:
        known = {f for f in cls.__dataclass_fields__}
        return cls(node=node, **{k: v for k, v in reply.items() if k in known})


def inspect_nodes(pool: Pool, profile: TrainingProfile, master_port: int,
                  env: Mapping[str, str] | None = None) -> dict[str, NodeInfo]:
    """Ask every node of the pool's cluster what the launch needs (in parallel). ``env``: what
    the launch adds to the training's environment (its TORCH_EXTENSIONS_DIR is looked at)."""
    cluster = pool.cluster
    data = [profile.train_data_set_list, profile.valid_data_set_list]
    extensions = (env or {}).get("TORCH_EXTENSIONS_DIR")
    per_node = {
        node.name: {"node": node.name, "output_dir": profile.output_dir, "data": data,
                    "port": master_port if node.name == cluster.master_node.name else None,
                    "env_file": nccl_env_file(cluster, node.name),
                    "extensions_dir": extensions}
        for node in cluster.nodes
    }
    replies = node_calls(pool, "inspect", per_node, timeout=60)
    return {name: NodeInfo(name, error=str(reply)) if isinstance(reply, Exception)
            else NodeInfo.from_reply(name, reply) for name, reply in replies.items()}


# ---------------------------------------------------------------- the plan


@dataclass
class NodePlan:
    """The exact launch on one node."""

    node: str
    host: str
    node_rank: int
    nproc: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str

    def shell_line(self) -> str:
        """The command as one shell line (``cd DIR && env K=V ... torchrun ...``)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"cd {shlex.quote(self.cwd)} && env {env} {shlex.join(self.argv)}"


@dataclass
class LaunchPlan:
    """What will run where. ``overrides`` are the ``++key=value`` arguments, the same on every
    node; ``nodes`` in node-rank order (the master first)."""

    run_id: str
    cluster: str
    master: str
    master_addr: str
    master_port: int
    output_dir: str
    entry: Entry
    overrides: list[str]
    nodes: list[NodePlan]
    options: LaunchOptions = field(default_factory=LaunchOptions)
    env_file: str | None = None
    """The NCCL environment file whose variables are in each node's env (None: none found)."""

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    def describe(self) -> str:
        """The whole plan as text for the operator, every command and variable in full (the
        values of secret variables, ``*TOKEN*`` and the like, as ``********``)."""
        per = {n.nproc for n in self.nodes}
        procs = f"{per.pop()} process(es) each" if len(per) == 1 else "processes per node vary"
        lines = [
            f"run {self.run_id} on cluster {self.cluster}: {self.nnodes} node(s), {procs}, "
            f"world size {self.world_size}",
            f"master {self.master} at {self.master_addr}:{self.master_port}; entry {self.entry}",
            f"output_dir {self.output_dir}",
            f"NCCL env file: {self.env_file or 'none found (setup step nccl-env writes one per node)'}",
        ]
        for n in self.nodes:
            lines += ["", f"[{n.node}] node rank {n.node_rank}, host {n.host}, {n.nproc} process(es)",
                      f"  cwd: {n.cwd}", f"  log: {n.log}", "  env:"]
            lines += [f"    {k}={v}" for k, v in redact_env(n.env).items()]
            head = [a for a in n.argv if not a.startswith("++")]
            lines.append("  command: " + shlex.join(head) + " \\")
            tail = [a for a in n.argv if a.startswith("++")]
            lines += [f"      {shlex.quote(a)}" + (" \\" if i < len(tail) - 1 else "")
                      for i, a in enumerate(tail)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchPlan:
        values = dict(data)
        values["nodes"] = [NodePlan(**n) for n in values["nodes"]]
        values["options"] = LaunchOptions(**values.get("options", {}))
        return cls(**values)


class PlanError(ValueError):
    """The plan cannot be built; one line per problem."""


def _overrides(profile: TrainingProfile, entry: Entry) -> list[str]:
    out = profile.to_overrides()
    if entry == "cpu-wrapper":
        out += [f"++{k}={v}" for k, v in CPU_OVERRIDES.items() if k not in profile.extra]
    return out


def _nproc(cluster: Cluster, name: str, info: NodeInfo, options: LaunchOptions) -> int:
    if options.nproc_per_node is not None:
        return options.nproc_per_node
    if options.entry == "cpu-wrapper":
        return 1
    gpus = cluster.node(name).gpus
    count = len(gpus) if gpus is not None else len(info.gpus or [])
    if count == 0:
        raise PlanError(f"{name}: no GPU found (use the cpu-wrapper entry to train on CPUs)")
    return count


def _node_env(cluster: Cluster, name: str, info: NodeInfo, nproc: int,
              options: LaunchOptions) -> dict[str, str]:
    env: dict[str, str] = {}
    gpus = cluster.node(name).gpus
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    elif info.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in info.gpus)
    env.update((info.env_file or {}).get("values") or {})
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(options.omp_num_threads or max(1, info.cpus // max(1, nproc)))
    env.update(options.env)
    return env


def _loopback(host: str) -> bool:
    return host in ("", "localhost", "::1", "ip6-localhost") or host.startswith("127.")


def master_address(cluster: Cluster, infos: Mapping[str, NodeInfo]) -> str:
    """The address the other nodes reach the master at (torchrun's ``--master-addr``). The
    master's host, unless that is this machine (``local: true``, or localhost / 127.*) while
    other nodes are elsewhere: then the address the workers route to this machine by (what a
    worker's SSH_CONNECTION says the console connected from). :class:`PlanError` when no such
    address is known; never a loopback address for a multi-node plan, unless every node is on
    this machine (a loopback cluster)."""
    master = cluster.master_node
    others = [n for n in cluster.nodes if n.name != master.name]
    if not others:
        return master.host or "127.0.0.1"
    if not _loopback(master.host):
        return master.host  # cluster.yaml's host (of a local head too)
    if all(not n.local and _loopback(n.host) for n in others) and not master.local:
        return master.host  # every node is on this machine
    routed = [a for n in others if (a := (infos.get(n.name) or NodeInfo(n.name)).ssh_client)
              and not _loopback(a)]
    if routed:
        return routed[0]
    raise PlanError(f"{master.name}: the master is this machine ({master.host or 'local'}) and "
                    f"no worker said how it reaches it: set {master.name}'s host in cluster.yaml "
                    f"to this machine's address on the network the workers use")


def build_plan(cluster: Cluster, profile: TrainingProfile, infos: Mapping[str, NodeInfo],
               options: LaunchOptions = LaunchOptions(), run_id: str | None = None) -> LaunchPlan:
    """The plan for every node of ``cluster`` (master first). Raises :class:`PlanError` naming
    each node that lacks what its command needs (reachable, train_ds.py, GPUs)."""
    master = cluster.master_node
    order = [master] + [n for n in cluster.nodes if n.name != master.name]
    port = options.master_port or cluster.master_port
    out = profile.output_dir.rstrip("/")
    run_id = run_id or new_run_id()
    if options.deepspeed_json is not None and profile.train_conf.use_deepspeed:
        profile = profile.replace("train_conf.deepspeed_config", shipped_ds_config(out, run_id))
    overrides = _overrides(profile, options.entry)
    problems, nodes = [], []
    try:
        master_addr = master_address(cluster, infos)
    except PlanError as exc:
        problems.append(str(exc))
        master_addr = master.host
    env_file = None
    for rank, node in enumerate(order):
        info = infos.get(node.name) or NodeInfo(node.name, error="not inspected")
        if info.error:
            problems.append(f"{node.name}: {info.error}")
            continue
        if options.entry == "cpu-wrapper":
            entry = f"{out}/svconsole/{CPU_WRAPPER}"
        elif info.train_ds:
            entry = info.train_ds
        else:
            problems.append(f"{node.name}: funasr/bin/train_ds.py not found "
                            f"({info.train_ds_error or 'funasr missing'})")
            continue
        try:
            nproc = _nproc(cluster, node.name, info, options)
        except PlanError as exc:
            problems.append(str(exc))
            continue
        if (info.env_file or {}).get("values"):
            env_file = nccl_env_file(cluster, "{node}")  # one per node, named like this
        launcher = [info.torchrun] if info.torchrun else [info.python or "python3", "-m",
                                                           "torch.distributed.run"]
        argv = [*launcher, "--nnodes", str(len(order)), "--nproc-per-node", str(nproc),
                "--node-rank", str(rank), "--master-addr", master_addr,
                "--master-port", str(port), entry, *overrides]
        env = _node_env(cluster, node.name, info, nproc, options)
        if options.entry != "cpu-wrapper":  # NCCL's flight recorder, dumped on a timeout
            env = {**recorder_env(out, run_id), **env}  # the operator's --env wins
        nodes.append(NodePlan(node.name, node.host, rank, nproc, argv, env,
                              options.cwd or out, f"{out}/logs/{node.name}.log"))
    if problems:
        raise PlanError("\n".join(problems))
    return LaunchPlan(run_id, cluster.name, master.name, master_addr, port, out,
                      options.entry, overrides, nodes, options, env_file)


# ---------------------------------------------------------------- pre-flight


@dataclass(frozen=True)
class Check:
    """One pre-flight check; ``node`` is None for checks over the whole cluster."""

    name: str
    ok: bool
    message: str
    node: str | None = None
    warning: bool = False
    """Passed, but worth the operator's eye (e.g. a hostname that resolves to loopback)."""

    def __str__(self) -> str:
        where = f"{self.node}: " if self.node else ""
        mark = "FAIL" if not self.ok else "warn" if self.warning else "ok"
        return f"[{mark}] {self.name}: {where}{self.message}"


def foreign_runs(pool: Pool, infos: Mapping[str, NodeInfo]) -> dict[str, str]:
    """The runs alive on the nodes that belong to another cluster sharing these hosts (two
    clusters defined over the same machines, a colleague's cluster.yaml): run id -> why it is
    not this cluster's (:func:`console.training.runs.foreign_reason`). A run whose record
    cannot be read is not among them: it counts as this cluster's."""
    here = own_identity(pool)
    found: dict[str, str] = {}
    seen: set[str] = set()
    for node, info in infos.items():
        for entry in info.runs:
            run_id = str(entry.get("run_id"))
            if run_id in seen or not entry.get("record"):
                continue
            seen.add(run_id)
            try:
                record = read_remote_record(pool, node, str(entry["record"]), run_id)
            except (BadRecord, NodeCallError) as exc:
                log.warning("run record not read: %s", exc)
                continue
            why = foreign_reason(record, pool.cluster, here)
            if why is not None:
                found[run_id] = why
    return found


def _node_checks(info: NodeInfo, profile: TrainingProfile, master: str,
                 foreign: Mapping[str, str] | None = None) -> list[Check]:
    n = info.node
    if info.error:
        return [Check("reachable", False, info.error, n)]
    checks = [Check("reachable", True, f"up, Python {info.python}", n)]
    missing = [p for p in STACK if not info.versions.get(p)
               and (p != "deepspeed" or profile.train_conf.use_deepspeed)]
    checks.append(Check("training stack", not missing,
                        f"{', '.join(missing)} not installed for {info.python}" if missing else
                        ", ".join(f"{k} {v}" for k, v in info.versions.items() if v), n))
    checks.append(Check("output_dir", info.output_dir_error is None,
                        info.output_dir_error or f"{profile.output_dir} is writable", n))
    for path, found in info.data.items():
        checks.append(Check("data", bool(found.get("ok")),
                            found.get("error") or f"{path} is readable", n))
    if n == master:
        checks.append(Check("master port", info.port_error is None,
                            info.port_error or "free", n))
    foreign = foreign or {}
    ours = [f"{r['run_id']} (pids {', '.join(map(str, r['pids']))})" for r in info.runs
            if r["run_id"] not in foreign]
    theirs = [f"{r['run_id']} (pids {', '.join(map(str, r['pids']))}; "
              f"{foreign[r['run_id']]})" for r in info.runs if r["run_id"] in foreign]
    if ours:
        checks.append(Check("no other run", False,
                            f"svconsole run {'; '.join(ours)} of this cluster is alive here", n))
    elif theirs:  # another cluster over the same machines: shared GPUs and CPUs, not a clash
        checks.append(Check("no other run", True,
                            f"run {'; '.join(theirs)} of another cluster is alive on this host: "
                            f"it shares the machine's GPUs and CPUs", n, warning=True))
    else:
        checks.append(Check("no other run", True, "no svconsole run alive", n))
    checks.append(extension_lock_check(info))
    env_errors = (info.env_file or {}).get("errors") or []
    if env_errors or (info.env_file or {}).get("error"):
        checks.append(Check("NCCL env file", False,
                            (info.env_file or {}).get("error") or "; ".join(env_errors), n))
    return checks


STALE_LOCK_S = 120
"""A torch extension build lock this old, with no build tool running, was left by a build that
was killed (a build of DeepSpeed's CPU ops takes about 35 s; loading a built one, a second)."""


def extension_lock_check(info: NodeInfo) -> Check:
    """torch's JIT build lock left behind: every rank that loads the extension (DeepSpeed's
    comm and optimizer ops) waits on it for ever, silently, in ``FileBaton.wait``."""
    found = info.extension_locks or {}
    locks, building = found.get("locks") or [], found.get("building") or []
    if not locks:
        return Check("build locks", True, "no torch extension build under way or left", info.node)
    where = "; ".join(f"{lock['path']} ({lock['age_s']} s old)" for lock in locks)
    if building or all(lock["age_s"] < STALE_LOCK_S for lock in locks):
        running = ", ".join(building) or "a build started moments ago"
        return Check("build locks", True, f"a torch extension build is under way ({running}): "
                                          f"{where}; the ranks wait for it", info.node,
                     warning=True)
    return Check("build locks", False,
                 f"{where}: a torch extension build was killed midway and left its lock, and "
                 f"no build runs now. Every rank would wait on it for ever as it loads "
                 f"DeepSpeed's ops (FileBaton.wait). Fix: remove the lock file (rm "
                 f"{' '.join(shlex.quote(lock['path']) for lock in locks)})", info.node)


def _same_versions(infos: Mapping[str, NodeInfo]) -> Check:
    seen: dict[str, dict[str | None, list[str]]] = {}
    for info in infos.values():
        if info.error:
            continue
        for pkg in STACK:
            seen.setdefault(pkg, {}).setdefault(info.versions.get(pkg), []).append(info.node)
    differ = [f"{pkg}: " + "; ".join(f"{v or 'missing'} on {', '.join(nodes)}"
                                     for v, nodes in by.items())
              for pkg, by in seen.items() if len(by) > 1]
    return Check("same versions", not differ,
                 " | ".join(differ) if differ else "torch, deepspeed and funasr match on every node")


def _data_content(infos: Mapping[str, NodeInfo], profile: TrainingProfile) -> list[Check]:
    out = []
    for path in (profile.train_data_set_list, profile.valid_data_set_list):
        for info in infos.values():
            found = info.data.get(path) or {}
            if found.get("ok"):
                bad = dsconfig.check_jsonl_lines(found.get("head", []), f"{info.node}:{path}")
                if bad is None and not any(s.strip() for s in found.get("head", [])):
                    bad = f"{info.node}:{path}: the file is empty"
                out.append(Check("data format", bad is None,
                                 bad or f"{path}: SenseVoice fields present"))
                break
    return out


def shipped_ds_config(output_dir: str, run_id: str) -> str:
    """Where a launch writes the DeepSpeed JSON edited in svconsole, on every node."""
    return f"{output_dir.rstrip('/')}/svconsole/{run_id}/ds_config.json"


def _config_check(pool: Pool, plan: LaunchPlan, profile: TrainingProfile,
                  infos: Mapping[str, NodeInfo]) -> Check:
    """The DeepSpeed JSON, validated by dsconfig with the plan's real world size: the text
    edited in svconsole when the plan ships one, else the profile's file as the master has it."""
    text = plan.options.deepspeed_json
    path = profile.train_conf.deepspeed_config
    if text is not None:
        path = f"ds_config.json (edited in svconsole, shipped to {shipped_ds_config(plan.output_dir, plan.run_id)})"
    else:
        result = pool.run(plan.master, f"cat -- {shlex.quote(path)}", timeout=30)
        if not result.ok:
            return Check("deepspeed config", False,
                         f"{path} is not readable on {plan.master}: "
                         f"{result.error or result.stderr.strip() or 'exit ' + str(result.exit)}")
        text = result.stdout
    spec = dsconfig.ClusterSpec(  # the ranks and each node's training stack, as they will run
        tuple(dsconfig.NodeSpec(n.node, n.nproc, cpu_cores=infos[n.node].cpus, versions=tuple(
            sorted((k, v) for k, v in infos[n.node].versions.items() if v)))
              for n in plan.nodes), pool.cluster.shared_dir, "launch plan", entry=plan.entry)
    report = dsconfig.validate(text, name=path, profile=profile, cluster=spec)
    if report.ok:
        return Check("deepspeed config", True,
                     f"{path}: valid for world size {plan.world_size} ({report.summary})")
    return Check("deepspeed config", False, "; ".join(str(f) for f in report.errors[:3]))


@dataclass
class Preparation:
    """Everything decided before a launch: node answers, the plan (None if it cannot be built),
    and the pre-flight checks."""

    infos: dict[str, NodeInfo]
    plan: LaunchPlan | None
    checks: list[Check]
    profile: TrainingProfile

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return self.plan is not None and not self.failures

    def to_dict(self) -> dict[str, Any]:
        """For output (JSON): secret values redacted."""
        return redact({"ok": self.ok, "checks": [asdict(c) for c in self.checks],
                       "plan": self.plan.to_dict() if self.plan else None})


def network_view(pool: Pool) -> Cluster:
    """The cluster with each node's ``host`` as the other nodes reach it: the HostName that
    ~/.ssh/config gives an alias (a ``Host`` alias is a name only this console's ssh knows,
    so it must never become MASTER_ADDR or a peer address), also behind a jump host."""
    cluster = pool.cluster
    nodes = []
    for node in cluster.nodes:
        endpoint = None if node.local else pool.endpoint(node.name)
        host = endpoint.host if endpoint is not None and endpoint.host else node.host
        nodes.append(node if host == node.host else replace(node, host=host))
    return replace(cluster, nodes=tuple(nodes))


def prepare(pool: Pool, profile: TrainingProfile, options: LaunchOptions = LaunchOptions(),
            *, run_id: str | None = None) -> Preparation:
    """Inspect the nodes, build the plan and run every pre-flight check (seconds)."""
    cluster = network_view(pool)
    infos = inspect_nodes(pool, profile, options.master_port or cluster.master_port,
                          options.env)
    foreign = foreign_runs(pool, infos)
    checks = [c for info in infos.values()
              for c in _node_checks(info, profile, cluster.master_node.name, foreign)]
    checks.append(_same_versions(infos))
    checks += _data_content(infos, profile)
    plan = None
    try:
        plan = build_plan(cluster, profile, infos, options, run_id)
        checks.append(Check("plan", True, f"world size {plan.world_size} over {plan.nnodes} "
                                          f"node(s)"))
    except PlanError as exc:
        checks.append(Check("plan", False, str(exc).replace("\n", "; ")))
    master = infos.get(cluster.master_node.name)
    if master is not None and master.error is None:
        checks.append(checkpoint_check(master.checkpoint, profile, options))
    if plan is not None and profile.train_conf.use_deepspeed:
        checks.append(_config_check(pool, plan, profile, infos))
    if plan is not None:  # between the nodes: ports, shared output_dir, interfaces, data files
        from console.training.preflight import preflight
        from console.training.stacks import pyspy_checks

        checks += preflight(pool, plan, profile)
        checks += pyspy_checks(pool, [n.node for n in plan.nodes])
    return Preparation(infos, plan, checks, profile)


def checkpoint_text(checkpoint: Mapping[str, Any]) -> str:
    """``model.pt (model.pt.ep2.400: epoch 2, step 400; saved 2026-12-01 10:02)``."""
    saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(checkpoint.get("saved") or 0))
    name, epoch, step = checkpoint.get("name"), checkpoint.get("epoch"), checkpoint.get("step")
    where = f"{name}: epoch {epoch}" + (f", step {step}" if step is not None else ", its end") \
        if name else "epoch and step unknown"
    return f"a checkpoint, model.pt ({where}; saved {saved})"


def checkpoint_check(checkpoint: Mapping[str, Any] | None, profile: TrainingProfile,
                     options: LaunchOptions) -> Check:
    """Launching into an output_dir that holds a checkpoint is a choice the operator makes:
    resume from it (refused when it is the end of the last epoch: raise max_epoch first), start
    fresh (the old output_dir moved aside) or force; without one, this check fails."""
    out = profile.output_dir
    resume = profile.train_conf.resume
    if checkpoint is None:
        if options.checkpoint == "resume":
            return Check("checkpoint", False, f"{out} holds no model.pt: nothing to resume")
        return Check("checkpoint", True, f"{out} holds no checkpoint: the run starts anew")
    what = checkpoint_text(checkpoint)
    broken = checkpoint.get("incomplete") or []
    if broken and options.checkpoint != "fresh":
        source = checkpoint.get("name")
        fix = (f"copy {source} over it (cp -a {shlex.quote(f'{out}/{source}')}/. "
               f"{shlex.quote(f'{out}/model.pt')}/) to resume, or " if source else "")
        return Check("checkpoint", False,
                     f"{out} holds {what}, but model.pt is incomplete ({'; '.join(broken)}): "
                     f"a save or its copy was cut short (a stop during it). FunASR would fail "
                     f"to resume from it (EOFError: Ran out of input). Fix: {fix}launch "
                     f"--fresh")
    if options.checkpoint == "fresh":
        return Check("checkpoint", True, f"{out} holds {what}: it is moved aside to "
                                         f"{out}.<launch time> and the run starts anew")
    if options.checkpoint == "resume":
        epoch, step = checkpoint.get("epoch"), checkpoint.get("step")
        last = profile.train_conf.max_epoch
        if not resume:
            return Check("checkpoint", False, f"{out} holds {what}, but train_conf.resume is "
                                              f"false: FunASR would start anew over it")
        if epoch is not None and step is None and epoch >= last:
            return Check("checkpoint", False, f"{out} holds {what}: that run finished its "
                                              f"max_epoch {last}; raise train_conf.max_epoch "
                                              f"to train on")
        return Check("checkpoint", True, f"resumes from {what} (max_epoch {last})")
    then = "FunASR resumes from it" if resume else "FunASR starts anew and overwrites it"
    return Check("checkpoint", False, f"{out} already holds {what}; choose: --resume continues "
                                      f"from it, --fresh moves it aside and starts anew, "
                                      f"--force launches as it is ({then})")


def _move_aside(pool: Pool, plan: LaunchPlan) -> str:
    """``--fresh``: rename output_dir to ``<output_dir>.<time>`` on the master (shared storage:
    every node sees it), never over an existing path, and make output_dir again."""
    out = plan.output_dir
    aside = f"{out}.{time.strftime('%Y%m%d-%H%M%S')}"
    q, qa = shlex.quote(out), shlex.quote(aside)
    result = pool.run(plan.master, f"test ! -e {qa} && mv -T -- {q} {qa} && mkdir -p -- {q}/logs",
                      timeout=60)
    if not result.ok:
        raise LaunchError(f"{plan.master}: cannot move {out} aside to {aside}: "
                          f"{result.error or result.stderr.strip() or 'exit ' + str(result.exit)}")
    return aside


# ---------------------------------------------------------------- launch


def _install_cpu_wrapper(pool: Pool, plan: LaunchPlan) -> None:
    """Copy sv_train_cpu.py to output_dir/svconsole/ on every node, one after another (on
    shared storage two writers of the same temp file would race)."""
    data = script_text(CPU_WRAPPER).encode()
    for node in plan.nodes:
        pool.put(node.node, data, f"{plan.output_dir}/svconsole/{CPU_WRAPPER}")


def secrets_file(node: NodeRun) -> str:
    """Where the values of a node's secret variables (``*TOKEN*`` and the like) wait for its
    supervisor: beside its pid file, mode 0600; the node script reads and removes it. They
    never go on a command line, which every user of the node can read in ``ps``."""
    return node.pid_file[: -len(".pid")] + ".secrets"


def _put_secrets(pool: Pool, plan: LaunchPlan, record: RunRecord) -> None:
    for n in plan.nodes:
        values = {k: v for k, v in n.env.items() if is_secret(k)}
        if values:
            pool.put(n.node, json.dumps(values).encode(), secrets_file(record.node(n.node)),
                     mode=0o600)


def launch(pool: Pool, prep: Preparation, state_dir: Path, *, force: bool = False,
           resumed_from: str | None = None) -> RunRecord:
    """Start the prepared run on every node, detached, and return its record (saved to
    output_dir and the local index). Refuses when a pre-flight check failed, unless ``force``.
    If a node cannot start, the nodes already started are stopped and :class:`LaunchError`
    says why."""
    plan = prep.plan
    if plan is None or (prep.failures and not force):
        raise LaunchError("pre-flight failed:\n" + "\n".join(str(c) for c in prep.failures))
    own = run_dir(plan.output_dir, plan.run_id)
    record = RunRecord(
        plan.run_id, time.time(), plan.cluster, plan.output_dir, plan.master,
        [NodeRun(n.node, n.node_rank, n.log, f"{own}/{n.node}.pid",
                 f"{own}/{n.node}.exit") for n in plan.nodes],
        plan.to_dict(), prep.profile.to_dict(), resumed_from)
    try:
        here = identity(pool.cluster, create=True, known_hosts=pool.known_hosts)
    except IdentityError as exc:
        raise LaunchError(str(exc)) from None
    assert here is not None  # create=True
    record.identity = here.to_dict()
    master = prep.infos.get(plan.master)
    if plan.options.checkpoint == "fresh" and master is not None and master.checkpoint:
        aside = _move_aside(pool, plan)
        relocate_runs(state_dir, pool.cluster, plan.output_dir, aside)
    try:
        _put_secrets(pool, plan, record)
        if plan.entry == "cpu-wrapper":
            _install_cpu_wrapper(pool, plan)
        if plan.options.deepspeed_json is not None and prep.profile.train_conf.use_deepspeed:
            for node in plan.nodes:  # one after another: on shared storage they race
                pool.put(node.node, plan.options.deepspeed_json.encode(),
                         shipped_ds_config(plan.output_dir, plan.run_id))
        put_record(pool, record)  # the processes name it: it must be there before they start
    except (RemoteError, BadRecord) as exc:
        raise LaunchError(str(exc)) from None
    per_node = {n.node: {"run_id": plan.run_id, "node": n.node, "argv": n.argv,
                         "env": {k: v for k, v in n.env.items() if not is_secret(k)},
                         "secret_env": sorted(k for k in n.env if is_secret(k)),
                         "cwd": n.cwd, "log": n.log, "pid_file": record.node(n.node).pid_file,
                         "exit_file": record.node(n.node).exit_file,
                         "record": record.record_path}
                for n in plan.nodes}
    replies = node_calls(pool, "start", per_node, timeout=60)
    failed = []
    for name, reply in replies.items():
        if isinstance(reply, Exception) or "error" in reply:
            failed.append(f"{name}: {reply if isinstance(reply, Exception) else reply['error']}")
            continue
        node = record.node(name)
        node.pid, node.start_ticks, node.child = reply["pid"], reply["start_ticks"], reply["child"]
        node.log_offset, node.started = reply["log_offset"], reply["started"]
    if not failed:
        try:
            save_record(pool, record, state_dir)  # indexed only once every node started
        except RemoteError as exc:
            failed.append(str(exc))
    if failed:
        stop_run(pool, record, grace=5)
        raise LaunchError("could not start the run (nodes already started were stopped):\n"
                          + "\n".join(failed))
    return record


def resume_profile(record: RunRecord, **changes: Any) -> TrainingProfile:
    """The run's profile with ``train_conf.resume=true`` (FunASR then loads
    ``output_dir/model.pt`` on every rank) and any ``changes`` (dotted keys, e.g.
    ``**{"train_conf.max_epoch": 5}``)."""
    profile = parse_profile(json.dumps(record.profile), f"profile of run {record.id}")
    profile = profile.replace("train_conf.resume", True)
    for key, value in changes.items():
        profile = profile.replace(key, value)
    return profile


def resume_options(record: RunRecord) -> LaunchOptions:
    """The launch options the run was started with, to resume from its checkpoint."""
    return replace(LaunchOptions(**record.plan.get("options", {})), checkpoint="resume")


__all__ = [
    "CPU_OVERRIDES", "Check", "CheckpointChoice", "checkpoint_check", "ENTRIES", "Entry", "LaunchError", "LaunchOptions", "LaunchPlan",
    "NodeInfo", "NodePlan", "PlanError", "master_address", "network_view", "Preparation",
    "build_plan",
    "inspect_nodes", "launch", "shipped_ds_config", "prepare", "resume_options", "resume_profile",
]
