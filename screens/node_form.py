"""Dialogs of the Nodes screen that change cluster.yaml: add/edit a node, confirm a removal, and
ask for a hostfile path.

The node form checks the edited document exactly as the loader does (``ClusterEditor.validate``)
and shows each message at its field; it saves with ``ClusterEditor.save`` (atomic, the old file
kept as ``cluster.yaml.bak``, comments kept). Reading and writing the file happen in a thread
worker; the form dismisses itself with the new :class:`Cluster` once it is saved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from console.cluster.model import ClusterConfigError, ClusterEditor, ConfigIssue
from screens.base import ConsoleModal

if TYPE_CHECKING:
    from console.cluster.model import Cluster

#: The form's fields, in order: (key in cluster.yaml, label, placeholder).
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("name", "name", "node3"),
    ("host", "host", "192.168.1.103 or a DNS name"),
    ("port", "port", "ssh port (blank: ssh.port)"),
    ("user", "user", "blank: ssh.user"),
    ("role", "role", ""),
    ("gpus", "gpus", "CUDA_VISIBLE_DEVICES, e.g. 0,1,2,3 (blank: all)"),
    ("identity_file", "identity file", "blank: ssh.identity_file / agent"),
)
_NODE_FIELD = re.compile(r"nodes\[(\d+)\]\.(\w+)")

def new_file_text(cluster: Cluster) -> str:
    """cluster.yaml text for the embedded default (this machine, no SSH), to which the form adds
    its node: the local node stays, as the head and master."""
    local = cluster.nodes[0]
    return (
        "# cluster.yaml written by svconsole from the Nodes screen.\n"
        "# cluster.yaml.example describes every key.\n"
        "cluster:\n"
        f"  name: {cluster.name}\n"
        f"  shared_dir: {cluster.shared_dir}  # on every node (NFS from the head node)\n"
        f"  master: {local.name}  # hosts torchrun's rendezvous\n"
        "nodes:\n"
        f"  - name: {local.name}\n"
        "    local: true  # this machine, run without SSH\n"
        "    role: head\n"
    )


def editor_for(cluster: Cluster) -> ClusterEditor:
    """An editor of the cluster's file; for the embedded default, of a new ./cluster.yaml."""
    if cluster.path is None:
        return ClusterEditor(Path("cluster.yaml"), text=new_file_text(cluster))
    return ClusterEditor(cluster.path)


def entry_value(key: str, text: str) -> Any:
    """A form field as cluster.yaml gets it: None (key left out) when blank, a port of digits as
    a number; anything else as typed, so the loader judges it and says what is wrong."""
    text = text.strip()
    if not text:
        return None
    if key == "port" and text.isdigit():
        return int(text)
    return text


@dataclass(frozen=True)
class EditOutcome:
    """What an edit gives: the saved cluster, or the issues by form field ("" for the others)."""

    cluster: Cluster | None
    issues: dict[str, list[str]]


def edit_node(cluster: Cluster, old_name: str | None, values: dict[str, Any], *,
              save: bool = True) -> EditOutcome:
    """Add (``old_name`` None) or change a node, check as the loader does, and save if valid.

    Renaming the master node renames ``cluster.master`` with it.
    """
    editor = editor_for(cluster)
    if old_name is None:
        if values.get("name") in editor.node_names():
            return EditOutcome(None, {"name": [f"a node named {values['name']!r} already exists"]})
        editor.add_node({k: v for k, v in values.items() if v is not None})
        index = len(editor.node_names()) - 1
    else:
        index = editor.node_names().index(old_name)
        editor.update_node(old_name, values)
        cluster_section = editor.doc.get("cluster") or {}
        if values.get("name") and cluster_section.get("master") == old_name:
            editor.set("cluster.master", values["name"])
    issues = issues_by_field(editor.validate(), index)
    if issues or not save:
        return EditOutcome(None, issues)
    return EditOutcome(editor.save(), {})


def remove_node(cluster: Cluster, name: str) -> Cluster:
    """Remove a node from cluster.yaml and save; ClusterConfigError (the loader's messages) if the
    rest would not load (such as removing the master node)."""
    editor = editor_for(cluster)
    editor.remove_node(name)
    return editor.save()


def issues_by_field(issues: list[ConfigIssue], index: int) -> dict[str, list[str]]:
    """The loader's issues of node ``index`` by field name; the others under "" in full."""
    out: dict[str, list[str]] = {}
    for issue in issues:
        m = _NODE_FIELD.fullmatch(issue.field)
        if m and int(m.group(1)) == index:
            out.setdefault(m.group(2), []).append(str(issue))
        else:
            out.setdefault("", []).append(str(issue))
    return out


class NodeForm(ConsoleModal):
    """Add or edit one node of cluster.yaml. Dismisses with the saved cluster, or None."""

    DEFAULT_CSS = """
    NodeForm { align: center middle; }
    NodeForm > Vertical {
        width: 78; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    NodeForm .title { text-style: bold; }
    NodeForm .note { color: $text-muted; }
    NodeForm .row { height: 1; }
    NodeForm .row Label { width: 15; }
    NodeForm .row Input, NodeForm .row Select { width: 1fr; }
    NodeForm .error { color: $error; padding-left: 15; height: auto; }
    NodeForm .error.-empty { display: none; }
    NodeForm #form-general { padding-left: 0; }
    NodeForm #form-buttons { height: 1; margin-top: 1; align-horizontal: right; }
    NodeForm #form-buttons Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+s", "save", "Save", id="form.save"),
    ]

    class Checked(Message):
        """The worker's answer: the saved cluster, or the issues to show."""

        def __init__(self, outcome: EditOutcome) -> None:
            super().__init__()
            self.outcome = outcome

    def __init__(self, cluster: Cluster, node: str | None = None) -> None:
        super().__init__()
        self.cluster = cluster
        self.node_name = node

    def _initial(self) -> dict[str, str]:
        if self.node_name is None:
            return {"role": "worker"}
        entry = editor_for(self.cluster).node_entry(self.node_name)
        return {k: "" if entry.get(k) is None else str(entry.get(k)) for k, _, _ in FIELDS}

    def compose(self) -> ComposeResult:
        values = self._initial()
        title = f"Edit node {self.node_name}" if self.node_name else "Add a node"
        if self.cluster.path is None:
            note = (f"No cluster.yaml yet: saving creates {Path.cwd() / 'cluster.yaml'} with "
                    "this machine and the new node.")
        else:
            note = f"Saved to {self.cluster.path} (comments kept, old file as .bak)."
        with Vertical():
            yield Static(title, classes="title")
            yield Static(note, classes="note")
            for key, label, placeholder in FIELDS:
                with Horizontal(classes="row"):
                    yield Label(label)
                    if key == "role":
                        yield Select([("worker", "worker"), ("head", "head")], id="field-role",
                                     value=values.get("role") or "worker", allow_blank=False,
                                     compact=True)
                    else:
                        yield Input(values.get(key, ""), placeholder=placeholder,
                                    id=f"field-{key}", compact=True)
                yield Static("", id=f"error-{key}", classes="error -empty")
            yield Static("", id="form-general", classes="error -empty")
            with Horizontal(id="form-buttons"):
                yield Button("Save (ctrl+s)", id="save", variant="primary", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self._initial_values = self.values()

    def typed_edits(self) -> str | None:
        """The fields typed but not saved, in words ("the new node's name, host")."""
        before = getattr(self, "_initial_values", None)
        if before is None:
            return None
        changed = [key for key, value in self.values().items() if value != before.get(key)]
        if not changed:
            return None
        whose = f"node {self.node_name}'s" if self.node_name else "the new node's"
        return f"{whose} {', '.join(changed)}"

    def unsaved_work(self) -> str | None:
        """What closing the form would lose; the app asks before it quits."""
        edits = self.typed_edits()
        return None if edits is None else f"Nodes: {edits} typed, not saved to cluster.yaml."

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, _, _ in FIELDS:
            if key == "role":
                out[key] = str(self.query_one("#field-role", Select).value)
            else:
                out[key] = entry_value(key, self.query_one(f"#field-{key}", Input).value)
        return out

    def show_issues(self, issues: dict[str, list[str]]) -> None:
        for key in [k for k, _, _ in FIELDS] + ["general"]:
            box = self.query_one(f"#error-{key}" if key != "general" else "#form-general", Static)
            text = "\n".join(issues.get("" if key == "general" else key, []))
            box.update(text)
            box.set_class(not text, "-empty")

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        self.check_and_save(self.values())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        """Close without saving; typed edits are discarded only once confirmed."""
        edits = self.typed_edits()
        if edits is None:
            self.dismiss(None)
            return
        question = f"Discard {edits}? Nothing is written to cluster.yaml."

        def answered(discard: bool | None) -> None:
            if discard:
                self.dismiss(None)

        self.app.push_screen(ConfirmDialog(question), answered)

    @work(thread=True, exclusive=True, exit_on_error=False, group="nodes.form",
          name="save cluster.yaml")
    def check_and_save(self, values: dict[str, Any]) -> None:
        try:
            outcome = edit_node(self.cluster, self.node_name, values)
        except ClusterConfigError as exc:  # the file on disk itself no longer loads
            outcome = EditOutcome(None, {"": [str(exc)]})
        self.post_message(self.Checked(outcome))

    def on_node_form_checked(self, message: Checked) -> None:
        if message.outcome.cluster is not None:
            self.dismiss(message.outcome.cluster)
        else:
            self.show_issues(message.outcome.issues)


class ConfirmDialog(ModalScreen[bool]):
    """A yes/no question; y or enter says yes, n or escape says no."""

    DEFAULT_CSS = """
    ConfirmDialog { align: center middle; }
    ConfirmDialog > Vertical {
        width: 64; max-width: 100%; height: auto; border: round $warning;
        background: $surface; padding: 0 1;
    }
    ConfirmDialog #confirm-buttons { height: 1; margin-top: 1; align-horizontal: right; }
    ConfirmDialog Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]
    AUTO_FOCUS = "#no"  # the safe answer; (a query in on_mount failed when a key closed it first)

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question)
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", id="yes", variant="error", compact=True)
                yield Button("No (n)", id="no", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PathPrompt(ModalScreen["str | None"]):
    """Ask for a file path (hostfile import or export); enter accepts, escape cancels."""

    DEFAULT_CSS = """
    PathPrompt { align: center middle; }
    PathPrompt > Vertical {
        width: 76; max-width: 100%; height: auto; border: round $accent;
        background: $surface; padding: 0 1;
    }
    PathPrompt .note { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="prompt.cancel")]

    def __init__(self, title: str, note: str, value: str = "") -> None:
        super().__init__()
        self.title_text, self.note, self.value = title, note, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            yield Static(self.note, classes="note")
            yield Input(self.value, placeholder="path", id="prompt-path", compact=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
