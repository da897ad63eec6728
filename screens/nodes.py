"""The Nodes screen: every node of cluster.yaml with its live connection state."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from screens.base import ConsoleScreen
from screens.bridge import follow_node_states
from screens.messages import NodeStatusChanged

STATE_STYLE = {
    "up": "green",
    "connecting": "yellow",
    "unknown": "dim",
    "down": "red",
    "auth_failed": "red",
    "hostkey_unknown": "magenta",
    "hostkey_changed": "bold red",
}


def _state_name(status) -> str:
    state = getattr(status.state, "value", status.state)
    return str(state).lower()


class NodesScreen(ConsoleScreen):
    HELP = ("Every node of the cluster and its connection state, live. The pool keeps one SSH "
            "connection per node and probes it; a node that stops answering is marked down with "
            "the reason and reconnected with backoff.")

    BINDINGS = [
        Binding("r", "reconnect", "Reconnect", id="nodes.reconnect"),
    ]

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static(id="nodes-summary")
        yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)
        yield from self.compose_footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("Node", key="node")
        table.add_column("Host", key="host")
        table.add_column("Role", key="role")
        table.add_column("State", key="state")
        table.add_column("RTT", key="rtt")
        table.add_column("Reason", key="reason")
        pool = self.console.pool
        for node in self.console.cluster.nodes:
            host = "local" if node.local else f"{node.host}:{node.port}"
            table.add_row(node.name, host, node.role, "", "", "", key=node.name)
        for status in pool.statuses().values():
            self._show(status)
        self._unsubscribe = follow_node_states(self, pool)
        self._summarise()

    def on_unmount(self) -> None:
        self._unsubscribe()

    def on_node_status_changed(self, message: NodeStatusChanged) -> None:
        self._show(message.status)
        self._summarise()

    def _show(self, status) -> None:
        table = self.query_one(DataTable)
        name = _state_name(status)
        style = STATE_STYLE.get(name, "")
        label = name.replace("_", " ")
        table.update_cell(status.node, "state", f"[{style}]{label}[/]" if style else label,
                          update_width=True)
        rtt = "" if status.rtt is None else f"{status.rtt * 1000:.0f} ms"
        table.update_cell(status.node, "rtt", rtt, update_width=True)
        table.update_cell(status.node, "reason", status.reason or "", update_width=True)

    def _summarise(self) -> None:
        statuses = self.console.pool.statuses()
        up = sum(1 for s in statuses.values() if _state_name(s) == "up")
        self.query_one("#nodes-summary", Static).update(
            f"{self.console.cluster.name}: {up}/{len(self.console.cluster.nodes)} nodes up"
        )

    def action_reconnect(self) -> None:
        self.console.check_nodes()
SCREEN = NodesScreen
