"""``svconsole plan [RUN] [--json]``: the resource planner (the guide's 7.2).

With a RUN (id, unique prefix or 'latest'): the time per epoch and the ETA with a 90 % band,
from the run's own step lines (validation and checkpoint saves measured at each epoch end), and
the storage its output_dir will need when it ends (checkpoints kept keep_nbest_models deep,
the averaged model, logs) against the free space of shared_dir, measured on the master.

Without a RUN, for a planned run: the guide's table of cluster sizes beside this cluster's
measured throughput from its latest run that logged steps (a short trial run is enough), if
there is one. Exit status: 0, 1 when the storage will not hold, 2 unknown run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="ETA and storage of a run, or a planned run",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run", metavar="RUN", nargs="?",
                        help="run id, unique prefix, or 'latest' (none: a planned run)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=handler)


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = max(0, int(round(s)))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def run_plan(ctx: Context, record: Any) -> dict[str, Any]:
    from console.training.follow import read_run
    from console.training.planner import estimate_storage, estimate_time

    events = [e for _node, e in read_run(ctx.pool, record)]
    estimate = estimate_time(events)
    train_conf = (record.profile or {}).get("train_conf", {}) or {}
    max_epoch = int(train_conf.get("max_epoch") or (estimate.max_epoch if estimate else 1))
    storage = estimate_storage(ctx.pool, record.master, record.output_dir,
                               ctx.cluster.shared_dir,
                               keep_nbest=int(train_conf.get("keep_nbest_models") or 5),
                               max_epoch=max_epoch)
    return {"run": record.id, "time": estimate.to_dict() if estimate else None,
            "storage": storage.to_dict()}


def planned(ctx: Context) -> dict[str, Any]:
    from console.training.follow import read_run
    from console.training.planner import GUIDE_TABLE, estimate_time
    from console.training.runs import find_runs

    trial = None
    for status in find_runs(ctx.pool, ctx.state_dir):
        try:
            estimate = estimate_time(e for _n, e in read_run(ctx.pool, status.record))
        except Exception:  # noqa: BLE001 - an unreadable old run is no trial
            continue
        if estimate is not None:
            ranks = max(1, len(status.record.plan.get("nodes", [])))
            trial = {"run": status.record.id, "step_s": estimate.step_s,
                     "epoch_s": estimate.epoch_s, "steps_per_epoch": estimate.steps_per_epoch,
                     "nodes": ranks}
            break
    return {"guide": [row.__dict__ for row in GUIDE_TABLE], "trial": trial,
            "cluster": {"name": ctx.cluster.name, "nodes": len(ctx.cluster.nodes)}}


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.training.runs import RunNotFound, resolve_run

    if args.run is None:
        doc = planned(ctx)
        if args.json:
            print(json.dumps(doc, indent=2), file=ctx.out)
            return EXIT_OK
        print("the guide's 7.2 table:", file=ctx.out)
        for row in doc["guide"]:
            print(f"  {row['name']:<9} {row['nodes']} node(s)  {row['gpus']:<8} "
                  f"{row['days']:<10} storage {row['storage']}", file=ctx.out)
        t = doc["trial"]
        c = doc["cluster"]
        if t is None:
            print(f"{c['name']} ({c['nodes']} node(s)): no run has logged steps yet; a short "
                  "trial run measures this cluster's throughput", file=ctx.out)
        else:
            print(f"{c['name']} ({c['nodes']} node(s)), measured by run {t['run']}: "
                  f"{t['step_s']:.2f} s/step, {_duration(t['epoch_s'])} per epoch of "
                  f"{t['steps_per_epoch']} steps", file=ctx.out)
        return EXIT_OK
    try:
        record = resolve_run(ctx.pool, ctx.state_dir, args.run)
    except RunNotFound as exc:
        print(f"svconsole plan: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = run_plan(ctx, record)
    storage = doc["storage"]
    if args.json:
        print(json.dumps(doc, indent=2), file=ctx.out)
    else:
        t = doc["time"]
        if t is None:
            print(f"run {record.id}: no timed step lines yet", file=ctx.out)
        else:
            print(f"run {record.id}: step {t['steps_done']}/{t['steps_total']} "
                  f"({t['fraction']:.0%}), {t['step_s']:.2f} s/step, "
                  f"{_duration(t['epoch_s'])} per epoch", file=ctx.out)
            print(f"  ETA {_duration(t['eta_s'])} (90%: {_duration(t['eta_low_s'])} to "
                  f"{_duration(t['eta_high_s'])})", file=ctx.out)
            for note in t["notes"]:
                print(f"  note: {note}", file=ctx.out)
        for finding in storage["findings"]:
            print(f"  storage: {finding}", file=ctx.out)
        if storage["projected_bytes"] is not None:
            print(f"  storage: {storage['used_bytes'] / 1e6:.0f} MB now, about "
                  f"{storage['projected_bytes'] / 1e6:.0f} MB at the end; "
                  f"{(storage['free_bytes'] or 0) / 1e9:.1f} GB free on "
                  f"{storage['shared_dir']}", file=ctx.out)
    return EXIT_FAILED if storage["fits"] is False else EXIT_OK
