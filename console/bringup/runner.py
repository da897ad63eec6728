"""Runs bring-up steps across the nodes through the shared pool.

Steps run in dependency order; each step runs on its nodes in parallel (at most ``parallel`` at
once). Every (step, node) pair is a cell with a :class:`StepState`. A shell step first runs its
check (all commands exit 0: "already done", nothing changes), then apply, then verify. A failed
cell blocks only the cells that depend on it (the same node, or every node for a dependency on
the head), never the other nodes. Output lines go live to subscribers and to one log file per
cell: ``<state_dir>/runs/<run-id>/<node>/<step>.log``, with ``summary.json`` beside them.

Root steps run through the pool's ``sudo=True``: as they are for root, through ``sudo -n`` where
sudo needs no password, else with the password its ``sudo_password`` callable gives (tried once
per node; a refused one is never sent again), streamed live like the others.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from console.atomic import atomic_write
from console.bringup.model import (
    EXIT_NEEDS_REBOOT,
    EXIT_NOT_APPLICABLE,
    Command,
    SetupOptions,
    Step,
    StepContext,
    StepState,
)
from console.cluster.model import Cluster
from console.cluster.redact import redact_text
from console.subscribers import Subscribers

if TYPE_CHECKING:
    from console.ssh.pool import Pool

SUMMARY = "summary.json"
RETRY_STATES = (StepState.FAILED, StepState.BLOCKED, StepState.NEEDS_REBOOT)
"""What "retry failed" runs again."""


# ------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class StateChanged:
    """A cell changed state (``detail`` says why, e.g. the failing command's last line)."""

    run_id: str
    step: str
    node: str
    state: StepState
    detail: str = ""


@dataclass(frozen=True)
class OutputLine:
    """One line of a cell's output, as it arrives (commands are shown as ``$ command``)."""

    run_id: str
    step: str
    node: str
    text: str


RunEvent = StateChanged | OutputLine


# ------------------------------------------------------------------------------ results


@dataclass
class Cell:
    """One step on one node."""

    step: str
    node: str
    state: StepState = StepState.PENDING
    detail: str = ""
    seconds: float = 0.0
    log: str | None = None


@dataclass
class RunSummary:
    """What a run did; saved as ``summary.json`` in the run's directory."""

    run_id: str
    started: float
    ended: float | None = None
    cells: list[Cell] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    measure_steps: list[str] = field(default_factory=list)

    def cell(self, step: str, node: str) -> Cell | None:
        for c in self.cells:
            if c.step == step and c.node == node:
                return c
        return None

    def state(self, step: str, node: str) -> StepState | None:
        c = self.cell(step, node)
        return c.state if c is not None else None

    @property
    def ok(self) -> bool:
        """No cell failed, was blocked or waits for a reboot."""
        return all(c.state.finished_ok or c.state == StepState.SKIPPED for c in self.cells)

    @property
    def changed(self) -> bool:
        """Some shell step changed a node (measurements change nothing)."""
        return any(c.state == StepState.DONE and c.step not in self.measure_steps
                   for c in self.cells)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cells:
            out[c.state.value] = out.get(c.state.value, 0) + 1
        return out

    def message(self) -> str:
        """One line for the operator."""
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items())
        if not self.cells:
            return "nothing to run"
        if not self.ok:
            return f"bring-up incomplete: {counts}"
        if all(c.step in self.measure_steps for c in self.cells):
            return f"measured: {counts}"
        if not self.changed:
            measured = " (measurements taken again)" if self.measure_steps else ""
            return f"nothing changed: every step was already done{measured} ({counts})"
        return f"finished: {counts}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cells"] = [dict(asdict(c), state=c.state.value) for c in self.cells]
        d["ok"], d["changed"], d["message"] = self.ok, self.changed, self.message()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSummary:
        cells = [Cell(c["step"], c["node"], StepState(c["state"]), c.get("detail", ""),
                      c.get("seconds", 0.0), c.get("log")) for c in d.get("cells", [])]
        return cls(d["run_id"], d["started"], d.get("ended"), cells, d.get("measurements", {}),
                   d.get("notes", {}), d.get("measure_steps", []))


def runs_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "runs"


def load_summary(state_dir: Path, run_id: str | None = None) -> RunSummary | None:
    """A run's summary (the latest finished run when ``run_id`` is None)."""
    base = runs_dir(state_dir)
    if run_id is None:
        ids = sorted(p.parent.name for p in base.glob(f"*/{SUMMARY}"))
        if not ids:
            return None
        run_id = ids[-1]
    path = base / run_id / SUMMARY
    try:
        return RunSummary.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def retry_selection(summary: RunSummary) -> tuple[list[str], set[tuple[str, str]]]:
    """(step ids, {(step, node)}) of what a run left failed, blocked or waiting for a reboot."""
    cells = [c for c in summary.cells if c.state in RETRY_STATES]
    steps = list(dict.fromkeys(c.step for c in cells))
    return steps, {(c.step, c.node) for c in cells}


def order_steps(steps: Sequence[Step]) -> list[Step]:
    """``steps`` in dependency order (stable: otherwise as given); ValueError on a cycle."""
    ids = {s.id for s in steps}
    done: list[Step] = []
    placed: set[str] = set()
    todo = list(steps)
    while todo:
        for s in todo:
            if all(d in placed or d not in ids for d in s.depends):
                done.append(s)
                placed.add(s.id)
                todo.remove(s)
                break
        else:
            raise ValueError("steps depend on each other in a cycle: "
                             + ", ".join(s.id for s in todo))
    return done


# ------------------------------------------------------------------------------ dry run


@dataclass
class PlannedCell:
    """What one step would run on one node (a dry run)."""

    step: str
    title: str
    node: str
    as_root: bool
    gather: list[str]
    check: list[str]
    apply: list[str]
    verify: list[str]
    note: str = ""


# ------------------------------------------------------------------------------ the runner


class Runner:
    """Runs ``steps`` on the cluster (or on ``nodes``); one Runner is one run.

    ``only``: restrict to these (step, node) cells (retry); cells outside it that a dependency
    needs are taken from ``previous`` (the run being retried), or assumed fine when not run.
    """

    def __init__(
        self,
        pool: Pool,
        cluster: Cluster,
        steps: Sequence[Step],
        *,
        state_dir: Path,
        options: SetupOptions | None = None,
        nodes: Iterable[str] | None = None,
        parallel: int | None = None,
        only: set[tuple[str, str]] | None = None,
        previous: RunSummary | None = None,
    ) -> None:
        self.pool = pool
        self.cluster = cluster
        self.options = options or SetupOptions()
        self.steps = order_steps(steps)
        self.state_dir = Path(state_dir)
        wanted = list(nodes) if nodes is not None else cluster.names()
        unknown = [n for n in wanted if n not in cluster.names()]
        if unknown:
            raise ValueError(f"unknown node(s) {', '.join(unknown)}; the cluster has "
                             f"{', '.join(cluster.names())}")
        self.nodes = [n for n in cluster.names() if n in wanted]
        self.parallel = max(1, parallel or cluster.ssh.max_parallel)
        self.previous = previous
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        self.cells: dict[tuple[str, str], Cell] = {}
        for step in self.steps:
            for node in step.nodes(cluster):
                if node in self.nodes and (only is None or (step.id, node) in only):
                    self.cells[(step.id, node)] = Cell(step.id, node)
        self._subscribers: Subscribers[RunEvent] = Subscribers("setup run")
        self._lock = threading.Lock()
        self._noise: dict[str, set[str]] = {}
        self._cancelled = threading.Event()
        self._streams: set[Any] = set()

    # -------------------------------------------------------------- subscribers

    def subscribe(self, callback: Callable[[RunEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` (on runner threads) for every state change and output line."""
        return self._subscribers.subscribe(callback)

    def _publish(self, event: RunEvent) -> None:
        self._subscribers.publish(event)

    def _set(self, cell: Cell, state: StepState, detail: str = "") -> None:
        cell.state, cell.detail = state, detail
        self._publish(StateChanged(self.run_id, cell.step, cell.node, state, detail))

    # -------------------------------------------------------------- operator actions

    def skip(self, step: str, node: str) -> bool:
        """Mark a pending cell as skipped by the operator (its dependants still run)."""
        cell = self.cells.get((step, node))
        if cell is None or cell.state != StepState.PENDING:
            return False
        self._set(cell, StepState.SKIPPED, "skipped by the operator")
        return True

    def cancel(self) -> None:
        """Stop the run: running commands are cancelled, pending cells are skipped."""
        self._cancelled.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.cancel()

    # -------------------------------------------------------------- dry run

    def dry_run(self) -> list[PlannedCell]:
        """The exact commands of every cell, per node, without running anything."""
        planned = []
        for step in self.steps:
            for node in self.nodes:
                if (step.id, node) not in self.cells:
                    continue
                note = step.changes(self.cluster, self.options)
                if step.measure is not None:
                    planned.append(PlannedCell(step.id, step.title, node, False, [], [], [], [],
                                               note))
                    continue
                ctx = self._context(node, {})
                try:
                    parts = [[c.render() for c in build(ctx)] if build else []
                             for build in (step.gather, step.check, step.apply, step.verify)]
                except ValueError as exc:
                    parts, note = [[], [], [], []], f"cannot plan: {exc}"
                planned.append(PlannedCell(step.id, step.title, node, step.needs_root, *parts,
                                           note=note))
        return planned

    # -------------------------------------------------------------- running

    def run(self) -> RunSummary:
        """Run every cell; returns (and saves) the summary. Never raises for node failures."""
        run_dir = runs_dir(self.state_dir) / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = RunSummary(self.run_id, time.time(),
                             measure_steps=[s.id for s in self.steps if s.measure is not None])
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="svconsole-setup") as executor:
            for step in self.steps:
                ready = []
                for node in self.nodes:
                    cell = self.cells.get((step.id, node))
                    if cell is None or cell.state != StepState.PENDING:
                        continue
                    if self._cancelled.is_set():
                        self._set(cell, StepState.SKIPPED, "run cancelled")
                        continue
                    blocker = self._blocker(step, node)
                    if blocker:
                        self._set(cell, StepState.BLOCKED, blocker)
                        continue
                    cell.log = str(run_dir / node / f"{step.id}.log")
                    ready.append(cell)
                if not ready:
                    continue
                if step.measure is not None:
                    self._measure(step, ready, summary)
                else:
                    gathered = self._gather(step, ready)
                    if gathered is not None:
                        futures = [executor.submit(self._run_cell, step, c, gathered)
                                   for c in ready]
                        for future in futures:
                            future.result()
        summary.cells = list(self.cells.values())
        summary.ended = time.time()
        atomic_write(run_dir / SUMMARY, json.dumps(summary.to_json(), indent=2), backup=False)
        return summary

    def _blocker(self, step: Step, node: str) -> str:
        """Why ``step`` cannot run on ``node`` ("" when its dependencies are fine)."""
        by_id = {s.id: s for s in self.steps}
        for dep in step.depends:
            dep_step = by_id.get(dep)
            if dep_step is None:
                continue  # not part of this run: the operator chose so
            targets = dep_step.nodes(self.cluster)
            on = [node] if node in targets else targets
            for other in on:
                state = self._known_state(dep, other)
                if state is not None and not state.finished_ok and state != StepState.SKIPPED:
                    return f"needs {dep} on {other}, which is {state.value}"
        return ""

    def _known_state(self, step: str, node: str) -> StepState | None:
        cell = self.cells.get((step, node))
        if cell is not None:
            return cell.state
        return self.previous.state(step, node) if self.previous is not None else None

    def _context(self, node: str, gathered: dict[str, str]) -> StepContext:
        return StepContext(self.cluster, self.cluster.node(node), self.options, gathered)

    def _gather(self, step: Step, ready: list[Cell]) -> dict[str, str] | None:
        """Stdout of the step's ``gather`` command on every node (None: the step failed)."""
        if step.gather is None:
            return {}
        gathered: dict[str, str] = {}
        problems = []
        for name in self.cluster.names():
            commands = step.gather(self._context(name, {}))
            result = self.pool.run(name, "; ".join(c.text for c in commands), timeout=60)
            if result.ok:
                gathered[name] = result.stdout
            else:
                problems.append(f"{name}: {result.error or result.stderr.strip() or result.exit}")
        if problems:
            for cell in ready:
                self._set(cell, StepState.FAILED, "could not gather from " + "; ".join(problems))
            return None
        return gathered

    def _run_cell(self, step: Step, cell: Cell, gathered: dict[str, str]) -> None:
        started = time.monotonic()
        assert cell.log is not None
        Path(cell.log).parent.mkdir(parents=True, exist_ok=True)
        with open(cell.log, "w", encoding="utf-8") as log:
            self._set(cell, StepState.RUNNING)
            try:
                state, detail = self._stages(step, cell, self._context(cell.node, gathered), log)
            except ValueError as exc:  # a builder refused the cluster's data
                state, detail = StepState.FAILED, str(exc)
            log.write(f"# {state.value}{': ' + detail if detail else ''}\n")
        cell.seconds = time.monotonic() - started
        self._set(cell, state, detail)

    def _stages(self, step: Step, cell: Cell, ctx: StepContext,
                log: IO[str]) -> tuple[StepState, str]:
        checks = step.check(ctx)
        if checks:
            code, last = 0, ""
            for command in checks:
                code, last = self._exec(step, cell, command, log)
                if code != 0:
                    break
            if code == 0:
                return StepState.ALREADY_DONE, last
            if code == EXIT_NOT_APPLICABLE:
                return StepState.NOT_APPLICABLE, last
        for stage, commands in (("apply", step.apply(ctx)), ("verify", step.verify(ctx))):
            for command in commands:
                if self._cancelled.is_set():
                    return StepState.FAILED, "run cancelled"
                code, last = self._exec(step, cell, command, log)
                if code == EXIT_NEEDS_REBOOT:
                    return StepState.NEEDS_REBOOT, last
                if code != 0:
                    what = "failed" if code is None else f"exit {code}"
                    return StepState.FAILED, f"{stage} {what}: {last}"
        return StepState.DONE, ""

    def _line(self, step: Step, cell: Cell, log: IO[str], text: str) -> None:
        text = redact_text(text)  # a secret's NAME=value never reaches the log or the screen
        log.write(text + "\n")
        log.flush()
        self._publish(OutputLine(self.run_id, step.id, cell.node, text))

    def _exec(self, step: Step, cell: Cell, command: Command,
              log: IO[str]) -> tuple[int | None, str]:
        """Run one command on the cell's node, streaming its lines; (exit code, last line that
        is not the node's login noise)."""
        self._line(step, cell, log, "$ " + command.render())
        last = ""
        noise = self._login_noise(cell.node)
        # A root step goes through the pool's sudo (root as it is, sudo -n, or the password
        # asked once and tried once per node), streamed live like any other.
        stream = self.pool.stream(cell.node, command.text, stdin=command.stdin or "",
                                  timeout=step.timeout, sudo=step.needs_root)
        with self._lock:
            self._streams.add(stream)
        try:
            with stream:
                for line in stream:
                    self._line(step, cell, log, line.text)
                    last = line.text if line.text and line.text not in noise else last
        finally:
            with self._lock:
                self._streams.discard(stream)
        if stream.error is not None:
            self._line(step, cell, log, f"[{stream.error}]")
            return None, stream.error
        return stream.exit, last

    def _login_noise(self, node: str) -> set[str]:
        """Lines the node prints for any command (a chatty .bashrc), learnt once with ``true``:
        kept in the log, never taken as a step's result line."""
        if node not in self._noise:
            result = self.pool.run(node, "true", timeout=30)
            self._noise[node] = set((result.stdout + result.stderr).splitlines())
        return self._noise[node]

    def _measure(self, step: Step, ready: list[Cell], summary: RunSummary) -> None:
        assert step.measure is not None
        logs: dict[str, IO[str]] = {}
        by_node = {c.node: c for c in ready}
        started = time.monotonic()
        for cell in ready:
            assert cell.log is not None
            Path(cell.log).parent.mkdir(parents=True, exist_ok=True)
            logs[cell.node] = open(cell.log, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
            self._set(cell, StepState.RUNNING)
        lock = threading.Lock()

        def emit(node: str, text: str) -> None:
            if node in logs:
                with lock:
                    self._line(step, by_node[node], logs[node], text)

        try:
            result = step.measure(self.pool, self.cluster, [c.node for c in ready],
                                  self.options, emit)
            summary.measurements[step.id] = result.data
            summary.notes[step.id] = result.summary
            outcomes = result.outcomes
        except Exception as exc:  # a measurement's bug must not end the whole run
            outcomes = {}
            summary.notes[step.id] = [f"measurement failed: {type(exc).__name__}: {exc}"]
        seconds = time.monotonic() - started
        for cell in ready:
            outcome = outcomes.get(cell.node)
            state = outcome.state if outcome else StepState.FAILED
            detail = outcome.detail if outcome else "; ".join(summary.notes[step.id])
            logs[cell.node].write(f"# {state.value}{': ' + detail if detail else ''}\n")
            logs[cell.node].close()
            cell.seconds = seconds
            self._set(cell, state, detail)
