"""Collective bandwidth benchmark, run on every node at once by ``svconsole verify``.

Each node starts one process per local GPU (NCCL) or one CPU process (gloo) and joins a
torch.distributed group through ``tcp://MASTER:PORT``; all ranks all_reduce a large float32
tensor several times. Global rank 0 prints one line::

    SVBENCH {"backend": "nccl", "world_size": 16, "size_bytes": ..., "seconds": ...,
             "algbw_gbps": ..., "busbw_gbps": ...}

Bus bandwidth follows nccl-tests: busbw = algbw * 2 (n - 1) / n for all_reduce, where algbw is
the tensor size divided by the time of one all_reduce. Bandwidths are in GB/s (1e9 bytes).
Any rank that fails prints ``SVBENCH-ERROR <text>`` and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--nproc", type=int, default=0,
                   help="processes on this node (default: one per GPU, or 1 without GPUs)")
    p.add_argument("--size-mb", type=float, default=256.0, help="tensor size in MiB")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to join the group")
    return p.parse_args(argv)


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """all_reduce bus bandwidth from algorithm bandwidth (nccl-tests' factor 2(n-1)/n)."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else algbw


def worker(local_rank: int, args: argparse.Namespace, backend: str, nproc: int) -> None:
    import torch
    import torch.distributed as dist

    rank = args.node_rank * nproc + local_rank
    world = args.nnodes * nproc
    try:
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend, init_method=f"tcp://{args.master_addr}:{args.master_port}",
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=args.timeout))
        numel = int(args.size_mb * (1 << 20)) // 4
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        sync()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor)
        sync()
        seconds = (time.perf_counter() - started) / args.iters
        size = numel * 4
        algbw = size / seconds / 1e9
        if rank == 0:
            print("SVBENCH " + json.dumps({
                "backend": backend, "world_size": world, "nnodes": args.nnodes,
                "nproc_per_node": nproc, "size_bytes": size, "iters": args.iters,
                "seconds": seconds, "algbw_gbps": algbw,
                "busbw_gbps": bus_bandwidth(algbw, world),
                "device": torch.cuda.get_device_name(local_rank) if backend == "nccl" else "cpu",
            }), flush=True)
        dist.destroy_process_group()
    except Exception as exc:
        print(f"SVBENCH-ERROR rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(f"SVBENCH-ERROR torch is not installed for {sys.executable}", flush=True)
        return 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl" and not gpus:
        print("SVBENCH-ERROR nccl asked for, but no CUDA GPU is visible", flush=True)
        return 1
    nproc = args.nproc or (gpus if backend == "nccl" else 1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if nproc == 1:
        worker(0, args, backend, 1)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, backend, nproc), nprocs=nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
