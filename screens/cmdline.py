"""The ``:`` command line, as in k9s: a verb and its arguments, completed as they are typed.

``:nodes`` ``:setup`` ``:config`` ``:training`` (``:runs``) ``:gpus`` switch screens;
``:logs [NODE]`` opens the log view across ranks (one node's lines with NODE);
``:stop [RUN]`` stops the followed run (or RUN) after the usual confirmation;
``:stacks`` dumps every rank's stack; ``:plan`` shows the planner; ``:help``; ``:quit``.
:func:`parse` turns the text into a :class:`Command` or says what is wrong; the app carries it
out with the same actions as the keys, so a command is never more powerful than a key.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Input, Static

#: verb -> (what it does, the argument it takes or "").
VERBS: dict[str, tuple[str, str]] = {
    "nodes": ("the Nodes screen", ""),
    "setup": ("the Setup screen", ""),
    "config": ("the Config screen", ""),
    "training": ("the Training screen", ""),
    "runs": ("the Training screen's runs", ""),
    "gpus": ("the GPUs screen", ""),
    "logs": ("the log view across ranks", "NODE"),
    "stop": ("stop the followed run", "RUN"),
    "stacks": ("every rank's stack", ""),
    "plan": ("the planner: ETA and storage", ""),
    "help": ("the keys of this screen", ""),
    "quit": ("leave svconsole", ""),
}
ALIASES = {"q": "quit", "no": "nodes", "gpu": "gpus", "train": "training", "log": "logs",
           "h": "help", "run": "runs"}


@dataclass(frozen=True)
class Command:
    verb: str
    args: tuple[str, ...] = ()


class CommandError(ValueError):
    """Text that is no command; the message says why and what would be."""


def parse(text: str) -> Command:
    text = text.strip().removeprefix(":").strip()
    if not text:
        raise CommandError("type a command: " + " ".join(f":{v}" for v in VERBS))
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CommandError(f"{text}: {exc}") from None
    verb = ALIASES.get(words[0].lower(), words[0].lower())
    starting = [v for v in VERBS if v.startswith(verb)]
    if verb not in VERBS and len(starting) == 1:   # a unique start is enough: ':gp' is :gpus
        verb = starting[0]
    if verb not in VERBS:
        near = [v for v in VERBS if v.startswith(verb[:2])]
        hint = f" (did you mean {', '.join(':' + v for v in near)}?)" if near else ""
        raise CommandError(f":{words[0]}: no such command{hint}")
    takes = VERBS[verb][1]
    if len(words) > 1 + bool(takes):
        raise CommandError(f":{verb} takes {('one ' + takes) if takes else 'no argument'}")
    return Command(verb, tuple(words[1:]))


class CommandSuggester(Suggester):
    """Completes the verb, then the argument from ``choices[verb]`` (node names, run ids)."""

    def __init__(self, choices: dict[str, Sequence[str]] | None = None) -> None:
        super().__init__(use_cache=False, case_sensitive=False)
        self.choices = choices or {}

    async def get_suggestion(self, value: str) -> str | None:
        lead = ":" if value.startswith(":") else ""
        body = value[len(lead):]
        if " " not in body:
            for verb in VERBS:
                if verb.startswith(body.lower()) and body:
                    return lead + verb
            return None
        verb, _, arg = body.partition(" ")
        for choice in self.choices.get(ALIASES.get(verb, verb), ()):
            if choice.startswith(arg) and arg != choice:
                return f"{lead}{verb} {choice}"
        return None


class CommandLine(ModalScreen["Command | None"]):
    """The line at the bottom; Enter runs, Escape leaves, Tab (or →) takes the completion."""

    DEFAULT_CSS = """
    CommandLine { align: left bottom; background: $background 30%; }
    CommandLine > #cmd-help { width: 100%; height: auto; background: $panel; padding: 0 1; }
    CommandLine > Input { width: 100%; }
    """
    BINDINGS: ClassVar = [Binding("escape", "cancel", "Cancel", id="cmdline.cancel")]

    def __init__(self, choices: dict[str, Sequence[str]] | None = None) -> None:
        super().__init__()
        self.choices = choices or {}

    def compose(self) -> ComposeResult:
        yield Static(self._help(), id="cmd-help")
        yield Input(value=":", suggester=CommandSuggester(self.choices), id="cmd")

    def _help(self, problem: str = "") -> str:
        verbs = "  ".join(f":{v}{(' ' + a) if a else ''}" for v, (_d, a) in VERBS.items())
        return (f"[red]{problem}[/]\n" if problem else "") + f"[dim]{verbs}[/]"

    def on_mount(self) -> None:
        box = self.query_one(Input)
        box.focus()
        box.cursor_position = len(box.value)

    @on(Input.Submitted)
    def run(self, event: Input.Submitted) -> None:
        try:
            command = parse(event.value)
        except CommandError as exc:
            self.query_one("#cmd-help", Static).update(self._help(str(exc)))
            return
        self.dismiss(command)

    def action_cancel(self) -> None:
        self.dismiss(None)
