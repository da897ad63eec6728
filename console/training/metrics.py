"""The metrics of one training run, fed by parsed log events, bounded in memory.

:class:`MetricsStore` takes :mod:`console.training.logparse` events (from any node, in any order of
ranks) and keeps, per rank and total step, the loss, learning rate, FunASR's stats list, its
timings and GPU memory; validation losses; DeepSpeed's gradient synchronisation time; an event
feed (validation, checkpoints, best model, early stopping, errors) and the faults seen.

Memory stays bounded however long the run: each chart series is a :class:`Series` of at most
``capacity`` buckets that merge pairwise as points arrive, each keeping the min, max and mean of
its points, so a one-step spike is still visible after a million steps. The whole history goes
to a CSV file on disk as it arrives (one row per step line); :meth:`MetricsStore.to_csv` copies
it out.

The mean train loss over ranks is kept per total step as a running sum of the ranks that
reported that step, for the latest ``mean_window`` steps: a rank whose line comes late (a
reattached follower reads one node's log far ahead of another's) still joins its step's mean, whose
point is updated in place. Beyond that window the oldest steps are final and go to the bounded
``loss/mean`` series, in step order; a rank reporting a step that is already final is left out of
its mean. Validation results (``current_val: X``) are keyed by the validation they belong to, from
the same node's log: its epoch (``Validate epoch: E`` or the val lines) and total step (the val
lines', else the node's last train line), so a result read late is charted where it belongs and a
result read twice is not charted twice.

Derived figures: the mean train loss over ranks per step, the step time (FunASR's measured
``total_time``, else the time between successive lines), throughput, an ETA from the measured step
time, per-rank status (last step, loss, step time, GPU memory, seconds since its last line),
and the detectors of :mod:`console.training.faults` (loss spikes, stalled ranks, slow gradient sync, low GPU
utilisation). Exports: CSV, JSON (nan as null) and PNG (matplotlib, imported when needed).

The store is thread-safe: followers add from their threads while a screen reads.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import math
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from console.atomic import atomic_write
from console.training import faults
from console.training.faults import Finding, FindingCollector
from console.training.logparse import (
    BestModel,
    CheckpointSaved,
    DeepSpeedTimers,
    EarlyStop,
    Eta,
    Event,
    ExceptionRaised,
    HydraError,
    NoImprovement,
    Phase,
    StepEvent,
    ValResult,
    ValStep,
    WorkerExit,
    json_number,
)
from console.training.stragglers import (
    DEFAULT_WINDOW,
    RUN_STALLED,
    STRAGGLER,
    StepTimings,
    Straggler,
)


def json_safe(value: Any) -> Any:
    """``value`` with every nan/inf float (at any depth) replaced by ``None``."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# --- bounded series -------------------------------------------------------------------------


@dataclass
class Bucket:
    """Consecutive points merged: x range, count, and min/max/mean of the y values. nan values
    are counted in ``nans`` and left out of min, max and mean."""

    x_first: float
    x_last: float
    count: int = 0
    nans: int = 0
    total: float = 0.0
    low: float = math.nan
    high: float = math.nan

    @property
    def mean(self) -> float:
        n = self.count - self.nans
        return self.total / n if n else math.nan

    def add(self, x: float, y: float) -> None:
        self.x_last = x
        self.count += 1
        if math.isnan(y):
            self.nans += 1
            return
        self.total += y
        self.low = y if math.isnan(self.low) else min(self.low, y)
        self.high = y if math.isnan(self.high) else max(self.high, y)

    def merge(self, other: Bucket) -> None:
        self.x_last = other.x_last
        self.count += other.count
        self.nans += other.nans
        self.total += other.total
        for y in (other.low, other.high):
            if not math.isnan(y):
                self.low = y if math.isnan(self.low) else min(self.low, y)
                self.high = y if math.isnan(self.high) else max(self.high, y)


class Series:
    """A chart series of at most ``capacity`` buckets. While fewer points than that have come,
    every point is its own bucket; beyond, neighbours merge pairwise and each bucket covers twice
    as many points. ``x`` should grow (total step); a smaller x simply starts a new bucket."""

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 2:
            raise ValueError(f"Series capacity must be at least 2, got {capacity}")
        self.capacity = capacity
        self.buckets: list[Bucket] = []
        self.per_bucket = 1
        self.count = 0
        self.last: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self.buckets)

    def add(self, x: float, y: float) -> None:
        self.count += 1
        self.last = (x, y)
        tail = self.buckets[-1] if self.buckets else None
        if tail is not None and tail.count < self.per_bucket and x >= tail.x_last:
            tail.add(x, y)
            return
        bucket = Bucket(x, x)
        bucket.add(x, y)
        self.buckets.append(bucket)
        if len(self.buckets) > self.capacity:
            self._halve()

    def _halve(self) -> None:
        merged: list[Bucket] = []
        for i in range(0, len(self.buckets), 2):
            head = self.buckets[i]
            if i + 1 < len(self.buckets):
                head.merge(self.buckets[i + 1])
            merged.append(head)
        self.buckets = merged
        self.per_bucket *= 2

    def copy(self) -> Series:
        """An independent copy (to add points to without touching this one)."""
        twin = Series(self.capacity)
        twin.buckets = [replace(b) for b in self.buckets]
        twin.per_bucket, twin.count, twin.last = self.per_bucket, self.count, self.last
        return twin

    def points(self) -> list[tuple[float, float, float, float]]:
        """``(x, mean, min, max)`` per bucket; x is the bucket's last x."""
        return [(b.x_last, b.mean, b.low, b.high) for b in self.buckets]

    def to_dict(self) -> dict[str, Any]:
        pts = self.points()
        return json_safe({"count": self.count, "x": [p[0] for p in pts],
                          "mean": [p[1] for p in pts], "min": [p[2] for p in pts],
                          "max": [p[3] for p in pts]})


# --- the store ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankStatus:
    """One row of the per-rank table."""

    rank: int
    node: str | None
    epoch: int | None
    last_step: int | None
    loss: float | None
    lr: float | None
    step_time_s: float | None
    gpu_mem_gb: float | None
    gpu_peak_gb: float | None
    grad_sync_ms: float | None
    seconds_since: float | None
    rel_time: float | None = None
    """Its own time a step (the step time less its waits for the others) relative to the
    median over ranks: 0.34 for +34% (:mod:`console.training.stragglers`)."""
    grad_sync_est_ms: float | None = None
    """Estimated gradient-sync wait (backward less the fastest rank's), median of the last
    steps; used where DeepSpeed's timers are off."""


@dataclass(frozen=True)
class Progress:
    """Where the run is. ``eta_s`` comes from the measured step time; ``funasr_eta_hours`` is
    FunASR's own last estimate."""

    epoch: int | None
    max_epoch: int | None
    step_in_epoch: int | None
    steps_per_epoch: int | None
    total_step: int | None
    step_time_s: float | None
    steps_per_s: float | None
    eta_s: float | None
    funasr_eta_hours: float | None
    finished: bool


@dataclass(frozen=True)
class FeedItem:
    """A notable event for the feed, with the node whose log it came from."""

    node: str | None
    received: float
    event: Event


#: Event types shown in the feed.
FEED_TYPES = (Phase, CheckpointSaved, BestModel, ValResult, NoImprovement, EarlyStop, Eta,
              HydraError, ExceptionRaised, WorkerExit)

#: Columns of the history CSV (one row per train/val line; stats as a JSON object).
HISTORY_COLUMNS = (
    "received", "time", "node", "kind", "rank", "epoch", "max_epoch", "data_slice", "data_slices",
    "step_in_slice", "steps_in_slice", "step_in_epoch", "total_step", "loss", "loss_avg_slice",
    "ppl", "acc", "lr", "data_load", "forward_time", "backward_time", "optim_time", "total_time",
    "mem_usage_gb", "mem_peak_gb", "mem_cache_gb", "mem_cache_peak_gb", "stats", "line",
)
_TIMING_KEYS = ("data_load", "forward_time", "backward_time", "optim_time", "total_time")


@dataclass(frozen=True)
class SilentRank:
    """One rank in a run stall: its last step line, and how long ago it came."""

    rank: int
    node: str | None
    last_step: int | None
    silent_s: float | None
    text: str | None
    line_no: int | None


@dataclass(frozen=True)
class RunStall:
    """No step line from any rank for ``silent_s`` (> ``threshold_s``), or none at all within
    the start-up allowance (``startup``). ``behind``: the ranks whose last step is the lowest
    when the ranks' last steps differ (the ones the others wait for, most likely). ``since``: the
    time of the last step line (the stall's identity: a new step ends it)."""

    since: float
    silent_s: float
    threshold_s: float
    startup: bool
    ranks: tuple[SilentRank, ...]
    behind: tuple[int, ...]
    median_step_s: float | None

    def detail(self) -> str:
        if self.startup:
            return (f"no step line from any rank {self.silent_s:.0f} s after the start (start-up "
                    f"allowance {self.threshold_s:.0f} s)")
        step = (f"3 x median step {self.median_step_s:.2f} s" if self.median_step_s
                else "no step time yet")
        out = (f"no step line from any rank for {self.silent_s:.0f} s (threshold "
               f"{self.threshold_s:.0f} s: the larger of {step} and the minimum); ranks "
               f"{', '.join(str(r.rank) for r in self.ranks)} stopped logging")
        if self.behind:
            lows = [r for r in self.ranks if r.rank in self.behind]
            top = max((r.last_step or 0) for r in self.ranks)
            out += (f"; behind: {', '.join(map(_where, lows))} at step {lows[0].last_step}, "
                    f"the others at step {top}")
        return out

    def evidence(self) -> tuple[str, ...]:
        """Each silent rank's last step line and its age (the first 16 ranks)."""
        out = tuple(f"{_where(r)}, {r.silent_s:.0f} s ago: {r.text}" for r in self.ranks[:16])
        if len(self.ranks) > 16:
            out += (f"... and {len(self.ranks) - 16} more ranks",)
        return out


def _where(r: SilentRank) -> str:
    """``rank 1 on node1``."""
    return f"rank {r.rank}" + (f" on {r.node}" if r.node else "")


@dataclass
class _StepMean:
    """The running sum of one step's losses over the ranks that reported it."""

    total: float = 0.0
    ranks: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.ranks


@dataclass
class _ValContext:
    """Where one node's log stands, for the validation result that follows in it: the epoch of
    the validation under way (``None`` while training) and the total step of its last step line."""

    epoch: int | None = None
    step: int | None = None


#: Validation results kept (one per validation: one per epoch); beyond, the earliest are dropped.
MAX_VAL_POINTS = 10_000


class _RankState:
    """What the store tracks for one rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.node: str | None = None
        self.last: StepEvent | None = None
        self.last_seen: float | None = None
        self.gaps: deque[float] = deque(maxlen=20)
        self.step_times: deque[float] = deque(maxlen=20)
        self.grad_sync: deque[float] = deque(maxlen=20)
        self.grad_sync_est: deque[float] = deque(maxlen=20)
        self.last_step_seen: float | None = None
        """When its last step line (train or val) came."""
        self.watch = faults.LossWatch()
        self.last_grad_line: DeepSpeedTimers | None = None
        self.ds_steps = 0
        self.mean_step: int | None = None
        """The last step this rank added to the mean over ranks."""

    def seen(self, received: float) -> None:
        if self.last_seen is not None:
            self.gaps.append(received - self.last_seen)
        self.last_seen = received


class MetricsStore:
    """Metrics of one run. ``history_path``: the CSV the full history is appended to (a
    temporary file when ``None``). ``capacity``: buckets per chart series. ``stall_after_s``:
    silence after which a rank counts as stalled while others log (default: ten times the
    rank's usual gap between lines, at least ``min_stall_s``). ``mean_window``: steps whose mean
    over ranks stays open for ranks still to report them (see the module's documentation)."""

    def __init__(self, history_path: str | Path | None = None, *, capacity: int = 1000,
                 max_events: int = 500, clock: Callable[[], float] = time.time,
                 stall_after_s: float | None = None, min_stall_s: float = 60.0,
                 gpu_samples: int = 7200, mean_window: int = 4096,
                 min_run_stall_s: float = 60.0, startup_allowance_s: float = 900.0,
                 early_stall_s: float = 20.0, startup_quiet_s: float = 30.0,
                 straggler_window: int = DEFAULT_WINDOW) -> None:
        if mean_window < 1:
            raise ValueError(f"mean_window must be at least 1, got {mean_window}")
        self.capacity = capacity
        self.mean_window = mean_window
        self.clock = clock
        self.stall_after_s = stall_after_s
        self.min_stall_s = min_stall_s
        self.min_run_stall_s = min_run_stall_s
        self.startup_allowance_s = startup_allowance_s
        self.early_stall_s = early_stall_s
        self.startup_quiet_s = startup_quiet_s
        self._started_at: float | None = None
        self._ended = False
        self._last_step_at: float | None = None
        self._last_line_at: float | None = None
        self._diagnosis: tuple[float, str, int | None, str | None] | None = None
        self._early: tuple[RunStall, str, int | None, str | None] | None = None
        """A suspected stall the ranks confirmed (:meth:`confirm_stall`)."""
        self._timings = StepTimings(straggler_window)
        self._attached: dict[str, Finding] = {}
        self._amended: dict[tuple[str, str | None, int | None], Callable[[Finding], Finding]] = {}
        self.revision = 0
        self._lock = threading.RLock()
        self._series: dict[str, Series] = {}
        self._ranks: dict[int, _RankState] = {}
        self._open_means: dict[int, _StepMean] = {}
        self._open_steps: list[int] = []
        """The keys of ``_open_means`` as a heap: the oldest open step is settled first."""
        self._final_step: int | None = None
        """The newest step whose mean is final (in the ``loss/mean`` series)."""
        self._val_context: dict[str | None, _ValContext] = {}
        self._val_points: dict[tuple[str, int], tuple[int, float]] = {}
        self._max_step = 0
        self._feed: deque[FeedItem] = deque(maxlen=max_events)
        self._findings = FindingCollector()
        self._scanners: dict[str | None, faults.FaultScanner] = {}
        """One fault scanner per node's log (ranks, wrapped messages, causes), one collector."""
        self.scan_contexts: dict[str | None, faults.ScanContext] = {}
        """What the fault scanner of each node's log knows of the run (its rank offset, the
        master's address and port): ``faults.scan_contexts(record.plan)``; set before lines."""
        self._gpu: dict[tuple[str | None, int], deque[tuple[float, float]]] = {}
        self._gpu_samples = gpu_samples
        self._last_eta: Eta | None = None
        self._finished = False
        self.history_path = Path(history_path) if history_path is not None else None
        self._history: IO[str] = self._open_history()
        self._writer = csv.writer(self._history)
        self._last_flush = 0.0

    # -- input ---------------------------------------------------------------------------

    def add(self, event: Event, *, node: str | None = None,
            received: float | None = None) -> None:
        """Take one parsed log line from ``node``'s log."""
        received = self.clock() if received is None else received
        with self._lock:
            self.revision += 1
            self._last_line_at = received if self._last_line_at is None \
                else max(self._last_line_at, received)
            state = self._rank(event.rank, node, received) if event.rank is not None else None
            matched = self._scanner(node).feed(event.text, line_no=event.line_no, event=event)
            if isinstance(event, StepEvent):
                self._add_step(event, node, received, state, matched)
            elif isinstance(event, DeepSpeedTimers) and state is not None:
                self._add_timers(event, state)
            elif isinstance(event, ValResult) and event.value is not None:
                self._add_val_result(event.value, node)
            elif isinstance(event, Phase) and event.phase == "validate":
                self._val_at(node).epoch = event.epoch
            if isinstance(event, Eta):
                self._last_eta = event
            if isinstance(event, EarlyStop):
                self._finished = True
            if isinstance(event, FEED_TYPES):
                self._feed.append(FeedItem(node, received, event))

    def _scanner(self, node: str | None) -> faults.FaultScanner:
        scanner = self._scanners.get(node)
        if scanner is None:
            scanner = self._scanners[node] = faults.FaultScanner(
                self.scan_contexts.get(node) or faults.ScanContext(node=node), self._findings)
        return scanner

    def add_all(self, events: Iterable[Event], *, node: str | None = None) -> None:
        for event in events:
            self.add(event, node=node)

    def add_gpu_sample(self, node: str | None, gpu: int, t: float, util: float) -> None:
        """One utilisation reading (percent) of a GPU, for the low-utilisation detector."""
        with self._lock:
            samples = self._gpu.setdefault((node, gpu), deque(maxlen=self._gpu_samples))
            samples.append((t, util))

    def _rank(self, rank: int, node: str | None, received: float) -> _RankState:
        state = self._ranks.get(rank)
        if state is None:
            state = self._ranks[rank] = _RankState(rank)
            state.node = node
        state.seen(received)
        return state

    def _line(self, name: str) -> Series:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = Series(self.capacity)
        return series

    def _add_step(self, ev: StepEvent, node: str | None, received: float,
                  state: _RankState | None, matched: list[faults.Fault]) -> None:
        self._write_history(ev, node, received)
        if ev.total_step is None or state is None:
            return
        r, x = state.rank, ev.total_step
        state.node = node if node is not None else state.node
        context = self._val_at(node)
        context.step = x
        context.epoch = ev.epoch if isinstance(ev, ValStep) else None
        state.last_step_seen = received
        self._last_step_at = received if self._last_step_at is None \
            else max(self._last_step_at, received)
        if isinstance(ev, ValStep):
            if ev.loss is not None:
                self._line(f"val_loss/rank{r}").add(x, ev.loss)
            return
        self._max_step = max(self._max_step, x)
        self._record_step_time(ev, state)
        if ev.timings:
            waits = self._timings.add(r, node, x, ev.timings)
            for rank, ms in (waits or {}).items():
                other = self._ranks.get(rank)
                if other is not None:
                    other.grad_sync_est.append(ms)
                    self._line(f"grad_sync_est_ms/rank{rank}").add(x, ms)
        state.last = ev
        for name, value in self._step_values(ev):
            if value is not None:
                self._line(f"{name}/rank{r}").add(x, value)
        if ev.loss is not None:
            self._add_to_mean(x, ev.loss, state)
            reason = state.watch.observe(ev.loss)
            spike = faults.fault("loss-divergence")
            if reason is not None and spike not in matched:
                self._findings.add(spike, ev.text, node=node, rank=r, line_no=ev.line_no,
                                   detail=reason)

    @staticmethod
    def _step_values(ev: StepEvent) -> Iterable[tuple[str, float | None]]:
        yield "loss", ev.loss
        yield "lr", ev.lr
        yield "mem/usage_gb", ev.mem_usage_gb
        yield "mem/peak_gb", ev.mem_peak_gb
        for key, value in ev.stats.items():
            yield f"stat/{key}", value
        for key, value in ev.timings.items():
            yield f"timing/{key}", value

    def _record_step_time(self, ev: StepEvent, state: _RankState) -> None:
        measured = ev.timings.get("total_time")
        if measured is None and state.last is not None and ev.time is not None \
                and state.last.time is not None and state.last.total_step is not None \
                and ev.total_step is not None and ev.total_step > state.last.total_step:
            measured = (ev.time - state.last.time) / (ev.total_step - state.last.total_step)
        if measured is not None and math.isfinite(measured) and measured > 0:
            state.step_times.append(measured)

    def _add_to_mean(self, step: int, loss: float, state: _RankState) -> None:
        """Add a rank's loss to its step's mean over ranks (in place: a late rank updates the
        step's point), then settle the oldest steps beyond ``mean_window``. A step this rank has
        already passed (its log read again) or a step already final is left out."""
        if state.mean_step is not None and step <= state.mean_step:
            return
        state.mean_step = step
        if self._final_step is not None and step <= self._final_step:
            return
        entry = self._open_means.get(step)
        if entry is None:
            entry = self._open_means[step] = _StepMean()
            heapq.heappush(self._open_steps, step)
            self._line("loss/mean")  # listed from the first step, filled as steps become final
        entry.total += loss
        entry.ranks += 1
        self._settle_means(self.mean_window)

    def _settle_means(self, keep: int) -> None:
        """Make final the oldest open steps' means until ``keep`` steps are open."""
        while len(self._open_means) > keep:
            step = heapq.heappop(self._open_steps)
            self._line("loss/mean").add(step, self._open_means.pop(step).mean)
            self._final_step = step

    def _val_at(self, node: str | None) -> _ValContext:
        context = self._val_context.get(node)
        if context is None:
            context = self._val_context[node] = _ValContext()
        return context

    def _add_val_result(self, value: float, node: str | None) -> None:
        """Chart a validation loss at the total step of ``node``'s log where it came (at the
        latest step seen when that log had no step line yet), keyed by its validation epoch
        (else that step): a result read again replaces its point."""
        context = self._val_at(node)
        x = context.step if context.step is not None else self._max_step
        key = ("epoch", context.epoch) if context.epoch is not None else ("step", x)
        self._val_points[key] = (x, value)
        if len(self._val_points) > MAX_VAL_POINTS:
            del self._val_points[min(self._val_points, key=lambda k: self._val_points[k][0])]
        series = self._series["val_loss"] = Series(self.capacity)
        for step, loss in sorted(self._val_points.values(), key=lambda p: p[0]):
            series.add(step, loss)

    def _add_timers(self, ev: DeepSpeedTimers, state: _RankState) -> None:
        ms = ev.allreduce_ms
        if ms is None:
            return
        state.grad_sync.append(ms)
        state.last_grad_line = ev
        state.ds_steps += 1  # one such line per optimizer step: DeepSpeed's step count
        self._line(f"grad_sync_ms/rank{state.rank}").add(state.ds_steps, ms)

    def _write_history(self, ev: StepEvent, node: str | None, received: float) -> None:
        row = {"received": received, "time": ev.time, "node": node, "kind": ev.kind,
               "rank": ev.rank, "epoch": ev.epoch, "max_epoch": ev.max_epoch,
               "data_slice": ev.data_slice, "data_slices": ev.data_slices,
               "step_in_slice": ev.step_in_slice, "steps_in_slice": ev.steps_in_slice,
               "step_in_epoch": ev.step_in_epoch, "total_step": ev.total_step, "loss": ev.loss,
               "loss_avg_slice": ev.loss_avg_slice, "ppl": ev.ppl, "acc": ev.acc, "lr": ev.lr,
               **{k: ev.timings.get(k) for k in _TIMING_KEYS},
               "mem_usage_gb": ev.mem_usage_gb, "mem_peak_gb": ev.mem_peak_gb,
               "mem_cache_gb": ev.mem_cache_gb, "mem_cache_peak_gb": ev.mem_cache_peak_gb,
               "stats": json.dumps(json_safe(ev.stats)), "line": ev.line_no}
        self._writer.writerow(["" if row[c] is None else row[c] for c in HISTORY_COLUMNS])
        if received - self._last_flush >= 1.0:
            self._history.flush()
            self._last_flush = received

    def _open_history(self) -> IO[str]:
        if self.history_path is None:
            return tempfile.TemporaryFile("w+", encoding="utf-8", newline="")
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.history_path, "a+", encoding="utf-8", newline="")  # noqa: SIM115
        if f.tell() == 0:
            csv.writer(f).writerow(HISTORY_COLUMNS)
        return f

    # -- reading -------------------------------------------------------------------------

    def series(self, name: str) -> Series | None:
        """A chart series by name: ``loss/mean``, ``loss/rank0``, ``lr/rank0``, ``val_loss``,
        ``val_loss/rank0``, ``stat/loss_ctc/rank0``, ``timing/total_time/rank0``,
        ``mem/peak_gb/rank0`` (x: total step), ``grad_sync_ms/rank0`` (x: DeepSpeed step).
        ``loss/mean`` holds the final steps only (:meth:`mean_loss` adds the open ones).
        It is the live object: read it through :meth:`Series.points`, which copies."""
        with self._lock:
            return self._series.get(name)

    def series_names(self) -> list[str]:
        with self._lock:
            return sorted(self._series)

    def mean_loss(self) -> list[tuple[float, float, float, float]]:
        """The mean train loss over ranks per step, in step order, at most ``capacity``
        points like any series: ``(x, mean, min, max)``. Open steps count with the ranks that
        reported them so far."""
        with self._lock:
            final = self._series.get("loss/mean")
            chart = final.copy() if final is not None else Series(self.capacity)
            for step in sorted(self._open_means):
                chart.add(step, self._open_means[step].mean)
            return chart.points()

    def ranks(self, now: float | None = None) -> list[RankStatus]:
        """The per-rank table, by rank."""
        now = self.clock() if now is None else now
        with self._lock:
            rows = []
            relative = self._timings.relative()
            for r in sorted(self._ranks):
                s = self._ranks[r]
                last = s.last
                rows.append(RankStatus(
                    rank=r, node=s.node, epoch=last.epoch if last else None,
                    last_step=last.total_step if last else None,
                    loss=last.loss if last else None, lr=last.lr if last else None,
                    step_time_s=statistics.median(s.step_times) if s.step_times else None,
                    gpu_mem_gb=last.mem_usage_gb if last else None,
                    gpu_peak_gb=last.mem_peak_gb if last else None,
                    grad_sync_ms=s.grad_sync[-1] if s.grad_sync else None,
                    seconds_since=now - s.last_seen if s.last_seen is not None else None,
                    rel_time=relative.get(r),
                    grad_sync_est_ms=statistics.median(s.grad_sync_est)
                    if s.grad_sync_est else None))
            return rows

    def progress(self) -> Progress:
        with self._lock:
            lead = max((s.last for s in self._ranks.values() if s.last is not None),
                       key=lambda ev: ev.total_step or 0, default=None)
            times = [statistics.median(s.step_times) for s in self._ranks.values()
                     if s.step_times]
            step_time = max(times) if times else None  # the slowest rank sets the pace
            steps_per_epoch = eta = None
            if lead is not None and lead.steps_in_slice and lead.data_slices:
                steps_per_epoch = lead.steps_in_slice * lead.data_slices
                if step_time and lead.max_epoch is not None and lead.epoch is not None \
                        and lead.step_in_epoch is not None:
                    remaining = ((lead.max_epoch - lead.epoch - 1) * steps_per_epoch
                                 + max(steps_per_epoch - lead.step_in_epoch, 0))
                    eta = max(remaining, 0) * step_time
            return Progress(
                epoch=lead.epoch if lead else None, max_epoch=lead.max_epoch if lead else None,
                step_in_epoch=lead.step_in_epoch if lead else None,
                steps_per_epoch=steps_per_epoch, total_step=lead.total_step if lead else None,
                step_time_s=step_time, steps_per_s=1.0 / step_time if step_time else None,
                eta_s=0.0 if self._finished else eta,
                funasr_eta_hours=self._last_eta.remaining_hours if self._last_eta else None,
                finished=self._finished)

    def feed(self) -> list[FeedItem]:
        """The latest notable events, oldest first."""
        with self._lock:
            return list(self._feed)

    def grad_sync(self) -> dict[str, Any]:
        """Per rank: the median ``bwd_allreduce`` over the last steps, and its verdict against
        the seed's thresholds (< 500 ms normal, > 2000 ms bad)."""
        with self._lock:
            out = {}
            for r, s in sorted(self._ranks.items()):
                if s.grad_sync:
                    med = statistics.median(s.grad_sync)
                    out[f"rank{r}"] = {"median_ms": med, "last_ms": s.grad_sync[-1],
                                       "verdict": faults.grad_sync_verdict(med)}
                elif s.grad_sync_est:
                    med = statistics.median(s.grad_sync_est)
                    out[f"rank{r}"] = {"median_ms": med, "last_ms": s.grad_sync_est[-1],
                                       "verdict": faults.grad_sync_verdict(med),
                                       "estimated": True}
            return out

    def findings(self, now: float | None = None) -> list[Finding]:
        """Faults seen in the lines, plus what the detectors say now."""
        now = self.clock() if now is None else now
        with self._lock:
            out = [self._amended[(f.id, f.node, f.rank)](f)
                   if (f.id, f.node, f.rank) in self._amended else f
                   for f in self._findings.findings()]
            out += self._run_stall_findings(now)
            out += self._stall_findings(now)
            out += self._straggler_findings()
            out += self._grad_sync_findings()
            out += self._gpu_findings()
            out += self._attached.values()
            return out

    def amend(self, fault_id: str, node: str | None, rank: int | None,
              change: Callable[[Finding], Finding]) -> None:
        """From now on, the finding of ``fault_id`` on ``node`` and ``rank`` that the lines
        made is shown through ``change`` (evidence from beyond the log: the kernel's oom-kill
        lines for a SIGKILL)."""
        with self._lock:
            self._amended[(fault_id, node, rank)] = change
            self.revision += 1

    def attach(self, key: str, finding: Finding) -> None:
        """Keep a finding that a diagnosis made (the flight recorder's, after a watchdog
        timeout) among this run's findings, under ``key`` (a later one replaces it)."""
        with self._lock:
            self._attached[key] = finding
            self.revision += 1

    # -- run stalls and stragglers ---------------------------------------------------------

    def watch_run(self, started_at: float) -> None:
        """The run started at ``started_at`` (the store's clock): no step line at all within
        ``startup_allowance_s`` of it is a stall too."""
        with self._lock:
            self._started_at = started_at

    def run_ended(self) -> None:
        """The run ended on every node: its silence is no stall."""
        with self._lock:
            self._ended = True

    def run_stall(self, now: float | None = None) -> RunStall | None:
        """The run stall now, if there is one: no step line from any rank for the larger of
        3x the median step time and ``min_run_stall_s``, or none at all within the start-up
        allowance of :meth:`watch_run`. Never once the run ended or stopped early."""
        now = self.clock() if now is None else now
        with self._lock:
            if self._ended or self._finished:
                return None
            if self._last_step_at is None:
                if self._started_at is None or now - self._started_at <= self.startup_allowance_s:
                    return None
                return RunStall(self._started_at, now - self._started_at,
                                self.startup_allowance_s, True, (), (), None)
            return self._silence(now, self.min_run_stall_s)

    def _silence(self, now: float, minimum: float) -> RunStall | None:
        """No step line from any rank for the larger of 3x the median step time and
        ``minimum``: the stall with its silent ranks (under the lock, after a first step)."""
        assert self._last_step_at is not None
        times = [statistics.median(s.step_times) for s in self._ranks.values() if s.step_times]
        median = statistics.median(times) if times else None
        threshold = max(3.0 * (median or 0.0), minimum)
        silent = now - self._last_step_at
        if silent <= threshold:
            return None
        ranks = []
        for r, st in sorted(self._ranks.items()):
            if st.last_step_seen is None:
                continue
            last = st.last
            ranks.append(SilentRank(r, st.node, last.total_step if last else None,
                                    now - st.last_step_seen, last.text if last else None,
                                    last.line_no if last else None))
        steps = {r.last_step for r in ranks if r.last_step is not None}
        behind = tuple(r.rank for r in ranks if r.last_step == min(steps)) \
            if len(steps) > 1 else ()
        return RunStall(self._last_step_at, silent, threshold, False, tuple(ranks), behind,
                        median)

    def suspected_stall(self, now: float | None = None) -> RunStall | None:
        """A silence worth a look at the ranks before it is a run stall: after a first step,
        no step line for the larger of 3x the median step time and ``early_stall_s``; before
        it, no line at all for ``startup_quiet_s`` (``since``: the last line, or the start)
        within the start-up allowance. Not a stall by itself (a checkpoint save, a JIT build
        or a checkpoint load is quiet too): the run's watch looks at the ranks, and a stopped
        rank or a port that cannot be reached makes it one at once (:meth:`confirm_stall`).
        None while :meth:`run_stall` has one."""
        now = self.clock() if now is None else now
        with self._lock:
            if self._ended or self._finished or self.run_stall(now) is not None:
                return None
            if self._last_step_at is not None:
                return self._silence(now, self.early_stall_s)
            since = self._quiet_since()
            if since is None:
                return None
            quiet = now - since
            if quiet < self.startup_quiet_s:
                return None
            return RunStall(since, quiet, self.startup_quiet_s, True, (), (), None)

    def _quiet_since(self) -> float | None:
        """Before a first step: when the last line came, or the start (under the lock)."""
        if self._started_at is None:
            return None
        return max(self._started_at, self._last_line_at or self._started_at)

    def confirm_stall(self, stall: RunStall, text: str, *, rank: int | None = None,
                      node: str | None = None) -> None:
        """The ranks show why the run went quiet (``stall``, from :meth:`suspected_stall`):
        a run stall from now on, until a line (before a first step) or a step line comes; its
        diagnosis is ``text``, naming ``rank`` on ``node``."""
        with self._lock:
            self._early = (stall, text, rank, node)
            self.set_stall_diagnosis(stall.since, text, rank=rank, node=node)

    def set_stall_diagnosis(self, since: float, text: str, *, rank: int | None = None,
                            node: str | None = None) -> None:
        """What the diagnosis of the stall that began at ``since`` found (reachability,
        stacks), with the rank and node it names; shown in that stall's finding."""
        with self._lock:
            self._diagnosis = (since, text, rank, node)
            self.revision += 1

    def stall_diagnosis(self, since: float) -> str | None:
        with self._lock:
            d = self._diagnosis
            return d[1] if d is not None and d[0] == since else None

    def _early_stall_findings(self, now: float) -> list[Finding]:
        """The confirmed stall (:meth:`confirm_stall`) while nothing came since it began."""
        e = self._early
        if e is None or self._ended or self._finished:
            return []
        stall, text, rank, node = e
        if stall.startup:
            if self._last_step_at is not None or stall.since != self._quiet_since():
                return []  # a line came since: the start-up goes on
            started = now - (self._started_at if self._started_at is not None else stall.since)
            detail = (f"no step line yet, and no line from any rank for {now - stall.since:.0f} "
                      f"s ({started:.0f} s after the start; the ranks show why before the "
                      f"start-up allowance of {self.startup_allowance_s:.0f} s)")
            evidence: tuple[str, ...] = (f"no line from any rank for {now - stall.since:.0f} s, "
                                         f"{started:.0f} s after the start",)
        else:
            now_stall = self._silence(now, 0.0) if self._last_step_at == stall.since else None
            if now_stall is None:
                return []  # a step came since
            detail = (f"no step line from any rank for {now_stall.silent_s:.0f} s (looked at "
                      f"after {stall.threshold_s:.0f} s, before the {self.min_run_stall_s:.0f} s "
                      f"minimum: the ranks show why)")
            if now_stall.behind:
                detail += "; behind: " + ", ".join(
                    _where(r) for r in now_stall.ranks if r.rank in now_stall.behind)
            evidence = now_stall.evidence()
        return [Finding(RUN_STALLED, evidence, node, rank, None, f"{detail}; diagnosis: {text}")]

    def _run_stall_findings(self, now: float) -> list[Finding]:
        stall = self.run_stall(now)
        if stall is None:
            return self._early_stall_findings(now)
        evidence = stall.evidence()
        detail = stall.detail()
        rank = stall.behind[0] if len(stall.behind) == 1 else None
        node = next((r.node for r in stall.ranks if r.rank == rank), None)
        line_no = next((r.line_no for r in stall.ranks if r.rank == rank), None)
        d = self._diagnosis
        if d is not None and d[0] == stall.since:
            detail += f"; diagnosis: {d[1]}"
            if d[2] is not None:
                rank, node, line_no = d[2], d[3], None
        return [Finding(RUN_STALLED, evidence or ("no step line yet",), node, rank, line_no,
                        detail)]

    def stragglers(self) -> list[Straggler]:
        """The straggler ranks now (:class:`console.training.stragglers.Straggler`)."""
        with self._lock:
            return self._timings.stragglers()

    def _straggler_findings(self) -> list[Finding]:
        out = []
        for s in self._timings.stragglers():
            state = self._ranks.get(s.rank)
            last = state.last if state is not None else None
            out.append(Finding(STRAGGLER, (last.text,) if last else (), s.node, s.rank,
                               last.line_no if last else None, s.text()))
        return out

    def _stall_threshold(self, state: _RankState) -> float:
        if self.stall_after_s is not None:
            return self.stall_after_s
        gap = statistics.median(state.gaps) if state.gaps else 0.0
        return max(self.min_stall_s, 10.0 * gap)

    def _stall_findings(self, now: float) -> list[Finding]:
        seen = {r: s.last_seen for r, s in self._ranks.items() if s.last_seen is not None}
        if not seen:
            return []
        threshold = max(self._stall_threshold(s) for s in self._ranks.values())
        out = []
        for r in faults.stalled_ranks(seen, now, threshold):
            s = self._ranks[r]
            freshest = min(now - t for t in seen.values())
            evidence = s.last.text if s.last is not None else f"rank {r}: no step line yet"
            out.append(Finding(faults.fault("stalled-rank"), (evidence,), s.node, r,
                               s.last.line_no if s.last else None,
                               f"rank {r} silent for {now - seen[r]:.0f} s (threshold "
                               f"{threshold:.0f} s) while another rank logged {freshest:.0f} s "
                               "ago"))
        return out

    def _grad_sync_findings(self) -> list[Finding]:
        out = []
        for r, s in sorted(self._ranks.items()):
            if not s.grad_sync and s.grad_sync_est and s.last is not None:
                med = statistics.median(s.grad_sync_est)
                verdict = faults.grad_sync_verdict(med)
                if verdict in ("elevated", "bad"):
                    out.append(Finding(faults.fault("slow-gradient-sync"), (s.last.text,),
                                       s.node, r, s.last.line_no,
                                       f"estimated gradient sync {med:.0f} ms a step (its "
                                       "backward_time less the fastest rank's; DeepSpeed's "
                                       f"wall_clock_breakdown is off) over the last "
                                       f"{len(s.grad_sync_est)} steps: {verdict}"))
                continue
            if not s.grad_sync or s.last_grad_line is None:
                continue
            med = statistics.median(s.grad_sync)
            verdict = faults.grad_sync_verdict(med)
            if verdict in ("elevated", "bad"):
                out.append(Finding(faults.fault("slow-gradient-sync"), (s.last_grad_line.text,),
                                   s.node, r, s.last_grad_line.line_no,
                                   f"median bwd_allreduce {med:.0f} ms over the last "
                                   f"{len(s.grad_sync)} steps: {verdict}"))
        return out

    def _gpu_findings(self) -> list[Finding]:
        out = []
        for (node, gpu), samples in sorted(self._gpu.items(), key=lambda kv: str(kv[0])):
            verdict = faults.low_gpu_util([t for t, _ in samples], [u for _, u in samples])
            if verdict is not None and verdict.low:
                out.append(Finding(faults.fault("low-gpu-util"),
                                   (f"GPU {gpu}: {verdict.detail}",), node, None, None,
                                   verdict.detail))
        return out

    # -- export --------------------------------------------------------------------------

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """Everything a screen or script needs, JSON-ready (nan/inf as ``None``)."""
        with self._lock:
            mean = self.mean_loss()
            return json_safe({
                "progress": asdict(self.progress()),
                "ranks": [asdict(r) for r in self.ranks(now)],
                "loss_mean": {"x": [p[0] for p in mean], "mean": [p[1] for p in mean],
                              "min": [p[2] for p in mean], "max": [p[3] for p in mean]},
                "series": {name: s.to_dict() for name, s in sorted(self._series.items())},
                "grad_sync": self.grad_sync(),
                "events": [{"node": i.node, **i.event.to_dict()} for i in self._feed],
                "findings": [f.to_dict() for f in self.findings(now)],
            })

    def to_csv(self, path: str | Path) -> Path:
        """Write the whole history (every train/val line so far) as CSV, atomically."""
        with self._lock:
            self._history.flush()
            self._history.seek(0)
            data = self._history.read()
            self._history.seek(0, io.SEEK_END)
        if self.history_path is None:
            data = ",".join(HISTORY_COLUMNS) + "\r\n" + data
        return atomic_write(path, data, backup=False)

    def to_png(self, path: str | Path, *, title: str | None = None) -> Path:
        """Loss (per rank, mean over ranks with its min-max band, validation) and learning
        rate over total step, as a PNG (matplotlib's Agg canvas; no display needed)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        with self._lock:
            mean = self.mean_loss()
            per_rank = {n: s.points() for n, s in self._series.items()
                        if n.startswith("loss/rank") or n.startswith("lr/rank")}
            val = self._series["val_loss"].points() if "val_loss" in self._series else []
        fig = Figure(figsize=(12, 5))
        FigureCanvasAgg(fig)
        ax_loss, ax_lr = fig.subplots(1, 2)
        for name, pts in sorted(per_rank.items()):
            if name.startswith("loss/"):
                ax_loss.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.6, alpha=0.5,
                             label=name.split("/")[1])
            else:
                ax_lr.plot([p[0] for p in pts], [p[1] for p in pts], label=name.split("/")[1])
        if mean:
            xs = [p[0] for p in mean]
            ax_loss.fill_between(xs, [p[2] for p in mean], [p[3] for p in mean], alpha=0.2,
                                 color="tab:blue")
            ax_loss.plot(xs, [p[1] for p in mean], lw=1.5, color="tab:blue", label="mean")
        if val:
            ax_loss.plot([p[0] for p in val], [p[1] for p in val], "o-", color="tab:red",
                         label="validation")
        finite = [abs(p[3]) for p in mean if math.isfinite(p[3])]
        if finite and max(finite) > 1e4 * max(statistics.median(finite), 1e-12):
            ax_loss.set_yscale("symlog")  # a 1e+14 spike must not flatten the rest
        ax_loss.set(title="Training loss", xlabel="total step", ylabel="loss")
        ax_lr.set(title="Learning rate", xlabel="total step", ylabel="lr")
        for ax in (ax_loss, ax_lr):
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return atomic_write(path, buf.getvalue(), backup=False)

    def close(self) -> None:
        """Flush and close the history file (a temporary one is deleted)."""
        with self._lock:
            self._settle_means(0)
            if not self._history.closed:
                self._history.close()

    def __enter__(self) -> MetricsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
