"""What svconsole's watching costs the training: steps/s of a tiny SenseVoice CPU run, unfollowed
against followed and sampled, on a loopback cluster of three nodes.

Each round launches the same tiny run (FunASR train_ds.py under torchrun + DeepSpeed ZeRO-1 over
gloo, on CPU; tests/test_launch.py's tiny profile) through ``svconsole launch``, twice:

- **unfollowed**: nothing of svconsole touches it until it ends;
- **followed**: a :class:`RunFollower` into a metrics store (with its stall watch), as the
  Training screen follows a run, plus ``take_stacks`` (``--no-native``: py-spy never pauses a
  rank) every ``--sample-every`` seconds.

Steps/s comes from rank 0's own log: train lines after the first epoch (start-up, DeepSpeed's
op build, first-epoch warm-up left out), by their time stamps. Each round runs both ways, the
order swapped every round, so that a change in the machine's load hits both; the figure is the
ratio of the medians (the issue's target: within 1%).

On a small machine the steps/s of two runs differ by several percent whatever svconsole does,
so the bench also counts what the watching costs in CPU time, which noise does not blur:

- **nodes**: everything that ran through the nodes' sshd (the follower scripts, py-spy, the
  SSH sessions themselves), read from each loopback sshd listener's reaped-children times
  (``cutime + cstime`` in /proc: the detached training is not its child, so it is not in them);
- **console**: this process's own CPU time (the followers' threads, the metrics store);
- **training**: the CPU time of every process of the run (sampled from /proc every 2 s).

Watching CPU over training CPU bounds the slowdown from above when the training is CPU-bound
on the same cores, as it is here.

    .venv/bin/python bench/follow_overhead.py [--rounds 3] [--epochs 12] [--sample-every 10]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from test_launch import tiny_profile  # noqa: E402
from walk import TORCH_EXTENSIONS  # noqa: E402

from console.cli import main as cli  # noqa: E402
from console.cluster.model import load_cluster  # noqa: E402
from console.ssh.loopback import LoopbackCluster  # noqa: E402
from console.ssh.pool import Pool  # noqa: E402
from console.training import runs  # noqa: E402
from console.training.follow import RunFollower  # noqa: E402
from console.training.logparse import TrainStep, parse_file  # noqa: E402
from console.training.stacks import take_stacks  # noqa: E402


def steps_per_s(record: runs.RunRecord) -> float:
    """Rank 0's steps per second after its first epoch, from its lines' time stamps."""
    node = record.nodes[0]
    steps = [e for e in parse_file(node.log) if isinstance(e, TrainStep) and e.rank == 0
             and e.offset >= node.log_offset and e.epoch and e.time is not None]
    if len(steps) < 2:
        raise SystemExit(f"run {record.id}: too few train lines after the first epoch")
    first, last = steps[0], steps[-1]
    return (last.total_step - first.total_step) / (last.time - first.time)


TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ssh_cpu(lb: LoopbackCluster) -> float:
    """CPU seconds of what ran under the nodes' sshd listeners and has ended (reaped)."""
    total = 0.0
    for i in range(len(lb.nodes)):
        pid = lb._listener(i)
        fields = _stat_fields(pid) if pid is not None else None
        if fields is not None:  # fields from the state on: 13 cutime, 14 cstime
            total += (int(fields[13]) + int(fields[14])) / TICK
    return total


def console_cpu() -> float:
    times = os.times()
    return times.user + times.system


class TrainingCpu(threading.Thread):
    """The CPU time of the run's processes (those with its SVCONSOLE_RUN_ID), sampled."""

    def __init__(self, run_id: str) -> None:
        super().__init__(daemon=True)
        self.tag = f"SVCONSOLE_RUN_ID={run_id}\0".encode()
        self.seen: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(2.0):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                pid = int(entry)
                try:
                    if pid not in self.seen and \
                            self.tag not in Path(f"/proc/{pid}/environ").read_bytes():
                        continue
                except OSError:
                    continue
                fields = _stat_fields(pid)
                if fields is not None:  # 11 utime, 12 stime
                    self.seen[pid] = (int(fields[11]) + int(fields[12])) / TICK

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


def one_run(lb: LoopbackCluster, profile: Path, pool: Pool, followed: bool,
            sample_every: float) -> tuple[float, int, dict[str, float]]:
    """Launch, (follow and sample,) wait for the end; (steps/s, stack samples taken, CPU
    seconds: nodes, console, training)."""
    nodes_before, console_before = ssh_cpu(lb), console_cpu()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["--config", str(lb.cluster_yaml), "launch", "--profile", str(profile),
                    "--entry", "cpu-wrapper", "--env",
                    f"TORCH_EXTENSIONS_DIR={TORCH_EXTENSIONS}", "--yes", "--json"])
    reply = json.loads(out.getvalue())
    if code != 0:
        raise SystemExit(f"launch failed: {reply.get('message')}")
    record = runs.RunRecord.from_dict(reply["run"])
    training = TrainingCpu(record.id)
    training.start()
    samples = 0
    if followed:
        follower = RunFollower(pool, record).start()
        done = threading.Event()

        def sample() -> None:
            nonlocal samples
            while not done.wait(sample_every):
                take_stacks(pool, record, native=False)
                samples += 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        follower.wait(3600)
        done.set()
        sampler.join(60)
        follower.stop()
    else:
        while runs.run_status(pool, record).live:
            time.sleep(5)
    status = runs.run_status(pool, record)
    training.done.set()
    training.join(30)
    if status.state != "finished":
        raise SystemExit(f"run {record.id} {status.state}")
    cpu = {"nodes": ssh_cpu(lb) - nodes_before, "console": console_cpu() - console_before,
           "training": training.seconds}
    return steps_per_s(record), samples, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--sample-every", type=float, default=10.0)
    args = parser.parse_args(argv)
    from svconsole_scripts import tiny_sensevoice

    with tempfile.TemporaryDirectory(prefix="svconsole-bench-follow-") as tmp:
        os.environ.setdefault("SVCONSOLE_STATE_DIR", f"{tmp}/state")
        lb = LoopbackCluster(Path(tmp) / "lb", 3, base_port=None)
        lb.up()
        pool = None
        try:
            tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=24, seconds=1.5)
            pool = Pool(load_cluster(lb.cluster_yaml))
            got: dict[bool, list[float]] = {False: [], True: []}
            costs: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.rounds):
                for followed in ((False, True) if i % 2 == 0 else (True, False)):
                    profile = Path(tmp) / f"training-{i}-{int(followed)}.yaml"
                    out = lb.shared_dir / f"exp-{i}-{int(followed)}"
                    profile.write_text(yaml.safe_dump(tiny_profile(tiny, out, args.epochs)))
                    rate, samples, cpu = one_run(lb, profile, pool, followed,
                                                 args.sample_every)
                    got[followed].append(rate)
                    watching = cpu["nodes"] + cpu["console"]
                    costs[followed].append(watching / cpu["training"])
                    way = f"followed ({samples} stack samples)" if followed else "unfollowed"
                    print(f"round {i + 1}: {way}: {rate:.3f} steps/s "
                          f"(load {os.getloadavg()[0]:.1f}); CPU s: training "
                          f"{cpu['training']:.1f}, svconsole on the nodes {cpu['nodes']:.2f} + "
                          f"console {cpu['console']:.2f} = {watching / cpu['training']:.2%} "
                          f"of the training's", flush=True)
            plain, watched = statistics.median(got[False]), statistics.median(got[True])
            print(f"median steps/s: unfollowed {plain:.3f}, followed and sampled "
                  f"{watched:.3f}: ratio {watched / plain:.3f} ({(watched / plain - 1):+.1%})")
            extra = statistics.median(costs[True]) - statistics.median(costs[False])
            print(f"median CPU of svconsole's watching, as a share of the training's: "
                  f"unfollowed {statistics.median(costs[False]):.2%} (launch, the end "
                  f"polls), followed and sampled {statistics.median(costs[True]):.2%}; "
                  f"following costs {extra:+.2%} of the training's CPU time")
        finally:
            if pool is not None:
                pool.close()
            lb.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
