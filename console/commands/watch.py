"""``svconsole watch RUN|latest [--webhook URL] [--exec CMD]``: alerts for one run, headless.

Follows the run's logs and its nodes like the Training screen does, and sends an alert when a
fault of error severity is found, a rank stalls, a straggler persists, a node is down for longer
than the rules allow, and when the run ends: to alerts.log in the state directory, to the
webhooks and command hooks of cluster.yaml's ``alerts:`` section, and to those given here. Each
alert is sent once per kind, node and rank until it clears, then once more as resolved, under
the rate limit. Meant for tmux, nohup or a systemd unit.

A URL given as ``--webhook @FILE`` is read from FILE, which must be mode 0600 (a URL in argv
shows in ``ps``). Exit status: 0 the run finished, 1 it failed (or stopped, or was lost),
2 bad input or unknown run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("watch", help="send alerts for a run until it ends",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run", metavar="RUN", help="run id, unique prefix, or 'latest'")
    parser.add_argument("--webhook", action="append", default=[], metavar="URL",
                        help="POST each alert here (repeatable; @FILE reads the URL from a "
                             "private file)")
    parser.add_argument("--format", choices=("generic", "slack", "feishu"), default="generic",
                        help="payload of the --webhook URLs (default: generic JSON)")
    parser.add_argument("--exec", action="append", default=[], metavar="CMD",
                        help="run CMD with each alert as JSON on stdin (repeatable)")
    parser.add_argument("--interval", type=float, default=5.0, metavar="S",
                        help="seconds between evaluations (default 5)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not print each alert on stdout")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.alerts.rules import cli_webhooks, load_rules
    from console.alerts.sinks import CallbackSink, Dispatcher, sinks_for
    from console.alerts.watch import RunWatch
    from console.cluster.model import ClusterConfigError
    from console.training.runs import RunNotFound, resolve_run

    try:
        rules = load_rules(ctx.cluster)
        rules = rules.with_sinks(cli_webhooks(args.webhook, args.format, len(rules.webhooks)),
                                 tuple(args.exec))
    except (ClusterConfigError, ValueError) as exc:
        print(f"svconsole watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        record = resolve_run(ctx.pool, ctx.state_dir, args.run)
    except RunNotFound as exc:
        print(f"svconsole watch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sinks = sinks_for(rules, ctx.state_dir)
    if not args.quiet:
        out = ctx.out

        def show(alert):
            print(alert.summary, file=out, flush=True)

        sinks.append(CallbackSink(show))
    dispatcher = Dispatcher(sinks, rules.rate_limit)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"watching run {record.id} on {', '.join(n.node for n in record.nodes)}",
          file=ctx.out, flush=True)
    ctx.pool.start_health(interval=max(2.0, args.interval))
    try:
        end = RunWatch(ctx.pool, record, rules, dispatcher, interval=args.interval).run(stop)
    except KeyboardInterrupt:
        end = "interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous)
        dispatcher.close()
    for failure in dispatcher.failures():
        print(f"svconsole watch: alert not delivered: {failure}", file=sys.stderr)
    print(f"run {record.id}: {end}", file=ctx.out, flush=True)
    if end == "interrupted":
        return 130
    return EXIT_OK if end == "finished" else EXIT_FAILED
