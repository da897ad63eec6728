"""The app shell: driven with Textual's Pilot, against a real pool (no mocked SSH)."""

from __future__ import annotations

import pytest

from console.cluster.model import Cluster, Node
from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.help import HelpScreen
from screens.keys import SCREENS
from screens.messages import NodeStatusChanged


def offline_cluster() -> Cluster:
    """Nodes nobody answers for: a stable picture for snapshots (the pool is never started)."""
    nodes = tuple(
        Node(name=f"node{i}", host=f"192.0.2.{i + 10}", port=22, role="head" if i == 0 else "worker",
             gpus=(0, 1, 2, 3))
        for i in range(3)
    )
    return Cluster(name="sv-a100", nodes=nodes, shared_dir="/data/shared", master="node0")


@pytest.fixture
def offline_app():
    cluster = offline_cluster()
    pool = Pool(cluster)
    yield SVConsoleApp(cluster, pool, health_interval=None)
    pool.close()


async def test_keys_switch_the_five_screens(offline_app):
    async with offline_app.run_test(size=(80, 24)) as pilot:
        for mode, key, title in SCREENS:
            await pilot.press(key)
            await pilot.pause()
            assert offline_app.current_mode == mode, title
        await pilot.press("1")
        assert offline_app.current_mode == "nodes"


async def test_help_lists_the_screen_keys_and_closes(offline_app):
    async with offline_app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(offline_app.screen, HelpScreen)
        text = "\n".join(str(s.render()) for s in offline_app.screen.query("Static"))
        assert "Reconnect" in text and "Quit" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(offline_app.screen, HelpScreen)


async def test_quit_key_exits(offline_app):
    async with offline_app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert offline_app.return_code in (0, None)


async def test_header_counts_nodes_up_live(loopback):
    from console.cluster.model import load_cluster

    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=1.0)
    messages = []
    try:
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if app.sub_title == f"{len(cluster.nodes)}/{len(cluster.nodes)} nodes up":
                    break
            assert app.sub_title == f"{len(cluster.nodes)}/{len(cluster.nodes)} nodes up"
            assert any(isinstance(m, NodeStatusChanged) for m in messages)
            table = app.screen.query_one("#nodes-table")
            assert "up" in str(table.get_cell("node0", "state"))
    finally:
        pool.close()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("key", [key for _, key, _ in SCREENS])
def test_snapshot(snap_compare, key, size):
    cluster = offline_cluster()
    pool = Pool(cluster)
    try:
        async def show(pilot) -> None:
            await pilot.press(key)
            for _ in range(600):  # a screen that loads in the background says when it settled
                await pilot.pause(0.1)
                if getattr(pilot.app.screen, "settled", True):
                    break

        assert snap_compare(SVConsoleApp(cluster, pool, health_interval=None), run_before=show,
                            terminal_size=size)
    finally:
        pool.close()
