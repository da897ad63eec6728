"""The Training screen's widgets: loss, learning-rate and gradient-sync charts, the run's
headline, the per-rank table, the event feed and the fault panel.

Every widget is given a *copy* of what it shows (frozen dataclasses and tuples made from the
metrics store under its lock), never the live store: a chart that redraws on a resize draws the
same picture, and a follower thread adding lines meanwhile cannot change it under the renderer.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from console.training.faults import GRAD_SYNC_BAD_MS, GRAD_SYNC_NORMAL_MS, Finding, Severity
from console.training.logparse import (
    BestModel,
    CheckpointSaved,
    EarlyStop,
    Eta,
    Event,
    ExceptionRaised,
    HydraError,
    NoImprovement,
    Phase,
    ValResult,
    WorkerExit,
)
from console.training.metrics import FeedItem, MetricsStore, Progress, RankStatus

Points = tuple[tuple[float, float], ...]


# ---------------------------------------------------------------------------- data copies


@dataclass(frozen=True)
class ChartData:
    """What the two charts show, copied out of the store: the mean train loss over ranks, each
    rank's train loss, the validation loss (x: total step) and each rank's learning rate."""

    mean: Points = ()
    per_rank: tuple[tuple[str, Points], ...] = ()
    val: Points = ()
    lr: tuple[tuple[str, Points], ...] = ()
    sync: tuple[tuple[str, Points], ...] = ()
    """Each rank's gradient-sync time in ms: DeepSpeed's ``bwd_allreduce`` (x: DeepSpeed step)
    where its timers are on, else the estimate (x: total step; ``sync_estimated``)."""
    sync_estimated: bool = False

    @classmethod
    def of(cls, store: MetricsStore) -> ChartData:
        def pts(name: str) -> Points:
            series = store.series(name)
            return () if series is None else tuple((p[0], p[1]) for p in series.points())

        names = store.series_names()
        rank_names = sorted((n for n in names if n.startswith("loss/rank")), key=_rank_order)
        lr_names = sorted((n for n in names if n.startswith("lr/rank")), key=_rank_order)
        timed = sorted((n for n in names if n.startswith("grad_sync_ms/rank")), key=_rank_order)
        estimated = sorted((n for n in names if n.startswith("grad_sync_est_ms/rank")),
                           key=_rank_order)
        # In step order: while a reattached follower catches up, one node's lines can run far
        # ahead of another's and the store settles some steps' means out of order.
        return cls(
            mean=tuple(sorted(((p[0], p[1]) for p in store.mean_loss()), key=lambda p: p[0])),
            per_rank=tuple((n.split("/")[1], pts(n)) for n in rank_names),
            val=pts("val_loss"),
            lr=tuple((n.split("/")[1], pts(n)) for n in lr_names),
            sync=tuple((n.split("/")[1], pts(n)) for n in (timed or estimated)),
            sync_estimated=not timed and bool(estimated))


def _rank_order(name: str) -> int:
    digits = name.rsplit("rank", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def _finite(points: Points) -> Points:
    return tuple(p for p in points if math.isfinite(p[0]) and math.isfinite(p[1]))


def robust_ylim(values: Sequence[float]) -> tuple[float, float] | None:
    """A y range that a few wild values (FunASR's 1e+14 losses) do not flatten: when the largest
    value is far above the rest, the top is cut at three times the 90th percentile. None: let
    plotext choose."""
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 5:
        return None
    p90 = finite[int(0.9 * (len(finite) - 1))]
    spread = max(abs(statistics.median(finite)), abs(p90), 1e-12)
    if finite[-1] <= 100 * spread:
        return None
    low = min(finite[0], 0.0) if finite[0] < 0 else finite[0]
    return low, max(3 * p90, low + 1e-9)


# ---------------------------------------------------------------------------- charts


class _Chart(PlotextPlot):
    """A plotext chart drawn from a :class:`ChartData` copy; ``renders`` counts its renders
    (the redraw throttle is tested on it)."""

    DEFAULT_CSS = """
    _Chart { height: 1fr; min-height: 5; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 (Textual's name)
        super().__init__(id=id)
        self.data = ChartData()
        self.per_rank = False
        self.renders = 0

    def show(self, data: ChartData, *, per_rank: bool | None = None) -> None:
        """Draw ``data`` (a copy) at the next refresh."""
        self.data = data
        if per_rank is not None:
            self.per_rank = per_rank
        self.refresh()

    def render(self) -> RenderResult:
        self.renders += 1
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        self.draw(plt)
        return super().render()

    def draw(self, plt) -> None:  # noqa: ANN001 (plotext's module-like object)
        raise NotImplementedError

    def plot_lines(self, plt, lines: Sequence[tuple[str, Points, str]],  # noqa: ANN001
                   ylim: tuple[float, float] | None = None) -> bool:
        """Plot ``lines`` ((label, points, marker) each) with a legend that never covers them:
        plotext draws it over the plot's top-left rows, so the y range gets that many rows of
        room on top. One line needs no legend (the title names it); a plot too short to spare
        the rows has none either. True when the legend is drawn."""
        lines = [(label, pts, marker) for label, pts, marker in lines if pts]
        values = [p[1] for _, pts, _ in lines for p in pts]
        rows = self.size.height - CHART_CHROME_ROWS
        room = len(lines) + 1  # the legend's rows and one between it and the data
        legend = len(lines) > 1 and rows >= 2 * room
        for label, pts, marker in lines:
            plt.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                     **({"label": label} if legend else {}))
        if not values:
            return legend
        low, high = ylim if ylim is not None else (min(values), max(values))
        if legend:
            span = (high - low) or abs(high) * 0.1 or 1.0
            high += span * room / (rows - room)
        if ylim is not None or legend:
            plt.ylim(low, high)
        return legend


#: Rows plotext draws around the plot itself: the title, the frame's top and bottom, the x
#: ticks and the x label.
CHART_CHROME_ROWS = 5


class LossChart(_Chart):
    """Train loss over total step: the mean over ranks (or each rank, toggled), and the
    validation loss."""

    def draw(self, plt) -> None:  # noqa: ANN001
        d = self.data
        trains = list(d.per_rank) if self.per_rank else [("mean", d.mean)]
        lines = [(label, _finite(points), "braille") for label, points in trains]
        lines.append(("val", _finite(d.val), "dot"))
        shown = [p[1] for _, pts, _ in lines for p in pts]
        ylim = robust_ylim(shown)
        legend = self.plot_lines(plt, lines, ylim)
        what = "per rank" if self.per_rank else "mean over ranks"
        clipped = " (spikes cut)" if ylim is not None else ""
        val = ", • validation" if d.val and not legend else ""  # no room for the legend
        plt.title(f"train loss, {what}{clipped}{val}" if shown
                  else "train loss per rank: no step line yet" if self.per_rank
                  else "train loss: no step line yet")
        plt.xlabel("total step")


class LrChart(_Chart):
    """Learning rate over total step, per rank (the ranks agree; one line unless they do not)."""

    def draw(self, plt) -> None:  # noqa: ANN001
        lines = [(label, _finite(points)) for label, points in self.data.lr]
        distinct = {pts for _, pts in lines}
        if len(distinct) == 1:
            lines = lines[:1]
        self.plot_lines(plt, [(label, pts, "braille") for label, pts in lines])
        plt.title("learning rate" if any(p for _, p in lines) else "learning rate: none yet")
        plt.xlabel("total step")


class SyncChart(_Chart):
    """Gradient-sync time per step and rank, in ms, against the guide's 6.1 thresholds (below
    500 normal, above 2000 abnormal): DeepSpeed's ``bwd_allreduce`` where wall_clock_breakdown
    is on, else the estimate (a rank's backward time less the fastest rank's)."""

    def draw(self, plt) -> None:  # noqa: ANN001
        d = self.data
        lines = [(label, _finite(points), "braille") for label, points in d.sync]
        values = [p[1] for _, pts, _ in lines for p in pts]
        if values:
            top = max(values)
            for limit, color in ((GRAD_SYNC_NORMAL_MS, "orange"), (GRAD_SYNC_BAD_MS, "red")):
                if limit <= top * 1.5:  # a limit far above the data would flatten it
                    plt.hline(limit, color)
        self.plot_lines(plt, lines, (0.0, max([*values, 1.0]) * 1.05) if values else None)
        what = ("estimated gradient sync (backward less the fastest rank's)" if d.sync_estimated
                else "gradient sync (DeepSpeed bwd_allreduce)")
        plt.title(f"{what}, ms; guide 6.1: <500 normal, >2000 abnormal" if values
                  else "gradient sync: none yet (DeepSpeed's wall_clock_breakdown times it; "
                       "else it is estimated from 2+ ranks' backward times)")
        plt.xlabel("total step" if d.sync_estimated or not values else "DeepSpeed step")


# ---------------------------------------------------------------------------- headline


def duration(seconds: float | None) -> str:
    """``42s``, ``12m05s``, ``3h07m``, ``2d04h``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def bar(done: float, total: float, width: int) -> str:
    """A text progress bar of ``width`` cells."""
    frac = 0.0 if total <= 0 else min(max(done / total, 0.0), 1.0)
    full = int(round(frac * width))
    return "█" * full + "░" * (width - full)


def progress_text(p: Progress, *, live: bool = True) -> Text:
    """Epoch and step progress, the ETA from the measured step time (``live`` runs only), the
    step time and throughput, the total step; most important first (a narrow terminal cuts the
    end)."""
    out = Text()
    if p.total_step is None:
        out.append("no step line yet", style="dim")
        return out
    if p.epoch is not None and p.max_epoch:
        out.append(f"epoch {p.epoch + 1}/{p.max_epoch} ", style="bold")
    if p.step_in_epoch is not None and p.steps_per_epoch:
        out.append(f"step {p.step_in_epoch}/{p.steps_per_epoch} ")
        out.append(bar(p.step_in_epoch, p.steps_per_epoch, 8))
    if p.finished:
        out.append(" done", style="bold green")
    elif p.eta_s is not None and live:
        out.append(f" ETA {duration(p.eta_s)}", style="bold")
    if p.step_time_s is not None and p.steps_per_s is not None:
        out.append(f" · {p.step_time_s:.2f} s/step, {p.steps_per_s:.2f} steps/s")
    out.append(f" · total step {p.total_step}")
    if p.funasr_eta_hours is not None and not p.finished and live:
        out.append(f" · FunASR ETA {p.funasr_eta_hours:.2f} h", style="dim")
    return out


# ---------------------------------------------------------------------------- rank table


RANK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "node"), ("rank", "rank"), ("step", "last step"), ("loss", "loss"),
    ("step_time", "s/step"), ("mem", "GPU mem GB"), ("since", "since"),
    ("rel", "vs median"),
)
#: A rank this much slower than the median is shown as a straggler would be.
SLOW_REL = 0.10


def _num(value: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return format(value, fmt)


def rank_cells(r: RankStatus) -> tuple[str | Text, ...]:
    """One row of the rank table: node, rank, last step, loss, step time, GPU memory (usage /
    peak), seconds since its last line, its own time a step relative to the median over ranks
    (``+34%``; console.training.stragglers)."""
    mem = "-" if r.gpu_mem_gb is None else (
        f"{r.gpu_mem_gb:.1f}" + (f"/{r.gpu_peak_gb:.1f}" if r.gpu_peak_gb is not None else ""))
    loss = Text(_num(r.loss, ".4g"), style="bold red" if r.loss is not None
                and not math.isfinite(r.loss) else "")
    since = "-" if r.seconds_since is None else f"{r.seconds_since:.0f}s"
    rel = Text("-" if r.rel_time is None else f"{r.rel_time:+.0%}",
               style="bold yellow" if r.rel_time is not None and r.rel_time > SLOW_REL else "")
    return (r.node or "?", str(r.rank), _num(r.last_step, "d") if r.last_step is not None else "-",
            loss, _num(r.step_time_s, ".2f"), mem, since, rel)


class RankTable(DataTable):
    """One row per rank, as the metrics store's rank table says."""

    DEFAULT_CSS = """
    RankTable { height: 1fr; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in RANK_COLUMNS:
            self.add_column(label, key=key)

    def show(self, ranks: Sequence[RankStatus]) -> None:
        """Replace the rows (ranks by number), keeping the cursor's row."""
        row = self.cursor_row
        self.clear()
        for r in ranks:
            self.add_row(*rank_cells(r), key=str(r.rank))
        if ranks:
            self.move_cursor(row=min(row, len(ranks) - 1))


# ---------------------------------------------------------------------------- event feed


def describe_event(event: Event) -> tuple[str, str]:
    """A feed line for ``event``: (style, words)."""
    if isinstance(event, ValResult):
        if event.improved and event.value is not None:
            before = event.best_before
            return "cyan", f"validation loss {event.value:.4f}" + (
                f" (best before {before:.4f})" if before is not None and math.isfinite(before)
                else "")
        return "yellow", (f"validation: no improvement for {event.epochs_no_improve}/"
                          f"{event.patience} epochs")
    if isinstance(event, BestModel):
        value = f" {event.value:.4f}" if event.value is not None else ""
        return "bold green", f"best model ({event.metric}{value}): {_short(event.path)}"
    if isinstance(event, CheckpointSaved):
        return "green", f"checkpoint saved: {_short(event.path)}"
    if isinstance(event, NoImprovement):
        return "yellow", f"no improvement in {event.metric}: {event.value} > {event.best}"
    if isinstance(event, EarlyStop):
        return "bold yellow", f"early stopping at epoch {event.epoch}"
    if isinstance(event, Phase):
        return "dim", f"{event.phase} epoch {event.epoch}"
    if isinstance(event, HydraError):
        return "bold red", "the job failed (Hydra: Error executing job)"
    if isinstance(event, ExceptionRaised):
        return "bold red", f"{event.exc_type}: {event.message}"
    if isinstance(event, WorkerExit):
        return "bold red", f"worker exit code {event.exitcode} (local rank {event.local_rank})"
    return "", event.text


def _short(path: str) -> str:
    """A checkpoint's name in output_dir (the plan pane shows output_dir in full)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path


#: Feed events the screen leaves out: FunASR's ETA is on the progress line.
QUIET = (Eta,)


def feed_text(items: Sequence[FeedItem], limit: int = 200) -> Text:
    """The newest ``limit`` feed items, oldest first: the line's own time, node, rank, words."""
    out = Text()
    items = [i for i in items if not isinstance(i.event, QUIET)]
    if not items:
        out.append("no event yet (validation, checkpoints, best model, early stopping)",
                   style="dim")
        return out
    for item, words, style, wheres, count in collapse_feed(items)[-limit:]:
        when = _clock(item.event.time)
        where = wheres[0] if len(wheres) == 1 else f"{len(wheres)} ranks"
        out.append(f"{when} {where:<10} ", style="dim")
        out.append(words, style=style)
        if count > 1:
            out.append(f"  ×{count}", style="bold")
        out.append("\n")
    out.rstrip()
    return out


def collapse_feed(items: Sequence[FeedItem]) -> list[tuple[FeedItem, str, str, list[str], int]]:
    """Consecutive items that say the same words (every rank's "Train epoch 3", a checkpoint
    per rank) as one line: (first item, words, style, where from, how many)."""
    out: list[tuple[FeedItem, str, str, list[str], int]] = []
    for item in items:
        e = item.event
        style, words = describe_event(e)
        where = (item.node or "?") + (f"/r{e.rank}" if e.rank is not None else "")
        if out and out[-1][1] == words:
            first, _w, _s, wheres, count = out[-1]
            out[-1] = (first, words, style, wheres if where in wheres else [*wheres, where],
                       count + 1)
        else:
            out.append((item, words, style, [where], 1))
    return out


def _clock(t: float | None) -> str:
    return "--:--:--" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


class EventFeed(Static):
    """The run's notable events (validation, checkpoints, best model, early stopping, errors)."""

    def show(self, items: Sequence[FeedItem]) -> None:
        self.update(feed_text(items))


# ---------------------------------------------------------------------------- faults


SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow",
                  Severity.INFO: "bold cyan"}


def finding_text(f: Finding, *, evidence: int = 3, width: int = 200) -> Text:
    """One finding: what, where (node/rank, line), why (detail), the evidence lines, the fix."""
    out = Text()
    out.append(f"{f.severity.value.upper()} ", style=SEVERITY_STYLE[f.severity])
    out.append(f.fault.title, style="bold")
    where = [f"node {f.node}" if f.node else "", f"rank {f.rank}" if f.rank is not None else "",
             f"line {f.line_no}" if f.line_no is not None else "",
             f"{f.count}x" if f.count > 1 else ""]
    out.append(f"  ({', '.join(w for w in where if w)})\n" if any(where) else "\n", style="dim")
    if f.detail:
        out.append(f"  {f.detail}\n")
    for line in f.evidence[:evidence]:
        cut = line if len(line) <= width else line[:width - 1] + "…"
        out.append(f"  │ {cut}\n", style="dim")
    out.append("  fix: ", style="bold green")
    out.append(f.fault.advice + "\n")
    return out


def faults_text(findings: Sequence[Finding]) -> Text:
    if not findings:
        return Text("no fault seen in the logs so far", style="dim")
    out = Text()
    for f in findings:
        out.append_text(finding_text(f))
        out.append("\n")
    out.rstrip()
    return out


class FaultPanel(Static):
    """Each finding with its evidence and its fix (errors first)."""

    def show(self, findings: Sequence[Finding]) -> None:
        self.update(faults_text(findings))


__all__ = [
    "ChartData", "EventFeed", "FaultPanel", "LossChart", "LrChart", "RANK_COLUMNS", "RankTable",
    "bar", "describe_event", "duration", "faults_text", "feed_text", "finding_text",
    "progress_text", "rank_cells", "robust_ylim",
]
