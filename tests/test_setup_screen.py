"""The Setup screen (guided bring-up), driven with Textual's Pilot against real sshd nodes.

The steps that run here are the catalog's own: the training-Python step makes a real venv per
node (without pip, so it takes a fraction of a second); a node whose base interpreter is missing
fails there while the others finish. Nothing runs as root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from textual.widgets import Log, Static

from console.bringup import CATALOG, RunSummary, SetupOptions, StepState
from console.bringup.runner import OutputLine, Runner, StateChanged
from console.cluster.model import Cluster, Node, load_cluster
from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.messages import SetupRunProgress, SetupSudoChecked
from screens.setup import NOTHING_TO_DO, SetupScreen
from screens.setup_widgets import GLYPHS, ConfirmModal, PasswordModal, RunFeed

PASSWORD = "s3cret-Pa55word"


def offline_cluster(n: int = 3) -> Cluster:
    """Nodes nobody answers for (documentation addresses): a stable picture for snapshots."""
    nodes = tuple(Node(name=f"node{i}", host=f"192.0.2.{i + 10}", port=22,
                       role="head" if i == 0 else "worker", gpus=(0, 1, 2, 3)) for i in range(n))
    return Cluster(name="sv-a100", nodes=nodes, shared_dir="/data/shared", master="node0")


def env_options(tmp_path: Path) -> SetupOptions:
    """A venv per node under tmp_path, made from ``<tmp>/<node>/python3`` (a link we control)."""
    return SetupOptions(env_path=str(tmp_path / "{node}" / "env"),
                        base_python=str(tmp_path / "{node}" / "python3"), venv_with_pip=False)


def give_python(tmp_path: Path, node: str) -> None:
    (tmp_path / node).mkdir(exist_ok=True)
    os.symlink("/usr/bin/python3", tmp_path / node / "python3")


def glyph(state: StepState | None) -> str:
    return GLYPHS[state][0]


def cell_text(screen: SetupScreen, step: str, node: str) -> str:
    return str(screen.grid.get_cell(step, node))


def pane_text(screen: SetupScreen) -> str:
    return "\n".join(screen.query_one("#setup-log", Log).lines)


def status(screen: SetupScreen) -> str:
    return str(screen.query_one("#setup-status", Static).render())


async def settle(pilot, screen: SetupScreen, timeout: float = 30.0) -> None:
    """Until no run is in progress and the screen has taken everything in."""
    for _ in range(int(timeout / 0.1)):
        await pilot.pause(0.1)
        if screen.runner is None and screen._pending is None and "…" not in status(screen):
            await pilot.pause(0.1)
            return
    raise AssertionError(f"the run did not finish: {status(screen)}")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    path = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(path))
    return path


async def open_setup(app: SVConsoleApp, pilot, screen: SetupScreen) -> SetupScreen:
    await app.push_screen(screen)
    await settle(pilot, screen)
    return screen


async def test_run_failure_on_one_node_retry_then_nothing_to_do(loopback, tmp_path, state_dir):
    cluster = load_cluster(loopback.cluster_yaml)
    for node in cluster.names():
        if node != "node1":
            give_python(tmp_path, node)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    messages: list = []
    try:
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            screen = await open_setup(app, pilot, SetupScreen(
                options=env_options(tmp_path), steps=[CATALOG["python-env"]]))
            await pilot.press("R")
            await settle(pilot, screen)
            for node in cluster.names():
                want = StepState.FAILED if node == "node1" else StepState.DONE
                assert screen.standing.state("python-env", node) == want, node
                assert glyph(want) in cell_text(screen, "python-env", node)
                assert (tmp_path / node / "env" / "bin" / "python").exists() == (node != "node1")
            assert "software" in str(screen.query_one("#setup-phases").render())
            assert screen.standing.phase_status(CATALOG["python-env"].phase) == "failed"
            assert "incomplete" in status(screen)
            assert sum(isinstance(m, SetupRunProgress) for m in messages) >= 1

            # the failed cell's log: the command and what the node said
            await pilot.press("right")
            await pilot.pause(0.5)
            text = pane_text(screen)
            assert "python-env on node1" in text and "-m venv --without-pip" in text
            assert "# failed" in text and "python3" in text

            give_python(tmp_path, "node1")
            await pilot.press("f")
            await settle(pilot, screen)
            assert screen.standing.state("python-env", "node1") == StepState.DONE
            assert screen.standing.phase_status(CATALOG["python-env"].phase) != "failed"

            await pilot.press("R")
            await settle(pilot, screen)
            assert NOTHING_TO_DO in status(screen)
            for node in cluster.names():
                assert screen.standing.state("python-env", node) == StepState.ALREADY_DONE
                assert glyph(StepState.ALREADY_DONE) in cell_text(screen, "python-env", node)
    finally:
        pool.close()
    runs = sorted((state_dir / "runs").iterdir())
    assert len(runs) == 3
    log = runs[0] / "node1" / "python-env.log"
    assert "# failed" in log.read_text()


async def test_dry_run_shows_commands_per_node_and_touches_nothing(loopback, tmp_path, state_dir):
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_setup(app, pilot, SetupScreen(
                options=env_options(tmp_path),
                steps=[CATALOG["python-env"], CATALOG["net-tuning"]]))
            await pilot.press("d")
            await pilot.pause(0.5)
            text = pane_text(screen)
            for node in cluster.names():
                assert f"python-env on {node}: " in text
                assert f"net-tuning on {node} (as root)" in text
                assert f"{tmp_path}/{node}/python3 -m venv --without-pip" in text
            assert "writes /etc/sysctl.d/90-svconsole.conf" in text
            assert "nothing touched" in str(screen.query_one("#setup-log-title").render())
    finally:
        pool.close()
    assert not any((tmp_path / n).exists() for n in cluster.names())
    assert not (state_dir / "runs").exists()


async def test_root_steps_ask_for_confirmation_listing_the_changes(tmp_path, state_dir):
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_setup(app, pilot, SetupScreen(
                steps=[CATALOG["net-tuning"], CATALOG["nfs-server"]]))
            await pilot.press("R")
            await pilot.pause(0.2)
            assert isinstance(app.screen, ConfirmModal)
            text = str(app.screen.query_one("#confirm-changes").render())
            assert "Network socket buffers (sysctl) [root] on node0, node1, node2:" in text
            assert "writes /etc/sysctl.d/90-svconsole.conf" in text
            assert "[root, destructive] on node0:" in text and "/etc/exports" in text
            await pilot.press("n")
            await pilot.pause(0.2)
            assert app.screen is screen
            assert "cancelled" in status(screen) and screen.runner is None
    finally:
        pool.close()
    assert not (state_dir / "runs").exists()


async def test_password_is_asked_once_and_never_shown(loopback, tmp_path, state_dir):
    """The loopback nodes run as root, so their sudo probe says "root"; here the probe's answer
    is given as if node0 needed a password, and the rest is the real flow."""
    cluster = load_cluster(loopback.cluster_yaml)
    for node in cluster.names():
        give_python(tmp_path, node)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    messages: list = []
    try:
        async with app.run_test(size=(80, 24), message_hook=messages.append) as pilot:
            screen = await open_setup(app, pilot, SetupScreen(
                options=env_options(tmp_path), steps=[CATALOG["python-env"]]))
            screen._pending = screen._runner([CATALOG["python-env"]])
            screen.post_message(SetupSudoChecked({"node0": "password", "node1": "root"}))
            await pilot.pause(0.2)
            assert isinstance(app.screen, PasswordModal)
            assert "node0" in str(app.screen.query_one("Static").render())
            await pilot.press(*PASSWORD, "enter")
            await settle(pilot, screen)
            assert screen.secret() == PASSWORD and pool._sudo_password() == PASSWORD
            assert PASSWORD not in repr(screen.secret)
            assert all(screen.standing.state("python-env", n) == StepState.DONE
                       for n in cluster.names())
            assert PASSWORD not in pane_text(screen)
            # asked once: the next run needs no modal
            screen._pending = screen._runner([CATALOG["python-env"]])
            screen.post_message(SetupSudoChecked({"node0": "password"}))
            await pilot.pause(0.2)
            assert not isinstance(app.screen, PasswordModal)
            await settle(pilot, screen)
    finally:
        pool.close()
    assert not any(PASSWORD in repr(m) for m in messages)
    assert any("PasswordInput" in repr(m) for m in messages)  # the input's own messages ran
    for log in state_dir.rglob("*"):
        if log.is_file():
            assert PASSWORD not in log.read_text(), log


def test_feed_coalesces_states_and_bounds_lines():
    cluster = offline_cluster(2)
    pool = Pool(cluster)
    posted: list = []

    class Target:
        def post_message(self, message) -> bool:
            posted.append(message)
            return True

    try:
        runner = Runner(pool, cluster, [CATALOG["python-env"]], state_dir=Path("/nonexistent"))
        feed = RunFeed(Target(), runner, tail=100)
        for state in (StepState.RUNNING, StepState.FAILED):
            feed._on_event(StateChanged(runner.run_id, "python-env", "node0", state, "why"))
        for i in range(5000):
            feed._on_event(OutputLine(runner.run_id, "python-env", "node1", f"line {i}"))
        assert len(posted) == 1  # one message until the screen drains
        states, lines = feed.drain()
        assert states == {("python-env", "node0"): (StepState.FAILED, "why")}
        got = lines[("python-env", "node1")]
        assert got[0].startswith("[… 4900 lines not shown") and got[1:] == [
            f"line {i}" for i in range(4900, 5000)]
        runner.skip("python-env", "node1")  # a real runner event after the drain
        assert len(posted) == 2
        feed.close()
        runner.skip("python-env", "node0")
        assert len(posted) == 2
    finally:
        pool.close()


def write_fixed_summary(state_dir: Path) -> None:
    """A finished run with every state the grid can show (no times, no log paths)."""
    states = {
        ("build-essential", "node0"): "already done", ("build-essential", "node1"): "done",
        ("build-essential", "node2"): "done", ("nvidia-driver", "node0"): "done",
        ("nvidia-driver", "node1"): "needs reboot", ("nvidia-driver", "node2"): "not applicable",
        ("python-env", "node0"): "done", ("python-env", "node1"): "done",
        ("python-env", "node2"): "failed", ("python-packages", "node0"): "done",
        ("python-packages", "node1"): "skipped", ("python-packages", "node2"): "blocked",
        ("latency", "node0"): "done", ("latency", "node1"): "done",
        ("latency", "node2"): "done",
    }
    summary = RunSummary.from_json({
        "run_id": "20260101-000000-abcd", "started": 0.0, "ended": 1.0,
        "cells": [{"step": s, "node": n, "state": v} for (s, n), v in states.items()],
    })
    run = state_dir / "runs" / summary.run_id
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary.to_json()))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot(snap_compare, size, state_dir):
    write_fixed_summary(state_dir)
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)

    async def run_before(pilot) -> None:
        await pilot.press("2")
        screen = app.screen
        for _ in range(100):
            await pilot.pause(0.05)
            if "last run" in status(screen) and "build-essential on node0" in str(
                    screen.query_one("#setup-log-title").render()):
                break
        await pilot.pause(0.2)

    try:
        assert snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        pool.close()
