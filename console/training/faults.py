"""The fault catalog: what goes wrong in multi-node SenseVoice training, how to see it, what to do.

The catalog (:data:`CATALOG`) is data: one :class:`Fault` per known failure, with regex signatures
over log lines, or the name of a detector over metrics, or a trigger over a DeepSpeed config, the
advice, and the versions it was seen with. The training screen's fault panel and the config
editor read the same list:

- :func:`scan_lines` finds faults in log lines (with the lines as evidence, node, rank, line),
- :func:`config_incompatibilities` finds configs known to fail with the installed versions,
- :class:`LossWatch`, :func:`stalled_ranks`, :func:`grad_sync_verdict` and :func:`low_gpu_util`
  are the detectors over metrics (the metrics store calls them).

Severity and advice follow the seed guide's tables 6.1/6.2 and what real runs showed
(``shared/notes/domain.md``, the H200 readings).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from console.training.logparse import parse_line


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class VersionRange:
    """``package`` at a version ``>= low`` and ``< below`` (either may be open); ``seen`` is the
    exact version the fault was observed with. ``if_unknown``: whether the fault is reported
    (as unconfirmed) when the version is not known."""

    package: str
    low: str | None = None
    below: str | None = None
    seen: str | None = None
    if_unknown: bool = True

    def contains(self, version: str) -> bool:
        v = version_tuple(version)
        if self.low is not None and v < version_tuple(self.low):
            return False
        return not (self.below is not None and v >= version_tuple(self.below))

    def __str__(self) -> str:
        parts = [f">={self.low}" if self.low else "", f"<{self.below}" if self.below else ""]
        text = f"{self.package} {','.join(p for p in parts if p)}".strip()
        return f"{text} (seen with {self.seen})" if self.seen else text


def version_tuple(version: str) -> tuple[int, ...]:
    """``'1.4.16'`` -> ``(1, 4, 16)``; a suffix such as ``+cu128`` or ``rc1`` ends the numbers."""
    out: list[int] = []
    for part in re.split(r"[.+]", version.strip()):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.end() < len(part):
            break
    return tuple(out)


#: A config trigger: given a DeepSpeed config, the evidence (a short text) when it applies.
ConfigTrigger = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Fault:
    """One entry of the catalog.

    ``signatures`` are regexes searched in each log line; ``detector`` names the metrics
    detector that reports it (``loss``, ``stall``, ``grad_sync``, ``gpu_util``); ``versions``
    restrict a config trigger to the versions it is known for; ``config_trigger`` tells the
    config editor which configs cause it."""

    id: str
    title: str
    severity: Severity
    advice: str
    signatures: tuple[str, ...] = ()
    detector: str | None = None
    versions: tuple[VersionRange, ...] = ()
    config_trigger: ConfigTrigger | None = None
    source: str = ""


@dataclass(frozen=True)
class Finding:
    """A fault seen: the catalog entry, the lines or readings that show it, where."""

    fault: Fault
    evidence: tuple[str, ...]
    node: str | None = None
    rank: int | None = None
    line_no: int | None = None
    detail: str = ""
    count: int = 1

    @property
    def id(self) -> str:
        return self.fault.id

    @property
    def severity(self) -> Severity:
        return self.fault.severity

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.fault.id, "title": self.fault.title,
                "severity": self.fault.severity.value, "advice": self.fault.advice,
                "node": self.node, "rank": self.rank, "line": self.line_no,
                "count": self.count, "detail": self.detail, "evidence": list(self.evidence)}


# --- config triggers ------------------------------------------------------------------------


def _bf16_enabled(cfg: Mapping[str, Any]) -> str | None:
    section = cfg.get("bf16") or cfg.get("bfloat16")
    if isinstance(section, Mapping) and section.get("enabled") in (True, "true", "auto"):
        return f'bf16.enabled = {section.get("enabled")!r}'
    return None


def _adam_without_torch_adam(cfg: Mapping[str, Any]) -> str | None:
    opt = cfg.get("optimizer")
    if not isinstance(opt, Mapping):
        return None
    kind = str(opt.get("type", "")).lower()
    params = opt.get("params") or {}
    if kind in ("adam", "adamw") and not (isinstance(params, Mapping) and params.get("torch_adam")):
        return f'optimizer.type = {opt.get("type")!r} without "torch_adam": true (FusedAdam)'
    return None


# --- the catalog ----------------------------------------------------------------------------

CATALOG: tuple[Fault, ...] = (
    Fault(
        id="connection-reset", title="Node connection reset", severity=Severity.ERROR,
        signatures=(r"ConnectionResetError", r"Connection reset by peer"),
        advice="A peer dropped the connection. Check the firewall rules between the nodes "
               "(master port and NCCL ports) and raise the timeouts (DEEPSPEED_TIMEOUT, "
               "minutes); see whether a node died first.",
        source="seed 6.2"),
    Fault(
        id="connection-timeout", title="Connection timed out (errno 110)", severity=Severity.ERROR,
        signatures=(r"rrno:? ?110\b", r"Connection timed out",
                    r"client socket has timed out after \d+m?s while trying to connect"),
        advice="A node could not reach the master: usually a firewall dropping the master port, or "
               "a wrong --master-addr / network interface (NCCL_SOCKET_IFNAME, "
               "GLOO_SOCKET_IFNAME). Open the port on the master and check the address.",
        source="domain notes"),
    Fault(
        id="nccl-watchdog-timeout", title="NCCL collective timed out", severity=Severity.ERROR,
        signatures=(r"Watchdog caught collective operation timeout",),
        advice="A collective (all-reduce) waited past its timeout: one rank is stuck, dead or far "
               "slower (data loading, a full disk, another node's failure). Look for the first "
               "rank that stopped logging; check the interconnect (NCCL_DEBUG=INFO).",
        source="domain notes"),
    Fault(
        id="cuda-oom", title="CUDA out of memory", severity=Severity.ERROR,
        signatures=(r"CUDA out of memory", r"torch\.(?:cuda\.)?OutOfMemoryError"),
        advice="Lower dataset_conf.batch_size (tokens per batch) or train_micro_batch_size_per_gpu, "
               "enable bf16 where the GPU and FunASR version allow it, or a higher ZeRO stage.",
        source="seed 6.2"),
    Fault(
        id="host-oom-kill", title="Worker killed (exit code -9, host out of memory)",
        severity=Severity.ERROR,
        signatures=(r"exitcode\s*:\s*-9\b", r"Signal 9 \(SIGKILL\) received",
                    r"Out of memory: Killed process"),
        advice="The kernel's OOM killer (or an operator) sent SIGKILL. Check the node's RAM "
               "(dmesg); lower dataset_conf.num_workers and the prefetch, and make sure no other "
               "job shares the host.",
        source="domain notes"),
    Fault(
        id="module-not-found", title="Python module missing on a node", severity=Severity.ERROR,
        signatures=(r"ModuleNotFoundError: No module named",),
        advice="This node runs a different Python or environment than the others. Point the "
               "cluster's training python at the same venv/conda env on every node and compare "
               "versions (svconsole check).",
        source="domain notes"),
    Fault(
        id="deepspeed-batch-assertion", title="DeepSpeed batch sizes do not add up",
        severity=Severity.ERROR,
        signatures=(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step",),
        advice="train_batch_size must equal train_micro_batch_size_per_gpu x "
               "gradient_accumulation_steps x world size (nodes x GPUs). Set two of them and let "
               "DeepSpeed derive the third, or fix the world size.",
        source="DeepSpeed runtime/config.py"),
    Fault(
        id="bf16-dtype-mismatch", title="bf16 dtype mismatch in FunASR's forward",
        severity=Severity.ERROR,
        signatures=(r"must have the same dtype, but got \w+ and BFloat16",
                    r"must have the same dtype, but got BFloat16 and \w+"),
        versions=(VersionRange("funasr", low="1.4", below="1.5", seen="1.4.16"),),
        config_trigger=_bf16_enabled,
        advice="FunASR 1.4.x feeds float32 inputs to a bf16 DeepSpeed engine and the first step "
               "fails (also with ++train_conf.use_bf16=true). Train in fp32 (bf16.enabled false) "
               "with this FunASR version.",
        source="H200 run, funasr 1.4.16"),
    Fault(
        id="fusedadam-jit-arch", title="FusedAdam JIT build fails on the GPU arch list",
        severity=Severity.ERROR,
        signatures=(r"invalid literal for int\(\) with base 10: '\d*a'",),
        versions=(VersionRange("deepspeed", seen="0.19.8"),
                  VersionRange("compute_capability", low="9.0", below="10.0", if_unknown=False)),
        config_trigger=_adam_without_torch_adam,
        advice='DeepSpeed\'s FusedAdam JIT cannot parse an arch like "9.0a" (Hopper). Add '
               '"torch_adam": true to optimizer.params, or remove the optimizer block so '
               "FunASR's torch optimizer is used, or set TORCH_CUDA_ARCH_LIST without the suffix.",
        source="H200 run, deepspeed 0.19.8"),
    Fault(
        id="node-unreachable", title="Node unreachable", severity=Severity.ERROR,
        signatures=(r"No route to host", r"Host is unreachable", r"rrno:? ?113\b",
                    r"Name or service not known", r"nfs: server \S+ not responding",
                    r"Stale file handle"),
        advice="Check the node's network and its NFS mount of the shared directory; restart the "
               "node or its training processes, then resume from output_dir/model.pt.",
        source="seed 6.2"),
    Fault(
        id="loss-divergence", title="Loss spike or nan", severity=Severity.WARNING,
        signatures=(r"\(loss_avg_rank: (?:nan|-?inf)\)",),
        detector="loss",
        advice="Gradients exploded: enable gradient clipping (gradient_clipping in the DeepSpeed "
               "config), lower the learning rate or lengthen the warmup, and check the data.",
        source="seed 6.2"),
    Fault(
        id="stalled-rank", title="Rank stopped logging", severity=Severity.ERROR,
        detector="stall",
        advice="This rank is silent while the others go on: it may be hung in data loading, "
               "swapping, or its node is failing. Check the node (svconsole nodes) and its GPU; "
               "an NCCL timeout usually follows.",
        source="domain notes"),
    Fault(
        id="slow-gradient-sync", title="Slow gradient synchronisation", severity=Severity.WARNING,
        detector="grad_sync",
        advice="bwd_allreduce above 500 ms per step (bad above 2000 ms): check the inter-node "
               "bandwidth and NCCL settings (NCCL_IB_*, NCCL_SOCKET_IFNAME), raise "
               "allgather/reduce bucket sizes, use gradient accumulation.",
        source="seed 6.1"),
    Fault(
        id="low-gpu-util", title="GPU utilisation below 50%", severity=Severity.WARNING,
        detector="gpu_util",
        advice="The GPUs wait for data or for each other: raise dataset_conf.batch_size, "
               "num_workers (CPU cores / 2), check data loading and storage throughput.",
        source="seed 6.1; H200 run at batch 6000 sat at 10-60%"),
    Fault(
        id="bf16-unsupported-gpu", title="bf16 on a GPU without bf16", severity=Severity.ERROR,
        config_trigger=_bf16_enabled,
        versions=(VersionRange("compute_capability", below="8.0", if_unknown=False),),
        advice="bf16 needs compute capability 8.0 or newer (A100, H100, RTX 30xx); V100 and T4 "
               "do not have it. Use fp16 or fp32 on these GPUs.",
        source="domain notes"),
    Fault(
        id="job-failed", title="Training job failed", severity=Severity.ERROR,
        signatures=(r"Error executing job with overrides:", r"ChildFailedError: "),
        advice="The trainer exited with an error; the exception above it names the cause.",
        source="Hydra / torchrun"),
)

_BY_ID = {f.id: f for f in CATALOG}
_INDEX = {f.id: i for i, f in enumerate(CATALOG)}


def fault(fault_id: str) -> Fault:
    """The catalog entry with this id (``KeyError`` if there is none)."""
    return _BY_ID[fault_id]


#: Every signature compiled, with its entry. Searched one by one: each starts with a literal,
#: which the regex engine finds fast; one big alternation would be many times slower.
_SIGNATURES: tuple[tuple[Fault, re.Pattern[str]], ...] = tuple(
    (f, re.compile(s)) for f in CATALOG for s in f.signatures)

#: How many evidence lines a finding keeps (the first ones; ``count`` says how many matched).
MAX_EVIDENCE = 5


def match_line(text: str) -> list[Fault]:
    """The catalog entries whose signatures appear in this line (usually none)."""
    found: list[Fault] = []
    for f, pattern in _SIGNATURES:
        if (not found or found[-1] is not f) and pattern.search(text):
            found.append(f)
    return found


class FindingCollector:
    """Gathers matches into findings: one per (fault, node, rank), keeping the first
    :data:`MAX_EVIDENCE` lines and a count."""

    def __init__(self) -> None:
        self._findings: dict[tuple[str, str | None, int | None], Finding] = {}

    def add(self, fault_: Fault, evidence: str, *, node: str | None, rank: int | None,
            line_no: int | None, detail: str = "") -> Finding:
        key = (fault_.id, node, rank)
        old = self._findings.get(key)
        if old is None:
            new = Finding(fault_, (evidence,), node, rank, line_no, detail)
        else:
            kept = old.evidence if len(old.evidence) >= MAX_EVIDENCE else (*old.evidence, evidence)
            new = Finding(fault_, kept, node, rank, old.line_no, old.detail or detail,
                          old.count + 1)
        self._findings[key] = new
        return new

    def findings(self) -> list[Finding]:
        return sorted(self._findings.values(), key=_finding_order)


def _finding_order(f: Finding) -> tuple[int, int, int]:
    """Errors first; among equals, catalog order (specific causes before ``job-failed``)."""
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return order[f.severity], _INDEX[f.id], f.line_no if f.line_no is not None else 0


def scan_lines(lines: Iterable[str], node: str | None = None, rank: int | None = None, *,
               start_line: int = 1) -> list[Finding]:
    """Faults whose signatures appear in ``lines`` (one log, e.g. one node's). Each finding
    names the node, the rank (``rank`` if given, else the line's own ``[rankN]:``/``rank: N``)
    and the first line number; errors first, specific causes before generic ones."""
    collector = FindingCollector()
    for line_no, text in enumerate(lines, start_line):
        text = text.rstrip("\n")
        matched = match_line(text)
        if not matched:
            continue
        line_rank = rank if rank is not None else parse_line(text).rank
        for f in matched:
            collector.add(f, text, node=node, rank=line_rank, line_no=line_no)
    return collector.findings()


def config_incompatibilities(ds_config: Mapping[str, Any],
                             versions: Mapping[str, str]) -> list[Finding]:
    """Known failures this DeepSpeed config would run into with these versions.

    ``versions`` maps package names (``funasr``, ``deepspeed``, ``torch``) and optionally
    ``compute_capability`` (e.g. ``"9.0"``) to versions. An entry whose version constraint
    names a package that ``versions`` lacks applies (marked unconfirmed in ``detail``) unless the
    constraint says otherwise (``if_unknown``).
    """
    out: list[Finding] = []
    for f in CATALOG:
        if f.config_trigger is None:
            continue
        evidence = f.config_trigger(ds_config)
        if evidence is None:
            continue
        notes: list[str] = []
        applies = True
        for vr in f.versions:
            have = versions.get(vr.package)
            if have is None:
                applies = applies and vr.if_unknown
                notes.append(f"{vr.package} version unknown; known for {vr}")
            elif vr.contains(have):
                notes.append(f"{vr.package} {have}")
            else:
                applies = False
        if applies:
            out.append(Finding(f, (evidence,), detail="; ".join(notes)))
    return out


# --- detectors over metrics -----------------------------------------------------------------


class LossWatch:
    """Flags a loss that is nan/inf, or far above the running median of the last ``window``
    values: above ``median + max(mad_factor * MAD, rel_factor * |median|)``. FunASR's token
    batches make the loss noisy (a real run swung between 26 and 169), so the bar is high."""

    def __init__(self, window: int = 50, min_points: int = 10, mad_factor: float = 8.0,
                 rel_factor: float = 2.0) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.min_points = min_points
        self.mad_factor = mad_factor
        self.rel_factor = rel_factor

    def observe(self, loss: float | None) -> str | None:
        """Take the next loss; return why it is a spike, or ``None``."""
        if loss is None:
            return None
        if not math.isfinite(loss):
            return f"loss is {loss}"
        reason = None
        if len(self.values) >= self.min_points:
            med = statistics.median(self.values)
            mad = statistics.median([abs(v - med) for v in self.values])
            bar = med + max(self.mad_factor * mad, self.rel_factor * abs(med), 1e-6)
            if loss > bar:
                reason = (f"loss {loss:.6g} against a running median of {med:.6g} "
                          f"over the last {len(self.values)} values")
        self.values.append(loss)
        return reason


#: Seed table 6.1: gradient synchronisation per step, in ms.
GRAD_SYNC_NORMAL_MS = 500.0
GRAD_SYNC_BAD_MS = 2000.0


def grad_sync_verdict(ms: float | None) -> str:
    """``normal`` (< 500 ms), ``elevated`` (500-2000 ms), ``bad`` (> 2000 ms) or ``unknown``."""
    if ms is None or not math.isfinite(ms):
        return "unknown"
    if ms < GRAD_SYNC_NORMAL_MS:
        return "normal"
    return "bad" if ms > GRAD_SYNC_BAD_MS else "elevated"


def stalled_ranks(last_seen: Mapping[Any, float], now: float, threshold_s: float) -> list[Any]:
    """Ranks silent for more than ``threshold_s`` while at least one other rank logged within
    it. When every rank is silent the run as a whole pauses (validation, checkpoint): no
    rank is singled out."""
    if len(last_seen) < 2:
        return []
    active = [r for r, t in last_seen.items() if now - t <= threshold_s]
    if not active:
        return []
    return sorted((r for r, t in last_seen.items() if now - t > threshold_s), key=str)


@dataclass(frozen=True)
class UtilVerdict:
    """Utilisation over a span of samples."""

    mean: float
    fraction_below: float
    samples: int
    seconds: float
    low: bool
    detail: str = ""


def low_gpu_util(timestamps: Sequence[float], util: Sequence[float], *, threshold: float = 50.0,
                 min_fraction: float = 0.8, min_seconds: float = 60.0) -> UtilVerdict | None:
    """Judge GPU utilisation (percent) sampled at ``timestamps`` (seconds) during a run: low when
    at least ``min_fraction`` of the samples are below ``threshold`` over at least
    ``min_seconds``. Pass the samples taken while training ran (idle time before the run
    would count as low). ``None`` when there are no samples."""
    pairs = [(t, u) for t, u in zip(timestamps, util, strict=True)
             if u is not None and math.isfinite(u) and t is not None]
    if not pairs:
        return None
    seconds = pairs[-1][0] - pairs[0][0]
    values = [u for _, u in pairs]
    mean = sum(values) / len(values)
    below = sum(1 for u in values if u < threshold) / len(values)
    low = below >= min_fraction and seconds >= min_seconds
    detail = (f"mean {mean:.0f}% over {seconds:.0f} s, {below:.0%} of {len(values)} samples "
              f"below {threshold:.0f}%")
    return UtilVerdict(mean, below, len(values), seconds, low, detail)
