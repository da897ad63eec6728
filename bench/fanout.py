"""Fan-out benchmark: one command on every node of a loopback cluster, four ways.

Starts its own loopback cluster (real sshd processes, console/ssh/loopback.py) and measures, in the
same run, the wall time of ``hostname`` on all N nodes:

- through a warm svconsole pool (connections already open: one channel per node);
- with pdsh (``pdsh -R ssh -f 64``, the harness's ssh options via PDSH_SSH_ARGS_APPEND);
- with one ``ssh`` process per node, all in parallel;
- with a cold ``svconsole exec`` (a fresh Python process: imports, connects, runs).

Each is the median of ``--rounds`` runs, every run checked for one correct line per node. Targets:
the warm pool at least 20x faster than pdsh, a cold ``svconsole exec`` no slower than pdsh.
``--nodes 32,128`` runs the whole comparison once per size (a fresh cluster each) and ends with
both figures per size. svconsole gets the same fan-out as pdsh (``ssh.max_parallel`` = pdsh's
``-f``, 64 unless ``--fanout`` says otherwise).

Every method pays the remote shell's start-up for each command (sshd runs ``$SHELL -c CMD``, and
Debian's bash then reads ``~/.bashrc``). A ``.bashrc`` that runs ``pyenv init`` or ``conda init``
costs ~0.3 s per command and can dominate everything else. ``--plain-shell`` (root only) runs the
benchmark in a private mount namespace where the login user's ``~/.bashrc`` is empty, to measure
the SSH machinery alone; the real file is untouched.

    .venv/bin/python bench/fanout.py [--nodes 32,128] [--rounds 5] [--fanout 64] [--plain-shell]
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.cluster.model import load_cluster  # noqa: E402
from console.ssh.loopback import LoopbackCluster  # noqa: E402
from console.ssh.pool import Pool  # noqa: E402

NAMESPACE_FLAG = "--inside-namespace"


def median_time(rounds: int, once: Callable[[], int], n: int, what: str) -> float:
    """Median seconds of ``once()``, which returns how many nodes answered correctly."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        answered = once()
        times.append(time.perf_counter() - started)
        if answered != n:
            raise SystemExit(f"{what}: only {answered} of {n} nodes answered")
    return statistics.median(times)


def ssh_options(lb: LoopbackCluster) -> list[str]:
    """The harness's ssh client options (key, known_hosts, port, user), without host and command."""
    argv = lb.ssh_argv(0, "true")
    return argv[1:-2]


def count_hostnames(text: str, hostname: str, prefixed: bool) -> int:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if prefixed:
        lines = [ln.split(": ", 1)[1] for ln in lines if ": " in ln]
    return sum(ln.strip() == hostname for ln in lines)


def bench(n: int, rounds: int, fanout: int) -> tuple[float, float]:
    """Measure and print the four ways for ``n`` nodes; returns (pdsh / warm, cold / pdsh)."""
    hostname = os.uname().nodename
    with tempfile.TemporaryDirectory(prefix="svconsole-bench-") as tmp, \
            LoopbackCluster(Path(tmp) / "lb", n, base_port=None) as lb:
        text = lb.cluster_yaml.read_text()
        lb.cluster_yaml.write_text(text.replace("ssh:\n", f"ssh:\n  max_parallel: {fanout}\n", 1))
        cluster = load_cluster(lb.cluster_yaml)
        addresses = ",".join(lb.node(i).address for i in range(n))

        with Pool(cluster) as pool:
            def warm_once() -> int:
                return sum(r.ok and r.stdout.strip() == hostname
                           for r in pool.run_all("hostname").values())

            warm_once()  # opens the connections
            warm = median_time(max(rounds, 5), warm_once, n, "warm pool")

        pdsh_env = dict(os.environ, PDSH_SSH_ARGS_APPEND=shlex.join(ssh_options(lb)))

        def pdsh_once() -> int:
            out = subprocess.run(["pdsh", "-R", "ssh", "-f", str(fanout), "-w", addresses,
                                  "hostname"],
                                 capture_output=True, text=True, env=pdsh_env, timeout=120)
            return count_hostnames(out.stdout, hostname, prefixed=True)

        def ssh_once() -> int:
            procs = [subprocess.Popen(lb.ssh_argv(i, "hostname"), stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True) for i in range(n)]
            return sum(count_hostnames(p.communicate(timeout=120)[0], hostname, False)
                       for p in procs)

        def cold_once() -> int:
            out = subprocess.run(
                [sys.executable, "-m", "console.cli", "--config", str(lb.cluster_yaml),
                 "exec", "--", "hostname"],
                capture_output=True, text=True, cwd=ROOT, timeout=120)
            return count_hostnames(out.stdout, hostname, prefixed=True)

        pdsh = median_time(rounds, pdsh_once, n, "pdsh")
        ssh = median_time(rounds, ssh_once, n, "ssh per node")
        cold = median_time(rounds, cold_once, n, "cold svconsole exec")

    print(f"fan-out of `hostname` to {n} loopback sshd nodes, median of {rounds} "
          f"(warm pool: {max(rounds, 5)}) runs, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    for name, seconds in (("warm svconsole pool", warm), (f"pdsh -R ssh -f {fanout}", pdsh),
                          ("ssh per node, parallel", ssh), ("cold svconsole exec", cold)):
        print(f"  {name:24} {seconds * 1000:8.1f} ms")
    print(f"  pdsh / warm pool        {pdsh / warm:8.1f} x   (target >= 20)  "
          f"{'ok' if pdsh / warm >= 20 else 'MISSED'}")
    print(f"  ssh per node / warm pool{ssh / warm:8.1f} x")
    print(f"  cold exec / pdsh        {cold / pdsh:8.2f}     (target <= 1)   "
          f"{'ok' if cold <= pdsh else 'MISSED'}")
    return pdsh / warm, cold / pdsh


def enter_plain_shell_namespace(argv: list[str]) -> None:
    """Re-run this script in a private mount namespace with an empty ``~/.bashrc``."""
    if os.geteuid() != 0:
        raise SystemExit("--plain-shell needs root (a private mount namespace)")
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private",
                          sys.executable, __file__, *argv, NAMESPACE_FLAG])


def blank_bashrc() -> None:
    bashrc = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".bashrc"
    if bashrc.exists():
        subprocess.run(["mount", "--bind", "/dev/null", str(bashrc)], check=True)
        print(f"(private mount namespace: {bashrc} reads as empty for this benchmark)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="32",
                        help="node count, or several comma-separated (32,128): one run each")
    parser.add_argument("--fanout", type=int, default=64,
                        help="pdsh -f and svconsole's ssh.max_parallel (default 64)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plain-shell", action="store_true",
                        help="measure with an empty ~/.bashrc (root; private mount namespace)")
    parser.add_argument(NAMESPACE_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_shell and not args.inside_namespace:
        enter_plain_shell_namespace(sys.argv[1:])
    if args.inside_namespace:
        blank_bashrc()
    sizes = [int(n) for n in args.nodes.split(",")]
    figures = {n: bench(n, args.rounds, args.fanout) for n in sizes}
    if len(sizes) > 1:
        print("summary: nodes   pdsh/warm pool (>= 20)   cold exec/pdsh (<= 1)")
        for n, (speedup, cold) in figures.items():
            print(f"         {n:5}   {speedup:8.1f} x {'ok' if speedup >= 20 else 'MISSED':>8}"
                  f"   {cold:8.2f} {'ok' if cold <= 1 else 'MISSED':>8}")


if __name__ == "__main__":
    main()
