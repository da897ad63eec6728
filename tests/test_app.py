"""The app shell: driven with Textual's Pilot, against a real pool (no mocked SSH)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import screens.app
from console.cluster.model import Cluster, Node, load_cluster, local_cluster
from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.broken import BrokenScreen
from screens.config import ConfigScreen
from screens.gpus import GPUsScreen
from screens.help import HelpScreen
from screens.keys import SCREENS
from screens.leave import LeaveDialog
from screens.messages import NodeStatusChanged
from screens.node_form import ConfirmDialog, NodeForm
from screens.nodes import NodesScreen
from screens.setup import SetupScreen


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


class SnapshotApp(SVConsoleApp):
    """The app whose GPUs screen starts no agent, so its nodes stay ``starting``: a real agent
    start against the offline addresses fails after the 10 s connect timeout, sooner than a
    loaded machine may take the picture (seen in CI: the nodes were ``down``)."""

    CSS_PATH = str(Path(screens.app.__file__).with_name(SVConsoleApp.CSS_PATH))
    MODES = {**SVConsoleApp.MODES, "gpus": lambda: GPUsScreen(start_telemetry=False)}


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

        assert snap_compare(SnapshotApp(cluster, pool, health_interval=None), run_before=show,
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
        screen = pilot.app.screen
        if isinstance(screen, kind) and screen.is_mounted:
            await pilot.pause()  # its compose and mount done
            return screen
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


# ------------------------------------------------------------------ leaving asks first


async def test_quit_with_nothing_unsaved_quits_at_once(offline_app):
    async with offline_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")  # a screen that can have unsaved work, untouched
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert not isinstance(offline_app.screen, LeaveDialog)
    assert offline_app.return_code in (0, None)


async def open_node_form(pilot) -> NodeForm:
    await pilot.press("1")
    await pilot.press("n")  # new node
    form = await wait_for_screen(pilot, NodeForm)
    for _ in range(50):
        if getattr(form, "_initial_values", None) is not None:
            break
        await pilot.pause(0.05)
    return form


async def type_into(pilot, form: NodeForm, field: str, text: str) -> None:
    form.query_one(f"#field-{field}").focus()
    await pilot.press(*text)
    await pilot.pause()


async def test_escape_in_a_node_form_with_edits_asks_before_discarding(offline_app):
    async with offline_app.run_test(size=(100, 30)) as pilot:
        form = await open_node_form(pilot)
        assert form.unsaved_work() is None  # nothing typed yet
        await type_into(pilot, form, "name", "node9")
        await pilot.press("escape")
        confirm = await wait_for_screen(pilot, ConfirmDialog)
        assert confirm.question.startswith("Discard the new node's name?")
        await pilot.press("n")
        assert await wait_for_screen(pilot, NodeForm) is form
        assert form.query_one("#field-name").value == "node9"  # nothing lost
        await pilot.press("escape")
        await wait_for_screen(pilot, ConfirmDialog)
        await pilot.press("y")
        await wait_for_screen(pilot, NodesScreen)
        form = await open_node_form(pilot)  # a new form, empty: escape closes it at once
        await pilot.press("escape")
        await wait_for_screen(pilot, NodesScreen)


async def test_quit_with_an_unsaved_node_form_asks_and_cancel_keeps_it(offline_app):
    """Over a dialog, q is the dialog's (or typed text): whatever else asks the app to quit
    (the palette, ctrl+q where bound) asks first too."""
    async with offline_app.run_test(size=(100, 30)) as pilot:
        form = await open_node_form(pilot)
        await type_into(pilot, form, "name", "node9")
        await type_into(pilot, form, "host", "192.0.2.99")
        await offline_app.run_action("quit")
        dialog = await wait_for_screen(pilot, LeaveDialog)
        text = panel_text(offline_app)
        assert "Quit? Not everything is saved" in text
        assert "Nodes: the new node's name, host typed, not saved to cluster.yaml." in text
        labels = [str(b.label) for b in dialog.query("Button")]
        assert labels == ["Save, then quit (s)", "Quit anyway (d)", "Cancel (esc)"]
        await pilot.press("escape")
        assert await wait_for_screen(pilot, NodeForm) is form
        assert form.query_one("#field-name").value == "node9"  # nothing lost
        await offline_app.run_action("quit")
        await wait_for_screen(pilot, LeaveDialog)
        await pilot.press("d")  # quit anyway
        for _ in range(100):
            if not offline_app.is_running:
                break
            await pilot.pause(0.05)
        assert not offline_app.is_running
    assert offline_app.return_code in (0, None)


async def test_save_then_quit_saves_the_node_form_and_quits(offline_app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the embedded default's form creates ./cluster.yaml
    async with offline_app.run_test(size=(100, 30)) as pilot:
        offline_app.cluster = local_cluster()  # no cluster.yaml yet
        form = await open_node_form(pilot)
        await type_into(pilot, form, "name", "node9")
        await type_into(pilot, form, "host", "192.0.2.99")
        await offline_app.run_action("quit")
        await wait_for_screen(pilot, LeaveDialog)
        await pilot.press("s")
        for _ in range(200):  # the form saves in a worker, then the app quits by itself
            if not offline_app.is_running:
                break
            await pilot.pause(0.05)
        assert not offline_app.is_running, "did not quit after saving"
    saved = load_cluster(tmp_path / "cluster.yaml")
    assert saved.node("node9").host == "192.0.2.99"


def gated_python(tmp_path, gate) -> None:
    """A base interpreter for the python-env step that waits while ``gate`` exists (a run
    that is under way as long as the test wants), on every node."""
    for node in ("node0", "node1", "node2", "node3"):
        (tmp_path / node).mkdir(exist_ok=True)
        script = tmp_path / node / "python3"
        script.write_text(f"#!/bin/sh\nwhile [ -e {gate} ]; do sleep 0.1; done\n"
                          f'exec /usr/bin/python3 "$@"\n')
        script.chmod(0o755)


async def start_gated_setup_run(pilot, app, tmp_path) -> SetupScreen:
    from console.bringup import CATALOG, SetupOptions

    options = SetupOptions(env_path=str(tmp_path / "{node}" / "env"),
                           base_python=str(tmp_path / "{node}" / "python3"), venv_with_pip=False)
    screen = SetupScreen(options=options, steps=[CATALOG["python-env"]])
    await app.push_screen(screen)
    await pilot.pause()
    await pilot.press("R")
    for _ in range(300):
        if screen.runner is not None:
            return screen
        await pilot.pause(0.1)
    raise AssertionError("the Setup run did not start")


@pytest.fixture
def loopback_app(loopback, tmp_path, monkeypatch):
    from console.cluster.model import load_cluster as load

    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cluster = load(loopback.cluster_yaml)
    pool = Pool(cluster)
    yield SVConsoleApp(cluster, pool, health_interval=None)
    pool.close()


async def test_quit_during_a_setup_run_asks_and_when_done_waits_for_it(loopback_app, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    gated_python(tmp_path, gate)
    async with loopback_app.run_test(size=(100, 30)) as pilot:
        screen = await start_gated_setup_run(pilot, loopback_app, tmp_path)
        await pilot.press("q")
        dialog = await wait_for_screen(pilot, LeaveDialog)
        text = panel_text(loopback_app)
        assert f"Setup: run {screen.runner.run_id} is applying steps" in text
        assert "leaving stops it" in text
        labels = [str(b.label) for b in dialog.query("Button")]
        assert labels == ["Quit when done (w)", "Quit anyway (d)", "Cancel (esc)"]
        await pilot.press("s")  # nothing to save here: s does nothing
        assert loopback_app.screen is dialog
        await pilot.press("escape")  # cancel: the run goes on
        await wait_for_screen(pilot, SetupScreen)
        assert screen.runner is not None and not screen.runner._cancelled.is_set()

        await pilot.press("q")
        await wait_for_screen(pilot, LeaveDialog)
        await pilot.press("w")
        await wait_for_screen(pilot, SetupScreen)
        await pilot.pause(1.0)
        assert loopback_app.is_running and screen.runner is not None  # still waiting on it
        gate.unlink()  # the run can end now, and with it the console
        for _ in range(1200):
            if not loopback_app.is_running:
                break
            await pilot.pause(0.1)
        assert not loopback_app.is_running, "did not quit when the run ended"
    assert (tmp_path / "node0" / "env" / "bin" / "python").exists()  # the run finished


async def test_quit_anyway_during_a_setup_run_stops_it(loopback_app, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    gated_python(tmp_path, gate)
    try:
        async with loopback_app.run_test(size=(100, 30)) as pilot:
            screen = await start_gated_setup_run(pilot, loopback_app, tmp_path)
            runner = screen.runner
            await pilot.press("q")
            await wait_for_screen(pilot, LeaveDialog)
            await pilot.press("d")
            for _ in range(300):
                if not loopback_app.is_running:
                    break
                await pilot.pause(0.1)
            assert not loopback_app.is_running
        assert runner._cancelled.is_set()
        assert not (tmp_path / "node0" / "env" / "bin" / "python").exists()
    finally:
        gate.unlink()


async def test_reload_of_the_cluster_asks_first_and_cancel_keeps_the_old_one(offline_app,
                                                                             monkeypatch):
    calls = []
    async with offline_app.run_test(size=(100, 30)) as pilot:
        form = await open_node_form(pilot)
        await type_into(pilot, form, "name", "node9")
        old = offline_app.cluster
        offline_app.reload_cluster(local_cluster(), then=lambda: calls.append("reloaded"))
        await wait_for_screen(pilot, LeaveDialog)
        assert "Reload the cluster? Not everything is saved" in panel_text(offline_app)
        await pilot.press("escape")
        await wait_for_screen(pilot, NodeForm)
        assert offline_app.cluster is old and calls == []
        offline_app.reload_cluster(local_cluster(), then=lambda: calls.append("reloaded"))
        await wait_for_screen(pilot, LeaveDialog)
        await pilot.press("d")
        for _ in range(100):
            if calls:
                break
            await pilot.pause(0.05)
        assert calls == ["reloaded"] and offline_app.cluster is not old


async def test_a_dialog_that_raises_is_closed_and_its_screen_goes_on(containing_app, monkeypatch):
    def broken_compose(self):
        raise RuntimeError("boom in the form")
        yield

    monkeypatch.setattr(NodeForm, "compose", broken_compose)
    notes: list[str] = []
    monkeypatch.setattr(containing_app, "notify",
                        lambda message, **kw: notes.append(str(message)))
    async with containing_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("1")
        await pilot.press("n")
        for _ in range(200):
            if notes:
                break
            await pilot.pause(0.05)
        assert any("NodeForm (screens.node_form) failed" in n and "boom in the form" in n
                   for n in notes), notes
        await wait_for_screen(pilot, NodesScreen)
        await assert_other_screens_open(pilot, "nodes")
    assert containing_app.return_code in (0, None)


async def test_a_screen_worker_that_fails_with_exit_on_error_is_an_error_panel(containing_app):
    from textual import work

    from screens.gpus import GPUsScreen as Base

    class Failing(Base):
        mode_name = "gpus"

        def on_mount(self) -> None:
            self.fail()

        @work(thread=True)  # exit_on_error (Textual's default): this used to end the app
        def fail(self) -> None:
            raise OSError("boom in a worker")

    containing_app.remove_mode("gpus")
    containing_app.add_mode("gpus", lambda: Failing())
    async with containing_app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await wait_for_screen(pilot, BrokenScreen)
        assert "OSError: boom in a worker" in panel_text(containing_app)
        await assert_other_screens_open(pilot, "gpus")
    assert containing_app.return_code in (0, None)
