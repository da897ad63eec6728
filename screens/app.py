"""The svconsole Textual app: five screens over one shared SSH session pool."""

from __future__ import annotations

import importlib
import re
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import App, SystemCommand
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerFailed, WorkerState

from screens.base import ConsoleScreen
from screens.bridge import follow_node_states
from screens.broken import BrokenScreen, ScreenFailure
from screens.help import HelpScreen
from screens.keys import GLOBAL_BINDINGS, SCREENS
from screens.leave import LeaveDialog, Unsaved, unsaved_work
from screens.messages import NodeStatusChanged

if TYPE_CHECKING:
    from console.cli import Context
    from console.cluster.model import Cluster
    from console.gpu.telemetry import Telemetry
    from console.ssh.pool import Pool
    from screens.alerting import AlertsHub


def _build_screen(mode: str) -> Screen:
    """The screen of ``mode``, or the error panel in its place when its module cannot be
    imported or its class cannot be made."""
    module = f"screens.{mode}"
    try:
        screen = importlib.import_module(module).SCREEN()
    except Exception as exc:  # any failure of one screen's code must not end the console
        return BrokenScreen(ScreenFailure(mode, module, "import", exc))
    screen.mode_name = mode
    return screen


def _failed_screen(error: BaseException) -> Screen | None:
    """The screen whose code raised ``error``: the innermost frame of its traceback run by a
    widget (its screen) or a screen; None when no screen's code is on it."""
    seen: set[int] = set()
    chain: list[BaseException] = [error]
    while chain:  # the error, then what it wraps (a worker's WorkerFailed, a cause)
        exc = chain.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
            node = frame.f_locals.get("self")
            if not isinstance(node, DOMNode):
                continue
            while node is not None and not isinstance(node, Screen):
                node = node._parent
            if node is not None:
                return node
        chain += [e for e in (getattr(exc, "error", None), exc.__cause__, exc.__context__)
                  if isinstance(e, BaseException)]
    return None


#: Seconds "save, then quit" waits for the saves (their dialogs answered) before giving up.
SAVE_WAIT = 120.0


#: Seconds between two evaluations of the alert rules.
ALERT_TICK_S = 5.0


class SVConsoleApp(App[int]):
    """One app, one cluster, one pool. Screens read ``app.cluster`` and ``app.pool``."""

    CSS_PATH = "app.tcss"
    TITLE = "svconsole"
    BINDINGS = GLOBAL_BINDINGS
    #: Each mode's screen is ``SCREEN`` in the module ``screens.<mode>`` (screens/nodes.py, ...).
    MODES = {mode: (lambda m=mode: _build_screen(m)) for mode, _, _ in SCREENS}
    DEFAULT_MODE = "nodes"

    def __init__(self, cluster: Cluster, pool: Pool, *, health_interval: float | None = 5.0,
                 gpu_simulate: Path | None = None, contain_screen_errors: bool = False) -> None:
        super().__init__()
        #: An exception in one of the five screens' code replaces that screen with an error
        #: panel instead of ending the app (``svconsole`` runs so; tests see the exception).
        self.contain_screen_errors = contain_screen_errors
        self._failed_screens: weakref.WeakSet[Screen] = weakref.WeakSet()
        #: The check of a "save, then quit" or "quit when done" under way.
        self._waiting: Timer | None = None
        self.cluster = cluster
        self.pool = pool
        self.health_interval = health_interval
        #: An nvml.json to replay on the GPUs screen instead of real GPUs (shown as SIMULATED).
        self.gpu_simulate = gpu_simulate
        self._telemetry: Telemetry | None = None
        #: The console's alerts (screens/alerting.py): bell, toast and cluster.yaml's sinks.
        self.alerts: AlertsHub | None = None
        self._alert_timer: Timer | None = None
        self.title = f"svconsole · {cluster.name}"
        self._unsubscribe = lambda: None

    def on_mount(self) -> None:
        self._unsubscribe = follow_node_states(self, self.pool)
        self._update_subtitle()
        if self.health_interval:
            self.start_health()
        self._apply_keymap()
        self._start_alerts()

    def on_unmount(self) -> None:
        if self.alerts is not None:
            self.alerts.close()
        self._unsubscribe()
        self.stop_gpu_telemetry()

    def gpu_telemetry(self, interval: float = 1.0) -> Telemetry:
        """The console's one GPU agent per node (started on first use, by the GPUs screen or a
        followed training run); stopped when the app exits or the cluster changes."""
        if self._telemetry is None:
            from console.gpu.telemetry import Telemetry, simulation_fixture

            try:
                simulate = simulation_fixture(self.gpu_simulate)
            except ValueError as exc:
                self.notify(str(exc), severity="error", timeout=15)
                simulate = None
            self._telemetry = Telemetry(self.pool, self.cluster, interval=interval,
                                        simulate=simulate)
            self._telemetry.start()  # collector threads: returns at once
        return self._telemetry

    def stop_gpu_telemetry(self, wait: float = 1.0) -> None:
        """Cancel every collector (their streams close, so the agents exit on the nodes), then
        wait up to ``wait`` seconds in all for their threads."""
        telemetry, self._telemetry = self._telemetry, None
        if telemetry is not None:
            telemetry.stop(wait=wait)

    # ------------------------------------------------------------------ leaving

    async def action_quit(self) -> None:
        """``q``: quit, asking first when a screen or dialog has unsaved work (q again while
        a save or a run is awaited asks again)."""
        self._stop_waiting()
        self.leave("quit", self.exit)

    def leave(self, verb: str, proceed: Callable[[], object]) -> None:
        """Run ``proceed`` (quit, reload the cluster) now if nothing would be lost, else ask
        (screens/leave.py): save, go on anyway, go on when done, or cancel."""
        items = list(unsaved_work(self, self._screen_stacks))
        if not items:
            proceed()
            return

        def answered(choice: str | None) -> None:
            if choice == "discard":
                for item in items:
                    discard = getattr(item.screen, "discard_work", None)
                    if callable(discard):
                        discard()
                proceed()
            elif choice in ("save", "wait"):
                if choice == "save":
                    self._save(items)
                self._proceed_when_clear(verb, proceed, deadline=SAVE_WAIT if choice == "save"
                                         else None)

        self.push_screen(LeaveDialog(verb, items), answered)

    def _save(self, items: list[Unsaved]) -> None:
        """Each screen with unsaved edits saves as it always does, from its own mode (the
        first one's shown, so its save dialogs are seen)."""
        savable = [item for item in items if item.savable]
        if savable and savable[0].mode != self.current_mode:
            self.switch_mode(savable[0].mode)
        for item in savable:
            item.screen.action_save()  # type: ignore[attr-defined]

    def _proceed_when_clear(self, verb: str, proceed: Callable[[], object],
                            deadline: float | None) -> None:
        """Go on once no screen has unsaved work (checked twice a second); give up after
        ``deadline`` seconds (None: wait as long as it takes). q again asks again."""
        started = time.monotonic()

        def check() -> None:
            if not any(True for _ in unsaved_work(self, self._screen_stacks)):
                self._stop_waiting()
                proceed()
            elif deadline is not None and time.monotonic() - started > deadline:
                self._stop_waiting()
                self.notify(f"still not saved after {deadline:g} s: not going to {verb}",
                            severity="warning", timeout=8)

        self._waiting = self.set_interval(0.5, check, name=f"{verb} when clear")
        self.notify(f"going to {verb} once nothing is left unsaved (q again to change that)",
                    timeout=6)

    def _stop_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.stop()

    def reload_cluster(self, cluster: Cluster, then: Callable[[], object] | None = None) -> None:
        """Make ``cluster`` (just saved from the Nodes screen) the app's, asking first when a
        screen has unsaved work (the other screens are built anew); ``then`` runs after it.
        Cancelled, the console goes on with the cluster it had (the file stays saved)."""
        def reload() -> None:
            self._reload_cluster(cluster)
            if then is not None:
                then()

        self.leave("reload the cluster", reload)

    def _reload_cluster(self, cluster: Cluster) -> None:
        """A pool for ``cluster``, the header following it, health checks on it; the other
        screens are built anew on their next visit (their workers stop with them), and the old
        pool closes in the background."""
        from console.ssh.pool import Pool

        old = self.pool
        self.stop_gpu_telemetry()
        self.cluster, self.pool = cluster, Pool(cluster)
        self.title = f"svconsole · {cluster.name}"
        self._unsubscribe()
        self._unsubscribe = follow_node_states(self, self.pool)
        self._update_subtitle()
        if self.health_interval:
            self.start_health()
        self._start_alerts()   # the new cluster's alert rules
        for mode, _, _ in SCREENS:
            if mode != self.current_mode:
                self.remove_mode(mode)
                self.add_mode(mode, self.MODES[mode])
        threading.Thread(target=old.close, name="close the old pool", daemon=True).start()

    def _handle_exception(self, error: Exception) -> None:
        """An exception in the code of one of the five screens (its compose, mount or a
        handler) leaves the error panel in that screen's place, one in a dialog closes that
        dialog; anything else ends the app."""
        screen = _failed_screen(error) if self.contain_screen_errors else None
        if screen is not None and screen in self._failed_screens:
            # a later error of a screen that failed already (its panel shows the first)
            self.log.error(f"{type(screen).__name__} again: {type(error).__name__}: {error}")
            return
        if isinstance(screen, ModalScreen) and screen in self.screen_stack[1:]:
            # a dialog that failed closes (with those above it); its screen goes on
            self._failed_screens.add(screen)
            self.log.error("".join(traceback.format_exception(error)))
            self.call_later(self._close_failed_dialog, screen, error)
            return
        mode = getattr(screen, "mode_name", "")
        if (not isinstance(screen, ConsoleScreen) or isinstance(screen, BrokenScreen)
                or screen not in self._screen_stacks.get(mode, ())):
            super()._handle_exception(error)
            return
        phase = "run" if screen.built else "build"
        shown = error.error if isinstance(error, WorkerFailed) else error  # with its traceback
        failure = ScreenFailure(mode, type(screen).__module__, phase, shown)
        self.log.error(failure.traceback)
        self._failed_screens.add(screen)
        self.call_later(self._show_failure, failure)

    def _close_failed_dialog(self, dialog: Screen, error: BaseException) -> None:
        if dialog in self.screen_stack:
            while self.screen_stack[-1] is not dialog:
                self.pop_screen()
            self.pop_screen()
        self.notify(f"the dialog {type(dialog).__name__} ({type(dialog).__module__}) failed and "
                    f"was closed: {type(error).__name__}: {error}", severity="error", timeout=15)

    def _show_failure(self, failure: ScreenFailure) -> None:
        self._replace_mode_screen(failure.mode, lambda: BrokenScreen(failure))
        self.notify(f"the {failure.mode} screen failed: {failure.summary}", severity="error",
                    timeout=10)

    def rebuild_screen(self, mode: str) -> None:
        """Build ``mode``'s screen anew (the error panel's retry)."""
        self._replace_mode_screen(mode, lambda: _build_screen(mode))

    def _replace_mode_screen(self, mode: str, build) -> None:
        if mode == self.current_mode:
            while len(self.screen_stack) > 1:  # dialogs over the failed screen go with it
                self.pop_screen()
            base = self.screen
            if not base._result_callbacks:  # a mode's first screen has none to pop (Textual 8)
                base._push_result_callback(base, None)
            self.switch_screen(build())
        else:
            self.remove_mode(mode)
            self.add_mode(mode, build)

    @work(thread=True, exclusive=True, group="health", name="start health checks", exit_on_error=False)
    def start_health(self) -> None:
        self.pool.start_health(self.health_interval)

    @work(thread=True, exclusive=True, group="ping", name="check every node", exit_on_error=False)
    def check_nodes(self) -> None:
        for node in self.cluster.names():
            self.pool.ping(node)

    def on_node_status_changed(self, message: NodeStatusChanged) -> None:
        self._update_subtitle()

    def _update_subtitle(self) -> None:
        statuses = self.pool.statuses()
        up = sum(1 for s in statuses.values() if str(getattr(s.state, "value", s.state)).lower() == "up")
        self.sub_title = f"{up}/{len(self.cluster.nodes)} nodes up" + (
            " · read-only" if self.cluster.read_only else "")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one error handler: a worker that failed says so, with its name."""
        if event.state is WorkerState.ERROR:
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error",
                        timeout=10)

    # ------------------------------------------------------------------ keys, commands, alerts

    async def run_action(self, action, default_namespace=None, namespaces=None) -> bool:
        """Every key, palette entry and ``:`` command comes here: in read-only mode an action
        a screen lists in its ``WRITES`` is refused, saying why, instead of run."""
        if self.cluster.read_only:
            target, name, _params = self._parse_action(
                action, self if default_namespace is None else default_namespace, namespaces)
            what = getattr(target, "WRITES", {}).get(name)
            if what is not None:
                from console.cluster.model import ReadOnlyError

                self.bell()
                self.notify(str(ReadOnlyError(what)), title="read-only", severity="warning",
                            timeout=8)
                return True
        return await super().run_action(action, default_namespace, namespaces)

    def _apply_keymap(self) -> None:
        """The operator's keys.yaml (screens/keymap.py); what is wrong in it is said at start,
        and the remaps that are fine apply."""
        from screens.keymap import load_keymap

        result = load_keymap()
        if result.keymap:
            self.set_keymap(result.keymap)
        for problem in result.problems:
            self.notify(problem, title="keys.yaml", severity="warning", timeout=20)

    def _start_alerts(self) -> None:
        from console.cli import state_dir
        from screens.alerting import AlertsHub

        if self.alerts is not None:
            self.alerts.close()
        self.alerts = AlertsHub(self.cluster, state_dir(), self._alert_from_sink)
        if self.alerts.problem:
            self.notify(self.alerts.problem, severity="error", timeout=20)
        if self._alert_timer is None:
            self._alert_timer = self.set_interval(ALERT_TICK_S, self._alert_tick, name="alerts")

    def _alert_tick(self) -> None:
        if self.alerts is not None:
            self.alerts.tick(self.pool.statuses())

    def _alert_from_sink(self, alert) -> None:
        """The console's sink (its own thread): the bell and the toast on the UI thread."""
        try:
            self.call_from_thread(self.show_alert, alert)
        except RuntimeError:   # the app has stopped
            pass

    def show_alert(self, alert) -> None:
        resolved = alert.state == "resolved"
        if not resolved:
            self.bell()
        severity = ("information" if resolved or alert.condition.severity == "info"
                    else "error" if alert.condition.severity == "error" else "warning")
        self.notify(alert.summary, title="resolved" if resolved else "alert",
                    severity=severity, timeout=30)

    def action_command_line(self) -> None:
        """``:``: a k9s-style command (screens/cmdline.py)."""
        from screens.cmdline import CommandLine

        record = getattr(self._mode_screen("training"), "record", None)
        choices = {"logs": self.cluster.names(), "stop": [record.id] if record else []}
        self.push_screen(CommandLine(choices), self._run_command)

    def _mode_screen(self, mode: str):
        try:
            stack = self.get_screen_stack(mode)
        except KeyError:
            return None
        return stack[0] if stack else None

    def _run_command(self, command) -> None:
        """Carry out a ``:`` command with the same actions as the keys."""
        if command is None:
            return
        verb, args = command.verb, command.args
        modes = {"nodes": "nodes", "setup": "setup", "config": "config",
                 "training": "training", "runs": "training", "gpus": "gpus"}
        if verb in modes:
            self.switch_mode(modes[verb])
            if verb == "runs":
                self.call_later(self._training_action, "pick_run", ())
        elif verb == "help":
            self.action_help()
        elif verb == "quit":
            self.call_later(self.action_quit)
        else:
            self.switch_mode("training")
            self.call_later(self._training_action, verb, args)

    def _training_action(self, verb: str, args: tuple[str, ...]) -> None:
        screen = self._mode_screen("training")
        action = {"logs": "logs", "stop": "stop", "stacks": "stacks",
                  "plan": "pane('plan')", "pick_run": "pick_run"}[verb]
        if screen is None:
            return
        if verb == "logs" and args:
            screen.log_node = args[0]
        if verb == "stop" and args and (screen.record is None or not
                                        screen.record.id.startswith(args[0])):
            self.notify(f":stop {args[0]}: not the run this console follows "
                        f"({screen.record.id if screen.record else 'none'}); pick it first "
                        "(:runs), or use svconsole stop", severity="warning")
            return
        if hasattr(screen, f"action_{action.split('(')[0]}"):
            self.run_action(action, screen)
        else:
            self.notify(f":{verb}: not available on this screen yet", severity="warning")

    def action_help(self) -> None:
        screen = self.screen
        keys: list[tuple[str, str]] = []
        for binding in [*getattr(screen, "BINDINGS", []), *self.BINDINGS]:
            if getattr(binding, "description", ""):
                keys.append((binding.key_display or binding.key, binding.description))
        title = type(screen).__name__.removesuffix("Screen")
        self.push_screen(HelpScreen(title, getattr(screen, "HELP", ""), keys))

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """The palette's "Screenshot": an SVG of the screen in the state dir's screenshots/
        (Textual's default, ~/Downloads, is missing on most servers, and the save failed), named
        without spaces; Textual's notification says where it went."""
        from console.cli import state_dir

        if path is None:
            directory = state_dir() / "screenshots"
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError:
                directory = Path.cwd()
            path = str(directory)
        if not filename:
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.cluster.name) or "cluster"
            now = time.time()
            filename = (f"svconsole-{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
                        f".{int(now * 1000) % 1000:03d}.svg")
        return super().deliver_screenshot(filename, path, time_format)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette offers the current screen's actions first, then the app's."""
        for binding in getattr(screen, "BINDINGS", []):
            if getattr(binding, "description", ""):
                yield SystemCommand(binding.description, f"key {binding.key}",
                                    lambda a=binding.action: self.run_action(a, screen))
        for mode, key, title in SCREENS:
            yield SystemCommand(f"Go to {title}", f"key {key}",
                                lambda m=mode: self.switch_mode(m))
        yield from super().get_system_commands(screen)


def run_app(ctx: Context) -> int:
    # No terminal prompt for sudo while Textual owns the terminal: the Setup screen asks in a
    # modal and lends the pool that in-memory secret.
    ctx.pool.set_sudo_password(None)
    app = SVConsoleApp(ctx.cluster, ctx.pool, gpu_simulate=ctx.gpu_simulate,
                       contain_screen_errors=True)
    app.run()
    return app.return_code or 0
