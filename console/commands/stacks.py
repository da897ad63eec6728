"""``svconsole stacks RUN [--json] [--no-native] [--window S]``: who holds a hung run up.

Dumps the Python stack of every rank of the run on every node at once (py-spy; native frames
where it gives them), with each process's state (R, S, D, T, wchan) and CPU time over a window,
groups the ranks by their innermost frames and names the suspects: the ranks outside the
collective the others wait in, with why ("rank 1 on node2 is stopped (state T)"). The training is
never stopped for it. RUN is a run id, a unique prefix of one, or ``latest``. Exit status: 0 no
suspect, 1 suspects (or a node or rank that could not be seen), 2 unknown run.
"""

from __future__ import annotations

import argparse
import sys

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("stacks", help="stacks of every rank of a run: who is stuck",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'latest'")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-native", dest="native", action="store_false",
                        help="Python frames only (py-spy never attaches: --nonblocking)")
    parser.add_argument("--window", type=float, default=1.0, metavar="S",
                        help="seconds over which CPU time is measured (default 1)")
    parser.add_argument("--frames", type=int, default=8, metavar="N",
                        help="frames shown per group in the text report (default 8)")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.training.runs import RunNotFound, resolve_run
    from console.training.stacks import take_stacks

    try:
        record = resolve_run(ctx.pool, ctx.state_dir, args.run)
    except RunNotFound as exc:
        print(f"svconsole stacks: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = take_stacks(ctx.pool, record, window_s=args.window, native=args.native)
    if args.json:
        print(report.to_json(), file=ctx.out)
    else:
        print(report.text(frames=args.frames), file=ctx.out)
    if not report.ranks:
        print(f"svconsole stacks: no rank process of run {record.id} found on any node",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if report.suspects else EXIT_OK
