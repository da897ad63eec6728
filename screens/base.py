"""What every svconsole screen has: the header, the screen tabs, the footer, a help text, and
worker errors handed to the app's one error handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol, cast

from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Static
from textual.worker import Worker

from screens.keys import SCREENS

if TYPE_CHECKING:
    from console.cluster.model import Cluster
    from console.gpu.telemetry import Telemetry
    from console.ssh.pool import Pool


class ConsoleApp(Protocol):
    """What the screens use of the app (screens/app.py's ``SVConsoleApp``), named here so that
    this module need not import the app, which imports it: no import circle in screens/."""

    cluster: Cluster
    pool: Pool
    health_interval: float | None

    def gpu_telemetry(self, interval: float = 1.0) -> Telemetry: ...

    def reload_cluster(self, cluster: Cluster, then: Callable[[], object] | None = None
                       ) -> None: ...

    def rebuild_screen(self, mode: str) -> None: ...

    def check_nodes(self) -> object: ...


class WorkerErrorsToApp:
    """``Worker.StateChanged`` does not bubble: a screen hands it to the app's one handler."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.on_worker_state_changed(event)  # type: ignore[attr-defined]


class ConsoleModal(WorkerErrorsToApp, ModalScreen):
    """Base of svconsole's dialogs whose workers may fail."""


class ScreenTabs(Static):
    """One line naming the five screens and their keys, the current one highlighted."""

    DEFAULT_CSS = """
    ScreenTabs { height: 1; background: $panel; color: $text-muted; }
    """

    def __init__(self, current: str) -> None:
        parts = []
        for mode, key, title in SCREENS:
            if mode == current:
                parts.append(f"[b reverse] {key} {title} [/]")
            else:
                parts.append(f" [b]{key}[/] {title} ")
        super().__init__(" ".join(parts))


class ConsoleScreen(WorkerErrorsToApp, Screen):
    """Base of the five top-level screens."""

    #: Shown by the help screen (``?``) above the key list: what this screen is for.
    HELP: ClassVar[str] = ""
    #: Which of the five it is (set by the app when it builds the screen for a mode).
    mode_name: str = ""
    #: True once its compose and every ``on_mount`` of its classes ran: an error before that
    #: means the screen could not be built (screens/app.py shows the error panel either way).
    built: bool = False

    def on_mount(self) -> None:
        # Textual calls each class's on_mount, the subclass's first: this one runs last
        self.built = True

    @property
    def console(self) -> ConsoleApp:
        return cast("ConsoleApp", self.app)

    def compose_header(self):
        yield Header(show_clock=False, icon="≡")
        yield ScreenTabs(self.mode_name)

    def compose_footer(self):
        yield Footer()
