"""Benchmark: parsing a training log, and parsing plus storing it, in lines per second.

Usage: ``python bench/logparse.py [--lines 1000000] [--ranks 8] [--json]``

A synthetic multi-rank FunASR log is written to a temporary file: ``--ranks`` ranks' per-step lines
(Hydra prefix, the real line layout of funasr 1.4.16, some behind torchrun's ``[rankN]:`` prefix or
cut before the tag as pasted logs are), DeepSpeed ``wall_clock_breakdown`` lines, warnings,
checkpoint and validation lines and a traceback now and then, in the proportions of the H200 run.

Measured in the same process, on the same bytes (the peers and the parser twice, interleaved,
the better pass of each counting, as other work shares the machine):

- peers: a plain ``str.split`` loop (lines split on ``", "``), and a one-regex loop that pulls
  rank, step and loss out of each line: the floor any parser pays;
- parse: :func:`console.training.logparse.parse_file` (every event typed, every field);
- parse + store: each event added to a :class:`console.training.metrics.MetricsStore` (history
  to a CSV on disk, charts bounded, faults scanned).

Memory: each size runs in a fresh child process, so its peak RSS is its own; the log is read
in chunks, so peak RSS must not grow with the log. The report gives the peak at ``--lines`` and
at twice as many. Goal (issue 15): at least 300k lines/s for parsing alone.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.training.logparse import parse_file  # noqa: E402
from console.training.metrics import MetricsStore  # noqa: E402

TRAIN = ("[2026-11-30 00:{m:02d}:{s:02d},439][root][INFO] - train, rank: {r}, epoch: 0/3, "
         "data_slice: 0/1, step_in_slice: {k}/30000, step_in_epoch: {k}, total step: {k}, "
         "(loss_avg_rank: {loss:.3f}), (loss_avg_slice: 364.813), (ppl_avg_slice: 2.732e+158), "
         "(acc_avg_slice: 0.000), (lr: 6.000e-04), [('loss_ctc', 141.118), ('loss_rich', "
         "10.015), ('loss', {loss:.3f}), ('acc_rich', 0.0)], {{'data_load': '0.008', "
         "'forward_time': '0.097', 'backward_time': '0.278', 'optim_time': '0.054', "
         "'total_time': '0.439'}}, GPU, memory: usage: 3.559 GB, peak: 20.901 GB, cache: "
         "24.301 GB, cache_peak: 24.301 GB")
TIMERS = ("[Rank {r}] time (ms) | fwd: 173.39 | bwd: 50.32 | bwd_inner: 47.92 | "
          "bwd_allreduce: 2.21 | step: 608.62")
OTHER = (
    "[2026-11-30 00:15:52,325] [WARNING] [torch_autocast.py:52:autocast_if_enabled] "
    "torch.autocast is enabled outside DeepSpeed",
    "[2026-11-30 00:16:10,002][root][INFO] - Save checkpoint: 1, rank: 0",
    "[2026-11-30 00:16:11,120][root][INFO] - Checkpoint saved to /data/shared/out/model.pt.ep1",
    "[2026-11-30 00:16:11,121][root][INFO] - current_val: 94.43608856201172, best_val_loss: inf",
    '[rank3]:   File "/opt/venv/lib/python3.11/site-packages/funasr/bin/train_ds.py", line 225',
    "[rank3]: RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16",
    "W1130 00:16:12.000000 1326 torch/distributed/elastic/multiprocessing/api.py:1010] Sending "
    "process 2212 closing signal SIGTERM",
)


def write_log(path: Path, lines: int, ranks: int, seed: int = 15) -> int:
    """Write the synthetic log; return its size in bytes."""
    rng = random.Random(seed)
    size = 0
    step = 0
    with path.open("w", encoding="utf-8") as f:
        n = 0
        while n < lines:
            step += 1
            for r in range(ranks):
                if n >= lines:
                    break
                text = TRAIN.format(m=step // 60 % 60, s=step % 60, r=r, k=step,
                                    loss=100 * rng.random() + 20)
                roll = rng.random()
                if roll < 0.1:
                    text = f"[rank{r}]: " + text
                elif roll < 0.15:
                    text = text[rng.randrange(1, 40):]  # a pasted log: the prefix cut anywhere
                size += f.write(text + "\n")
                n += 1
                if n < lines and rng.random() < 0.25:
                    size += f.write(TIMERS.format(r=r) + "\n")
                    n += 1
                if n < lines and rng.random() < 0.05:
                    size += f.write(rng.choice(OTHER) + "\n")
                    n += 1
    return size


def read_lines(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return f.read().splitlines()


_PEER = re.compile(r"rank: (\d+).*?total step: (\d+), \(loss_avg_rank: ([^)]*)\)")


def peer_split(path: Path) -> int:
    count = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            count += len(line.split(", "))
    return count


def peer_regex(path: Path) -> int:
    count = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            m = _PEER.search(line)
            if m:
                count += int(m.group(2))
    return count


def ours_parse(path: Path) -> int:
    return sum(1 for _ in parse_file(str(path)))


def ours_store(path: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        store = MetricsStore(Path(tmp) / "history.csv")
        n = 0
        for event in parse_file(str(path)):
            store.add(event, node="node0", received=float(n))
            n += 1
        store.findings(now=float(n))
        store.close()
    return n


def timed(fn, path: Path) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn(path)
    return time.perf_counter() - started


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(lines: int, ranks: int, what: str) -> dict:
    """One measurement in this (fresh) process: the log of ``lines`` lines, then ``what``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        size = write_log(path, lines, ranks)
        base_rss = peak_rss_mb()  # writing streams: nothing of the log is held
        out: dict = {"lines": lines, "bytes": size, "rss_before_mb": round(base_rss, 1)}
        fns = {"split": peer_split, "regex": peer_regex, "parse": ours_parse,
               "store": ours_store}
        for name in what.split(","):  # a name twice: its best pass counts (a loaded machine)
            rate = round(lines / timed(fns[name], path))
            out[f"{name}_lines_per_s"] = max(rate, out.get(f"{name}_lines_per_s", 0))
        out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


def run_child(lines: int, ranks: int, what: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", what, "--lines", str(lines),
                           "--ranks", str(ranks)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.lines, args.ranks, args.child)))
        return 0
    speed = run_child(args.lines, args.ranks, "split,regex,parse,store,split,regex,parse")
    double = run_child(2 * args.lines, args.ranks, "parse,store")
    report = {
        "lines": args.lines, "ranks": args.ranks, "log_mb": round(speed["bytes"] / 2**20, 1),
        "peer_split_lines_per_s": speed["split_lines_per_s"],
        "peer_regex_lines_per_s": speed["regex_lines_per_s"],
        "parse_lines_per_s": speed["parse_lines_per_s"],
        "parse_store_lines_per_s": speed["store_lines_per_s"],
        "parse_vs_regex_peer": round(speed["parse_lines_per_s"] / speed["regex_lines_per_s"], 3),
        "parse_vs_split_peer": round(speed["parse_lines_per_s"] / speed["split_lines_per_s"], 3),
        "store_vs_parse": round(speed["store_lines_per_s"] / speed["parse_lines_per_s"], 3),
        "parse_store_lines_per_s_2x": double["store_lines_per_s"],
        "peak_rss_mb": {str(args.lines): speed["peak_rss_mb"],
                        str(2 * args.lines): double["peak_rss_mb"]},
        "rss_growth_2x": round(double["peak_rss_mb"] / speed["peak_rss_mb"], 3),
        "goal_parse_300k": speed["parse_lines_per_s"] >= 300_000,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
