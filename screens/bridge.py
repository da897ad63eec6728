"""The thin adapter between ``console`` objects and Textual: subscribe on mount, post messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from screens.messages import NodeStatusChanged

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from console.ssh.pool import NodeStatus, Pool


def follow_node_states(target: MessagePump, pool: Pool) -> Callable[[], None]:
    """Post a ``NodeStatusChanged`` to ``target`` for every state change the pool publishes.

    Returns the unsubscribe function; call it when ``target`` unmounts.
    """

    def publish(status: NodeStatus) -> None:
        target.post_message(NodeStatusChanged(status))

    return pool.subscribe(publish)
