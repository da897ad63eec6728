"""What every svconsole screen has: the header, the footer and a help text."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from textual.screen import Screen
from textual.widgets import Footer, Header

if TYPE_CHECKING:
    from screens.app import SVConsoleApp


class ConsoleScreen(Screen):
    """Base of the five top-level screens."""

    #: Shown by the help screen (``?``) above the key list: what this screen is for.
    HELP: ClassVar[str] = ""

    @property
    def console(self) -> SVConsoleApp:
        return cast("SVConsoleApp", self.app)

    def compose_header(self):
        yield Header(show_clock=False, icon="≡")

    def compose_footer(self):
        yield Footer()
