"""Following a run's logs over the pool's streaming channel, from a byte offset, across
reconnects, into the run's metrics store; subscribers get coalesced updates.

:class:`LogFollower` follows one node's log. On the node, ``launch_node.py follow`` reads the file
from the offset and sends only complete lines, each with the byte offset just after it
(``@svcL <end> <text>``), a heartbeat when the file is quiet, and an end marker once the run on
that node has exited and every byte was sent. The console side feeds each line to a
:class:`console.training.logparse.LogParser` and keeps the offset the node reported; when the connection
drops (or the heartbeats stop: a hung node), it reconnects with backoff and asks again from the
last complete line's offset, so no line is lost or repeated.

:class:`RunFollower` follows every node of a run (:class:`console.training.runs.RunRecord`) into one
:class:`console.training.metrics.MetricsStore` (which also scans the lines against the fault catalog and
keeps the event feed) and hands :class:`RunUpdate` s to subscribers at most every ``interval``
seconds, however fast lines arrive. Callbacks run on the follower's dispatch thread.

:func:`read_run` reads a run's logs up to their current end once (no following), for
``svconsole metrics RUN`` and ``svconsole logs RUN``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from console.cluster.redact import redact_text
from console.ssh.pool import Pool, Stream
from console.subscribers import Subscribers
from console.training import faults
from console.training.evidence import add_kernel_evidence
from console.training.logparse import Event, LogParser, TrainStep
from console.training.metrics import MetricsStore
from console.training.runs import PREFIX, NodeRun, RunRecord, RunStatus, node_args, node_stream
from console.training.stacks import StallWatch

log = logging.getLogger(__name__)

FollowState = Literal["connecting", "following", "reconnecting", "ended", "stopped"]


class FollowError(RuntimeError):
    """A log could not be read (the node stayed unreachable)."""


@dataclass(frozen=True)
class Position:
    """Where a follower stands: the byte offset after the last complete line, and its number."""

    offset: int
    line_no: int


class LogFollower:
    """Follow one node's log from ``offset`` until the run on that node ends (or, with
    ``once``, until the current end of the file), reconnecting when the connection is lost.

    ``on_events(node, events)`` is called on the follower's thread with the parsed events of each
    line as it arrives; ``on_notice(node, text)`` when the log was truncated, rewritten or
    rotated (it is read again from its start). ``heartbeat``: seconds between the node's keep-alive lines; a stream
    silent for ``3 * heartbeat + 2`` seconds counts as lost, and one that sends nothing within
    ``startup`` seconds (the remote shell's rc files run first: pyenv or conda init can take
    long) too. Reconnects wait ``retry_min``
    seconds, doubling up to ``retry_max``; after ``give_up`` failed connections in a row
    (None: never) the follower stops with ``error`` set."""

    def __init__(self, pool: Pool, record: RunRecord, node: NodeRun, *,
                 on_events: Callable[[str, list[Event]], None],
                 on_notice: Callable[[str, str], None] | None = None,
                 position: Position | None = None, once: bool = False,
                 heartbeat: float = 2.0, retry_min: float = 0.5, retry_max: float = 10.0,
                 give_up: int | None = None, startup: float = 90.0) -> None:
        self.pool = pool
        self.node = node.node
        self._args = {**node_args(record, node), "heartbeat": heartbeat, "once": once}
        start = position or Position(node.log_offset, 0)
        self._parser = LogParser(offset=start.offset, line_no=start.line_no)
        self._on_events = on_events
        self._on_notice = on_notice or (lambda _node, _text: None)
        self.restarts = 0
        """Times the log was found truncated, rewritten or rotated (and read again from 0)."""
        self.heartbeat = heartbeat
        self.retry_min, self.retry_max = retry_min, retry_max
        self.give_up = give_up
        self.startup = startup
        self._started = False
        self.state: FollowState = "connecting"
        self.error: str | None = None
        self.reconnects = 0
        self.ended_because: str | None = None
        self._stop = threading.Event()
        self._stream: Stream | None = None
        self._last_rx = time.monotonic()
        self._thread: threading.Thread | None = None

    @property
    def position(self) -> Position:
        return Position(self._parser.offset, self._parser.line_no)

    @property
    def done(self) -> bool:
        return self.state in ("ended", "stopped")

    def start(self) -> LogFollower:
        self._thread = threading.Thread(target=self.run, name=f"svconsole-follow-{self.node}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following (from any thread)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """Follow in the calling thread until the end or :meth:`stop`."""
        delay, failures = self.retry_min, 0
        watchdog = threading.Thread(target=self._watch, name=f"svconsole-watch-{self.node}",
                                    daemon=True)
        watchdog.start()
        try:
            while not self._stop.is_set():
                if self._follow_once():
                    self.state = "ended"
                    return
                if self._stop.is_set():
                    break
                if self.state == "following":  # this connection worked: start afresh
                    failures, delay = 0, self.retry_min
                failures += 1
                if self.give_up is not None and failures >= self.give_up:
                    break
                self.state = "reconnecting"
                self.reconnects += 1
                if self._stop.wait(delay):
                    break
                delay = min(self.retry_max, delay * 2)
            self.state = "stopped"
        finally:
            self._stop.set()  # ends the watchdog
            watchdog.join()
            if self.state not in ("ended", "stopped"):
                self.state = "stopped"

    def _follow_once(self) -> bool:
        """One connection: True when the node said the log is complete."""
        args = {**self._args, "offset": self._parser.offset}
        stream = node_stream(self.pool, self.node, "follow", args)
        self._stream = stream
        self._last_rx, self._started = time.monotonic(), False
        if self._stop.is_set():
            stream.cancel()
        with stream:
            for line in stream:
                self._last_rx, self._started = time.monotonic(), True
                if line.fd != "out" or not line.text.startswith(PREFIX):
                    continue
                kind, rest = line.text[len(PREFIX):len(PREFIX) + 1], line.text[len(PREFIX) + 2:]
                if kind == "L":
                    self.state = "following"
                    end, _, text = rest.partition(" ")
                    event = self._parser.feed_line(redact_text(text))  # no secret shown
                    self._parser.offset = int(end)  # the node counted the bytes
                    self._on_events(self.node, [event])
                elif kind == "H":
                    self.state = "following"
                elif kind == "T":  # truncated, rewritten or rotated: read again from there
                    offset, _, why = rest.partition(" ")
                    self._parser.offset, self._parser.line_no = int(offset), 0
                    self.restarts += 1
                    self._on_notice(self.node, f"{self.node}: log {why}; read again from the "
                                               f"start")
                elif kind == "E":
                    self.ended_because = rest
                    return True
        self.error = stream.error or f"follower exited ({stream.exit})"
        return False

    def _watch(self) -> None:
        """Cancel a stream that stopped answering (a hung node or connection)."""
        while not self._stop.wait(0.5):
            stream = self._stream
            limit = 3 * self.heartbeat + 2 if self._started else self.startup
            if stream is not None and time.monotonic() - self._last_rx > limit:
                self.error = f"no data or heartbeat for {limit:g}s"
                stream.cancel()
                self._last_rx = time.monotonic()


@dataclass
class RunUpdate:
    """What changed since the last update: new events (node, event), each node's follower state
    and position, and whether every node's log is complete."""

    run_id: str
    revision: int
    events: list[tuple[str, Event]]
    nodes: dict[str, FollowState]
    positions: dict[str, Position]
    ended: bool
    dropped: int = 0
    """Events left out of ``events`` because more than ``max_events`` arrived in one interval
    (the store has them all)."""
    notices: list[tuple[str, str]] = field(default_factory=list)
    """(node, text): a node's log truncated, rewritten or rotated, read again from its start."""


class RunFollower:
    """Follow every node of a run into one metrics store; coalesced updates to subscribers."""

    def __init__(self, pool: Pool, record: RunRecord, *, store: MetricsStore | None = None,
                 interval: float = 0.5, max_events: int = 5000, once: bool = False,
                 heartbeat: float = 2.0, retry_max: float = 10.0,
                 positions: dict[str, Position] | None = None,
                 diagnose_stalls: bool = True) -> None:
        self.record = record
        self.store = store if store is not None else MetricsStore()
        give_contexts(self.store, record)
        self.store.watch_run(record.created)
        self.stall_watch = None if once or not diagnose_stalls else StallWatch(
            pool, record, self.store, on_change=self._watch_changed)
        """Diagnoses a run stall once seen (reachability, stacks: console.training.stacks)."""
        self.interval = interval
        self.max_events = max_events
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Event]] = []
        self._notices: list[tuple[str, str]] = []
        self.notices: list[tuple[str, str]] = []
        """Every notice so far (node, text)."""
        self._dropped = 0
        self._poked = False
        self._dispatch_done = False
        self._revision = 0
        self._subscribers: Subscribers[RunUpdate] = Subscribers("run update")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.followers = {
            n.node: LogFollower(pool, record, n, on_events=self._take, on_notice=self._notice,
                                once=once,
                                heartbeat=heartbeat, retry_max=retry_max,
                                position=(positions or {}).get(n.node))
            for n in record.nodes
        }
        self._dispatcher: threading.Thread | None = None

    def subscribe(self, callback: Callable[[RunUpdate], None]) -> Callable[[], None]:
        """Call ``callback(RunUpdate)`` at most every ``interval`` seconds while something
        changes; returns the function that unsubscribes."""
        return self._subscribers.subscribe(callback)

    def _take(self, node: str, events: list[Event]) -> None:
        for event in events:
            self.store.add(event, node=node)
        with self._lock:
            room = self.max_events - len(self._pending)
            self._pending.extend((node, e) for e in events[:max(0, room)])
            self._dropped += max(0, len(events) - max(0, room))
        self._wake.set()

    def _notice(self, node: str, text: str) -> None:
        with self._lock:
            self._notices.append((node, text))
            self.notices.append((node, text))
        self._wake.set()

    def _watch_changed(self) -> None:
        """The run's watch changed a finding (kernel evidence): the subscribers get an update,
        from the dispatcher while it runs, else (the run over) from here."""
        with self._lock:
            dispatching = self._dispatcher is not None and not self._dispatch_done
            self._poked = dispatching
        if dispatching:
            self._wake.set()
        else:
            self._update()

    @property
    def ended(self) -> bool:
        """Every node's log is complete (the run ended everywhere)."""
        return all(f.state == "ended" for f in self.followers.values())

    def start(self) -> RunFollower:
        for follower in self.followers.values():
            follower.start()
        self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                            name=f"svconsole-run-{self.record.id}")
        self._dispatcher.start()
        if self.stall_watch is not None:
            self.stall_watch.start()
        return self

    def gather_evidence(self) -> int:
        """Now, on this thread: the evidence from beyond the logs that the run's watch adds
        every few seconds (a SIGKILLed rank's kernel oom-kill lines); the number of nodes
        asked. For a run's end, whose cause came in its last lines."""
        return self.stall_watch.check_kernel_evidence() if self.stall_watch is not None else 0

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every log is complete (or followers stopped); True if the run ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for follower in self.followers.values():
            follower.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._dispatcher is not None and all(f.done for f in self.followers.values()):
            self._dispatcher.join(None if deadline is None
                                  else max(0.0, deadline - time.monotonic()))
        return self.ended

    def stop(self) -> None:
        if self.stall_watch is not None:
            self.stall_watch.stop()
        for follower in self.followers.values():
            follower.stop()
        self._stop.set()
        self._wake.set()
        for follower in self.followers.values():
            follower.join(5)
        if self._dispatcher is not None:
            self._dispatcher.join(5)

    def _update(self) -> RunUpdate:
        with self._lock:
            events, self._pending = self._pending, []
            notices, self._notices = self._notices, []
            dropped, self._dropped = self._dropped, 0
            self._revision += 1
        update = RunUpdate(self.record.id, self._revision, events,
                           {n: f.state for n, f in self.followers.items()},
                           {n: f.position for n, f in self.followers.items()},
                           self.ended, dropped, notices)
        self._subscribers.publish(update)
        return update

    def _dispatch(self) -> None:
        last_states: dict[str, FollowState] = {}
        while True:
            self._wake.wait(self.interval)
            finished = self._stop.is_set() or all(f.done for f in self.followers.values())
            states = {n: f.state for n, f in self.followers.items()}
            with self._lock:
                changed = bool(self._pending or self._dropped or self._notices or self._poked)
                self._poked = False
            if changed or states != last_states or finished:
                self._wake.clear()
                self._update()
                last_states = states
            if finished:
                if self.ended:
                    self.store.run_ended()
                with self._lock:  # a poke from now on updates by itself
                    self._dispatch_done = True
                    poked, self._poked = self._poked, False
                if poked:
                    self._update()
                return
            time.sleep(self.interval)  # at most one update per interval

    def __enter__(self) -> RunFollower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def give_contexts(store: MetricsStore, record: RunRecord) -> None:
    """Tell the store's fault scanner what the run's plan says: each node's rank offset (a
    ``local_rank`` becomes the global rank) and the master's address and port (a connect
    failure names the master port or a peer, never the wrong one)."""
    if record.plan and not store.scan_contexts:
        store.scan_contexts.update(faults.scan_contexts(
            record.plan, resuming=record.resumed_from is not None))


def read_run(pool: Pool, record: RunRecord, *, nodes: list[str] | None = None,
             store: MetricsStore | None = None) -> Iterator[tuple[str, Event]]:
    """Every line of the run's logs (one node after another) up to their current end."""
    if store is not None:
        give_contexts(store, record)
    for node in record.nodes:
        if nodes is not None and node.node not in nodes:
            continue
        events: list[Event] = []
        follower = LogFollower(pool, record, node, once=True, retry_max=2.0, give_up=3,
                               on_events=lambda _n, evs, into=events: into.extend(evs))
        follower.run()
        if follower.ended_because is None:
            raise FollowError(f"{node.node}: cannot read {node.log}: {follower.error}")
        for event in events:
            if store is not None:
                store.add(event, node=node.node)
            yield node.node, event


def last_step(pool: Pool, status: RunStatus, *, tail: int = 256 * 1024) -> int | None:
    """The last ``total step`` in the run's first node's log (its last ``tail`` bytes, this
    run's part only): what the run picker shows. None when it cannot be read to its end or has
    none."""
    node = status.record.nodes[0]
    size = status.nodes[node.node].log_size if node.node in status.nodes else None
    if size is None:
        return None
    events: list[Event] = []
    follower = LogFollower(pool, status.record, node, once=True, retry_max=1.0, give_up=3,
                           position=Position(max(node.log_offset, size - tail), 0),
                           on_events=lambda _n, evs: events.extend(evs))
    follower.run()
    if follower.ended_because is None:
        return None  # read in part: a step from the middle of the log would mislead
    steps = [e.total_step for e in events if isinstance(e, TrainStep) and e.total_step is not None]
    return max(steps) if steps else None


def run_metrics(pool: Pool, record: RunRecord, store: MetricsStore | None = None
                ) -> MetricsStore:
    """The run's metrics store, filled from its logs as they are now (``svconsole metrics
    RUN``), a SIGKILLed rank's finding with its node's kernel oom-kill lines as the run's watch
    adds them."""
    store = store if store is not None else MetricsStore()
    for _ in read_run(pool, record, store=store):
        pass
    add_kernel_evidence(pool, store, set())
    return store


__all__ = ["FollowError", "FollowState", "LogFollower", "Position", "RunFollower", "RunUpdate",
           "last_step", "read_run",
           "run_metrics"]
