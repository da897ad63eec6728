"""``svconsole logs RUN [--node N] [--follow]``: a training run's logs from the nodes.

Prints each node's log of the run (from where this run started in it: a resumed run appends to
the same file), each line prefixed with its node. ``--follow`` keeps following until the run
ends on every node (or Ctrl-C), surviving lost connections without losing or repeating a line.
Exit status: 0, 1 when a node's log could not be read, 2 unknown run or node.
"""

from __future__ import annotations

import argparse
import sys
import threading

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("logs", help="show or follow a training run's logs",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'latest'")
    parser.add_argument("--node", action="append", metavar="N",
                        help="only this node (repeatable; default: every node of the run)")
    parser.add_argument("--follow", "-f", action="store_true",
                        help="keep following until the run ends")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.training.follow import FollowError, LogFollower, read_run
    from console.training.runs import RunNotFound, resolve_run

    try:
        record = resolve_run(ctx.pool, ctx.state_dir, args.run)
        for name in args.node or []:
            record.node(name)
    except (RunNotFound, KeyError) as exc:
        print(f"svconsole logs: {exc.args[0] if isinstance(exc, KeyError) else exc}",
              file=sys.stderr)
        return EXIT_USAGE
    if not args.follow:
        try:
            for node, event in read_run(ctx.pool, record, nodes=args.node):
                print(f"{node}: {event.text}", file=ctx.out)
        except FollowError as exc:
            print(f"svconsole logs: {exc}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    lock = threading.Lock()

    def show(node: str, events: list) -> None:
        with lock:
            for event in events:
                print(f"{node}: {event.text}", file=ctx.out, flush=True)

    def notice(_node: str, text: str) -> None:
        print(f"svconsole logs: {text}", file=sys.stderr, flush=True)

    followers = [LogFollower(ctx.pool, record, n, on_events=show, on_notice=notice).start()
                 for n in record.nodes if not args.node or n.node in args.node]
    try:
        for follower in followers:
            follower.join()
    finally:
        for follower in followers:
            follower.stop()
    return EXIT_OK
