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


def one_run(lb: LoopbackCluster, profile: Path, pool: Pool, followed: bool,
            sample_every: float) -> tuple[float, int]:
    """Launch, (follow and sample,) wait for the end; (steps/s, stack samples taken)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(["--config", str(lb.cluster_yaml), "launch", "--profile", str(profile),
                    "--entry", "cpu-wrapper", "--env",
                    f"TORCH_EXTENSIONS_DIR={TORCH_EXTENSIONS}", "--yes", "--json"])
    reply = json.loads(out.getvalue())
    if code != 0:
        raise SystemExit(f"launch failed: {reply.get('message')}")
    record = runs.RunRecord.from_dict(reply["run"])
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
    if status.state != "finished":
        raise SystemExit(f"run {record.id} {status.state}")
    return steps_per_s(record), samples


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
            for i in range(args.rounds):
                for followed in ((False, True) if i % 2 == 0 else (True, False)):
                    profile = Path(tmp) / f"training-{i}-{int(followed)}.yaml"
                    out = lb.shared_dir / f"exp-{i}-{int(followed)}"
                    profile.write_text(yaml.safe_dump(tiny_profile(tiny, out, args.epochs)))
                    rate, samples = one_run(lb, profile, pool, followed, args.sample_every)
                    got[followed].append(rate)
                    way = f"followed ({samples} stack samples)" if followed else "unfollowed"
                    print(f"round {i + 1}: {way}: {rate:.3f} steps/s "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
            plain, watched = statistics.median(got[False]), statistics.median(got[True])
            print(f"median steps/s: unfollowed {plain:.3f}, followed and sampled "
                  f"{watched:.3f}: ratio {watched / plain:.3f} ({(watched / plain - 1):+.1%})")
        finally:
            if pool is not None:
                pool.close()
            lb.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
