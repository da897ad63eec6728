"""Watching one run headless (``svconsole watch``): follow its logs into a metrics store, ask its
nodes how it stands, and turn what is wrong into alerts until the run ends.

:class:`RunWatch` is the loop: every ``interval`` seconds the store's findings and the pool's
node statuses become conditions; every ``status_every`` seconds (and as soon as every log is
complete) the nodes are asked for the run's state. When the run has ended, its logs are read to
the end first, so that the "failed" alert carries the fault that killed it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from console.alerts.engine import (
    AlertEngine,
    Condition,
    finding_conditions,
    node_conditions,
    run_end_condition,
)
from console.alerts.rules import AlertRules
from console.alerts.sinks import Dispatcher
from console.ssh.pool import Pool
from console.training.follow import RunFollower
from console.training.runs import RunRecord, run_status

log = logging.getLogger(__name__)

#: Run states after which there is nothing more to watch.
ENDED = ("finished", "failed", "stopped", "lost")


class RunWatch:
    """Alerts for one run until it ends (see the module docstring)."""

    def __init__(self, pool: Pool, record: RunRecord, rules: AlertRules,
                 dispatcher: Dispatcher, *, interval: float = 5.0, status_every: float = 15.0,
                 follower: RunFollower | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.record = record
        self.rules = rules
        self.dispatcher = dispatcher
        self.interval = interval
        self.status_every = status_every
        self.clock = clock
        self.engine = AlertEngine(pool.cluster.name, record.id, clock=clock)
        self.follower = follower or RunFollower(pool, record, interval=min(1.0, interval))
        self.state = "running"
        self._last_status = float("-inf")

    def conditions(self) -> list[Condition]:
        findings = self.follower.store.findings()
        out = finding_conditions(findings, self.rules)
        out += node_conditions({n: s for n, s in self.pool.statuses().items()
                                if n in {x.node for x in self.record.nodes}}, self.rules)
        return out

    def _ask_state(self) -> str:
        try:
            return run_status(self.pool, self.record).state
        except Exception as exc:  # noqa: BLE001 - an unreachable cluster is not the run's end
            log.warning("run %s: state not known: %s", self.record.id, exc)
            return "running"

    def step(self) -> str | None:
        """One evaluation; the run's end state once it has ended, else None."""
        now = self.clock()
        if self.follower.ended or now - self._last_status >= self.status_every:
            self._last_status = now
            self.state = self._ask_state()
        if self.state not in ENDED:
            self.dispatcher.send(self.engine.evaluate(self.conditions(), now))
            return None
        self.follower.wait(timeout=60)   # the last lines hold the cause
        self.follower.gather_evidence()  # and a SIGKILL's cause is in the node's kernel log
        # The end says why the run ended (its first error finding, with the evidence); what
        # fired before is not "resolved" by the run's end, and a fault first seen in the last
        # lines is told by the end alert rather than paged on its own as well.
        end = run_end_condition(self.state, self.rules, self.follower.store.findings())
        if end is not None:
            self.dispatcher.send([a for a in self.engine.evaluate([end], now)
                                  if a.condition.kind == "run"])
        return self.state

    def run(self, stop: threading.Event | None = None) -> str:
        """Watch until the run ends (or ``stop`` is set: then ``"interrupted"``)."""
        stop = stop or threading.Event()
        self.follower.start()
        try:
            while True:
                end = self.step()
                if end is not None:
                    return end
                if stop.wait(self.interval):
                    return "interrupted"
        finally:
            self.follower.stop()
