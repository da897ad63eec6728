"""The log view across ranks: every node's log of the followed run in one pane, interleaved by
time, each line prefixed ``node/rank`` (what ``tail -f`` on every node would show).

It follows live and can pause (``space``); ``/`` searches (a regex, case-insensitive) with
``n``/``N`` for next and previous; ``f`` and ``r`` narrow it to one node or one rank (pressed
again: the next one, then all), ``x`` to error lines; ``w`` wraps, ``t`` shows timestamps;
``s`` saves what is shown to a file. The lines come from a :class:`console.training.logview.LogView`
(a ring per node) that the Training screen fills from its follower; this screen only draws it.
Only the rows on screen are rendered, so a long log costs nothing to scroll.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from console.training.logview import Filter, LogLine, LogView
from screens.base import ConsoleModal

PREFIX = Style(color="cyan", bold=True)
ERROR = Style(color="red")
STAMP = Style(dim=True)
MATCH = Style(reverse=True)


class LogLines(ScrollView):
    """Renders only the visible rows of a list of :class:`LogLine` (wrapped or not)."""

    DEFAULT_CSS = "LogLines { height: 1fr; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines: list[LogLine] = []
        self.wrap = False
        self.timestamps = False
        self.current: int | None = None
        self._rows: list[tuple[int, int, int]] = []   # (line index, start, end) of the text
        self._width = 0

    def text_of(self, line: LogLine) -> str:
        stamp = ""
        if self.timestamps and line.time is not None:
            stamp = datetime.datetime.fromtimestamp(line.time).strftime("%H:%M:%S ")
        return f"{stamp}{line.prefix} {line.text}"

    def set_lines(self, lines: list[LogLine], *, follow: bool) -> None:
        self.lines = lines
        self._layout()
        if follow:
            self.scroll_end(animate=False, immediate=True)
        self.refresh()

    def _layout(self) -> None:
        width = max(20, self.scrollable_content_region.width or self.size.width or 80)
        self._width = width
        rows: list[tuple[int, int, int]] = []
        longest = 0
        for i, line in enumerate(self.lines):
            n = len(self.text_of(line))
            longest = max(longest, n)
            if self.wrap and n > width:
                rows.extend((i, s, min(n, s + width)) for s in range(0, n, width))
            else:
                rows.append((i, 0, n))
        self._rows = rows
        self.virtual_size = Size(width if self.wrap else max(width, longest), len(rows))

    def on_resize(self) -> None:
        if self.wrap:
            self._layout()

    def row_of(self, index: int) -> int:
        for y, (i, _s, _e) in enumerate(self._rows):
            if i == index:
                return y
        return 0

    def show(self, index: int) -> None:
        self.current = index
        y = self.row_of(index)
        self.scroll_to(y=max(0, y - self.size.height // 2), animate=False, immediate=True)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        if row >= len(self._rows):
            return Strip.blank(width, self.rich_style)
        i, start, end = self._rows[row]
        line = self.lines[i]
        text = self.text_of(line)
        prefix_end = len(text) - len(line.text)
        segments = []
        base = ERROR if line.is_error else Style()
        if i == self.current:
            base = base + MATCH
        piece_start = start
        if start < prefix_end:
            segments.append(Segment(text[start:min(end, prefix_end)],
                                    PREFIX + base))
            piece_start = min(end, prefix_end)
        if piece_start < end:
            segments.append(Segment(text[piece_start:end], base))
        strip = Strip(segments)
        if not self.wrap:
            strip = strip.crop(scroll_x, scroll_x + width)
        return strip.extend_cell_length(width, self.rich_style)


class LogViewScreen(ConsoleModal):
    """The log view (see the module docstring)."""

    DEFAULT_CSS = """
    LogViewScreen { background: $background; }
    LogViewScreen > #status { height: 1; background: $panel; }
    LogViewScreen > Input { dock: bottom; display: none; }
    LogViewScreen > Input.shown { display: block; }
    """
    BINDINGS: ClassVar = [
        Binding("escape,q", "close", "Close", id="logs.close"),
        Binding("space", "pause", "Pause/follow", id="logs.pause"),
        Binding("slash", "search", "Search", id="logs.search"),
        Binding("n", "next", "Next", id="logs.next"),
        Binding("N", "previous", "Previous", id="logs.previous"),
        Binding("f", "node", "Node", id="logs.node"),
        Binding("r", "rank", "Rank", id="logs.rank"),
        Binding("x", "errors", "Errors", id="logs.errors"),
        Binding("a", "all", "All", id="logs.all"),
        Binding("w", "wrap", "Wrap", id="logs.wrap"),
        Binding("t", "timestamps", "Times", id="logs.timestamps"),
        Binding("s", "save", "Save", id="logs.save"),
        Binding("g", "top", "Top", show=False, id="logs.top"),
        Binding("G", "bottom", "Bottom", show=False, id="logs.bottom"),
    ]

    def __init__(self, view: LogView, title: str = "", save_dir: Path | None = None,
                 node: str | None = None) -> None:
        super().__init__()
        self.view = view
        self.title_text = title
        self.save_dir = save_dir or Path.cwd()
        self.filter = Filter(node=node)
        self.paused = False
        self.pattern: str | None = None
        self._seen = -1
        self.message = ""

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield LogLines(id="lines")
        yield Input(placeholder="search (regex): Enter finds, Escape cancels", id="query")
        yield Footer()

    @property
    def pane(self) -> LogLines:
        return self.query_one("#lines", LogLines)

    def on_mount(self) -> None:
        self.refresh_lines(force=True)
        self.set_interval(0.5, self.refresh_lines)
        self.pane.focus()

    def refresh_lines(self, force: bool = False) -> None:
        """Take the view's new lines (at most twice a second, nothing while paused)."""
        if (self.paused and not force) or (self.view.revision == self._seen and not force):
            self.update_status()
            return
        self._seen = self.view.revision
        self.pane.set_lines(self.view.lines(self.filter), follow=not self.paused)
        self.update_status()

    def update_status(self) -> None:
        pane = self.pane
        state = "[b yellow]PAUSED[/]" if self.paused else "[b green]following[/]"
        parts = [f" {self.title_text}", state, f"{len(pane.lines)} lines ({self.filter.describe()})"]
        if pane.wrap:
            parts.append("wrap")
        if self.pattern:
            where = "" if pane.current is None else f" at {pane.current + 1}"
            parts.append(f"/{self.pattern}{where}")
        if self.message:
            parts.append(self.message)
        self.query_one("#status", Static).update("  ".join(parts))

    def say(self, message: str) -> None:
        self.message = message
        self.update_status()

    # ---------------------------------------------------------------- actions

    def action_close(self) -> None:
        query = self.query_one("#query", Input)
        if query.has_class("shown"):
            query.remove_class("shown")
            self.pane.focus()
            return
        self.dismiss(None)

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.say("paused: new lines wait" if self.paused else "following again")
        if not self.paused:
            self.refresh_lines(force=True)

    def action_search(self) -> None:
        query = self.query_one("#query", Input)
        query.add_class("shown")
        query.value = self.pattern or ""
        query.focus()

    @on(Input.Submitted, "#query")
    def _searched(self, event: Input.Submitted) -> None:
        event.input.remove_class("shown")
        self.pane.focus()
        self.pattern = event.value.strip() or None
        if self.pattern:
            self.paused = True   # a found line stays where it is
            self._find(backwards=False, start=-1 if self.pane.current is None
                       else self.pane.current)

    def _find(self, *, backwards: bool, start: int | None = None) -> None:
        if not self.pattern:
            self.say("no search yet: press /")
            return
        lines = self.pane.lines
        if start is None:
            start = self.pane.current if self.pane.current is not None else (
                len(lines) if backwards else -1)
        found = LogView.find(lines, self.pattern, start, backwards=backwards)
        if found is None:
            self.say(f"not found: {self.pattern}")
            return
        self.pane.show(found)
        self.say(f"{found + 1}/{len(lines)}")

    def action_next(self) -> None:
        self._find(backwards=False)

    def action_previous(self) -> None:
        self._find(backwards=True)

    def _cycle(self, values: list, current):
        if not values:
            return None
        if current is None:
            return values[0]
        i = values.index(current) if current in values else -1
        return values[i + 1] if i + 1 < len(values) else None

    def action_node(self) -> None:
        self.filter = Filter(self._cycle(self.view.nodes(), self.filter.node), self.filter.rank,
                             self.filter.errors)
        self._refilter()

    def action_rank(self) -> None:
        self.filter = Filter(self.filter.node, self._cycle(self.view.ranks(), self.filter.rank),
                             self.filter.errors)
        self._refilter()

    def action_errors(self) -> None:
        self.filter = Filter(self.filter.node, self.filter.rank, not self.filter.errors)
        self._refilter()

    def action_all(self) -> None:
        self.filter = Filter()
        self._refilter()

    def _refilter(self) -> None:
        self.pane.current = None
        self.refresh_lines(force=True)
        self.say(f"showing {self.filter.describe()}")

    def action_wrap(self) -> None:
        self.pane.wrap = not self.pane.wrap
        self.refresh_lines(force=True)
        self.say("wrapping long lines" if self.pane.wrap else "long lines cut (scroll right)")

    def action_timestamps(self) -> None:
        self.pane.timestamps = not self.pane.timestamps
        self.refresh_lines(force=True)
        self.say("timestamps shown" if self.pane.timestamps else "timestamps hidden")

    def action_top(self) -> None:
        self.paused = True
        self.pane.scroll_home(animate=False)
        self.update_status()

    def action_bottom(self) -> None:
        self.pane.scroll_end(animate=False)

    def action_save(self) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.title_text or "run") or "run"
        path = self.save_dir / f"logs-{name}.txt"
        try:
            n = LogView.save(path, self.pane.lines, timestamps=True)
        except OSError as exc:
            self.say(f"not saved: {exc}")
            self.notify(f"log view not saved: {exc}", severity="error")
            return
        self.say(f"saved {n} lines to {path}")
        self.notify(f"saved {n} lines to {path}")
