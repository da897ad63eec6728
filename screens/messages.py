"""Typed messages from the engine to the screens.

Engine objects call back on their own threads; ``bridge`` turns those callbacks into these messages
(``post_message`` is thread-safe). Noisy messages say which older queued message they replace, so a
burst of updates collapses instead of piling up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from collections.abc import Sequence

    from console.cluster.model import Cluster
    from console.cluster.probe import NodeFacts
    from console.gpu.telemetry import TelemetryUpdate
    from console.ssh.pool import NodeStatus
    from console.training.metrics import RankStatus
    from console.training.runs import RunRecord


class NodeStatusChanged(Message):
    """A node's connection state changed (up, connecting, down, auth failed, host key problem)."""

    def __init__(self, status: NodeStatus) -> None:
        super().__init__()
        self.status = status

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NodeStatusChanged) and message.status.node == self.status.node


class GPUTelemetry(Message):
    """A GPU collector's update for one node: a new sample, or a status change (stale, down...).

    A newer sample supersedes a queued message of its node (it is the node's whole latest state);
    a status change supersedes only an older status change, so a sample is never lost to it.
    (Textual drops the message it is about to handle when ``message.can_replace(next_one)``.)
    """

    def __init__(self, update: TelemetryUpdate) -> None:
        super().__init__()
        self.update = update

    def can_replace(self, message: Message) -> bool:
        return (isinstance(message, GPUTelemetry) and message.update.node == self.update.node
                and (message.update.sample is not None or self.update.sample is None))


class RunFollowed(Message):
    """The training run the console follows changed: its record (which node has which node
    rank) and its per-rank status (step times, to name the slowest rank); ``record`` is None when
    no run is followed any more. ``live``: the run is still running (a finished run's GPUs are
    no longer judged by the run's thresholds)."""

    def __init__(self, record: RunRecord | None, ranks: Sequence[RankStatus] = (),
                 live: bool = True) -> None:
        super().__init__()
        self.record = record
        self.ranks = tuple(ranks)
        self.live = live


# ------------------------------------------------------------------------------------------------
# The Config screen (its workers post these; each replaces a queued older one of its kind)

if TYPE_CHECKING:
    from collections.abc import Sequence  # noqa: F811 (also above, for other messages)
    from pathlib import Path

    from console.training.dsconfig import ClusterSpec, Finding, Report
    from screens.config_widgets import ConfigFiles


class _Latest(Message):
    """A message whose newer copy makes a queued older one of the same class pointless."""

    def can_replace(self, message: Message) -> bool:
        return type(message) is type(self)


class DeepSpeedLoaded(_Latest):
    """The background import of deepspeed ended: its version, or why it cannot be imported."""

    def __init__(self, version: str | None, problem: str | None) -> None:
        super().__init__()
        self.version = version
        self.problem = problem


class ClusterSpecReady(_Latest):
    """The cluster the config checks use (``spec`` None while a probe runs or when none is
    known), where its facts came from in words, and when they were collected; ``waiting``: no
    facts are cached and the nodes will be probed once one is up."""

    def __init__(self, spec: ClusterSpec | None, source: str, collected_at: float | None = None,
                 up: tuple[str, ...] = (), waiting: bool = False) -> None:
        super().__init__()
        self.waiting = waiting
        self.spec = spec
        self.source = source
        self.collected_at = collected_at
        self.up = up


class DataListsChecked(_Latest):
    """The train/valid jsonl were looked for on the nodes (``paths``), with what was found."""

    def __init__(self, paths: tuple[str, str], findings: Sequence[Finding]) -> None:
        super().__init__()
        self.paths = paths
        self.findings = list(findings)


class ConfigValidated(_Latest):
    """A validation of the config ended; ``generation`` says which edit it judged."""

    def __init__(self, report: Report, generation: int) -> None:
        super().__init__()
        self.report = report
        self.generation = generation


class ConfigSaved(Message):
    """The Config screen's files were written (atomically, the old ones kept as .bak)."""

    def __init__(self, files: ConfigFiles, written: Sequence[Path], notes: Sequence[str]) -> None:
        super().__init__()
        self.files = files
        self.written = tuple(written)
        self.notes = tuple(notes)


# ------------------------------------------------------------------------------------------------
# The Setup screen (guided bring-up). No message carries the sudo password.

if TYPE_CHECKING:
    from console.bringup import RunSummary


class SetupStandingRead(_Latest):
    """The saved run summaries were read (oldest first): where the cluster stood before."""

    def __init__(self, summaries: Sequence[RunSummary]) -> None:
        super().__init__()
        self.summaries = list(summaries)


class SetupRunProgress(_Latest):
    """A run's feed has new states or lines; the screen drains the feed when it handles this
    (one is queued at a time, however fast the runner goes)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class SetupRunFinished(Message):
    """A run ended; its summary (also saved as summary.json beside the per-cell logs), or None
    when the runner itself broke (the app's worker error handler says why)."""

    def __init__(self, summary: RunSummary | None) -> None:
        super().__init__()
        self.summary = summary


class SetupText(_Latest):
    """Text for the Setup screen's log pane: a dry run's commands, or one cell's commands and
    log (``cell`` is its (step, node))."""

    def __init__(self, title: str, lines: Sequence[str], cell: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.title = title
        self.lines = list(lines)
        self.cell = cell


class SetupSudoChecked(Message):
    """How root steps run on each node ("root", "nopass" or "password"), probed before a run."""

    def __init__(self, modes: dict[str, str]) -> None:
        super().__init__()
        self.modes = dict(modes)


class NodeFactsArrived(Message):
    """A probe of one node finished: its facts (fresh, or the last known ones marked stale).

    Posted per node as each probe ends, so a slow node never holds back the others. A newer
    message for the same node replaces a queued older one.
    """

    def __init__(self, facts: NodeFacts) -> None:
        super().__init__()
        self.facts = facts

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NodeFactsArrived) and message.facts.node == self.facts.node


class ProbeRoundFinished(Message):
    """A round of probes ended (every node it covered answered or failed)."""

    def __init__(self, nodes: tuple[str, ...], seconds: float) -> None:
        super().__init__()
        self.nodes = nodes
        self.seconds = seconds


class ClusterChanged(Message):
    """cluster.yaml was written (node added, edited, removed, hostfile imported): the new cluster,
    and what happened in words for the operator."""

    def __init__(self, cluster: Cluster, what: str) -> None:
        super().__init__()
        self.cluster = cluster
        self.what = what


# ------------------------------------------------------------------------------------------------
# The Training screen (launch, follow, stop, resume, export)

if TYPE_CHECKING:
    from console.training.follow import RunUpdate
    from console.training.launch import Preparation
    from console.training.runs import RunStatus, StopResult


class RunProgress(Message):
    """The followed run's logs gave new lines (or a node's follower changed state). The lines
    are already in the run's metrics store; a newer update of the same run replaces a queued
    older one, so a burst of lines costs the screen one redraw."""

    def __init__(self, update: RunUpdate) -> None:
        super().__init__()
        self.update = update

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunProgress) and message.update.run_id == self.update.run_id


class RunsFound(Message):
    """The runs of this cluster with their state (newest first), as ``find_runs`` saw them."""

    def __init__(self, statuses: Sequence[RunStatus]) -> None:
        super().__init__()
        self.statuses = list(statuses)


class RunStepsRead(Message):
    """The run picker's last steps: run id -> the last total step in its log (None: unknown)."""

    def __init__(self, steps: dict[str, int | None]) -> None:
        super().__init__()
        self.steps = steps


class RunStatusChecked(_Latest):
    """One run's state on every node, asked again (after its logs ended, or after a stop)."""

    def __init__(self, status: RunStatus) -> None:
        super().__init__()
        self.status = status


class LaunchPrepared(Message):
    """The nodes were asked, the plan built and the pre-flight checks run (``prep``), or the
    profile could not be read (``problem``, naming the file, line and key)."""

    def __init__(self, prep: Preparation | None, problem: str | None = None) -> None:
        super().__init__()
        self.prep = prep
        self.problem = problem


class RunLaunched(Message):
    """A run was started on every node (detached); its record. ``problem``: why it was not."""

    def __init__(self, record: RunRecord | None, problem: str | None = None) -> None:
        super().__init__()
        self.record = record
        self.problem = problem


class RunStopped(Message):
    """Stopping a run ended: per node what got SIGTERM, what needed SIGKILL, what is left."""

    def __init__(self, run_id: str, results: dict[str, StopResult]) -> None:
        super().__init__()
        self.run_id = run_id
        self.results = dict(results)


class MetricsExported(Message):
    """The charts (PNG) and the metrics history (CSV) were written to ``paths``."""

    def __init__(self, paths: Sequence[Path]) -> None:
        super().__init__()
        self.paths = tuple(paths)
