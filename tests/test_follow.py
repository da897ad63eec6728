"""Following logs over real loopback sshd nodes: from a byte offset, across a node's sshd being
killed and restarted (no line lost or repeated), into the metrics store, coalesced updates."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training.follow import FollowError, LogFollower, Position, RunFollower, read_run
from console.training.logparse import TrainStep, parse_file
from console.training.runs import NodeRun, RunRecord, run_dir

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
REAL_LOG = FIXTURES / "funasr-sensevoicesmall-zero1-fp32-bs6000.log"


RUN_ID = "20261130-000000-7e57"


def record_for(out: Path, nodes: list[str]) -> RunRecord:
    """A run record for logs the test writes in ``out`` where a launch puts them (each node's
    writer ends by creating the node's exit file); the directories are made."""
    own = Path(run_dir(str(out), RUN_ID))
    own.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    return RunRecord(RUN_ID, 0.0, "loopback", str(out), nodes[0],
                     [NodeRun(node, rank, f"{out}/logs/{node}.log", f"{own}/{node}.pid",
                              f"{own}/{node}.exit")
                      for rank, node in enumerate(nodes)])


def paths(record: RunRecord, node: str) -> tuple[Path, Path]:
    """The node's log and exit file."""
    return Path(record.node(node).log), Path(record.node(node).exit_file)


def write_slowly(path: Path, data: bytes, done: Path, *, seconds: float, seed: int = 0) -> None:
    """Append ``data`` in random-sized pieces (cutting lines anywhere) over about ``seconds``,
    then create ``done``."""
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(data):
        n = rng.randint(1, 700)
        pieces.append(data[i:i + n])
        i += n
    with open(path, "ab") as f:
        for piece in pieces:
            f.write(piece)
            f.flush()
            time.sleep(seconds / len(pieces))
    done.touch()


@pytest.fixture
def lb2(fresh_loopback):
    lb = fresh_loopback(2)
    pool = Pool(load_cluster(lb.cluster_yaml))
    yield lb, pool
    pool.close()


def test_reconnect_after_sshd_is_killed_neither_loses_nor_repeats(lb2):
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node1"])
    log, done = paths(record, "node1")
    head = b"written before the follower started\n" * 3
    log.write_bytes(head)
    data = REAL_LOG.read_bytes() + "末行 без перевода строки".encode()  # ends mid-line
    got: list = []
    follower = LogFollower(pool, record, record.nodes[0], position=Position(len(head), 3),
        on_events=lambda node, events: got.extend(events), heartbeat=0.5, retry_max=1.0)
    half = len(data) // 2 + 17  # mid-line
    with open(log, "ab") as f:
        f.write(data[:half])
    follower.start()
    writer = threading.Thread(target=write_slowly, args=(log, data[half:], done),
                              kwargs={"seconds": 3})
    try:
        deadline = time.monotonic() + 150  # a remote shell's rc files can be slow here
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got, "nothing followed before the kill"
        lb.kill(1)  # sshd and its sessions die: the stream breaks mid-file
        writer.start()  # the rest is written while the node is unreachable
        time.sleep(1.5)
        lb.restart(1)
        follower.join(90)
    finally:
        follower.stop()
        if writer.is_alive():
            writer.join()
    assert follower.state == "ended" and follower.ended_because == "exited"
    assert follower.reconnects >= 1
    want = list(parse_file(str(log)))[3:]
    assert [e.text for e in got] == [e.text for e in want]
    assert [(e.offset, e.line_no) for e in got] == [(e.offset, e.line_no) for e in want]
    assert got[-1].text == "末行 без перевода строки"
    assert follower.position == Position(log.stat().st_size, want[-1].line_no)


def test_run_follower_feeds_the_store_and_coalesces_updates(lb2):
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node0", "node1"])
    logs = {n: paths(record, n)[0] for n in ("node0", "node1")}
    lines = REAL_LOG.read_bytes()
    for path in logs.values():
        path.write_bytes(b"")
    updates: list = []
    follower = RunFollower(pool, record, interval=0.3, heartbeat=0.5)
    follower.subscribe(lambda update: updates.append((time.monotonic(), update)))
    follower.start()
    try:
        for path in logs.values():  # a burst: everything at once, many times over
            with open(path, "ab") as f:
                for _ in range(5):
                    f.write(lines)
        for node in logs:
            paths(record, node)[1].touch()
        assert follower.wait(60), {n: f.state for n, f in follower.followers.items()}
    finally:
        follower.stop()
    per_file = len(list(parse_file(str(REAL_LOG)))) * 5
    events = [e for _, u in updates for e in u.events]
    assert len(events) + sum(u.dropped for _, u in updates) == 2 * per_file
    assert updates[-1][1].ended
    times = [t for t, _ in updates]
    assert len(updates) < 40 and all(b - a >= 0.25 for a, b in zip(times, times[1:], strict=False))
    train = [e for e in parse_file(str(REAL_LOG)) if isinstance(e, TrainStep)]
    progress = follower.store.progress()
    assert progress.total_step == max(e.total_step for e in train)
    assert [r.rank for r in follower.store.ranks()] == sorted({e.rank for e in train})


def test_read_run_reads_to_the_current_end_and_names_a_dead_node(lb2):
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node0"])
    log = paths(record, "node0")[0]
    log.write_bytes(b"one\ntwo\nthree")
    assert [e.text for _, e in read_run(pool, record)] == ["one", "two", "three"]
    lb.kill(0)
    with pytest.raises(FollowError, match="node0: cannot read"):
        list(read_run(pool, record))
