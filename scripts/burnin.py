"""Short GPU burn-in, run on each node by ``svconsole verify``.

On every visible GPU: repeated square matmuls in each dtype (bf16 where the GPU supports it,
fp32) for about ``--seconds`` per dtype, reporting TFLOP/s (2 n^3 per matmul) and any error.
Prints one line::

    SVBURN {"gpus": [{"index": 0, "name": "...", "tflops": {"bf16": 610.2, "fp32": 48.1},
                      "errors": []}], "note": ""}

Without a CUDA GPU it still prints the line, with ``"gpus": []`` and a note saying so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run_gpu(torch, index: int, size: int, seconds: float, dtypes: list[str]) -> dict:
    device = torch.device("cuda", index)
    result = {"index": index, "name": torch.cuda.get_device_name(index), "tflops": {},
              "errors": []}
    major, _minor = torch.cuda.get_device_capability(index)
    for dtype_name in dtypes:
        if dtype_name == "bf16" and major < 8:
            result["errors"].append("bf16 needs compute capability >= 8.0; skipped")
            continue
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
        try:
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
            torch.matmul(a, b)
            torch.cuda.synchronize(device)
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                for _ in range(4):
                    torch.matmul(a, b)
                count += 4
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - started
            result["tflops"][dtype_name] = 2 * size ** 3 * count / elapsed / 1e12
            if not torch.isfinite(torch.matmul(a[:64], b[:, :64])).all():
                result["errors"].append(f"{dtype_name}: non-finite results")
            del a, b
            torch.cuda.empty_cache()
        except Exception as exc:  # an Xid, OOM or ECC error is what a burn-in is for
            result["errors"].append(f"{dtype_name}: {type(exc).__name__}: {exc}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="per GPU and dtype")
    p.add_argument("--size", type=int, default=8192, help="matrix side")
    p.add_argument("--dtypes", default="bf16,fp32")
    args = p.parse_args(argv)
    report: dict = {"gpus": [], "note": ""}
    try:
        import torch
    except ImportError:
        report["note"] = f"torch is not installed for {sys.executable}: no burn-in"
        print("SVBURN " + json.dumps(report), flush=True)
        return 1
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        report["note"] = "no CUDA GPU visible on this node (torch.cuda.is_available() is False)"
        print("SVBURN " + json.dumps(report), flush=True)
        return 0
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for index in range(torch.cuda.device_count()):
        report["gpus"].append(run_gpu(torch, index, args.size, args.seconds, dtypes))
    print("SVBURN " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
