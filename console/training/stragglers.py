"""Stragglers and gradient-sync time from the ranks' own per-step timings.

FunASR logs, for every rank and step, ``data_load``, ``forward_time``, ``backward_time``,
``optim_time`` and ``total_time``. In synchronous training every rank leaves a step's gradient
all-reduce together, so ``total_time`` is about the same on every rank; what differs is where the
time went. A rank that is slow (its data, its forward, a frozen process) arrives late at the
all-reduce in its backward (and the all-gather in the optimizer step under ZeRO): the others
wait there, and their ``backward_time`` / ``optim_time`` grow by that wait. So:

- **wait** of a rank at a step: its backward (optim, rest of the step) time minus the fastest
  rank's at that step;
- **busy** time: ``total_time`` minus those waits (its data_load and forward, plus the fastest
  rank's backward, optim and rest): what the rank itself spent;
- **straggler** (the rule Megatron-LM uses): over the last ``window`` steps that every rank
  reported (default 20, at least 5; judged once there are that many), a rank whose mean busy time is more than 1 sigma and more
  than 10% above the mean of the others, and which was the slowest at most of those steps. Its
  slow phase is the one (data_load, forward, backward, optim) furthest above the others' mean.
- **gradient-sync estimate** (when DeepSpeed's ``wall_clock_breakdown`` timers are off): the
  backward time minus the fastest rank's backward at that step, judged against the seed guide's
  6.1 thresholds (normal < 500 ms, abnormal > 2000 ms) by :func:`faults.grad_sync_verdict`.

:class:`StepTimings` keeps a bounded window of steps per rank; the metrics store feeds it and asks
it. The catalog entries for the detectors here (:data:`STRAGGLER`, :data:`RUN_STALLED`) live
here too: their findings carry them.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from console.training.faults import Fault, Severity

DEFAULT_WINDOW = 20
MIN_WINDOW = 5
PHASES = ("data_load", "forward_time", "backward_time", "optim_time")
PHASE_NAMES = {"data_load": "data_load", "forward_time": "forward", "backward_time": "backward",
               "optim_time": "optim"}
#: Phases in which a rank waits for the others (the gradient all-reduce, ZeRO's all-gather).
SYNC_PHASES = ("backward_time", "optim_time")

STRAGGLER = Fault(
    id="straggler", title="Straggler rank", severity=Severity.WARNING, detector="straggler",
    advice="The whole run goes at this rank's pace. By its slow phase: data_load: its node's "
           "storage or CPU (num_workers, page cache, NFS); forward/backward: its GPU (clocks, "
           "thermal throttling, another process on it: svconsole gpus) or CPU contention; a "
           "rank frozen now and then (swap, a debugger) shows in every phase. Compare its node "
           "with the others (svconsole nodes), and svconsole stacks RUN while it lags.",
    source="issue 16; Megatron-LM's straggler rule (1 sigma and 10%)")
RUN_STALLED = Fault(
    id="run-stalled", title="Run stalled: no step line from any rank", severity=Severity.ERROR,
    detector="stall",
    advice="Every rank stopped logging: they usually wait in a collective for one rank that is "
           "stuck, stopped or dead, or for a node they cannot reach. svconsole stacks RUN (t on "
           "the Training screen) names the rank the others wait for and what it is doing; the "
           "reachability checks name a "
           "node or port that cannot be reached. Stop the run (svconsole stop RUN) once the "
           "evidence is taken, and resume from the last checkpoint.",
    source="issue 15 item 5, issue 16")


@dataclass(frozen=True)
class Straggler:
    """A rank slower than the others over ``steps`` steps: its mean busy time against the
    others' mean and spread, and its slowest phase against the others' mean of it."""

    rank: int
    node: str | None
    busy_s: float
    others_s: float
    sigma_s: float
    phase: str
    phase_s: float
    phase_others_s: float
    steps: int
    slowest_share: float

    @property
    def excess(self) -> float:
        """How much slower than the others' mean (0.34 for 34%)."""
        return self.busy_s / self.others_s - 1 if self.others_s > 0 else math.inf

    def text(self) -> str:
        on = f" on {self.node}" if self.node else ""
        phase_pct = (f"{self.phase_s / self.phase_others_s - 1:+.0%}"
                     if self.phase_others_s > 0 else "from ~0")
        return (f"rank {self.rank}{on} is a straggler: {self.busy_s:.3f} s a step of its own "
                f"against {self.others_s:.3f} s for the others ({self.excess:+.0%}, "
                f"{_sigmas(self.busy_s - self.others_s, self.sigma_s)}) over the last "
                f"{self.steps} steps, slowest at {self.slowest_share:.0%} of them; slow phase "
                f"{PHASE_NAMES[self.phase]}: {self.phase_s:.3f} s against {self.phase_others_s:.3f}"
                f" s ({phase_pct})")


def _sigmas(diff: float, sigma: float) -> str:
    return f"{diff / sigma:.1f} sigma" if sigma > 0 else "the others agree exactly"


class StepTimings:
    """The last ``window`` steps' timings of every rank (``window`` at least :data:`MIN_WINDOW`).
    Not thread-safe by itself: the metrics store calls it under its lock."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < MIN_WINDOW:
            raise ValueError(f"straggler window must be at least {MIN_WINDOW} steps, got {window}")
        self.window = window
        self._steps: dict[int, OrderedDict[int, Mapping[str, float | None]]] = {}
        self._nodes: dict[int, str | None] = {}
        self._estimated: set[int] = set()

    def add(self, rank: int, node: str | None, step: int,
            timings: Mapping[str, float | None]) -> dict[int, float] | None:
        """Take one rank's timings at one step. When this completes the step (every rank known
        reported it), return each rank's estimated gradient-sync wait in ms at that step."""
        steps = self._steps.setdefault(rank, OrderedDict())
        self._nodes[rank] = node if node is not None else self._nodes.get(rank)
        if step in steps:
            return None
        steps[step] = dict(timings)
        while len(steps) > 2 * self.window:
            steps.popitem(last=False)
        if len(self._steps) < 2 or step in self._estimated:
            return None
        if not all(step in s for s in self._steps.values()):
            return None
        self._estimated.add(step)
        if len(self._estimated) > 4 * self.window:
            self._estimated = set(sorted(self._estimated)[-2 * self.window:])
        backward = {r: _num(s[step].get("backward_time")) for r, s in self._steps.items()}
        if any(v is None for v in backward.values()):
            return None
        fastest = min(v for v in backward.values() if v is not None)
        return {r: 1000.0 * (v - fastest) for r, v in backward.items() if v is not None}

    def common_steps(self) -> list[int]:
        """The last ``window`` steps that every rank reported, in order."""
        if len(self._steps) < 2:
            return []
        shared = set.intersection(*(set(s) for s in self._steps.values()))
        return sorted(shared)[-self.window:]

    def _busy(self, steps: list[int]) -> dict[int, list[float]]:
        """Each rank's own time at each step: its data_load and forward, plus the fastest
        rank's backward, optim and the rest of the step (logging, validation, checkpoints, the
        barriers around them): whatever a rank spends beyond the fastest in those phases is
        (or cannot be told from) waiting for the others."""
        out: dict[int, list[float]] = {r: [] for r in self._steps}
        for step in steps:
            rows = {r: s[step] for r, s in self._steps.items()}
            parts = {r: _parts(t) for r, t in rows.items()}
            shared = {c: min(p[c] for p in parts.values()) for c in (*SYNC_PHASES, "rest")}
            for r, p in parts.items():
                out[r].append(p["data_load"] + p["forward_time"] + sum(shared.values()))
        return out

    def busy_means(self) -> dict[int, float]:
        """Each rank's mean busy time over the common steps (empty below the minimum)."""
        steps = self.common_steps()
        if len(steps) < MIN_WINDOW:
            return {}
        return {r: statistics.fmean(v) for r, v in self._busy(steps).items()}

    def relative(self) -> dict[int, float]:
        """Each rank's busy time relative to the median over ranks (0.34 for +34%)."""
        means = self.busy_means()
        if len(means) < 2:
            return {}
        median = statistics.median(means.values())
        return {r: (m / median - 1 if median > 0 else 0.0) for r, m in means.items()}

    def stragglers(self, *, rel: float = 0.10, sigmas: float = 1.0,
                   min_excess_s: float = 0.005) -> list[Straggler]:
        """The ranks that are stragglers by the rule in the module's documentation."""
        steps = self.common_steps()
        if len(steps) < self.window or len(self._steps) < 2:
            return []  # judged over a full window only: a few noisy steps name nobody
        busy = self._busy(steps)
        means = {r: statistics.fmean(v) for r, v in busy.items()}
        slowest = [max(busy, key=lambda r, i=i: busy[r][i]) for i in range(len(steps))]
        out = []
        for r, mine in means.items():
            others = [m for o, m in means.items() if o != r]
            mean_o = statistics.fmean(others)
            sigma = statistics.pstdev(others) if len(others) > 1 else 0.0
            share = slowest.count(r) / len(steps)
            if not (mine > (1 + rel) * mean_o and mine - mean_o > sigmas * sigma
                    and mine - mean_o >= min_excess_s and share >= 0.5):
                continue
            phase, value, other_value = self._slow_phase(r, steps)
            out.append(Straggler(r, self._nodes.get(r), mine, mean_o, sigma, phase, value,
                                 other_value, len(steps), share))
        return out

    def _slow_phase(self, rank: int, steps: list[int]) -> tuple[str, float, float]:
        best = ("forward_time", 0.0, 0.0, -math.inf)
        for phase in PHASES:
            mine = _mean(self._steps[rank][s].get(phase) for s in steps)
            theirs = [_mean(st[s].get(phase) for s in steps)
                      for r, st in self._steps.items() if r != rank]
            theirs = [t for t in theirs if t is not None]
            if mine is None or not theirs:
                continue
            other = statistics.fmean(theirs)
            if mine - other > best[3]:
                best = (phase, mine, other, mine - other)
        return best[0], best[1], best[2]


def _parts(timings: Mapping[str, float | None]) -> dict[str, float]:
    """A step's phases (0 where missing) and ``rest``: total_time less the phases."""
    parts = {p: _num(timings.get(p)) or 0.0 for p in PHASES}
    total = _num(timings.get("total_time"))
    parts["rest"] = max(0.0, total - sum(parts.values())) if total is not None else 0.0
    return parts


def _num(value: object) -> float | None:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _mean(values) -> float | None:
    got = [v for v in (_num(x) for x in values) if v is not None]
    return statistics.fmean(got) if got else None


__all__ = ["DEFAULT_WINDOW", "MIN_WINDOW", "RUN_STALLED", "STRAGGLER", "StepTimings",
           "Straggler"]
