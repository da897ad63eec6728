"""Reliability drills during one real training run on a loopback cluster of three nodes.

One tiny SenseVoice run (FunASR's train_ds.py under torchrun + DeepSpeed ZeRO-1 over gloo, on
CPU) is launched through ``svconsole launch``; while it trains:

1. **sshd killed**: one node's sshd and all its connections are SIGKILLed, then started again.
   The console's pool marks the node down and reconnects; the log follow resumes from its byte
   offset; at the end the followed lines equal the log files (none lost, none repeated), and the
   run's processes never died.
2. **node hung**: another node's sshd and its sessions are SIGSTOPped. The real ``svconsole`` in
   tmux keeps answering keys (response time measured) and shows the node as not up; after
   SIGCONT the follow goes on.
3. **console restarted**: the first console (pool and follower) is closed; a new one, with an
   empty state directory, finds the run on the nodes (``find_runs``), follows it to its end, and
   the TUI, started again, shows the run.

Each drill's outcome and numbers are printed as one line (also without ``-s``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from test_launch import tiny_profile  # tests/ is on sys.path (conftest.py lives there)
from tmux import Tmux
from walk import (
    REPO,
    TORCH_EXTENSIONS,
    isolate_node_names,
    needs_training_and_tmux,
    run_pids,
    screen_where,
    terminal_env,
    wait_until,
)

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.loopback import LoopbackCluster, _descendants
from console.ssh.pool import NodeState, Pool
from console.training import runs
from console.training.follow import RunFollower, RunUpdate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPOCHS = 40
"""About a second an epoch for 24 clips over three ranks: training outlasts the drills."""


class Followed:
    """Every line a RunFollower delivered, per node, as (byte offset, text)."""

    def __init__(self) -> None:
        self.lines: dict[str, list[tuple[int, str]]] = {}
        self.dropped = 0

    def __call__(self, update: RunUpdate) -> None:
        self.dropped += update.dropped
        for node, event in update.events:
            self.lines.setdefault(node, []).append((event.offset, event.text))

    def count(self, node: str) -> int:
        return len(self.lines.get(node, []))


def _file_lines(node: runs.NodeRun) -> list[tuple[int, str]]:
    """The complete lines of a node's log from the run's start offset, as (offset, text)."""
    data = Path(node.log).read_bytes()
    lines, at = [], node.log_offset
    while (end := data.find(b"\n", at)) != -1:
        lines.append((at, data[at:end].decode("utf-8", "surrogateescape")))
        at = end + 1
    return lines


def _kill_sshd(lb: LoopbackCluster, index: int) -> int:
    """SIGKILL node ``index``'s sshd listener and every process below it (its connections and
    their commands), as a crash of sshd would. ``LoopbackCluster.kill`` also kills every process
    whose environment names the node's SSH connection, which includes a run's detached supervisor
    (it was started from an SSH session); a real sshd crash leaves that alone. Returns how many
    processes were killed."""
    pid = next(e["pid"] for e in lb.status() if e["name"] == f"node{index}")
    os.kill(pid, signal.SIGSTOP)  # no new connection forks while the tree is collected
    victims = [pid, *_descendants(pid)]
    for victim in victims:
        os.kill(victim, signal.SIGKILL)
    return len(victims)


def _timed(predicate: Callable[[], object], timeout: float, what: str) -> float:
    started = time.monotonic()
    wait_until(predicate, timeout, what, interval=0.1)
    return time.monotonic() - started


def test_drills_during_one_run(fresh_loopback, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    needs_training_and_tmux()
    from svconsole_scripts import tiny_sensevoice

    report: list[str] = []
    lb = fresh_loopback(3)
    tag = uuid.uuid4().hex[:4]
    names = isolate_node_names(lb.cluster_yaml, tag)
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=24, seconds=1.5)
    profile = tmp_path / "training.yaml"
    profile.write_text(yaml.safe_dump(tiny_profile(tiny, lb.shared_dir / "exp", EPOCHS)))
    state = Path(os.environ["SVCONSOLE_STATE_DIR"])
    cluster = load_cluster(lb.cluster_yaml)
    pool = Pool(cluster)
    pool.start_health(1.0)
    follower: RunFollower | None = None
    tui: Tmux | None = None
    record: runs.RunRecord | None = None
    started = time.monotonic()
    try:
        code = main(["--config", str(lb.cluster_yaml), "launch", "--profile", str(profile),
                     "--entry", "cpu-wrapper", "--env", f"TORCH_EXTENSIONS_DIR={TORCH_EXTENSIONS}",
                     "--yes", "--json"])
        reply = json.loads(capsys.readouterr().out)
        assert code == 0, reply["message"]
        record = runs.RunRecord.from_dict(reply["run"])
        followed = Followed()
        follower = RunFollower(pool, record, interval=0.2)
        follower.subscribe(followed)
        follower.start()
        env = terminal_env(120, 40, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                           SVCONSOLE_STATE_DIR=str(state), HOME=os.environ["HOME"])
        console_cmd = f"svconsole --config {shlex.quote(str(lb.cluster_yaml))}"
        tui = Tmux(console_cmd, width=120, height=40, env=env, cwd=str(REPO))
        tui.wait_for("3/3 nodes up", 60)
        wait_until(lambda: all(followed.count(n) >= 3 for n in names), 180,
                   "log lines from every node")
        # torchrun and its rank on each node (tagged), and each node's supervisor
        wait_until(lambda: len(run_pids(record.id)) >= 6, 60, "torchrun and a rank on every node")
        pids = set(run_pids(record.id)) | {n.pid for n in record.nodes}
        assert all(Path(f"/proc/{pid}").exists() for pid in pids), pids

        # 1. kill node1's sshd and bring it back
        victim = names[1]
        lost = follower.followers[victim]
        before = lost.reconnects
        killed = _kill_sshd(lb, 1)
        down_s = _timed(lambda: pool.status(victim).state != NodeState.UP, 30,
                        f"{victim} marked down by the pool")
        wait_until(lambda: lost.state == "reconnecting", 30, "the follow to notice")
        time.sleep(2)
        lb.up()  # starts the missing sshd only; rewrites cluster.yaml, so rename again
        isolate_node_names(lb.cluster_yaml, tag)
        count = followed.count(victim)
        back_s = _timed(lambda: pool.status(victim).state == NodeState.UP
                        and lost.state == "following" and followed.count(victim) > count,
                        60, f"{victim} back and its log followed again")
        gone = sorted(pid for pid in pids if not Path(f"/proc/{pid}").exists())
        alive = not gone
        assert alive, gone
        report.append(f"drill sshd-kill: {victim}: {killed} sshd processes killed; pool down "
                      f"after {down_s:.1f} s; back and following {back_s:.1f} s after restart "
                      f"({lost.reconnects - before} reconnects); run processes intact: {alive}")

        # 2. hang node2: the TUI answers keys, the node is shown not up
        hung = names[2]
        lb.hang(2)
        hung_at = time.monotonic()
        latencies = []
        for key, text in (("2", "software"), ("1", "Verdict"), ("5", "heat:"), ("1", "Verdict"),
                          ("4", "Charts"), ("1", "Verdict")):
            sent = time.monotonic()
            tui.send(key)
            screen_where(tui, lambda s, t=text: t in s, 10, f"key {key} answered")
            latencies.append(time.monotonic() - sent)
        assert max(latencies) < 5, latencies  # a hung node never holds the UI
        screen = screen_where(tui, lambda s: "2/3 nodes up" in s, 60, f"{hung} shown not up")
        shown_s = time.monotonic() - hung_at
        row = next(ln.strip() for ln in screen.splitlines() if re.match(rf"\s*{hung}\s", ln))
        stalled = follower.followers[hung]
        wait_until(lambda: stalled.state == "reconnecting", 30, "the follow to give up the hang")
        lb.resume(2)
        count = followed.count(hung)
        resume_s = _timed(lambda: stalled.state == "following" and followed.count(hung) > count,
                          60, f"{hung} followed again")
        report.append(f"drill hang: {hung}: keys answered in max {max(latencies) * 1000:.0f} ms "
                      f"(median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms, "
                      f"{len(latencies)} keys); shown not up after {shown_s:.1f} s "
                      f"({row!r}); follow back {resume_s:.1f} s after SIGCONT")

        # 3. restart the console: a new pool with an empty state dir reattaches
        assert runs.run_status(pool, record).live, "the run ended before the restart drill"
        follower.stop()
        pool.close()
        first_lines = {n: list(v) for n, v in followed.lines.items()}
        assert followed.dropped == 0
        for node in record.nodes:  # what the first console saw: a prefix of the file, exactly
            got = first_lines.get(node.node, [])
            assert got == _file_lines(node)[:len(got)], node.node
        tui.send("q")
        tui.wait_for("[exited 0 ]", 20)
        tui.close()
        restart_at = time.monotonic()
        pool = Pool(load_cluster(lb.cluster_yaml))
        (live,) = [s for s in runs.find_runs(pool, tmp_path / "new-state", live_only=True)
                   if s.record.id == record.id]
        found_s = time.monotonic() - restart_at
        tui = Tmux(console_cmd, width=120, height=40, env=env, cwd=str(REPO))
        tui.wait_for("3/3 nodes up", 60)
        tui.send("4")
        tui.wait_for(record.id, 60)
        shown_run_s = time.monotonic() - restart_at
        followed_again = Followed()
        follower = RunFollower(pool, live.record, interval=0.2)
        follower.subscribe(followed_again)
        with follower:
            assert follower.wait(400), {n: (f.state, f.error)
                                        for n, f in follower.followers.items()}
        status = runs.run_status(pool, record)
        assert status.state == "finished", status
        total = 0
        assert followed_again.dropped == 0
        for node in record.nodes:
            expected = _file_lines(node)
            assert followed_again.lines.get(node.node) == expected, node.node
            total += len(expected)
        report.append(f"drill restart: run found on the nodes {found_s:.1f} s after the new "
                      f"console started, shown on its Training screen after {shown_run_s:.1f} s; "
                      f"followed to the end: {total} lines on {len(record.nodes)} nodes equal "
                      f"the log files (none lost or repeated); run {status.state}")
    finally:
        if follower is not None:
            follower.stop()
        if tui is not None:
            tui.close()
        if record is not None and run_pids(record.id):
            lb.heal()
            runs.stop_run(pool, record, grace=2)
        pool.close()
        with capsys.disabled():
            print(f"\ndrills ({time.monotonic() - started:.0f} s):")
            for line in report:
                print(f"  {line}")
