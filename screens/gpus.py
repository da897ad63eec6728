"""The GPUs screen: every GPU of the cluster, live, from one streaming agent per node.

When first shown it follows the app's one :class:`console.gpu.telemetry.Telemetry` over its pool
(``app.gpu_telemetry()``: one ``gpu_agent.py`` per node, over one SSH channel each, shared with
the Training screen). The collectors call back on their threads;
:func:`follow_telemetry` turns each update into a :class:`~screens.messages.GPUTelemetry` message
(a node's newer sample replaces its queued older one), :class:`GPUBoard` keeps what the screen
knows, and the widgets re-render from a copy of it at most twice a second, only while the screen is
shown. The app stops the agents when it exits: cancelling each stream closes its channel, and the
agent exits when its stdin closes.

Simulated data (for trying the screen without GPUs): set ``SVCONSOLE_GPU_SIMULATE`` to an
``nvml.json`` fixture (or give the app a ``gpu_simulate`` path attribute); every panel then says
SIMULATED.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.gpu.telemetry import (
    NodeStatus,
    Overview,
    Sample,
    Telemetry,
    TelemetryUpdate,
    judge_gpu,
    overview,
)
from screens.base import ConsoleScreen
from screens.gpu_widgets import GPUView, HeatGrid, NodePanel, NodeView, age_text, short_advice
from screens.messages import GPUTelemetry, RunFollowed
from screens.throttle import RedrawThrottle

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from console.training.metrics import RankStatus
    from console.training.runs import RunRecord

#: Points of history kept per GPU for the sparklines (the collectors keep an hour).
SPARK_POINTS = 120
#: The panels re-render at most this often (seconds).
RENDER_EVERY = 0.5
#: Seconds the screen waits for the collectors' threads when it stops them.


def follow_telemetry(target: MessagePump, telemetry: Telemetry) -> Callable[[], None]:
    """Post a :class:`GPUTelemetry` to ``target`` for every collector update (thread-safe);
    returns the unsubscribe function."""
    return telemetry.subscribe(lambda update: target.post_message(GPUTelemetry(update)))


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class RunView:
    """What the GPU screen uses of a followed run: node ranks and the slowest rank."""

    run_id: str
    node_ranks: dict[str, int]
    slowest: RankStatus | None = None
    live: bool = True
    """Still running: once it has ended, its GPUs are judged as outside a run."""

    @classmethod
    def of(cls, record: RunRecord, ranks: Sequence[RankStatus] = (), live: bool = True
           ) -> RunView:
        timed = [r for r in ranks if r.step_time_s is not None]
        slowest = max(timed, key=lambda r: r.step_time_s or 0.0, default=None)
        return cls(record.id, {n.node: n.node_rank for n in record.nodes}, slowest, live)


@dataclass
class NodeTrack:
    """One node as the screen knows it (mutated on the UI thread only)."""

    name: str
    status: NodeStatus = NodeStatus.STARTING
    reason: str = ""
    sample: Sample | None = None
    util: dict[int, deque[float | None]] = field(default_factory=dict)
    mem: dict[int, deque[float | None]] = field(default_factory=dict)
    version: int = 0


class GPUBoard:
    """The screen's model: per node the latest sample, its collector status and a short
    history for the sparklines; plus the followed run. Fed with :class:`TelemetryUpdate`."""

    def __init__(self, nodes: Iterable[str], *, points: int = SPARK_POINTS) -> None:
        self.points = points
        self.nodes: dict[str, NodeTrack] = {n: NodeTrack(n) for n in nodes}
        self.run: RunView | None = None

    def apply(self, update: TelemetryUpdate) -> None:
        """Take one collector update (a sample, or a status change)."""
        track = self.nodes.get(update.node)
        if track is None:
            track = self.nodes[update.node] = NodeTrack(update.node)
        track.status, track.reason = update.status, update.reason
        track.version += 1
        sample = update.sample
        if sample is None:
            return
        track.sample = sample
        for g in sample.gpus:
            for history, value in ((track.util, g.util_gpu), (track.mem, g.mem_pct)):
                history.setdefault(g.index, deque(maxlen=self.points)).append(value)

    def follow(self, run: RunView | None) -> None:
        self.run = run
        for track in self.nodes.values():
            track.version += 1

    @property
    def in_run(self) -> bool:
        """The seed's 6.1 thresholds apply: a live run of this cluster is followed, or (while
        the console follows none) torchrun ranks hold GPUs. A followed run that has ended is no
        run: its GPUs are judged as outside a run, whatever else holds them."""
        if self.run is not None:
            return self.run.live
        return any(p.rank is not None for t in self.nodes.values() if t.sample is not None
                   for g in t.sample.gpus for p in g.procs)

    def overview(self) -> Overview:
        return overview({n: t.sample for n, t in self.nodes.items()},
                        {n: t.status for n, t in self.nodes.items()}, in_run=self.in_run)

    def view(self, name: str, now: float, *, in_run: bool | None = None) -> NodeView:
        """A copy of one node for the widgets."""
        t = self.nodes[name]
        in_run = self.in_run if in_run is None else in_run
        s = t.sample
        gpus = () if s is None else tuple(
            GPUView(g, judge_gpu(g, in_run=in_run), tuple(t.util.get(g.index, ())),
                    tuple(t.mem.get(g.index, ()))) for g in s.gpus)
        return NodeView(
            name=name, status=t.status, reason=t.reason,
            age=None if s is None else max(0.0, s.age(now) or 0.0),
            simulated=bool(s and s.simulated),
            no_gpu=(s.reason or "no reason given") if s and s.no_gpu else None,
            gpus=gpus, node_rank=self.run.node_ranks.get(name) if self.run else None, in_run=in_run)

    def views(self, now: float) -> list[NodeView]:
        in_run = self.in_run
        return [self.view(n, now, in_run=in_run) for n in self.nodes]


def overview_text(ov: Overview, run: RunView | None, views: Sequence[NodeView]) -> Text:
    """The overview: the cluster's GPUs at a glance; the nodes and the run; the alarms (only
    during a run). One line each, cut with an ellipsis on a narrow terminal."""
    first = Text()
    first.append(f"GPUs {ov.gpus_in_use}/{ov.gpus_total} in use", style="bold")
    first.append(f" · util {'-' if ov.mean_util is None else f'{ov.mean_util:.0f}%'}")
    first.append(f" · {ov.total_power_w / 1000:.1f} kW" if ov.total_power_w >= 1000
                 else f" · {ov.total_power_w:.0f} W")
    if ov.hottest is not None:
        first.append(f" · hottest {ov.hottest.node}:{ov.hottest.index} {ov.hottest.temp_c:.0f}°C")
    if ov.simulated:
        first.append("  SIMULATED", style="bold black on yellow")
    second = Text(f"nodes {ov.nodes_live}/{ov.nodes_total} live")
    if run is None:
        second.append(" · slowest rank: no run", style="grey50")
    elif run.slowest is None:
        second.append(f" · run {run.run_id}: no step times yet")
    else:
        r = run.slowest
        second.append(f" · slowest: rank {r.rank} on {r.node or '?'}, {r.step_time_s:.2f} s/step",
                      style="bold")
    if ov.stale:
        ages = {v.name: v.age for v in views}
        second.append(" · stale: " + ", ".join(f"{n} ({age_text(ages.get(n))})" for n in ov.stale),
                      style="yellow")
    if ov.down:
        second.append(" · waiting: " + ", ".join(ov.down), style="grey50")
    if ov.no_gpu:
        second.append(f" · no GPU: {', '.join(ov.no_gpu)}", style="grey50")
    lines = [first, second]
    if ov.alarms:
        n = len(ov.alarms)
        lines.append(Text(f"{n} alarm{'s' if n > 1 else ''}: " + " · ".join(
            f"{a.node}:{a.index} {short_advice(a.verdict.advice)}" for a in ov.alarms[:8]),
            style="bold dark_orange"))
    text = Text("\n").join(lines)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


# ---------------------------------------------------------------------------- screen


class GPUsScreen(ConsoleScreen):
    """Cluster overview, heat grid and one panel per node."""

    HELP = (
        "Every GPU of the cluster, live: one agent per node streams NVML readings over the SSH "
        "pool (1 s). On top: GPUs in use, mean utilisation, total power, the hottest GPU, the "
        "slowest rank of the followed run, and a heat grid (a cell per GPU, coloured by "
        "utilisation, a row per node). Below, a panel per node: utilisation and memory bars with "
        "their history, temperature, power against its limit, and the processes (torchrun ranks "
        "shown as rank, node rank, local rank).\n\n"
        "During a run the seed's thresholds colour the bars: utilisation normal 70-90%, warning "
        "below 50% or above 95% (adjust batch_size); memory normal below 85%, critical above 95% "
        "(mixed precision, smaller batch). Outside a run nothing is an alarm. A node without "
        "samples for two intervals is marked STALE with its age; SIMULATED marks replayed data."
    )

    BINDINGS = [
        Binding("n", "next_node", "Next node", id="gpus.next_node"),
        Binding("p", "previous_node", "Prev node", id="gpus.previous_node"),
        Binding("g", "toggle_grid", "Heat grid", id="gpus.toggle_grid"),
        Binding("d", "toggle_detail", "Detail", id="gpus.toggle_detail"),
    ]

    DEFAULT_CSS = """
    GPUsScreen #gpu-overview {
        height: auto; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis;
    }
    GPUsScreen #gpu-heat {
        height: auto; max-height: 35%; padding: 0 1;
        border-top: solid $primary 40%; border-title-align: left;
    }
    GPUsScreen #gpu-heat.-hidden { display: none; }
    GPUsScreen #gpu-panels { height: 1fr; scrollbar-size-vertical: 1; }
    """

    #: Detail (full panels) by default when the terminal is at least this large.
    DETAIL_SIZE = (120, 40)

    def __init__(self, *, interval: float = 1.0, start_telemetry: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.interval = interval
        self.start_telemetry = start_telemetry
        self.clock = clock
        self.board = GPUBoard(())
        self.telemetry: Telemetry | None = None
        self.detail: bool | None = None      # None: chosen from the terminal size
        self._unsubscribe: Callable[[], None] = lambda: None
        self.redraws = RedrawThrottle(self, self.render_now, RENDER_EVERY)
        self._overview_height = 0
        self._versions: dict[str, int] = {}
        self.panels: dict[str, NodePanel] = {}

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static(id="gpu-overview")
        with VerticalScroll(id="gpu-heat"):
            yield HeatGrid(id="gpu-grid")
        yield VerticalScroll(id="gpu-panels")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.board = GPUBoard(self.console.cluster.names())
        self.query_one("#gpu-heat").border_title = "heat: utilisation per GPU"
        self.render_now(force=True)
        if self.start_telemetry:
            self._start()

    def _start(self) -> None:
        self.telemetry = self.console.gpu_telemetry(self.interval)
        self._unsubscribe = follow_telemetry(self, self.telemetry)

    def on_unmount(self) -> None:
        self._unsubscribe()  # the agents are the app's: they stop when it exits

    # -- updates
    @on(GPUTelemetry)
    def take_update(self, message: GPUTelemetry) -> None:
        self.board.apply(message.update)
        self.redraws.schedule()

    @on(RunFollowed)
    def take_run(self, message: RunFollowed) -> None:
        record = message.record
        self.board.follow(None if record is None
                          else RunView.of(record, message.ranks, live=message.live))
        self.redraws.schedule()

    def on_screen_resume(self) -> None:
        self.redraws.show()
        self.render_now()

    def on_screen_suspend(self) -> None:
        self.redraws.hide()

    def on_resize(self) -> None:
        if self.detail is None:
            self.render_now(force=True)

    def _detail(self) -> bool:
        if self.detail is not None:
            return self.detail
        width, height = self.app.size
        return width >= self.DETAIL_SIZE[0] and height >= self.DETAIL_SIZE[1]

    def render_now(self, *, force: bool = False) -> None:
        """Re-render the overview, the grid and the panels whose node changed (all when
        ``force``); re-armed every second while a node's age is ticking (stale, down)."""
        self.redraws.drawn()
        views = self.board.views(self.clock())
        text = overview_text(self.board.overview(), self.board.run, views)
        height, self._overview_height = self._overview_height, len(text.plain.splitlines())
        self.query_one("#gpu-overview", Static).update(text, layout=height != self._overview_height)
        self.query_one(HeatGrid).show(views)
        detail = self._detail()
        panels = self.query_one("#gpu-panels")
        for v in views:
            track = self.board.nodes[v.name]
            ticking = v.has_sample and v.status != NodeStatus.LIVE
            if not force and not ticking and self._versions.get(v.name) == track.version:
                continue
            self._versions[v.name] = track.version
            panel = self.panels.get(v.name)
            if panel is None:
                panel = self.panels[v.name] = NodePanel(v, detail=detail)
                panels.mount(panel)
            else:
                panel.show(v, detail=detail)
        if any(v.has_sample and v.status != NodeStatus.LIVE for v in views):
            self.redraws.schedule(1.0)

    # -- actions
    def _move(self, step: int) -> None:
        panels = list(self.panels.values())
        if not panels:
            return
        focused = self.focused
        index = panels.index(focused) + step if focused in panels else (0 if step > 0 else -1)
        panel = panels[index % len(panels)]
        panel.focus(scroll_visible=False)
        panel.scroll_visible(top=True, animate=False)

    def action_next_node(self) -> None:
        """Focus the next node's panel."""
        self._move(1)

    def action_previous_node(self) -> None:
        """Focus the previous node's panel."""
        self._move(-1)

    def action_toggle_grid(self) -> None:
        """Show or hide the heat grid."""
        self.query_one("#gpu-heat").toggle_class("-hidden")

    def action_toggle_detail(self) -> None:
        """Switch the panels between one line per GPU and the full detail."""
        self.detail = not self._detail()
        self.render_now(force=True)
        if isinstance(self.focused, NodePanel):   # keep the node in view across the relayout
            self.call_after_refresh(self.focused.scroll_visible, top=True, animate=False)


SCREEN = GPUsScreen
