"""The panel a screen that could not be built (or stopped on an error) leaves in its place: the
module and the exception, with the traceback below, while the other screens keep working."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from screens.base import ConsoleScreen
from screens.keys import SCREENS


@dataclass(frozen=True)
class ScreenFailure:
    """What went wrong with one of the five screens."""

    mode: str
    module: str
    #: "import", "build" (compose or mount) or "run" (a handler of a screen that was up)
    phase: str
    error: BaseException

    @property
    def summary(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"

    @property
    def traceback(self) -> str:
        return "".join(traceback.format_exception(type(self.error), self.error,
                                                  self.error.__traceback__))


def screen_title(mode: str) -> str:
    return next((title for m, _, title in SCREENS if m == mode), mode)


class BrokenScreen(ConsoleScreen):
    """Stands in for a screen whose module failed to import, whose compose or mount raised, or
    whose handler raised: the app goes on, and ``r`` tries to build the real screen again."""

    HELP = ("This screen failed: the panel names its module and the exception, and shows the "
            "traceback. The other screens keep working (keys 1-5). r builds the screen again "
            "(after a fix to the module or to the file it reads, for example).")
    BINDINGS = [Binding("r", "retry", "Retry", id="broken.retry")]

    DEFAULT_CSS = """
    BrokenScreen #broken-summary { padding: 1 2; color: $error; height: auto; }
    BrokenScreen #broken-traceback { padding: 0 2; height: 1fr; }
    """

    def __init__(self, failure: ScreenFailure) -> None:
        super().__init__()
        self.failure = failure
        self.mode_name = failure.mode

    def compose(self) -> ComposeResult:
        f = self.failure
        what = {"import": "could not be built: its module did not import",
                "build": "could not be built"}.get(f.phase, "stopped on an error")
        yield from self.compose_header()
        yield Static(
            f"[b]✗ The {escape(screen_title(f.mode))} screen {what}[/b]\n"
            f"module: {escape(f.module)}\n"
            f"{escape(f.summary)}\n\n"
            "[dim]The other screens keep working (keys 1-5); r tries this one again. "
            "The traceback:[/dim]",
            id="broken-summary")
        with VerticalScroll(id="broken-traceback"):
            yield Static(escape(f.traceback), markup=True)
        yield from self.compose_footer()

    def action_retry(self) -> None:
        self.console.rebuild_screen(self.failure.mode)
