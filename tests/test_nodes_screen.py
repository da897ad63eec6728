"""The Nodes screen, driven with Textual's Pilot: filter, marks, sort, detail pane, the node form
and its validation, hostfiles, stale facts of a killed loopback node, and snapshots.

Offline tests use nodes at documentation addresses (192.0.2.x, nobody answers; the pool is never
started) with facts from ``fixtures/nodes/facts-cache.json`` and a fixed clock, so snapshots hold
no wall-clock time and nothing that depends on a probe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from console.cluster.model import Cluster, ClusterConfigError, load_cluster, local_cluster
from console.cluster.probe import FactsCache, NodeFacts
from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.messages import NodeFactsArrived, ProbeRoundFinished
from screens.node_detail import NodeDetail
from screens.node_form import ConfirmDialog, NodeForm, PathPrompt
from screens.nodes import NodesScreen, keep_torch_details

FIXTURES = Path(__file__).parent / "fixtures" / "nodes"
#: The fixed clock: facts of node0/node1 are 12 s old, node2's 5 min (2027-01-15 08:00:00 UTC).
NOW = 1_800_000_000.0

CLUSTER_YAML = """\
# our H200 cluster (comment kept by every edit)
cluster:
  name: sv-h200
  shared_dir: /data/shared
  master: node0
ssh:
  user: train
nodes:
  - name: node0        # the head
    host: 192.0.2.10
    role: head
    gpus: "0,1,2,3,4,5,6,7"
  # workers below
  - name: node1
    host: 192.0.2.11
    gpus: "0,1,2,3,4,5,6,7"
  - name: node2
    host: 192.0.2.12
    gpus: "0,1,2,3,4,5,6,7"
  - name: node3
    host: 192.0.2.13
"""


@pytest.fixture(autouse=True)
def _stable(monkeypatch, tmp_path):
    """A private state directory (facts cache), UTC times and the fixed clock."""
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(NodesScreen, "clock", staticmethod(lambda: NOW))
    # the loopback nodes' Python has torch: importing it takes seconds per probe here
    monkeypatch.setattr(NodesScreen, "TORCH_TIMEOUT", 0.0)
    yield
    monkeypatch.undo()
    time.tzset()


def fixture_facts() -> list[NodeFacts]:
    """node0 and node1 fresh (node1 with another torch), node2's last known facts (stale)."""
    doc = json.loads((FIXTURES / "facts-cache.json").read_text())
    facts = [NodeFacts.from_json(v) for v in doc["nodes"].values()]
    facts[2].ok, facts[2].stale, facts[2].error = False, True, "connection refused"
    return facts


def offline_cluster(tmp_path: Path) -> Cluster:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_YAML)
    return load_cluster(path)


@pytest.fixture
def app(tmp_path):
    cluster = offline_cluster(tmp_path)
    pool = Pool(cluster)
    yield SVConsoleApp(cluster, pool, health_interval=None)
    pool.close()


async def feed(app, pilot, facts=None) -> NodesScreen:
    """Post the fixture facts as a probe would, and wait until the screen shows them."""
    screen = app.screen
    assert isinstance(screen, NodesScreen)
    for f in facts if facts is not None else fixture_facts():
        screen.post_message(NodeFactsArrived(f))
    await pilot.pause()
    return screen


def rows(app) -> list[str]:
    table = app.screen.query_one("#nodes-table", DataTable)
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


def cell(app, node: str, column: str) -> str:
    return str(app.screen.query_one("#nodes-table", DataTable).get_cell(node, column))


def detail(app) -> str:
    return str(app.screen.query_one("#node-detail-text", Static).render())


async def test_filter_by_name_host_state_and_verdict(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        await pilot.press("slash", *"node1")
        await pilot.pause()
        assert rows(app) == ["node1"]
        box = app.screen.query_one("#nodes-filter", Input)
        box.value = "192.0.2.12"
        await pilot.pause()
        assert rows(app) == ["node2"]
        box.value = "stale"
        await pilot.pause()
        assert rows(app) == ["node2"]
        box.value = "not ready"
        await pilot.pause()
        assert rows(app) == ["node1", "node2"]  # node1's torch differs, node2 is unreachable
        assert "filter “not ready”: 2/4" in str(app.screen.query_one("#nodes-summary").render())
        await pilot.press("enter")  # keeps the filter, back to the table
        assert app.focused is app.screen.query_one("#nodes-table")
        assert rows(app) == ["node1", "node2"]
        await pilot.press("escape")
        await pilot.pause()
        assert rows(app) == ["node0", "node1", "node2", "node3"]
        assert not box.display


async def test_marks_toggle_all_and_pick_refresh_targets(app):
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await feed(app, pilot)
        assert screen.targets() == ["node0", "node1", "node2", "node3"]  # none marked: all
        await pilot.press("down", "space")  # marks node1, moves to node2
        assert screen.marked == {"node1"}
        assert cell(app, "node1", "mark") == "●" and cell(app, "node0", "mark") == " "
        assert screen.highlighted == "node2"
        await pilot.press("space")
        assert screen.targets() == ["node1", "node2"]
        assert "2 marked" in str(screen.query_one("#nodes-summary").render())
        await pilot.press("up", "up", "space")  # back to node1: unmark it
        assert screen.marked == {"node2"}
        await pilot.press("a")
        assert screen.marked == {"node0", "node1", "node2", "node3"}
        await pilot.press("a")
        assert screen.marked == set()


async def test_sort_cycles_columns_and_header_click_reverses(app):
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await feed(app, pilot)
        while screen.sort_key != "verdict":
            await pilot.press("s")
        # ready first, then not ready (by name), unprobed last
        assert rows(app) == ["node0", "node1", "node2", "node3"]
        while screen.sort_key != "state":
            await pilot.press("s")
        table = screen.query_one("#nodes-table", DataTable)
        await pilot.click(table, offset=(4, 0))  # the "Node" header
        assert screen.sort_key == "node" and rows(app)[0] == "node0"
        await pilot.click(table, offset=(4, 0))
        assert screen.sort_reverse and rows(app) == ["node3", "node2", "node1", "node0"]


async def test_detail_pane_facts_age_stale_and_mismatch(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        pane = app.screen.query_one(NodeDetail)
        assert not pane.display  # narrow: a toggle
        await pilot.press("down", "d")
        assert pane.display
        text = detail(app)
        assert "facts: 12 s ago" in text
        assert "torch: 2.5.1 (others: 2.6.0)" in text
        assert "mixed versions break collective communication" in text
        assert "8x (GPU 0-7): NVIDIA H200 140.4 GiB, cc 9.0, driver 580.159.04" in text
        assert "Hardware tier: high end" in text
        # the odd cell is highlighted in the table
        table = app.screen.query_one("#nodes-table", DataTable)
        stack = table.get_cell("node1", "stack")
        assert any("red" in str(span.style) and stack.plain[span.start:span.end] == "2.5.1"
                   for span in stack.spans)
        assert not any("red" in str(s.style) for s in table.get_cell("node0", "stack").spans)
        await pilot.press("down")
        text = detail(app)
        assert "facts: STALE: from 07:55:00 (5 min ago)" in text
        assert "last probe failed: connection refused" in text
        assert "stale" in cell(app, "node2", "state")
        await pilot.press("d")
        assert not pane.display


async def test_cluster_verdict_with_reasons_on_top(app):
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await feed(app, pilot)
        head = str(screen.query_one("#nodes-summary").render())
        assert head.startswith("sv-h200: NOT READY")
        reasons = str(screen.query_one("#nodes-reasons").render())
        assert "node2: unreachable: connection refused (facts from 5 min ago)" in reasons
        assert "torch differs: node0=2.6.0, node1=2.5.1" in reasons
        assert screen.report.nodes["node0"].verdict.value == "ready"


async def test_bad_port_shows_the_loaders_message_at_the_field(app, tmp_path):
    path = tmp_path / "cluster.yaml"
    before = path.read_text()
    bad = tmp_path / "bad" / "cluster.yaml"
    bad.parent.mkdir()
    node1 = '  - name: node1\n    host: 192.0.2.11\n    gpus: "0,1,2,3,4,5,6,7"\n'
    bad.write_text(before.replace(node1, node1 + "    port: 70000\n"))  # where the form puts it
    with pytest.raises(ClusterConfigError) as loader:
        load_cluster(bad)
    expected = str(loader.value).replace(str(bad), str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        await pilot.press("down", "e")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, NodeForm)
        assert form.query_one("#field-host", Input).value == "192.0.2.11"
        form.query_one("#field-port", Input).value = "70000"
        await pilot.press("ctrl+s")
        await app.workers.wait_for_complete()
        await pilot.pause()
        shown = str(form.query_one("#error-port", Static).render())
        assert shown == expected
        assert "must be a port number from 1 to 65535, got 70000" in shown
        assert app.screen is form  # still open
        await pilot.press("escape")
    assert path.read_text() == before  # nothing written
    assert not (tmp_path / "cluster.yaml.bak").exists()


async def test_good_edit_saves_atomically_keeps_comments_and_reloads(app, tmp_path):
    path = tmp_path / "cluster.yaml"
    before = path.read_text()
    async with app.run_test(size=(160, 48)) as pilot:
        await feed(app, pilot)
        await pilot.press("down", "e")
        await pilot.pause()
        form = app.screen
        form.query_one("#field-host", Input).value = "192.0.2.21"
        form.query_one("#field-port", Input).value = "2222"
        await pilot.press("ctrl+s")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, NodesScreen)
        assert app.cluster.node("node1").host == "192.0.2.21"
        assert app.pool.cluster is app.cluster
        assert cell(app, "node1", "host") == "192.0.2.21:2222"
    text = path.read_text()
    assert "# our H200 cluster (comment kept by every edit)" in text
    assert "# workers below" in text and "# the head" in text
    assert "    host: 192.0.2.21\n" in text
    assert "port: 2222" in text
    assert (tmp_path / "cluster.yaml.bak").read_text() == before
    assert load_cluster(path).node("node1").port == 2222


async def test_add_then_remove_a_node_with_confirmation(app, tmp_path):
    path = tmp_path / "cluster.yaml"
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        await pilot.press("n")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, NodeForm)
        await pilot.press(*"node9", "tab", *"192.0.2.19")
        form.query_one("#field-gpus", Input).value = "0,1"
        await pilot.press("enter")  # enter in a field saves too
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.cluster.names()[-1] == "node9"
        assert "node9" in rows(app)
        # removal asks first; "n" keeps the node
        table = app.screen.query_one("#nodes-table", DataTable)
        table.move_cursor(row=table.get_row_index("node9"))
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("n")
        await pilot.pause()
        assert "node9" in app.cluster.names()
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "node9" not in app.cluster.names() and "node9" not in rows(app)
    assert "node9" not in path.read_text() and "# workers below" in path.read_text()


async def test_confirm_dialog_answered_before_it_finished_opening(app):
    """A key that closes the dialog at once (no pause) is an answer, not a crash."""
    answers = []
    async with app.run_test(size=(80, 24)) as pilot:
        for yes in (False, True):
            dialog = ConfirmDialog("Remove node1?")
            app.push_screen(dialog, answers.append)
            dialog.action_answer(yes)  # answered in the same tick it was pushed
            await pilot.pause()
        assert app.return_code is None  # no crash ended the app
    assert answers == [False, True]


async def test_removing_the_master_is_refused_with_the_loaders_message(app, tmp_path):
    path = tmp_path / "cluster.yaml"
    before = path.read_text()
    errors = []
    app.notify = lambda message, **kw: errors.append(message)  # the app's one error handler
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "node0" in app.cluster.names()
    assert path.read_text() == before
    assert any("remove the node failed" in e and "cluster.master: 'node0' is not a node" in e
               for e in errors), errors


async def test_embedded_default_form_says_it_creates_cluster_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cluster = local_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("n")
            await pilot.pause()
            note = str(app.screen.query(".note").first().render())
            assert f"saving creates {tmp_path / 'cluster.yaml'}" in note.replace("\n", " ")
            await pilot.press(*"gpu1", "tab", *"192.0.2.31")
            await pilot.press("ctrl+s")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.cluster.path == Path("cluster.yaml")
            assert app.cluster.names() == [cluster.nodes[0].name, "gpu1"]
    finally:
        app.pool.close()
        pool.close()
    saved = load_cluster(tmp_path / "cluster.yaml")
    assert saved.node(cluster.nodes[0].name).local and saved.master == cluster.nodes[0].name


async def test_hostfile_export_and_import(app, tmp_path):
    out = tmp_path / "hostfile"
    async with app.run_test(size=(80, 24)) as pilot:
        await feed(app, pilot)
        await pilot.press("o")
        await pilot.pause()
        assert isinstance(app.screen, PathPrompt)
        app.screen.query_one(Input).value = str(out)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        # node3 has no gpus setting and no facts: the export names it instead of guessing
        assert not out.exists()
        await feed(app, pilot, [_with_node("node3")])
        await pilot.press("o")
        await pilot.pause()
        app.screen.query_one(Input).value = str(out)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert out.read_text().splitlines()[1:] == [
            "192.0.2.10 slots=8", "192.0.2.11 slots=8", "192.0.2.12 slots=8", "192.0.2.13 slots=8"]
        hosts = tmp_path / "more-hosts"
        hosts.write_text("192.0.2.11 slots=4\n192.0.2.40 slots=2\n")
        await pilot.press("i")
        await pilot.pause()
        app.screen.query_one(Input).value = str(hosts)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.cluster.node("node1").gpus == (0, 1, 2, 3)
        assert app.cluster.names() == ["node0", "node1", "node2", "node3", "node4"]
        assert app.cluster.node("node4").host == "192.0.2.40"
        assert "node4" in rows(app)


def _with_node(name: str) -> NodeFacts:
    facts = fixture_facts()[0]
    facts.node = name
    return facts


async def test_cached_facts_show_as_stale_before_the_first_probe(app):
    from console.cli import state_dir

    cache = FactsCache(state_dir(), "sv-h200")
    cache.save({f.node: f for f in fixture_facts()[:2]})
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        screen = app.screen
        assert screen.facts["node0"].stale and screen.facts["node0"].error == "not probed yet"
        assert "stale" in cell(app, "node0", "state")
        assert "node3" not in screen.facts


def test_a_light_probe_keeps_torch_details_of_the_same_torch():
    full = fixture_facts()[0]
    light = fixture_facts()[0]
    light.python = {**light.python, "torch_imported": False, "torch_cuda": None, "nccl": None}
    kept = keep_torch_details(light, full)
    assert kept.python["torch_cuda"] == "12.4" and kept.python["nccl"] == "2.21.5"
    upgraded = fixture_facts()[0]
    upgraded.python = {**light.python, "torch": "2.7.0"}
    assert keep_torch_details(upgraded, full).python["torch_cuda"] is None  # not carried over
    assert keep_torch_details(light, None) is light


async def test_older_facts_arriving_late_do_not_replace_newer_ones(app):
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await feed(app, pilot)
        old = fixture_facts()[0]
        old.collected_at -= 600
        old.ok, old.stale = False, True
        await feed(app, pilot, [old])
        assert screen.facts["node0"].ok and screen.facts["node0"].collected_at == NOW - 12


# ---------------------------------------------------------------- against real sshd


async def wait_for(pilot, condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


async def test_killed_node_keeps_stale_facts_while_the_others_refresh(loopback, monkeypatch):
    monkeypatch.setattr(NodesScreen, "clock", staticmethod(time.time))
    monkeypatch.setattr(NodesScreen, "PROBE_TIMEOUT", 20.0)
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    messages: list = []
    try:
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            screen = app.screen
            await pilot.press("r")
            await wait_for(pilot, lambda: not screen.round_running and len(screen.facts) == 4)
            before = dict(screen.facts)
            first = {n: f.collected_at for n, f in before.items()}
            assert all(f.ok for f in screen.facts.values()), {
                n: f.error for n, f in screen.facts.items()}
            assert screen.facts["node1"].cpu_cores and screen.facts["node1"].hostname
            loopback.kill(1)
            messages.clear()
            await pilot.press("r")
            live = ("node0", "node2", "node3")
            # the round is over when the live nodes have new facts and the dead one is marked
            # (a ProbeRoundFinished still queued from the first round must not count)
            await wait_for(pilot, lambda: screen.facts["node1"].stale and all(
                screen.facts[n].collected_at > first[n] for n in live), 60)
            await pilot.pause()
            dead = screen.facts["node1"]
            assert not dead.ok and dead.stale and dead.collected_at == first["node1"]
            assert dead.hostname == before["node1"].hostname  # last known facts kept
            assert dead.cpu_cores == before["node1"].cpu_cores
            for name in live:
                assert screen.facts[name].ok and screen.facts[name].collected_at > first[name]
            assert "stale" in cell(app, "node1", "state")
            assert cell(app, "node1", "verdict") == "not ready"
            await pilot.press("down", "d")
            text = detail(app)
            assert "facts: STALE: from" in text and "last probe failed:" in text
            # each node's facts were posted on their own, not as one batch at the end
            arrived = [m.facts.node for m in messages if isinstance(m, NodeFactsArrived)]
            assert sorted(set(arrived)) == ["node0", "node1", "node2", "node3"]
    finally:
        app.pool.close()


async def test_periodic_probe_rearms_and_pauses_while_hidden(loopback, monkeypatch):
    monkeypatch.setattr(NodesScreen, "PROBE_INTERVAL", 0.3)
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=30.0)
    messages: list = []
    rounds = lambda: [m for m in messages if isinstance(m, ProbeRoundFinished)]  # noqa: E731
    try:
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            screen = app.screen
            await wait_for(pilot, lambda: len(rounds()) >= 2)  # first on mount, then re-armed
            await pilot.press("2")
            await wait_for(pilot, lambda: not screen.round_running)
            hidden = len(rounds())
            await pilot.pause(1.5)
            assert len(rounds()) == hidden and screen._probe_due  # held while hidden
            await pilot.press("1")
            await wait_for(pilot, lambda: len(rounds()) > hidden)
    finally:
        app.pool.close()


async def test_a_hung_node_does_not_hold_the_others_or_the_ui(loopback, monkeypatch):
    monkeypatch.setattr(NodesScreen, "PROBE_TIMEOUT", 4.0)
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            pool.run_all("true")  # connect first: the hang hits the probe itself
            loopback.hang(3)
            await pilot.press("r")
            await wait_for(pilot, lambda: {"node0", "node1", "node2"} <= set(screen.facts))
            assert "node3" in screen.probing  # still waiting for the hung node
            await pilot.press("slash", *"node2")  # the UI answers meanwhile
            await pilot.pause()
            assert rows(app) == ["node2"]
            await wait_for(pilot, lambda: not screen.round_running, seconds=30)
            assert not screen.facts["node3"].ok
    finally:
        app.pool.close()


# ---------------------------------------------------------------- snapshots


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot(snap_compare, tmp_path, size):
    cluster = offline_cluster(tmp_path)
    pool = Pool(cluster)

    async def show_facts(pilot):
        await feed(pilot.app, pilot)
        await pilot.press("down")
        await pilot.pause()

    try:
        assert snap_compare(SVConsoleApp(cluster, pool, health_interval=None),
                            terminal_size=size, run_before=show_facts)
    finally:
        pool.close()


def test_snapshot_detail_80x24(snap_compare, tmp_path):
    cluster = offline_cluster(tmp_path)
    pool = Pool(cluster)

    async def show_detail(pilot):
        await feed(pilot.app, pilot)
        await pilot.press("down", "d")
        await pilot.pause()

    try:
        assert snap_compare(SVConsoleApp(cluster, pool, health_interval=None),
                            terminal_size=(80, 24), run_before=show_detail)
    finally:
        pool.close()
