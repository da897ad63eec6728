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


def file_lines(*datas: bytes) -> list[str]:
    """The lines of file contents as the follower must show them (a last line without its
    newline included), decoded as the console decodes them."""
    out = []
    for data in datas:
        out += [raw.decode() for raw in data.split(b"\n")]
        if data.endswith(b"\n"):
            out.pop()
    return out


def follow_in_thread(pool, record, node, got, notices, **kwargs) -> LogFollower:
    return LogFollower(pool, record, record.node(node), heartbeat=0.5, retry_max=1.0,
                       on_events=lambda _n, events: got.extend(events),
                       on_notice=lambda _n, text: notices.append(text), **kwargs).start()


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {seconds:g}s waiting for {what}"
        time.sleep(0.05)


def test_the_end_of_a_run_loses_nothing_while_the_writer_is_still_writing(lb2):
    """The exit file appears while ranks still write: the lines after it (a burst of many
    lines in one read, then a last line without its newline) all arrive, one line per event,
    byte for byte as in the file."""
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node0"])
    log, done = paths(record, "node0")
    data = REAL_LOG.read_bytes()
    first, burst = data[:len(data) // 3], data[len(data) // 3:]
    log.write_bytes(b"")
    got: list = []
    follower = follow_in_thread(pool, record, "node0", got, [])
    try:
        with open(log, "ab") as f:
            f.write(first)
            f.flush()
            wait_for(lambda: len(got) >= 5, 150, "the first lines")
            done.write_text('{"code": 0}')  # the run "ended" ...
            for i in range(0, len(burst), len(burst) // 3 + 1):  # ... its ranks still write
                f.write(burst[i:i + len(burst) // 3 + 1])
                f.flush()
                time.sleep(0.3)
            f.write("последняя строка без перевода".encode())
        follower.join(60)
    finally:
        follower.stop()
    assert follower.state == "ended" and follower.ended_because == "exited"
    written = log.read_bytes()
    assert [e.text for e in got] == file_lines(written)
    assert all("\n" not in e.text for e in got)
    assert "\n".join(e.text for e in got).encode() == written
    assert follower.position.offset == len(written)


def test_truncation_and_rotation_mid_follow_read_the_new_file_from_the_start(lb2):
    """Mid-follow the log is truncated (copytruncate), then rotated (a new file at its path):
    each time the follower says so and reads the new content from byte 0; every line of the
    three contents arrives exactly once, in order, with offsets in its own file."""
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node1"])
    log, done = paths(record, "node1")
    lines = REAL_LOG.read_bytes().split(b"\n")
    a, b, c = (b"\n".join(lines[i:i + 40]) + b"\n" for i in (0, 40, 80))
    log.write_bytes(a)
    got: list = []
    notices: list[str] = []
    follower = follow_in_thread(pool, record, "node1", got, notices)
    try:
        wait_for(lambda: len(got) == 40, 150, "the first content")
        with open(log, "r+b") as f:  # copytruncate: same file, cut to 0, written again
            f.truncate(0)
        wait_for(lambda: notices, 30, "the truncation noticed")
        with open(log, "ab") as f:
            f.write(b)
        wait_for(lambda: len(got) == 80, 30, "the content after the truncation")
        log.rename(log.with_suffix(".log.1"))  # rotated: a new file
        log.write_bytes(c)
        wait_for(lambda: len(got) == 120, 30, "the new file's content")
        done.write_text('{"code": 0}')
        follower.join(60)
    finally:
        follower.stop()
    assert follower.state == "ended" and follower.restarts == 2, notices
    assert notices[0].startswith("node1: log truncated (size 0 below offset ")
    assert notices[1] == "node1: log rotated (a new file at its path); read again from the start"
    assert [e.text for e in got] == file_lines(a, b, c)
    for content, events in ((a, got[:40]), (b, got[40:80]), (c, got[80:])):
        starts = [0, *(i + 1 for i, ch in enumerate(content[:-1]) if ch == ord("\n"))]
        assert [e.offset for e in events] == starts  # each in its own file
    assert got[40].offset == 0 and got[80].offset == 0 and got[80].line_no == 1
    assert follower.position == Position(len(c), 40)


def test_a_rewritten_log_is_noticed_even_when_it_grew_past_the_offset(lb2):
    """The log replaced in place by longer content while the follower waits (size above the
    offset: only the bytes at the offset tell): read again from 0, nothing of the old kept."""
    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node0"])
    log, done = paths(record, "node0")
    log.write_bytes(b"old one\nold two\n")
    got: list = []
    notices: list[str] = []
    follower = follow_in_thread(pool, record, "node0", got, notices)
    try:
        wait_for(lambda: len(got) == 2, 150, "the old lines")
        new = b"".join(b"new line %d\n" % i for i in range(50))
        with open(log, "r+b") as f:
            f.write(new)
        done.write_text('{"code": 0}')
        follower.join(60)
    finally:
        follower.stop()
    assert notices == ["node0: log rewritten; read again from the start"]
    assert [e.text for e in got] == ["old one", "old two", *file_lines(new)]


def test_a_supervisor_killed_alone_does_not_end_the_follow_while_the_run_writes(lb2):
    """loopback-cluster kill (or an OOM killer) takes the supervisor but leaves torchrun, which
    goes on writing: the node is not "ended" until no process of the run is left there."""
    import os
    import subprocess

    from test_runs import stand_in_supervisor

    lb, pool = lb2
    record = record_for(lb.shared_dir / "out", ["node0"])
    log, _ = paths(record, "node0")
    log.write_bytes(b"first\n")
    supervisor = stand_in_supervisor(record, "node0", seconds=300)
    rank = subprocess.Popen(["sleep", "300"], env={**os.environ, "SVCONSOLE_RUN_ID": RUN_ID,
                                                    "SVCONSOLE_NODE": "node0"})
    got: list = []
    follower = follow_in_thread(pool, record, "node0", got, [])
    try:
        wait_for(lambda: len(got) == 1, 150, "the first line")
        supervisor.kill()
        supervisor.wait()
        time.sleep(3)  # several polls with the supervisor gone
        assert follower.state == "following" and follower.ended_because is None
        with open(log, "ab") as f:
            f.write(b"written after the supervisor died\n")
        wait_for(lambda: len(got) == 2, 30, "the line written after")
        rank.kill()
        rank.wait()
        follower.join(60)
    finally:
        follower.stop()
        for proc in (supervisor, rank):
            proc.kill()
            proc.wait()
    assert follower.ended_because == "gone"
    assert [e.text for e in got] == ["first", "written after the supervisor died"]
