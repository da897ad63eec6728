"""``svconsole exec [--nodes a,b] [--timeout S] [--json] -- CMD``: run CMD on the nodes in parallel.

Output comes pdsh style, each line prefixed with ``node: `` as soon as it arrives (stderr lines
on stderr); a node that fails to run it gets a last line saying why. ``--json`` waits for all
nodes and prints ``{node: {exit, stdout, stderr, seconds, error}}``. Exit code 1 if any node
failed (non-zero exit, timeout, unreachable), 2 for an unknown node name.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "exec",
        help="run a command on the nodes in parallel",
        description="Run CMD on every node (or --nodes) through the shared SSH pool; output lines "
        "are prefixed with the node name as they arrive.",
    )
    parser.add_argument("--nodes", metavar="A,B", help="comma-separated node names (default: all)")
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds per node")
    parser.add_argument("--json", action="store_true",
                        help="print {node: {exit, stdout, stderr, seconds, error}} at the end")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD",
                        help="the command (words are joined with spaces, as ssh does)")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    ctx.check_writable("exec (it runs a command on the nodes)")
    words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not words:
        print("svconsole exec: no command given (svconsole exec -- CMD)", file=sys.stderr)
        return EXIT_USAGE
    command = " ".join(words)
    names = ctx.cluster.names()
    if args.nodes:
        wanted = [n.strip() for n in args.nodes.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"svconsole exec: unknown node(s) {', '.join(unknown)}; "
                  f"the cluster has {', '.join(names)}", file=sys.stderr)
            return EXIT_USAGE
        names = wanted
    if args.json:
        results = ctx.pool.run_all(command, nodes=names, timeout=args.timeout)
        print(json.dumps({n: {"exit": r.exit, "stdout": r.stdout, "stderr": r.stderr,
                              "seconds": round(r.seconds, 4), "error": r.error}
                          for n, r in results.items()}, indent=2), file=ctx.out)
        return EXIT_OK if all(r.ok for r in results.values()) else EXIT_FAILED
    return _follow(ctx, names, command, args.timeout)


def _follow(ctx: Context, names: list[str], command: str, timeout: float | None) -> int:
    """Stream every node's output, prefixed, as it arrives; EXIT_OK if every node succeeded."""
    lock = threading.Lock()
    pool = ctx.pool

    def emit(stream_out, text: str) -> None:
        with lock:
            print(text, file=stream_out, flush=True)

    def one(name: str) -> bool:
        started = time.monotonic()
        with pool.stream(name, command, stdin=b"", timeout=timeout) as stream:
            for line in stream:
                emit(ctx.out if line.fd == "out" else sys.stderr, f"{name}: {line.text}")
        if stream.error is not None:
            emit(sys.stderr, f"{name}: [failed after {time.monotonic() - started:.1f}s: "
                             f"{stream.error}]")
            return False
        if stream.exit != 0:
            emit(sys.stderr, f"{name}: [exit {stream.exit}]")
        return stream.exit == 0

    workers = max(1, min(len(names), ctx.cluster.ssh.max_parallel))
    with ThreadPoolExecutor(workers, thread_name_prefix="svconsole-exec") as executor:
        ok = list(executor.map(one, names))
    return EXIT_OK if all(ok) else EXIT_FAILED
