"""Benchmark: GPU telemetry from 32 loopback nodes, streaming agents against per-sample polling.

Usage: ``python bench/telemetry.py [--nodes 32] [--seconds 30] [--json]``

It starts a loopback cluster (real sshd per node, console/ssh/loopback.py), then measures two ways of
getting one sample per node per second, each for ``--seconds`` after start-up:

- streaming: :class:`console.gpu.telemetry.Telemetry`, one long-lived agent per node at 1 Hz over the
  shared pool, each agent simulating 8 H200 GPUs from tests/fixtures/h200/nvml.json;
- naive: every second, for every node, a fresh SSH connection that runs the agent once
  (``--count 1``, like ``nvidia-smi`` or ``gpustat`` over SSH) and closes.

Reported: this (console) process's CPU use in % of one core, the age of each sample when the
console received it (p50/p95; node and console share a clock here), and the processes started on
the nodes per minute, counted by a separate scanner process that watches the sshd process trees.
Targets (issue 7): < 10% of one core, p95 age < 1.5 s, no process start per sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.cluster.model import Cluster, load_cluster  # noqa: E402
from console.gpu.telemetry import Collector, Telemetry, parse_sample  # noqa: E402
from console.ssh.loopback import LoopbackCluster  # noqa: E402
from console.ssh.pool import Pool  # noqa: E402
from console.ssh.remote import script_path  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "h200" / "nvml.json"


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def scan(roots: list[int], seconds: float) -> int:
    """Scanner mode (own process): count new processes below ``roots`` over ``seconds``,
    scanning /proc every 20 ms."""
    def tree() -> set[tuple[int, str]]:
        children: dict[int, list[tuple[int, str]]] = {}
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append((int(p), fields[19]))  # ppid, starttime
        found, todo = set(), list(roots)
        while todo:
            for child in children.get(todo.pop(), []):
                found.add(child)
                todo.append(child[0])
        return found

    seen = tree()
    started = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = tree()
        started += len(now - seen)
        seen |= now
        time.sleep(0.02)
    return started


def start_scanner(lb: LoopbackCluster, seconds: float) -> subprocess.Popen:
    roots = [str(s["pid"]) for s in lb.status() if s["pid"]]
    return subprocess.Popen([sys.executable, __file__, "--scan", str(seconds), *roots],
                            stdout=subprocess.PIPE, text=True)


@dataclasses.dataclass
class Result:
    way: str
    seconds: float
    samples: int
    samples_due: int          # one per node per second
    cpu_pct_one_core: float
    age_p50_s: float | None
    age_p95_s: float | None
    remote_process_starts_per_min: float
    process_starts_per_sample: float
    due_to_received_p50_s: float | None = None   # naive only: request to answer
    due_to_received_p95_s: float | None = None


def measure(way: str, lb: LoopbackCluster, seconds: float, run, ages: list[float]) -> Result:
    """Run ``run(stop_event)`` in the background, measure over ``seconds``."""
    scanner = start_scanner(lb, seconds)
    cpu0, t0 = cpu_seconds(), time.monotonic()
    stop = threading.Event()
    worker = threading.Thread(target=run, args=(stop,), daemon=True)
    worker.start()
    starts = int(scanner.communicate()[0])
    cpu = cpu_seconds() - cpu0
    wall = time.monotonic() - t0
    n = len(ages)
    stop.set()
    worker.join(30)
    return Result(way, round(wall, 1), n, int(len(lb.nodes) * wall), round(100 * cpu / wall, 1),
                  percentile(ages, 50), percentile(ages, 95),
                  round(starts * 60 / wall, 1), round(starts / n, 2) if n else float("nan"))


def streaming(lb: LoopbackCluster, cluster: Cluster, seconds: float) -> Result:
    ages: list[float] = []
    with Pool(cluster) as pool:
        tel = Telemetry(pool, cluster, interval=1.0, simulate=FIXTURE, sim_gpus=8)
        record = [False]

        def on_update(u) -> None:
            if record[0] and u.sample is not None:
                ages.append(u.sample.received - u.sample.t)

        tel.subscribe(on_update)
        t0 = time.monotonic()
        tel.start()
        while not all(c.latest is not None for c in tel.collectors.values()):
            if time.monotonic() - t0 > 120:
                raise SystemExit("not every node answered within 120 s")
            time.sleep(0.1)
        print(f"streaming: all {len(tel.collectors)} agents live after "
              f"{time.monotonic() - t0:.1f} s; measuring {seconds:g} s", file=sys.stderr)
        record[0] = True

        def idle(stop: threading.Event) -> None:
            stop.wait()

        try:
            result = measure("streaming agent", lb, seconds, idle, ages)
        finally:
            tel.stop()
    return result


def naive(lb: LoopbackCluster, cluster: Cluster, seconds: float) -> Result:
    ages: list[float] = []
    latencies: list[float] = []   # from the moment the sample was due to its arrival
    lock = threading.Lock()
    # the agent is already cached on the nodes (the streaming run uploaded it)
    with Pool(cluster) as pool:
        cmd = Collector(pool, cluster.nodes[0].name, python=cluster.python, simulate=FIXTURE).command()
    cmd = cmd.replace("--interval 1.0", "--interval 1.0 --count 1")

    def poll(node: str, due: float) -> None:
        one = dataclasses.replace(cluster, nodes=(cluster.node(node),))
        with Pool(one) as fresh:   # a fresh connection per sample, closed after it
            r = fresh.run(node, cmd, timeout=30)
        s = next((x for x in map(parse_sample, r.stdout.splitlines()) if x), None)
        if s is not None:
            with lock:
                ages.append(time.time() - s.t)
                latencies.append(time.time() - due)

    def run(stop: threading.Event) -> None:
        ex = ThreadPoolExecutor(len(cluster.nodes))
        tick = time.monotonic()
        while not stop.is_set():
            for n in cluster.names():
                ex.submit(poll, n, time.time())
            tick += 1.0
            stop.wait(max(0.0, tick - time.monotonic()))
        ex.shutdown(wait=True, cancel_futures=True)   # polls not started by now are dropped

    result = measure("naive: fresh ssh + command per sample", lb, seconds, run, ages)
    result.due_to_received_p50_s = percentile(latencies, 50)
    result.due_to_received_p95_s = percentile(latencies, 95)
    return result


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--scan":
        print(scan([int(x) for x in sys.argv[3:]], float(sys.argv[2])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    assert script_path("gpu_agent.py").exists()
    with tempfile.TemporaryDirectory(prefix="svconsole-bench-") as tmp:
        lb = LoopbackCluster(Path(tmp), args.nodes, base_port=None)
        lb.up()
        try:
            cluster = load_cluster(lb.cluster_yaml)
            results = [streaming(lb, cluster, args.seconds)]
            if not args.skip_naive:
                results.append(naive(lb, cluster, args.seconds))
        finally:
            lb.down()
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        for r in results:
            print(f"{r.way}: {r.samples} samples of {r.samples_due} due in {r.seconds} s; console CPU "
                  f"{r.cpu_pct_one_core}% of one core; age p50 {r.age_p50_s and round(r.age_p50_s, 3)} s, "
                  f"p95 {r.age_p95_s and round(r.age_p95_s, 3)} s; remote process starts "
                  f"{r.remote_process_starts_per_min}/min ({r.process_starts_per_sample} per sample)"
                  + (f"; due to received p50 {r.due_to_received_p50_s:.3f} s, p95 "
                     f"{r.due_to_received_p95_s:.3f} s" if r.due_to_received_p95_s is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
