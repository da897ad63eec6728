"""The detail pane of the Nodes screen: every fact of the highlighted node, with its age.

Fresh facts say how old they are ("12 s ago"); facts of a node that no longer answers are the last
known ones, shown as STALE with the time they were read and why the node did not answer. The
node's readiness verdict comes with its reasons, its hardware tier field by field, and every fact
where it differs from the other nodes (with what the difference costs).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.cluster.inventory import age_text

if TYPE_CHECKING:
    from console.cluster.inventory import Mismatch, NodeReport
    from console.cluster.model import Node
    from console.cluster.probe import NodeFacts
    from console.ssh.pool import NodeStatus
    from console.ssh.sshconfig import Endpoint

VERDICT_STYLE = {"ready": "bold green", "degraded": "bold yellow", "not ready": "bold red"}
MISMATCH_STYLE = "bold red"


def clock_time(ts: float) -> str:
    """A timestamp as the operator's local wall-clock time (HH:MM:SS)."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def facts_age(facts: NodeFacts, now: float) -> str:
    """"12 s ago", or "STALE: from 10:02:03 (5 min ago)" for last known facts."""
    age = f"{age_text(max(0.0, facts.age(now)))} ago"
    if facts.stale:
        return f"STALE: from {clock_time(facts.collected_at)} ({age})"
    return age


def _gb(value: Any) -> str:
    return "?" if value is None else f"{value:.0f} GB"


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.1f} GiB"


def _flag(value: bool | None, yes: str, no: str) -> str:
    return "?" if value is None else (yes if value else no)


class _Lines:
    """A Text built line by line: headings, ``label: value`` pairs, styled notes."""

    def __init__(self) -> None:
        self.text = Text()

    def heading(self, title: str) -> None:
        if self.text:
            self.text.append("\n")
        self.text.append(f"{title}\n", style="bold underline")

    def pair(self, label: str, value: Any, style: str = "") -> None:
        self.text.append(f"{label}: ", style="dim")
        self.text.append(f"{'?' if value in (None, '') else value}\n", style=style)

    def note(self, text: str, style: str = "") -> None:
        self.text.append(f"{text}\n", style=style)


def _node_section(out: _Lines, node: Node, status: NodeStatus | None,
                  endpoint: Endpoint | None) -> None:
    if node.local:
        out.pair("ssh", "local (no SSH)")
    elif endpoint is None:
        out.pair("ssh", f"{node.user or '(local user)'}@{node.host}:{node.port}")
    else:
        out.pair("ssh", endpoint.describe(), "red" if endpoint.error else "")
        defaults = []
        for label, value, where in endpoint.explain():
            if where == "default":
                defaults.append(f"{label} {value}")
                continue
            out.text.append(f"  {label}: ", style="dim")
            out.text.append(value)
            out.text.append("\n" if where == "HostName and Port" else f" ({where})\n",
                            style="dim")
        if defaults:
            out.text.append(f"  defaults: {', '.join(defaults)}\n", style="dim")
        if endpoint.error:
            out.note(endpoint.error, "red")
    out.pair("role", node.role)
    gpus = "all" if node.gpus is None else ",".join(map(str, node.gpus)) or "none"
    out.pair("gpus setting", gpus)
    if status is not None:
        label = getattr(status.state, "label", str(status.state))
        out.pair("connection", f"{label}{': ' + status.reason if status.reason else ''}")
        if status.rtt is not None:
            out.pair("ssh round trip", f"{status.rtt * 1000:.0f} ms")


def _verdict_section(out: _Lines, report: NodeReport | None, mismatches: list[Mismatch],
                     name: str) -> None:
    out.heading("Readiness")
    if report is None:
        out.note("not probed yet (r probes)", "dim")
        return
    out.text.append(report.verdict.value.upper() + "\n", style=VERDICT_STYLE[report.verdict.value])
    for reason in report.reasons:
        if reason.code != "mismatch":
            style = VERDICT_STYLE[reason.verdict.value].replace("bold ", "")
            out.note(f"• {reason.message}", style)
    odd = [m for m in mismatches if name in m.odd]
    if odd:
        out.heading("Differs from the other nodes")
        for m in odd:
            out.text.append(f"{m.label}: ", style="dim")
            out.text.append(m.values[name], style=MISMATCH_STYLE)
            out.text.append(f" (others: {m.majority})\n")
            out.note(f"  {m.note}", "italic")
    if report.tier is not None:
        out.heading(f"Hardware tier: {report.tier.tier}")
        for f in report.tier.fields:
            held = f"  needs {f.short_of} for the next tier" if f.short_of else ""
            style = "red" if f.level == 0 else "yellow" if f.field in report.tier.limited_by else ""
            out.pair(f.field, f"{f.value} ({f.tier}){held}", style)


def _gpu_lines(out: _Lines, facts: NodeFacts) -> None:
    out.heading(f"GPUs ({facts.gpu_source or 'none'})")
    if not facts.gpus:
        out.note(facts.gpu_error or "no NVIDIA GPU", "red")
    groups: dict[str, list[int]] = {}
    for g in facts.gpus:  # identical GPUs share one line
        pcie = f"PCIe gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen else "PCIe ?"
        nvlink = "" if g.nvlink_up is None else f", NVLink {g.nvlink_up} up"
        line = (f"{g.name} {_mb(g.memory_total_mb)}, cc {g.compute_capability or '?'}, "
                f"driver {g.driver_version or '?'}, CUDA {g.cuda_driver_version or '?'}, "
                f"persistence {_flag(g.persistence, 'on', 'off')}, "
                f"ECC {_flag(g.ecc, 'on', 'off')}, {pcie}{nvlink}")
        groups.setdefault(line, []).append(g.index)
    for line, indices in groups.items():
        which = (str(indices[0]) if len(indices) == 1
                 else f"{len(indices)}x (GPU {_ranges(indices)})")
        out.note(f"{which}: {line}")


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _python_lines(out: _Lines, facts: NodeFacts) -> None:
    py = facts.python or {}
    out.heading("Training Python")
    out.pair("interpreter", py.get("executable") or py.get("path"))
    out.pair("python", py.get("version"))
    torch = py.get("torch")
    if torch:
        extra = f" (CUDA {py.get('torch_cuda') or 'none'}, NCCL {py.get('nccl') or '?'})"
        torch += extra if py.get("torch_imported", True) else " (not imported)"
    for label, value in (("torch", torch), ("deepspeed", py.get("deepspeed")),
                         ("funasr", py.get("funasr")), ("numpy", py.get("numpy"))):
        out.pair(label, value or "not installed", "" if value else "red")
    if py.get("error"):
        out.note(py["error"], "red")


def _system_lines(out: _Lines, facts: NodeFacts) -> None:
    out.heading("System")
    out.pair("hostname", facts.hostname)
    out.pair("os", facts.os)
    out.pair("kernel", f"{facts.kernel or '?'} ({facts.arch or '?'})")
    out.pair("cpu", f"{facts.cpu_model or '?'}, {facts.cpu_cores or '?'} cores "
                    f"({facts.cpu_usable or '?'} usable)")
    out.pair("memory", f"{_mb(facts.mem_total_mb)} total, {_mb(facts.mem_available_mb)} available")
    if facts.load:
        out.pair("load", " ".join(f"{x:.2f}" for x in facts.load))
    root = facts.disk_root or {}
    out.pair("disk /", f"{_gb(root.get('free_gb'))} free of {_gb(root.get('total_gb'))}")
    for d in facts.disks:
        kind = "NVMe" if d.get("nvme") else "HDD" if d.get("rotational") else "SSD"
        out.pair(f"disk {d.get('name')}", f"{_gb(d.get('size_gb'))} {kind}")
    shared = facts.shared
    if shared is None:
        out.pair("shared_dir", facts.fact_errors.get("shared", "not reported"), "red")
    elif not shared.get("exists"):
        out.pair("shared_dir", f"{shared.get('path')} does not exist", "red")
    else:
        nfs = f"NFS from {shared.get('server')}" if shared.get("is_nfs") else "not NFS"
        out.pair("shared_dir", f"{shared.get('path')}: {shared.get('fstype')} "
                               f"({shared.get('source')}), {nfs}, "
                               f"{_gb(shared.get('free_gb'))} free")


def _network_lines(out: _Lines, facts: NodeFacts) -> None:
    out.heading("Network")
    for iface in facts.net:
        speed = f"{iface['speed_mbps']} Mb/s" if iface.get("speed_mbps") else "speed ?"
        addrs = ", ".join(iface.get("addrs") or []) or "no address"
        out.pair(iface.get("name", "?"), f"{iface.get('kind', '?')} {iface.get('state', '')} "
                                         f"{speed}, {addrs}")
    ports = ", ".join(f"{p.get('device')}/{p.get('port')} {p.get('state')} "
                      f"{p.get('rate_gbps')} Gb/s {p.get('link_layer')}" for p in facts.rdma_ports)
    out.pair("RDMA", ports or "none")
    if facts.clock_offset_s is not None:
        within = facts.clock_uncertainty_s or 0.0
        out.pair("clock offset", f"{facts.clock_offset_s:+.3f} s (± {within:.3f})")
    if facts.rtt_ms is not None:
        out.pair("round trip from here", f"{facts.rtt_ms:.1f} ms")
    if facts.master_rtt_ms is not None or facts.master_rtt_note:
        ms = "?" if facts.master_rtt_ms is None else f"{facts.master_rtt_ms:.1f} ms"
        out.pair("round trip from master", f"{ms} ({facts.master_rtt_note or ''})")


def detail_text(node: Node, facts: NodeFacts | None, status: NodeStatus | None,
                report: NodeReport | None, mismatches: list[Mismatch], now: float,
                endpoint: Endpoint | None = None) -> Text:
    """Everything known about one node, as the detail pane shows it; ``endpoint``: the pool's
    effective connection of the node (user@host:port via jumps, each value's origin)."""
    out = _Lines()
    out.text.append(f"{node.name}\n", style="bold reverse")
    _node_section(out, node, status, endpoint)
    if facts is None:
        out.pair("facts", "not probed yet")
    elif facts.ok or facts.stale:
        out.pair("facts", facts_age(facts, now), "bold yellow" if facts.stale else "")
        if facts.stale and facts.error:
            out.note(f"last probe failed: {facts.error}", "yellow")
    else:
        out.pair("probe", f"failed {facts_age(facts, now)}: {facts.error}", "red")
    _verdict_section(out, report, mismatches, node.name)
    if facts is not None and (facts.ok or facts.stale):
        _gpu_lines(out, facts)
        _python_lines(out, facts)
        _system_lines(out, facts)
        _network_lines(out, facts)
        if facts.fact_errors:
            out.heading("Facts the node could not read")
            for key, why in sorted(facts.fact_errors.items()):
                out.pair(key, why, "yellow")
        if facts.probe_seconds is not None:
            out.pair("probe took", f"{facts.probe_seconds:.1f} s on the node")
    out.text.rstrip()
    return out.text


class NodeDetail(VerticalScroll):
    """Scrollable pane with :func:`detail_text` of one node."""

    DEFAULT_CSS = """
    NodeDetail {
        border-left: vkey $primary 50%;
        padding: 0 1;
        height: 1fr;
    }
    NodeDetail > Static { width: 1fr; }
    """

    def compose(self):
        yield Static(id="node-detail-text")

    def show(self, text: Text) -> None:
        self.query_one("#node-detail-text", Static).update(text)
