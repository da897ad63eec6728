"""``svconsole nodes [--json]``: each node's SSH connection state, checked now.

Every node is probed in parallel through the pool (connect if needed, one round trip within the
cluster's ``connect_timeout``). The table shows the state (up, unreachable, auth failed, unknown
host key, host key changed), the round-trip time, the effective connection (``user@host:port via
jump1,jump2``: cluster.yaml, then ~/.ssh/config) with where its values came from, and the error
text. Exit code 0 only if every node is up. ``--json`` also carries each node's facts and readiness verdict (the probe of
``svconsole check``), unless ``--no-facts``.
"""

from __future__ import annotations

import argparse
import json

from console.cli import EXIT_FAILED, EXIT_OK, Context


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="show each node's connection state",
        description="Connect to every node (in parallel) and show its state, round-trip time and "
        "error. Exit code 0 only if all nodes are up.",
    )
    parser.add_argument("--json", action="store_true",
                        help="print {node: {host, port, state, error, rtt_ms, connection, via, "
                        "origins, facts, verdict, reasons, tier, stale, collected_at}} as JSON")
    parser.add_argument("--no-facts", action="store_true",
                        help="with --json: connection state only, no probe of the node's facts")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.ssh.pool import NodeState

    cluster = ctx.cluster
    statuses = ctx.pool.ping_all(deadline=cluster.ssh.connect_timeout)
    rows = {}
    sources = {}
    for node in cluster.nodes:
        status = statuses[node.name]
        endpoint = ctx.pool.endpoint(node.name)
        rows[node.name] = {
            "host": "local" if endpoint is None else endpoint.host,
            "port": None if endpoint is None else endpoint.port,
            "state": status.state.label,
            "error": status.reason,
            "rtt_ms": None if status.rtt is None else round(status.rtt * 1000, 2),
            **({} if endpoint is None else {k: v for k, v in endpoint.to_json().items()
                                            if k in ("connection", "user", "via", "origins")}),
        }
        sources[node.name] = "" if endpoint is None else endpoint.sources()
    if args.json:
        if not args.no_facts:
            from console.commands.check import facts_json

            inventory = facts_json(ctx.pool, cluster, ctx.state_dir)
            for name, row in rows.items():
                row.update(inventory["nodes"].get(name, {}))
        print(json.dumps(rows, indent=2), file=ctx.out)
    else:
        width = max(len(name) for name in rows)
        for name, row in rows.items():
            where = row.get("connection", "local")
            rtt = "" if row["rtt_ms"] is None else f"{row['rtt_ms']:.1f} ms"
            line = f"{name:<{width}} {row['state']:<16} {rtt:>9}  {where}"
            print(f"{line}  {row['error']}".rstrip(), file=ctx.out)
            if sources[name]:
                print(f"{'':<{width}}   ({sources[name]})", file=ctx.out)
    up = sum(s.state == NodeState.UP for s in statuses.values())
    return EXIT_OK if up == len(statuses) else EXIT_FAILED
