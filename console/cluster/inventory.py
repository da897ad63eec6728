"""Judgement on node facts: hardware tier, cross-node consistency, readiness.

* :func:`tier_of` places a node in the guide's hardware table (its section 2.1: minimum,
  recommended, high end) field by field (CPU, RAM, GPU, storage, network) and names the fields
  that hold it back.
* :func:`consistency` compares the nodes (GPU model, driver, CUDA, torch, NCCL, DeepSpeed,
  FunASR, Python) and lists each difference with the value on every node.
* :func:`assess` gives the verdict per node and for the cluster: ready, degraded or not ready,
  each with its reasons.

Everything here is data (tables and dataclasses); rendering is the caller's business.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from console.cluster.model import Cluster, Node
    from console.cluster.probe import GPUInfo, NodeFacts


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class GPUClass:
    """A GPU model: its memory and its dense BF16 tensor throughput (approximate TFLOPS from
    NVIDIA's datasheets; used only to rank models against each other)."""

    label: str
    pattern: str          # regular expression on the reported name
    memory_gb: int        # nominal memory of the reference part
    bf16_tflops: float


#: Known GPU models, most specific first. A100/H100 variants with more memory than the reference
#: part are compared by their reported memory, so only one entry per chip is needed.
GPU_CLASSES: tuple[GPUClass, ...] = (
    GPUClass("B200", r"\bB200\b", 180, 2250),
    GPUClass("B100", r"\bB100\b", 180, 1750),
    GPUClass("GH200", r"\bGH200\b", 96, 989),
    GPUClass("H200", r"\bH200\b", 141, 989),
    GPUClass("H100 80GB", r"\bH100\b", 80, 989),
    GPUClass("H800", r"\bH800\b", 80, 989),
    GPUClass("H20", r"\bH20\b", 96, 148),
    GPUClass("A100 40GB", r"\bA100\b", 40, 312),
    GPUClass("A800", r"\bA800\b", 40, 312),
    GPUClass("L40S", r"\bL40S\b", 48, 362),
    GPUClass("L40", r"\bL40\b", 48, 181),
    GPUClass("RTX 6000 Ada", r"RTX 6000 Ada", 48, 364),
    GPUClass("RTX A6000", r"RTX A6000", 48, 155),
    GPUClass("A40", r"\bA40\b", 48, 150),
    GPUClass("A30", r"\bA30\b", 24, 165),
    GPUClass("A10", r"\bA10G?\b", 24, 125),
    GPUClass("L4", r"\bL4\b", 24, 121),
    GPUClass("RTX 5090", r"RTX 5090", 32, 210),
    GPUClass("RTX 4090", r"RTX 4090", 24, 165),
    GPUClass("RTX 3090", r"RTX 3090", 24, 71),
    GPUClass("V100", r"\bV100", 16, 125),
    GPUClass("T4", r"\bT4\b", 16, 65),
)


def gpu_class(name: str) -> GPUClass | None:
    """The known model a reported GPU name belongs to ("NVIDIA H200" -> H200), else None."""
    for cls in GPU_CLASSES:
        if re.search(cls.pattern, name, re.IGNORECASE):
            return cls
    return None


def _reference(label: str) -> GPUClass:
    return next(c for c in GPU_CLASSES if c.label == label)


@dataclass(frozen=True)
class TierSpec:
    """One column of the guide's hardware table (section 2.1)."""

    name: str
    cores: int
    ram_gb: int
    gpu_count: int
    gpu: str              # GPUClass label of the reference GPU
    nvme_tb: float
    net_gbps: float
    rdma: bool = False
    infiniband: bool = False


TIERS: tuple[TierSpec, ...] = (
    TierSpec("minimum", 8, 64, 2, "RTX 3090", 1, 1),
    TierSpec("recommended", 24, 256, 4, "A100 40GB", 4, 10, rdma=True),
    TierSpec("high end", 64, 512, 8, "H100 80GB", 8, 200, rdma=True, infiniband=True),
)
BELOW_MINIMUM = "below minimum"
#: Nominal sizes are met within this fraction (a "64 GB" machine shows ~62.8 GiB to Linux).
SIZE_TOLERANCE = 0.9
GPU_MEMORY_TOLERANCE = 0.95


def tier_name(level: int) -> str:
    """0 -> "below minimum", 1 -> "minimum", ... (level = tiers reached)."""
    return BELOW_MINIMUM if level == 0 else TIERS[level - 1].name


# ---------------------------------------------------------------- tiers


@dataclass(frozen=True)
class FieldTier:
    """How one field of a node measures against the table; ``level`` None when not reported."""

    field: str
    value: str
    level: int | None
    short_of: str = ""    # what the next tier up needs that this field lacks

    @property
    def tier(self) -> str:
        return "unknown" if self.level is None else tier_name(self.level)


@dataclass(frozen=True)
class TierResult:
    """A node's tier: the lowest tier all its known fields reach."""

    level: int | None
    fields: tuple[FieldTier, ...]
    limited_by: tuple[str, ...]    # fields at the node's level (those below minimum, if it is)
    unknown: tuple[str, ...]       # fields the node did not report

    @property
    def tier(self) -> str:
        return "unknown" if self.level is None else tier_name(self.level)

    def field(self, name: str) -> FieldTier:
        return next(f for f in self.fields if f.field == name)

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "level": self.level, "limited_by": list(self.limited_by),
                "unknown": list(self.unknown),
                "fields": [{**asdict(f), "tier": f.tier} for f in self.fields]}


def _level(passes: list[bool]) -> int:
    """Number of consecutive tiers met from the bottom."""
    level = 0
    for ok in passes:
        if not ok:
            break
        level += 1
    return level


def _field(name: str, value: str, passes: list[bool], needs: list[str]) -> FieldTier:
    level = _level(passes)
    return FieldTier(name, value, level, needs[level] if level < len(TIERS) else "")


def gpu_meets(gpu: GPUInfo, reference: GPUClass) -> bool:
    """Whether a GPU is at least the reference part: as much memory, and as fast when its model
    is known (an unknown model is judged by memory alone)."""
    if gpu.memory_total_mb is None:
        return False
    if gpu.memory_total_mb < reference.memory_gb * 1024 * GPU_MEMORY_TOLERANCE:
        return False
    cls = gpu_class(gpu.name)
    return cls is None or cls.bf16_tflops >= reference.bf16_tflops


def _gpu_summary(gpus: list[GPUInfo]) -> str:
    if not gpus:
        return "none"
    counts = Counter((g.name, g.memory_total_mb) for g in gpus)
    return ", ".join(f"{n}x {name} ({mem} MiB)" if mem else f"{n}x {name}"
                     for (name, mem), n in counts.items())


def _usable_gpus(facts: NodeFacts, node: Node | None) -> list[GPUInfo]:
    """The GPUs training may use: those listed in the node's ``gpus`` setting, else all."""
    if node is None or node.gpus is None:
        return list(facts.gpus)
    return [g for g in facts.gpus if g.index in node.gpus]


def _storage(facts: NodeFacts) -> FieldTier:
    nvme = [d for d in facts.disks if d.get("nvme")]
    if not facts.disks and "disks" in facts.fact_errors:
        return FieldTier("storage", "not reported", None)
    gb = sum(d["size_gb"] for d in nvme)
    value = (f"{gb / 1000:.1f} TB NVMe ({len(nvme)} drives)" if nvme else
             "no NVMe (" + ", ".join(f"{d['name']} {d['size_gb']:.0f} GB" for d in facts.disks)
             + ")")
    passes = [gb >= t.nvme_tb * 1000 * SIZE_TOLERANCE for t in TIERS]
    return _field("storage", value, passes, [f"{t.nvme_tb:g} TB NVMe" for t in TIERS])


def _network(facts: NodeFacts) -> FieldTier:
    links = [i for i in facts.net if i.get("kind") in ("physical", "infiniband")]
    speeds = [i["speed_mbps"] for i in links if i.get("speed_mbps")]
    active = [p for p in facts.rdma_ports if p.get("state") == "ACTIVE"]
    ib = [p for p in active if p.get("link_layer") == "InfiniBand"]
    ib_gbps = max((p.get("rate_gbps") or 0 for p in ib), default=0)
    rdma_gbps = max((p.get("rate_gbps") or 0 for p in active), default=0)
    gbps = max([s / 1000 for s in speeds] + [rdma_gbps], default=0)
    if not gbps and not active:
        names = ", ".join(i["name"] for i in links) or "no physical interface"
        return FieldTier("network", f"speed not reported ({names})", None,
                         "a link speed in /sys/class/net/*/speed")
    parts = [f"{gbps:g} Gb/s"]
    if active:
        parts.append(f"RDMA {', '.join(sorted({p['device'] for p in active}))}")
    if ib:
        parts.append(f"InfiniBand {ib_gbps:g} Gb/s")
    passes = []
    for t in TIERS:
        fast = (ib_gbps if t.infiniband else gbps) >= t.net_gbps
        passes.append(fast and (bool(active) or not t.rdma) and (bool(ib) or not t.infiniband))
    needs = [f"{t.net_gbps:g} Gb/s" + (" InfiniBand" if t.infiniband else " RDMA" if t.rdma else "")
             for t in TIERS]
    return _field("network", ", ".join(parts), passes, needs)


def tier_of(facts: NodeFacts, node: Node | None = None) -> TierResult:
    """Place one node in the guide's table; ``node`` (its cluster entry) limits the GPUs counted
    to those it lists."""
    out: list[FieldTier] = []
    if facts.cpu_cores is None:
        out.append(FieldTier("cpu", "not reported", None))
    else:
        out.append(_field("cpu", f"{facts.cpu_cores} cores",
                          [facts.cpu_cores >= t.cores for t in TIERS],
                          [f"{t.cores} cores" for t in TIERS]))
    if facts.mem_total_mb is None:
        out.append(FieldTier("ram", "not reported", None))
    else:
        gb = facts.mem_total_mb / 1024
        out.append(_field("ram", f"{gb:.0f} GB", [gb >= t.ram_gb * SIZE_TOLERANCE for t in TIERS],
                          [f"{t.ram_gb} GB" for t in TIERS]))
    gpus = _usable_gpus(facts, node)
    out.append(_field(
        "gpu", _gpu_summary(gpus),
        [sum(gpu_meets(g, _reference(t.gpu)) for g in gpus) >= t.gpu_count for t in TIERS],
        [f"{t.gpu_count}x {t.gpu} or better" for t in TIERS]))
    out.append(_storage(facts))
    out.append(_network(facts))
    known = [f for f in out if f.level is not None]
    level = min(f.level for f in known) if known else None
    return TierResult(level, tuple(out),
                      tuple(f.field for f in known if f.level == level),
                      tuple(f.field for f in out if f.level is None))


# ---------------------------------------------------------------- consistency


class Verdict(str, Enum):
    """Ready to train; degraded (it will run, worse than it should); not ready (it will fail)."""

    READY = "ready"
    DEGRADED = "degraded"
    NOT_READY = "not ready"

    @property
    def rank(self) -> int:
        return list(Verdict).index(self)


@dataclass(frozen=True)
class CheckedField:
    """A fact that must be the same on every node; ``verdict`` is what a difference costs."""

    name: str
    label: str
    note: str
    verdict: Verdict


_COLLECTIVES = ("mixed versions break collective communication (NCCL/gloo) between ranks: "
                "install the same version on every node")
CONSISTENCY_FIELDS: tuple[CheckedField, ...] = (
    CheckedField("gpu_model", "GPU model",
                 "mixed GPU models: the slowest GPU sets the pace and memory limits differ per "
                 "rank", Verdict.DEGRADED),
    CheckedField("driver", "NVIDIA driver",
                 "mixed drivers can break NCCL between nodes: install the same driver",
                 Verdict.DEGRADED),
    CheckedField("cuda", "CUDA (driver)",
                 "the drivers support different CUDA versions", Verdict.DEGRADED),
    CheckedField("torch", "torch", _COLLECTIVES, Verdict.NOT_READY),
    CheckedField("torch_cuda", "torch CUDA", _COLLECTIVES, Verdict.NOT_READY),
    CheckedField("nccl", "NCCL", _COLLECTIVES, Verdict.NOT_READY),
    CheckedField("deepspeed", "DeepSpeed", _COLLECTIVES, Verdict.NOT_READY),
    CheckedField("funasr", "FunASR",
                 "mixed FunASR versions build different models and data pipelines per rank",
                 Verdict.NOT_READY),
    CheckedField("python", "Python version", _COLLECTIVES, Verdict.NOT_READY),
    CheckedField("python_path", "Python path",
                 "torchrun runs the same command on every node: the training Python must be at "
                 "the same path", Verdict.DEGRADED),
    CheckedField("shared_dir", "shared_dir mounted",
                 "every node must see shared_dir (data, checkpoints, resume)", Verdict.NOT_READY),
)


def consistency_values(facts: NodeFacts) -> dict[str, str]:
    """The compared values of one node ("missing" where the node has none)."""
    gpu = facts.gpus[0] if facts.gpus else None
    py = facts.python or {}
    shared = facts.shared or {}
    names = sorted({g.name for g in facts.gpus})
    values = {
        "gpu_model": " + ".join(names) if names else None,
        "driver": gpu.driver_version if gpu else None,
        "cuda": gpu.cuda_driver_version if gpu else None,
        "torch": py.get("torch"), "torch_cuda": py.get("torch_cuda"), "nccl": py.get("nccl"),
        "deepspeed": py.get("deepspeed"), "funasr": py.get("funasr"),
        "python": py.get("version"), "python_path": py.get("executable"),
        "shared_dir": "mounted" if shared.get("exists") else "missing",
    }
    return {k: "missing" if v is None else str(v) for k, v in values.items()}


@dataclass(frozen=True)
class Mismatch:
    """A fact that differs between nodes: every node's value, the majority's, and the nodes that
    differ from it."""

    field: str
    label: str
    values: dict[str, str]
    majority: str
    odd: tuple[str, ...]
    note: str
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "odd": list(self.odd), "verdict": self.verdict.value}


def consistency(facts: dict[str, NodeFacts], prefer: str | None = None) -> list[Mismatch]:
    """The facts that differ between nodes with known facts (fresh or stale).

    The majority value is taken as the reference; on a tie, ``prefer``'s (the master) wins.
    """
    known = {n: f for n, f in facts.items() if f.ok or f.stale}
    if len(known) < 2:
        return []
    values = {n: consistency_values(f) for n, f in known.items()}
    out = []
    for spec in CONSISTENCY_FIELDS:
        per_node = {n: v[spec.name] for n, v in values.items()}
        if len(set(per_node.values())) < 2:
            continue
        counts = Counter(per_node.values())
        top = max(counts.values())
        tied = [v for v, c in counts.items() if c == top]
        majority = per_node[prefer] if prefer in per_node and per_node[prefer] in tied else tied[0]
        odd = tuple(n for n, v in per_node.items() if v != majority)
        out.append(Mismatch(spec.name, spec.label, per_node, majority, odd, spec.note,
                            spec.verdict))
    return out


# ---------------------------------------------------------------- readiness


@dataclass(frozen=True)
class Reason:
    """Why a node or the cluster is not fully ready. ``code`` is stable (for scripts):
    unreachable, no_gpu, gpus_missing, below_minimum, training_stack, cpu_torch, no_shared_dir,
    not_shared, mismatch, clock; a reason with verdict ready is a note."""

    code: str
    message: str
    verdict: Verdict

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "verdict": self.verdict.value}


def _worst(reasons: list[Reason]) -> Verdict:
    return max((r.verdict for r in reasons), key=lambda v: v.rank, default=Verdict.READY)


@dataclass
class NodeReport:
    node: str
    verdict: Verdict
    reasons: list[Reason]
    tier: TierResult | None
    facts: NodeFacts

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "verdict": self.verdict.value,
                "reasons": [r.to_json() for r in self.reasons],
                "tier": self.tier.to_json() if self.tier else None,
                "stale": self.facts.stale, "collected_at": self.facts.collected_at}


@dataclass
class Report:
    """The readiness of a cluster: a verdict per node and one for the cluster, with reasons."""

    cluster: str
    verdict: Verdict
    reasons: list[Reason]
    nodes: dict[str, NodeReport]
    mismatches: list[Mismatch] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "verdict": self.verdict.value,
                "reasons": [r.to_json() for r in self.reasons],
                "nodes": {n: r.to_json() for n, r in self.nodes.items()},
                "mismatches": [m.to_json() for m in self.mismatches]}


#: Packages without which the training cannot start.
TRAINING_STACK = ("torch", "deepspeed", "funasr")
#: Clock offsets beyond this (after the measurement's uncertainty) are worth a note.
CLOCK_NOTE_S = 2.0


def _same_machine(facts: dict[str, NodeFacts]) -> bool:
    ids = {(f.machine_id, f.boot_id) for f in facts.values() if f.ok or f.stale}
    return len(ids) == 1 and None not in next(iter(ids))


def _addresses(facts: NodeFacts, node: Node | None) -> set[str]:
    names = {facts.hostname or "", node.host if node else ""}
    for iface in facts.net:
        names.update(a.split("/")[0] for a in iface.get("addrs") or [])
    return {n for n in names if n}


def _shared_reasons(facts: NodeFacts, cluster: Cluster, everyone: dict[str, NodeFacts],
                    head_addrs: set[str]) -> list[Reason]:
    shared = facts.shared
    if shared is None:
        why = facts.fact_errors.get("shared", "not reported")
        return [Reason("no_shared_dir", f"shared_dir: {why}", Verdict.NOT_READY)]
    path = shared.get("path") or cluster.shared_dir
    if not shared.get("exists"):
        return [Reason("no_shared_dir", f"shared_dir {path} does not exist", Verdict.NOT_READY)]
    if shared.get("is_nfs"):
        server = shared.get("server")
        if head_addrs and server not in head_addrs:
            return [Reason("not_shared", f"shared_dir is NFS from {server}, not from the head "
                                         f"node", Verdict.READY)]
        return []
    if shared.get("shared_fs") or len(cluster.nodes) < 2 or _same_machine(everyone):
        return []
    if facts.node == _head_name(cluster):
        servers = {(f.shared or {}).get("server") for f in everyone.values()}
        if servers & _addresses(facts, cluster.node(facts.node)):
            return []  # the head exports it
    return [Reason("not_shared",
                   f"shared_dir {path} is on local {shared.get('fstype')} "
                   f"({shared.get('source')}), not shared with the other nodes: checkpoints "
                   f"and resume need shared storage", Verdict.DEGRADED)]


def _head_name(cluster: Cluster) -> str:
    heads = [n.name for n in cluster.nodes if n.role == "head"]
    return heads[0] if heads else cluster.master_node.name


def _stack_reasons(facts: NodeFacts) -> list[Reason]:
    py = facts.python
    if py is None:
        why = facts.fact_errors.get("python", "not reported")
        return [Reason("training_stack", f"training Python: {why}", Verdict.NOT_READY)]
    out = []
    if py.get("error"):
        out.append(Reason("training_stack", py["error"], Verdict.NOT_READY))
    missing = [p for p in TRAINING_STACK if not py.get(p)]
    if py.get("executable") and missing:
        out.append(Reason("training_stack", f"{', '.join(missing)} not installed in "
                                            f"{py['executable']}", Verdict.NOT_READY))
    if facts.gpus and py.get("torch_imported") and not py.get("torch_cuda"):
        out.append(Reason("cpu_torch", f"torch {py['torch']} is a CPU build: it cannot use the "
                                       f"GPUs", Verdict.NOT_READY))
    return out


def _gpu_reasons(facts: NodeFacts, node: Node | None) -> list[Reason]:
    if not facts.gpus:
        return [Reason("no_gpu", facts.gpu_error or "no NVIDIA GPU", Verdict.NOT_READY)]
    if node is not None and node.gpus is not None:
        present = {g.index for g in facts.gpus}
        missing = [i for i in node.gpus if i not in present]
        if missing:
            return [Reason("gpus_missing", f"GPUs {missing} listed in cluster.yaml are not on "
                                           f"the node (it has {len(facts.gpus)})",
                           Verdict.NOT_READY)]
    return []


def age_text(seconds: float) -> str:
    """A short age: "40 s", "12 min", "3.5 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def assess(cluster: Cluster, facts: dict[str, NodeFacts], now: float | None = None) -> Report:
    """Readiness of every node and of the cluster from their facts (as probe_all returns them)."""
    mismatches = consistency(facts, prefer=cluster.master_node.name)
    head = _head_name(cluster)
    head_facts = facts.get(head)
    head_addrs = _addresses(head_facts, cluster.node(head)) if head_facts else set()
    reports: dict[str, NodeReport] = {}
    for name, f in facts.items():
        node = cluster.node(name) if name in cluster.names() else None
        reasons: list[Reason] = []
        if not f.ok:
            seen = f" (facts from {age_text(f.age(now))} ago)" if f.stale else ""
            reasons.append(Reason("unreachable", f"unreachable: {f.error}{seen}",
                                  Verdict.NOT_READY))
        tier = tier_of(f, node) if (f.ok or f.stale) else None
        if tier is not None:
            reasons += _gpu_reasons(f, node)
            if tier.level == 0:
                short = "; ".join(f"{t.field} {t.value} (needs {t.short_of})"
                                  for t in tier.fields if t.level == 0)
                reasons.append(Reason("below_minimum", f"below the minimum tier: {short}",
                                      Verdict.DEGRADED))
            reasons += _stack_reasons(f)
            reasons += _shared_reasons(f, cluster, facts, head_addrs)
            for m in mismatches:
                if name in m.odd:
                    reasons.append(Reason("mismatch", f"{m.label} {m.values[name]} differs from "
                                                      f"{m.majority} on the others: {m.note}",
                                          m.verdict))
            off = abs(f.clock_offset_s or 0.0) - (f.clock_uncertainty_s or 0.0)
            if f.ok and off > CLOCK_NOTE_S:
                reasons.append(Reason("clock", f"clock off by {f.clock_offset_s:+.1f} s: logs "
                                               f"from the nodes will not line up",
                                      Verdict.READY))
        reports[name] = NodeReport(name, _worst(reasons), reasons, tier, f)
    cluster_reasons = [Reason(r.code, f"{name}: {r.message}", r.verdict)
                       for name, rep in reports.items() for r in rep.reasons
                       if r.code != "mismatch"]
    cluster_reasons += [Reason("mismatch", f"{m.label} differs: "
                               + ", ".join(f"{n}={v}" for n, v in m.values.items())
                               + f" ({m.note})", m.verdict) for m in mismatches]
    if not reports:
        cluster_reasons.append(Reason("unreachable", "no node facts", Verdict.NOT_READY))
    return Report(cluster.name, _worst(cluster_reasons), cluster_reasons, reports, mismatches)
