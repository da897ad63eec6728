"""From what is true now to the alerts to send.

A :class:`Condition` is one thing wrong at this instant (a fault found, a stalled rank, a node
down, a GPU out of range, a run that ended). :func:`conditions` derives them from a run's
findings and state, the pool's node statuses and the GPU readings. :class:`AlertEngine` turns
successive sets of conditions into :class:`Alert` s: one ``firing`` alert per key (kind, node,
rank, what) once the condition has held for its rule's time, then nothing while it holds, and
one ``resolved`` alert when it clears. A run's end is told once and never resolves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from console.alerts.rules import AlertRules

Kind = Literal["fault", "stall", "straggler", "run", "node-down", "gpu"]
State = Literal["firing", "resolved"]

#: Fault ids that are their own kind of alert (the detectors'), not "a fault found".
STALL_IDS = frozenset({"stalled-rank", "stall", "run-stalled"})
STRAGGLER_IDS = frozenset({"straggler", "straggler-rank"})
#: Findings that only say the job or a worker died: the run's end tells that, with the cause.
GENERIC_IDS = frozenset({"job-failed", "worker-exit", "worker-failed"})
#: Longest alert text and evidence line sent (a Hydra override line runs to kilobytes).
MAX_TEXT, MAX_EVIDENCE_LINE, MAX_EVIDENCE = 300, 500, 5


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _evidence(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(clip(line, MAX_EVIDENCE_LINE) for line in list(lines)[:MAX_EVIDENCE])


@dataclass(frozen=True)
class Condition:
    """One thing wrong now. ``key`` identifies it across evaluations; ``hold_s``: how long it
    must hold before it is told; ``once``: told once and never resolved (a run's end)."""

    kind: Kind
    what: str
    severity: str
    title: str
    text: str
    node: str | None = None
    rank: int | None = None
    fault_id: str | None = None
    evidence: tuple[str, ...] = ()
    hold_s: float = 0.0
    once: bool = False
    started: float | None = None
    """When it began, where that is known (a node's status says since when it is down)."""

    @property
    def key(self) -> tuple[str, str | None, int | None, str]:
        return (self.kind, self.node, self.rank, self.what)


@dataclass(frozen=True)
class Alert:
    """What the sinks send."""

    state: State
    condition: Condition
    cluster: str
    run: str | None
    at: float
    since: float
    suppressed: int = 0
    """Messages this sink left out before this one (rate limit), set by the dispatcher."""

    @property
    def summary(self) -> str:
        c = self.condition
        where = " ".join(p for p in (c.node or "", f"rank {c.rank}" if c.rank is not None else "")
                         if p)
        head = "RESOLVED" if self.state == "resolved" else c.severity.upper()
        text = f"[svconsole {self.cluster}] {head}: {c.title}"
        if where:
            text += f" ({where})"
        if self.run:
            text += f", run {self.run}"
        if self.state == "resolved":
            text += f": cleared after {_duration(self.at - self.since)}"
        elif c.text:
            text += f": {c.text}"
        if self.suppressed:
            text += f" [{self.suppressed} earlier alert(s) left out by the rate limit]"
        return text

    def to_dict(self) -> dict[str, Any]:
        c = self.condition
        return {"schema": "svconsole.alert/1", "state": self.state, "kind": c.kind,
                "severity": c.severity, "title": c.title, "text": c.text,
                "summary": self.summary, "cluster": self.cluster, "run": self.run,
                "node": c.node, "rank": c.rank, "fault_id": c.fault_id,
                "evidence": list(c.evidence), "at": _iso(self.at), "since": _iso(self.since),
                "key": "/".join("" if p is None else str(p) for p in c.key),
                "suppressed": self.suppressed}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@dataclass
class _Held:
    condition: Condition
    since: float
    told: bool = False


@dataclass
class AlertEngine:
    """Conditions in, alerts out (see the module docstring)."""

    cluster: str
    run: str | None = None
    clock: Any = time.time
    _held: dict[tuple[str, str | None, int | None, str], _Held] = field(default_factory=dict)
    _told_once: set[tuple[str, str | None, int | None, str]] = field(default_factory=set)

    def evaluate(self, now_true: Iterable[Condition], now: float | None = None) -> list[Alert]:
        now = self.clock() if now is None else now
        current: dict[tuple[str, str | None, int | None, str], Condition] = {}
        for c in now_true:
            current.setdefault(c.key, c)
        out: list[Alert] = []
        for key, c in current.items():
            if c.once:
                if key not in self._told_once:
                    self._told_once.add(key)
                    out.append(Alert("firing", c, self.cluster, self.run, now, now))
                continue
            held = self._held.get(key)
            if held is None:
                held = self._held[key] = _Held(c, min(now, c.started or now))
            else:
                held.condition = c   # the newest evidence and text
            if not held.told and now - held.since >= c.hold_s:
                held.told = True
                out.append(Alert("firing", c, self.cluster, self.run, now, held.since))
        for key in [k for k in self._held if k not in current]:
            held = self._held.pop(key)
            if held.told:
                out.append(Alert("resolved", held.condition, self.cluster, self.run, now,
                                 held.since))
        return out

    def firing(self) -> list[Condition]:
        """The conditions told and not yet resolved."""
        return [h.condition for h in self._held.values() if h.told]


# ------------------------------------------------------------------------ conditions


def finding_conditions(findings: Sequence[Any], rules: AlertRules) -> list[Condition]:
    """Conditions from a run's findings (:class:`console.training.faults.Finding`): stalls,
    stragglers (held ``straggler_minutes``) and faults of error severity."""
    out: list[Condition] = []
    for f in findings:
        fid = f.id
        evidence = _evidence(f.evidence)
        detail = clip(f.detail or (evidence[0] if evidence else ""), MAX_TEXT)
        if fid in STALL_IDS:
            if rules.stall:
                out.append(Condition("stall", fid, "error", f.fault.title, detail, f.node,
                                     f.rank, fid, evidence))
        elif fid in STRAGGLER_IDS:
            if rules.straggler_minutes > 0:
                out.append(Condition("straggler", fid, "warning", f.fault.title, detail,
                                     f.node, f.rank, fid, evidence,
                                     hold_s=rules.straggler_minutes * 60))
        elif fid in GENERIC_IDS:
            continue
        elif rules.fault and getattr(f.severity, "value", f.severity) == "error":
            out.append(Condition("fault", fid, "error", f.fault.title,
                                 clip(f"{detail} Fix: {f.fault.advice}", MAX_TEXT * 2), f.node,
                                 f.rank, fid,
                                 evidence))
    return out


#: A run's end states and how they are told.
_ENDS = {"finished": ("info", "run finished"), "failed": ("error", "run failed"),
         "stopped": ("warning", "run stopped"), "lost": ("error", "run lost")}


def run_end_condition(state: str, rules: AlertRules, findings: Sequence[Any] = (),
                      detail: str = "") -> Condition | None:
    """The one-shot condition of a run that ended (None while it runs). A failed run carries
    its first error finding's id and evidence, so the page says why."""
    if not rules.run_end or state not in _ENDS:
        return None
    severity, title = _ENDS[state]
    cause = next((f for f in findings if getattr(f.severity, "value", f.severity) == "error"),
                 None)
    text = detail
    fault_id, evidence = None, ()
    if cause is not None and state != "finished":
        fault_id, evidence = cause.id, _evidence(cause.evidence)
        where = " ".join(p for p in (cause.node or "",
                                     f"rank {cause.rank}" if cause.rank is not None else "")
                         if p)
        text = f"{cause.fault.title}" + (f" on {where}" if where else "") + \
            (f": {detail}" if detail else "") + f". Fix: {cause.fault.advice}"
    return Condition("run", state, severity, title, text, fault_id=fault_id, evidence=evidence,
                     once=True)


def node_conditions(statuses: Mapping[str, Any], rules: AlertRules) -> list[Condition]:
    """A node not up (pool :class:`NodeStatus`), held ``node_down_s`` from when it went down."""
    if rules.node_down_s <= 0:
        return []
    out = []
    for name, st in statuses.items():
        state = getattr(st.state, "value", st.state)
        if state in ("up", "unknown", "connecting"):
            continue
        out.append(Condition("node-down", "down", "error", "node down",
                             f"{state}: {st.reason}" if st.reason else str(state), name,
                             hold_s=rules.node_down_s, started=st.since))
    return out


def gpu_conditions(readings: Mapping[str, Sequence[Any]], rules: AlertRules, *,
                   in_run: bool) -> list[Condition]:
    """GPUs outside the guide's 6.1 thresholds, during a run only (outside a run nothing is an
    alarm), held ``gpu_minutes``. ``readings``: node -> its latest GPU readings."""
    if not in_run or rules.gpu_minutes <= 0:
        return []
    from console.gpu.telemetry import judge_gpu

    out = []
    for node, gpus in readings.items():
        for g in gpus:
            verdicts = judge_gpu(g, in_run=True)
            for what, v in (("utilisation", verdicts.util), ("memory", verdicts.memory)):
                if v.alarming:
                    out.append(Condition("gpu", f"gpu{g.index}-{what}", v.level.value,
                                         f"GPU {g.index} {what} out of range", v.advice, node,
                                         hold_s=rules.gpu_minutes * 60))
            if g.temp_c is not None and g.temp_c >= GPU_TEMP_ALARM_C:
                out.append(Condition("gpu", f"gpu{g.index}-temperature", "warn",
                                     f"GPU {g.index} temperature out of range",
                                     f"{g.temp_c:.0f} °C (alarm at {GPU_TEMP_ALARM_C:.0f} °C)",
                                     node, hold_s=rules.gpu_minutes * 60))
    return out


#: Temperature at which a GPU in a run counts as out of range (the guide's 6.1 table stops at
#: utilisation and memory; datacenter parts start to slow down around 85 °C).
GPU_TEMP_ALARM_C = 85.0

