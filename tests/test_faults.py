"""console.training.faults: the catalog finds the real H200 failures, realistic lines of the others, and
the configs that fail; the detectors judge real readings."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.training.faults import (
    CATALOG,
    CONSEQUENCES,
    LossWatch,
    ScanContext,
    Severity,
    config_incompatibilities,
    fault,
    grad_sync_verdict,
    literal_prefix,
    low_gpu_util,
    match_line,
    scan_contexts,
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
            "stalled-rank", "slow-gradient-sync", "low-gpu-util", "master-port-unreachable",
            "peer-unreachable", "connection-refused", "port-in-use", "nccl-connect-failed",
            "nccl-system-error", "nccl-internal-error", "nccl-remote-error",
            "collective-mismatch", "unused-parameters", "checkpoint-world-size",
            "resume-checkpoint-missing", "data-audio-missing", "data-fields-missing",
            "data-empty", "dtype-mismatch", "loss-negative", "worker-exit",
            "job-failed"} <= set(ids)
    for f in CATALOG:
        for other in f.supersedes:
            fault(other)
    assert "bf16" in fault("cuda-oom").advice and "batch" in fault("cuda-oom").advice
    with pytest.raises(KeyError):
        fault("no-such-fault")


def test_real_bf16_dtype_failure() -> None:
    lines = lines_of("funasr-sensevoicesmall-zero1-bf16-dtype-failure.log")
    found = scan_lines(lines, node="gpu-node-1")
    # the cause first; the worker's exit and Hydra's failure carry it as evidence
    assert [(f.id, f.rank) for f in found] == [
        ("bf16-dtype-mismatch", 0), ("worker-exit", 0), ("job-failed", None)]
    cause = lines[134]
    assert found[1].evidence[0] == found[2].evidence[0] == cause
    assert "exit code 1" in found[1].detail and found[1].count == 2  # torchrun's line + summary
    assert found[2].line_no == 35  # Hydra's line comes before the traceback it reports
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


# --- faults as they really read (tests/fixtures/faults: see its README) ------------------------

FAULT_LOGS = FIXTURES / "faults"
#: The 3-node, 2-processes-per-node cluster the fixtures come from: node0 is the master.
HOSTS = {"10.99.0.1": "node0", "10.99.0.2": "node1", "10.99.0.3": "node2"}


def context(node: str = "node1", **kw: object) -> ScanContext:
    offset = {"node0": 0, "node1": 2, "node2": 4}[node]
    return ScanContext(node=node, rank_offset=offset, master_addr="10.99.0.1",
                       master_port=29500, hosts=HOSTS, **kw)  # type: ignore[arg-type]


#: fixture -> (node it was read on, extra context, [(fault id, rank, text in the detail)]).
CASES: dict[str, tuple[str, dict, list[tuple[str, int | None, str]]]] = {
    "host-oom-torchrun-sigkill.log": ("node1", {}, [
        ("host-oom-kill", 3, "exit code -9 (SIGKILL"),
        ("worker-exit", 2, "exit code -15 (SIGTERM"),  # stopped by torchrun: the OOM is the cause
        ("job-failed", None, "cause: E1201 09:14:02.532000")]),
    "host-oom-dataloader.log": ("node0", {}, [
        ("host-oom-kill", 1, "DataLoader worker killed by signal Killed"),
        ("worker-exit", 1, "cause: [rank1]: RuntimeError: DataLoader worker (pid 4711) is killed")]),
    "host-oom-errno12.log": ("node0", {}, [
        ("host-oom-kill", 0, "errno 12"), ("host-oom-kill", 1, "errno 12")]),
    "host-oom-deepspeed-launcher.log": ("node2", {}, [
        ("host-oom-kill", 5, "exit code -9")]),  # --local_rank=1 on node2 (ranks 4, 5)
    "port-in-use.log": ("node0", {}, [("port-in-use", None, "port 29500 (the master port)")]),
    "connect-timeout-master.log": ("node2", {}, [
        ("master-port-unreachable", None, "node0:29500 is the master port")]),
    "rendezvous-incomplete-master.log": ("node0", {}, [
        ("master-port-unreachable", None, "only 1 of 3 nodes reached the master's store "
                                          "(master_port 29500) in 901 s")]),
    "connect-timeout-peer-gloo.log": ("node2", {}, [
        ("peer-unreachable", 4, "10.99.0.2:41733 (node1) is a peer, not the master port")]),
    "connect-refused-peer-on-master.log": ("node1", {}, [
        ("peer-unreachable", 3, "10.99.0.1:38211 (node0) is a port on the master node other "
                                "than master_port 29500")]),
    "connection-reset.log": ("node0", {}, [
        ("connection-reset", 1, "10.99.0.3:24817 (node2) is a peer"),
        ("connection-reset", 0, "")]),
    "nccl-system-error.log": ("node1", {}, [
        ("nccl-connect-failed", 3, "10.99.0.3:43617 (node2) is a peer"),
        ("nccl-system-error", 3, "")]),
    "nccl-internal-remote.log": ("node0", {}, [
        ("nccl-internal-error", 0, ""), ("nccl-remote-error", 5, "")]),
    "collective-heartbeat-abort.log": ("node0", {}, [
        ("nccl-watchdog-timeout", 1, ""),
        ("worker-exit", 1, "exit code -6 (SIGABRT: the NCCL watchdog aborts")]),
    "collective-gloo-timeout-mismatch.log": ("node0", {}, [
        ("nccl-watchdog-timeout", 2, ""), ("collective-mismatch", 1, ""),
        ("unused-parameters", 0, "")]),
    "checkpoints.log": ("node0", {"resuming": True}, [
        ("checkpoint-world-size", 0, "saved with 4 data-parallel ranks, now 6"),
        ("resume-checkpoint-missing", 2, "no checkpoint at /data/shared/outputs/run1/model.pt")]),
    "data-empty.log": ("node0", {}, [
        ("data-empty", None, "0 samples in /data/shared/data/train.jsonl"), ("data-empty", 0, "")]),
    "data-fields-missing.log": ("node0", {}, [
        ("data-fields-missing", 1, "field 'target' missing")]),
    "data-audio-missing.log": ("node0", {}, [
        ("data-audio-missing", None, "missing: /data/shared/wav/utt0007.wav"),
        ("data-audio-missing", 1, "missing: /data/shared/wav/utt0008.wav")]),
    "worker-exits.log": ("node1", {}, [
        ("worker-exit", 2, "cause: [rank2]: ZeroDivisionError: division by zero; exit code 1"),
        ("worker-exit", 3, "exit code -11 (SIGSEGV)")]),  # a crash of its own: no other's cause
    "hydra-cause-before.log": ("node0", {}, [
        ("data-empty", None, ""),
        ("job-failed", None, "cause: RuntimeError: stack expects a non-empty TensorList")]),
}


def test_every_fixture_has_a_case() -> None:
    assert sorted(p.name for p in FAULT_LOGS.glob("*.log")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_faults_as_they_really_read(name: str) -> None:
    node, extra, expected = CASES[name]
    lines = (FAULT_LOGS / name).read_text(encoding="utf-8").splitlines()
    found = scan_lines(lines, context=context(node, **extra))
    assert [(f.id, f.rank) for f in found] == [(i, r) for i, r, _ in expected]
    for f, (_, _, detail) in zip(found, expected, strict=True):
        assert f.node == node and detail in f.detail, (f.id, f.detail)
        assert f.evidence and all(e for e in f.evidence)
        assert lines[f.line_no - 1] in " ".join(f.evidence) or f.evidence[0].startswith(
            lines[f.line_no - 1])


def test_the_same_logs_without_context_keep_what_the_text_says() -> None:
    """No master address known: connect failures keep their neutral entries; the ranks the
    text states itself (prefix, summary block, gloo's rank=) stay."""
    found = scan_lines((FAULT_LOGS / "connect-timeout-peer-gloo.log").read_text().splitlines())
    assert [(f.id, f.rank) for f in found] == [("connection-timeout", 4)]
    assert "10.99.0.2:41733" in found[0].detail
    found = scan_lines((FAULT_LOGS / "host-oom-torchrun-sigkill.log").read_text().splitlines())
    assert [(f.id, f.rank) for f in found][:2] == [("host-oom-kill", 3), ("worker-exit", 2)]


def test_connect_failure_never_blames_a_master_port_that_answered() -> None:
    line = "[rank3]: TimeoutError: [Errno 110] Connection timed out"
    neutral = scan_lines([line], context=context())
    assert [(f.id, f.rank) for f in neutral] == [("connection-timeout", 3)]
    assert "usually a firewall dropping the master port" not in neutral[0].fault.advice
    assert "master port" in neutral[0].fault.advice and "beyond it" in neutral[0].fault.advice
    assert "peer connection" in neutral[0].fault.advice
    reached = scan_lines([line], context=context(master_port_reachable=True))
    assert [f.id for f in reached] == ["peer-unreachable"]
    assert "master port answered" in reached[0].detail
    # the master's hostname instead of its address names the master port too
    by_name = scan_lines([(FAULT_LOGS / "connect-timeout-master.log").read_text().splitlines()[0]],
                         context=context("node2"))
    assert [f.id for f in by_name] == ["master-port-unreachable"]
    assert by_name[0].detail.startswith("node0:29500 is the master port")
    # the drill: only ssh and the master port open on node1: gloo's connect to it
    gloo = (FAULT_LOGS / "connect-timeout-peer-gloo.log").read_text().splitlines()
    found = scan_lines(gloo, context=context("node2", master_port_reachable=True))
    assert [f.id for f in found] == ["peer-unreachable"]
    assert "node1" in found[0].detail and "master-port" not in found[0].id


def test_ranks_from_local_rank_and_prefixes() -> None:
    ctx = context("node2")  # ranks 4 and 5
    lines = ["[default1]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "E1201 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:984] "
             "failed (exitcode: 3) local_rank: 0 (pid: 77) of binary: /opt/venv/bin/python",
             "[rank7]:[E1201 10:11:12.000000 4321 ProcessGroupNCCL.cpp:632] [Rank 7] Watchdog "
             "caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE)"]
    found = scan_lines(lines, context=ctx)
    assert sorted((f.id, f.rank) for f in found) == [
        ("cuda-oom", 5), ("nccl-watchdog-timeout", 7), ("worker-exit", 4)]
    assert all(f.node == "node2" for f in found)
    # the caller's rank wins over the text's
    assert [f.rank for f in scan_lines(lines[:1], rank=9, context=ctx)] == [9]


@pytest.mark.parametrize("ops", ["bf16", "half", "long"])
def test_dtype_mismatch_in_the_installed_torchs_words(ops: str) -> None:
    """The messages PyTorch itself raises now, for every op of FunASR's forward that mixes
    dtypes: matmul, linear, conv, scaled-dot-product attention, addmm, dot, a loss."""
    torch = pytest.importorskip("torch")
    other = {"bf16": torch.bfloat16, "half": torch.float16, "long": torch.int64}[ops]
    a = torch.ones(2, 2)
    b = torch.ones(2, 2, dtype=other)
    attempts = [
        lambda: torch.mm(a, b), lambda: torch.nn.functional.linear(a, b),
        lambda: torch.addmm(a, a, b), lambda: torch.dot(a[0], b[0]),
        lambda: torch.nn.functional.conv1d(torch.ones(1, 2, 4), torch.ones(2, 2, 1, dtype=other)),
        lambda: torch.nn.functional.scaled_dot_product_attention(
            torch.ones(1, 2, 2), torch.ones(1, 2, 2, dtype=other), torch.ones(1, 2, 2)),
        lambda: torch.nn.functional.mse_loss(a.requires_grad_(), b).backward(),
    ]
    messages = []
    for attempt in attempts:
        try:
            attempt()
        except (RuntimeError, TypeError) as exc:
            messages.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert len(messages) >= 4, messages
    for message in messages:
        found = scan_lines([f"[rank3]: {message}"], context=context())
        ids = [f.id for f in found]
        assert len(found) == 1 and found[0].rank == 3, message
        if ops == "bf16":
            assert ids == ["bf16-dtype-mismatch"] and "bf16" in found[0].detail, message
        elif ops == "half":
            assert ids == ["dtype-mismatch"] and "fp16" in found[0].detail, message
        else:
            assert ids == ["dtype-mismatch"] and found[0].detail == "", message


#: dtype wordings of CUDA kernels and older releases (torch's sources).
CUDA_DTYPE_LINES = {
    "expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16": "bf16",
    "Input type (CUDABFloat16Type) and weight type (torch.cuda.FloatTensor) should be the same":
        "bf16",
    "expected scalar type Half but found Float": "fp16",
    "Expected query, key, and value to have the same dtype, but got query.dtype: c10::Half "
    "key.dtype: float and value.dtype: float instead.": "fp16",
    "Found dtype Float but expected Half": "fp16",
    "Expected object of scalar type Float but got scalar type Half for argument #2 'mat2' in "
    "call to _th_mm": "fp16",
    "result type Float can't be cast to the desired output type Long": "",
}


@pytest.mark.parametrize("message", sorted(CUDA_DTYPE_LINES))
def test_dtype_mismatch_other_wordings(message: str) -> None:
    [f] = scan_lines([f"[rank2]: RuntimeError: {message}"])
    precision = CUDA_DTYPE_LINES[message]
    assert f.rank == 2 and f.id == ("bf16-dtype-mismatch" if precision == "bf16"
                                    else "dtype-mismatch")
    assert (precision in f.detail) if precision else f.detail == ""


def test_assertion_wrapped_over_lines_is_joined() -> None:
    """Rich tracebacks wrap a long message at the terminal's width; the parts are joined."""
    config = pytest.importorskip("deepspeed.runtime.config")
    with pytest.raises(AssertionError) as err:
        config.DeepSpeedConfig({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 1})
    import textwrap
    wrapped = textwrap.wrap(f"AssertionError: {err.value}", 48)
    assert len(wrapped) >= 3 and not any(match_line(w) for w in wrapped)  # no part alone
    lines = ["│ /opt/venv/lib/python3.11/site-packages/deepspeed/runtime/config.py:1000 in "
             "_batch_assertion │", *(f"[rank1]: {w}" for w in wrapped),
             "[rank1]: [W1201 10:00:00.000000 ProcessGroupNCCL.cpp:1575] Warning: destroy_process"]
    found = scan_lines(lines, context=context())
    assert [(f.id, f.rank, f.line_no) for f in found] == [("deepspeed-batch-assertion", 1, 2)]
    assert "micro_batch_per_gpu * gradient_acc_step" in found[0].evidence[0]
    # a generic failure after it carries the whole message as its cause
    lines.append("E1201 10:00:01.000000 1 torch/distributed/elastic/multiprocessing/api.py:984] "
                 "failed (exitcode: 1) local_rank: 1 (pid: 7) of binary: /opt/venv/bin/python")
    exit_ = [f for f in scan_lines(lines, context=context("node0")) if f.id == "worker-exit"]
    assert exit_[0].rank == 1 and "world_size 6 != 4 * 1 * 1" in exit_[0].evidence[0]


def test_cause_that_comes_after_hydras_line_is_attached() -> None:
    lines = ["Error executing job with overrides: ['++model=/m']",
             "[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/opt/venv/lib/python3.11/site-packages/funasr/bin/train_ds.py", '
             "line 225, in main",
             "[rank0]: RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is "
             "running collective: CollectiveFingerPrint(OpType=ALLREDUCE)"]
    found = scan_lines(lines)
    assert [(f.id, f.rank) for f in found] == [("collective-mismatch", 0), ("job-failed", None)]
    assert found[1].evidence == (lines[3], lines[0]) and found[1].line_no == 1


def test_a_loggers_error_line_before_hydras_failure_is_its_cause() -> None:
    lines = ["[2026-12-01 10:30:00,000][root][INFO] - Train epoch: 0, rank: 0",
             "[2026-12-01 10:30:01,000][root][ERROR] - tokenizer: token id 25100 outside the "
             "vocabulary (25055)",
             "Error executing job with overrides: ['++model=/m']"]
    [f] = scan_lines(lines)
    assert f.id == "job-failed" and f.evidence == (lines[1], lines[2])
    assert "cause: [2026-12-01 10:30:01,000][root][ERROR] - tokenizer" in f.detail


@pytest.mark.parametrize("prefix", ["[2026-11-30 01:00:00,000][root][INFO] - ", "", "INFO] - ",
                                    "[rank1]:", "[default1]: "])
def test_negative_and_non_finite_loss_with_rank_and_step(prefix: str) -> None:
    base = ("train, rank: 1, epoch: 0/3, data_slice: 0/1, step_in_slice: 5/30, "
            "step_in_epoch: {s}, total step: {s}, (loss_avg_rank: {v}), (loss_avg_slice: 1.0), "
            "(lr: 6.000e-04)")
    lines = [prefix + base.format(s=s, v=v) for s, v in ((5, "12.5"), (10, "-3.250"),
                                                          (15, "nan"), (20, "-inf"))]
    found = scan_lines(lines, node="n1")
    assert [(f.id, f.rank, f.step, f.line_no, f.count) for f in found] == [
        ("loss-divergence", 1, 15, 3, 2), ("loss-negative", 1, 10, 2, 1)]
    assert "step 10: loss -3.25" in found[1].detail and found[1].to_dict()["step"] == 10


def test_ordinary_lines_of_a_failing_run_are_not_faults() -> None:
    for line in ("W1201 09:14:02.118000 2190 torch/distributed/elastic/multiprocessing/api.py:1010] "
                 "Sending process 2212 closing signal SIGTERM",
                 "  exitcode  : 0 (pid: 1348)",
                 "[rank0]: No checkpoint found at '/out/model.pt', does not resume status!",
                 "[2026-12-01 10:10:00,000][root][INFO] - total_num of samplers: 1200, /d/t.jsonl",
                 "[rank0]: loading /data/wav/a.wav took 0.1 s",
                 "[2026-12-01 10:10:00,000][root][INFO] - (loss_avg_rank: 0.5), KeyError count: 0"):
        assert scan_lines([line]) == [], line


def test_literal_prefixes_never_hide_a_match() -> None:
    """The substring test before each regex is sound: on every fixture line and every real
    log line, a signature that matches contains its prefix."""
    lines = [line for p in (*FAULT_LOGS.glob("*.log"), *LOGS.glob("*.log"))
             for line in p.read_text(encoding="utf-8").splitlines()]
    for f in CATALOG:
        for s in f.signatures:
            prefix = literal_prefix(s)
            for line in lines:
                if re.search(s, line):
                    assert prefix in line, (f.id, s, line)
    assert literal_prefix(r"rrno:? ?110\b") == "rrno"
    assert literal_prefix(r"\(loss_avg_rank: -\d") == "(loss_avg_rank: -"
    assert literal_prefix(r"(?:a|b)c") == "" and literal_prefix(r"ab|cd") == ""
    assert literal_prefix(r"Signal 9 \(SIGKILL\)") == "Signal 9 (SIGKILL)"


# --- kernel evidence for a SIGKILL (console.training.evidence), on a loopback node ----------------

def test_oom_evidence_from_a_nodes_kernel_log(loopback) -> None:  # type: ignore[no-untyped-def]
    """A line written to the kernel log (/dev/kmsg, as root) is read back over SSH as the
    evidence of the killed pid; where the kernel log cannot be read, the evidence says why."""
    import os
    import uuid

    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool
    from console.training.evidence import killed_pid, oom_evidence, with_kernel_evidence

    marker = f"svconsole-test-{uuid.uuid4().hex[:8]}"
    pid = 4_190_000 + os.getpid() % 4000  # above any real pid here
    wrote = False
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<4>Out of memory: Killed process {pid} ({marker}) total-vm:1024kB, "
                       "anon-rss:512kB, file-rss:0kB\n")
        wrote = True
    except OSError:
        pass
    sigkill = scan_lines([f"  exitcode  : -9 (pid: {pid})"], node="node0")[0]
    assert sigkill.id == "host-oom-kill" and killed_pid(sigkill) == pid
    with Pool(load_cluster(loopback.cluster_yaml)) as pool:
        ev = oom_evidence(pool, "node0", pid=pid, sudo=False)
        if ev.readable:
            assert ev.source in ("dmesg", "journalctl -k") and ev.error is None
            if wrote:  # the killed pid's lines first (an earlier run may have used the pid)
                assert f"process {pid}" in ev.lines[0]
                assert any(marker in line for line in ev.lines)
            attached = with_kernel_evidence(sigkill, ev)
            assert attached.evidence[:1] == sigkill.evidence
            assert attached.evidence[1:] == ev.lines and "kernel log of node0" in attached.detail
        else:
            assert "dmesg" in ev.error and "journalctl" in ev.error  # type: ignore[operator]
        refused = oom_evidence(pool, "node0", sudo=False, readers=(
            ("dmesg", "dmesg --no-such-option 2>&1"),
            ("journalctl -k", "journalctl --no-such-option 2>&1")))
    assert not refused.readable and refused.lines == ()
    assert refused.error is not None and refused.error.startswith("dmesg: ")
    assert "; journalctl -k: " in refused.error
    assert "not readable" in refused.summary() and "node0" in refused.summary()


OOM_WORKER = """
import sys, time
print("worker up", flush=True)
held = []
while True:  # a step's allocations, written page by page, some kept (as a leak would)
    held.append(b"\\1" * (2 << 20))
    del held[:-8]
    time.sleep(0.05)
"""


def test_a_rank_killed_by_the_oom_killer_is_named_with_the_kernels_lines(loopback, tmp_path,
                                                                          monkeypatch):
    """A real OOM kill: the rank of a real torchrun on node1 is moved into a memory cgroup of
    16 MiB and the kernel kills it. The followed run's finding names node1 and rank 0 from
    torchrun's summary (exitcode -9), and the watch adds the kernel's own line for the pid
    (``Killed process PID``) without being asked."""
    import sys
    import time

    from oomkill import MemoryCage, needs_memory_cgroup
    from walk import rank_pid, run_pids, wait_until

    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool
    from console.training import runs
    from console.training.follow import RunFollower
    from console.training.launch import LaunchPlan, NodePlan, Preparation, launch
    from console.training.profile import default_profile

    needs_memory_cgroup()
    cluster = load_cluster(loopback.cluster_yaml)
    node = cluster.nodes[1]
    out = loopback.shared_dir / f"oom-{tmp_path.name}"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [torchrun, "--standalone", "--nproc-per-node", "1", "--no-python", sys.executable,
            "-c", OOM_WORKER]
    plan = LaunchPlan(runs.new_run_id(), cluster.name, node.name, node.host, 29500, str(out),
                      "train_ds", [], [NodePlan(node.name, node.host, 0, 1, argv,
                                                {"PYTHONUNBUFFERED": "1"}, str(out),
                                                f"{out}/logs/{node.name}.log")])
    with Pool(cluster) as pool:
        record = launch(pool, Preparation({}, plan, [], default_profile().replace(
            "output_dir", str(out))), tmp_path)
        follower = RunFollower(pool, record, interval=0.2)
        told: list[bool] = []  # per update: did the subscribers' findings hold the kernel line
        follower.subscribe(lambda update: told.append(any(
            "Killed process" in e for f in follower.store.findings() for e in f.evidence)))
        follower.start()
        try:
            wait_until(lambda: (Path(f"{out}/logs/{node.name}.log").exists() and "worker up" in
                                Path(f"{out}/logs/{node.name}.log").read_text()), 120,
                       "the worker up")
            pid = rank_pid(record.id, 0)
            with MemoryCage() as cage:
                cage.put(pid)
                killed_at = time.monotonic()

                def named():
                    return [f for f in follower.store.findings() if f.id == "host-oom-kill"
                            and any(f"Killed process {pid}" in e for e in f.evidence)]

                [found] = wait_until(named, 60, "the OOM finding with the kernel's line")
            named_s = time.monotonic() - killed_at
            assert (found.node, found.rank) == (node.name, 0), found
            assert f"(pid: {pid})" in found.evidence[0] or f"PID {pid}" in found.evidence[0]
            assert f"kernel log of {node.name} (" in found.detail and \
                f"Memory cgroup out of memory: Killed process {pid} (" in found.detail, found.detail
            print(f"OOM kill named in {named_s:.1f} s: {found.detail[:200]}")
            # the subscribers (the Training screen) are told, also after the run's end, when
            # no line would bring an update
            wait_until(lambda: any(told), 30, "an update with the kernel's line")
            assert follower.wait(60), "the run ended"
            told.clear()
            assert follower.stall_watch is not None
            follower.stall_watch.kernel_checked.clear()  # as if the read had come only now
            assert follower.gather_evidence() == 1 and told == [True], told
            # read once per rank: the next look does not ask the node again
            assert follower.gather_evidence() == 0
            # an operator who comes afterwards: `svconsole metrics RUN` has the kernel's word too
            from console.cli import main as cli_main
            out = tmp_path / "metrics.json"
            monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path))  # where it was launched
            assert cli_main(["--config", str(loopback.cluster_yaml), "metrics", record.id,
                             "--json", str(out)]) == 1
            [later] = [f for f in json.loads(out.read_text())["findings"]
                       if f["id"] == "host-oom-kill"]
            assert f"Memory cgroup out of memory: Killed process {pid} (" in later["detail"], later
        finally:
            follower.stop()
            if run_pids(record.id):
                runs.stop_run(pool, record, grace=1, save_wait=0)


def test_the_metrics_store_names_bad_losses_with_rank_and_step() -> None:
    """The store reads its lines through the scanner: a negative and a non-finite loss are
    findings with their rank and step, and a torchrun summary keeps its rank there too."""
    from console.training.logparse import parse_lines
    from console.training.metrics import MetricsStore

    base = ("[2026-11-30 01:00:00,000][root][INFO] - train, rank: {r}, epoch: 0/3, data_slice: "
            "0/1, step_in_slice: {s}/30, step_in_epoch: {s}, total step: {s}, (loss_avg_rank: "
            "{v}), (loss_avg_slice: 1.0), (lr: 6.000e-04)")
    lines = [base.format(r=r, s=s, v=v) for s, r, v in ((5, 0, "10.0"), (5, 1, "9.0"),
                                                         (10, 1, "-0.5"), (15, 0, "inf"))]
    lines += (FAULT_LOGS / "host-oom-torchrun-sigkill.log").read_text().splitlines()
    with MetricsStore() as store:
        store.add_all(parse_lines(lines), node="node1")
        found = {(f.id, f.rank): f for f in store.findings(now=0.0)}
    assert found[("loss-negative", 1)].step == 10
    assert found[("loss-divergence", 0)].step == 15
    assert "step 15: loss inf" in found[("loss-divergence", 0)].detail
    assert ("host-oom-kill", 3) in found and found[("host-oom-kill", 3)].node == "node1"


def test_a_rank_killed_reads_before_the_resets_it_brought_on_its_peers() -> None:
    """Seen in the TUI after a real OOM kill of rank 1 (the logs of that run, from its last
    step line on): node0 and node2 report "Connection reset by peer", node1's torchrun the
    SIGKILL. The Faults pane (and the end alert, which takes the first error) put the killed
    rank first, its peers' resets after it."""
    from console.training.logparse import parse_lines
    from console.training.metrics import MetricsStore

    plan = {"master_addr": "127.0.1.1", "master_port": 24987,
            "nodes": [{"node": f"node{i}", "host": f"127.0.1.{i + 1}", "node_rank": i,
                       "nproc": 1} for i in range(3)]}
    with MetricsStore() as store:
        store.scan_contexts = scan_contexts(plan)
        for i in range(3):
            text = (FAULT_LOGS / "oom-kill-3-nodes" / f"node{i}.log").read_text()
            store.add_all(parse_lines(text.splitlines()), node=f"node{i}")
        errors = [(f.id, f.node, f.rank) for f in store.findings(now=0.0)
                  if f.severity.value == "error"]
    assert errors[0] == ("host-oom-kill", "node1", 1), errors
    assert {("connection-reset", "node0", 0), ("connection-reset", "node2", 2)} <= set(errors)
    assert all(e[0] in CONSEQUENCES for e in errors[1:]), errors


def test_scan_contexts_from_a_launch_plan_give_global_ranks_and_roles() -> None:
    from console.training.launch import LaunchPlan, NodePlan
    from console.training.logparse import parse_lines
    from console.training.metrics import MetricsStore

    nodes = [NodePlan(node=f"node{i}", host=f"10.99.0.{i + 1}", node_rank=i, nproc=2, argv=[],
                      env={}, cwd="/", log=f"/out/node{i}.log") for i in (2, 0, 1)]
    plan = LaunchPlan(run_id="r1", cluster="c", master="node0", master_addr="10.99.0.1",
                      master_port=29500, output_dir="/out", entry=None,  # type: ignore[arg-type]
                      overrides=[], nodes=nodes)
    contexts = scan_contexts(plan.to_dict(), resuming=True)
    assert {n: c.rank_offset for n, c in contexts.items()} == {"node0": 0, "node1": 2, "node2": 4}
    assert contexts["node2"].hosts["10.99.0.2"] == "node1" and contexts["node1"].resuming
    lines = (FAULT_LOGS / "connect-timeout-peer-gloo.log").read_text().splitlines()
    lines.append("E1201 10:00:05.000000 1 torch/distributed/elastic/multiprocessing/api.py:984] "
                 "failed (exitcode: -9) local_rank: 1 (pid: 8812) of binary: /opt/venv/bin/python")
    with MetricsStore() as store:
        store.scan_contexts.update(contexts)
        store.add_all(parse_lines(lines), node="node2")
        found = {(f.id, f.rank): f for f in store.findings(now=0.0)}
    assert "node1" in found[("peer-unreachable", 4)].detail
    assert found[("host-oom-kill", 5)].node == "node2"


LIVE_FAILURES = r'''
import datetime, os, signal, socket, sys, traceback
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

def report(fn):
    try:
        fn()
    except Exception as exc:
        sys.stderr.write("".join(traceback.format_exception(exc)))
        sys.stderr.flush()

busy = socket.socket(); busy.bind(("127.0.0.1", 0)); busy.listen()
closed = socket.socket(); closed.bind(("127.0.0.1", 0)); port = closed.getsockname()[1]
closed.close()
print("PORTS", busy.getsockname()[1], port, flush=True)
report(lambda: dist.TCPStore("127.0.0.1", busy.getsockname()[1], 1, True,
                             timeout=datetime.timedelta(seconds=3)))
report(lambda: dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=1)))

class Dies(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGKILL)

report(lambda: list(DataLoader(Dies(), num_workers=1)))
'''


def test_failures_the_installed_torch_really_prints() -> None:
    """A taken port, a connect timeout and a DataLoader worker killed by SIGKILL, made for real
    with this torch (its C++ log lines and Python tracebacks as they come out)."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", LIVE_FAILURES], capture_output=True,
                          text=True, timeout=180)
    busy, closed = (int(p) for p in proc.stdout.split()[1:3])
    lines = proc.stderr.splitlines()
    found = scan_lines(lines, context=ScanContext(node="n0", master_addr="127.0.0.1",
                                                  master_port=busy))
    ids = [f.id for f in found]
    assert ids[:3] == ["peer-unreachable", "port-in-use", "host-oom-kill"], ids
    assert f"127.0.0.1:{closed}" in found[0].detail
    assert found[1].detail == f"port {busy} (the master port)"
    assert "DataLoader worker killed by signal Killed" in found[2].detail
    as_master = scan_lines(lines, context=ScanContext(master_addr="127.0.0.1",
                                                      master_port=closed))
    assert "master-port-unreachable" in [f.id for f in as_master]
    assert not any(f.id == "peer-unreachable" for f in as_master)
    # torch's C++ stack frames and "Exception raised from ..." lines are not faults
    assert not any(e.startswith(("frame #", "Exception raised from")) for f in found
                   for e in f.evidence)


_ALL_FAULT_LINES = [line for p in sorted(FAULT_LOGS.glob("*.log"))
                    for line in p.read_text(encoding="utf-8").splitlines()]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_ALL_FAULT_LINES), min_size=1, max_size=12), st.data())
def test_the_scanner_never_raises_on_mutated_failure_text(lines: list[str],
                                                          data: st.DataObject) -> None:
    mutated = []
    for line in lines:
        i = data.draw(st.integers(0, max(len(line) - 1, 0)))
        junk = data.draw(st.sampled_from(["", "9" * 30, "-", ":", "(", ")", "[", "]", "'", " ",
                                          "\x00", "é", "pid: ", "rank      : "]))
        mutated.append(line[:i] + junk + line[i + data.draw(st.integers(0, 3)):])
    for ctx in (ScanContext(), context("node2", master_port_reachable=True, resuming=True)):
        for f in scan_lines(mutated, context=ctx):
            assert f.evidence and f.count >= 1
            f.to_dict()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e3, 1e3), st.sampled_from([1e14, -1e14, 0.0, 5.0])),
                max_size=150), st.sampled_from([12, 20, 50]))
def test_loss_watch_flags_exactly_what_its_rule_says(losses: list[float], window: int) -> None:
    """The sorted window and the early exit change nothing: the rule computed plainly."""
    from collections import deque
    watch = LossWatch(window=window)
    seen: deque[float] = deque(maxlen=window)
    for loss in losses:
        expected = False
        if len(seen) >= 10:
            med = statistics.median(seen)
            mad = statistics.median([abs(v - med) for v in seen])
            expected = loss > med + max(8 * mad, 2 * abs(med), 1e-6)
        assert (watch.observe(loss) is not None) == expected
        seen.append(loss)
