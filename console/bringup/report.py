"""Text for people: a dry-run plan per node, live output lines, and a run's summary table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TextIO

from console.bringup.model import Step
from console.bringup.profiles import PROFILES
from console.bringup.runner import OutputLine, PlannedCell, RunEvent, RunSummary, StateChanged


def plan_text(planned: Sequence[PlannedCell]) -> str:
    """The dry run, grouped by node: every command each step would run there."""
    out: list[str] = []
    for node in dict.fromkeys(p.node for p in planned):
        out.append(f"{node}:")
        for p in planned:
            if p.node != node:
                continue
            root = "  (as root)" if p.as_root else ""
            out.append(f"  [{p.step}] {p.title}{root}")
            if p.note:
                out.append(f"    what:   {p.note}")
            for label, commands in (("gather", p.gather), ("check", p.check),
                                    ("apply", p.apply), ("verify", p.verify)):
                for command in commands:
                    first, *rest = command.splitlines()
                    out.append(f"    {label + ':':7} {first}")
                    out.extend(f"            {line}" for line in rest)
    return "\n".join(out)


def plan_json(planned: Sequence[PlannedCell]) -> dict[str, list[dict[str, Any]]]:
    """The dry run as ``{node: [cell, ...]}``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in planned:
        out.setdefault(p.node, []).append(asdict(p))
    return out


def catalog_text(steps: Sequence[Step]) -> str:
    """Steps by phase, then the package profiles with their pins."""
    out = []
    phase = None
    for step in steps:
        if step.phase != phase:
            phase = step.phase
            out.append(f"{phase.value}:")
        flags = [w for w, on in (("root", step.needs_root), ("changes system", step.destructive),
                                 ("measurement", step.measure is not None)) if on]
        deps = f" after {', '.join(step.depends)}" if step.depends else ""
        extra = f" ({'; '.join(flags)})" if flags else ""
        out.append(f"  {step.id:16} {step.title} [{step.targets}]{deps}{extra}")
    out.append("package profiles (--profile):")
    for profile in PROFILES.values():
        out.append(f"  {profile.name:10} {profile.description}")
        out.append(f"  {'':10} {profile.pins()}")
    return "\n".join(out)


def live_printer(out: TextIO) -> Callable[[RunEvent], None]:
    """A runner subscriber that prints ``node: [step] line`` and final states as they come."""
    lock = threading.Lock()

    def show(event: RunEvent) -> None:
        if isinstance(event, OutputLine):
            text = f"{event.node}: [{event.step}] {event.text}"
        elif isinstance(event, StateChanged) and event.state.final:
            detail = f": {event.detail}" if event.detail else ""
            text = f"{event.node}: [{event.step}] == {event.state.value}{detail}"
        else:
            return
        with lock:
            print(text, file=out, flush=True)

    return show


def summary_text(summary: RunSummary) -> str:
    """A table of states (steps x nodes), the measurements' notes and the verdict line."""
    steps = list(dict.fromkeys(c.step for c in summary.cells))
    nodes = list(dict.fromkeys(c.node for c in summary.cells))
    width = max([len(s) for s in steps] + [4]) + 2
    col = max([len(n) for n in nodes] + [14]) + 2
    lines = ["STEP".ljust(width) + "".join(n.ljust(col) for n in nodes)]
    for step in steps:
        row = step.ljust(width)
        for node in nodes:
            state = summary.state(step, node)
            row += (state.value if state else "-").ljust(col)
        lines.append(row.rstrip())
    problems = [c for c in summary.cells if not c.state.finished_ok and c.detail]
    for cell in problems:
        lines.append(f"{cell.node}: {cell.step}: {cell.state.value}: {cell.detail}")
    for step, notes in summary.notes.items():
        for note in notes:
            lines.append(f"{step}: {note}")
    lines.append(summary.message())
    return "\n".join(lines)
