"""Hang and straggler drills on one real training run on a loopback cluster of three nodes.

One tiny SenseVoice run (FunASR's train_ds.py under torchrun + DeepSpeed ZeRO-1 over gloo, on
CPU), launched through ``svconsole launch`` and followed as the Training screen follows it
(:class:`RunFollower` into a :class:`MetricsStore`, with its stall diagnosis):

1. **frozen rank**: once it steps, rank 1 is frozen with SIGSTOP. Within 90 s the stall detector
   raises a stall finding that names rank 1 on its node; ``svconsole stacks`` names that rank and
   node as the suspect, with state T, and the other ranks in one collective group. After SIGCONT
   the run goes on.
2. **slow rank**: rank 2 is stopped half of the time (SIGSTOP/SIGCONT every 0.25 s). The
   straggler detector names rank 2 on its node, and no other rank.
3. **OOM kill** (last: it ends the run): rank 1 is moved into a memory cgroup of 16 MiB and
   the kernel's OOM killer kills it. The host-oom-kill finding names rank 1 on its node, with
   the kernel's ``Killed process PID`` line that the run's watch read from the node.

Each drill's outcome and numbers are printed as one line (also without ``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from oomkill import MemoryCage, needs_memory_cgroup
from test_launch import _needs_training_stack, tiny_profile
from walk import TORCH_EXTENSIONS, isolate_node_names, rank_pid, run_pids, wait_until

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training import runs
from console.training.follow import RunFollower
from console.training.logparse import TrainStep
from console.training.metrics import MetricsStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

EPOCHS = 2000
"""Far more than the drills need: the run is stopped at the end."""


class Steps:
    """The last total step of each rank, from the followed events."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}

    def __call__(self, update) -> None:
        for _node, event in update.events:
            if isinstance(event, TrainStep) and event.rank is not None and event.total_step:
                self.last[event.rank] = max(self.last.get(event.rank, 0), event.total_step)


class DutyCycle(threading.Thread):
    """SIGSTOP for ``stopped`` s, then SIGCONT for ``running`` s, until stopped."""

    def __init__(self, pid: int, stopped: float = 0.25, running: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.stopped, self.running = pid, stopped, running
        self.halt = threading.Event()
        self.cycles = 0

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self.halt.wait(self.stopped)
                os.kill(self.pid, signal.SIGCONT)
                self.cycles += 1
                self.halt.wait(self.running)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def test_frozen_rank_and_slow_rank_are_named(fresh_loopback, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _needs_training_stack()
    from svconsole_scripts import tiny_sensevoice

    report: list[str] = []
    lb = fresh_loopback(3)
    names = isolate_node_names(lb.cluster_yaml, uuid.uuid4().hex[:4])
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=24, seconds=1.5)
    profile = tmp_path / "training.yaml"
    profile.write_text(yaml.safe_dump(tiny_profile(tiny, lb.shared_dir / "exp", EPOCHS)))
    pool = Pool(load_cluster(lb.cluster_yaml))
    follower: RunFollower | None = None
    record: runs.RunRecord | None = None
    duty: DutyCycle | None = None
    started = time.monotonic()
    try:
        code = main(["--config", str(lb.cluster_yaml), "launch", "--profile", str(profile),
                     "--entry", "cpu-wrapper", "--env", f"TORCH_EXTENSIONS_DIR={TORCH_EXTENSIONS}",
                     "--yes", "--json"])
        reply = json.loads(capsys.readouterr().out)
        assert code == 0, reply["message"]
        record = runs.RunRecord.from_dict(reply["run"])
        store = MetricsStore()
        steps = Steps()
        follower = RunFollower(pool, record, store=store, interval=0.2)
        follower.subscribe(steps)
        follower.start()
        wait_until(lambda: len(steps.last) == 3 and min(steps.last.values()) >= 5, 300,
                   "every rank stepping")
        ranks = {r.rank: r.node for r in store.ranks()}
        assert ranks == {0: names[0], 1: names[1], 2: names[2]}, ranks

        # 1. freeze rank 1: the stall finding names it, and so does stacks
        frozen = rank_pid(record.id, 1)
        os.kill(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            def named() -> bool:
                return any(f.id == "run-stalled" and f.rank == 1 for f in store.findings())

            wait_until(named, 90, "a stall finding naming rank 1")
            named_s = time.monotonic() - frozen_at
            [stall] = [f for f in store.findings() if f.id == "run-stalled"]
            assert stall.node == names[1], stall
            assert f"rank 1 on {names[1]} is stopped (state T)" in stall.detail, stall.detail
            at = time.monotonic()
            code = main(["--config", str(lb.cluster_yaml), "stacks", record.id, "--json"])
            stacks_s = time.monotonic() - at
            stacks = json.loads(capsys.readouterr().out)
            assert code == 1
            suspects = [(s["node"], s["rank"]) for s in stacks["suspects"]]
            assert suspects == [(names[1], 1)], stacks["suspects"]
            assert "is stopped (state T)" in stacks["suspects"][0]["why"]
            (majority,) = [g for g in stacks["groups"] if g["majority"]]
            # the others wait in one collective; the frozen rank may have been stopped inside
            # it too (same frames): it is named by its state, not by its stack
            assert {0, 2} <= set(majority["ranks"]) and majority["collective"], majority
        finally:
            os.kill(frozen, signal.SIGCONT)
        before = dict(steps.last)
        wait_until(lambda: all(steps.last[r] > before[r] + 2 for r in before), 120,
                   "every rank stepping again after SIGCONT")
        assert store.run_stall() is None
        report.append(
            f"drill frozen rank: stall finding naming rank 1 on {names[1]} {named_s:.0f} s after "
            f"SIGSTOP ({stall.detail[:160]}...); stacks in {stacks_s:.1f} s: suspect "
            f"{stacks['suspects'][0]['why']!r}, ranks 0, 2 in {majority['collective']}; run "
            f"stepping again after SIGCONT")

        # 2. rank 2 stopped half of the time: the straggler detector names it
        duty = DutyCycle(rank_pid(record.id, 2))
        duty.start()
        duty_at = time.monotonic()

        def straggler() -> bool:
            return any(f.id == "straggler" and f.rank == 2 for f in store.findings())

        wait_until(straggler, 240, "a straggler finding naming rank 2")
        found_s = time.monotonic() - duty_at
        found = [f for f in store.findings() if f.id == "straggler"]
        assert [(f.rank, f.node) for f in found] == [(2, names[2])], [f.detail for f in found]
        rel = {r.rank: r.rel_time for r in store.ranks()}
        duty.stop()
        report.append(f"drill slow rank: {found_s:.0f} s after a 50% SIGSTOP duty cycle "
                      f"({duty.cycles} cycles): {found[0].detail}; time relative to the median "
                      + ", ".join(f"rank {r}: {v:+.0%}" for r, v in sorted(rel.items())
                                  if v is not None))
        assert rel[2] is not None and rel[2] > 0.1, rel

        # 3. rank 1 killed by the kernel's OOM killer (its memory cgroup cut to 16 MiB): the
        # finding names it, with the kernel's line for its pid, added by the watch unasked
        needs_memory_cgroup()
        victim = rank_pid(record.id, 1)
        with MemoryCage() as cage:
            cage.put(victim)
            caged_at = time.monotonic()

            def oom() -> list:
                return [f for f in store.findings() if f.id == "host-oom-kill" and f.rank == 1
                        and any(f"Killed process {victim}" in e for e in f.evidence)]

            [killed] = wait_until(oom, 120, "an OOM finding naming rank 1 with the kernel's line")
        oom_s = time.monotonic() - caged_at
        assert killed.node == names[1], killed
        report.append(f"drill OOM kill: rank 1 on {names[1]} named {oom_s:.0f} s after its memory "
                      f"cgroup was cut to 16 MiB: {killed.detail[:200]}")
    finally:
        if duty is not None:
            duty.stop()
        if follower is not None:
            follower.stop()
        if record is not None and run_pids(record.id):
            runs.stop_run(pool, record, grace=2)
        pool.close()
        with capsys.disabled():
            print(f"\nhang drills ({time.monotonic() - started:.0f} s):")
            for line in report:
                print(f"  {line}")
