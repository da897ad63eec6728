"""``svconsole exporter``: serve the cluster's nodes, GPUs and runs as Prometheus metrics.

A long-running headless process on the same engine as the console: one SSH pool with health
probes, one GPU agent per node, a follower for every live training run. Prometheus scrapes
``http://BIND:PORT/metrics``; the metric names and their meaning are in ``console/exporter.py``,
and ``scripts/grafana-dashboard.json`` is a Grafana dashboard built on them.

It listens on 127.0.0.1 unless ``--bind`` says otherwise (the metrics name every node, GPU and
run: on another address anyone who can reach the port reads them). SIGTERM or Ctrl-C stop it
cleanly: the agents see their channels close and exit on the nodes.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.gpu.telemetry import SIMULATION_FIXTURE

#: Where Prometheus finds the exporter by default: this machine only.
DEFAULT_PORT = 9877
DEFAULT_BIND = "127.0.0.1"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "exporter",
        help="serve nodes, GPUs and training runs as Prometheus metrics",
        description="Run headless and serve Prometheus metrics of every node, GPU and live "
        "training run at http://BIND:PORT/metrics until SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"TCP port (default {DEFAULT_PORT}; 0: any free port, printed)")
    parser.add_argument("--bind", default=DEFAULT_BIND, metavar="ADDR",
                        help=f"address to listen on (default {DEFAULT_BIND}, this machine only; "
                        "0.0.0.0 exposes the metrics to the network)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="seconds between GPU agent samples (default 1)")
    parser.add_argument("--health-interval", type=float, default=5.0, metavar="S",
                        help="seconds between SSH health probes of every node (default 5)")
    parser.add_argument("--runs-interval", type=float, default=30.0, metavar="S",
                        help="seconds between looks for live training runs (default 30; 0: none)")
    parser.add_argument("--simulate", metavar="FIXTURE", type=Path, nargs="?",
                        const=SIMULATION_FIXTURE,
                        help="replay an nvml.json fixture's readings instead of real GPUs (default: the "
                        "H200 readings shipped with svconsole) "
                        "(served with svconsole_gpu_info{simulated=\"true\"})")
    parser.add_argument("--sim-gpus", type=int, default=8, metavar="N",
                        help="GPUs per node with --simulate (default 8)")
    parser.set_defaults(func=handler)


def _usage_error(args: argparse.Namespace) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port {args.port}: must be 0-65535"
    for flag in ("interval", "health_interval"):
        if getattr(args, flag) <= 0:
            return f"--{flag.replace('_', '-')} must be > 0"
    if args.runs_interval < 0:
        return "--runs-interval must be >= 0"
    if args.simulate is not None and not args.simulate.is_file():
        return f"--simulate {args.simulate}: no such file"
    if args.sim_gpus < 1:
        return "--sim-gpus must be >= 1"
    return None


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.exporter import Exporter, is_loopback

    problem = _usage_error(args)
    if problem:
        print(f"svconsole exporter: {problem}", file=sys.stderr)
        return EXIT_USAGE
    cluster = ctx.cluster
    exporter = Exporter(ctx.pool, cluster, state_dir=ctx.state_dir, interval=args.interval,
                        simulate=args.simulate, sim_gpus=args.sim_gpus,
                        health_interval=args.health_interval, runs_interval=args.runs_interval)
    try:
        host, port = exporter.serve(args.port, args.bind)
    except OSError as exc:
        print(f"svconsole exporter: cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_FAILED
    if not is_loopback(args.bind):
        print(f"svconsole exporter: warning: listening on {args.bind}, not loopback: anyone who "
              f"can reach port {port} reads every node, GPU and run of cluster {cluster.name}",
              file=sys.stderr, flush=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        exporter.start()
        shown = f"[{host}]" if ":" in host else host
        print(f"svconsole exporter: serving http://{shown}:{port}/metrics for cluster "
              f"{cluster.name} ({len(cluster.nodes)} nodes"
              + (", SIMULATED GPUs" if args.simulate else "") + ")", file=ctx.out, flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        exporter.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    print("svconsole exporter: stopped", file=ctx.out, flush=True)
    return EXIT_OK
