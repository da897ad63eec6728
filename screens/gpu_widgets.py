"""The GPU screen's pieces: bars, sparklines, one panel per node, the cluster heat grid.

Widgets here render from a :class:`NodeView`, an immutable copy of what the screen knows about one
node at one instant; they never read the collectors, so a render cannot race an update. Colours
come from the seed guide's 6.1 verdicts (:func:`console.gpu.telemetry.judge_gpu`): green when normal,
yellow when outside the normal range, orange for a warning, red for critical, grey when idle; and
outside a run nothing is judged (busy GPUs are blue, never an alarm).
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from console.gpu.telemetry import GPUReading, GPUVerdicts, Level, NodeStatus

SPARKS = "▁▂▃▄▅▆▇█"
DETAIL_BAR = 24     # cells of a bar in the detailed form
SPARK_MAX = 60      # at most this many samples of history on a line
FULL, EMPTY = "█", "░"

#: Style of each 6.1 level during a run.
LEVEL_STYLES: dict[Level, str] = {
    Level.NORMAL: "green",
    Level.WATCH: "yellow",
    Level.WARN: "bold dark_orange",
    Level.CRITICAL: "bold red",
    Level.IDLE: "grey50",
    Level.UNKNOWN: "grey50",
}
#: Outside a run a busy GPU is shown in a neutral colour: there is nothing to judge.
UNJUDGED_STYLE = "steel_blue1"

#: Heat grid colours by utilisation (upper bound in %, colour).
HEAT_RAMP: tuple[tuple[float, str], ...] = (
    (1, "grey27"), (30, "dodger_blue3"), (60, "green3"), (85, "yellow3"), (95, "orange1"),
    (math.inf, "red1"),
)


def level_style(level: Level, *, in_run: bool) -> str:
    """The colour of a verdict; outside a run only idle and unknown are told apart."""
    if not in_run and level == Level.NORMAL:
        return UNJUDGED_STYLE
    return LEVEL_STYLES[level]


def heat_style(util: float | None) -> str:
    """Heat grid colour of a GPU's utilisation (grey when not read)."""
    if util is None:
        return "grey15"
    return next(style for top, style in HEAT_RAMP if util < top)


def bar(pct: float | None, width: int, style: str) -> Text:
    """A horizontal bar ``width`` cells wide, filled to ``pct`` percent."""
    if pct is None:
        return Text("?".center(width, EMPTY), style="grey50")
    filled = round(max(0.0, min(100.0, pct)) * width / 100)
    return Text.assemble((FULL * filled, style), (EMPTY * (width - filled), "grey30"))


def sparkline(values: Sequence[float | None], width: int, *, top: float = 100.0) -> str:
    """The last ``width`` values as block characters scaled to ``top`` (blank where not read),
    oldest first and starting at the left, so that a short history sits next to its bar and
    grows to the right (the newest value is the last glyph)."""
    if width <= 0:
        return ""
    chars = []
    for v in list(values)[-width:]:
        if v is None:
            chars.append(" ")
        else:
            chars.append(SPARKS[min(len(SPARKS) - 1, max(0, int(v / top * len(SPARKS))))])
    return "".join(chars).ljust(width)


def short_name(name: str, width: int) -> str:
    """``name`` in at most ``width`` cells; a long name keeps its start and its (usually
    distinguishing) end: ``gpu-node-063`` -> ``gp…e-063``."""
    if len(name) <= width:
        return name
    if width < 3:
        return name[:width]
    head = (width - 1) // 3
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def _num(value: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def age_text(age: float | None) -> str:
    """``4 s``, ``3 min``, ``2 h`` (an age, coarse)."""
    if age is None:
        return "?"
    if age < 120:
        return f"{age:.0f} s"
    if age < 7200:
        return f"{age / 60:.0f} min"
    return f"{age / 3600:.0f} h"


# ---------------------------------------------------------------------------- views


@dataclass(frozen=True)
class GPUView:
    """One GPU as shown: its latest reading, its 6.1 verdicts and a short history (%)."""

    reading: GPUReading
    verdicts: GPUVerdicts
    util_history: tuple[float | None, ...] = ()
    mem_history: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class NodeView:
    """One node as shown, copied from the screen's model at render time.

    ``age`` is the seconds since its latest sample; ``no_gpu`` the agent's reason when the node
    has no GPU; ``node_rank`` its rank in the followed run; ``in_run`` whether 6.1 applies."""

    name: str
    status: NodeStatus
    reason: str = ""
    age: float | None = None
    simulated: bool = False
    no_gpu: str | None = None
    gpus: tuple[GPUView, ...] = ()
    node_rank: int | None = None
    in_run: bool = False

    @property
    def has_sample(self) -> bool:
        return self.age is not None

    @property
    def state_text(self) -> str:
        """``live``, ``STALE 12 s``, ``starting``, ``down``."""
        if self.status == NodeStatus.STALE:
            return f"STALE {age_text(self.age)}"
        if self.status == NodeStatus.DOWN and self.has_sample:
            return f"down, last sample {age_text(self.age)} ago"
        return self.status.value


def short_advice(advice: str) -> str:
    """A verdict's advice without its parenthesis: ``utilisation below 50%: adjust batch_size``."""
    return re.sub(r" \([^)]*\)", "", advice)


def _gpu_line(view: NodeView, g: GPUView, width: int) -> Text:
    """The compact form: one line per GPU with both bars and the utilisation history."""
    r = g.reading
    util_style = level_style(g.verdicts.util.level, in_run=view.in_run)
    mem_style = level_style(g.verdicts.memory.level, in_run=view.in_run)
    alarm = g.verdicts.util.alarming or g.verdicts.memory.alarming
    power = f"{_num(r.power_w)}/{_num(r.power_limit_w)}W"
    procs = f"{len(r.procs)}p" if r.procs else ""
    tail = Text(f" {_num(r.temp_c, '.0f', '°C'):>5} {power:>9}{procs:>4}")
    tail.append(" !" if alarm else "  ", style="bold red" if alarm else "")
    fixed = 3 + 5 + 5 + 1 + 5 + 5 + len(tail)    # index, "util ", pct, " ", " mem ", pct
    room = max(12, width - fixed)
    bar_w = max(4, min(20, room // 3))
    spark_w = max(0, min(SPARK_MAX, room - 2 * bar_w))
    pad = max(0, room - 2 * bar_w - spark_w)   # a wide panel: the rest goes after the memory
    line = Text(f"{r.index:>2} ", style="bold")
    line.append("util ")
    line.append_text(bar(r.util_gpu, bar_w, util_style))
    line.append(f"{_num(r.util_gpu, '.0f', '%'):>5}", style=util_style)
    line.append(" " + sparkline(g.util_history, spark_w), style=util_style)
    line.append(" mem ")
    line.append_text(bar(r.mem_pct, bar_w, mem_style))
    line.append(f"{_num(r.mem_pct, '.0f', '%'):>5}", style=mem_style)
    line.append(" " * pad)
    line.append_text(tail)
    return line


def _gpu_block(view: NodeView, g: GPUView, width: int) -> list[Text]:
    """The detailed form: identity line, a bar + sparkline line for utilisation and for memory
    (with the 6.1 advice when alarming), then the processes (at least one line)."""
    r = g.reading
    head = Text(f"GPU{r.index} ", style="bold")
    head.append(r.name or "?")
    head.append(f"  {_num(r.temp_c, '.0f', '°C')}  "
                f"power {_num(r.power_w)}/{_num(r.power_limit_w)} W")
    if r.power_pct is not None:
        head.append(f" ({r.power_pct:.0f}%)")
    if r.sm_clock_mhz is not None:
        head.append(f"  SM {r.sm_clock_mhz:.0f} MHz")
    if r.throttle:
        head.append(f"  throttle {','.join(r.throttle)}", style="yellow")
    if r.ecc_uncorrected:
        head.append(f"  ECC uncorrected {r.ecc_uncorrected}", style="bold red")
    mem_text = (f"  {r.mem_used_mb / 1024:.1f}/{r.mem_total_mb / 1024:.1f} GiB"
                if r.mem_used_mb is not None and r.mem_total_mb else "")
    lines = [head]
    for label, pct, verdict, history, extra in (
            ("util", r.util_gpu, g.verdicts.util, g.util_history, ""),
            ("mem ", r.mem_pct, g.verdicts.memory, g.mem_history, mem_text)):
        style = level_style(verdict.level, in_run=view.in_run)
        advice = f"  ! {short_advice(verdict.advice)}" if verdict.alarming else ""
        line = Text(f"  {label} ")
        line.append_text(bar(pct, DETAIL_BAR, style))
        line.append(f"{_num(pct, '.0f', '%'):>5}", style=style)
        line.append(f"{extra:<19} ")
        spark_w = max(8, min(SPARK_MAX, width - len(line) - len(advice)))
        line.append(sparkline(history, spark_w), style=style)
        line.append(advice, style=style)
        lines.append(line)
    for p in r.procs:
        line = Text(f"  pid {p.pid:<7} {_num(p.used_mb, '.0f', ' MiB'):>10}  ")
        if p.rank is not None or p.local_rank is not None:
            node_rank = "?" if view.node_rank is None else view.node_rank
            line.append(f"rank {_num(p.rank, 'd')} "
                        f"(node {node_rank}, local {_num(p.local_rank, 'd')})  ",
                        style="bold cyan")
        line.append(p.cmd or "?", style="grey70")
        lines.append(line)
    if not r.procs:     # a steady height: the panel does not jump as processes come and go
        lines.append(Text("  no compute process", style="grey50"))
    return lines


def wrapped(sentence: str, width: int, style: str) -> list[Text]:
    """A sentence (a reason from a node) over as many lines as ``width`` needs."""
    return [Text(line, style=style) for line in textwrap.wrap(sentence, max(20, width))]


def node_lines(view: NodeView, width: int, *, detail: bool) -> list[Text]:
    """The content of a node's panel: a plain sentence when there is nothing to show, else a
    line (compact) or a block (detail) per GPU."""
    if not view.has_sample:
        if view.status == NodeStatus.DOWN:
            return wrapped(f"down: {view.reason or 'no connection'} (retrying)", width, "red")
        waiting = "stopped" if view.status == NodeStatus.STOPPED else "starting the GPU agent…"
        return [Text(waiting, style="grey50")]
    lines: list[Text] = []
    if view.status != NodeStatus.LIVE:
        lines += wrapped(f"{view.reason or 'no recent sample'}: the values below are "
                         f"{age_text(view.age)} old", width, "bold yellow")
    if view.no_gpu is not None:
        lines += wrapped(f"no NVIDIA GPU on this node: {view.no_gpu}", width, "")
    elif not view.gpus:
        lines.append(Text("the agent reports no GPU", style="bold"))
    for g in view.gpus:
        if detail:
            lines.extend(_gpu_block(view, g, width))
        else:
            lines.append(_gpu_line(view, g, width))
    if view.status != NodeStatus.LIVE:
        for line in lines[1:]:
            line.stylize("dim")
    return lines


class NodePanel(Widget, can_focus=True):
    """One node's GPUs; its border says the node, its state and SIMULATED when replayed data."""

    DEFAULT_CSS = """
    NodePanel {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
        border: round $primary 50%;
        padding: 0 1;
    }
    NodePanel:focus { border: round $accent; }
    NodePanel.-stale, NodePanel.-down { border: round $warning 60%; }
    NodePanel.-stale:focus, NodePanel.-down:focus { border: round $warning; }
    NodePanel.-simulated { border-subtitle-color: $warning; border-subtitle-style: bold; }
    """

    def __init__(self, view: NodeView, *, detail: bool = False) -> None:
        super().__init__(classes="gpu-node")
        self.detail = detail
        self.view = view
        self._cache: tuple[int, list[Text]] | None = None   # (width, lines) of this view
        self.show(view)

    def show(self, view: NodeView, *, detail: bool | None = None) -> None:
        """Show ``view`` (and switch the compact/detail form when ``detail`` is given); the
        layout is redone only when the panel's shape (so its height) changes."""
        before = self._shape()
        self.view = view
        if detail is not None:
            self.detail = detail
        self._cache = None
        title = view.name
        if view.node_rank is not None:
            title += f" (node rank {view.node_rank})"
        simulated = " · SIMULATED" if view.simulated else ""
        self.border_title = f"{title} · {view.state_text}{simulated}"
        self.border_subtitle = "SIMULATED" if view.simulated else ""
        for name, wanted in (("-simulated", view.simulated),
                             ("-stale", view.status == NodeStatus.STALE),
                             ("-down", view.status == NodeStatus.DOWN)):
            if self.has_class(name) != wanted:     # a class change restyles: only when needed
                self.set_class(wanted, name)
        self.refresh(layout=self._shape() != before)

    def _shape(self) -> tuple:
        """What the number of content lines depends on."""
        v = self.view
        procs = (tuple(max(1, len(g.reading.procs)) for g in v.gpus) if self.detail
                 else len(v.gpus))
        reason = v.reason if v.status != NodeStatus.LIVE else ""
        return (self.detail, v.has_sample, v.status, reason, v.no_gpu, procs)

    def lines(self, width: int | None = None) -> list[Text]:
        """The panel's content lines for ``width`` cells (cached per view and width)."""
        width = width or self.content_size.width or 76
        if self._cache is None or self._cache[0] != width:
            self._cache = (width, node_lines(self.view, width, detail=self.detail))
        return self._cache[1]

    def render(self) -> Text:
        text = Text("\n").join(self.lines())
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.lines(width))


class HeatGrid(Widget):
    """Every GPU of the cluster as one coloured cell (by utilisation), a row per node; nodes flow
    into as many columns as the width holds, and the grid scrolls, so 64 nodes x 8 GPUs stay
    readable in 80 columns. Names longer than ``NAME_WIDTH`` keep their start and end."""

    NAME_WIDTH = 10
    CELL = "██"
    DEFAULT_CSS = """
    HeatGrid { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, views: Sequence[NodeView] = (), *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.views: tuple[NodeView, ...] = tuple(views)

    def show(self, views: Sequence[NodeView]) -> None:
        """Show ``views``; the layout is redone only when the number of rows changes."""
        width = self.content_size.width
        rows = math.ceil(len(self.views) / self.columns(width)) if width else None
        self.views = tuple(views)
        self.refresh(layout=rows != math.ceil(len(self.views) / self.columns(width or 1)))

    def _name_width(self) -> int:
        return min(self.NAME_WIDTH, max((len(v.name) for v in self.views), default=4))

    def _cell_width(self) -> int:
        gpus = max((len(v.gpus) for v in self.views), default=1)
        return self._name_width() + 1 + len(self.CELL) * max(gpus, 6) + 2

    def columns(self, width: int) -> int:
        """How many nodes fit side by side in ``width`` cells."""
        return max(1, (width + 2) // self._cell_width())

    def rows(self, width: int) -> list[Text]:
        """The grid's lines for ``width`` cells."""
        name_w, cols = self._name_width(), self.columns(width)
        cells_w = self._cell_width() - name_w - 3
        lines = []
        for start in range(0, len(self.views), cols):
            line = Text()
            for v in self.views[start:start + cols]:
                if len(line):
                    line.append("  ")
                line.append(f"{short_name(v.name, name_w):<{name_w}} ",
                            style="bold" if v.status == NodeStatus.LIVE else "yellow")
                cells = Text()
                if not v.has_sample or v.no_gpu is not None or not v.gpus:
                    label = "no GPU" if v.no_gpu is not None else v.state_text
                    cells.append(label[:cells_w], style="grey50")
                for g in v.gpus:
                    cells.append(self.CELL, style=heat_style(g.reading.util_gpu))
                if v.status != NodeStatus.LIVE:
                    cells.stylize("dim")
                line.append_text(cells)
                line.append(" " * (cells_w - len(cells)))
            lines.append(line)
        return lines

    def render(self) -> Text:
        text = Text("\n").join(self.rows(self.content_size.width or 76))
        text.no_wrap = True
        return text

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, math.ceil(len(self.views) / self.columns(width)))
