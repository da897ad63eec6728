"""The Training screen's wiring to this round's pieces: L opens the log view across ranks with
every line of the followed run (read over SSH by the real follower; ':logs NODE' opens it on
one node's lines), and the app's alerts see the run's findings and its end."""

from __future__ import annotations

import time

from test_training_screen import (
    BF16,
    ended_run_on_node1,
    fed_app,  # noqa: F401 - a fixture
    fed_run,
    log_lines,
    loopback_app,
    settle,
    show,
    wait_until,
)

from console.training.runs import index_record
from screens.logview import LogViewScreen


async def test_L_opens_the_log_view_with_every_line_of_the_run(loopback, tmp_path):
    record, log = ended_run_on_node1(loopback.cluster_yaml, tmp_path, "20261201-101500-cafe")
    state = tmp_path / "state"
    index_record(record, state)
    app, pool = loopback_app(loopback.cluster_yaml, state)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await show(pilot)
            await wait_until(pilot, lambda: screen.run_state == "finished" and screen.ended,
                             90, "the run found and followed to its end")
            await pilot.press("L")
            await pilot.pause()
            view = app.screen
            assert isinstance(view, LogViewScreen)
            expected = len(log.read_text(encoding="utf-8").splitlines())
            deadline = time.monotonic() + 30
            while len(view.pane.lines) != expected and time.monotonic() < deadline:
                await pilot.pause(0.1)
            assert len(view.pane.lines) == expected
            assert {ln.node for ln in view.pane.lines} == {"node1"}
            await pilot.press("escape")
            await pilot.pause()
            screen.log_node = "node0"             # as ':logs node0' asks: none of its lines
            await pilot.press("L")
            await pilot.pause(0.6)
            assert app.screen.pane.lines == []
    finally:
        pool.close()


async def test_the_apps_alerts_see_the_followed_runs_findings(fed_app, monkeypatch):  # noqa: F811
    seen = []
    async with fed_app.run_test(size=(120, 36)) as pilot:
        screen = await show(pilot)
        monkeypatch.setattr(fed_app.alerts, "run_seen",
                            lambda run, findings, state: seen.append(
                                (run, {f.id for f in findings}, state)))
        feeder = fed_run(screen, {"node0": BF16})
        feeder.lines("node0", log_lines(BF16), ended=True)
        await settle(pilot)
        assert seen and seen[-1][0] == screen.record.id
        assert any("dtype" in fid for fid in seen[-1][1]), seen[-1]
