"""``?``: what the current screen is for and every key that works there."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", id="help.close")]

    def __init__(self, title: str, text: str, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self._title, self._text, self._keys = title, text, keys

    def compose(self) -> ComposeResult:
        width = max((len(k) for k, _ in self._keys), default=4)
        lines = [f"[b]{self._title}[/b]", "", self._text, "", "[b]Keys[/b]"]
        lines += [f"  [b]{key.ljust(width)}[/b]  {desc}" for key, desc in self._keys]
        lines += ["", "[dim]ctrl+p: command palette with this screen's actions · escape closes[/dim]"]
        with VerticalScroll(id="help-body"):
            yield Static("\n".join(lines))
