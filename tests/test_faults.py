"""console.training.faults: the catalog finds the real H200 failures, realistic lines of the others, and
the configs that fail; the detectors judge real readings."""

from __future__ import annotations

import csv
import json
import math
import re
from datetime import datetime
from pathlib import Path

import pytest

from console.training.faults import (
    CATALOG,
    LossWatch,
    Severity,
    config_incompatibilities,
    fault,
    grad_sync_verdict,
    low_gpu_util,
    match_line,
    scan_lines,
    stalled_ranks,
    version_tuple,
)

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "logs"
SMI_CSV = FIXTURES / "h200" / "nvidia-smi-during-funasr-training.csv"

#: The guide's DeepSpeed config (seed section 4.1).
SEED_DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 100,
    "gradient_clipping": 5, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 1, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": 5e8, "contiguous_gradients": True},
}


def lines_of(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines()


def test_catalog_is_data_and_complete() -> None:
    ids = [f.id for f in CATALOG]
    assert len(ids) == len(set(ids))
    for f in CATALOG:
        assert f.title and f.advice and isinstance(f.severity, Severity)
        assert f.signatures or f.detector or f.config_trigger, f.id
        for s in f.signatures:
            re.compile(s)
    assert {"connection-reset", "connection-timeout", "nccl-watchdog-timeout", "cuda-oom",
            "host-oom-kill", "module-not-found", "deepspeed-batch-assertion",
            "bf16-dtype-mismatch", "fusedadam-jit-arch", "node-unreachable", "loss-divergence",
            "stalled-rank", "slow-gradient-sync", "low-gpu-util"} <= set(ids)
    assert "bf16" in fault("cuda-oom").advice and "batch" in fault("cuda-oom").advice
    with pytest.raises(KeyError):
        fault("no-such-fault")


def test_real_bf16_dtype_failure() -> None:
    lines = lines_of("funasr-sensevoicesmall-zero1-bf16-dtype-failure.log")
    found = scan_lines(lines, node="gpu-node-1")
    assert [f.id for f in found] == ["bf16-dtype-mismatch", "job-failed"]  # cause first
    f = found[0]
    assert (f.node, f.rank, f.severity) == ("gpu-node-1", 0, Severity.ERROR)
    assert lines[f.line_no - 1] == f.evidence[0]
    assert f.evidence == ("[rank0]: RuntimeError: mat1 and mat2 must have the same dtype, "
                          "but got Float and BFloat16",)
    assert "fp32" in f.fault.advice
    d = f.to_dict()
    assert json.loads(json.dumps(d)) == d and d["line"] == f.line_no


def test_real_fusedadam_jit_failure() -> None:
    lines = lines_of("deepspeed-fusedadam-jit-failure.log")
    found = scan_lines(lines, node="h200", rank=None, start_line=1)
    assert found[0].id == "fusedadam-jit-arch"
    assert found[0].rank == 0 and lines[found[0].line_no - 1].endswith("'0a'")
    assert "torch_adam" in found[0].fault.advice


@pytest.mark.parametrize("name", ["funasr-sensevoicesmall-zero1-fp32-bs6000.log",
                                  "deepspeed-zero1-bf16-run.log"])
def test_real_healthy_runs_have_no_findings(name: str) -> None:
    assert scan_lines(lines_of(name)) == []


# Lines as the tools print them (messages from torch, NCCL, Python, the kernel, DeepSpeed).
REALISTIC = {
    "connection-reset": "[rank3]: ConnectionResetError: [Errno 104] Connection reset by peer",
    "connection-timeout": "[rank1]: torch.distributed.DistNetworkError: The client socket has "
                          "timed out after 900000ms while trying to connect to (10.0.0.1, 29500).",
    "nccl-watchdog-timeout": "[rank2]:[E1130 10:11:12.000000 4321 ProcessGroupNCCL.cpp:632] "
                             "[Rank 2] Watchdog caught collective operation timeout: "
                             "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                             "Timeout(ms)=600000) ran for 600016 milliseconds before timing out.",
    "cuda-oom": "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                "GPU 0 has a total capacity of 139.81 GiB of which 1.02 GiB is free.",
    "host-oom-kill": "E1130 10:11:12.000000 1326 torch/distributed/elastic/multiprocessing/api.py:"
                     "986] failed (exitcode: -9) local_rank: 2 (pid: 4242) of binary: /opt/venv/"
                     "bin/python",
    "module-not-found": "[rank5]: ModuleNotFoundError: No module named 'funasr'",
    "node-unreachable": "ssh: connect to host 10.0.0.7 port 22: No route to host",
    "loss-divergence": "[2026-11-30 01:00:00,000][root][INFO] - train, rank: 1, epoch: 0/3, "
                       "data_slice: 0/1, step_in_slice: 5/30, step_in_epoch: 5, total step: 5, "
                       "(loss_avg_rank: nan), (loss_avg_slice: nan), (ppl_avg_slice: nan), "
                       "(acc_avg_slice: 0.000), (lr: 6.000e-04)",
}


@pytest.mark.parametrize("fault_id", sorted(REALISTIC))
def test_realistic_lines(fault_id: str) -> None:
    line = REALISTIC[fault_id]
    found = scan_lines(["[2026-11-30 01:00:00,000][root][INFO] - fine", line], node="n3")
    assert [f.id for f in found] == [fault_id]
    assert found[0].line_no == 2 and found[0].evidence == (line,)


def test_errno_110_and_rank_from_prefix() -> None:
    found = scan_lines(["[rank4]: TimeoutError: [Errno 110] Connection timed out"], node="n1")
    assert [(f.id, f.rank, f.node) for f in found] == [("connection-timeout", 4, "n1")]


def test_repeated_matches_make_one_finding_per_rank() -> None:
    line = "[rank{r}]: ConnectionResetError: [Errno 104] Connection reset by peer"
    lines = [line.format(r=r % 2) for r in range(10)]
    found = scan_lines(lines)
    assert [(f.rank, f.count, len(f.evidence), f.line_no) for f in found] == [
        (0, 5, 5, 1), (1, 5, 5, 2)]


def test_deepspeed_batch_assertion_real_message() -> None:
    config = pytest.importorskip("deepspeed.runtime.config")
    with pytest.raises(AssertionError) as err:
        config.DeepSpeedConfig({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 1})
    line = f"[rank0]: AssertionError: {err.value}"
    assert [f.id for f in scan_lines([line])] == ["deepspeed-batch-assertion"]


def test_no_false_alarms_on_ordinary_lines() -> None:
    for line in ("[2026-11-30 00:15:51,952][root][INFO] - total_num of samplers: 1200",
                 "errno 1100 is not a thing", "loss_avg_rank: 0.110",
                 "[Rank 0] time (ms) | fwd: 110.00 | bwd: 110.00"):
        assert match_line(line) == [], line


# --- config incompatibilities ---------------------------------------------------------------

def test_seed_bf16_config_with_funasr_1_4_16() -> None:
    found = config_incompatibilities(SEED_DS_CONFIG, {"funasr": "1.4.16", "deepspeed": "0.19.8"})
    assert [f.id for f in found] == ["bf16-dtype-mismatch"]
    assert found[0].evidence == ("bf16.enabled = True",) and found[0].detail == "funasr 1.4.16"


def test_fp32_config_and_other_versions() -> None:
    fp32 = {**SEED_DS_CONFIG, "bf16": {"enabled": False}}
    assert config_incompatibilities(fp32, {"funasr": "1.4.16"}) == []
    assert config_incompatibilities(SEED_DS_CONFIG, {"funasr": "1.3.26"}) == []
    unknown = config_incompatibilities(SEED_DS_CONFIG, {})
    assert [f.id for f in unknown] == ["bf16-dtype-mismatch"]
    assert "unknown" in unknown[0].detail


def test_bf16_on_old_gpus() -> None:
    v100 = config_incompatibilities(SEED_DS_CONFIG, {"funasr": "1.3.26", "compute_capability": "7.0"})
    assert [f.id for f in v100] == ["bf16-unsupported-gpu"]
    h200 = config_incompatibilities(SEED_DS_CONFIG, {"funasr": "1.3.26", "compute_capability": "9.0"})
    assert h200 == []


def test_fusedadam_trigger() -> None:
    adamw = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    hopper = {"deepspeed": "0.19.8", "compute_capability": "9.0"}
    assert [f.id for f in config_incompatibilities(adamw, hopper)] == ["fusedadam-jit-arch"]
    # the "9.0a" arch suffix is Hopper's: A100, V100 and CPU-only nodes do not hit it
    for cc in ({"compute_capability": "8.0"}, {"compute_capability": "7.0"}, {}):
        assert config_incompatibilities(adamw, {"deepspeed": "0.19.8", **cc}) == []
    torch_adam = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    assert config_incompatibilities(torch_adam, {"deepspeed": "0.19.8"}) == []
    assert config_incompatibilities({"optimizer": {"type": "SGD"}}, {}) == []
    assert config_incompatibilities({}, {}) == []


def test_version_tuple() -> None:
    assert version_tuple("1.4.16") == (1, 4, 16)
    assert version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert version_tuple("0.19.8rc1") == (0, 19, 8)


# --- detectors --------------------------------------------------------------------------------

REAL_LOSSES = [151.133, 168.796, 109.512, 103.310, 74.307, 115.400, 104.068, 101.023, 26.556,
               106.875, 42.288, 52.457, 25.928, 91.176, 73.152, 97.587, 79.417, 117.937]


def test_loss_watch_quiet_on_the_real_noisy_run() -> None:
    watch = LossWatch()
    assert [watch.observe(v) for v in REAL_LOSSES * 3] == [None] * 54


def test_loss_watch_flags_spike_and_nan() -> None:
    watch = LossWatch()
    for v in REAL_LOSSES:
        watch.observe(v)
    reason = watch.observe(1.139e14)
    assert reason and "1.139e+14" in reason and "median" in reason
    assert watch.observe(math.nan) == "loss is nan"
    assert watch.observe(-math.inf) == "loss is -inf"
    assert watch.observe(None) is None
    negative = LossWatch()
    for i in range(20):
        negative.observe(-5.0 - 0.1 * (i % 3))
    assert negative.observe(-4.0) is None and negative.observe(30.0) is not None


def test_grad_sync_thresholds_of_the_seed() -> None:
    assert [grad_sync_verdict(v) for v in (23.6, 499.9, 500.0, 2000.0, 2000.1, None, math.nan)] \
        == ["normal", "normal", "elevated", "elevated", "bad", "unknown", "unknown"]


def test_stalled_ranks() -> None:
    seen = {0: 1000.0, 1: 1000.0, 2: 700.0}
    assert stalled_ranks(seen, now=1010.0, threshold_s=120.0) == [2]
    assert stalled_ranks(seen, now=2000.0, threshold_s=120.0) == []  # all silent: a pause
    assert stalled_ranks({0: 0.0}, now=1000.0, threshold_s=1.0) == []


def _smi() -> tuple[list[float], list[float], list[float]]:
    t, util, mem = [], [], []
    with SMI_CSV.open() as f:
        for row in csv.reader(f, skipinitialspace=True):
            t.append(datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp())
            util.append(float(row[1]))
            mem.append(float(row[2]))
    return t, util, mem


def test_low_gpu_util_on_the_real_h200_run() -> None:
    t, util, mem = _smi()
    # while training held GPU memory (the FunASR process is on the GPU)
    during = [i for i, m in enumerate(mem) if m > 1000]
    verdict = low_gpu_util([t[i] for i in during], [util[i] for i in during])
    assert verdict is not None and verdict.low
    assert verdict.mean < 50 and verdict.fraction_below > 0.9 and verdict.seconds > 60
    assert "below 50%" in verdict.detail


def test_low_gpu_util_not_flagged_when_busy_or_short() -> None:
    t = [i * 0.5 for i in range(400)]
    assert not low_gpu_util(t, [85.0] * 400).low  # type: ignore[union-attr]
    short = low_gpu_util(t[:20], [10.0] * 20)
    assert short is not None and not short.low
    assert low_gpu_util([], []) is None
    with pytest.raises(ValueError):
        low_gpu_util([0.0, 1.0], [10.0])
