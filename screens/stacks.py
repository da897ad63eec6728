"""The Stacks view: who holds a run up, from every rank's stack (``svconsole stacks`` in the TUI).

Opened from the Training screen (key ``t``) for the followed run. A thread worker takes the stacks
(:func:`console.training.stacks.take_stacks`: py-spy on every rank of every node at once, the
training never stopped) and the result comes back as a :class:`StacksTaken` message. The view
shows the suspects first (highlighted, with why), then the groups side by side (ranks whose
innermost frames are the same; the majority, in its collective, first), each rank's stack
expandable under its group, and what could not be seen (py-spy missing, ptrace rights, a node
that could not be asked) with what to change. ``r`` takes the stacks again; escape closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Footer, Static

from screens.base import ConsoleModal

if TYPE_CHECKING:
    from console.ssh.pool import Pool
    from console.training.runs import RunRecord
    from console.training.stacks import Group, RankStack, StacksReport

SUSPECT_STYLE = "bold red"
#: Frames shown for a group before its ranks' own stacks.
GROUP_FRAMES = 6


class StacksTaken(Message):
    """The stacks of a run were taken (``report``), or could not be (``error``)."""

    def __init__(self, run_id: str, report: StacksReport | None, error: str | None = None) -> None:
        super().__init__()
        self.run_id, self.report, self.error = run_id, report, error


def rank_title(r: RankStack, suspect: bool) -> str:
    """One rank's line: rank, node, pid, state, CPU over the window, last step line's age."""
    cpu = f"{r.cpu_s:.2f} s CPU/{r.window_s or 1:.0f} s" if r.cpu_s is not None else "CPU ?"
    age = f", last step {r.last_log_age_s:.0f} s ago" if r.last_log_age_s is not None else ""
    mark = "! " if suspect else ""
    return (f"{mark}rank {'?' if r.rank is None else r.rank} on {r.node} (pid {r.pid}): state "
            f"{r.state}{f' ({r.wchan})' if r.wchan else ''}, {cpu}{age}")


def frames_text(r: RankStack) -> str:
    if r.error and not r.frames:
        return f"no stack: {escape(r.error)}"
    return "\n".join(escape(str(f)) for f in r.frames) or "no stack"


class StacksScreen(ConsoleModal):
    """Every rank's stack of one run, grouped, with the suspects."""

    DEFAULT_CSS = """
    StacksScreen { align: center middle; }
    StacksScreen > Vertical {
        width: 96%; height: 92%; border: round $primary; background: $surface; padding: 0 1;
    }
    StacksScreen #stacks-head { height: auto; }
    StacksScreen #stacks-suspects { height: auto; color: $error; text-style: bold; }
    StacksScreen #stacks-groups { height: 1fr; }
    StacksScreen .stacks-group {
        width: 1fr; height: 1fr; border: round $primary-darken-2; padding: 0 1;
    }
    StacksScreen .stacks-group.-majority { border: round $success; }
    StacksScreen .stacks-group.-suspect { border: round $error; }
    StacksScreen .stacks-frames { color: $text-muted; }
    StacksScreen .-suspect-rank CollapsibleTitle { color: $error; text-style: bold; }
    StacksScreen #stacks-notes { height: auto; color: $warning; }
    """
    BINDINGS: ClassVar = [
        Binding("r", "refresh", "Take again", id="stacks.refresh"),
        Binding("escape", "close", "Close", id="stacks.close"),
    ]

    def __init__(self, pool: Pool, record: RunRecord) -> None:
        super().__init__()
        self.pool, self.record = pool, record
        self.report: StacksReport | None = None
        self.taking = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"stacks of run {escape(self.record.id)}: taking…", id="stacks-head")
            yield Static("", id="stacks-suspects")
            yield Horizontal(id="stacks-groups")
            yield Static("", id="stacks-notes")
        yield Footer()

    def on_mount(self) -> None:
        self.take()

    def action_refresh(self) -> None:
        if not self.taking:
            self.query_one("#stacks-head", Static).update(
                f"stacks of run {escape(self.record.id)}: taking…")
            self.take()

    def action_close(self) -> None:
        self.dismiss(None)

    def take(self) -> None:
        self.taking = True
        self._take(self.pool, self.record)

    @work(thread=True, exclusive=True, group="stacks", name="take the ranks' stacks",
          exit_on_error=False)
    def _take(self, pool: Pool, record: RunRecord) -> None:
        from console.training.runs import NodeCallError, RunNotFound
        from console.training.stacks import take_stacks

        try:
            self.post_message(StacksTaken(record.id, take_stacks(pool, record)))
        except (RunNotFound, NodeCallError, OSError) as exc:
            self.post_message(StacksTaken(record.id, None, str(exc)))

    @on(StacksTaken)
    def show(self, message: StacksTaken) -> None:
        self.taking = False
        head = self.query_one("#stacks-head", Static)
        if message.report is None:
            head.update(f"stacks of run {escape(message.run_id)}: could not be taken: "
                        f"{escape(message.error or '?')}")
            return
        report = self.report = message.report
        head.update(f"stacks of run {escape(report.run)}: {len(report.ranks)} ranks in "
                    f"{len(report.groups)} group(s), taken in {report.seconds:.1f} s "
                    "(r: take again)")
        self.query_one("#stacks-suspects", Static).update(
            "\n".join(f"suspect: {escape(s.why)}" for s in report.suspects)
            or "suspects: none")
        self.query_one("#stacks-notes", Static).update(
            "\n".join(f"note: {escape(n)}" for n in report.notes))
        box = self.query_one("#stacks-groups", Horizontal)
        box.remove_children()
        suspects = {(s.node, s.rank) for s in report.suspects}
        by_group: list[tuple[Group | None, list[RankStack]]] = []
        placed: set[int] = set()
        for g in report.groups:
            members = [r for r in report.ranks if r.frames and r.key() == g.key]
            placed.update(id(r) for r in members)
            by_group.append((g, members))
        rest = [r for r in report.ranks if id(r) not in placed]
        if rest:
            by_group.append((None, rest))
        box.mount_all(self._column(g, members, suspects) for g, members in by_group)

    def _column(self, group: Group | None, members: list[RankStack],
                suspects: set[tuple[str | None, int | None]]) -> VerticalScroll:
        classes = "stacks-group"
        if group is not None and group.majority:
            classes += " -majority"
        if any((r.node, r.rank) in suspects for r in members):
            classes += " -suspect"
        if group is None:
            title = "no stack"
            frames = ""
        else:
            kind = "majority" if group.majority else "group"
            waited = f", last step {group.waited_s:.0f} s ago" if group.waited_s is not None \
                else ""
            title = (f"{kind}: {escape(group.label)}\nranks "
                     f"{', '.join('?' if r is None else str(r) for r in group.ranks)}{waited}")
            frames = "\n".join(escape(str(f)) for f in group.frames[:GROUP_FRAMES])
        children = [Static(f"[b]{title}[/]"), Static(frames, classes="stacks-frames")]
        for r in members:
            suspect = (r.node, r.rank) in suspects
            children.append(Collapsible(Static(frames_text(r)), title=rank_title(r, suspect),
                                        collapsed=True,
                                        classes="-suspect-rank" if suspect else ""))
        return VerticalScroll(*children, classes=classes)


__all__ = ["StacksScreen", "StacksTaken", "frames_text", "rank_title"]
