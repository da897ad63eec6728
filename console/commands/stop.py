"""``svconsole stop RUN [--yes] [--grace S] [--save-wait S | --now]``: stop a training run on
every node.

SIGTERM goes to every node's process group and to every process of the run (torchrun gives each
rank a session of its own); what is still alive after the grace period gets SIGKILL; then every
node is checked for leftovers. A node whose ranks are saving a checkpoint is signalled once the
save ends (at most --save-wait seconds; --now: at once), so that model.pt is whole for a resume.
Asks for confirmation unless ``--yes``. RUN is a run id, a unique prefix of one, or ``latest``.
Exit status: 0 stopped (or not running), 1 something is left or a node could not be reached,
2 unknown run or not confirmed.
"""

from __future__ import annotations

import argparse
import sys

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.commands.runs import confirm


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("stop", help="stop a training run on every node",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'latest'")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--grace", type=float, default=20.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL (default 20)")
    parser.add_argument("--save-wait", type=float, default=None, metavar="S",
                        help="seconds to wait for a checkpoint save in progress before the "
                             "SIGTERM (default 300)")
    parser.add_argument("--now", action="store_true",
                        help="do not wait for a checkpoint save in progress (model.pt may be "
                             "left cut short)")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.training.runs import SAVE_WAIT, RunNotFound, resolve_run, run_status, stop_run

    ctx.check_writable("stop")
    if args.now and args.save_wait is not None:
        print("svconsole stop: --now and --save-wait exclude each other", file=sys.stderr)
        return EXIT_USAGE

    try:
        record = resolve_run(ctx.pool, ctx.state_dir, args.run)
    except RunNotFound as exc:
        print(f"svconsole stop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    status = run_status(ctx.pool, record)
    if not status.live:
        print(f"run {record.id} is not running ({status.state})", file=ctx.out)
        return EXIT_OK
    nodes = ", ".join(n.node for n in record.nodes)
    if not args.yes and not confirm(ctx, f"Stop run {record.id} on {nodes}?"):
        print("not stopped: not confirmed (--yes)", file=sys.stderr)
        return EXIT_USAGE
    save_wait = 0.0 if args.now else SAVE_WAIT if args.save_wait is None else args.save_wait
    results = stop_run(ctx.pool, record, grace=args.grace, save_wait=save_wait)
    for node, r in results.items():
        if r.error:
            print(f"{node}: {r.error}", file=ctx.out)
            continue
        what = f"{len(r.terminated)} process(es) sent SIGTERM"
        if r.save_waited is not None:
            what = (f"checkpoint save in progress: STILL SAVING after {r.save_waited:g} s"
                    f"{' (nothing of it moved for a minute)' if r.save_stalled else ''}, "
                    "model.pt may be cut short (the resume's pre-flight checks it); "
                    if r.save_cut else
                    f"waited {r.save_waited:g} s for the checkpoint save in progress; ") + what
        if r.killed:
            what += f", {len(r.killed)} needed SIGKILL"
        left = f"; STILL ALIVE: {', '.join(map(str, r.remaining))}" if r.remaining else "; none left"
        print(f"{node}: {what}{left}", file=ctx.out)
    return EXIT_OK if all(r.ok for r in results.values()) else EXIT_FAILED
