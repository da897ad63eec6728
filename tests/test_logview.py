"""The log view across ranks: the engine (interleaving by time, rings, filters, search, save,
older lines read back by offset over real sshd) and the screen driven with Pilot while three
nodes' lines arrive live."""

from __future__ import annotations

import threading
import time

import pytest
from textual.app import App

from console.training.logparse import parse_line
from console.training.logview import Filter, LogView, read_before
from screens.logview import LogViewScreen

STAMP = "[2026-12-01 10:00:{s:02d},000][root][INFO] - "


def feed(view: LogView, node: str, rank: int, seconds: list[int], text: str = "step") -> None:
    for s in seconds:
        view.add_event(node, parse_line(f"[rank{rank}]:{STAMP.format(s=s)}{text} {s}"))


def test_lines_interleave_by_time_and_tracebacks_stay_under_their_line():
    view = LogView()
    feed(view, "node0", 0, [1, 3, 5])
    feed(view, "node1", 1, [2, 4])
    view.add("node1", "Traceback (most recent call last):")   # no time, no rank of its own
    view.add("node1", "RuntimeError: boom")
    feed(view, "node0", 0, [6])
    shown = [(ln.prefix, ln.text.rsplit(" ", 1)[-1]) for ln in view.lines()]
    assert [p for p, _ in shown] == ["node0/0", "node1/1", "node0/0", "node1/1", "node1/1",
                                     "node1/1", "node0/0", "node0/0"]
    assert [t for _, t in shown][4:6] == ["last):", "boom"]
    assert view.nodes() == ["node0", "node1"] and view.ranks() == [0, 1]


def test_filters_by_node_rank_and_errors():
    view = LogView()
    feed(view, "node0", 0, [1, 2])
    feed(view, "node2", 2, [3])
    view.add("node2", "torch.distributed.DistNetworkError: failed to connect", rank=2)
    assert {ln.node for ln in view.lines(Filter(node="node2"))} == {"node2"}
    assert len(view.lines(Filter(rank=0))) == 2
    (err,) = view.lines(Filter(errors=True))
    assert "DistNetworkError" in err.text and Filter(errors=True).describe() == "errors"


def test_each_node_keeps_a_bounded_ring():
    view = LogView(ring=100)
    for i in range(1000):
        view.add("node0", f"line {i}", line_no=i + 1, offset=i * 10)
    lines = view.lines()
    assert len(lines) == 100 and lines[0].text == "line 900"
    assert view.dropped("node0") == 900 and view.oldest_offset("node0") == 9000


def test_find_goes_both_ways_and_wraps():
    view = LogView()
    feed(view, "node0", 0, list(range(10)))
    lines = view.lines()
    assert LogView.find(lines, r"step [37]", -1) == 3
    assert LogView.find(lines, r"step [37]", 3) == 7
    assert LogView.find(lines, r"step [37]", 7) == 3                  # wraps round
    assert LogView.find(lines, r"step [37]", 3, backwards=True) == 7
    assert LogView.find(lines, "[unclosed", 0) is None               # plain text, not a regex
    assert LogView.find(lines, "node0/0", 0) == 1                    # the prefix counts


def test_save_writes_what_is_shown(tmp_path):
    view = LogView()
    feed(view, "node1", 1, [1, 2])
    path = tmp_path / "out.txt"
    assert LogView.save(path, view.lines(), timestamps=False) == 2
    assert path.read_text().splitlines()[0].startswith("node1/1 [rank1]:")


def test_older_lines_are_read_back_from_the_node_by_offset(loopback):
    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool

    log = loopback.shared_dir / "logview-older.log"
    text = "".join(f"line {i} é\n" for i in range(50))
    log.write_text(text)
    offset = text.encode().index(b"line 40 ")
    with Pool(load_cluster(loopback.cluster_yaml)) as pool:
        got = read_before(pool, "node1", str(log), offset, count=5)
    assert [t for _o, t in got] == [f"line {i} é" for i in range(35, 40)]
    assert all(text.encode()[o:].startswith(t.encode()) for o, t in got)


class Host(App):
    def __init__(self, view: LogView, tmp_path) -> None:
        super().__init__()
        self.view, self.tmp = view, tmp_path

    def on_mount(self) -> None:
        self.push_screen(LogViewScreen(self.view, "run-1", save_dir=self.tmp))


async def wait_until(pilot, predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_screen_follows_three_nodes_live_and_finds_a_line(tmp_path, size):
    view = LogView()
    stop = threading.Event()

    def writer():
        s = 0
        while not stop.is_set():
            for rank, node in enumerate(("node0", "node1", "node2")):
                view.add_event(node, parse_line(f"[rank{rank}]:{STAMP.format(s=s % 60)}"
                                                f"train step {s}"))
            if s == 30:
                view.add("node2", "RuntimeError: Connection reset by peer", rank=2)
            s += 1
            time.sleep(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    app = Host(view, tmp_path)
    try:
        async with app.run_test(size=size) as pilot:
            screen = app.screen
            assert isinstance(screen, LogViewScreen)
            await wait_until(pilot, lambda: len(screen.pane.lines) > 200, "lines to arrive")
            await wait_until(pilot, lambda: {ln.node for ln in screen.pane.lines} ==
                             {"node0", "node1", "node2"}, "all three nodes")
            await pilot.press("space")                        # pause: the view holds still
            held = len(screen.pane.lines)
            await pilot.pause(1.0)
            assert len(screen.pane.lines) == held and "PAUSED" in str(
                screen.query_one("#status").render())
            await pilot.press("slash")
            for ch in "reset by":
                await pilot.press("space" if ch == " " else ch)
            await pilot.press("enter")
            await wait_until(pilot, lambda: screen.pane.current is not None, "a match")
            found = screen.pane.lines[screen.pane.current]
            assert found.node == "node2" and "Connection reset by peer" in found.text
            await pilot.press("x")                            # errors only
            assert all(ln.is_error for ln in screen.pane.lines) and screen.pane.lines
            await pilot.press("a", "f")                       # node0 only
            assert {ln.node for ln in screen.pane.lines} == {"node0"}
            await pilot.press("s")
            saved = (tmp_path / "logs-run-1.txt").read_text().splitlines()
            assert saved and all(" node0/0 " in line for line in saved)
            await pilot.press("a", "space")                   # follow again
            before = len(screen.pane.lines)
            await wait_until(pilot, lambda: len(screen.pane.lines) > before, "live lines again")
    finally:
        stop.set()
        thread.join(5)
