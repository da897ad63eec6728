"""``svconsole gpus [--json] [--once|--follow]``: every GPU of the cluster, from the node agents.

One agent per node (``scripts/gpu_agent.py``) streams NVML readings over the SSH pool. ``--once``
(the default) waits for one sample from every node (or ``--timeout``), prints them with the
cluster overview, and stops the agents. ``--follow`` prints every interval until Ctrl-C; with
``--json`` it writes one JSON object per sample (JSON lines). ``--simulate FIXTURE`` replays the
H200 readings of an ``nvml.json`` fixture instead of reading GPUs: its output says SIMULATED.
Exit code 0 when every node answered, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.gpu.telemetry import SIMULATION_FIXTURE


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gpus",
        help="show every GPU of the cluster (utilisation, memory, power, processes)",
        description="Start the GPU agent on every node over SSH and show its readings. Exit code "
        "0 when every node answered.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true",
                      help="one sample per node, then exit (the default)")
    mode.add_argument("--follow", action="store_true", help="keep printing until Ctrl-C")
    parser.add_argument("--json", action="store_true",
                        help="JSON: {nodes: {name: {...}}, overview: {...}}; with --follow one "
                        "object per sample per line")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="seconds between samples (default 1)")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S",
                        help="--once: how long to wait for the nodes (default 20)")
    parser.add_argument("--nodes", metavar="A,B", help="only these nodes (default all)")
    parser.add_argument("--in-run", action="store_true",
                        help="judge utilisation and memory as during a training run (seed 6.1)")
    parser.add_argument("--simulate", metavar="FIXTURE", type=Path, nargs="?",
                        const=SIMULATION_FIXTURE,
                        help="replay an nvml.json fixture's load series instead of real GPUs, labelled "
                        "SIMULATED (default: the H200 readings shipped with svconsole)")
    parser.add_argument("--sim-gpus", type=int, default=8, metavar="N",
                        help="GPUs per node with --simulate (default 8)")
    parser.set_defaults(func=handler)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(obj), default=str)) if obj is not None else None


def node_record(collector: Any, now: float) -> dict:
    """What the command reports for one node."""
    s = collector.latest
    age = collector.age(now)
    return {
        "status": collector.status.value, "reason": collector.reason,
        "age_s": None if age is None else round(age, 3),
        "source": s.source if s else None, "simulated": bool(s and s.simulated),
        "no_gpu": bool(s and s.no_gpu), "no_gpu_reason": s.reason if s else None,
        "host": _jsonable(s.host) if s else None,
        "gpus": [_jsonable(g) for g in s.gpus] if s else [],
        "errors": s.errors if s else {},
    }


def _fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def render_text(records: dict[str, dict], ov: Any) -> str:
    """The human table: a line per node, a line per GPU, then the overview."""
    out = []
    width = max((len(n) for n in records), default=4)
    for name, r in records.items():
        head = f"{name:<{width}}  {r['status']:<8} {_fmt(r['age_s'], ' s', 1):>7}"
        if r["simulated"]:
            head += "  SIMULATED"
        elif r["source"]:
            head += f"  {r['source']}"
        if r["no_gpu"]:
            head += f"  no GPU: {r['no_gpu_reason']}"
        elif r["reason"]:
            head += f"  {r['reason']}"
        out.append(head)
        for g in r["gpus"]:
            procs = " ".join(f"{p['pid']}({(p['cmd'] or '?')[:30]})" for p in g["procs"])
            out.append(
                f"  GPU{g['index']} {g['name'] or '?'}  util {_fmt(g['util_gpu'], '%'):>4}"
                f"  mem {_fmt(g['mem_used_mb'])}/{_fmt(g['mem_total_mb'])} MiB"
                f"  {_fmt(g['temp_c'], ' C')}  {_fmt(g['power_w'])}/{_fmt(g['power_limit_w'])} W"
                + (f"  throttle {','.join(g['throttle'])}" if g["throttle"] else "")
                + (f"  {procs}" if procs else ""))
    hottest = (f", hottest {ov.hottest.node} GPU{ov.hottest.index} {ov.hottest.temp_c:.0f} C"
               if ov.hottest else "")
    out.append(f"{ov.gpus_in_use}/{ov.gpus_total} GPUs in use, mean util {_fmt(ov.mean_util, '%')}, "
               f"{ov.total_power_w:.0f} W{hottest}; {ov.nodes_live}/{ov.nodes_total} nodes live"
               + ("  [SIMULATED]" if ov.simulated else ""))
    for a in ov.alarms:
        out.append(f"  {a.verdict.level.value.upper()} {a.node} GPU{a.index} {a.metric} "
                   f"{_fmt(a.value, '%')}: {a.verdict.advice}")
    return "\n".join(out)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.gpu.telemetry import Telemetry, TelemetryUpdate

    if args.interval <= 0:
        print("svconsole gpus: --interval must be > 0", file=sys.stderr)
        return EXIT_USAGE
    if args.simulate is not None and not args.simulate.is_file():
        print(f"svconsole gpus: --simulate {args.simulate}: no such file", file=sys.stderr)
        return EXIT_USAGE
    cluster = ctx.cluster
    nodes = args.nodes.split(",") if args.nodes else cluster.names()
    unknown = [n for n in nodes if n not in cluster.names()]
    if unknown:
        print(f"svconsole gpus: --nodes: unknown node(s) {', '.join(unknown)} "
              f"(the cluster has {', '.join(cluster.names())})", file=sys.stderr)
        return EXIT_USAGE
    tel = Telemetry(ctx.pool, cluster, interval=args.interval, nodes=nodes,
                    simulate=args.simulate, sim_gpus=args.sim_gpus)
    changed = threading.Event()
    lock = threading.Lock()

    def on_update(update: TelemetryUpdate) -> None:
        if args.follow and args.json and update.sample is not None:
            line = json.dumps({"node": update.node, **node_record(tel.collectors[update.node], time.time())})
            with lock:
                print(line, file=ctx.out, flush=True)
        changed.set()

    def answered() -> dict[str, bool]:
        return {n: c.latest is not None for n, c in tel.collectors.items()}

    tel.subscribe(on_update)
    tel.start()
    try:
        if args.follow:
            while True:
                time.sleep(args.interval)
                if not args.json:
                    records = {n: node_record(c, time.time()) for n, c in tel.collectors.items()}
                    print(render_text(records, tel.overview(in_run=args.in_run)) + "\n",
                          file=ctx.out, flush=True)
        deadline = time.monotonic() + args.timeout
        while not all(answered().values()) and time.monotonic() < deadline:
            changed.wait(0.1)
            changed.clear()
        now = time.time()
        records = {n: node_record(c, now) for n, c in tel.collectors.items()}
        ov = tel.overview(in_run=args.in_run)
    finally:
        tel.stop()
    for n, ok in answered().items():
        if not ok:
            records[n]["reason"] = records[n]["reason"] or f"no sample within {args.timeout:g} s"
    if args.json:
        print(json.dumps({"nodes": records, "overview": _jsonable(ov)}, indent=2), file=ctx.out)
    else:
        print(render_text(records, ov), file=ctx.out)
    return EXIT_OK if all(answered().values()) else EXIT_FAILED
