"""Stacks benchmark: ``svconsole stacks`` over a loopback cluster with many ranks per node.

Starts its own loopback cluster (real sshd processes) and, per node, ``--ranks`` Python processes
tagged as one run's ranks are (``SVCONSOLE_RUN_ID``, ``SVCONSOLE_NODE``, torchrun's ``RANK``),
each in a loop a few frames deep, like a rank waiting in a collective. It then measures, in the
same run:

- **svconsole**: :func:`console.training.stacks.take_stacks` through a warm pool: every node at
  once, every rank of a node dumped at once (py-spy ``--native``, or ``--nonblocking`` with
  ``--no-native``), CPU time over the 1 s window, the analysis; the median of ``--rounds``
  runs, each checked for every rank with a stack;
- **by hand** (the peer): what an operator scripts without it: one ``ssh`` per node, one after
  the other, running ``py-spy dump --native`` for each rank pid of that node in turn.

Budgets (issue 16): under 5 s for 3 nodes, under 10 s for 32 nodes with 8 ranks each. Prints the
seconds of both and their ratio per size, with the machine's load: on loopback every node's dumps
share this machine's CPUs (256 py-spy runs at 32 x 8), where a real cluster gives each node its
own.

    .venv/bin/python bench/stacks.py [--nodes 3,32] [--ranks 8] [--rounds 3] [--peer-rounds 1]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.cluster.model import load_cluster  # noqa: E402
from console.ssh.loopback import LoopbackCluster  # noqa: E402
from console.ssh.pool import Pool  # noqa: E402
from console.training import runs  # noqa: E402
from console.training.stacks import take_stacks  # noqa: E402

RANK = """
import time
def wait_in(depth):
    if depth:
        return wait_in(depth - 1)
    while True:
        time.sleep(0.5)
wait_in(8)
"""
BUDGET_S = {3: 5.0, 32: 10.0}


def record_for(cluster, run_id: str, directory: Path, names: list[str], ranks: int):
    """A run record as a launch writes it, for ranks that are already running."""
    own = f"{directory}/svconsole/{run_id}"
    nodes = [runs.NodeRun(n, i, f"{directory}/logs/{n}.log", f"{own}/{n}.pid",
                          f"{own}/{n}.exit") for i, n in enumerate(names)]
    extra = {}
    if "identity" in runs.RunRecord.__dataclass_fields__:
        from console.cluster.identity import identity

        extra["identity"] = identity(cluster, create=True).to_dict()
    plan = {"nodes": [{"node": n, "node_rank": i, "nproc": ranks} for i, n in enumerate(names)]}
    return runs.RunRecord(run_id, time.time(), cluster.name, str(directory), names[0], nodes,
                          plan=plan, **extra)


def start_ranks(run_id: str, names: list[str], ranks: int) -> list[subprocess.Popen]:
    procs = []
    world = len(names) * ranks
    for i, node in enumerate(names):
        for local in range(ranks):
            env = {**os.environ, "SVCONSOLE_RUN_ID": run_id, "SVCONSOLE_NODE": node,
                   "RANK": str(i * ranks + local), "LOCAL_RANK": str(local),
                   "WORLD_SIZE": str(world)}
            procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env,
                                          stdin=subprocess.DEVNULL))
    return procs


def by_hand(lb: LoopbackCluster, procs: list[subprocess.Popen], names: list[str],
            ranks: int) -> float:
    """One ssh per node in turn, py-spy for each of its ranks in turn; seconds."""
    pyspy = Path(sys.executable).parent / "py-spy"
    started = time.perf_counter()
    for i, _node in enumerate(names):
        pids = [p.pid for p in procs[i * ranks:(i + 1) * ranks]]
        script = "; ".join(f"{shlex.quote(str(pyspy))} dump --native --pid {pid} >/dev/null"
                           for pid in pids)
        subprocess.run(lb.ssh_argv(i, script, connect_timeout=30), check=True,
                       stdin=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - started


def measure(n: int, ranks: int, rounds: int, peer_rounds: int, native: bool = True
            ) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="svconsole-bench-stacks-") as tmp:
        lb = LoopbackCluster(Path(tmp) / "lb", n, base_port=None)
        lb.up()
        procs: list[subprocess.Popen] = []
        pool = None
        try:
            cluster = load_cluster(lb.cluster_yaml)
            names = cluster.names()
            run_id = runs.new_run_id()
            record = record_for(cluster, run_id, Path(tmp) / "exp", names, ranks)
            procs = start_ranks(run_id, names, ranks)
            time.sleep(2)  # let every rank reach its loop (the bench's own start-up)
            pool = Pool(cluster)
            pool.run_all("true", timeout=120)  # warm: connections open, as in the TUI
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                report = take_stacks(pool, record, timeout=120, native=native)
                times.append(time.perf_counter() - started)
                framed = [r for r in report.ranks if r.frames]
                if len(framed) != n * ranks:
                    raise SystemExit(f"{n} nodes: {len(framed)} of {n * ranks} ranks have a "
                                     f"stack; notes: {report.notes[:3]}")
            peer = [by_hand(lb, procs, names, ranks) for _ in range(peer_rounds)]
            return {"svconsole": statistics.median(times), "by_hand": statistics.median(peer)}
        finally:
            for p in procs:
                p.kill()
                p.wait()
            if pool is not None:
                pool.close()
            lb.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", default="3,32", help="cluster sizes, comma-separated")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer-rounds", type=int, default=1)
    parser.add_argument("--no-native", dest="native", action="store_false",
                        help="Python frames only (py-spy --nonblocking), as stacks --no-native")
    args = parser.parse_args(argv)
    failed = False
    for n in (int(x) for x in args.nodes.split(",")):
        got = measure(n, args.ranks, args.rounds, args.peer_rounds, args.native)
        budget = BUDGET_S.get(n)
        verdict = ""
        if budget is not None:
            ok = got["svconsole"] < budget
            failed |= not ok
            verdict = f" (budget {budget:g} s: {'met' if ok else 'MISSED'})"
        mode = "native" if args.native else "no-native"
        print(f"{n} nodes x {args.ranks} ranks ({mode}, load {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs): svconsole stacks {got['svconsole']:.2f} s, "
              f"by hand {got['by_hand']:.2f} s, {got['by_hand'] / got['svconsole']:.1f}x "
              f"faster{verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
