"""``svconsole verify``: measure the cluster environment (the seed's section 7.1, step 3).

Latency between every pair of nodes (TCP round trips, judged against the seed's RDMA target of
< 20 us), all_reduce bus bandwidth over torch.distributed (NCCL with GPUs, gloo without), iperf3
throughput when installed, a GPU burn-in (TFLOP/s per GPU, slow GPUs flagged) and shared
storage throughput from every node at once. Exit code 1 when a measurement failed.
"""

from __future__ import annotations

import argparse

from console.cli import Context
from console.commands.setup import add_selection, execute, split, usage


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="measure latency, collective bandwidth, GPUs and shared storage",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_selection(parser)  # --steps: latency, collective, iperf3, gpu-burnin, storage, master-port
    parser.add_argument("--dry-run", action="store_true", help="say what would run")
    parser.add_argument("--bench-mb", type=float, default=256.0,
                        help="all_reduce tensor size in MiB (default 256)")
    parser.add_argument("--bench-iters", type=int, default=10)
    parser.add_argument("--latency-count", type=int, default=1000,
                        help="round trips per node pair (default 1000)")
    parser.add_argument("--iperf-seconds", type=int, default=5)
    parser.add_argument("--burnin-seconds", type=float, default=5.0,
                        help="per GPU and dtype (default 5)")
    parser.add_argument("--storage-mb", type=int, default=1024,
                        help="MiB each node writes and reads on shared_dir (default 1024)")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from console.bringup.measure import MEASUREMENTS, STEPS
    from console.bringup.model import SetupOptions
    from console.bringup.runner import Runner

    known = MEASUREMENTS
    ids = split(args.steps) or [s.id for s in STEPS]
    unknown = [i for i in ids if i not in known]
    if unknown:
        return usage(f"unknown measurement(s) {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        options = SetupOptions(bench_mb=args.bench_mb, bench_iters=args.bench_iters,
                               latency_count=args.latency_count, iperf_seconds=args.iperf_seconds,
                               burnin_seconds=args.burnin_seconds, storage_mb=args.storage_mb)
        runner = Runner(ctx.pool, ctx.cluster, [known[i] for i in ids], state_dir=ctx.state_dir,
                        options=options, nodes=split(args.nodes), parallel=args.parallel)
    except ValueError as exc:
        return usage(str(exc))
    return execute(runner, args, ctx, confirm=False)
