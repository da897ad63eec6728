"""Alerts in the console: the bell and a toast for each alert, nothing twice, "resolved" when a
condition clears, and the same line in alerts.log as ``svconsole watch`` writes."""

from __future__ import annotations

import json
import time

from test_alerts import finding
from test_app import offline_cluster

from console.ssh.pool import NodeState, NodeStatus, Pool
from screens.alerting import AlertsHub
from screens.app import SVConsoleApp


def test_hub_sends_a_runs_faults_then_its_end_once(tmp_path):
    got = []
    hub = AlertsHub(offline_cluster(), tmp_path, got.append)
    failing = [finding("host-oom-kill", node="node1", rank=1, text="exitcode: -9")]
    hub.run_seen("run1", failing, "running")
    hub.tick({})
    hub.run_seen("run1", failing, "running")
    hub.tick({})
    hub.run_seen("run1", failing, "failed")
    hub.tick({})
    hub.run_seen("run1", failing, "failed")
    hub.tick({})
    hub.close()
    assert [(a.state, a.condition.kind) for a in got] == [("firing", "fault"), ("firing", "run")]
    assert got[1].condition.fault_id == "host-oom-kill"
    lines = (tmp_path / "alerts.log").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["fault", "run"]


def test_a_run_that_ended_before_the_console_opened_is_not_news(tmp_path):
    """Seen on the tour: opening the console on a run finished 45 minutes earlier popped
    "alert INFO: run finished"."""
    got = []
    hub = AlertsHub(offline_cluster(), tmp_path, got.append)
    hub.run_seen("old-run", [], "finished")
    hub.tick({})
    hub.close()
    assert got == []


async def test_the_app_rings_and_shows_a_toast(tmp_path, monkeypatch):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    bells = []
    app.bell = lambda: bells.append(1)  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            assert app.alerts is not None
            down = {"node1": NodeStatus("node1", NodeState.DOWN, "connection refused",
                                        since=time.time() - 120)}
            app.alerts.tick(down)
            deadline = time.monotonic() + 30
            while not bells and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert bells == [1]
            assert any("node down (node1)" in n.message for n in app._notifications)
            app.alerts.tick({"node1": NodeStatus("node1", NodeState.UP, since=time.time())})
            deadline = time.monotonic() + 30
            while not any(n.title == "resolved" for n in app._notifications) \
                    and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert bells == [1], "a resolved alert is told quietly"
    finally:
        pool.close()
