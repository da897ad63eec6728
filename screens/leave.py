"""Leaving with unsaved work asks first.

Before the app quits (``q``) or reloads the cluster (which builds the other screens anew), it
asks every screen and dialog it holds what leaving would lose: a screen may implement
``unsaved_work(self) -> str | None`` (a sentence, None when nothing would be lost). If any has
something, :class:`LeaveDialog` lists the sentences and offers:

- save (``s``), when a screen with unsaved work can save (its ``action_save``): each one saves
  as it always does (its own dialogs included), and the app goes on once nothing is left;
- go on anyway (``d``): a screen's ``discard_work()``, if it has one, runs first (the Setup
  screen stops its run there);
- go on when done (``w``), when some of the work is not edits but a job this console drives (a
  Setup run): the app goes on once it has ended;
- cancel (``escape``): nothing happens; a save or wait that was under way is given up too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rich.markup import escape
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Static


@dataclass(frozen=True)
class Unsaved:
    """One screen's (or dialog's) answer: what leaving would lose."""

    mode: str
    screen: Screen
    what: str

    @property
    def savable(self) -> bool:
        return callable(getattr(self.screen, "action_save", None))


def unsaved_work(app: App, stacks: dict[str, list[Screen]]) -> Iterator[Unsaved]:
    """Every screen of every mode's stack (``stacks``) with something unsaved, the current
    mode's first. A screen whose ``unsaved_work`` raises is reported as unknown work, so the
    question is still asked."""
    current = app.current_mode
    for mode in sorted(stacks, key=lambda m: m != current):
        for screen in stacks[mode]:
            ask = getattr(screen, "unsaved_work", None)
            if not callable(ask):
                continue
            try:
                what = ask()
            except Exception as exc:  # noqa: BLE001  a bug there must not let the work go silently
                what = (f"{type(screen).__name__} could not tell what is unsaved "
                        f"({type(exc).__name__}: {exc})")
            if what:
                yield Unsaved(mode, screen, what)


class LeaveDialog(ModalScreen["str | None"]):
    """Save / go on anyway / go on when done / cancel, for what :func:`unsaved_work` found.
    Dismisses with "save", "discard", "wait" or None (cancel)."""

    DEFAULT_CSS = """
    LeaveDialog { align: center middle; }
    LeaveDialog > Vertical {
        width: 84; max-width: 100%; height: auto; max-height: 100%;
        border: round $warning; background: $surface; padding: 0 1;
    }
    LeaveDialog #leave-title { text-style: bold; }
    LeaveDialog #leave-buttons { height: 1; margin-top: 1; align-horizontal: right; }
    LeaveDialog Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("s", "answer('save')", "Save", id="leave.save"),
        Binding("d", "answer('discard')", "Anyway", id="leave.discard"),
        Binding("w", "answer('wait')", "When done", id="leave.wait"),
        Binding("escape,c", "answer(None)", "Cancel", id="leave.cancel"),
    ]
    AUTO_FOCUS = "#leave-cancel"  # the safe answer

    def __init__(self, verb: str, items: Iterable[Unsaved]) -> None:
        super().__init__()
        self.verb = verb
        self.items = list(items)
        self.can_save = any(item.savable for item in self.items)
        self.can_wait = any(not item.savable for item in self.items)

    def compose(self) -> ComposeResult:
        verb = self.verb.capitalize()
        lines = "\n".join(f"• {escape(item.what)}" for item in self.items)
        anyway = "discards the edits" + (" and stops the run" if self.can_wait else "")
        with Vertical():
            yield Static(f"{verb}? Not everything is saved:", id="leave-title")
            yield Static(lines, id="leave-items")
            yield Static(f"[dim]{verb} anyway {anyway}.[/dim]")
            with Horizontal(id="leave-buttons"):
                if self.can_save:
                    yield Button(f"Save, then {self.verb} (s)", id="leave-save",
                                 variant="primary", compact=True)
                if self.can_wait:
                    yield Button(f"{verb} when done (w)", id="leave-wait", compact=True)
                yield Button(f"{verb} anyway (d)", id="leave-discard", variant="error",
                             compact=True)
                yield Button("Cancel (esc)", id="leave-cancel", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        choice = (event.button.id or "").removeprefix("leave-")
        self.dismiss(None if choice == "cancel" else choice)

    def action_answer(self, choice: str | None) -> None:
        if (choice == "save" and not self.can_save) or (choice == "wait" and not self.can_wait):
            return
        self.dismiss(choice)
