"""The fault catalog: what goes wrong in multi-node SenseVoice training, how to see it, what to do.

The catalog (:data:`CATALOG`) is data: one :class:`Fault` per known failure, with regex signatures
over log lines, or the name of a detector over metrics, or a trigger over a DeepSpeed config, the
advice, and the versions it was seen with. The training screen's fault panel and the config
editor read the same list:

- :func:`scan_lines` finds faults in log lines (with the lines as evidence, node, rank, line),
- :func:`config_incompatibilities` finds configs known to fail with the installed versions,
- :class:`LossWatch`, :func:`stalled_ranks`, :func:`grad_sync_verdict` and :func:`low_gpu_util`
  are the detectors over metrics (the metrics store calls them).

Severity and advice follow the seed guide's tables 6.1/6.2 and what real runs showed
(``shared/notes/domain.md``, the H200 readings).
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from console.training.logparse import Event, StepEvent, parse_line


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class VersionRange:
    """``package`` at a version ``>= low`` and ``< below`` (either may be open); ``seen`` is the
    exact version the fault was observed with. ``if_unknown``: whether the fault is reported
    (as unconfirmed) when the version is not known."""

    package: str
    low: str | None = None
    below: str | None = None
    seen: str | None = None
    if_unknown: bool = True

    def contains(self, version: str) -> bool:
        v = version_tuple(version)
        if self.low is not None and v < version_tuple(self.low):
            return False
        return not (self.below is not None and v >= version_tuple(self.below))

    def __str__(self) -> str:
        parts = [f">={self.low}" if self.low else "", f"<{self.below}" if self.below else ""]
        text = f"{self.package} {','.join(p for p in parts if p)}".strip()
        return f"{text} (seen with {self.seen})" if self.seen else text


def version_tuple(version: str) -> tuple[int, ...]:
    """``'1.4.16'`` -> ``(1, 4, 16)``; a suffix such as ``+cu128`` or ``rc1`` ends the numbers."""
    out: list[int] = []
    for part in re.split(r"[.+]", version.strip()):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.end() < len(part):
            break
    return tuple(out)


#: A config trigger: given a DeepSpeed config, the evidence (a short text) when it applies.
ConfigTrigger = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Fault:
    """One entry of the catalog.

    ``signatures`` are regexes searched in each log line; ``detector`` names the metrics
    detector that reports it (``loss``, ``stall``, ``grad_sync``, ``gpu_util``), or ``address``
    / ``context`` for entries the scanner assigns from what a line names (the master port or a
    peer) or from the run (a resume); ``versions`` restrict a config trigger to the versions it
    is known for; ``config_trigger`` tells the config editor which configs cause it.
    ``network``: a connect failure, re-assigned by the address it names; ``supersedes``: ids of
    less specific entries left out when this one matches the same line; ``generic``: a failure
    whose cause is another line (the scanner attaches it)."""

    id: str
    title: str
    severity: Severity
    advice: str
    signatures: tuple[str, ...] = ()
    detector: str | None = None
    versions: tuple[VersionRange, ...] = ()
    config_trigger: ConfigTrigger | None = None
    source: str = ""
    network: bool = False
    supersedes: tuple[str, ...] = ()
    generic: bool = False


@dataclass(frozen=True)
class Finding:
    """A fault seen: the catalog entry, the lines or readings that show it, where."""

    fault: Fault
    evidence: tuple[str, ...]
    node: str | None = None
    rank: int | None = None
    line_no: int | None = None
    detail: str = ""
    count: int = 1
    step: int | None = None

    @property
    def id(self) -> str:
        return self.fault.id

    @property
    def severity(self) -> Severity:
        return self.fault.severity

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.fault.id, "title": self.fault.title,
                "severity": self.fault.severity.value, "advice": self.fault.advice,
                "node": self.node, "rank": self.rank, "line": self.line_no,
                "count": self.count, "step": self.step, "detail": self.detail,
                "evidence": list(self.evidence)}


# --- config triggers ------------------------------------------------------------------------


def _bf16_enabled(cfg: Mapping[str, Any]) -> str | None:
    section = cfg.get("bf16") or cfg.get("bfloat16")
    if isinstance(section, Mapping) and section.get("enabled") in (True, "true", "auto"):
        return f'bf16.enabled = {section.get("enabled")!r}'
    return None


def _adam_without_torch_adam(cfg: Mapping[str, Any]) -> str | None:
    opt = cfg.get("optimizer")
    if not isinstance(opt, Mapping):
        return None
    kind = str(opt.get("type", "")).lower()
    params = opt.get("params") or {}
    if kind in ("adam", "adamw") and not (isinstance(params, Mapping) and params.get("torch_adam")):
        return f'optimizer.type = {opt.get("type")!r} without "torch_adam": true (FusedAdam)'
    return None


# --- the catalog ----------------------------------------------------------------------------

#: What a dtype mismatch reads like, in every wording of PyTorch's kernels (CPU and CUDA), its
#: Python layers and older releases.
_DTYPE_SIGNATURES = (
    r"must have the same dtype",                  # mat1 and mat2 / self and mat2 / addmv
    r"to have the same dtype",                    # expected m1 and m2 / query, key, and value
    r"to have same dtype",                        # dot : expected both vectors to have same dtype
    r"expected scalar type \w+ but found \w+",
    r"of scalar type \w+ but got scalar type \w+",  # Expected object of scalar type (old torch)
    r"Input type \([^)]*\) and (?:weight|bias) type \([^)]*\) should be the same",
    r"Found dtype \w+ but expected \w+",
    r"result type \w+ can't be cast to the desired output type \w+",
)

CATALOG: tuple[Fault, ...] = (
    Fault(
        id="master-port-unreachable", title="Master port not reached", severity=Severity.ERROR,
        detector="address",
        signatures=(r"waiting for clients\. \d+/\d+ clients joined",),
        advice="A node could not connect to master_addr:master_port (torch's rendezvous store). "
               "Check that the master's firewall lets the master port in from every node, that "
               "--master-addr is the master's address on the training network, and that the "
               "interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) routes to it.",
        source="torch c10d TCPStore"),
    Fault(
        id="peer-unreachable", title="A peer's ports not reached", severity=Severity.ERROR,
        detector="address",
        advice="A connection between ranks failed on a port other than the master port: gloo's "
               "pairs and NCCL's bootstrap and rings use ports beyond master_port, chosen at "
               "random. Let TCP in between the training nodes on all ports in each node's "
               "firewall (the finding names the address), and pin the interface with "
               "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME.",
        source="namespace cluster drill; gloo pair.cc, NCCL socket.cc"),
    Fault(
        id="connection-timeout", title="Connection timed out", severity=Severity.ERROR,
        network=True,
        signatures=(r"rrno:? ?110\b", r"Connection timed out", r"ETIMEDOUT",
                    r"client socket has timed out after \d+m?s while trying to connect",
                    r"TCP client failed to connect/validate to host", r"timed out connecting: ",
                    r"Connect timeout ", r"Socket Timeout", r"TimeoutError: timed out"),
        advice="A connection between nodes timed out (a firewall dropping the packets, or a "
               "wrong address or interface). To master_addr:master_port it is the master port "
               "(open it on the master); to any other port it is a peer connection (gloo and "
               "NCCL use ports beyond it): let TCP in between the nodes. Check "
               "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME.",
        source="torch c10d socket.cpp, gloo, Python"),
    Fault(
        id="connection-refused", title="Connection refused", severity=Severity.ERROR,
        network=True,
        signatures=(r"onnection refused", r"rrno:? ?111\b",
                    r"ECONNREFUSED", r"client socket has failed to connect to"),
        advice="Nothing listened at the address: the master's agent or a peer rank was not up "
               "(yet), had already exited, or the address is wrong (--master-addr, the "
               "interface). See whether another node failed first.",
        source="torch c10d socket.cpp, gloo"),
    Fault(
        id="connection-reset", title="Node connection reset", severity=Severity.ERROR,
        signatures=(r"ConnectionResetError", r"onnection reset by peer",
                    r"Connection closed by peer", r"Connection closed by remote peer",
                    r"ECONNRESET", r"Broken pipe", r"rrno:? ?104\b"),
        advice="A peer dropped the connection. Check the firewall rules between the nodes "
               "(master port and NCCL ports) and raise the timeouts (DEEPSPEED_TIMEOUT, "
               "minutes); see whether a node died first.",
        source="seed 6.2"),
    Fault(
        id="port-in-use", title="Address or port already in use", severity=Severity.ERROR,
        signatures=(r"ddress already in use", r"EADDRINUSE", r"rrno:? ?98\b",
                    r"server socket has failed to (?:bind|listen)"),
        advice="The port was taken on this node: another run (svconsole runs), a leftover "
               "torchrun of an earlier one, or another service holds it. Stop it, or choose "
               "another master port in cluster.yaml.",
        source="torch c10d socket.cpp (DistNetworkError)"),
    Fault(
        id="nccl-connect-failed", title="NCCL could not connect to a peer",
        severity=Severity.ERROR,
        signatures=(r"NCCL WARN .*?(?:Connect to \S+ failed|Call to connect returned|"
                    r"Connection closed by remote peer|Call to recv from \S+ failed)",),
        supersedes=("connection-timeout", "connection-refused", "connection-reset",
                    "node-unreachable"),
        advice="NCCL's bootstrap or ring connection to the named peer failed: its ports are "
               "firewalled, or NCCL picked an interface that does not reach it. Set "
               "NCCL_SOCKET_IFNAME to the training network's interface on every node and let "
               "TCP in between the nodes.",
        source="NCCL misc/socket.cc"),
    Fault(
        id="nccl-system-error", title="NCCL system error", severity=Severity.ERROR,
        signatures=(r"unhandled system error", r"ncclSystemError"),
        advice="A system call inside NCCL failed (socket, shared memory, InfiniBand). Run with "
               "NCCL_DEBUG=INFO; usual causes: NCCL_SOCKET_IFNAME naming an interface the node "
               "lacks, /dev/shm too small in a container (--shm-size), RDMA misconfigured "
               "(try NCCL_IB_DISABLE=1), a peer that is not reachable.",
        source="NCCL ncclGetErrorString; torch ProcessGroupNCCL"),
    Fault(
        id="nccl-internal-error", title="NCCL internal error", severity=Severity.ERROR,
        signatures=(r"internal error - please report this issue to the NCCL developers",
                    r"ncclInternalError"),
        advice="NCCL failed an internal check: often mismatched NCCL versions between nodes or "
               "a broken topology detection. Compare the stack on every node (svconsole check) "
               "and run with NCCL_DEBUG=INFO.",
        source="NCCL ncclGetErrorString"),
    Fault(
        id="nccl-remote-error", title="NCCL: remote process exited or network error",
        severity=Severity.ERROR,
        signatures=(r"remote process exited or there was a network error", r"ncclRemoteError"),
        advice="Another rank died or the network dropped under NCCL. Find the rank that failed "
               "first (its own finding names the cause); this one is the consequence.",
        source="NCCL ncclGetErrorString"),
    Fault(
        id="nccl-watchdog-timeout", title="Collective operation timed out",
        severity=Severity.ERROR,
        signatures=(r"Watchdog caught collective operation timeout",
                    r"Heartbeat monitor timed out", r"watchdog got stuck for",
                    r"Timeout at NCCL work", r"Timed out waiting \d+ms for (?:recv|send)"),
        advice="A collective (all-reduce) waited past its timeout and the rank was aborted "
               "(exit -6): one rank is stuck, dead or far slower (data loading, a full disk, "
               "another node's failure). Look for the first rank that stopped logging; check "
               "the interconnect (NCCL_DEBUG=INFO).",
        source="torch ProcessGroupNCCL watchdog and heartbeat monitor; gloo"),
    Fault(
        id="collective-mismatch", title="Ranks ran different collectives",
        severity=Severity.ERROR,
        signatures=(r"Detected mismatch between collectives on ranks",),
        advice="Ranks entered different collectives: the data gives ranks different numbers of "
               "batches (FunASR's token batching does; a rank that finishes its epoch early "
               "enters the next collective alone), or code runs a collective on some ranks "
               "only. TORCH_DISTRIBUTED_DEBUG=DETAIL names the collectives.",
        source="torch ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL)"),
    Fault(
        id="unused-parameters", title="Parameters without gradients (DDP reduction)",
        severity=Severity.ERROR,
        signatures=(r"Expected to have finished reduction in the prior iteration",),
        advice="Some parameters took no part in the loss, so DDP's reduction never finished. "
               "Set ++train_conf.find_unused_parameters=true, or freeze the unused parameters.",
        source="torch reducer.cpp"),
    Fault(
        id="cuda-oom", title="CUDA out of memory", severity=Severity.ERROR,
        signatures=(r"CUDA out of memory", r"torch\.(?:cuda\.)?OutOfMemoryError"),
        advice="Lower dataset_conf.batch_size (tokens per batch) or train_micro_batch_size_per_gpu, "
               "enable bf16 where the GPU and FunASR version allow it, or a higher ZeRO stage.",
        source="seed 6.2"),
    Fault(
        id="host-oom-kill", title="Host out of memory (worker killed or allocation failed)",
        severity=Severity.ERROR,
        signatures=(r"exitcode\s*:\s*-9\b", r"Signal 9 \(SIGKILL\)",
                    r"exits with return code = -9\b", r"is killed by signal: Killed",
                    r"Out of memory: Killed process", r"Memory cgroup out of memory",
                    r"invoked oom-killer", r"oom-kill:", r"Cannot allocate memory",
                    r"rrno:? ?12\b"),
        supersedes=("worker-exit",),
        advice="The host ran out of RAM: the kernel's OOM killer sent SIGKILL (exit -9), or an "
               "allocation failed (errno 12). Check the node's RAM and kernel log (the finding "
               "attaches its oom-kill lines); lower dataset_conf.num_workers and the prefetch, "
               "and make sure no other job shares the host.",
        source="torch elastic, DataLoader, DeepSpeed launcher, kernel"),
    Fault(
        id="module-not-found", title="Python module missing on a node", severity=Severity.ERROR,
        signatures=(r"ModuleNotFoundError: No module named",),
        advice="This node runs a different Python or environment than the others. Point the "
               "cluster's training python at the same venv/conda env on every node and compare "
               "versions (svconsole check).",
        source="domain notes"),
    Fault(
        id="deepspeed-batch-assertion", title="DeepSpeed batch sizes do not add up",
        severity=Severity.ERROR,
        signatures=(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step",),
        advice="train_batch_size must equal train_micro_batch_size_per_gpu x "
               "gradient_accumulation_steps x world size (nodes x GPUs). Set two of them and let "
               "DeepSpeed derive the third, or fix the world size.",
        source="DeepSpeed runtime/config.py"),
    Fault(
        id="checkpoint-world-size", title="Checkpoint saved with another world size",
        severity=Severity.ERROR,
        signatures=(r"The checkpoint being loaded used a DP world size of",),
        advice="DeepSpeed cannot re-partition ZeRO optimizer states for a new number of ranks. "
               "Resume with the nodes and GPUs the checkpoint was saved with, or convert it "
               "(deepspeed.checkpoint.ds_to_universal) and load it as a universal checkpoint.",
        source="DeepSpeed runtime/engine.py"),
    Fault(
        id="resume-checkpoint-missing", title="Resume found no checkpoint",
        severity=Severity.ERROR, detector="context",
        signatures=(r"No checkpoint found at .*does not resume",),
        advice="This run was launched to resume, but this rank found no output_dir/model.pt and "
               "started from scratch: output_dir is not the same shared storage on every node, "
               "or the run points at another output_dir. (A first run prints the same line: "
               "it is a finding only when resuming.)",
        source="funasr train_utils/trainer_ds.py"),
    Fault(
        id="data-audio-missing", title="Audio file missing", severity=Severity.ERROR,
        signatures=(r"Audio file not found: ", r"Loading wav failed!",
                    r"No such file or directory: '[^']*\.(?:wav|flac|mp3|ogg|opus|m4a|aac|pcm)'",
                    r"Error opening '[^']*': ", r"LibsndfileError", r"NoBackendError"),
        advice="A data list names audio that this node cannot read. Check the paths in the "
               "jsonl (the finding names the file) on every node: the data must be on shared "
               "storage, or at the same path on each node.",
        source="funasr utils/load_utils.py, sense_voice_datasets"),
    Fault(
        id="data-fields-missing", title="Data list lacks a SenseVoice field",
        severity=Severity.ERROR,
        signatures=(r"KeyError: '(?:key|source|source_len|target|target_len|text_language|"
                    r"emo_target|event_target|with_or_wo_itn)'",),
        advice="A jsonl line lacks a field FunASR's SenseVoice dataset reads (key, source, "
               "source_len, target, target_len, text_language, emo_target, event_target, "
               "with_or_wo_itn). Regenerate the list (funasr's sensevoice2jsonl) or add it.",
        source="funasr datasets/audio_datasets/index_ds.py"),
    Fault(
        id="data-empty", title="No training data", severity=Severity.ERROR,
        signatures=(r"ERROR: data is empty!", r"total_num of samplers: 0\b",
                    r"num_samples should be a positive integer value, but got num_samples=0"),
        advice="The data list gave no samples: the jsonl is empty, every sample is outside "
               "dataset_conf's min/max lengths (source_len counts 10 ms frames), or every audio "
               "file failed to load.",
        source="funasr index_ds.py, sense_voice_datasets, torch samplers"),
    Fault(
        id="bf16-dtype-mismatch", title="bf16 dtype mismatch in FunASR's forward",
        severity=Severity.ERROR,
        signatures=(r"must have the same dtype, but got \w+ and BFloat16",
                    r"must have the same dtype, but got BFloat16 and \w+"),
        supersedes=("dtype-mismatch",),
        versions=(VersionRange("funasr", low="1.4", below="1.5", seen="1.4.16"),),
        config_trigger=_bf16_enabled,
        advice="FunASR 1.4.x feeds float32 inputs to a bf16 DeepSpeed engine and the first step "
               "fails (also with ++train_conf.use_bf16=true). Train in fp32 (bf16.enabled false) "
               "with this FunASR version.",
        source="H200 run, funasr 1.4.16"),
    Fault(
        id="dtype-mismatch", title="Tensors of different dtypes", severity=Severity.ERROR,
        signatures=_DTYPE_SIGNATURES,
        advice="Two tensors of one operation have different dtypes. When the message names "
               "BFloat16 or Half, the precision config does it: bf16.enabled / fp16.enabled in "
               "the DeepSpeed config and ++train_conf.use_bf16 / use_fp16 must agree with what "
               "FunASR feeds the model; train in fp32 to confirm.",
        source="torch kernels"),
    Fault(
        id="fusedadam-jit-arch", title="FusedAdam JIT build fails on the GPU arch list",
        severity=Severity.ERROR,
        signatures=(r"invalid literal for int\(\) with base 10: '\d*a'",),
        versions=(VersionRange("deepspeed", seen="0.19.8"),
                  VersionRange("compute_capability", low="9.0", below="10.0", if_unknown=False)),
        config_trigger=_adam_without_torch_adam,
        advice='DeepSpeed\'s FusedAdam JIT cannot parse an arch like "9.0a" (Hopper). Add '
               '"torch_adam": true to optimizer.params, or remove the optimizer block so '
               "FunASR's torch optimizer is used, or set TORCH_CUDA_ARCH_LIST without the suffix.",
        source="H200 run, deepspeed 0.19.8"),
    Fault(
        id="node-unreachable", title="Node unreachable", severity=Severity.ERROR,
        signatures=(r"No route to host", r"Host is unreachable", r"rrno:? ?113\b",
                    r"Name or service not known", r"nfs: server \S+ not responding",
                    r"Stale file handle"),
        advice="Check the node's network and its NFS mount of the shared directory; restart the "
               "node or its training processes, then resume from output_dir/model.pt.",
        source="seed 6.2"),
    Fault(
        id="loss-divergence", title="Loss spike or nan", severity=Severity.WARNING,
        signatures=(r"\(loss_avg_rank: (?:nan|-?inf)\)",),
        detector="loss",
        advice="Gradients exploded: enable gradient clipping (gradient_clipping in the DeepSpeed "
               "config), lower the learning rate or lengthen the warmup, and check the data.",
        source="seed 6.2"),
    Fault(
        id="loss-negative", title="Negative loss", severity=Severity.WARNING,
        signatures=(r"\(loss_avg_rank: -\d",),
        advice="A CTC/cross-entropy loss cannot be below zero: the labels or the loss weights "
               "are wrong (e.g. a token id outside the vocabulary, a mis-set ctc_weight), or "
               "the numbers overflowed. Check the data and the model config.",
        source="domain notes"),
    Fault(
        id="stalled-rank", title="Rank stopped logging", severity=Severity.ERROR,
        detector="stall",
        advice="This rank is silent while the others go on: it may be hung in data loading, "
               "swapping, or its node is failing. Check the node (svconsole nodes) and its GPU; "
               "an NCCL timeout usually follows.",
        source="domain notes"),
    Fault(
        id="slow-gradient-sync", title="Slow gradient synchronisation", severity=Severity.WARNING,
        detector="grad_sync",
        advice="bwd_allreduce above 500 ms per step (bad above 2000 ms): check the inter-node "
               "bandwidth and NCCL settings (NCCL_IB_*, NCCL_SOCKET_IFNAME), raise "
               "allgather/reduce bucket sizes, use gradient accumulation.",
        source="seed 6.1"),
    Fault(
        id="low-gpu-util", title="GPU utilisation below 50%", severity=Severity.WARNING,
        detector="gpu_util",
        advice="The GPUs wait for data or for each other: raise dataset_conf.batch_size, "
               "num_workers (CPU cores / 2), check data loading and storage throughput.",
        source="seed 6.1; H200 run at batch 6000 sat at 10-60%"),
    Fault(
        id="bf16-unsupported-gpu", title="bf16 on a GPU without bf16", severity=Severity.ERROR,
        config_trigger=_bf16_enabled,
        versions=(VersionRange("compute_capability", below="8.0", if_unknown=False),),
        advice="bf16 needs compute capability 8.0 or newer (A100, H100, RTX 30xx); V100 and T4 "
               "do not have it. Use fp16 or fp32 on these GPUs.",
        source="domain notes"),
    Fault(
        id="worker-exit", title="Worker process exited with an error", severity=Severity.ERROR,
        generic=True,
        signatures=(r"failed \(exitcode: (?!0\))-?\d+\)", r"exitcode\s*:\s*(?!0 )-?\d+ \(pid",
                    r"exits with return code = (?!0\b)-?\d+", r"received by PID \d+",
                    r"is killed by signal: ", r"exited unexpectedly"),
        advice="A training process ended with a non-zero exit code or a signal; the cause "
               "named with it is the line before (a Python exception), or the signal: -6 "
               "SIGABRT (the NCCL watchdog's abort), -7 SIGBUS (/dev/shm full), -11 SIGSEGV, "
               "-15 SIGTERM (stopped by the launcher after another rank failed).",
        source="torch elastic, DeepSpeed launcher, DataLoader"),
    Fault(
        id="output-dir-not-shared", title="output_dir is not one shared directory",
        severity=Severity.ERROR, detector="storage",
        advice="Mount the same shared directory (NFS from the head node) at output_dir on every "
               "node (svconsole setup's nfs steps): each node now writes its own checkpoints, "
               "and a resume finds a different model.pt on each.",
        source="svconsole's storage check of a running run"),
    Fault(
        id="job-failed", title="Training job failed", severity=Severity.ERROR, generic=True,
        signatures=(r"Error executing job with overrides:", r"ChildFailedError: "),
        advice="The trainer exited with an error; the exception above it names the cause.",
        source="Hydra / torchrun"),
)

_BY_ID = {f.id: f for f in CATALOG}
_INDEX = {f.id: i for i, f in enumerate(CATALOG)}


def fault(fault_id: str) -> Fault:
    """The catalog entry with this id (``KeyError`` if there is none)."""
    return _BY_ID[fault_id]


def literal_prefix(pattern: str) -> str:
    """The literal text every match of the regex ``pattern`` contains at its start (``''`` when
    it has none): a substring test that rules most lines out before the regex runs."""
    depth = 0
    for i, ch in enumerate(pattern):
        if ch == "\\":
            continue
        if ch == "(" and (i == 0 or pattern[i - 1] != "\\"):
            depth += 1
        elif ch == ")" and pattern[i - 1] != "\\":
            depth -= 1
        elif ch == "|" and depth == 0 and pattern[i - 1] != "\\":
            return ""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1:i + 2]
            if not nxt or nxt.isalnum():
                break
            out.append(nxt)
            i += 2
            continue
        if ch in "*?{":
            if out:
                out.pop()
            break
        if ch in ".^$+[]|()":
            break
        out.append(ch)
        i += 1
    return "".join(out)


#: Every signature compiled, with its entry and its literal prefix. Searched one by one after a
#: substring test of the prefix; one big alternation would be many times slower.
_SIGNATURES: tuple[tuple[Fault, re.Pattern[str], str], ...] = tuple(
    (f, re.compile(s), literal_prefix(s)) for f in CATALOG for s in f.signatures)

#: How many evidence lines a finding keeps (the first ones; ``count`` says how many matched).
MAX_EVIDENCE = 5


def match_line(text: str, *, resuming: bool = False) -> list[Fault]:
    """The catalog entries whose signatures appear in this line (usually none); an entry that
    a more specific one on the same line supersedes is left out, and a dtype mismatch that
    names BFloat16 is the bf16 entry. ``resuming``: the run resumes, so "no checkpoint found"
    is a fault (a first run prints it too)."""
    found: list[Fault] = []
    for f, pattern, prefix in _SIGNATURES:
        if found and found[-1] is f:
            continue
        if prefix and prefix not in text:
            continue
        if pattern.search(text):
            found.append(f)
    if not found:
        return found
    if not resuming and _BY_ID["resume-checkpoint-missing"] in found:
        found = [f for f in found if f.id != "resume-checkpoint-missing"]
    if len(found) > 1:
        dropped = {i for f in found for i in f.supersedes}
        found = [f for f in found if f.id not in dropped]
    if _BY_ID["dtype-mismatch"] in found and _BF16.search(text):
        found = [_BY_ID["bf16-dtype-mismatch"] if f.id == "dtype-mismatch" else f
                 for f in found]
    return found


_BF16 = re.compile(r"[Bb][Ff]loat16|\bbf16\b")
_HALF = re.compile(r"\bHalf\b|float16|\bfp16\b")


# --- what the text says: address, rank, exit --------------------------------------------


@dataclass(frozen=True)
class ScanContext:
    """What the scanner knows about the run whose log it reads. ``rank_offset``: the global
    rank of the node's local rank 0 (node rank x processes per node), to turn a ``local_rank``
    into a global rank. ``master_addr``/``master_port``: where the rendezvous store listens.
    ``master_port_reachable``: what a pre-flight saw (``None``: not checked); when it answered,
    a connect failure that names no address is not blamed on the master port. ``hosts``: address
    or hostname -> node name, to name the node behind an address. ``resuming``: the run was
    launched to resume, so finding no checkpoint is an error."""

    node: str | None = None
    rank_offset: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    master_port_reachable: bool | None = None
    hosts: Mapping[str, str] = field(default_factory=dict)
    resuming: bool = False

    def global_rank(self, local_rank: int | None) -> int | None:
        if local_rank is None or self.rank_offset is None:
            return None
        return self.rank_offset + local_rank

    def is_master(self, host: str) -> bool:
        if self.master_addr is None:
            return False
        master_node = self.hosts.get(self.master_addr, self.master_addr)
        names = {self.master_addr, master_node}
        names.update(h for h, n in self.hosts.items() if n == master_node)
        return host in names


#: The address a connection failure names, in the wordings of gloo (``remote=[A]:P``), c10d
#: (``(A, P)``, ``[A]:P``, ``to host A:P``), NCCL (``A<P>``), ssh (``host A port P``).
_ADDRESSES = (
    re.compile(r"remote=\[?([^\]\s,]+?)\]?:(\d+)"),
    re.compile(r"\(([^,()\s]+), (\d+)\)"),
    re.compile(r"\[([^\]\s]+)\]:(\d+)"),
    re.compile(r"to host \[?([^\s\]]+?)\]?:(\d+)"),
    re.compile(r"([\w.:-]+)<(\d+)>"),
    re.compile(r"host (\S+) port (\d+)"),
    re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3}):(\d+)"),
)


def named_address(text: str) -> tuple[str, int] | None:
    """The (host, port) a connection failure names, or ``None``."""
    for pattern in _ADDRESSES:
        m = pattern.search(text)
        if m:
            return m.group(1), int(m.group(2))
    return None


def address_role(host: str, port: int, context: ScanContext) -> str:
    """``master`` (master_addr:master_port, the rendezvous store), ``master-node`` (another port
    on the master), ``peer`` (another node) or ``unknown`` (no master address known)."""
    if context.master_addr is not None:
        if context.is_master(host):
            return "master" if port == context.master_port else "master-node"
        return "peer"
    if context.master_port is not None:
        return "master" if port == context.master_port else "peer"
    return "unknown"


def _describe_address(host: str, port: int, role: str, context: ScanContext) -> str:
    node = context.hosts.get(host)
    where = f"{host}:{port}" + (f" ({node})" if node else "")
    if role == "master":
        return f"{where} is the master port (master_addr:master_port)"
    if role == "master-node":
        return (f"{where} is a port on the master node other than master_port "
                f"{context.master_port}: a peer connection")
    if role == "peer":
        note = f", not the master port {context.master_addr}:{context.master_port}" \
            if context.master_addr is not None else ""
        return f"{where} is a peer{note}"
    return f"address {where} (master port or peer: the run's master address is not known here)"


_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV",
            13: "SIGPIPE", 15: "SIGTERM"}
_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)|exits with return code = (-?\d+)|"
                   r"Signal (\d+) \((SIG\w+)\) received|killed by signal: (.+?)\.?\s*$")
_PORT = re.compile(r"port:? (\d+)|\]:(\d+)|:(\d+) \(errno")
_QUOTED_AUDIO = re.compile(r"'([^']+\.(?:wav|flac|mp3|ogg|opus|m4a|aac|pcm))'")
_AUDIO_NOT_FOUND = re.compile(r"Audio file not found: '([^']+)'|Error opening '([^']+)'")
_KEY_ERROR = re.compile(r"KeyError: '(\w+)'")
_SAMPLERS = re.compile(r"total_num of samplers: 0, (\S+)")
_CLIENTS = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients")
_WORLD = re.compile(r"DP world size of (\d+) but the current world size is (\d+)")
_CKPT = re.compile(r"No checkpoint found at '([^']*)'")


def _exit_detail(text: str) -> str:
    m = _EXIT.search(text)
    if not m:
        return ""
    if m.group(5) is not None:
        return f"DataLoader worker killed by signal {m.group(5)}"
    if m.group(3) is not None:
        code = -int(m.group(3))
    else:
        code = int(m.group(1) or m.group(2))
    if code < 0:
        name = _SIGNALS.get(-code, f"signal {-code}")
        notes = {6: ": the NCCL watchdog aborts this way after a collective timeout",
                 7: ": often /dev/shm too small for the DataLoader", 9: ": the OOM killer or "
                 "an operator", 15: ": stopped, usually by the launcher after another rank failed"}
        return f"exit code {code} ({name}{notes.get(-code, '')})"
    return f"exit code {code}"


def _crashed_by_itself(text: str) -> bool:
    """A worker exit by a signal of its own (SIGSEGV, SIGABRT, SIGBUS...), not the SIGTERM or
    SIGINT a launcher sends the others when one rank failed."""
    m = _EXIT.search(text)
    if not m or m.group(5) is not None:
        return False
    code = -int(m.group(3)) if m.group(3) is not None else int(m.group(1) or m.group(2))
    return code < 0 and -code not in (1, 2, 15)


def _detail(f: Fault, text: str, context: ScanContext) -> tuple[Fault, str]:
    """The entry a match really is (a connect failure to the master or to a peer, a resume
    that found nothing) and what the line says in particular."""
    if f.network or f.id in ("connection-reset", "nccl-connect-failed", "node-unreachable"):
        addr = named_address(text)
        if addr is None:
            if f.network and context.master_port_reachable:
                return _BY_ID["peer-unreachable"], (
                    "the log names no address; the master port answered the pre-flight, so "
                    "a connection between peers failed")
            return f, ""
        role = address_role(*addr, context)
        detail = _describe_address(*addr, role, context)
        if f.network and role == "master":
            if context.master_port_reachable:
                detail += "; the pre-flight reached it, so look at this node's route to it"
            return _BY_ID["master-port-unreachable"], detail
        if f.network and role in ("peer", "master-node"):
            return _BY_ID["peer-unreachable"], detail
        return f, detail
    if f.id == "master-port-unreachable":  # the store's side: not every node came
        m = _CLIENTS.search(text)
        if m:
            port = f" {context.master_port}" if context.master_port else ""
            return f, (f"only {m.group(2)} of {m.group(3)} nodes reached the master's store "
                       f"(master_port{port}) in {m.group(1)} s: the others were firewalled out, "
                       "had the wrong address or did not start")
        return f, ""
    if f.id in ("bf16-dtype-mismatch", "dtype-mismatch"):
        if _BF16.search(text):
            return f, "bf16 in the message: the precision config (bf16.enabled, use_bf16)"
        if _HALF.search(text):
            return f, "half (fp16) in the message: the precision config (fp16.enabled, use_fp16)"
        return f, ""
    if f.id in ("host-oom-kill", "worker-exit"):
        detail = _exit_detail(text)
        if not detail and "Cannot allocate memory" in text:
            detail = "an allocation failed (errno 12, ENOMEM)"
        return f, detail
    if f.id == "port-in-use":
        m = _PORT.search(text)
        if not m:
            return f, ""
        port = int(next(g for g in m.groups() if g))
        master = " (the master port)" if port == context.master_port else ""
        return f, f"port {port}{master}"
    if f.id == "resume-checkpoint-missing":
        m = _CKPT.search(text)
        return f, f"no checkpoint at {m.group(1) if m else 'output_dir/model.pt'}"
    if f.id == "checkpoint-world-size":
        m = _WORLD.search(text)
        return f, (f"saved with {m.group(1)} data-parallel ranks, now {m.group(2)}" if m else "")
    if f.id == "data-audio-missing":
        m = _AUDIO_NOT_FOUND.search(text) or _QUOTED_AUDIO.search(text)
        return f, (f"missing: {next(g for g in m.groups() if g)}" if m else "")
    if f.id == "data-fields-missing":
        m = _KEY_ERROR.search(text)
        return f, (f"field {m.group(1)!r} missing from a data line" if m else "")
    if f.id == "data-empty":
        m = _SAMPLERS.search(text)
        return f, (f"0 samples in {m.group(1).rstrip(',')}" if m else "")
    if f.id in ("loss-divergence", "loss-negative"):
        ev = parse_line(text)
        step, loss = getattr(ev, "total_step", None), getattr(ev, "loss", None)
        return f, (f"rank {ev.rank}, step {step}: loss {loss}" if step is not None else "")
    return f, ""


# --- findings ----------------------------------------------------------------------------


class FindingCollector:
    """Gathers matches into findings: one per (fault, node, rank), keeping the first
    :data:`MAX_EVIDENCE` lines and a count."""

    def __init__(self) -> None:
        self._findings: dict[tuple[str, str | None, int | None], Finding] = {}
        self._causes: dict[tuple[str, str | None, int | None], str] = {}

    def add(self, fault_: Fault, evidence: str, *, node: str | None, rank: int | None,
            line_no: int | None, detail: str = "", step: int | None = None) -> Finding:
        key = (fault_.id, node, rank)
        old = self._findings.get(key)
        if old is None:
            new = Finding(fault_, (evidence,), node, rank, line_no, detail, step=step)
        else:
            kept = old.evidence if len(old.evidence) >= MAX_EVIDENCE else (*old.evidence, evidence)
            new = Finding(fault_, kept, node, rank, old.line_no, old.detail or detail,
                          old.count + 1, old.step if old.step is not None else step)
        self._findings[key] = new
        return new

    def get(self, key: tuple[str, str | None, int | None]) -> Finding | None:
        return self._findings.get(key)

    def with_cause(self, key: tuple[str, str | None, int | None], cause: str, *,
                   extend_only: bool = False) -> None:
        """Put ``cause`` (the line that says why) first in a finding's evidence and detail. A
        cause that continues the one already given (a wrapped message, joined) replaces it;
        ``extend_only``: do nothing otherwise."""
        old = self._findings.get(key)
        if old is None or cause in old.evidence:
            return
        given = self._causes.get(key)
        evidence, detail = old.evidence, old.detail
        if given is not None and cause.startswith(given):
            evidence = tuple(cause if e == given else e for e in evidence)
            detail = detail.replace(given.strip(), cause.strip(), 1)
        elif extend_only:
            return
        else:
            evidence = (cause, *evidence)[:MAX_EVIDENCE + 1]
            detail = f"cause: {cause.strip()}" + (f"; {detail}" if detail else "")
        self._causes[key] = cause
        self._findings[key] = replace(old, evidence=evidence, detail=detail)

    def move(self, key: tuple[str, str | None, int | None], rank: int) -> None:
        """The finding under ``key`` (rank unknown) turned out to be ``rank``'s: merge it there."""
        old = self._findings.pop(key, None)
        if old is None:
            return
        new_key = (key[0], key[1], rank)
        there = self._findings.get(new_key)
        if there is None:
            self._findings[new_key] = replace(old, rank=rank)
            return
        first, second = sorted((there, old), key=lambda f: f.line_no or 0)
        evidence = tuple(dict.fromkeys(first.evidence + second.evidence))[:MAX_EVIDENCE + 1]
        self._findings[new_key] = replace(first, rank=rank, evidence=evidence,
                                          count=first.count + second.count,
                                          detail=first.detail or second.detail)

    def findings(self) -> list[Finding]:
        return sorted(self._findings.values(), key=_finding_order)


#: Faults that one rank's death brings on the others (its peers' connections reset, their
#: collectives fail, torchrun reports the exits): listed after the other errors, so that a
#: rank killed by the OOM killer reads first, and its peers' resets after it.
CONSEQUENCES = frozenset({"connection-reset", "nccl-remote-error", "worker-exit", "job-failed"})


def _finding_order(f: Finding) -> tuple[int, int, int, int]:
    """Errors first, their causes before their consequences (:data:`CONSEQUENCES`); among
    equals, catalog order (specific causes before ``job-failed``)."""
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return (order[f.severity], f.id in CONSEQUENCES, _INDEX[f.id],
            f.line_no if f.line_no is not None else 0)


_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")
#: NCCL's own prefix ``host:pid:tid [device]``: the device is the process's local GPU, which
#: torchrun gives local rank N.
_NCCL_PREFIX = re.compile(r"^\S+:\d+:\d+ \[(\d+)\] ")
_LOCAL_PREFIX = re.compile(r"\[([a-z_]+?)(\d+)\]:")
_BLOCK_START = re.compile(r"^\[\d+\]:\s*$")
_BLOCK_RANK = re.compile(r"^\s+rank\s*: (\d+) \(local_rank: (\d+)\)")
_LOCAL_RANK = re.compile(r"local_rank: (\d+) \(pid|--local_rank=(\d+)")
_PG_RANK = re.compile(r"\[(?:PG (?:ID )?\d+ (?:PG GUID \S+ )?)?Rank (\d+)\]|, rank=(\d+),")
_PID = re.compile(r"\(pid: (\d+)\)|received by PID (\d+)")
_EXC_START = re.compile(
    r"^(?:\[[^\]]*\]\s?)*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|Exit)): ")
_NEW_RECORD = re.compile(r"^(?:\[|[EWIFD]\d{4} |\d{4}-\d\d-\d\d|\s|Traceback|[=\-─━│╭╰])")

_LOSS_FAULTS = (_BY_ID["loss-divergence"], _BY_ID["loss-negative"])
_LOSS_SIGNATURES = {f.id: [re.compile(p) for p in f.signatures] for f in _LOSS_FAULTS}

#: Lines after a generic failure in which its cause may still come (Hydra prints its error
#: line before the traceback that ends with the cause).
CAUSE_WINDOW = 400
#: Lines a wrapped exception message may continue over (rich tracebacks wrap long messages).
JOIN_LINES = 8


@dataclass
class _Joined:
    text: str
    rank: int | None
    prefix_rank: int | None
    line_no: int
    faults: set[str]
    lines: int = 1


class FaultScanner:
    """Reads one node's log line by line and names the faults in it, keeping what a single line
    cannot say: the rank of a torchrun failure summary (``rank : N (local_rank: L)``) for the
    lines of its block, a ``local_rank`` turned global with the node's rank offset, an
    exception message wrapped over several lines (joined before matching), and the cause line
    before (or, with Hydra, after) a generic failure, attached to it as evidence."""

    def __init__(self, context: ScanContext | None = None,
                 collector: FindingCollector | None = None) -> None:
        self.context = context or ScanContext()
        self.collector = collector or FindingCollector()
        self.line_no = 0
        self._block: dict[str, Any] | None = None
        self._joined: _Joined | None = None
        self._causes: dict[int | None, tuple[str, int]] = {}
        self._waiting: list[tuple[tuple[str, str | None, int | None], int]] = []
        self._pids: dict[int, tuple[str, str | None, int | None]] = {}
        self._given: deque[tuple[str, str | None, int | None]] = deque(maxlen=32)

    def findings(self) -> list[Finding]:
        return self.collector.findings()

    def feed(self, text: str, *, line_no: int | None = None, rank: int | None = None,
             event: Event | None = None) -> list[Fault]:
        """Take the next line (``event``: its parse, when the caller has it; ``rank``: the rank
        when the caller knows it); return the entries it matched."""
        self.line_no = line_no if line_no is not None else self.line_no + 1
        text = text.rstrip("\n")
        if isinstance(event, StepEvent):
            self._joined = None
            return self._step(event, text)
        if event is None and "(loss_avg_rank: " in text and "total step: " in text:
            # a FunASR step line carries no other fault: only the loss signatures can match
            self._joined = None
            return self._loss_line(text, rank)
        body = text
        line_rank = rank
        if text.startswith("[") and line_rank is None:
            m = _RANK_PREFIX.match(text)
            if m:
                body = text[m.end():].lstrip()
                line_rank = int(m.group(1)) if line_rank is None else line_rank
            else:
                m = _LOCAL_PREFIX.match(text)
                if m and m.group(1) != "rank":
                    body = text[m.end():].lstrip()
                    if line_rank is None:
                        line_rank = self.context.global_rank(int(m.group(2)))
        block_rank = self._track_block(body)
        if self._joined is not None:
            if self._continues(body, rank if rank is not None else line_rank):
                return self._join(body)
            self._joined = None
        prefix_rank = line_rank
        matched = match_line(text, resuming=self.context.resuming)
        exc = _EXC_START.match(body)
        if not matched and exc is None:
            if "[ERROR]" in body[:80] or "[CRITICAL]" in body[:80]:  # a logger's error line
                self._cause(text, line_rank)
            return matched
        if line_rank is None:
            line_rank = block_rank if block_rank is not None else self._rank_of(text, event)
        is_cause = False
        if exc is not None and not exc.group(1).endswith("ChildFailedError"):
            self._joined = _Joined(text, line_rank, rank if rank is not None else prefix_rank,
                                   self.line_no, {f.id for f in matched})
            is_cause = True
        for f in matched:
            self._record(f, text, line_rank)
            is_cause = is_cause or (not f.generic and f.severity is Severity.ERROR)
        if is_cause:
            self._cause(text, line_rank)
        return matched

    # -- pieces ------------------------------------------------------------------------

    def _step(self, event: StepEvent, text: str) -> list[Fault]:
        loss = event.loss
        if loss is None or (math.isfinite(loss) and loss >= 0):
            return []
        f = _BY_ID["loss-divergence" if not math.isfinite(loss) else "loss-negative"]
        self.collector.add(f, text, node=self.context.node, rank=event.rank,
                           line_no=self.line_no, step=event.total_step,
                           detail=f"rank {event.rank}, step {event.total_step}: loss {loss}")
        return [f]

    def _loss_line(self, text: str, rank: int | None) -> list[Fault]:
        matched = [f for f in _LOSS_FAULTS if any(p.search(text) for p in _LOSS_SIGNATURES[f.id])]
        for f in matched:
            self._record(f, text, rank if rank is not None else self._rank_of(text, None))
        return matched

    def _track_block(self, body: str) -> int | None:
        """Follow torchrun's failure summary; the rank of the block this line is in."""
        if _BLOCK_START.match(body):
            self._block = {}
            return None
        if self._block is None:
            return None
        if not body.startswith(" "):
            self._block = None
            return None
        m = _BLOCK_RANK.match(body)
        if m:
            self._block["rank"] = int(m.group(1))
        return self._block.get("rank")

    def _rank_of(self, text: str, event: Event | None) -> int | None:
        m = _LOCAL_RANK.search(text) or _NCCL_PREFIX.match(text)
        if m:
            return self.context.global_rank(int(next(g for g in m.groups() if g)))
        m = _PG_RANK.search(text)
        if m:
            return int(m.group(1) or m.group(2))
        return (event if event is not None else parse_line(text)).rank

    def _continues(self, body: str, rank: int | None) -> bool:
        joined = self._joined
        assert joined is not None
        return (joined.lines < JOIN_LINES and self.line_no == joined.line_no + joined.lines
                and rank == joined.prefix_rank and bool(body.strip())
                and not _NEW_RECORD.match(body) and not _EXC_START.match(body))

    def _join(self, body: str) -> list[Fault]:
        joined = self._joined
        assert joined is not None
        joined.text = f"{joined.text} {body.strip()}"
        joined.lines += 1
        new = [f for f in match_line(joined.text, resuming=self.context.resuming)
               if f.id not in joined.faults]
        for f in new:
            joined.faults.add(f.id)
            self._record(f, joined.text, joined.rank, line_no=joined.line_no)
        for key in self._given:
            self.collector.with_cause(key, joined.text, extend_only=True)
        self._causes[joined.rank] = self._causes[None] = (joined.text, joined.line_no)
        return new

    def _record(self, f: Fault, text: str, rank: int | None, *,
                line_no: int | None = None) -> None:
        line_no = self.line_no if line_no is None else line_no
        real, detail = _detail(f, text, self.context)
        node = self.context.node
        key = (real.id, node, rank)
        pid = _PID.search(text)
        if pid and real.id in ("worker-exit", "host-oom-kill"):
            pid_no = int(pid.group(1) or pid.group(2))
            earlier = self._pids.get(pid_no)
            if earlier is not None and earlier[0] == real.id and earlier[2] is None \
                    and rank is not None:
                self.collector.move(earlier, rank)
            elif earlier is not None and earlier[0] == real.id and earlier[2] is not None \
                    and rank is None:
                key = earlier
                rank = earlier[2]
            self._pids[pid_no] = key
            if len(self._pids) > 1024:  # the oldest go: a summary follows its exits closely
                del self._pids[next(iter(self._pids))]
        step = None
        if real.id in ("loss-divergence", "loss-negative"):
            step = getattr(parse_line(text), "total_step", None)
        known = self.collector.get(key) is not None
        self.collector.add(real, text, node=node, rank=rank, line_no=line_no,
                           detail=detail, step=step)
        if f.generic and not known:
            cause = self._cause_for(rank, own=_crashed_by_itself(text))
            if cause is not None:
                self.collector.with_cause(key, cause)
                self._given.append(key)
            else:
                self._waiting.append((key, line_no))

    def _cause_for(self, rank: int | None, *, own: bool = False) -> str | None:
        """The latest cause line of ``rank`` (of any rank when none of its own, unless
        ``own``: the rank crashed by itself, another rank's error did not cause it)."""
        ranks = (rank,) if own and rank is not None else (rank, None)
        for r in ranks:
            seen = self._causes.get(r)
            if seen is not None and self.line_no - seen[1] <= CAUSE_WINDOW:
                return seen[0]
        return None

    def _cause(self, text: str, rank: int | None) -> None:
        """A line that says why: remember it for the generic failures that follow, and give it
        to those that came before it and still wait."""
        self._causes[rank] = self._causes[None] = (text, self.line_no)
        if not self._waiting:
            return
        still = []
        for key, line_no in self._waiting:
            if self.line_no - line_no > CAUSE_WINDOW:
                continue
            if key[2] is None or rank is None or key[2] == rank:
                self.collector.with_cause(key, text)
                self._given.append(key)
            else:
                still.append((key, line_no))
        self._waiting = still


def scan_contexts(plan: Mapping[str, Any], *, resuming: bool = False,
                  master_port_reachable: bool | None = None) -> dict[str, ScanContext]:
    """One :class:`ScanContext` per node of a launch plan (``LaunchPlan.to_dict()``, as a run
    record keeps it): the node's rank offset (the processes of the nodes of lower node rank),
    the master's address and port, every node's host and name."""
    nodes = sorted(plan.get("nodes") or [], key=lambda n: n.get("node_rank", 0))
    hosts = {n["host"]: n["node"] for n in nodes if n.get("host")}
    hosts.update({n["node"]: n["node"] for n in nodes})
    out: dict[str, ScanContext] = {}
    offset = 0
    for n in nodes:
        out[n["node"]] = ScanContext(
            node=n["node"], rank_offset=offset, master_addr=plan.get("master_addr"),
            master_port=plan.get("master_port"), master_port_reachable=master_port_reachable,
            hosts=hosts, resuming=resuming)
        offset += int(n.get("nproc") or 1)
    return out


def scan_lines(lines: Iterable[str], node: str | None = None, rank: int | None = None, *,
               start_line: int = 1, context: ScanContext | None = None) -> list[Finding]:
    """Faults in ``lines`` (one log, e.g. one node's), read with :class:`FaultScanner`. Each
    finding names the node, the rank (``rank`` if given, else what the text says) and the
    first line number; errors first, specific causes before generic ones."""
    ctx = context or ScanContext()
    if node is not None and ctx.node is None:
        ctx = replace(ctx, node=node)
    scanner = FaultScanner(ctx)
    for line_no, text in enumerate(lines, start_line):
        scanner.feed(text, line_no=line_no, rank=rank)
    return scanner.findings()


def config_incompatibilities(ds_config: Mapping[str, Any],
                             versions: Mapping[str, str]) -> list[Finding]:
    """Known failures this DeepSpeed config would run into with these versions.

    ``versions`` maps package names (``funasr``, ``deepspeed``, ``torch``) and optionally
    ``compute_capability`` (e.g. ``"9.0"``) to versions. An entry whose version constraint
    names a package that ``versions`` lacks applies (marked unconfirmed in ``detail``) unless the
    constraint says otherwise (``if_unknown``).
    """
    out: list[Finding] = []
    for f in CATALOG:
        if f.config_trigger is None:
            continue
        evidence = f.config_trigger(ds_config)
        if evidence is None:
            continue
        notes: list[str] = []
        applies = True
        for vr in f.versions:
            have = versions.get(vr.package)
            if have is None:
                applies = applies and vr.if_unknown
                notes.append(f"{vr.package} version unknown; known for {vr}")
            elif vr.contains(have):
                notes.append(f"{vr.package} {have}")
            else:
                applies = False
        if applies:
            out.append(Finding(f, (evidence,), detail="; ".join(notes)))
    return out


# --- detectors over metrics -----------------------------------------------------------------


class LossWatch:
    """Flags a loss that is nan/inf, or far above the running median of the last ``window``
    values: above ``median + max(mad_factor * MAD, rel_factor * |median|)``. FunASR's token
    batches make the loss noisy (a real run swung between 26 and 169), so the bar is high."""

    def __init__(self, window: int = 50, min_points: int = 10, mad_factor: float = 8.0,
                 rel_factor: float = 2.0) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        """``values`` in order: the median without a sort per step (the store calls this for
        every step line of every rank)."""
        self.min_points = min_points
        self.mad_factor = mad_factor
        self.rel_factor = rel_factor

    def observe(self, loss: float | None) -> str | None:
        """Take the next loss; return why it is a spike, or ``None``."""
        if loss is None:
            return None
        if not math.isfinite(loss):
            return f"loss is {loss}"
        reason = None
        n = len(self._sorted)
        if n >= self.min_points:
            ordered = self._sorted
            med = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
            # the bar is at least this high: below it, the MAD need not be computed
            if loss > med + max(self.rel_factor * abs(med), 1e-6):
                mad = statistics.median([abs(v - med) for v in ordered])
                bar = med + max(self.mad_factor * mad, self.rel_factor * abs(med), 1e-6)
                if loss > bar:
                    reason = (f"loss {loss:.6g} against a running median of {med:.6g} "
                              f"over the last {n} values")
        if len(self.values) == self.values.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self.values[0])]
        self.values.append(loss)
        bisect.insort(self._sorted, loss)
        return reason


#: Seed table 6.1: gradient synchronisation per step, in ms.
GRAD_SYNC_NORMAL_MS = 500.0
GRAD_SYNC_BAD_MS = 2000.0


def grad_sync_verdict(ms: float | None) -> str:
    """``normal`` (< 500 ms), ``elevated`` (500-2000 ms), ``bad`` (> 2000 ms) or ``unknown``."""
    if ms is None or not math.isfinite(ms):
        return "unknown"
    if ms < GRAD_SYNC_NORMAL_MS:
        return "normal"
    return "bad" if ms > GRAD_SYNC_BAD_MS else "elevated"


def stalled_ranks(last_seen: Mapping[Any, float], now: float, threshold_s: float) -> list[Any]:
    """Ranks silent for more than ``threshold_s`` while at least one other rank logged within
    it. When every rank is silent the run as a whole pauses (validation, checkpoint): no
    rank is singled out."""
    if len(last_seen) < 2:
        return []
    active = [r for r, t in last_seen.items() if now - t <= threshold_s]
    if not active:
        return []
    return sorted((r for r, t in last_seen.items() if now - t > threshold_s), key=str)


@dataclass(frozen=True)
class UtilVerdict:
    """Utilisation over a span of samples."""

    mean: float
    fraction_below: float
    samples: int
    seconds: float
    low: bool
    detail: str = ""


def low_gpu_util(timestamps: Sequence[float], util: Sequence[float], *, threshold: float = 50.0,
                 min_fraction: float = 0.8, min_seconds: float = 60.0) -> UtilVerdict | None:
    """Judge GPU utilisation (percent) sampled at ``timestamps`` (seconds) during a run: low when
    at least ``min_fraction`` of the samples are below ``threshold`` over at least
    ``min_seconds``. Pass the samples taken while training ran (idle time before the run
    would count as low). ``None`` when there are no samples."""
    pairs = [(t, u) for t, u in zip(timestamps, util, strict=True)
             if u is not None and math.isfinite(u) and t is not None]
    if not pairs:
        return None
    seconds = pairs[-1][0] - pairs[0][0]
    values = [u for _, u in pairs]
    mean = sum(values) / len(values)
    below = sum(1 for u in values if u < threshold) / len(values)
    low = below >= min_fraction and seconds >= min_seconds
    detail = (f"mean {mean:.0f}% over {seconds:.0f} s, {below:.0%} of {len(values)} samples "
              f"below {threshold:.0f}%")
    return UtilVerdict(mean, below, len(values), seconds, low, detail)
