"""``svconsole runs [--json]``: the training runs of this cluster and how they stand.

Lists the runs this machine launched and any run alive on the nodes (launched from elsewhere:
found through its processes and its record in output_dir), newest first, with their state
(running, unknown, finished, failed, stopped, lost) derived from each node's part: running,
exited N, killed by signal N, unknown (node unreachable since ...) or lost (no process, no exit
file). A run is never shown running merely because a node could not be asked. Exit status 0.
"""

from __future__ import annotations

import argparse
import json
import time

from console.cli import EXIT_OK, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list training runs and their state",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    parser.add_argument("--live", action="store_true", help="only runs that are still running")
    parser.set_defaults(func=handler)


def confirm(ctx: Context, question: str) -> bool:
    """Ask ``question`` on the terminal; False without one (use --yes)."""
    if not ctx.interactive:
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.training.runs import find_runs

    statuses = find_runs(ctx.pool, ctx.state_dir, live_only=args.live)
    if args.json:
        print(json.dumps([s.to_dict() for s in statuses], indent=2), file=ctx.out)
        return EXIT_OK
    if not statuses:
        print("no runs (start one with svconsole launch)", file=ctx.out)
        return EXIT_OK
    for s in statuses:
        r = s.record
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created))
        nodes = "\n    ".join(f"{n}: {st.part}" for n, st in s.nodes.items())
        resumed = f"  (resumes {r.resumed_from})" if r.resumed_from else ""
        print(f"{r.id}  {s.state:<8}  {started}  {r.output_dir}{resumed}\n    {nodes}",
              file=ctx.out)
    return EXIT_OK
