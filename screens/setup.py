"""The Setup screen: the guided bring-up (the seed guide's sections 3 and 7.1, made safe to run
twice).

Left, the phases in the seed's order with where the cluster stands; right, the step x node grid
of states; below, the log pane: the selected cell's commands and its log (live while it runs),
or a dry run's commands. Runs go through :class:`console.bringup.Runner` in a thread worker; its
events are buffered by :class:`~screens.setup_widgets.RunFeed` and drained at most
``RENDER_EVERY`` seconds apart, so a chatty step never floods the screen.

Root steps: before a run that has any, the nodes are asked how sudo works there; where it needs
a password, a modal asks once and the password stays in memory (given to the pool as its
``sudo_password`` callable), never in a message, a log or a file.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import DataTable, Log, Static

from console.bringup import STEPS, RunSummary, SetupOptions, Step, StepState
from console.bringup.runner import Runner
from screens.base import ConsoleScreen
from screens.messages import (
    SetupRunFinished,
    SetupRunProgress,
    SetupStandingRead,
    SetupSudoChecked,
    SetupText,
)
from screens.setup_widgets import (
    LEGEND,
    LIVE_TAIL,
    CellKey,
    ConfirmModal,
    Known,
    PasswordModal,
    PhaseChecklist,
    RunFeed,
    Standing,
    StateGrid,
    SudoSecret,
    change_list,
    plan_lines,
    read_log_tail,
    read_summaries,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The grid, checklist and log pane take a run's news at most this often (seconds).
RENDER_EVERY = 0.25
#: Lines the log pane keeps.
LOG_LINES = 5000

NOTHING_TO_DO = "nothing to do: every step already done"


def outcome(summary: RunSummary) -> str:
    """One line for the operator about a finished run."""
    quiet = (StepState.ALREADY_DONE, StepState.NOT_APPLICABLE, StepState.SKIPPED)
    if summary.cells and all(c.state in quiet for c in summary.cells):
        counts = ", ".join(f"{n} {s}" for s, n in summary.counts().items())
        return f"{NOTHING_TO_DO} ({counts})"
    return summary.message()


class SetupScreen(ConsoleScreen):
    """Guided bring-up: phases, the step x node grid, per-cell logs, dry run and runs."""

    HELP = (
        "Guided bring-up. Left: the phases in the seed guide's order and where the cluster "
        "stands (from the saved runs and the live one). Right: every step (rows) on every node "
        "(columns); move with the arrows, the log pane shows the cell's check/apply/verify "
        "commands for that node and its log, live while it runs.\n"
        "A step first checks whether it is already done (then it changes nothing), else applies "
        "and verifies. Root or destructive steps ask for confirmation, listing what they change; "
        "sudo's password, if a node needs one, is asked once and kept in memory only.\n"
        "Mark cells with space to run only those; s sets a cell to be skipped (or skips a "
        "pending cell of the running run). Logs: <state dir>/runs/<run>/<node>/<step>.log.\n"
        "Glyphs: " + LEGEND.replace("\n", ", ")
    )
    #: Actions that change a node or a file: refused in read-only mode (screens/app.py).
    WRITES: ClassVar[dict[str, str]] = {
        "run_step": "setup: run a step", "run_all": "setup: run every step",
        "run_marked": "setup: run the marked steps", "retry_failed": "setup: retry failed steps",
    }
    BINDINGS = [
        Binding("d", "dry_run", "Dry run", id="setup.dry_run"),
        Binding("r", "run_step", "Run step", id="setup.run_step"),
        Binding("R", "run_all", "Run all", key_display="R", id="setup.run_all"),
        Binding("space", "mark", "Mark", id="setup.mark"),
        Binding("m", "run_marked", "Run marked", id="setup.run_marked"),
        Binding("f", "retry_failed", "Retry failed", id="setup.retry_failed"),
        Binding("s", "skip", "Skip", id="setup.skip"),
        Binding("x", "stop_run", "Stop run", show=False, id="setup.stop"),
    ]
    DEFAULT_CSS = """
    SetupScreen #setup-top { height: 1fr; }
    SetupScreen #setup-side { width: 26; height: 100%; }
    SetupScreen #setup-legend { color: $text-muted; padding: 0 1; }
    SetupScreen #setup-log-title { height: 1; background: $boost; padding: 0 1; }
    SetupScreen #setup-log { height: 40%; }
    SetupScreen #setup-status { height: 1; padding: 0 1; }
    """

    def __init__(self, *, options: SetupOptions | None = None, state_dir: Path | None = None,
                 steps: Sequence[Step] = STEPS) -> None:
        super().__init__()
        self.options = options or SetupOptions()
        self._state_dir = state_dir
        self.steps = list(steps)
        self.marked: set[CellKey] = set()
        self.skips: set[CellKey] = set()
        self.secret = SudoSecret()
        self.runner: Runner | None = None
        self._feed: RunFeed | None = None
        self._pending: Runner | None = None
        self._live: dict[CellKey, deque[str]] = {}
        self._shown: CellKey | None = None
        self._last_drain = 0.0
        self._drain_timer: Timer | None = None
        self.standing: Standing | None = None
        self._seen_run: str | None = None

    @property
    def state_dir(self) -> Path:
        if self._state_dir is None:
            from console.cli import state_dir

            self._state_dir = state_dir()
        return self._state_dir

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        with Horizontal(id="setup-top"):
            with Vertical(id="setup-side"):
                yield PhaseChecklist(id="setup-phases")
                yield Static(LEGEND, id="setup-legend")
            yield StateGrid(id="setup-grid")
        yield Static("", id="setup-log-title")
        yield Log(max_lines=LOG_LINES, id="setup-log")
        yield Static("", id="setup-status")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        cluster = self.console.cluster
        self.standing = Standing(cluster, self.steps)
        self.grid.build(self.steps, cluster.names())
        self._lend_password()
        # The first picture is complete at once (a few small local files; later reads, when
        # the screen is shown again, happen in a worker).
        self.on_setup_standing_read(SetupStandingRead(read_summaries(self.state_dir)),
                                    immediate=True)

    def on_screen_resume(self) -> None:
        if self.standing is not None and self.runner is None:
            self.read_standing()

    def on_unmount(self) -> None:
        if self.runner is not None:
            self.runner.cancel()
        if self._feed is not None:
            self._feed.close()

    def unsaved_work(self) -> str | None:
        """A run under way (this console drives it: leaving stops it); the app asks before it
        quits or reloads the cluster."""
        runner = self.runner
        if runner is None:
            return None
        cells = list(runner.cells.values())
        finished = sum(1 for c in cells if c.state.final)
        return (f"Setup: run {runner.run_id} is applying steps ({finished}/{len(cells)} cells "
                "finished); this console drives it, so leaving stops it (running commands "
                "cancelled, pending cells skipped).")

    def discard_work(self) -> None:
        """Leaving anyway: stop the run (as x does)."""
        if self.runner is not None:
            self.runner.cancel()

    @property
    def grid(self) -> StateGrid:
        return self.query_one("#setup-grid", StateGrid)

    @property
    def log_pane(self) -> Log:
        return self.query_one("#setup-log", Log)

    def _status(self, text: str) -> None:
        self.query_one("#setup-status", Static).update(text)

    def _repaint(self, keys: list[CellKey] | None = None) -> None:
        assert self.standing is not None
        self.grid.paint(self.standing, self.marked, self.skips, keys)
        self.query_one("#setup-phases", PhaseChecklist).show(self.standing)

    def _lend_password(self) -> None:
        """The pool asks this screen's in-memory secret for sudo's password, never a terminal
        prompt (which would fight Textual for the terminal)."""
        self.console.pool.set_sudo_password(self.secret)

    def _cursor(self) -> CellKey | None:
        grid = self.grid
        if grid.row_count == 0 or not grid.columns:
            return None
        key = grid.coordinate_to_cell_key(grid.cursor_coordinate)
        return (str(key.row_key.value), str(key.column_key.value))

    # ------------------------------------------------------------------ where the cluster stands

    @work(thread=True, exclusive=True, group="setup-read", name="read the saved bring-up runs",
          exit_on_error=False)
    def read_standing(self) -> None:
        self.post_message(SetupStandingRead(read_summaries(self.state_dir)))

    def on_setup_standing_read(self, message: SetupStandingRead, immediate: bool = False) -> None:
        """Where the cluster stands, from the saved runs (not while a run is going)."""
        assert self.standing is not None
        newest = message.summaries[-1].run_id if message.summaries else None
        if self.runner is not None or (newest == self._seen_run and not immediate):
            return  # nothing new (e.g. a modal closed), or a run of ours is going
        self._seen_run = newest
        self.standing.cells.clear()
        for summary in message.summaries:
            self.standing.absorb(summary)
        self._repaint()
        last = message.summaries[-1] if message.summaries else None
        self._status(f"last run {last.run_id}: {outcome(last)}" if last else
                     "no bring-up run yet: d shows what a run would do, R runs every step")
        self._show_cell(self._cursor(), immediate)

    # ------------------------------------------------------------------ the log pane

    @on(DataTable.CellHighlighted, "#setup-grid")
    def _cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        self._show_cell((str(event.cell_key.row_key.value), str(event.cell_key.column_key.value)))

    def _show_cell(self, key: CellKey | None, immediate: bool = False) -> None:
        """Show the cell's commands and log in the pane (read in a worker unless
        ``immediate``)."""
        if key is None or self.standing is None:
            return
        self._shown = key
        step = next(s for s in self.steps if s.id == key[0])
        node = key[1]
        if node not in step.nodes(self.standing.cluster):
            self.on_setup_text(SetupText(f"{step.id}: does not run on {node}", [], key))
            return
        state = self.standing.state(*key)
        title = f"{step.id} on {node}: {state.value if state else 'not run yet'}"
        live = list(self._live[key]) if key in self._live else None
        known = self.standing.cells.get(key)
        if immediate:
            self.on_setup_text(SetupText(title, self._cell_lines(step, node, live, known), key))
        else:
            self.load_cell(step, node, title, live, known)

    @work(thread=True, exclusive=True, group="setup-cell", name="show a bring-up cell",
          exit_on_error=False)
    def load_cell(self, step: Step, node: str, title: str, live: list[str] | None,
                  known: Known | None) -> None:
        self.post_message(SetupText(title, self._cell_lines(step, node, live, known),
                                    (step.id, node)))

    def _cell_lines(self, step: Step, node: str, live: list[str] | None,
                    known: Known | None) -> list[str]:
        """The cell's commands, then its live lines (a running cell) or its log's end."""
        lines = plan_lines(self._runner([step], nodes=[node]))
        if live is not None:
            lines += ["── live output"] + live
        elif known is None:
            lines += ["── no log yet: this step has not run on this node"]
        elif known.log:
            lines += [f"── log {known.log}"] + read_log_tail(known.log)
        else:
            lines += [f"── run {known.run_id} kept no log of this cell"
                      + (f": {known.detail}" if known.detail else "")]
        return lines

    def on_setup_text(self, message: SetupText) -> None:
        if message.cell is not None and message.cell != self._shown:
            return  # the cursor moved on meanwhile
        self.query_one("#setup-log-title", Static).update(message.title)
        pane = self.log_pane
        pane.clear()
        pane.write_lines(message.lines)

    # ------------------------------------------------------------------ choosing what runs

    def _runner(self, steps: Sequence[Step], *, nodes: Sequence[str] | None = None,
                only: set[CellKey] | None = None, previous: RunSummary | None = None) -> Runner:
        return Runner(self.console.pool, self.console.cluster, steps, state_dir=self.state_dir,
                      options=self.options, nodes=nodes, only=only, previous=previous)

    def _cells_runner(self, cells: set[CellKey], previous: RunSummary | None = None) -> Runner:
        steps = [s for s in self.steps if s.id in {k[0] for k in cells}]
        nodes = [n for n in self.console.cluster.names() if n in {k[1] for k in cells}]
        return self._runner(steps, nodes=nodes, only=set(cells), previous=previous)

    def _chosen(self) -> Runner:
        """The marked cells, else every step on every node."""
        return self._cells_runner(self.marked) if self.marked else self._runner(self.steps)

    def action_mark(self) -> None:
        key = self._cursor()
        if key is None:
            return
        self.marked.symmetric_difference_update({key})
        self._repaint([key])
        self._status(f"{len(self.marked)} cell(s) marked: m runs them, d shows their commands"
                     if self.marked else "no cell marked")

    def action_skip(self) -> None:
        key = self._cursor()
        if key is None:
            return
        if self.runner is not None and key in self.runner.cells:
            if self.runner.skip(*key):
                self._status(f"{key[0]} on {key[1]}: skipped by the operator")
            else:
                self._status(f"{key[0]} on {key[1]} is no longer pending: it cannot be skipped")
            return
        self.skips.symmetric_difference_update({key})
        self._repaint([key])
        self._status(f"{key[0]} on {key[1]}: "
                     + ("will be skipped by the next run" if key in self.skips else "will run"))

    def action_dry_run(self) -> None:
        runner = self._chosen()
        self.dry_run(runner, "dry run of the marked cells" if self.marked else
                     "dry run of every step")

    @work(thread=True, exclusive=True, group="setup-cell", name="dry run", exit_on_error=False)
    def dry_run(self, runner: Runner, title: str) -> None:
        lines = plan_lines(runner)
        self.post_message(SetupText(f"{title}: {len(runner.cells)} cell(s), nothing touched",
                                    lines))

    def action_run_all(self) -> None:
        self._request(self._runner(self.steps), "Run every step")

    def action_run_step(self) -> None:
        key = self._cursor()
        if key is not None:
            step = next(s for s in self.steps if s.id == key[0])
            self._request(self._runner([step]), f"Run {step.id} on every node")

    def action_run_marked(self) -> None:
        if not self.marked:
            self._status("nothing marked: mark cells with space first")
            return
        self._request(self._cells_runner(self.marked), f"Run {len(self.marked)} marked cell(s)")

    def action_retry_failed(self) -> None:
        assert self.standing is not None
        failed = self.standing.failed()
        if not failed:
            self._status("nothing failed: nothing to retry")
            return
        self._request(self._cells_runner(failed, previous=self.standing.as_summary()),
                      f"Retry {len(failed)} failed cell(s)")

    def action_stop_run(self) -> None:
        if self.runner is not None:
            self.runner.cancel()
            self._status("stopping: running commands are cancelled, pending cells skipped")

    # ------------------------------------------------------------------ confirm, sudo, run

    def _request(self, runner: Runner, title: str) -> None:
        if self.runner is not None or self._pending is not None:
            self._status("a run is in progress: wait for it, or x stops it")
            return
        if not runner.cells:
            self._status("nothing to run for this choice")
            return
        changes = change_list(self.console.cluster, self.options, runner.steps, runner.cells)
        if not changes:
            self._check_sudo(runner)
            return
        self.app.push_screen(ConfirmModal(title, changes),
                             lambda ok: self._check_sudo(runner) if ok else
                             self._status("run cancelled: nothing changed"))

    def _check_sudo(self, runner: Runner) -> None:
        by_id = {s.id: s for s in runner.steps}
        nodes = sorted({n for (s, n) in runner.cells if by_id[s].needs_root})
        if not nodes or (self.secret.known and not self._refused(nodes)):
            self._start(runner)
            return
        self._pending = runner
        self._status("asking the nodes how sudo works there…")
        self.probe_sudo(nodes)

    @work(thread=True, exclusive=True, group="setup-sudo", name="check sudo on the nodes",
          exit_on_error=False)
    def probe_sudo(self, nodes: list[str]) -> None:
        from console.ssh.pool import SUDO_PROBE, parse_sudo_probe

        results = self.console.pool.run_all(SUDO_PROBE, nodes=nodes, timeout=30)
        modes = {node: parse_sudo_probe(result.stdout) or "password"
                 for node, result in results.items()}
        self.post_message(SetupSudoChecked(modes))

    def on_setup_sudo_checked(self, message: SetupSudoChecked) -> None:
        runner, self._pending = self._pending, None
        if runner is None:
            return
        need = [n for n, mode in message.modes.items() if mode == "password"]
        refused = self._refused(need)
        if not need or (self.secret.known and not refused):
            self._start(runner)
            return
        if refused:
            self._status(f"sudo refused the password on {', '.join(refused)}: type it again")

        def given(ok: bool | None) -> None:
            if ok:
                self._start(runner)
            else:
                self._status("run cancelled: sudo needs a password on " + ", ".join(need))

        self.app.push_screen(PasswordModal(self.secret, need), given)

    def _refused(self, nodes: list[str]) -> list[str]:
        """The nodes whose sudo refused the password this screen holds (never sent again)."""
        return [n for n in nodes if self.console.pool.sudo_refused(n)]

    def _start(self, runner: Runner) -> None:
        assert self.standing is not None
        for key in self.skips & set(runner.cells):
            runner.skip(*key)
        self.runner, self._feed = runner, RunFeed(self, runner)
        self._live = {key: deque(maxlen=LIVE_TAIL) for key in runner.cells}
        for key, cell in runner.cells.items():
            self.standing.set(key, cell.state, cell.detail, runner.run_id)
        self.skips -= set(runner.cells)
        self.marked.clear()
        self._repaint()
        self._status(f"run {runner.run_id}: {len(runner.cells)} cell(s)…")
        self._show_cell(self._shown)
        self.run_bringup(runner, self._feed)

    @work(thread=True, exclusive=True, group="setup-run", name="bring-up run",
          exit_on_error=False)
    def run_bringup(self, runner: Runner, feed: RunFeed) -> None:
        summary = None
        try:
            summary = runner.run()
        finally:
            feed.close()
            self.post_message(SetupRunFinished(summary))

    # ------------------------------------------------------------------ live progress

    def on_setup_run_progress(self, message: SetupRunProgress) -> None:
        wait = self._last_drain + RENDER_EVERY - time.monotonic()
        if wait <= 0:
            self._drain()
        elif self._drain_timer is None:
            self._drain_timer = self.set_timer(wait, self._drain)

    def _drain(self) -> None:
        self._drain_timer = None
        self._last_drain = time.monotonic()
        if self._feed is None or self.runner is None or self.standing is None:
            return
        states, lines = self._feed.drain()
        for key, (state, detail) in states.items():
            cell = self.runner.cells.get(key)
            self.standing.set(key, state, detail, self.runner.run_id, cell.log if cell else None)
        for key, new in lines.items():
            self._live.setdefault(key, deque(maxlen=LIVE_TAIL)).extend(new)
            if key == self._shown:
                self.log_pane.write_lines(new)
        if states:
            self._repaint(list(states))
            if self._shown in states:
                state = self.standing.state(*self._shown)
                self.query_one("#setup-log-title", Static).update(
                    f"{self._shown[0]} on {self._shown[1]}: {state.value if state else ''}")
            cells = self.runner.cells.values()
            finished = sum(1 for c in cells if c.state.final)
            self._status(f"run {self.runner.run_id}: {finished}/{len(cells)} cell(s) finished"
                         " · x stops")

    def on_setup_run_finished(self, message: SetupRunFinished) -> None:
        self._drain()
        if self._drain_timer is not None:
            self._drain_timer.stop()
            self._drain_timer = None
        self.runner, self._feed, self._live = None, None, {}
        assert self.standing is not None
        if message.summary is None:
            self._status("the run stopped on an error (see the notification)")
            return
        self.standing.absorb(message.summary)
        self._seen_run = message.summary.run_id
        self._repaint()
        self._status(f"run {message.summary.run_id}: {outcome(message.summary)}")
        self._show_cell(self._shown)


SCREEN = SetupScreen
