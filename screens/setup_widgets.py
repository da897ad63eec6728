"""The Setup screen's parts: where the cluster stands per (step, node), the phase checklist, the
step x node grid, the run feed (runner events -> coalesced UI updates) and the sudo modals.

The model (:class:`Standing`) is fed from the saved run summaries and then from a live run; the
widgets render from it. Nothing here does I/O on the UI thread except what its docstring says.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Static

from console.bringup import PHASES, Phase, RunSummary, Step, StepState
from console.bringup.runner import SUMMARY, Cell, OutputLine, RunEvent, Runner, runs_dir
from screens.messages import SetupRunProgress

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from console.bringup import SetupOptions
    from console.cluster.model import Cluster

CellKey = tuple[str, str]
"""(step id, node name)."""

#: Glyph and style of each state in the grid (None: never run on this node).
GLYPHS: dict[StepState | None, tuple[str, str]] = {
    None: ("·", "dim"),
    StepState.PENDING: ("…", "yellow"),
    StepState.RUNNING: ("▶", "bold yellow"),
    StepState.DONE: ("✓", "bold green"),
    StepState.ALREADY_DONE: ("=", "green"),
    StepState.NOT_APPLICABLE: ("-", "dim"),
    StepState.FAILED: ("✗", "bold red"),
    StepState.NEEDS_REBOOT: ("R", "bold magenta"),
    StepState.BLOCKED: ("⊘", "red"),
    StepState.SKIPPED: ("»", "cyan"),
}

LEGEND = "\n".join(f"{glyph} {'not run' if state is None else state.value}"
                    for state, (glyph, _) in GLYPHS.items())
"""Every glyph and its state, one a line."""

#: Phases whose steps are training runs, done on the Training screen rather than here.
TRAINING_PHASES = (Phase.SINGLE_NODE, Phase.MULTI_NODE)

#: Summaries read to know where the cluster stands (the newest ones).
SUMMARIES_READ = 50
#: Output lines kept in memory per cell of the live run (the full log is in its file).
LIVE_TAIL = 1000
#: Bytes read from the end of a finished cell's log file.
LOG_TAIL_BYTES = 256 * 1024


# ---------------------------------------------------------------------------- model


@dataclass
class Known:
    """The latest known state of one step on one node, and where its log is."""

    state: StepState
    detail: str = ""
    log: str | None = None
    run_id: str = ""


@dataclass
class Standing:
    """Where the cluster stands: per (step, node) the latest known state, from the saved runs
    and then from the live run. Mutated on the UI thread only."""

    cluster: Cluster
    steps: Sequence[Step]
    cells: dict[CellKey, Known] = field(default_factory=dict)

    def expected(self, step: Step) -> list[CellKey]:
        return [(step.id, node) for node in step.nodes(self.cluster)]

    def state(self, step: str, node: str) -> StepState | None:
        known = self.cells.get((step, node))
        return known.state if known else None

    def absorb(self, summary: RunSummary) -> None:
        """Take the cells of ``summary`` that belong to this cluster and catalog."""
        ids = {s.id for s in self.steps}
        nodes = set(self.cluster.names())
        for c in summary.cells:
            if c.step in ids and c.node in nodes and c.state != StepState.PENDING:
                self.cells[(c.step, c.node)] = Known(c.state, c.detail, c.log, summary.run_id)

    def set(self, key: CellKey, state: StepState, detail: str, run_id: str,
            log: str | None = None) -> None:
        old = self.cells.get(key)
        self.cells[key] = Known(state, detail, log or (old.log if old else None), run_id)

    def phase_status(self, phase: Phase) -> str:
        """done / partly / not started / failed / running, or why the phase is not here."""
        steps = [s for s in self.steps if s.phase == phase]
        if not steps:
            return "Training screen" if phase in TRAINING_PHASES else "no steps"
        states = [self.state(*key) for s in steps for key in self.expected(s)]
        if StepState.RUNNING in states or StepState.PENDING in states:
            return "running"
        if any(s in (StepState.FAILED, StepState.BLOCKED) for s in states):
            return "failed"
        if StepState.NEEDS_REBOOT in states:
            return "needs reboot"
        finished = [s for s in states if s is not None and (s.finished_ok or s == StepState.SKIPPED)]
        if states and len(finished) == len(states):
            return "done"
        return "partly" if any(s is not None for s in states) else "not started"

    def failed(self) -> set[CellKey]:
        """Cells that "retry failed" runs again."""
        from console.bringup.runner import RETRY_STATES

        return {k for k, v in self.cells.items() if v.state in RETRY_STATES}

    def as_summary(self) -> RunSummary:
        """The standing as a run summary (what a retry takes as the previous run)."""
        cells = [Cell(step, node, k.state, k.detail, 0.0, k.log)
                 for (step, node), k in self.cells.items()]
        return RunSummary("standing", 0.0, 0.0, cells)


def read_summaries(state_dir: Path, limit: int = SUMMARIES_READ) -> list[RunSummary]:
    """The newest ``limit`` saved run summaries, oldest first (I/O: call from a worker).
    Unreadable ones are left out."""
    out = []
    for path in sorted(runs_dir(state_dir).glob(f"*/{SUMMARY}"))[-limit:]:
        try:
            out.append(RunSummary.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def read_log_tail(path: str | None, limit: int = LOG_TAIL_BYTES) -> list[str]:
    """The end of a cell's log file (I/O: call from a worker)."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError as exc:
        return [f"[log {path} cannot be read: {exc.strerror}]"]
    lines = data.decode("utf-8", "replace").splitlines()
    return (["[… earlier lines are in the file]"] + lines[1:]) if size > limit else lines


def plan_lines(runner: Runner) -> list[str]:
    """The dry run of ``runner`` as text lines: per cell, what it runs (touches nothing)."""
    out = []
    for p in runner.dry_run():
        root = " (as root)" if p.as_root else ""
        out.append(f"── {p.step} on {p.node}{root}: {p.title}")
        if p.note:
            out.append(f"   changes: {p.note}")
        for stage, commands in (("gather", p.gather), ("check", p.check), ("apply", p.apply),
                                ("verify", p.verify)):
            out += [f"   {stage}: {c}" for c in commands]
        if not (p.gather or p.check or p.apply or p.verify):
            out.append("   (a measurement across the nodes: no per-node shell commands)")
    return out


def change_list(cluster: Cluster, options: SetupOptions, steps: Sequence[Step],
                cells: Iterable[CellKey]) -> list[str]:
    """What the root or destructive steps among ``cells`` will change, per step and its nodes
    (the confirmation's text); empty when none of them needs asking."""
    by_step: dict[str, list[str]] = {}
    for step, node in cells:
        by_step.setdefault(step, []).append(node)
    out = []
    for step in steps:
        if step.id not in by_step or not (step.needs_root or step.destructive):
            continue
        kinds = ", ".join(k for k, on in (("root", step.needs_root),
                                           ("destructive", step.destructive)) if on)
        out.append(f"{step.title} [{kinds}] on {', '.join(by_step[step.id])}:")
        out.append(f"    {step.changes(cluster, options) or '(no description)'}")
    return out


# ---------------------------------------------------------------------------- run feed


class RunFeed:
    """Subscribes to a runner; buffers its events, the latest state per cell and a bounded
    tail of lines per cell, and posts one :class:`SetupRunProgress` at a time to ``target``
    (the screen drains the buffer when it handles it). Thread-safe."""

    def __init__(self, target: MessagePump, runner: Runner, tail: int = LIVE_TAIL) -> None:
        self.target = target
        self.run_id = runner.run_id
        self.tail = tail
        self._lock = threading.Lock()
        self._states: dict[CellKey, tuple[StepState, str]] = {}
        self._lines: dict[CellKey, deque[str]] = {}
        self._dropped: dict[CellKey, int] = {}
        self._armed = False
        self._unsubscribe = runner.subscribe(self._on_event)

    def _on_event(self, event: RunEvent) -> None:
        key = (event.step, event.node)
        with self._lock:
            if isinstance(event, OutputLine):
                lines = self._lines.setdefault(key, deque(maxlen=self.tail))
                if len(lines) == self.tail:
                    self._dropped[key] = self._dropped.get(key, 0) + 1
                lines.append(event.text)
            else:
                self._states[key] = (event.state, event.detail)
            post, self._armed = not self._armed, True
        if post:
            self.target.post_message(SetupRunProgress(self.run_id))

    def drain(self) -> tuple[dict[CellKey, tuple[StepState, str]], dict[CellKey, list[str]]]:
        """What arrived since the last drain: states per cell, new lines per cell."""
        with self._lock:
            states, lines, dropped = self._states, self._lines, self._dropped
            self._states, self._lines, self._dropped, self._armed = {}, {}, {}, False
        out = {}
        for key, tail in lines.items():
            head = [f"[… {dropped[key]} lines not shown here; see the log file]"] if key in dropped else []
            out[key] = head + list(tail)
        return states, out

    def close(self) -> None:
        self._unsubscribe()


# ---------------------------------------------------------------------------- widgets


class PhaseChecklist(Static):
    """The seed's bring-up phases in order, each with where the cluster stands."""

    DEFAULT_CSS = """
    PhaseChecklist { height: auto; padding: 0 1; }
    """
    MARKS = {"done": ("✓", "green"), "partly": ("◐", "yellow"), "running": ("▶", "yellow"),
             "failed": ("✗", "red"), "needs reboot": ("R", "magenta"),
             "not started": ("○", "dim")}

    def show(self, standing: Standing) -> None:
        self.update(self.text_of(standing))

    @classmethod
    def text_of(cls, standing: Standing) -> Text:
        text = Text()
        # Lettered, not numbered: keys 1-5 switch screens, and "3" here would read as a key.
        for letter, phase in zip("ABCDEFGHIJ", PHASES, strict=False):
            status = standing.phase_status(phase)
            mark, style = cls.MARKS.get(status, ("→", "dim"))
            text.append(f"{letter} {mark} ", style=style)
            text.append(f"{phase.value}\n", style="bold" if status != "done" else "")
            text.append(f"      {status}\n", style=style)
        return text


class StateGrid(DataTable):
    """Steps (rows) x nodes (columns) as state glyphs; marked cells are underlined, cells set
    to be skipped show the skip glyph."""

    DEFAULT_CSS = """
    StateGrid { height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=False, **kwargs)

    def build(self, steps: Sequence[Step], nodes: Sequence[str]) -> None:
        self.clear(columns=True)
        for node in nodes:
            self.add_column(node, key=node)
        for step in steps:
            self.add_row(*(" " for _ in nodes), key=step.id, label=step.id)

    def paint(self, standing: Standing, marked: set[CellKey], skips: set[CellKey],
              keys: Iterable[CellKey] | None = None) -> None:
        """Re-render ``keys`` (every cell when None)."""
        steps = {s.id: s for s in standing.steps}
        if keys is None:
            keys = [(s.id, n) for s in standing.steps for n in standing.cluster.names()]
        for step, node in keys:
            if step not in steps:
                continue
            if node not in steps[step].nodes(standing.cluster):
                cell = Text("", justify="center")
            else:
                state = standing.state(step, node)
                glyph, style = GLYPHS[StepState.SKIPPED if (step, node) in skips
                                      and state in (None, StepState.PENDING) else state]
                if (step, node) in marked:
                    style += " underline reverse"
                cell = Text(glyph, style=style, justify="center")
            self.update_cell(step, node, cell)


class SudoSecret:
    """The sudo password, in memory only: given to the pool as its ``sudo_password`` callable.
    Its repr never shows the value."""

    def __init__(self) -> None:
        self._value: str | None = None
        self.asked = False

    def set(self, value: str | None) -> None:
        self._value, self.asked = (value or None), True

    @property
    def known(self) -> bool:
        return self._value is not None

    def __call__(self) -> str | None:
        return self._value

    def __repr__(self) -> str:
        return f"SudoSecret({'set' if self._value else 'unset'})"


class PasswordInput(Input):
    """An ``Input(password=True)`` whose messages never show the value in their repr."""

    class Changed(Input.Changed):
        def __repr__(self) -> str:
            return "PasswordInput.Changed(value=********)"

    class Submitted(Input.Submitted):
        def __repr__(self) -> str:
            return "PasswordInput.Submitted(value=********)"

    class Blurred(Input.Blurred):
        def __repr__(self) -> str:
            return "PasswordInput.Blurred(value=********)"

    def __init__(self, **kwargs) -> None:
        super().__init__(password=True, **kwargs)


class _Dialog(ModalScreen[bool]):
    DEFAULT_CSS = """
    _Dialog { align: center middle; }
    _Dialog > Vertical { width: 76; max-width: 100%; height: auto; max-height: 100%;
                         border: thick $accent; background: $surface; padding: 0 1; }
    _Dialog VerticalScroll { height: auto; max-height: 14; }
    _Dialog #confirm-buttons { height: 1; margin-top: 1; }
    _Dialog Button { margin: 0 2 0 0; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def action_cancel(self) -> None:
        self.dismiss(False)


class PasswordModal(_Dialog):
    """Asks once for the sudo password of the nodes that need one; fills ``secret``."""

    def __init__(self, secret: SudoSecret, nodes: Sequence[str]) -> None:
        super().__init__()
        self.secret, self.nodes = secret, list(nodes)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"[b]sudo password[/b] for {', '.join(self.nodes)}\n"
                         "[dim]Kept in memory only, for this session; never written or logged. "
                         "Enter: use it · escape: cancel the run[/dim]")
            yield PasswordInput(id="sudo-password", placeholder="password")

    def on_password_input_submitted(self, event: PasswordInput.Submitted) -> None:
        event.stop()
        self.secret.set(event.value)
        event.input.value = ""
        self.dismiss(self.secret.known)


class ConfirmModal(_Dialog):
    """Lists what root or destructive steps will change, per step and node; y/enter to go on."""

    BINDINGS = [Binding("y", "confirm", "Run", id="dialog.confirm"),
                Binding("escape,n", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, title: str, lines: Sequence[str]) -> None:
        super().__init__()
        self.title_text, self.lines = title, list(lines)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"[b]{self.title_text}[/b]\nThese steps run as root or change the "
                         "system:")
            with VerticalScroll():
                yield Static(Text("\n".join(self.lines)), id="confirm-changes")
            with Horizontal(id="confirm-buttons"):
                yield Button("Run (y)", id="confirm-yes", variant="warning", compact=True)
                yield Button("Cancel (n)", id="confirm-no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_confirm(self) -> None:
        self.dismiss(True)
