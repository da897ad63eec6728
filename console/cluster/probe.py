"""Node facts: what each node of the cluster is, read in one round trip per node.

:func:`probe_node` sends the node-side program ``scripts/probe.py`` over the pool as the stdin of
the node's ``python3`` and reads back its payload (between marker lines that carry a random
nonce, so whatever the remote shell prints around it is ignored). The payload becomes a typed
:class:`NodeFacts`. :func:`probe_all` does that for every node in parallel, adds the round trip
from the master node to each node, and keeps the last good facts of every node in a
:class:`FactsCache`: a node that cannot be reached keeps its last known facts, marked ``stale``
with the time they were collected.

Clock offset: the node reports its clock at the end of the probe and how long the probe ran. On
the console, that moment lies between the send time plus the probe's run time and the receive
time; the offset is measured against the middle of that window (``clock_uncertainty_s`` is half
its width).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shlex
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svconsole_scripts import probe as node_probe

from console.atomic import atomic_write
from console.ssh.remote import local_python, script_text

if TYPE_CHECKING:
    from console.cluster.model import Cluster
    from console.ssh.pool import NodeStatus, Pool, Result

log = logging.getLogger(__name__)

#: Seconds for one node's whole probe (connect, run, import torch).
PROBE_TIMEOUT = 120.0
#: Seconds the probe may spend importing torch in the training interpreter (0: skip it).
TORCH_TIMEOUT = 60.0
#: Seconds for the master's TCP connect to each node.
RTT_TIMEOUT = 3.0


class ProbeError(Exception):
    """The probe's output holds no readable payload (the message says what was seen instead)."""


@dataclass
class GPUInfo:
    """One NVIDIA GPU of a node (from NVML, else nvidia-smi)."""

    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: int | None = None      # MiB
    compute_capability: str | None = None   # "9.0"
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the CUDA version the driver supports, "13.0"
    persistence: bool | None = None
    ecc: bool | None = None
    pcie_gen: int | None = None             # maximum the GPU and its slot allow
    pcie_width: int | None = None
    nvlink_up: int | None = None            # NVLink links up; None: no NVLink or not reported


@dataclass
class NodeFacts:
    """Everything the probe learnt about one node.

    ``ok``: this probe reached the node and read its payload. When it did not, ``error`` says
    why; if earlier facts were known they are kept, with ``stale`` set and ``collected_at`` the
    time they were read. ``fact_errors`` names each fact the node could not read, with the
    reason. Sizes: MiB for memory, GB (10^9 bytes) for disks, Mb/s for network links.
    """

    node: str
    collected_at: float = 0.0
    ok: bool = False
    error: str | None = None
    stale: bool = False
    hostname: str | None = None
    machine_id: str | None = None
    boot_id: str | None = None
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    cpu_model: str | None = None
    cpu_cores: int | None = None            # logical CPUs of the machine (os.cpu_count)
    cpu_usable: int | None = None           # CPUs this process may use (affinity; like nproc)
    mem_total_mb: int | None = None
    mem_available_mb: int | None = None
    load: tuple[float, float, float] | None = None
    disk_root: dict[str, Any] | None = None           # total_gb, free_gb
    disks: list[dict[str, Any]] = field(default_factory=list)   # name, size_gb, rotational, nvme
    shared: dict[str, Any] | None = None
    # path, exists, total_gb, free_gb, fstype, source, mountpoint, is_nfs, server, shared_fs
    gpus: list[GPUInfo] = field(default_factory=list)
    gpu_source: str | None = None           # "nvml" | "nvidia-smi" | None
    gpu_error: str | None = None
    python: dict[str, Any] | None = None
    # path, executable, version, torch, torch_cuda, nccl, deepspeed, funasr, numpy, error,
    # torch_imported (False: torch was not imported, its CUDA and NCCL versions are unknown)
    net: list[dict[str, Any]] = field(default_factory=list)     # name, kind, state, addrs, speed_mbps, mtu
    rdma: list[str] = field(default_factory=list)               # RDMA devices (mlx5_0, ...)
    rdma_ports: list[dict[str, Any]] = field(default_factory=list)  # device, port, state, rate_gbps, link_layer
    clock_offset_s: float | None = None     # node clock minus console clock
    clock_uncertainty_s: float | None = None
    rtt_ms: float | None = None             # console to node (one SSH round trip)
    master_rtt_ms: float | None = None      # master node to this node (TCP connect to its SSH port)
    master_rtt_note: str | None = None      # how master_rtt_ms was measured, or why it is missing
    probe_seconds: float | None = None      # the probe's own run time on the node
    fact_errors: dict[str, str] = field(default_factory=dict)

    def age(self, now: float | None = None) -> float:
        """Seconds since these facts were collected."""
        return (time.time() if now is None else now) - self.collected_at

    def versions(self) -> dict[str, str | None]:
        """The training stack's versions: torch, torch_cuda, nccl, deepspeed, funasr, numpy, python."""
        py = self.python or {}
        keys = ("torch", "torch_cuda", "nccl", "deepspeed", "funasr", "numpy")
        return {"python": py.get("version"), **{k: py.get(k) for k in keys}}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeFacts:
        """Inverse of :meth:`to_json`; unknown keys are ignored, missing ones take defaults."""
        if not isinstance(data, dict) or not isinstance(data.get("node"), str):
            raise ValueError("facts must be an object with a 'node' name")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        gpu_keys = {f.name for f in fields(GPUInfo)}
        values["gpus"] = [GPUInfo(**{k: v for k, v in g.items() if k in gpu_keys})
                          for g in values.get("gpus") or []]
        if values.get("load") is not None:
            values["load"] = tuple(values["load"])
        return cls(**values)


# ---------------------------------------------------------------- payload


def probe_command(cluster: Cluster, nonce: str, *, torch_timeout: float = TORCH_TIMEOUT,
                  rtt_targets: Iterable[str] | None = None, local: bool = False) -> str:
    """The shell command that runs the probe read from stdin: ``python3 -`` (else cluster.python);
    on the ``local`` node, svconsole's own Python (it reads the GPUs through its nvidia-ml-py).
    The training interpreter it inspects is cluster.python (python3) either way."""
    args = ["--nonce", nonce, "--shared-dir", cluster.shared_dir,
            "--torch-timeout", f"{torch_timeout:g}"]
    if cluster.python:
        args += ["--python", cluster.python]
    if rtt_targets is not None:
        args += ["--rtt", *rtt_targets]
    tail = " ".join(shlex.quote(a) for a in args)
    if local:
        return f"exec {shlex.quote(local_python())} - {tail}"
    fallback = shlex.quote(cluster.python or "python")
    return (f"if command -v python3 >/dev/null 2>&1; then exec python3 - {tail}; "
            f"else exec {fallback} - {tail}; fi")


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)


def extract_payload(stdout: str, nonce: str) -> dict[str, Any]:
    """The JSON payload between the probe's marker lines; noise around it is ignored."""
    begin = node_probe.BEGIN.format(nonce=nonce)
    end = node_probe.END.format(nonce=nonce)
    start = stdout.find(begin)
    if start < 0:
        raise ProbeError(f"no probe payload in the output ({_tail(stdout) or 'no output'})")
    stop = stdout.find(end, start)
    if stop < 0:
        raise ProbeError("the probe payload was cut off (no end marker)")
    body = stdout[start + len(begin):stop]
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"the probe payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ProbeError("the probe payload is not a JSON object")
    if payload.get("version") != node_probe.PAYLOAD_VERSION:
        raise ProbeError(f"probe payload version {payload.get('version')!r}, "
                         f"expected {node_probe.PAYLOAD_VERSION}")
    return payload


def facts_from_payload(node: str, payload: dict[str, Any], *, sent: float,
                       received: float) -> NodeFacts:
    """Typed facts from a probe payload; ``sent``/``received`` are console times (time.time())."""
    memory = payload.get("memory") or (None, None)
    gpu = payload.get("gpu") or {}
    rdma_ports = payload.get("rdma") or []
    elapsed = float(payload.get("elapsed_s") or 0.0)
    facts = NodeFacts(
        node=node, collected_at=received, ok=True,
        hostname=payload.get("hostname"), machine_id=payload.get("machine_id"),
        boot_id=payload.get("boot_id"), os=payload.get("os"), kernel=payload.get("kernel"),
        arch=payload.get("arch"), cpu_model=payload.get("cpu_model"),
        cpu_cores=payload.get("cpu_cores"), cpu_usable=payload.get("cpu_usable"),
        mem_total_mb=memory[0], mem_available_mb=memory[1],
        load=tuple(payload["load"]) if payload.get("load") else None,
        disk_root=payload.get("disk_root"), disks=payload.get("disks") or [],
        shared=payload.get("shared"),
        gpus=[GPUInfo(**g) for g in gpu.get("gpus") or []],
        gpu_source=gpu.get("source"),
        gpu_error=gpu.get("error") or payload["errors"].get("gpu"),
        python=payload.get("python"), net=payload.get("net") or [],
        rdma=sorted({p["device"] for p in rdma_ports}), rdma_ports=rdma_ports,
        probe_seconds=elapsed, fact_errors=dict(payload.get("errors") or {}),
    )
    if payload.get("clock") is not None:
        earliest, latest = sent + elapsed, max(received, sent + elapsed)
        facts.clock_offset_s = round(float(payload["clock"]) - (earliest + latest) / 2, 4)
        facts.clock_uncertainty_s = round((latest - earliest) / 2, 4)
    return facts


def _from_result(result: Result, nonce: str, received: float) -> NodeFacts:
    if result.error is not None:
        return NodeFacts(node=result.node, collected_at=received, error=result.error)
    try:
        payload = extract_payload(result.stdout, nonce)
    except ProbeError as exc:
        why = str(exc)
        if result.exit not in (0, None):
            why = f"probe exited {result.exit}: {_tail(result.stderr) or why}"
        return NodeFacts(node=result.node, collected_at=received, error=why)
    return facts_from_payload(result.node, payload, sent=received - result.seconds,
                              received=received)


def _rtt_ms(status: NodeStatus) -> float | None:
    """The round trip of the pool's liveness probe (one SSH channel open), in ms."""
    return None if status.rtt is None else round(status.rtt * 1000, 3)


# ---------------------------------------------------------------- probing


def probe_node(pool: Pool, cluster: Cluster, node: str, *, timeout: float = PROBE_TIMEOUT,
               torch_timeout: float = TORCH_TIMEOUT) -> NodeFacts:
    """Probe one node; never raises for an unreachable node or a failing probe (see ``error``)."""
    nonce = secrets.token_hex(8)
    result = pool.run(node, probe_command(cluster, nonce, torch_timeout=torch_timeout,
                                          local=cluster.node(node).local),
                      stdin=script_text("probe.py"), timeout=timeout)
    facts = _from_result(result, nonce, time.time())
    if facts.ok:
        facts.rtt_ms = _rtt_ms(pool.ping(node))
    return facts


def master_round_trips(pool: Pool, cluster: Cluster, nodes: Iterable[str], *,
                       timeout: float = RTT_TIMEOUT) -> dict[str, tuple[float | None, str]]:
    """{node: (ms, note)}: TCP connect time from the master node to each node's SSH port.

    Measured by the probe program on the master (``--rtt``); ``note`` says what was measured or
    why it failed.
    """
    master = cluster.master_node
    names = list(nodes)
    out = {name: (None, "local node (no SSH port to time)") for name in names
           if cluster.node(name).local}
    targets = {name: f"{name}={cluster.node(name).host}:{cluster.node(name).port}"
               for name in names if name not in out}
    if not targets:
        return out
    nonce = secrets.token_hex(8)
    cmd = probe_command(cluster, nonce, rtt_targets=targets.values(), local=master.local)
    result = pool.run(master.name, cmd, stdin=script_text("probe.py"),
                      timeout=timeout * max(1, len(targets)) + 30)
    try:
        if result.error is not None:
            raise ProbeError(result.error)
        rtts = extract_payload(result.stdout, nonce)["rtt"]
    except (ProbeError, KeyError) as exc:
        out.update({name: (None, f"master {master.name} could not measure: {exc}")
                    for name in targets})
        return out
    for name, target in targets.items():
        r = rtts.get(name) or {"ms": None, "error": "not measured"}
        where = target.split("=", 1)[1]
        note = (f"TCP connect from {master.name} to {where}" if r["ms"] is not None
                else f"from {master.name} to {where}: {r['error']}")
        out[name] = (r["ms"], note)
    return out


def probe_all(pool: Pool, cluster: Cluster, nodes: Iterable[str] | None = None, *,
              cache: FactsCache | None = None, master_rtt: bool = True,
              timeout: float = PROBE_TIMEOUT,
              torch_timeout: float = TORCH_TIMEOUT) -> dict[str, NodeFacts]:
    """Probe the nodes (all by default) in parallel through the pool's fan-out.

    With ``cache``, nodes whose probe fails keep their last good facts (``stale``), and the good
    facts of this round are saved. With ``master_rtt``, the master also times a TCP connect to
    every node that answered.
    """
    names = list(nodes) if nodes is not None else cluster.names()
    nonce = secrets.token_hex(8)
    facts: dict[str, NodeFacts] = {}
    script = script_text("probe.py")
    local = [n for n in names if cluster.node(n).local]
    remote = [n for n in names if n not in local]
    # the local node's probe runs with another interpreter, alongside the remote ones
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-local") as executor:
        local_cmd = probe_command(cluster, nonce, torch_timeout=torch_timeout, local=True)
        local_results = executor.submit(
            lambda: [pool.run(n, local_cmd, stdin=script, timeout=timeout) for n in local])
        if remote:
            cmd = probe_command(cluster, nonce, torch_timeout=torch_timeout)
            for result in pool.iter_run_all(cmd, nodes=remote, stdin=script, timeout=timeout):
                facts[result.node] = _from_result(result, nonce, time.time())
        for result in local_results.result():
            facts[result.node] = _from_result(result, nonce, time.time())
    up = [n for n in names if facts[n].ok]
    for name, status in (pool.ping_all(nodes=up) if up else {}).items():
        facts[name].rtt_ms = _rtt_ms(status)
    if master_rtt and up and facts.get(cluster.master_node.name, NodeFacts("")).ok:
        for name, (ms, note) in master_round_trips(pool, cluster, up).items():
            facts[name].master_rtt_ms, facts[name].master_rtt_note = ms, note
    ordered = {n: facts[n] for n in names}
    return cache.update(ordered) if cache is not None else ordered


# ---------------------------------------------------------------- cache


class FactsCacheError(Exception):
    """The facts cache file cannot be read (the message names the file and the problem)."""


def _file_name(cluster_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", cluster_name) or "cluster"


class FactsCache:
    """Last good facts of every node of one cluster, in ``<state_dir>/facts/<cluster>.json``."""

    def __init__(self, state_dir: str | Path, cluster_name: str) -> None:
        self.path = Path(state_dir) / "facts" / f"{_file_name(cluster_name)}.json"
        self.cluster_name = cluster_name

    def load(self) -> dict[str, NodeFacts]:
        """The cached facts by node ({} when there is no cache yet)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FactsCacheError(f"{self.path}: cannot read the facts cache: {exc}") from None
        nodes = data.get("nodes") if isinstance(data, dict) else None
        if not isinstance(nodes, dict):
            raise FactsCacheError(f"{self.path}: nodes: expected an object of facts by node")
        out = {}
        for name, value in nodes.items():
            try:
                out[name] = NodeFacts.from_json(value)
            except (TypeError, ValueError) as exc:
                raise FactsCacheError(f"{self.path}: nodes.{name}: {exc}") from None
        return out

    def save(self, facts: dict[str, NodeFacts]) -> None:
        doc = {"cluster": self.cluster_name, "saved_at": time.time(),
               "nodes": {name: f.to_json() for name, f in facts.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(doc, indent=1), backup=False)

    def update(self, fresh: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
        """Merge a probe round into the cache and return what to show.

        A node that failed this round gets its last good facts back, marked stale, with this
        round's error. Good facts replace the cached ones, which are then saved.
        """
        try:
            cached = self.load()
        except FactsCacheError as exc:
            log.warning("%s; starting a new one", exc)
            cached = {}
        shown = {}
        for name, facts in fresh.items():
            old = cached.get(name)
            if facts.ok:
                cached[name] = facts
                shown[name] = facts
            elif old is not None:
                shown[name] = replace(old, ok=False, stale=True, error=facts.error)
            else:
                shown[name] = facts
        if any(f.ok for f in fresh.values()):
            self.save(cached)
        return shown

    def stale(self, names: Iterable[str]) -> dict[str, NodeFacts]:
        """Cached facts for the named nodes, all marked stale (to show before a first probe)."""
        try:
            cached = self.load()
        except FactsCacheError as exc:
            log.warning("%s", exc)
            cached = {}
        return {n: replace(cached[n], ok=False, stale=True, error="not probed yet")
                for n in names if n in cached}
