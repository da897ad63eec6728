"""``svconsole check [--json] [--strict] [--preflight [--profile FILE] [--entry E] [--env K=V]]``:
is every node ready to train, and are they the same?

Probes every node in parallel (one round trip each: hardware, GPUs, the training Python and its
torch/NCCL/DeepSpeed/FunASR versions, shared_dir, network), places each node in the guide's
hardware tiers, compares the nodes, and prints a verdict per node and for the cluster with the
reasons. Nodes that cannot be reached are shown with their last known facts (from the facts cache
in the state directory) and count as not ready.

Exit code: 0 when the cluster is ready or degraded (1 for degraded with ``--strict``), 1 when it
is not ready.

``--preflight`` runs the launch's pre-flight instead, exactly as ``svconsole launch --dry-run``
does (the same checks and results: stack, master port free and reachable from every worker, peer
ports between every pair of nodes, output_dir the same storage everywhere, the interface to the
master, hostname resolution, the data lists' audio files on every node) and prints the plan and
every check; exit code 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from console.cli import EXIT_FAILED, EXIT_OK, Context

if TYPE_CHECKING:
    from console.cluster.inventory import Report
    from console.cluster.model import Cluster
    from console.ssh.pool import Pool

#: Columns of the node table: header and how wide.
COLUMNS = (("NODE", 10), ("HOST", 15), ("STATE", 12), ("GPUS", 22), ("DRIVER", 11),
           ("CUDA", 6), ("TORCH/DS/FUNASR", 26), ("TIER", 13), ("VERDICT", 9))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="readiness report of every node (exit 1 when the cluster is not ready)",
        description="Probe every node, judge its hardware tier, compare the nodes' GPU, driver "
        "and training stack versions, and print a verdict per node and for the cluster. "
        "Exit code 1 when the cluster is not ready.",
    )
    parser.add_argument("--json", action="store_true",
                        help="print the facts and the report as JSON")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 for a degraded cluster too")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="per node probe timeout (default 120)")
    parser.add_argument("--no-torch", action="store_true",
                        help="do not import torch on the nodes (faster; its CUDA and NCCL "
                             "versions stay unknown)")
    parser.add_argument("--preflight", action="store_true",
                        help="run the launch's pre-flight checks (as launch --dry-run)")
    parser.add_argument("--profile", metavar="FILE",
                        help="with --preflight: the training profile (default: training.yaml "
                             "beside cluster.yaml)")
    parser.add_argument("--entry", choices=("train_ds", "cpu-wrapper"),
                        help="with --preflight: train_ds (default) or cpu-wrapper")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="with --preflight: the run's extra environment (repeatable), e.g. "
                             "GLOO_SOCKET_IFNAME=eth0")
    parser.set_defaults(func=handler)


def preflight(args: argparse.Namespace, ctx: Context) -> int:
    """``check --preflight``: ``launch --dry-run``'s own handler, so both say the same."""
    from console.commands import launch

    # parsed by launch's own parser, so its options (and their defaults) can never drift
    parser = argparse.ArgumentParser(prog="svconsole")
    launch.register(parser.add_subparsers(dest="command"))
    argv = ["launch", "--dry-run"]
    argv += ["--profile", args.profile] if args.profile else []
    argv += ["--entry", args.entry] if args.entry else []
    for env in args.env or []:
        argv += ["--env", env]
    argv += ["--json"] if args.json else []
    return launch.handler(parser.parse_args(argv), ctx)


def collect(pool: Pool, cluster: Cluster, state_dir: Path | None = None,
            timeout: float | None = None, torch: bool = True) -> tuple[dict, Report]:
    """Probe every node (cached facts for the unreachable ones) and judge them."""
    from console.cluster.inventory import assess
    from console.cluster.probe import PROBE_TIMEOUT, TORCH_TIMEOUT, FactsCache, probe_all

    cache = FactsCache(state_dir, cluster.name) if state_dir is not None else None
    facts = probe_all(pool, cluster, cache=cache, timeout=timeout or PROBE_TIMEOUT,
                      torch_timeout=TORCH_TIMEOUT if torch else 0)
    return facts, assess(cluster, facts)


def facts_json(pool: Pool, cluster: Cluster, state_dir: Path | None = None,
               timeout: float | None = None, torch: bool = True) -> dict[str, Any]:
    """Facts and verdicts of every node, for ``svconsole nodes --json`` and ``check --json``:
    ``{"cluster", "verdict", "reasons", "mismatches", "nodes": {name: {"facts", "verdict",
    "reasons", "tier", "stale", "collected_at"}}}``."""
    return report_json(*collect(pool, cluster, state_dir, timeout, torch))


def report_json(facts: dict, report: Report) -> dict[str, Any]:
    """The report as JSON with each node's facts under ``nodes.<name>.facts``."""
    doc = report.to_json()
    for name, node in doc["nodes"].items():
        node["facts"] = facts[name].to_json()
    return doc


def _state(report_node: Any, now: float) -> str:
    from console.cluster.inventory import age_text

    f = report_node.facts
    if f.ok:
        return "up"
    if f.stale:
        return f"stale {age_text(f.age(now))}"
    return "unreachable"


def _row(cluster: Cluster, name: str, rep: Any, now: float) -> list[str]:
    from console.cluster.inventory import consistency_values

    f = rep.facts
    host = cluster.node(name).host if name in cluster.names() else "?"
    if not (f.ok or f.stale):
        return [name, host, _state(rep, now), "", "", "", "", "", rep.verdict.value]
    v = {k: "-" if x == "missing" else x for k, x in consistency_values(f).items()}
    gpus = f"{len(f.gpus)}x {v['gpu_model']}" if f.gpus else "none"
    stack = "/".join(v[k] for k in ("torch", "deepspeed", "funasr"))
    return [name, host, _state(rep, now), gpus, v["driver"], v["cuda"], stack,
            rep.tier.tier if rep.tier else "", rep.verdict.value]


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def render(cluster: Cluster, report: Report, out: TextIO, now: float | None = None) -> None:
    """The readiness report as text: one row per node, the cluster verdict, the reasons."""
    now = time.time() if now is None else now
    print(" ".join(f"{h:<{w}}" for h, w in COLUMNS).rstrip(), file=out)
    for name, rep in report.nodes.items():
        cells = _row(cluster, name, rep, now)
        print(" ".join(f"{_cell(c, w):<{w}}" for c, (_, w) in zip(cells, COLUMNS, strict=True))
              .rstrip(), file=out)
    print(f"\ncluster {report.cluster}: {report.verdict.value.upper()}", file=out)
    for reason in report.reasons:
        mark = {"ready": "note", "degraded": "warn", "not ready": "FAIL"}[reason.verdict.value]
        print(f"  [{mark}] {reason.message}", file=out)
    limits = [(n, r.tier) for n, r in report.nodes.items() if r.tier and r.tier.limited_by]
    if limits:
        print("\ntiers (field that sets each node's tier):", file=out)
        for name, tier in limits:
            print(f"  {name}: {tier.tier} (held by {', '.join(tier.limited_by)})", file=out)


def render_connections(pool: Pool, cluster: Cluster, out: TextIO) -> None:
    """Each node's effective SSH connection (user@host:port via jumps) and where it came from."""
    endpoints = {n: pool.endpoint(n) for n in cluster.names()}
    if not any(endpoints.values()):
        return
    print("\nConnections (cluster.yaml, then the ssh config):", file=out)
    width = max(map(len, endpoints))
    for name, endpoint in endpoints.items():
        if endpoint is None:
            print(f"  {name:<{width}}  local", file=out)
            continue
        print(f"  {name:<{width}}  {endpoint.describe()}", file=out)
        print(f"  {'':<{width}}    {endpoint.sources()}", file=out)
        if endpoint.error:
            print(f"  {'':<{width}}    cannot connect as configured: {endpoint.error}", file=out)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.cluster.inventory import Verdict

    if args.preflight:
        return preflight(args, ctx)

    facts, report = collect(ctx.pool, ctx.cluster, ctx.state_dir, args.timeout,
                            not args.no_torch)
    if args.json:
        doc = report_json(facts, report)
        for name, node in doc["nodes"].items():
            endpoint = ctx.pool.endpoint(name)
            node["connection"] = None if endpoint is None else endpoint.to_json()
        print(json.dumps(doc, indent=2), file=ctx.out)
    else:
        render(ctx.cluster, report, ctx.out)
        render_connections(ctx.pool, ctx.cluster, ctx.out)
    failing = {Verdict.NOT_READY} | ({Verdict.DEGRADED} if args.strict else set())
    return EXIT_FAILED if report.verdict in failing else EXIT_OK
