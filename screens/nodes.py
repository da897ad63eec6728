"""The Nodes screen: is every node ready, and are they all the same?

One row per node of cluster.yaml with its live connection state (from the pool) and what the
probe found (GPUs, driver, CUDA, torch/DeepSpeed/FunASR, hardware tier, readiness verdict); the
cluster's verdict with its reasons on top; a detail pane with every fact of the highlighted node
and its age. Facts differing between nodes are highlighted in their cells and explained in the
detail pane.

Probes run in a thread worker, one node per thread; each node's facts are posted as soon as they
arrive. A refresh runs on ``r`` (marked nodes, else all) and every ``PROBE_INTERVAL`` seconds,
re-armed when a round ends (never two rounds at once) and held while the screen is hidden. A node
that no longer answers keeps its last known facts (the facts cache), shown as stale.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from console.atomic import atomic_write
from console.cluster.inventory import Reason, Report, Verdict, assess, consistency_values, gpu_class
from console.cluster.model import ClusterEditor, export_hostfile, import_hostfile, read_text
from console.cluster.probe import (
    PROBE_TIMEOUT,
    TORCH_TIMEOUT,
    FactsCache,
    NodeFacts,
    master_round_trips,
    probe_node,
)
from console.ssh.pool import NodeState
from screens.base import ConsoleScreen
from screens.bridge import follow_node_states
from screens.messages import ClusterChanged, NodeFactsArrived, NodeStatusChanged, ProbeRoundFinished
from screens.node_detail import VERDICT_STYLE, NodeDetail, detail_text
from screens.node_form import ConfirmDialog, NodeForm, PathPrompt, editor_for, remove_node

if TYPE_CHECKING:
    from console.cluster.model import Cluster
    from console.ssh.pool import NodeStatus

STATE_STYLE = {
    "up": "green",
    "connecting": "yellow",
    "unknown": "dim",
    "down": "red",
    "auth_failed": "red",
    "hostkey_unknown": "magenta",
    "hostkey_changed": "bold red",
}
STATE_ORDER = list(STATE_STYLE)
MISMATCH = "bold white on red"
STALE = "italic dim"
#: How many of the cluster's reasons show on top (narrow, wide); the rest are in the detail pane.
REASON_LINES = (3, 6)
REASON_MARK = {Verdict.NOT_READY: "✗", Verdict.DEGRADED: "!", Verdict.READY: "·"}
#: Terminal width from which the detail pane sits beside the table, with every column shown.
WIDE = 140


def _state_name(status) -> str:
    state = getattr(status.state, "value", status.state)
    return str(state).lower()


@dataclass(frozen=True)
class Column:
    """A table column: key, header, whether it is shown on a narrow (80 column) terminal, and
    the consistency fields whose mismatches it highlights."""

    key: str
    label: str
    narrow: bool
    fields: tuple[str, ...] = ()


COLUMNS: tuple[Column, ...] = (
    Column("mark", "✓", True),
    Column("node", "Node", True),
    Column("host", "Host", False),
    Column("state", "State", True),
    Column("gpus", "GPUs", True, ("gpu_model",)),
    Column("driver", "Driver", False, ("driver",)),
    Column("cuda", "CUDA", False, ("cuda",)),
    Column("stack", "torch/ds/funasr", True,
           ("torch", "deepspeed", "funasr", "torch_cuda", "nccl", "python", "python_path")),
    Column("tier", "Tier", False),
    Column("verdict", "Verdict", True),
)
#: Columns ``s`` cycles through for sorting.
SORTABLE = ("node", "host", "state", "gpus", "stack", "tier", "verdict")


def gpu_short(facts: NodeFacts) -> str:
    """"8x H200", "2x RTX 3090 + 1x T4", "none": the model's short name, without its memory."""
    if not facts.gpus:
        return "none"
    counts: dict[str, int] = {}
    for g in facts.gpus:
        cls = gpu_class(g.name)
        label = re.sub(r"\s+\d+GB$", "", cls.label) if cls else g.name.removeprefix("NVIDIA ")
        counts[label] = counts.get(label, 0) + 1
    return " + ".join(f"{n}x {label}" for label, n in counts.items())


@dataclass
class NodeView:
    """What the table shows of one node; ``text`` is what the filter searches."""

    name: str
    cells: dict[str, Text]
    sort: dict[str, object]

    @property
    def text(self) -> str:
        return " ".join(c.plain for c in self.cells.values()).lower()


class NodesScreen(ConsoleScreen):
    HELP = (
        "Every node of the cluster: live connection state, what the probe found (GPUs, driver, "
        "CUDA, torch/DeepSpeed/FunASR, hardware tier) and a readiness verdict, with the "
        "cluster's verdict and its reasons on top.\n\n"
        "Cells on red differ from the other nodes: mixed versions break collective "
        "communication (NCCL) between ranks; the detail pane says what differs and what it costs. "
        "Facts of a node that stopped answering are its last known ones, shown as stale with "
        "their time.\n\n"
        "r probes the marked nodes (all when none is marked); every node is probed again every "
        "minute while this screen is shown (without importing torch: its CUDA and NCCL versions "
        "come from the last full probe). Space marks a node, a marks all or none. / filters "
        "by any text (name, host, state, verdict), s cycles the sort column (or click a header). "
        "n, e and x add, edit and remove a node in cluster.yaml (checked as the loader does, "
        "saved atomically with its comments; the old file is kept as cluster.yaml.bak); i and o "
        "import and export a DeepSpeed hostfile."
    )

    #: Actions that change a node or a file: refused in read-only mode (screens/app.py).
    WRITES: ClassVar[dict[str, str]] = {
        "edit": "editing a node in cluster.yaml", "add": "adding a node to cluster.yaml",
        "remove": "removing a node from cluster.yaml",
        "import_hostfile": "importing a hostfile into cluster.yaml",
        "export_hostfile": "writing a hostfile",
    }
    BINDINGS = [
        Binding("r", "refresh", "Refresh", id="nodes.refresh"),
        Binding("slash", "filter", "Filter", key_display="/", id="nodes.filter"),
        Binding("space", "mark", "Mark", id="nodes.mark"),
        Binding("a", "mark_all", "Mark all/none", show=False, id="nodes.mark_all"),
        Binding("s", "sort", "Sort", show=False, id="nodes.sort"),
        Binding("d", "detail", "Detail", id="nodes.detail"),
        Binding("e", "edit", "Edit", id="nodes.edit"),
        Binding("n", "add", "New node", show=False, id="nodes.add"),
        Binding("x,delete", "remove", "Remove node", show=False, key_display="x",
                id="nodes.remove"),
        Binding("i", "import_hostfile", "Import hostfile", show=False, id="nodes.import"),
        Binding("o", "export_hostfile", "Export hostfile", show=False, id="nodes.export"),
        Binding("c", "reconnect", "Reconnect", show=False, id="nodes.reconnect"),
        Binding("escape", "clear_filter", "Clear filter", key_display="esc",
                id="nodes.clear_filter"),
    ]

    #: Screen CSS (app level, so it can refine app.tcss's rules for #nodes-summary/#nodes-table).
    CSS = """
    NodesScreen #nodes-reasons {
        height: auto; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis;
    }
    NodesScreen #nodes-main { layout: vertical; height: 1fr; }
    NodesScreen.-wide #nodes-main { layout: horizontal; }
    NodesScreen #nodes-table { height: 1fr; }
    NodesScreen.-wide #nodes-table { width: auto; max-width: 75%; }
    NodesScreen #node-detail { display: none; height: 1fr; border-left: none;
                               border-top: hkey $primary 50%; }
    NodesScreen.-detail #node-detail { display: block; }
    NodesScreen.-detail #nodes-table { height: auto; max-height: 50%; }
    NodesScreen.-wide #nodes-table { height: 1fr; max-height: 100%; }
    NodesScreen.-wide #node-detail { display: block; width: 1fr; border-top: none;
                                     border-left: vkey $primary 50%; }
    NodesScreen #nodes-filter { dock: bottom; display: none; }
    NodesScreen.-filtering #nodes-filter { display: block; }
    """

    #: Seconds between automatic probe rounds (counted from the end of the previous one).
    PROBE_INTERVAL: ClassVar[float] = 60.0
    #: Seconds one node's probe may take (connect, run, import torch).
    PROBE_TIMEOUT: ClassVar[float] = PROBE_TIMEOUT
    #: Seconds a node may spend importing torch in a full probe (r, and the first round).
    TORCH_TIMEOUT: ClassVar[float] = TORCH_TIMEOUT
    #: Seconds between updates of the ages shown in the detail pane.
    AGE_INTERVAL: ClassVar[float] = 5.0
    #: The clock for ages (tests fix it for stable snapshots).
    clock: ClassVar[Callable[[], float]] = staticmethod(time.time)

    def __init__(self) -> None:
        super().__init__()
        self.facts: dict[str, NodeFacts] = {}
        self.report: Report | None = None
        self.marked: set[str] = set()
        self.filter_text = ""
        self.sort_key = "node"
        self.sort_reverse = False
        self.probing: set[str] = set()  # nodes whose facts this round has not brought yet
        self.round_running = False
        self._probe_due = False
        self._back: set[str] = set()   # nodes up again whose last probe failed
        self._timer = None
        self._wide: bool | None = None
        self._unsubscribe: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static(id="nodes-summary")
        yield Static(id="nodes-reasons")
        with Container(id="nodes-main"):
            yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)
            yield NodeDetail(id="node-detail")
        yield Input(placeholder="filter: any text of the row (name, host, state, verdict)",
                    id="nodes-filter", compact=True)
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self._unsubscribe = follow_node_states(self, self.console.pool)
        self._layout(self.app.size.width)
        self.load_cached_facts(tuple(self.console.cluster.names()))
        self.set_interval(self.AGE_INTERVAL, self._age)
        if self.console.health_interval:  # the app talks to the nodes: probe them now
            self.start_probe(self.console.cluster.names())

    def on_unmount(self) -> None:
        self._unsubscribe()

    def on_resize(self, event: events.Resize) -> None:
        self._layout(event.size.width)

    def _layout(self, width: int) -> None:
        wide = width >= WIDE
        if wide == self._wide:
            return
        self._wide = wide
        self.set_class(wide, "-wide")
        table = self.query_one("#nodes-table", DataTable)
        table.clear(columns=True)
        for col in COLUMNS:
            if wide or col.narrow:
                table.add_column(col.label, key=col.key)
        self._render_table()

    @property
    def columns(self) -> list[Column]:
        return [c for c in COLUMNS if self._wide or c.narrow]

    # ------------------------------------------------------------------ data -> rows

    def _now(self) -> float:
        return type(self).clock()

    def _assess(self) -> None:
        cluster = self.console.cluster
        known = {n: self.facts[n] for n in cluster.names() if n in self.facts}
        self.report = assess(cluster, known, self._now()) if known else None

    def view(self, name: str, status: NodeStatus) -> NodeView:
        """The cells of one node's row."""
        node = self.console.cluster.node(name)
        facts = self.facts.get(name)
        rep = self.report.nodes.get(name) if self.report else None
        state = _state_name(status)
        state_text = Text(status.state.label if hasattr(status.state, "label") else state,
                          style=STATE_STYLE.get(state, ""))
        if name in self.probing:
            state_text.append(" …", style="dim")
        elif facts is not None and facts.stale:
            state_text.append(" stale", style="yellow")
        cells = {
            "mark": Text("●" if name in self.marked else " ", style="bold cyan"),
            "node": Text(name, style="bold" if node.role == "head" else ""),
            "host": Text("local" if node.local else f"{node.host}:{node.port}"),
            "state": state_text,
        }
        odd = {m.field for m in (self.report.mismatches if self.report else []) if name in m.odd}
        shown = facts is not None and (facts.ok or facts.stale)
        values = consistency_values(facts) if shown else {}
        base = STALE if facts is not None and facts.stale else ""
        for col in COLUMNS:
            if col.key in cells or col.key in ("tier", "verdict"):
                continue
            cells[col.key] = self._fact_cell(col, facts, values, odd, base) if shown else Text("")
        hidden = {f for c in COLUMNS if not (self._wide or c.narrow) for f in c.fields}
        if odd & hidden & {"driver", "cuda"}:  # narrow: driver/CUDA differences show on GPUs
            cells["gpus"].stylize(MISMATCH)
        cells["tier"] = Text(rep.tier.tier if rep and rep.tier else "", style=base)
        if rep is None:
            cells["verdict"] = Text("?", style="dim")
        else:
            cells["verdict"] = Text(rep.verdict.value, style=VERDICT_STYLE[rep.verdict.value])
        sort = {
            "node": name, "host": cells["host"].plain,
            "state": (STATE_ORDER.index(state) if state in STATE_ORDER else 99, name),
            "gpus": (-len(facts.gpus) if shown else 1, cells["gpus"].plain),
            "stack": cells["stack"].plain,
            "tier": -(rep.tier.level or 0) if rep and rep.tier else 1,
            "verdict": (rep.verdict.rank if rep else 9, name),
        }
        return NodeView(name, cells, sort)

    @staticmethod
    def _fact_cell(col: Column, facts: NodeFacts, values: dict[str, str], odd: set[str],
                   base: str) -> Text:
        def part(field: str) -> Text:
            value = "-" if values[field] == "missing" else values[field]
            return Text(value, style=MISMATCH if field in odd else base)

        if col.key == "gpus":
            return Text(gpu_short(facts), style=MISMATCH if "gpu_model" in odd else base)
        if col.key == "stack":
            out = Text("/", style=base).join(part(f) for f in ("torch", "deepspeed", "funasr"))
            if odd & set(col.fields[3:]):  # torch CUDA, NCCL, Python differ: flag the whole cell
                out.stylize(MISMATCH)
            return out
        return part(col.fields[0])

    def visible(self) -> list[NodeView]:
        """Rows after the filter, in sort order."""
        statuses = self.console.pool.statuses()
        views = [self.view(n, statuses[n]) for n in self.console.cluster.names()]
        needle = self.filter_text.lower().strip()
        if needle:
            views = [v for v in views if needle in v.text]
        return sorted(views, key=lambda v: v.sort[self.sort_key], reverse=self.sort_reverse)

    def _render_table(self) -> None:
        self._assess()
        table = self.query_one("#nodes-table", DataTable)
        keep = self.highlighted
        keys = [c.key for c in self.columns]
        table.clear()
        for view in self.visible():
            table.add_row(*(view.cells[k] for k in keys), key=view.name)
        if keep is not None and keep in table.rows:
            table.move_cursor(row=table.get_row_index(keep), animate=False)
        self._summarise()
        self._show_detail()

    @property
    def highlighted(self) -> str | None:
        table = self.query_one("#nodes-table", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def _summarise(self) -> None:
        cluster = self.console.cluster
        statuses = self.console.pool.statuses()
        up = sum(1 for s in statuses.values() if _state_name(s) == "up")
        unprobed = [n for n in cluster.names() if n not in self.facts]
        head = Text(f"{cluster.name}: ", style="bold")
        if self.report is None:
            reasons = [Reason("unprobed", "no facts yet: r probes every node", Verdict.READY)]
        else:
            reasons = [*self.report.reasons, *(Reason("unprobed", f"{n}: not probed yet",
                                                      Verdict.NOT_READY) for n in unprobed)]
        if unprobed and self.probing:
            head.append("CHECKING", style="bold yellow")
        elif self.report is None:
            head.append("NOT PROBED", style="bold")
        else:
            verdict = max((r.verdict for r in reasons), key=lambda v: v.rank, default=Verdict.READY)
            head.append(verdict.value.upper(), style=VERDICT_STYLE[verdict.value])
        head.append(f" · {up}/{len(cluster.nodes)} nodes up")
        if self.probing:
            head.append(f" · probing {len(self.probing)}", style="yellow")
        if self.marked:
            head.append(f" · {len(self.marked)} marked", style="cyan")
        if self.filter_text:
            shown = self.query_one("#nodes-table", DataTable).row_count
            head.append(f" · filter “{self.filter_text}”: {shown}/{len(cluster.nodes)}")
        arrow = "↓" if self.sort_reverse else "↑"
        head.append(f" · sort {self.sort_key}{arrow}", style="dim")
        self.query_one("#nodes-summary", Static).update(head)
        room = REASON_LINES[bool(self._wide)]
        ordered = sorted(reasons, key=lambda r: -r.verdict.rank)
        shown = [Text(f"{REASON_MARK[r.verdict]} {r.message}",
                      style=VERDICT_STYLE[r.verdict.value].replace("bold ", ""))
                 for r in ordered[:room if len(ordered) <= room else room - 1]]
        if len(ordered) > room:
            more = len(ordered) - room + 1
            shown.append(Text(f"… and {more} more: d shows each node's reasons",
                              style="dim"))
        lines = Text("\n").join(shown)
        box = self.query_one("#nodes-reasons", Static)
        box.update(lines)
        box.display = bool(reasons) and not (unprobed and self.probing)

    def _age(self) -> None:
        """Ages move on: the verdict's reasons ("facts from 5 min ago") and the detail pane."""
        if self.report is not None and self.is_active:
            self._assess()
            self._summarise()
            self._show_detail()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Clearing the filter is offered (in the footer) only while there is one."""
        if action == "clear_filter":
            return self.has_class("-filtering") or bool(self.filter_text)
        return True

    def _show_detail(self) -> None:
        pane = self.query_one(NodeDetail)
        name = self.highlighted
        if not pane.display or name is None:
            return
        rep = self.report.nodes.get(name) if self.report else None
        pane.show(detail_text(self.console.cluster.node(name), self.facts.get(name),
                              self.console.pool.statuses().get(name), rep,
                              self.report.mismatches if self.report else [], self._now(),
                              self.console.pool.endpoint(name)))

    # ------------------------------------------------------------------ messages

    def on_node_status_changed(self, message: NodeStatusChanged) -> None:
        name = message.status.node
        if name not in self.console.cluster.names():
            return
        facts = self.facts.get(name)
        if message.status.state == NodeState.UP and facts is not None and not facts.ok:
            # Back: its "unreachable" facts are probed again now, not at the next round.
            self._back.add(name)
            self._probe_back()
        self._render_table()

    def _probe_back(self) -> None:
        """Probe the nodes that came back, unless a round is running (then when it ends)."""
        if self._back and not self.round_running:
            names, self._back = sorted(self._back), set()
            self.start_probe(names, torch=False)

    def on_node_facts_arrived(self, message: NodeFactsArrived) -> None:
        name = message.facts.node
        if name not in self.console.cluster.names():
            return
        current = self.facts.get(name)
        if current is not None and message.facts.collected_at < current.collected_at:
            return  # the cache read on mount came after a probe's newer facts
        self.facts[name] = message.facts
        self.probing.discard(name)
        self._render_table()

    def on_probe_round_finished(self, message: ProbeRoundFinished) -> None:
        self.probing.difference_update(message.nodes)
        self.round_running = False
        self._render_table()
        self._arm()
        self._probe_back()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_detail()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = event.column_key.value
        if key in SORTABLE:
            self.sort_reverse = not self.sort_reverse if key == self.sort_key else False
            self.sort_key = key
            self._render_table()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "nodes-filter":
            self.filter_text = event.value
            self._render_table()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "nodes-filter":
            self.query_one("#nodes-table").focus()

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        if self._probe_due:
            self._periodic()

    # ------------------------------------------------------------------ probing

    def _arm(self) -> None:
        """One-shot timer for the next round, armed when a round ends: rounds never overlap."""
        if self._timer is not None:
            self._timer.stop()
        if self.console.health_interval:
            self._timer = self.set_timer(self.PROBE_INTERVAL, self._periodic)

    def _periodic(self) -> None:
        if not self.is_active:  # hidden or under a dialog: probe when the operator is back
            self._probe_due = True
            return
        self._probe_due = False
        self.start_probe(self.console.cluster.names(), torch=False)

    def start_probe(self, names: list[str], *, torch: bool = True) -> bool:
        """Probe these nodes unless a round is running; False when one is.

        ``torch=False`` (the periodic rounds) does not import torch on the nodes, which costs
        seconds of CPU on each; torch's CUDA and NCCL versions are then kept from the last full
        probe while the torch version is the same.
        """
        if self.round_running:
            return False
        self.round_running = True
        self.probing = set(names)
        self._render_table()
        previous = {n: self.facts[n] for n in names if n in self.facts}
        self.probe(tuple(names), previous, self.TORCH_TIMEOUT if torch else 0.0)
        return True

    def _cache(self, cluster: Cluster) -> FactsCache:
        from console.cli import state_dir

        return FactsCache(state_dir(), cluster.name)

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.cache",
          name="read the facts cache")
    def load_cached_facts(self, names: tuple[str, ...]) -> None:
        for facts in self._cache(self.console.cluster).stale(names).values():
            self.post_message(NodeFactsArrived(facts))

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.probe",
          name="probe nodes")
    def probe(self, names: tuple[str, ...], previous: dict[str, NodeFacts],
              torch_timeout: float) -> None:
        """Probe ``names`` in parallel; post each node's facts as it arrives, then the master's
        round trips to the nodes that answered."""
        cluster, pool = self.console.cluster, self.console.pool
        cache = self._cache(cluster)
        worker = get_current_worker()
        start = time.monotonic()
        fresh: dict[str, NodeFacts] = {}
        try:
            with ThreadPoolExecutor(max(1, min(len(names), cluster.ssh.max_parallel)),
                                    thread_name_prefix="probe") as pool_threads:
                futures = [pool_threads.submit(probe_node, pool, cluster, n,
                                               timeout=self.PROBE_TIMEOUT,
                                               torch_timeout=torch_timeout) for n in names]
                for future in as_completed(futures):
                    if worker.is_cancelled:
                        pool_threads.shutdown(wait=False, cancel_futures=True)
                        return
                    facts = future.result()
                    facts = keep_torch_details(facts, previous.get(facts.node))
                    fresh[facts.node] = cache.update({facts.node: facts})[facts.node]
                    self.post_message(NodeFactsArrived(fresh[facts.node]))
            up = [n for n, f in fresh.items() if f.ok]
            if up and cluster.master_node.name in up:
                for name, (ms, note) in master_round_trips(pool, cluster, up).items():
                    fresh[name].master_rtt_ms, fresh[name].master_rtt_note = ms, note
                    self.post_message(NodeFactsArrived(fresh[name]))
                cache.update({n: fresh[n] for n in up})
        finally:
            self.post_message(ProbeRoundFinished(tuple(names), time.monotonic() - start))

    # ------------------------------------------------------------------ actions

    def targets(self) -> list[str]:
        """The nodes an action applies to: the marked ones, else all."""
        names = self.console.cluster.names()
        return [n for n in names if n in self.marked] or names

    def action_refresh(self) -> None:
        targets = self.targets()
        if not self.start_probe(targets):
            self.notify("A probe is already running; r again when it ends.", timeout=3)

    def action_reconnect(self) -> None:
        self.console.check_nodes()

    def action_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one("#nodes-filter", Input).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#nodes-filter", Input)
        self.remove_class("-filtering")
        self.query_one("#nodes-table").focus()
        if box.value:
            box.value = ""  # Input.Changed re-renders the table

    def action_mark(self) -> None:
        name = self.highlighted
        if name is None:
            return
        self.marked.symmetric_difference_update({name})
        self._render_table()
        table = self.query_one("#nodes-table", DataTable)
        table.action_cursor_down()

    def action_mark_all(self) -> None:
        shown = {v.name for v in self.visible()}
        self.marked = set() if shown <= self.marked else self.marked | shown
        self._render_table()

    def action_sort(self) -> None:
        self.sort_key = SORTABLE[(SORTABLE.index(self.sort_key) + 1) % len(SORTABLE)]
        self.sort_reverse = False
        self._render_table()

    def action_detail(self) -> None:
        if self._wide:
            self.query_one(NodeDetail).focus()
            return
        self.toggle_class("-detail")
        self._show_detail()

    def action_add(self) -> None:
        self.app.push_screen(NodeForm(self.console.cluster), self._use_saved)

    def action_edit(self) -> None:
        if self.highlighted is not None:
            self.app.push_screen(NodeForm(self.console.cluster, self.highlighted), self._use_saved)

    def action_remove(self) -> None:
        name = self.highlighted
        if name is None:
            return
        where = self.console.cluster.path or "a new ./cluster.yaml"

        def answered(yes: bool | None) -> None:
            if yes:
                self.remove_worker(name)

        self.app.push_screen(ConfirmDialog(f"Remove node {name} from {where}?\n"
                                           "The old file is kept as cluster.yaml.bak."), answered)

    def action_import_hostfile(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.import_worker(path)

        self.app.push_screen(PathPrompt(
            "Import a DeepSpeed hostfile", "Lines \"host slots=N\": new hosts become nodes, known "
            "ones get gpus set to their slots. cluster.yaml is saved (old one as .bak).",
            "hostfile"), chosen)

    def action_export_hostfile(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.export_worker(path)

        self.app.push_screen(PathPrompt(
            "Export a DeepSpeed hostfile", "One \"host slots=N\" line per node (slots: the "
            "node's gpus setting, else the GPUs its probe found).", "hostfile"), chosen)

    # ------------------------------------------------------------------ cluster.yaml changes

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.file",
          name="remove the node")
    def remove_worker(self, name: str) -> None:
        cluster = remove_node(self.console.cluster, name)
        self.post_message(ClusterChanged(cluster, f"removed {name} from {cluster.path}"))

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.file",
          name="import the hostfile")
    def import_worker(self, path: str) -> None:
        entries = import_hostfile(read_text(Path(path), path), source=path)
        editor: ClusterEditor = editor_for(self.console.cluster)
        added, updated = editor.merge_hostfile(entries)
        cluster = editor.save()
        self.post_message(ClusterChanged(
            cluster, f"imported {path}: {len(added)} added, {len(updated)} updated"))

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.file",
          name="export the hostfile")
    def export_worker(self, path: str) -> None:
        counts = {n: len(f.gpus) for n, f in self.facts.items() if f.ok or f.stale}
        cluster = self.console.cluster
        text = export_hostfile(cluster, {n: c for n, c in counts.items()
                                         if cluster.node(n).gpus is None})
        hosts = [line for line in text.splitlines() if line and not line.startswith("#")]
        if not hosts:
            # as `svconsole hostfile export` refuses: a hostfile with no host line launches
            # nothing, whatever "(3 nodes)" would say
            raise ValueError(f"{path} not written: no node has a GPU (the probes found none and "
                             "no node sets gpus:), so the hostfile would have no host line; "
                             "set gpus: in cluster.yaml or use svconsole hostfile export "
                             "--slots N")
        atomic_write(Path(path).expanduser(), text, backup=True)
        left_out = len(cluster.nodes) - len(hosts)
        note = f"; {left_out} node(s) without GPUs left out" if left_out else ""
        self.app.call_from_thread(self.notify,
                                  f"wrote {path} ({len(hosts)} host line(s){note})")

    def _use_saved(self, cluster: Cluster | None) -> None:
        if cluster is not None:
            self.post_message(ClusterChanged(cluster, f"saved {cluster.path}"))

    def on_cluster_changed(self, message: ClusterChanged) -> None:
        # the app asks first when another screen has unsaved work (it is built anew)
        old = self.console.cluster
        self.console.reload_cluster(message.cluster, then=lambda: self._reloaded(old, message))

    def _reloaded(self, old: Cluster, message: ClusterChanged) -> None:
        self._unsubscribe()
        self._unsubscribe = follow_node_states(self, self.console.pool)
        names = set(message.cluster.names())
        self.facts = {n: f for n, f in self.facts.items() if n in names}
        self.marked &= names
        changed = [n.name for n in message.cluster.nodes if n.name not in old.names()
                   or _address(old.node(n.name)) != _address(n)]
        self._render_table()
        self.notify(message.what, timeout=4)
        if changed and self.console.health_interval:
            self.start_probe(changed)


def keep_torch_details(new: NodeFacts, old: NodeFacts | None) -> NodeFacts:
    """Facts of a probe that did not import torch, with torch's CUDA and NCCL versions from an
    earlier probe that did, when the interpreter and its torch version are the same."""
    py, before = new.python or {}, (old.python if old is not None else None) or {}
    if (new.ok and py.get("torch_imported") is False and before.get("torch_imported")
            and (py.get("executable"), py.get("torch")) == (before.get("executable"),
                                                            before.get("torch"))):
        return replace(new, python={**py, "torch_imported": True,
                                    "torch_cuda": before.get("torch_cuda"),
                                    "nccl": before.get("nccl")})
    return new


def _address(node) -> tuple:
    return (node.host, node.port, node.user, node.identity_file, node.local)


SCREEN = NodesScreen
