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

    from console.metrics import RankStatus
    from console.pool import NodeStatus
    from console.runs import RunRecord
    from console.telemetry import TelemetryUpdate


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
    no run is followed any more."""

    def __init__(self, record: RunRecord | None, ranks: Sequence[RankStatus] = ()) -> None:
        super().__init__()
        self.record = record
        self.ranks = tuple(ranks)
