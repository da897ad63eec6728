"""Read-only in the console: every key that would change a node or a file (each screen's
``WRITES``) is refused with the reason, the screen stays as it was, nothing is written, and the
header says read-only."""

from __future__ import annotations

import dataclasses

import pytest
from test_app import offline_cluster

from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.config import ConfigScreen
from screens.nodes import NodesScreen
from screens.setup import SetupScreen
from screens.training import TrainingScreen

SCREENS = [("1", NodesScreen), ("2", SetupScreen), ("3", ConfigScreen), ("4", TrainingScreen)]


def key_of(cls, action: str) -> str:
    for b in cls.BINDINGS:
        if b.action == action:
            return b.key.split(",")[0]
    raise AssertionError(f"{cls.__name__}.{action} has no key")


CASES = [(mode_key, cls, action) for mode_key, cls in SCREENS for action in cls.WRITES]


@pytest.mark.parametrize("mode_key,cls,action", CASES,
                         ids=[f"{c.__name__}.{a}" for _, c, a in CASES])
async def test_each_changing_key_is_refused_with_the_reason(tmp_path, monkeypatch, mode_key, cls,
                                                           action):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    cluster = dataclasses.replace(offline_cluster(), read_only=True)
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press(mode_key)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, cls)
            assert "read-only" in app.sub_title
            before = set(tmp_path.rglob("*"))
            await pilot.press(key_of(cls, action))
            await pilot.pause()
            assert app.screen is screen, f"{action} opened {type(app.screen).__name__}"
            said = [n.message for n in app._notifications if n.title == "read-only"]
            assert said and cls.WRITES[action] in said[-1] and "is disabled" in said[-1]
            assert set(tmp_path.rglob("*")) == before
    finally:
        pool.close()


async def test_the_same_keys_work_when_not_read_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("1")
            await pilot.pause()
            await pilot.press(key_of(NodesScreen, "add"))
            await pilot.pause()
            assert not isinstance(app.screen, NodesScreen), "the node form opens"
            assert "read-only" not in app.sub_title
    finally:
        pool.close()
