"""The app shell: driven with Textual's Pilot, against a real pool (no mocked SSH)."""

from __future__ import annotations

import sys

import pytest

from console.cluster.model import Cluster, Node
from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.broken import BrokenScreen
from screens.config import ConfigScreen
from screens.gpus import GPUsScreen
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


# ------------------------------------------------------------------ one broken screen


@pytest.fixture
def containing_app():
    """The app as ``svconsole`` runs it: a screen's failure is contained in an error panel."""
    cluster = offline_cluster()
    pool = Pool(cluster)
    yield SVConsoleApp(cluster, pool, health_interval=None, contain_screen_errors=True)
    pool.close()


def panel_text(app) -> str:
    return "\n".join(str(s.render()) for s in app.screen.query("Static"))


async def wait_for_screen(pilot, kind: type, timeout: float = 30.0):
    for _ in range(int(timeout / 0.05)):
        if isinstance(pilot.app.screen, kind):
            return pilot.app.screen
        await pilot.pause(0.05)
    raise AssertionError(f"{kind.__name__} not shown; {type(pilot.app.screen).__name__} is")


async def assert_other_screens_open(pilot, broken_mode: str) -> None:
    for mode, key, title in SCREENS:
        if mode == broken_mode:
            continue
        await pilot.press(key)
        await pilot.pause()
        assert pilot.app.current_mode == mode, title
        assert not isinstance(pilot.app.screen, BrokenScreen), title
        assert type(pilot.app.screen).__name__.removesuffix("Screen") == title, title


async def test_a_screen_whose_module_fails_to_import_is_an_error_panel(containing_app,
                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "screens.config", None)  # import of it now raises
    async with containing_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")
        screen = await wait_for_screen(pilot, BrokenScreen)
        text = panel_text(containing_app)
        assert "The Config screen could not be built: its module did not import" in text
        assert "module: screens.config" in text and "ModuleNotFoundError" in text
        assert "Traceback (most recent call last)" in text
        assert screen.mode_name == "config"
        await assert_other_screens_open(pilot, "config")
        await pilot.press("3")  # the panel stays the Config screen's until it is retried
        await wait_for_screen(pilot, BrokenScreen)
        monkeypatch.undo()
        await pilot.press("r")
        await wait_for_screen(pilot, ConfigScreen)
        assert containing_app.current_mode == "config"
    assert containing_app.return_code in (0, None)


async def test_a_screen_whose_compose_raises_is_an_error_panel(containing_app, monkeypatch):
    def broken_compose(self):
        raise RuntimeError("boom in compose")
        yield  # a generator, as compose is

    monkeypatch.setattr(ConfigScreen, "compose", broken_compose)
    async with containing_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")
        await wait_for_screen(pilot, BrokenScreen)
        text = panel_text(containing_app)
        assert "The Config screen could not be built" in text
        assert "module: screens.config" in text
        assert "RuntimeError: boom in compose" in text
        assert "broken_compose" in text  # the traceback names the code that raised
        await assert_other_screens_open(pilot, "config")
        monkeypatch.undo()
        await pilot.press("3")
        await wait_for_screen(pilot, BrokenScreen)
        await pilot.press("r")
        await wait_for_screen(pilot, ConfigScreen)
    assert containing_app.return_code in (0, None)


async def test_a_screen_whose_mount_raises_is_an_error_panel(containing_app, monkeypatch):
    def broken_mount(self):
        raise ValueError("boom in mount")

    monkeypatch.setattr(GPUsScreen, "on_mount", broken_mount)
    async with containing_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await wait_for_screen(pilot, BrokenScreen)
        text = panel_text(containing_app)
        assert "The GPUs screen could not be built" in text
        assert "module: screens.gpus" in text and "ValueError: boom in mount" in text
        await assert_other_screens_open(pilot, "gpus")
        await pilot.press("5")
        await wait_for_screen(pilot, BrokenScreen)
        await pilot.press("question_mark")  # help works over the panel and names retry
        await wait_for_screen(pilot, HelpScreen)
        assert "Retry" in panel_text(containing_app)
    assert containing_app.return_code in (0, None)


async def test_without_containment_a_screen_error_still_ends_the_app(offline_app, monkeypatch):
    """Tests build the app without containment, so a broken screen fails them loudly."""
    def broken_compose(self):
        raise RuntimeError("boom in compose")
        yield

    monkeypatch.setattr(ConfigScreen, "compose", broken_compose)
    with pytest.raises(RuntimeError, match="boom in compose"):
        async with offline_app.run_test(size=(100, 30)) as pilot:
            await pilot.press("3")
            await pilot.pause(0.5)
