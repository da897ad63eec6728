"""Screens whose engine arrives with a later issue say so plainly, instead of pretending."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from screens.base import ConsoleScreen


class PlannedScreen(ConsoleScreen):
    """A screen that is planned but not built yet; it names the issue that builds it."""

    TITLE_TEXT = ""
    ISSUE = 0
    WHAT = ""

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static(
            f"[b]{self.TITLE_TEXT}[/b]\n\n{self.WHAT}\n\n"
            f"[dim]Not built yet: this screen arrives with issue #{self.ISSUE}. "
            f"Its headless commands are listed by [b]svconsole --help[/b].[/dim]",
            classes="planned",
        )
        yield from self.compose_footer()


class SetupScreen(PlannedScreen):
    TITLE_TEXT = "Setup: guided bring-up"
    ISSUE = 4
    WHAT = "Bring-up steps run on the nodes (check, apply, verify), in parallel, with a dry run."
    HELP = WHAT


class ConfigScreen(PlannedScreen):
    TITLE_TEXT = "Config: DeepSpeed parameters"
    ISSUE = 5
    WHAT = ("The DeepSpeed JSON and the training knobs, validated by DeepSpeed, by the cluster and "
            "by the tuning matrix (headless today: svconsole validate).")
    HELP = WHAT


class TrainingScreen(PlannedScreen):
    TITLE_TEXT = "Training"
    ISSUE = 6
    WHAT = ("torchrun on every node, live loss and learning-rate charts, faults named with their fix "
            "(headless today: svconsole metrics --log).")
    HELP = WHAT


class GPUsScreen(PlannedScreen):
    TITLE_TEXT = "GPUs"
    ISSUE = 7
    WHAT = "Every GPU of the cluster, live, from one streaming agent per node."
    HELP = WHAT
