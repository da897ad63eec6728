"""The Training screen: launch a run on every node, follow it live, stop it, resume it.

When first shown it looks for this cluster's runs (``console.training.runs.find_runs``, in a thread worker):
a live run is reattached (its logs followed from where the run's output starts), else the newest
run is shown as it ended. Launching (``l``) opens :class:`LaunchDialog`: the profile and options,
then the whole plan (every node's command, environment, working directory and log file) and each
pre-flight check with its message. A failed check (a DeepSpeed config with errors among them)
refuses the launch until the operator overrides it explicitly (``o``); the launch is confirmed
before it starts, in a thread worker. ``s`` stops the run (confirmed; SIGTERM to every node's
process group, SIGKILL after a grace period), ``r`` relaunches a run that ended with
``train_conf.resume=true``.

Following: :class:`console.training.follow.RunFollower` reads every node's log over the pool into one
:class:`console.training.metrics.MetricsStore` and calls back at most every ``follow_interval`` seconds;
:func:`follow_run` turns each call into a :class:`~screens.messages.RunProgress` (a newer one
replaces a queued older one). The widgets are drawn from copies of the store, at most every
``RENDER_EVERY`` seconds however fast lines arrive, only when the store's ``revision`` moved, and
only while the screen is shown.

At 80x24 one pane fills the body (charts by default; ranks, events, faults and the plan one key
away: ``c k e f i``); on a large terminal the charts sit above the rank table, the event feed and
the fault panel.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from console.cli import state_dir
from console.cluster.redact import redact_env, restore_env
from console.gpu.telemetry import TelemetryUpdate, feed_utilisation
from console.training.follow import RunFollower, last_step
from console.training.launch import (
    ENTRIES,
    CheckpointChoice,
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    Preparation,
    launch,
    prepare,
    resume_options,
    resume_profile,
)
from console.training.logview import LogView
from console.training.metrics import MetricsStore
from console.training.profile import ProfileError, default_profile, load_profile, profile_path_for
from console.training.runs import RunRecord, RunStatus, find_runs, run_status, stop_run
from screens.base import ConsoleModal, ConsoleScreen
from screens.keys import SCREENS
from screens.messages import (
    LaunchPrepared,
    MetricsExported,
    RunFollowed,
    RunLaunched,
    RunProgress,
    RunsFound,
    RunStatusChecked,
    RunStepsRead,
    RunStopped,
)
from screens.node_form import ConfirmDialog
from screens.throttle import RedrawThrottle
from screens.training_widgets import (
    ChartData,
    EventFeed,
    FaultPanel,
    LossChart,
    LrChart,
    RankTable,
    SyncChart,
    progress_text,
)

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from console.training.profile import TrainingProfile

#: The widgets are drawn at most this often (seconds), however fast lines arrive.
RENDER_EVERY = 0.5
#: While a run is followed, the rank table's "since" column is refreshed this often (seconds).
TICK_EVERY = 1.0
#: Seconds between looks for a run started elsewhere (``svconsole launch``, another console)
#: while this screen is shown and follows no live run.
RESCAN_EVERY = 15.0
#: Seconds between SIGTERM and SIGKILL when stopping a run.
STOP_GRACE = 20.0
#: The panes, with the key that shows each one.
PANES: tuple[tuple[str, str, str], ...] = (
    ("charts", "c", "Charts"), ("ranks", "k", "Ranks"), ("events", "e", "Events"),
    ("faults", "f", "Faults"), ("plan", "i", "Plan"),
)
#: From this terminal size on, the charts, rank table, events and faults show together.
WIDE = (140, 40)


def follow_run(target: MessagePump, follower: RunFollower) -> Callable[[], None]:
    """Post a :class:`RunProgress` to ``target`` for each of the follower's (coalesced) updates;
    returns the unsubscribe function."""
    return follower.subscribe(lambda update: target.post_message(RunProgress(update)))


def parse_env(text: str) -> dict[str, str]:
    """``KEY=VALUE KEY2='a b'`` (shell quoting) as a dict; ValueError names a bad word."""
    out: dict[str, str] = {}
    for word in shlex.split(text):
        key, sep, value = word.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise ValueError(f"env: {word!r} is not KEY=VALUE")
        out[key] = value
    return out


# ---------------------------------------------------------------------------- launch dialog


@dataclass(frozen=True)
class LaunchSpec:
    """What the operator chose in the launch dialog. ``profile_path`` None: the resumed run's own
    profile (with ``train_conf.resume=true``), else the packaged default."""

    profile_path: Path | None
    options: LaunchOptions
    resume: RunRecord | None = None

    def profile(self) -> TrainingProfile:
        """The profile to launch; raises ProfileError naming the file, line and key."""
        resuming = self.resume is not None or self.options.checkpoint == "resume"
        if self.profile_path is not None and (self.profile_path.exists() or self.resume is None):
            profile = load_profile(self.profile_path)
            return profile.replace("train_conf.resume", True) if resuming else profile
        if self.resume is not None:
            return resume_profile(self.resume)
        profile = default_profile()
        return profile.replace("train_conf.resume", True) if resuming else profile


CHECKPOINT_CHOICES: list[tuple[str, CheckpointChoice]] = [
    ("ask: refuse while output_dir holds a model.pt", "refuse"),
    ("resume from output_dir's model.pt", "resume"),
    ("fresh: move output_dir aside (kept), start anew", "fresh"),
]
"""The launch dialog's answer to a checkpoint in output_dir (the CLI's --resume / --fresh;
override, o, is its --force)."""


@dataclass(frozen=True)
class LaunchRequest:
    """The dialog's answer: launch ``prep`` (``force``: despite failed checks)."""

    prep: Preparation
    force: bool = False
    resumed_from: str | None = None


def plan_text(plan: LaunchPlan | None, checks: list | tuple = ()) -> Text:
    """The plan in full, then every pre-flight check (ok, warn or FAIL, with its message)."""
    out = Text()
    if plan is not None:
        out.append("PLAN\n", style="bold")
        out.append(plan.describe() + "\n\n")
    if checks:
        out.append("PRE-FLIGHT\n", style="bold")
        for c in checks:
            mark, style = (("  FAIL ", "bold red") if not c.ok else ("  warn ", "yellow")
                           if c.warning else ("  ok   ", "green"))
            out.append(mark, style=style)
            where = f"{c.node}: " if c.node else ""
            out.append(f"{c.name}: {where}{c.message}\n")
    out.rstrip()
    return out


class RunPicker(ConsoleModal):
    """Every run of this cluster as the last look found them (live, finished, failed, lost),
    newest first, with its start time, nodes and last step (read from its log in a thread, the
    followed run's too: its follower may still be catching up with the log); enter follows the
    one chosen, escape keeps the current one."""

    DEFAULT_CSS = """
    RunPicker { align: center middle; }
    RunPicker > Vertical {
        width: 110; max-width: 100%; height: auto; max-height: 90%; border: round $accent;
        background: $surface; padding: 0 1;
    }
    RunPicker OptionList { height: auto; max-height: 20; }
    """
    BINDINGS = [Binding("escape", "dismiss_none", "Cancel", id="picker.cancel")]

    def __init__(self, pool, statuses: list[RunStatus], current: str | None,
                 seen: dict[str, int]) -> None:
        super().__init__()
        self.pool, self.statuses, self.current = pool, statuses, current
        self.seen = dict(seen)
        """Steps already seen (the followed run's store): the least a run's last step can be,
        and what is shown when its log cannot be read."""
        self.steps: dict[str, int | None] = {}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Runs of this cluster (enter follows, escape keeps the current one)")
            yield OptionList(*self._options(), id="run-options")

    def on_mount(self) -> None:
        self.read_steps()

    def _options(self) -> list[Option]:
        out = []
        for st in self.statuses:
            r = st.record
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created))
            step = self.steps.get(r.id, "…")
            mark = "▶ " if r.id == self.current else "  "
            nodes = ",".join(n.node for n in r.nodes)
            out.append(Option(f"{mark}{r.id}  {st.state:<8} {started}  {nodes}  "
                              f"last step {'?' if step is None else step}", id=r.id))
        return out

    @work(thread=True, exclusive=True, name="read the runs' last steps", exit_on_error=False)
    def read_steps(self) -> None:
        steps: dict[str, int | None] = {}
        for st in self.statuses:
            read, seen = last_step(self.pool, st), self.seen.get(st.record.id)
            steps[st.record.id] = seen if read is None else max(read, seen or 0)
        self.post_message(RunStepsRead(steps))

    @on(RunStepsRead)
    def take_steps(self, message: RunStepsRead) -> None:
        self.steps = message.steps
        options = self.query_one("#run-options", OptionList)
        highlighted = options.highlighted
        options.clear_options()
        options.add_options(self._options())
        options.highlighted = highlighted

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class LaunchDialog(ConsoleModal):
    """Choose the profile and options, see the plan and the pre-flight checks, then launch.

    enter (in a field) builds the plan and runs the checks; ``o`` overrides failed checks; ``l``
    launches (after a confirmation); ``b`` goes back to the fields; escape cancels."""

    DEFAULT_CSS = """
    LaunchDialog { align: center middle; }
    LaunchDialog > Vertical {
        width: 100%; max-width: 132; height: 100%; max-height: 60;
        border: round $accent; background: $surface; padding: 0 1;
    }
    LaunchDialog .launch-row { height: 1; }
    LaunchDialog .launch-row Label { width: 12; }
    LaunchDialog .launch-row Input, LaunchDialog .launch-row Select { width: 1fr; }
    LaunchDialog #launch-status { height: auto; max-height: 4; margin-top: 1; }
    LaunchDialog #launch-review { height: 1fr; border-top: solid $primary-darken-2; }
    """
    #: Actions that change a node or a file: refused in read-only mode (screens/app.py).
    WRITES: ClassVar[dict[str, str]] = {"launch": "launching a run"}
    BINDINGS: ClassVar = [
        Binding("o", "override", "Override failed checks", id="launch.override"),
        Binding("l", "launch", "Launch", id="launch.go"),
        Binding("b", "back", "Back to the fields", id="launch.back"),
        Binding("escape", "cancel", "Cancel", id="launch.cancel"),
    ]

    def __init__(self, pool, profile_path: Path | None, *, resume: RunRecord | None = None,
                 options: LaunchOptions | None = None) -> None:
        super().__init__()
        self.pool = pool
        self.resume = resume
        self.profile_path = profile_path
        self.options = options or (resume_options(resume) if resume else LaunchOptions())
        self.prep: Preparation | None = None
        self.override = False
        self.busy = False

    def compose(self) -> ComposeResult:
        title = (f"Resume run {self.resume.id} (train_conf.resume=true)" if self.resume
                 else "Launch a training run on every node")
        with Vertical():
            yield Static(Text(title, style="bold"))
            with Horizontal(classes="launch-row"):
                yield Label("profile")
                yield Input(str(self.profile_path or ""), id="launch-profile", compact=True,
                            placeholder="the run's own profile" if self.resume
                            else "training.yaml (empty: the packaged default)")
            with Horizontal(classes="launch-row"):
                yield Label("entry")
                yield Select([(e, e) for e in ENTRIES], value=self.options.entry,
                             allow_blank=False, id="launch-entry", compact=True)
            with Horizontal(classes="launch-row"):
                yield Label("procs/node")
                yield Input(str(self.options.nproc_per_node or ""), id="launch-nproc",
                            compact=True, placeholder="its GPUs (1 with cpu-wrapper)")
            with Horizontal(classes="launch-row"):
                yield Label("env")
                shown = redact_env(self.options.env)  # a secret stays ******** (and is kept)
                yield Input(" ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items()),
                            id="launch-env", compact=True, placeholder="KEY=VALUE ... (optional)")
            with Horizontal(classes="launch-row"):
                yield Label("checkpoint")
                yield Select(CHECKPOINT_CHOICES, value=self.options.checkpoint,
                             allow_blank=False, id="launch-checkpoint", compact=True,
                             disabled=self.resume is not None)
            yield Static(id="launch-status")
            with VerticalScroll(id="launch-review"):
                yield Static(id="launch-plan")

    def on_mount(self) -> None:
        self._say("enter: build the plan and run the pre-flight checks · escape: cancel")
        self.query_one("#launch-profile", Input).focus()

    def _say(self, text: str | Text) -> None:
        self.query_one("#launch-status", Static).update(text)

    def spec(self) -> LaunchSpec:
        """The fields as a :class:`LaunchSpec`; ValueError names the bad field."""
        raw_path = self.query_one("#launch-profile", Input).value.strip()
        nproc = self.query_one("#launch-nproc", Input).value.strip()
        if nproc and (not nproc.isdigit() or int(nproc) < 1):
            raise ValueError(f"procs/node: {nproc!r} is not a positive number")
        options = replace(self.options, entry=self.query_one("#launch-entry", Select).value,
                          checkpoint=self.query_one("#launch-checkpoint", Select).value,
                          nproc_per_node=int(nproc) if nproc else None,
                          env=restore_env(parse_env(self.query_one("#launch-env", Input).value),
                                          self.options.env))
        return LaunchSpec(Path(raw_path).expanduser() if raw_path else None, options, self.resume)

    @on(Input.Submitted)
    def start_prepare(self) -> None:
        if self.busy:
            return
        try:
            spec = self.spec()
        except ValueError as exc:
            self._say(Text(str(exc), style="bold red"))
            return
        self.busy, self.prep, self.override = True, None, False
        self.query_one("#launch-plan", Static).update("")
        self._say(f"asking {len(self.pool.cluster.nodes)} node(s), building the plan, "
                  "running the pre-flight checks…")
        self.prepare(spec)

    @on(Select.Changed)
    def choice_changed(self, event: Select.Changed) -> None:
        """A choice changed after the checks were shown: they are run again for it."""
        if self.prep is not None and not self.busy:
            self.start_prepare()

    @work(thread=True, exclusive=True, group="launch-prepare", name="plan and pre-flight",
          exit_on_error=False)
    def prepare(self, spec: LaunchSpec) -> None:
        try:
            profile = spec.profile()
        except ProfileError as exc:
            self.post_message(LaunchPrepared(None, str(exc)))
            return
        self.post_message(LaunchPrepared(prepare(self.pool, profile, spec.options)))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        super().on_worker_state_changed(event)  # the app's one handler says why
        if event.state is WorkerState.ERROR:
            self.busy = False
            self._say(Text(f"{event.worker.name} failed (see the notification); "
                           "enter tries again", style="bold red"))

    @on(LaunchPrepared)
    def show_preparation(self, message: LaunchPrepared) -> None:
        self.busy = False
        self.prep = message.prep
        if message.prep is None:
            self._say(Text(f"cannot launch: {message.problem}", style="bold red"))
            return
        prep = message.prep
        self.query_one("#launch-plan", Static).update(plan_text(prep.plan, prep.checks))
        self.query_one("#launch-review", VerticalScroll).focus()
        self._show_verdict()

    def _show_verdict(self) -> None:
        prep = self.prep
        if prep is None:
            return
        failed = prep.failures
        if prep.plan is None:
            self._say(Text("no plan could be built (see the FAIL lines) · b: back · escape",
                           style="bold red"))
        elif failed and not self.override:
            names = ", ".join(sorted({c.name for c in failed}))
            choose = ("checkpoint: set it to resume or fresh (b, then the checkpoint field) · "
                      if any(c.name == "checkpoint" for c in failed) and self.resume is None
                      else "")
            self._say(Text.assemble(
                (f"REFUSED: {len(failed)} pre-flight check(s) failed ({names}). ", "bold red"),
                f"{choose}o: override and launch anyway · b: back · escape: cancel"))
        elif failed:
            self._say(Text.assemble(
                ("OVERRIDE: the failed checks are ignored. ", "bold yellow"),
                "l: launch (asks first) · b: back · escape: cancel"))
        else:
            self._say(Text.assemble((f"all {len(prep.checks)} checks passed. ", "bold green"),
                                    "l: launch (asks first) · b: back · escape: cancel"))

    def action_override(self) -> None:
        if self.prep is not None and self.prep.failures and self.prep.plan is not None:
            self.override = not self.override
            self._show_verdict()
        elif self.prep is None:
            self._say_plan_first("o overrides failed pre-flight checks")
        else:
            self._say(Text("nothing to override: no check failed", style="yellow"))

    def _say_plan_first(self, what: str) -> None:
        """A key that needs the plan, pressed before there is one, says so (and what it is)."""
        busy = "the plan is being built…" if self.busy else "enter (in a field) builds it first"
        self._say(Text(f"{what} once the plan and the checks are shown: {busy} · escape: cancel",
                       style="yellow"))

    def action_launch(self) -> None:
        prep = self.prep
        if prep is None:
            self._say_plan_first("l launches")
            return
        if prep.plan is None or (prep.failures and not self.override):
            self._show_verdict()
            return
        plan = prep.plan
        despite = f", despite {len(prep.failures)} failed check(s)" if prep.failures else ""
        question = (f"Launch run {plan.run_id} on {plan.nnodes} node(s), world size "
                    f"{plan.world_size}{despite}? It runs on after svconsole exits.")

        def answered(yes: bool | None) -> None:
            if yes:
                self.dismiss(LaunchRequest(prep, bool(prep.failures),
                                           self.resume.id if self.resume else None))

        self.app.push_screen(ConfirmDialog(question), answered)

    def action_back(self) -> None:
        self.query_one("#launch-profile", Input).focus()
        self._say("back to the fields: change them, enter builds the plan and runs the checks "
                  "again · escape: cancel")

    def action_cancel(self) -> None:
        self.dismiss(None)


# ---------------------------------------------------------------------------- the screen


class TrainingScreen(ConsoleScreen):
    """Launch, follow, stop and resume the training run; charts, ranks, events, faults."""

    HELP = (
        "Training runs on every node of the cluster: torchrun with FunASR's train_ds.py, started "
        "detached (it outlives svconsole and the SSH connection) and followed live from the "
        "nodes' logs. Opening the screen reattaches to a live run.\n\n"
        "l launches: the plan and pre-flight checks are shown in full first; a failed check "
        "refuses until you override it (o), and the launch asks before it starts. s stops the run "
        "(SIGTERM, SIGKILL after 20 s); r resumes a run that ended (train_conf.resume=true: "
        "FunASR continues from output_dir/model.pt).\n\n"
        "Panes: c charts (train loss mean over ranks and validation loss, learning rate; p "
        "toggles one line per rank; a swaps the learning rate for the gradient-sync time per "
        "step, against the guide's 500 ms and 2000 ms marks), k rank table (node, rank, last "
        "step, loss, step time, GPU memory, seconds since its last line), e events (validation, "
        "checkpoints, best model, early stopping), f faults (what, where, the evidence lines, "
        "the fix), i the run's plan. x exports the charts as PNG and the metrics as CSV. t takes every rank's stack (py-spy, "
        "the training not stopped) and names the ranks the others wait for."
    )
    DEFAULT_CSS = """
    TrainingScreen #train-run, TrainingScreen #train-progress, TrainingScreen #train-tabs {
        height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis;
    }
    TrainingScreen #train-tabs { background: $boost; }
    TrainingScreen #train-body { height: 1fr; }
    TrainingScreen .pane { display: none; height: 1fr; }
    TrainingScreen .pane.-active { display: block; }
    TrainingScreen #lr-chart, TrainingScreen #sync-chart { height: 2fr; }
    TrainingScreen #sync-chart { display: none; }
    TrainingScreen #loss-chart { height: 3fr; }
    TrainingScreen #pane-events, TrainingScreen #pane-faults, TrainingScreen #pane-plan {
        padding: 0 1;
    }
    TrainingScreen.-wide #train-body {
        layout: grid; grid-size: 3 2; grid-rows: 3fr 2fr; grid-columns: 64 1fr 1fr;
    }
    TrainingScreen.-wide #pane-charts { display: block; column-span: 3; layout: horizontal; }
    TrainingScreen.-wide #pane-charts > * { height: 1fr; width: 1fr; }
    TrainingScreen.-wide #pane-ranks, TrainingScreen.-wide #pane-events,
    TrainingScreen.-wide #pane-faults { display: block; border-top: hkey $primary-darken-2; }
    TrainingScreen.-wide #pane-events, TrainingScreen.-wide #pane-faults {
        border-left: vkey $primary-darken-2;
    }
    TrainingScreen.-wide.-plan #pane-charts { display: none; }
    TrainingScreen.-wide #pane-plan.-active { column-span: 3; }
    """
    #: Actions that change a node or a file: refused in read-only mode (screens/app.py).
    WRITES: ClassVar[dict[str, str]] = {
        "launch": "launching a run", "stop": "stopping a run", "resume": "resuming a run",
    }
    BINDINGS: ClassVar = [
        *(Binding(key, f"pane('{pane}')", title, show=False, id=f"training.{pane}")
          for pane, key, title in PANES),
        Binding("l", "launch", "Launch", id="training.launch"),
        Binding("s", "stop", "Stop", id="training.stop"),
        Binding("r", "resume", "Resume", id="training.resume"),
        Binding("p", "toggle_per_rank", "Per-rank", id="training.per_rank"),
        Binding("a", "toggle_sync_chart", "LR / grad sync", show=False,
                id="training.sync_chart"),
        Binding("x", "export", "Export", id="training.export"),
        Binding("t", "stacks", "Stacks", id="training.stacks"),
        Binding("g", "pick_run", "Runs", id="training.runs"),
        Binding("L", "logs", "Logs", id="training.logs"),
        Binding("u", "find_runs", "Find runs", show=False, id="training.find"),
    ]

    def __init__(self, *, find_on_mount: bool = True, clock: Callable[[], float] = time.time,
                 follow_interval: float = 0.5, stop_grace: float = STOP_GRACE,
                 runs_dir: Path | None = None) -> None:
        super().__init__()
        self.find_on_mount = find_on_mount
        self.clock = clock
        self.follow_interval = follow_interval
        self.stop_grace = stop_grace
        self.runs_dir = runs_dir
        self.pane = "charts"
        self.per_rank = False
        self.record: RunRecord | None = None
        self.run_state = ""
        self.logview = LogView()
        #: ``:logs NODE`` sets it: the log view opens on that node's lines.
        self.log_node: str | None = None
        self.store: MetricsStore | None = None
        self.follower: RunFollower | None = None
        self.follow_states: dict[str, str] = {}
        self.ended = False
        self.finding = False
        self.note = ""
        self.statuses: list[RunStatus] = []
        """This cluster's runs as the last look found them (the run picker lists them)."""
        self.last_prep: Preparation | None = None
        self._unsubscribe: Callable[[], None] = lambda: None
        self.redraws = RedrawThrottle(self, self.render_now, RENDER_EVERY)
        self._rendered_revision = -1

    # -- layout

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static(id="train-run")
        yield Static(id="train-progress")
        yield Static(id="train-tabs")
        with Vertical(id="train-body"):
            with Vertical(id="pane-charts", classes="pane -active"):
                yield LossChart(id="loss-chart")
                yield LrChart(id="lr-chart")
                yield SyncChart(id="sync-chart")
            with Vertical(id="pane-ranks", classes="pane"):
                yield RankTable(id="rank-table")
            with VerticalScroll(id="pane-events", classes="pane"):
                yield EventFeed(id="event-feed")
            with VerticalScroll(id="pane-faults", classes="pane"):
                yield FaultPanel(id="fault-panel")
            with VerticalScroll(id="pane-plan", classes="pane"):
                yield Static(id="plan-text")
        yield from self.compose_footer()

    @property
    def state_dir(self) -> Path:
        """Where run records are indexed and exports go (``$SVCONSOLE_STATE_DIR``...)."""
        return self.runs_dir or state_dir()

    def on_mount(self) -> None:
        self._layout_for(self.app.size.width, self.app.size.height)
        self.render_now(force=True)
        if self.find_on_mount:
            self.action_find_runs()

    def on_unmount(self) -> None:
        self._retire_follower(block=False)

    def on_resize(self) -> None:
        self._layout_for(self.size.width, self.size.height)

    def _layout_for(self, width: int, height: int) -> None:
        self.set_class(width >= WIDE[0] and height >= WIDE[1], "-wide")

    def on_screen_resume(self) -> None:
        self.redraws.show()
        self.render_now(force=True)
        self._rescan()

    @property
    def following_live_run(self) -> bool:
        return self.follower is not None and not self.ended

    def _rescan(self) -> None:
        """Look again for runs every RESCAN_EVERY seconds (one launched from the CLI, or a
        resumed one, shows up by itself), unless a search is under way or the screen is hidden
        (then only the timer is armed again)."""
        if not self.find_on_mount:
            return
        if self.redraws.shown and not self.finding:
            self.action_find_runs()
        else:
            self.set_timer(RESCAN_EVERY, self._rescan)

    def on_screen_suspend(self) -> None:
        self.redraws.hide()

    def action_pane(self, pane: str) -> None:
        self.pane = pane
        for name, _, _ in PANES:
            self.query_one(f"#pane-{name}").set_class(name == pane, "-active")
        self.set_class(pane == "plan", "-plan")
        target = {"ranks": "#rank-table", "events": "#pane-events", "faults": "#pane-faults",
                  "plan": "#pane-plan"}.get(pane)
        if target is not None:
            self.query_one(target).focus()
        if pane == "events":  # the newest events (a hidden pane could not follow them)
            self.query_one("#pane-events").call_after_refresh(
                self.query_one("#pane-events").scroll_end, animate=False)
        self._render_tabs()

    # -- following

    def show_run(self, record: RunRecord, store: MetricsStore, state: str = "running") -> None:
        """Show ``record``'s metrics from ``store`` (fed by a follower, or by a test)."""
        self._retire_follower(block=False)
        self.record, self.store, self.run_state = record, store, state
        self.logview = LogView()   # the log view across ranks of this run (L)
        self.follow_states, self.ended = {}, False
        self._rendered_revision = -1
        self._plan_from_record(record)
        self.render_now(force=True)

    def follow(self, record: RunRecord, state: str = "running") -> None:
        """Follow ``record``'s logs on every node (threads; returns at once)."""
        store = MetricsStore(clock=self.clock)
        self.show_run(record, store, state)
        follower = RunFollower(self.console.pool, record, store=store,
                               interval=self.follow_interval)
        self.follower = follower
        self._render_head()  # now "followed"
        unfollow = follow_run(self, follower)
        nodes = {n.node for n in record.nodes}

        def utilisation(update: TelemetryUpdate) -> None:  # the "below 50% through a run" fault
            if update.node in nodes:
                feed_utilisation(store, update)

        unfeed = self.console.gpu_telemetry().subscribe(utilisation)
        # the log view takes every line on the follower's thread (the screen's updates are
        # coalesced: a queued one is replaced by the next, with its lines)
        view = self.logview
        unlog = follower.subscribe(lambda update: view.add_events(update.events))
        self._unsubscribe = lambda: (unfollow(), unfeed(), unlog())
        follower.start()

    def _retire_follower(self, *, block: bool) -> None:
        follower, self.follower = self.follower, None
        self._unsubscribe()
        self._unsubscribe = lambda: None
        if follower is None:
            return

        def stop() -> None:
            follower.stop()
            follower.store.close()

        if block:
            stop()
        else:  # joining threads must not hold up the UI (or the app's exit)
            threading.Thread(target=stop, name="svconsole-unfollow", daemon=True).start()

    @on(RunProgress)
    def take_progress(self, message: RunProgress) -> None:
        update = message.update
        if self.record is None or update.run_id != self.record.id:
            return  # a run no longer shown
        self.follow_states = dict(update.nodes)
        self._alerts_seen()
        for _node, text in update.notices:  # a log truncated or rotated: read again from 0
            self.note = text
            self.notify(text, severity="warning", timeout=15)
        if update.ended and not self.ended:
            self.ended = True
            self.check_status(self.record)
            self._tell_other_screens()   # its GPUs are no longer the run's
        self.redraws.schedule()

    # -- rendering (throttled, from copies, only while shown)

    def render_now(self, *, force: bool = False) -> None:
        """Draw what changed since the last draw (everything with ``force``)."""
        self.redraws.drawn()
        self._render_head()
        self._render_tabs()
        store = self.store
        if store is None:
            return
        revision = store.revision
        if force or revision != self._rendered_revision:
            self._rendered_revision = revision
            data = ChartData.of(store)
            self.query_one("#loss-chart", LossChart).show(data, per_rank=self.per_rank)
            self.query_one("#lr-chart", LrChart).show(data)
            self.query_one("#sync-chart", SyncChart).show(data)
            events = self.query_one("#pane-events", VerticalScroll)
            at_end = events.scroll_y >= events.max_scroll_y
            self.query_one("#event-feed", EventFeed).show(store.feed())
            if at_end:  # keep the newest event in view unless the operator scrolled up
                events.call_after_refresh(events.scroll_end, animate=False)
            self._tell_other_screens()
        ranks = store.ranks()
        self.query_one("#rank-table", RankTable).show(ranks)
        self.query_one("#fault-panel", FaultPanel).show(store.findings())
        self.query_one("#train-progress", Static).update(
            progress_text(store.progress(), live=self.run_state in ("running", "")))
        if self.follower is not None and not self.ended:
            self.redraws.schedule(TICK_EVERY)  # seconds since the last line, stalls

    def _render_head(self) -> None:
        out = Text()
        if self.record is None:
            if self.finding:
                out.append(f"looking for runs on {len(self.console.cluster.nodes)} node(s)…",
                           style="dim")
            else:
                out.append("no run · l launches one", style="dim")
            if self.note:
                out.append(f" · {self.note}", style="yellow")
            self.query_one("#train-run", Static).update(out)
            if self.store is None:
                self.query_one("#train-progress", Static).update("")
            return
        out.append(f"{self.console.cluster.name}: run {self.record.id} ", style="bold")
        style = {"running": "bold green", "finished": "bold", "failed": "bold red",
                 "stopped": "bold yellow", "lost": "bold red",
                 "unknown": "bold yellow"}.get(self.run_state, "")
        out.append(self.run_state or "?", style=style)
        if self.record.resumed_from:
            out.append(f" (resumes {self.record.resumed_from})", style="dim")
        out.append(" · followed" if self.following_live_run else " · shown", style="dim")
        states = self.follow_states
        if states:
            out.append(" · " + ", ".join(f"{n} {s}" for n, s in states.items()), style="dim")
        if self.note:
            out.append(f" · {self.note}", style="yellow")
        self.query_one("#train-run", Static).update(out)

    def _render_tabs(self) -> None:
        counts = {}
        if self.store is not None:
            counts = {"events": len(self.store.feed()), "faults": len(self.store.findings())}
        out = Text()
        for pane, key, title in PANES:
            label = f" {key} {title}" + (f"({counts[pane]})" if counts.get(pane) else "") + " "
            style = "reverse bold" if pane == self.pane else ""
            if pane == "faults" and counts.get("faults"):
                style += " red"
            out.append(label, style=style.strip())
            out.append(" ")
        self.query_one("#train-tabs", Static).update(out)

    def _plan_from_record(self, record: RunRecord) -> None:
        plan = LaunchPlan.from_dict(record.plan) if record.plan else None
        checks = self.last_prep.checks if (self.last_prep and self.last_prep.plan
                                           and self.last_prep.plan.run_id == record.id) else ()
        self.query_one("#plan-text", Static).update(
            plan_text(plan, checks) if plan else Text("this run has no plan recorded",
                                                      style="dim"))

    def _tell_other_screens(self) -> None:
        """The GPUs screen marks the run's ranks: tell every other screen which run this is."""
        if self.record is None or self.store is None:
            return
        ranks = self.store.ranks()
        for mode, _, _ in SCREENS:
            try:
                stack = self.app.get_screen_stack(mode)
            except KeyError:  # that mode's screen was never opened
                continue
            for screen in stack:
                if screen is not self:
                    screen.post_message(RunFollowed(self.record, ranks,
                                                    live=self.following_live_run))

    # -- finding runs

    def action_find_runs(self) -> None:
        self.finding = True
        self._render_head()
        self.find_runs()

    @work(thread=True, exclusive=True, group="training-find", name="find training runs",
          exit_on_error=False)
    def find_runs(self) -> None:
        self.post_message(RunsFound(find_runs(self.console.pool, self.state_dir)))

    @on(RunsFound)
    def take_runs(self, message: RunsFound) -> None:
        self.finding = False
        self.set_timer(RESCAN_EVERY, self._rescan)  # one-shot, re-armed after each search
        statuses = message.statuses
        self.statuses = statuses
        live = [s for s in statuses if s.live]
        if self.following_live_run and self.record is not None:  # the operator's run stays
            others = [s.record.id for s in live if s.record.id != self.record.id]
            self.note = (f"another run is live: {others[0]}"
                         + (f" (+{len(others) - 1} more)" if len(others) > 1 else "")
                         + " · g picks") if others else ""
            mine = next((s for s in statuses if s.record.id == self.record.id), None)
            if mine is not None:
                self.run_state = mine.state
            self._render_head()
            return
        if live and len(live) > 1:
            self.note = f"{len(live)} live runs; following the newest"
        chosen = live[0] if live else (statuses[0] if statuses else None)
        if chosen is None:
            self.note = ""
            self._render_head()
            return
        if self.record is not None and self.record.id == chosen.record.id:
            self.run_state = chosen.state
            self._render_head()
            return
        self.follow(chosen.record, chosen.state)
        if live:
            self.notify(f"reattached to run {chosen.record.id} (running)")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        super().on_worker_state_changed(event)  # the app's one handler says why
        if event.state is WorkerState.ERROR and event.worker.group == "training-export":
            self.note = ""  # the app's handler said why
            self._render_head()
        if event.state is WorkerState.ERROR and event.worker.group == "training-find":
            self.finding = False
            self.set_timer(RESCAN_EVERY, self._rescan)  # a failed look: try again later
            self._render_head()

    # -- status

    @work(thread=True, group="training-status", name="check the run's state",
          exit_on_error=False)
    def check_status(self, record: RunRecord) -> None:
        self.post_message(RunStatusChecked(run_status(self.console.pool, record)))

    @on(RunStatusChecked)
    def take_status(self, message: RunStatusChecked) -> None:
        status: RunStatus = message.status
        if self.record is not None and status.record.id == self.record.id:
            self.run_state = status.state
            self._render_head()
            self._alerts_seen()

    def _alerts_seen(self) -> None:
        """The app's alerts see this run's findings and state (screens/alerting.py)."""
        alerts = getattr(self.app, "alerts", None)
        if alerts is not None and self.record is not None and self.store is not None:
            alerts.run_seen(self.record.id, self.store.findings(), self.run_state or "running")

    # -- launch, stop, resume

    def _profile_path(self) -> Path:
        return profile_path_for(self.console.cluster.path)

    def action_launch(self) -> None:
        if self.record is not None and self.run_state == "running":
            self.notify(f"run {self.record.id} is running: stop it first (s)", severity="warning")
            return
        self.app.push_screen(LaunchDialog(self.console.pool, self._profile_path()),
                             self._launch_answered)

    def action_resume(self) -> None:
        record = self.record
        if record is None:
            self.notify("no run to resume (l launches one)", severity="warning")
            return
        if self.run_state == "running":
            self.notify(f"run {record.id} is still running", severity="warning")
            return
        self.app.push_screen(LaunchDialog(self.console.pool, None, resume=record),
                             self._launch_answered)

    def _launch_answered(self, request: LaunchRequest | None) -> None:
        if request is None:
            return
        self.last_prep = request.prep
        self.note = "launching…"
        self._render_head()
        self.launch_run(request)

    @work(thread=True, exclusive=True, group="training-launch", name="launch the run",
          exit_on_error=False)
    def launch_run(self, request: LaunchRequest) -> None:
        try:
            record = launch(self.console.pool, request.prep, self.state_dir, force=request.force,
                            resumed_from=request.resumed_from)
        except LaunchError as exc:
            self.post_message(RunLaunched(None, str(exc)))
            return
        self.post_message(RunLaunched(record))

    @on(RunLaunched)
    def take_launched(self, message: RunLaunched) -> None:
        self.note = ""
        if message.record is None:
            self._render_head()
            self.notify(f"not launched: {message.problem}", severity="error", timeout=20)
            return
        self.follow(message.record, "running")
        self.notify(f"launched run {message.record.id} on {len(message.record.nodes)} node(s); "
                    "it runs on after svconsole exits")

    def action_stop(self) -> None:
        record = self.record
        if record is None or self.run_state not in ("running", "unknown"):
            self.notify("no running run to stop", severity="warning")
            return
        nodes = ", ".join(n.node for n in record.nodes)
        question = (f"Stop run {record.id} on {nodes}? SIGTERM to every process group (after a "
                    f"checkpoint save in progress), SIGKILL after {self.stop_grace:g} s.")

        def answered(yes: bool | None) -> None:
            if yes:
                self.note = "stopping…"
                self._render_head()
                self.stop_run(record)

        self.app.push_screen(ConfirmDialog(question), answered)

    @work(thread=True, exclusive=True, group="training-stop", name="stop the run",
          exit_on_error=False)
    def stop_run(self, record: RunRecord) -> None:
        self.post_message(RunStopped(record.id, stop_run(self.console.pool, record,
                                                         grace=self.stop_grace)))

    @on(RunStopped)
    def take_stopped(self, message: RunStopped) -> None:
        self.note = ""
        bad = [f"{n}: {r.error or 'left ' + ', '.join(map(str, r.remaining))}"
               for n, r in message.results.items() if not r.ok]
        killed = sum(len(r.killed) for r in message.results.values())
        cut = [n for n, r in message.results.items() if r.save_cut]
        waited = max((r.save_waited or 0.0 for r in message.results.values()), default=0.0)
        if cut:
            self.notify(f"run {message.run_id}: the checkpoint save on {', '.join(cut)} was "
                        f"still going after {waited:g} s; model.pt may be cut short (a resume's "
                        "pre-flight checks it)", severity="warning", timeout=20)
        elif waited:
            self.notify(f"waited {waited:g} s for the checkpoint save in progress")
        if bad:
            self.notify(f"run {message.run_id} not fully stopped: " + "; ".join(bad),
                        severity="error", timeout=20)
        else:
            self.notify(f"run {message.run_id} stopped on every node"
                        + (f" ({killed} process(es) needed SIGKILL)" if killed else ""))
        if self.record is not None and self.record.id == message.run_id:
            self.check_status(self.record)

    # -- charts, export

    def action_pick_run(self) -> None:
        """Choose which of this cluster's runs to follow (:class:`RunPicker`)."""
        if not self.statuses:
            self.notify("no runs found yet (u looks again)", severity="warning")
            return
        current = self.record.id if self.record is not None else None
        seen = {}
        if self.store is not None and current is not None:
            progress = self.store.progress()  # the followed run's, as far as it was read
            if progress.total_step:
                seen[current] = progress.total_step

        def chosen(run_id: str | None) -> None:
            status = next((s for s in self.statuses if s.record.id == run_id), None)
            if status is None or run_id == current:
                return
            self.note = ""
            self.follow(status.record, status.state)
            self.notify(f"following run {run_id} ({status.state})")

        self.app.push_screen(RunPicker(self.console.pool, self.statuses, current, seen),
                             chosen)

    def action_stacks(self) -> None:
        """Every rank's stack of the followed run, grouped, with the suspects (screens/stacks)."""
        from screens.stacks import StacksScreen

        if self.record is None:
            self.notify("no run to take the stacks of", severity="warning")
            return
        self.app.push_screen(StacksScreen(self.console.pool, self.record))

    def action_logs(self) -> None:
        """Every node's log of the run, interleaved by time (screens/logview.py); ``:logs NODE``
        opens it on that node's lines."""
        from screens.logview import LogViewScreen

        node, self.log_node = self.log_node, None
        if self.record is None:
            self.notify("no run followed: its logs open here once one is (g picks one)",
                        severity="warning")
            return
        self.app.push_screen(LogViewScreen(self.logview, self.record.id, state_dir(), node))

    def action_toggle_per_rank(self) -> None:
        self.per_rank = not self.per_rank
        chart = self.query_one("#loss-chart", LossChart)
        chart.show(chart.data, per_rank=self.per_rank)
        if not self.query_one("#pane-charts").display:  # the toggled chart is shown
            self.action_pane("charts")

    def action_toggle_sync_chart(self) -> None:
        """The lower chart: the learning rate, or the gradient-sync time per step."""
        lr, sync = self.query_one("#lr-chart", LrChart), self.query_one("#sync-chart", SyncChart)
        lr.display, sync.display = not lr.display, lr.display
        if not self.query_one("#pane-charts").display:  # the toggled chart is shown
            self.action_pane("charts")

    def action_export(self) -> None:
        if self.store is None or self.record is None:
            self.notify("no run to export", severity="warning")
            return
        self.note = "exporting the charts and metrics…"
        self._render_head()
        self.export_metrics(self.record.id, self.store)

    @work(thread=True, exclusive=True, group="training-export", name="export the metrics",
          exit_on_error=False)
    def export_metrics(self, run_id: str, store: MetricsStore) -> None:
        directory = self.state_dir / "exports"
        directory.mkdir(parents=True, exist_ok=True)
        png = store.to_png(directory / f"{run_id}-charts.png", title=f"run {run_id}")
        csv = store.to_csv(directory / f"{run_id}-metrics.csv")
        self.post_message(MetricsExported((png, csv)))

    @on(MetricsExported)
    def take_exported(self, message: MetricsExported) -> None:
        self.note = ""
        self._render_head()
        self.notify("exported: " + ", ".join(str(p) for p in message.paths), timeout=15)


SCREEN = TrainingScreen
