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


async def test_nodes_hostfile_export_refuses_gpu_less_nodes_like_the_cli(tmp_path):
    """Seen: Nodes `o` wrote a hostfile with no host lines and said "(3 nodes)" on GPU-less
    nodes, where `svconsole hostfile export` refuses."""
    from test_nodes_screen import feed as feed_facts
    from test_nodes_screen import fixture_facts
    from textual.widgets import Input

    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool
    from screens.app import SVConsoleApp

    yaml_path = tmp_path / "cluster.yaml"
    yaml_path.write_text("cluster:\n  name: cpu-lab\n  master: node0\nnodes:\n" + "".join(
        f"  - name: node{i}\n    host: 192.0.2.{10 + i}\n" for i in range(4)))
    cluster = load_cluster(yaml_path)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
    gpu_less = []
    for i, f in enumerate(fixture_facts()[:1] * 4):
        f = type(f).from_json(f.to_json())
        f.node, f.gpus, f.ok, f.stale = f"node{i}", [], True, False
        gpu_less.append(f)
    out = tmp_path / "hostfile"
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await feed_facts(app, pilot, gpu_less)
            await pilot.press("o")
            await pilot.pause()
            app.screen.query_one(Input).value = str(out)
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await wait_until(pilot, lambda: notes, "the refusal")
            assert not out.exists()
            assert "no node has a GPU" in notes[-1] and "--slots" in notes[-1], notes
    finally:
        pool.close()


def test_setup_phases_are_lettered_not_numbered():
    """Seen: the Setup screen numbered its phases 1-5 while keys 1-5 switch screens."""
    from console.bringup.model import PHASES
    from screens.setup_widgets import PhaseChecklist

    class Standing:
        def phase_status(self, phase):
            return "not started"

    lines = [line for line in PhaseChecklist.text_of(Standing()).plain.splitlines()
             if "○" in line]
    assert [line.split()[0] for line in lines] == list("ABCDEFGHIJ"[:len(PHASES)])


def test_gpu_sparkline_sits_next_to_its_bar_at_160_columns():
    """Seen: at 160 columns the sparklines sat far to the right of their bars."""
    from test_gpus_screen import sim_sample

    from console.gpu.telemetry import NodeStatus, judge_gpu
    from screens.gpu_widgets import SPARKS, GPUView, NodeView, _gpu_line

    sample = sim_sample(0, gpus=1)
    g = sample.gpus[0]
    history = (60.0, 70.0, 80.0)                   # a few seconds of history so far
    view = GPUView(g, judge_gpu(g, in_run=True), history, history)
    line = _gpu_line(NodeView("node0", NodeStatus.LIVE, gpus=(view,), in_run=True), view,
                     156).plain
    bar_end = line.index("%") + 1                  # the utilisation bar and its percentage
    first_spark = min(line.index(ch) for ch in SPARKS if ch in line[bar_end:])
    assert first_spark - bar_end <= 2, line


def test_events_pane_collapses_repeats():
    """Seen: 480 events for 40 steps. Every rank's same line is one line with its count."""
    from console.training.logparse import parse_line
    from console.training.metrics import FeedItem
    from screens.training_widgets import feed_text

    items = [FeedItem(f"node{r // 2}", 0.0, parse_line(
        f"[2026-12-01 10:00:0{r},000][root][INFO] - Train epoch: 3, rank: {r}")) for r in range(4)]
    items += [FeedItem("node0", 0.0, parse_line(
        "[2026-12-01 10:00:09,000][root][INFO] - Save checkpoint: 3, rank: 0"))]
    lines = feed_text(items).plain.splitlines()
    assert len(lines) == 2, lines
    assert "×4" in lines[0] and "4 ranks" in lines[0] and "×" not in lines[1]
