"""Key bindings as data: each has an id so it can be listed in help and remapped."""

from __future__ import annotations

from textual.binding import Binding

#: The five screens, switched with 1-5 from anywhere: (mode id, key, title).
SCREENS: tuple[tuple[str, str, str], ...] = (
    ("nodes", "1", "Nodes"),
    ("setup", "2", "Setup"),
    ("config", "3", "Config"),
    ("training", "4", "Training"),
    ("gpus", "5", "GPUs"),
)

GLOBAL_BINDINGS: list[Binding] = [
    # The screen tabs under the header show 1-5; the footer keeps its room for the screen's keys.
    *(Binding(key, f"switch_mode('{mode}')", title, id=f"screen.{mode}", show=False)
      for mode, key, title in SCREENS),
    Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
    Binding("q", "quit", "Quit", id="app.quit"),
    Binding("colon", "command_line", "Command", key_display=":", id="app.command"),
]
