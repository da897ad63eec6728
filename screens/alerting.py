"""Alerts in the console: the rules of cluster.yaml's ``alerts:`` section applied to what the
console sees, rung as the terminal bell and shown as a toast, and sent to the same sinks as
``svconsole watch`` (alerts.log, webhooks, command hooks).

:class:`AlertsHub` belongs to the app. The Training screen hands it its followed run's findings
and state (:meth:`AlertsHub.run_seen`); the app ticks it every few seconds with the pool's node
states. Everything here runs on the UI thread except the sinks, which have threads of their own;
the bell and the toast come back through ``call_from_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from console.alerts.engine import (
    AlertEngine,
    Condition,
    finding_conditions,
    node_conditions,
    run_end_condition,
)
from console.alerts.rules import AlertRules, load_rules
from console.alerts.sinks import Dispatcher, sinks_for
from console.alerts.watch import ENDED
from console.cluster.model import Cluster, ClusterConfigError


class AlertsHub:
    """The console's alert engine and sinks (see the module docstring)."""

    def __init__(self, cluster: Cluster, state_dir: Path,
                 show: Callable[[Any], None]) -> None:
        self.problem: str | None = None
        try:
            self.rules = load_rules(cluster)
        except ClusterConfigError as exc:
            self.rules, self.problem = AlertRules(), f"alerts off: {exc}"
        self.engine = AlertEngine(cluster.name)
        self.dispatcher = Dispatcher(sinks_for(self.rules, state_dir, callback=show),
                                     self.rules.rate_limit)
        self._run: list[Condition] = []
        self._run_id: str | None = None
        self._ended: set[str] = set()
        self._running: set[str] = set()
        self._end: Condition | None = None

    def run_seen(self, run_id: str, findings: Sequence[Any], state: str) -> None:
        """The followed run as the Training screen sees it now (sent at the next tick)."""
        if run_id != self._run_id:
            self._run_id, self._run = run_id, []
            self.engine.run = run_id
        if state in ENDED:
            # told only for a run this console saw running: a run that ended before the
            # console opened is history, not news
            if run_id in self._running and run_id not in self._ended:
                self._ended.add(run_id)
                self._end = run_end_condition(state, self.rules, findings)
            self._run = []
        else:
            self._running.add(run_id)
            self._run = finding_conditions(findings, self.rules)

    def tick(self, statuses: dict[str, Any]) -> None:
        """Evaluate everything known now and send what is new. A run's end is told once, with
        its cause; its faults are not "resolved" by it."""
        conditions = self._run + node_conditions(statuses, self.rules)
        end, self._end = self._end, None
        alerts = self.engine.evaluate(conditions + ([end] if end else []))
        if end is not None:
            alerts = [a for a in alerts if not (a.state == "resolved" and a.condition.kind in
                                                ("fault", "stall", "straggler"))]
        self.dispatcher.send(alerts)

    def close(self) -> None:
        self.dispatcher.close()
