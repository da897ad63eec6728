"""What a bring-up step is: data (id, title, phase, nodes, dependencies, root, what it changes)
and three command builders (check, apply, verify) that turn the cluster and the options into
the exact shell text run on each node.

Exit-code conventions of step commands:

* check: 0 = already done (the step is skipped), :data:`EXIT_NOT_APPLICABLE` = nothing to do on
  this node (e.g. no NVIDIA GPU), anything else = to do;
* apply/verify: 0 = fine, :data:`EXIT_NEEDS_REBOOT` = installed but only active after a reboot,
  anything else = failed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from console.cluster.model import Cluster, Node

if TYPE_CHECKING:
    from console.ssh.pool import Pool

EXIT_NEEDS_REBOOT = 100
EXIT_NOT_APPLICABLE = 101

Target = Literal["all", "head", "workers"]


class Phase(str, Enum):
    """The seed guide's bring-up order (its section 7.1)."""

    SOFTWARE = "software"
    VERIFICATION = "verification"
    CONFIGURATION = "configuration"
    SINGLE_NODE = "single-node trial"
    MULTI_NODE = "multi-node training"


PHASES = tuple(Phase)


class StepState(str, Enum):
    """Where one step stands on one node."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    ALREADY_DONE = "already done"
    NOT_APPLICABLE = "not applicable"
    FAILED = "failed"
    NEEDS_REBOOT = "needs reboot"
    BLOCKED = "blocked"
    SKIPPED = "skipped"

    @property
    def finished_ok(self) -> bool:
        """True when dependants may go on (done, already done, nothing to do)."""
        return self in (StepState.DONE, StepState.ALREADY_DONE, StepState.NOT_APPLICABLE)

    @property
    def final(self) -> bool:
        return self not in (StepState.PENDING, StepState.RUNNING)


@dataclass(frozen=True)
class Command:
    """One shell command for a node. ``stdin`` is a program text sent on its standard input
    (shown by name in a dry run, as ``< name``)."""

    text: str
    stdin: str | None = None
    stdin_name: str | None = None

    def render(self) -> str:
        return self.text if self.stdin_name is None else f"{self.text}  < {self.stdin_name}"


@dataclass(frozen=True)
class SetupOptions:
    """Choices for a bring-up. Paths may contain ``{node}`` (replaced by the node name), which
    lets nodes that share one filesystem (the loopback cluster) keep separate copies."""

    profile: str = "current"
    """Package profile installed into the training environment (see ``console.bringup.profiles``)."""
    env_path: str | None = None
    """Training environment directory; default: the one holding ``cluster.python``, else
    ``~/sensevoice-env``."""
    env_kind: Literal["venv", "conda"] = "venv"
    base_python: str = "python3"
    """Interpreter that creates a venv (and runs pip for a venv made without pip)."""
    venv_with_pip: bool = True
    """Give the venv its own pip (slow: ensurepip); without it the base pip installs into it."""
    conda: str = "conda"
    python_version: str = "3.10"
    """Python of a new conda environment."""
    find_links: str | None = None
    """A directory of wheels for pip (``--find-links``); with ``no_index``, offline installs."""
    no_index: bool = False
    driver: str = "550"
    """NVIDIA server driver branch: installs ``nvidia-driver-<driver>-server``."""
    shared_group: str = "svtrain"
    """Group that owns ``shared_dir`` (mode 2775, setgid), instead of the seed's chmod 777."""
    export_options: str = "rw,sync,no_subtree_check"
    mount_options: str = "defaults,_netdev"
    exports_file: str = "/etc/exports"
    fstab_file: str = "/etc/fstab"
    sysctl_file: str = "/etc/sysctl.d/90-svconsole.conf"
    socket_buffer_max: int = 268435456
    """net.core.rmem_max / wmem_max in bytes (256 MiB)."""
    ssh_dir: str = "~/.ssh"
    nccl_debug: str = "WARN"
    latency_count: int = 1000
    """Round trips per node pair in the latency measurement."""
    bench_mb: float = 256.0
    """Tensor size of the collective benchmark (MiB)."""
    bench_iters: int = 10
    iperf_seconds: int = 5
    burnin_seconds: float = 5.0
    """Per GPU and dtype."""
    burnin_size: int = 8192
    storage_mb: int = 1024
    """Bytes each node writes then reads on shared_dir (MiB)."""
    slow_gpu_ratio: float = 0.8
    """A GPU below this fraction of its peers' median TFLOP/s is flagged."""

    def __post_init__(self) -> None:
        problems = [f"{name}: {why}" for name, why in option_problems(self)]
        if problems:
            raise ValueError("setup options: " + "; ".join(problems))

    def expand(self, text: str, node: Node) -> str:
        return text.replace("{node}", node.name)


_PACKAGE_PART = re.compile(r"[a-z0-9][a-z0-9+.-]*")
_GROUP = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_MOUNT_OPTIONS = re.compile(r"[A-Za-z0-9_.,=:@/+-]+")
_VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,2}")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
_NUMBERS = ("socket_buffer_max", "latency_count", "bench_mb", "bench_iters", "iperf_seconds",
            "burnin_seconds", "burnin_size", "storage_mb", "slow_gpu_ratio")


def option_problems(options: SetupOptions) -> list[tuple[str, str]]:
    """(field, why) for each option that cannot go safely into a node's shell or config files:
    the values that are not shell-quoted everywhere they go (a package name inside a message,
    a line of /etc/exports or /etc/fstab, the NCCL env file that torchrun's shell sources) must
    be plain words; paths must be one line."""
    problems = []
    if not _PACKAGE_PART.fullmatch(options.driver):
        problems.append(("driver", f"{options.driver!r} is not a driver branch (like 550 or "
                                   f"570-open: it becomes nvidia-driver-<driver>-server)"))
    if options.nccl_debug not in NCCL_DEBUG_LEVELS:
        problems.append(("nccl_debug", f"{options.nccl_debug!r} is not one of "
                                       f"{', '.join(NCCL_DEBUG_LEVELS)}"))
    if not _GROUP.fullmatch(options.shared_group):
        problems.append(("shared_group", f"{options.shared_group!r} is not a group name"))
    for name in ("export_options", "mount_options"):
        value = getattr(options, name)
        if not _MOUNT_OPTIONS.fullmatch(value):
            problems.append((name, f"{value!r}: options are letters, digits and , = : . _ @ "
                                   f"/ + - without spaces (one field of a line in the file)"))
    if not _VERSION.fullmatch(options.python_version):
        problems.append(("python_version", f"{options.python_version!r} is not a version"))
    if options.env_kind not in ("venv", "conda"):
        problems.append(("env_kind", f"{options.env_kind!r} is not venv or conda"))
    for f in fields(options):
        value = getattr(options, f.name)
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            problems.append((f.name, f"{value!r} holds a newline or another control character"))
        if f.name in _NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float))
                                   or not value > 0):
            problems.append((f.name, f"must be a number above 0, got {value!r}"))
    return problems


@dataclass(frozen=True)
class StepContext:
    """What a command builder sees: the cluster, the node, the options and, for steps that
    gather something first (public keys), the gathered text per node."""

    cluster: Cluster
    node: Node
    options: SetupOptions
    gathered: Mapping[str, str] = field(default_factory=dict)

    def path(self, text: str) -> str:
        return self.options.expand(text, self.node)


Builder = Callable[[StepContext], list[Command]]


@dataclass(frozen=True)
class NodeOutcome:
    """Result of a measurement step on one node."""

    state: StepState
    detail: str = ""


@dataclass
class MeasureResult:
    """A measurement step's outcome: a state and a line per node, plus the numbers (JSON-able)."""

    outcomes: dict[str, NodeOutcome]
    data: dict[str, Any]
    summary: list[str] = field(default_factory=list)


Emit = Callable[[str, str], None]
"""``emit(node, line)``: a measurement's live output line for one node."""
Measure = Callable[["Pool", Cluster, list[str], SetupOptions, Emit], MeasureResult]


def _none(ctx: StepContext) -> list[Command]:
    return []


def says(text: str) -> Callable[[Cluster, SetupOptions], str]:
    """A ``Step.changes`` that is the same whatever the cluster and options."""
    return lambda cluster, options: text


@dataclass(frozen=True)
class Step:
    """One step of the bring-up, as data.

    A shell step has ``check``/``apply``/``verify`` builders; a measurement step (environment
    verification) has ``measure``, which runs across the selected nodes at once."""

    id: str
    title: str
    phase: Phase
    targets: Target = "all"
    depends: tuple[str, ...] = ()
    needs_root: bool = False
    destructive: bool = False
    changes: Callable[[Cluster, SetupOptions], str] = says("")
    """What the step will change, in words, for the confirmation prompt."""
    check: Builder = _none
    apply: Builder = _none
    verify: Builder = _none
    gather: Builder | None = None
    """Run on every node of the cluster before ``apply``; stdout goes to ``ctx.gathered``."""
    measure: Measure | None = None
    timeout: float = 1800.0

    def nodes(self, cluster: Cluster) -> list[str]:
        """Names of the nodes this step runs on."""
        head = head_node(cluster).name
        if self.targets == "head":
            return [head]
        if self.targets == "workers":
            return [n for n in cluster.names() if n != head]
        return cluster.names()


def head_node(cluster: Cluster) -> Node:
    """The head node (NFS server): the first node with ``role: head``, else the master."""
    for node in cluster.nodes:
        if node.role == "head":
            return node
    return cluster.master_node


def nccl_env_file(cluster: Cluster, node: str) -> str:
    """Where the NCCL environment of ``node`` is kept on shared_dir (written by the nccl-env
    step, sourced before torchrun and before the collective benchmark on that node)."""
    return f"{cluster.shared_dir}/svconsole/nccl/{node}.env"
