"""``svconsole setup``: the guided bring-up, headless.

Runs the catalog's steps (build tools, NVIDIA driver, training env and package profile, NFS,
network tuning, NCCL env file, SSH trust, master port) on every node in dependency order, nodes
in parallel. Each step is skipped where its check says it is already done, so a second run
changes nothing and says so. ``--dry-run`` prints the exact commands per node and touches
nothing; ``--retry-failed`` reruns only what the last run left failed or blocked. Steps that
need root or change the system ask for confirmation, listing what they change, unless ``--yes``.

Logs: ``<state dir>/runs/<run-id>/<node>/<step>.log`` and ``summary.json``.
Exit code: 0 when every step is done (or already done), 1 when one failed, was blocked or needs
a reboot, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context

if TYPE_CHECKING:
    from console.bringup.model import SetupOptions
    from console.bringup.runner import Runner


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "setup",
        help="guided bring-up of the cluster (idempotent; --dry-run shows the commands)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_selection(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the exact commands per node; run nothing")
    parser.add_argument("--yes", action="store_true",
                        help="do not ask before steps that need root or change the system")
    parser.add_argument("--retry-failed", action="store_true",
                        help="rerun only what the last run left failed, blocked or needing a reboot")
    parser.add_argument("--list", action="store_true",
                        help="list the steps by phase and the package profiles with their pins")
    parser.add_argument("--profile", default="current",
                        help="package profile for the training env (see --list; default current)")
    parser.add_argument("--env-path", metavar="PATH",
                        help="training env directory ({node} is replaced by the node name; "
                             "default: from cluster.python)")
    parser.add_argument("--conda", action="store_true", help="make a conda env, not a venv")
    parser.add_argument("--find-links", metavar="DIR", help="pip --find-links directory")
    parser.add_argument("--no-index", action="store_true", help="pip --no-index (offline)")
    parser.add_argument("--driver", default="550",
                        help="NVIDIA server driver branch (nvidia-driver-N-server; default 550)")
    parser.set_defaults(func=handler)


def add_selection(parser: argparse.ArgumentParser) -> None:
    """--steps, --nodes, --json and --parallel, shared with ``svconsole verify``."""
    parser.add_argument("--steps", metavar="A,B", help="comma-separated step ids (see --list)")
    parser.add_argument("--nodes", metavar="A,B", help="comma-separated node names (default: all)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--parallel", type=int, metavar="N",
                        help="nodes worked on at once (default: ssh.max_parallel)")


def split(text: str | None) -> list[str] | None:
    return [w.strip() for w in text.split(",") if w.strip()] if text else None


def options_from(args: argparse.Namespace) -> SetupOptions:
    from console.bringup.model import SetupOptions
    from console.bringup.profiles import get_profile

    get_profile(args.profile)  # ValueError naming the known ones
    return SetupOptions(profile=args.profile, env_path=args.env_path,
                        env_kind="conda" if args.conda else "venv", find_links=args.find_links,
                        no_index=args.no_index, driver=args.driver)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.bringup.catalog import STEPS, get_steps
    from console.bringup.model import Phase
    from console.bringup.report import catalog_text
    from console.bringup.runner import Runner, load_summary, retry_selection

    if args.list:
        print(catalog_text(STEPS), file=ctx.out)
        return EXIT_OK
    if not args.dry_run:
        ctx.check_writable("setup apply (use --dry-run to see what it would do)")
    try:
        options = options_from(args)
        previous = only = None
        ids = split(args.steps)
        if args.retry_failed:
            previous = load_summary(ctx.state_dir)
            if previous is None:
                return usage(f"no earlier run under {ctx.state_dir}/runs to retry")
            ids, only = retry_selection(previous)
            if not ids:
                print(f"nothing to retry: run {previous.run_id} left nothing failed", file=ctx.out)
                return EXIT_OK
        steps = (get_steps(ids) if ids is not None
                 else [s for s in STEPS if s.phase != Phase.VERIFICATION])
        runner = Runner(ctx.pool, ctx.cluster, steps, state_dir=ctx.state_dir, options=options,
                        nodes=split(args.nodes), parallel=args.parallel, only=only,
                        previous=previous)
    except ValueError as exc:
        return usage(str(exc))
    return execute(runner, args, ctx, confirm=not args.yes)


def usage(message: str) -> int:
    print(f"svconsole: {message}", file=sys.stderr)
    return EXIT_USAGE


def execute(runner: Runner, args: argparse.Namespace, ctx: Context, *, confirm: bool) -> int:
    """Dry-run or run ``runner`` as the arguments say; print the outcome; the exit code."""
    from console.bringup.report import live_printer, plan_json, plan_text, summary_text

    if args.dry_run:
        planned = runner.dry_run()
        if args.json:
            print(json.dumps(plan_json(planned), indent=2), file=ctx.out)
        else:
            print(plan_text(planned), file=ctx.out)
        return EXIT_OK
    if confirm and not agreed(runner, ctx):
        return EXIT_FAILED
    if not args.json:
        for step in runner.steps:
            nodes = [n for (sid, n) in runner.cells if sid == step.id]
            if nodes:
                print(f"[{step.id}] on {', '.join(nodes)}: "
                      f"{step.changes(runner.cluster, runner.options)}", file=ctx.out)
        runner.subscribe(live_printer(ctx.out))
    summary = runner.run()
    if args.json:
        print(json.dumps(summary.to_json(), indent=2), file=ctx.out)
    else:
        print(summary_text(summary), file=ctx.out)
    return EXIT_OK if summary.ok else EXIT_FAILED


def agreed(runner: Runner, ctx: Context) -> bool:
    """Ask before steps that need root or change the system, listing what they change."""
    risky = [s for s in runner.steps
             if (s.needs_root or s.destructive) and any(k[0] == s.id for k in runner.cells)]
    if not risky:
        return True
    print("These steps need root or change the system:", file=sys.stderr)
    for step in risky:
        nodes = [n for (sid, n) in runner.cells if sid == step.id]
        print(f"  {step.id} on {', '.join(nodes)}: "
              f"{step.changes(runner.cluster, runner.options)}", file=sys.stderr)
    if not ctx.interactive:
        print("svconsole: not a terminal: add --yes to go ahead (or --dry-run to see the "
              "commands)", file=sys.stderr)
        return False
    answer = input("Go ahead? [y/N] ").strip().lower()
    return answer in ("y", "yes")
