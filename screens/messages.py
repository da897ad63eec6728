"""Typed messages from the engine to the screens.

Engine objects call back on their own threads; ``bridge`` turns those callbacks into these messages
(``post_message`` is thread-safe). Noisy messages say which older queued message they replace, so a
burst of updates collapses instead of piling up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from console.pool import NodeStatus


class NodeStatusChanged(Message):
    """A node's connection state changed (up, connecting, down, auth failed, host key problem)."""

    def __init__(self, status: NodeStatus) -> None:
        super().__init__()
        self.status = status

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NodeStatusChanged) and message.status.node == self.status.node
