"""Layouts at the three terminal sizes operators use (80x24, 120x36, 160x45): one snapshot of
every screen at each (Nodes, Setup, Config, Training, GPUs, the help and the log view), and on
the Training screen every pane (charts, ranks, events, faults, plan) brought into view at each
size. The clusters are offline (TEST-NET addresses nobody answers) and the Training screen is fed
a real FunASR log, so the pictures are stable."""

from __future__ import annotations

import time

import pytest
import test_training_screen
from test_training_screen import (  # tests/ is on sys.path (conftest.py lives there)
    BF16,
    FP32,
    FedApp,
    fed_run,
    log_lines,
    offline_cluster,
    settle,
)
from test_training_screen import show as show_training
from textual.command import CommandList
from textual.geometry import Region

from console.ssh.pool import Pool
from console.training.logparse import parse_line
from console.training.logview import LogView
from screens.logview import LogViewScreen
from screens.training import PANES, LaunchDialog, TrainingScreen

SIZES = [(80, 24), (120, 36), (160, 45)]
SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]
#: The views a snapshot is taken of, and how each is reached from the Nodes screen.
VIEWS = ("nodes", "setup", "config", "training", "gpus", "help", "logview")
#: The Training screen's tests' app (offline cluster, runs fed from logs), as a fixture here.
fed_app = test_training_screen.fed_app
STAMP = "[2026-12-01 10:00:{s:02d},000][root][INFO] - "


def log_view() -> LogView:
    """Three nodes' lines with fixed times (a stable picture), one of them an error."""
    view = LogView()
    for s in range(40):
        for rank, node in enumerate(("node0", "node1", "node2")):
            view.add_event(node, parse_line(
                f"[rank{rank}]:{STAMP.format(s=s)}train, rank: {rank}, epoch: 0/20, step_in_"
                f"epoch: {s}, total step: {s}, (loss_avg_rank: {250 - s * 0.5:.3f}), (lr: "
                f"2.000e-04)"))
    view.add("node2", "RuntimeError: Connection reset by peer", rank=2)
    return view


def feed_training(screen: TrainingScreen) -> None:
    """The Training screen follows a run whose node0 trains (300 lines of a real fp32 log) and
    whose node1 failed (the real bf16 failure: a fault with its evidence)."""
    feeder = fed_run(screen, {"node0": FP32, "node1": BF16})
    feeder.lines("node0", log_lines(FP32)[:300])
    feeder.lines("node1", log_lines(BF16))


async def settle_screen(pilot) -> None:
    """Until the screen shown says it settled (the Config screen loads in the background)."""
    for _ in range(600):
        await pilot.pause(0.1)
        if getattr(pilot.app.screen, "settled", True):
            break


def show_view(view: str):
    async def run_before(pilot) -> None:
        if view == "training":
            feed_training(await show_training(pilot))
            await settle(pilot)
            return
        if view == "help":
            await pilot.press("question_mark")
        elif view == "logview":
            await pilot.app.push_screen(LogViewScreen(log_view(), "run 20261130-001545-3fa2"))
        else:
            await pilot.press(str(VIEWS.index(view) + 1))
        await settle_screen(pilot)
    return run_before


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("view", VIEWS)
def test_snapshot(snap_compare, view, size):
    cluster = offline_cluster()
    pool = Pool(cluster)
    try:
        assert snap_compare(FedApp(cluster, pool, health_interval=None), terminal_size=size,
                            run_before=show_view(view))
    finally:
        pool.close()


# -------------------------------------------------------------------------- Training panes


def on_screen(widget, size: tuple[int, int]) -> Region:
    """The part of ``widget`` the operator sees: its region clipped to the terminal, less the
    footer's last row."""
    width, height = size
    return widget.region.intersection(Region(0, 0, width, height - 1))


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_every_training_pane_can_be_brought_into_view(fed_app, size):
    async with fed_app.run_test(size=size) as pilot:
        screen = await show_training(pilot)
        assert isinstance(screen, TrainingScreen)
        feed_training(screen)
        await settle(pilot)
        for pane, key, title in PANES:
            await pilot.press(key)
            await pilot.pause()
            widget = screen.query_one(f"#pane-{pane}")
            seen = on_screen(widget, size)
            assert widget.display and widget.visible, f"{title} ({key}) hidden at {size}"
            assert seen == widget.region, f"{title} ({key}) off-screen at {size}: {widget.region}"
            assert seen.height >= 5 and seen.width >= 40, f"{title} ({key}) at {size}: {seen}"
            content = widget.query_one("*")  # its content (chart, table, text) shows in it
            assert on_screen(content, size).height >= min(3, content.region.height) > 0, \
                f"{title}'s content at {size}: {content.region}"
        # the rank table's rows themselves are in view
        await pilot.press("k")
        await pilot.pause()
        table = screen.query_one("#rank-table")
        assert table.row_count >= 1 and on_screen(table, size).height >= table.row_count + 1


# -------------------------------------------------------------------------- the tour's fixes


async def test_the_palettes_screenshot_is_saved_in_the_state_dir_and_says_where(
        fed_app, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/Downloads (Textual's default)
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    said: list[str] = []
    async with fed_app.run_test(size=(120, 36)) as pilot:
        fed_app.notify = lambda message, **kw: said.append(str(message))  # type: ignore
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"screenshot")
        for _ in range(50):  # the palette's search runs in the background
            await pilot.pause(0.1)
            if fed_app.screen.query_one(CommandList).option_count:
                break
        await pilot.press("enter")
        for _ in range(100):
            await pilot.pause(0.1)
            if said:
                break
    shots = sorted((state / "screenshots").glob("*.svg"))
    assert said and "Failed" not in said[0], said
    assert len(shots) == 1 and "<svg" in shots[0].read_text(encoding="utf-8")
    assert str(shots[0]) in said[0]
    assert " " not in shots[0].name and "·" not in shots[0].name


def chart_rows(chart) -> list[str]:
    """The rows of ``chart`` as the terminal shows them."""
    return [strip.text for strip in chart.render_lines(Region(0, 0, *chart.size))]


def legend_rows_cover_data(rows: list[str], labels: list[str]) -> list[str]:
    """The legend rows in which something besides the legend is drawn inside the frame."""
    bad = []
    for row in rows:
        label = next((lb for lb in labels if f" {lb}" in row and row.rstrip().endswith("│")),
                     None)
        if label is None:
            continue
        start = min(i for i in (row.find("┤"), row.find("│")) if i >= 0)  # the left frame
        inside = row[start + 1:row.rstrip().rfind("│")]
        marker, _, rest = inside.strip().partition(" ")
        if rest.strip() != label:
            bad.append(row)
    return bad


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_chart_legends_leave_the_data_uncovered(fed_app, size):
    async with fed_app.run_test(size=size) as pilot:
        screen = await show_training(pilot)
        feed_training(screen)
        await settle(pilot)
        rows = chart_rows(screen.query_one("#loss-chart"))
        legend = any(" mean" in row for row in rows)
        assert legend or "• validation" in rows[0], "\n".join(rows)  # the val line is named
        if size != (80, 24):
            assert legend, "\n".join(rows)
        assert not legend_rows_cover_data(rows, ["mean", "val"]), "\n".join(rows)
        rows = chart_rows(screen.query_one("#lr-chart"))  # one line: no legend to cover it
        assert "learning rate" in rows[0] and not any("rank0" in row for row in rows), rows
        await pilot.press("p")  # one line per rank: a legend row each
        await settle(pilot)
        rows = chart_rows(screen.query_one("#loss-chart"))
        assert not legend_rows_cover_data(rows, ["rank0", "rank1", "val"]), "\n".join(rows)


async def pressed_and_seen(pilot, key: str, timeout: float = 10.0) -> bool:
    """Whether pressing ``key`` changes what the terminal shows (text or colours) within
    ``timeout`` s, generous for a loaded machine (seen in CI under a second training: `x`'s
    "exporting…" took over 100 ms to show while the export's thread held the interpreter)."""
    before = pilot.app.export_screenshot()
    await pilot.press(key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.02)
        if pilot.app.export_screenshot() != before:
            return True
    return False


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=["80x24", "160x45"])
async def test_every_training_key_gives_visible_feedback(fed_app, size):
    async with fed_app.run_test(size=size, notifications=True) as pilot:
        screen = await show_training(pilot)
        feed_training(screen)
        # the console's alerts would toast the fed findings a few seconds in: without them the
        # fed screen changes by nothing but a key (a key bound to nothing shows nothing)
        pilot.app.alerts.close()
        pilot.app.alerts = None
        await settle(pilot)
        assert not await pressed_and_seen(pilot, "z", timeout=5)
        silent = []
        # panes (each from another), per-rank from a pane without the chart and back, export,
        # then the keys that refuse or ask while the run is live
        for key in ("k", "p", "e", "f", "i", "c", "p", "x", "l", "r"):
            if not await pressed_and_seen(pilot, key):
                silent.append(key)
        if not await pressed_and_seen(pilot, "s"):  # asks first
            silent.append("s")
        await pilot.press("escape")
        assert not silent, f"no visible feedback at {size} for: {silent}"


async def test_the_launch_dialogs_keys_give_visible_feedback(fed_app):
    async with fed_app.run_test(size=(120, 36), notifications=True) as pilot:
        await show_training(pilot)
        await pilot.press("l")
        await pilot.pause()
        dialog = fed_app.screen
        assert isinstance(dialog, LaunchDialog)
        silent = []
        for key in ("o", "l", "b"):  # before any plan: each says what it needs
            dialog.query_one("#launch-review").focus()
            await pilot.pause()
            if not await pressed_and_seen(pilot, key):
                silent.append(key)
        assert not silent, f"no visible feedback in the launch dialog for: {silent}"
        assert dialog.query_one("#launch-profile").has_focus  # b: back to the fields


async def test_config_data_findings_follow_the_node_states(loopback, tmp_path, monkeypatch):
    """Seen: "train.jsonl is not readable on node0" stayed on the Config screen until ctrl+r.
    Now a checked node that goes away or comes back has the data lists looked for again."""
    import shutil

    from test_config_screen import open_config, write_data_lists

    from console.cluster.model import load_cluster
    from screens.app import SVConsoleApp

    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    here = tmp_path / "cluster"
    here.mkdir()
    shutil.copy(loopback.cluster_yaml, here / "cluster.yaml")  # training.yaml goes beside it
    write_data_lists(here)
    cluster = load_cluster(here / "cluster.yaml")
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=1.0)

    def unreadable() -> str:   # a node that went away is "could not be checked", not "not readable"
        return " ".join(f.message for f in app.screen._data[1]
                        if "not readable" in f.message or "could not be checked" in f.message)

    try:
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_config(pilot)
            for _ in range(1800):  # the probe of every node, then the data check
                if screen._up and screen._data[0] is not None and not screen._data_pending:
                    break
                await pilot.pause(0.1)
            assert "node1" in screen._up and not unreadable(), screen._data
            loopback.kill(1)
            for _ in range(600):
                if "node1" in unreadable():
                    break
                await pilot.pause(0.1)
            assert "node1" in unreadable(), "a node that went away is not looked at again"
            loopback.restart(1)
            for _ in range(900):
                if not unreadable() and not screen._data_pending:
                    break
                await pilot.pause(0.1)
            assert not unreadable(), f"still after node1 came back: {unreadable()}"
    finally:
        pool.close()
