"""The stale and wrong texts an operator saw (the babysitting issue's list), each reproduced
and held fixed: GPU alarms only during a live run, the Nodes screen's readiness following the
node states live, the hostfile export refusing like the CLI, the Setup phases lettered."""

from __future__ import annotations

import time

from test_gpus_screen import a_run, fed_app, feed, low_rows, overview_of, show, training_sample

from screens.messages import RunFollowed


async def wait_until(pilot, predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def test_gpu_alarms_stop_when_the_followed_run_has_ended():
    app, pool = fed_app(["node0", "node1"])
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await show(pilot)
            hot = training_sample(low_rows(2), mem_pct=97.0)   # ranks still on the GPUs
            feed(screen, "node0", hot)
            live = a_run({"node0": 0, "node1": 1})
            screen.post_message(live)
            await wait_until(pilot, lambda: "alarm" in overview_of(screen), "the run's alarms")
            ended = RunFollowed(live.record, live.ranks, live=False)
            screen.post_message(ended)
            feed(screen, "node0", hot)                           # the same readings, after it
            await wait_until(pilot, lambda: not screen.board.in_run, "the run to end")
            await wait_until(pilot, lambda: "alarm" not in overview_of(screen),
                             "the alarms to go")
    finally:
        pool.close()


async def test_nodes_reasons_follow_a_node_that_came_back(loopback, monkeypatch):
    """Seen: "✗ node1: unreachable (facts from 113 s ago)" for over a minute after node1 came
    back. Now the node is probed again as soon as the pool sees it up."""
    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool
    from screens.app import SVConsoleApp
    from screens.nodes import NodesScreen

    monkeypatch.setattr(NodesScreen, "PROBE_INTERVAL", 3600.0)   # no periodic round helps
    monkeypatch.setattr(NodesScreen, "PROBE_TIMEOUT", 20.0)
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=1.0)

    def reasons() -> str:
        return str(app.screen.query_one("#nodes-reasons").render())

    try:
        async with app.run_test(size=(120, 36)) as pilot:
            screen = app.screen
            await wait_until(pilot, lambda: len(screen.facts) == 4 and not screen.round_running
                             and all(f.ok for f in screen.facts.values()), "the first round", 90)
            loopback.kill(1)
            await pilot.press("r")
            await wait_until(pilot, lambda: not screen.facts["node1"].ok
                             and not screen.round_running, "node1 unreachable", 90)
            await wait_until(pilot, lambda: "unreachable" in reasons(), "the reason", 30)
            loopback.restart(1)
            await wait_until(pilot, lambda: screen.facts["node1"].ok, "node1 probed again", 60)
            await wait_until(pilot, lambda: "unreachable" not in reasons(), "the reason to go",
                             30)
    finally:
        pool.close()
