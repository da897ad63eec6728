"""The Config screen: the DeepSpeed JSON and the training profile, validated as you type.

Two files beside cluster.yaml (the current directory for the embedded default): ``ds_config.json``
and ``training.yaml``. A missing JSON starts from what launch would ship (the profile's
deepspeed_config, else the default preset for the cluster's GPUs and versions), a missing profile
from the packaged one; a file is written only when the operator saves (ctrl+s: atomic, the old
file kept as ``.bak``) and one of its values changed. A file changed on disk since it was read is
never overwritten silently: the save asks (reload theirs / overwrite with mine / three-way diff).

The JSON editor's text is the operator's: validation never rewrites it nor moves its cursor; a
form edit changes just its value's characters. While the JSON is invalid the form shows the last
valid JSON's values and where the error is. ``unsaved_work()`` says what leaving would lose.

The two files (a few KB, local) are read when the screen mounts, before its first paint.
Validation (``console.training.dsconfig.validate``: DeepSpeed's own rules, the tuning matrix, the cluster)
runs in a thread worker 300 ms after the last keystroke; a newer one cancels an older one. The
deepspeed import is slow, so it happens once, in the background, when the screen mounts. The
cluster comes from the cached node facts, or from a probe of the nodes in a worker.

Tabs: Form (fields by section, each finding shown at its field), JSON (the raw text, editable),
Diff (against the saved files or a preset), Report (every finding and the memory estimate).
``has_errors`` and ``report`` are what a launch checks before it goes ahead.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.timer import Timer
from textual.widgets import Input, Select, Static, TabbedContent, TabPane, Tabs, TextArea
from textual.worker import get_current_worker

from console.cli import state_dir
from console.cluster.probe import FactsCache, FactsCacheError, probe_all
from console.training import dsconfig
from console.training.dsconfig import Finding, Report
from console.training.profile import ProfileError, profile_text, save_profile
from screens.base import ConsoleScreen
from screens.bridge import follow_node_states
from screens.config_widgets import (
    FIELDS,
    FORM,
    ConfigFiles,
    ConfirmSave,
    FieldRow,
    FileStamp,
    JsonEditor,
    OutsideChoice,
    OutsideEdit,
    field_for,
    finding_text,
    literal_of,
    profile_value,
    read_files,
    set_value,
    shown_profile_value,
    shown_value,
    three_way_diff,
)
from screens.messages import (
    ClusterSpecReady,
    ConfigSaved,
    ConfigValidated,
    DataListsChecked,
    DeepSpeedLoaded,
    NodeStatusChanged,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from console.ssh.pool import NodeStatus
    from console.training.profile import TrainingProfile

#: Seconds after the last keystroke before the config is validated again.
DEBOUNCE_S = 0.3
#: What the Diff tab compares with: the saved files, or one of the presets.
DIFF_TARGETS = (("saved files", "saved"),
                *((name.replace("ds_", "").replace("_", " "), name) for name in dsconfig.PRESETS))
_DATA_KEYS = ("train_data_set_list", "valid_data_set_list")


def age_text(seconds: float) -> str:
    """``just now``, ``5 min ago``, ``3 h ago``, ``2 days ago``."""
    if seconds < 60:
        return "just now"
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' * (unit == 'day' and n != 1)} ago"
    return "just now"


class ConfigScreen(ConsoleScreen):
    HELP = (
        "The DeepSpeed JSON (ds_config.json) and the FunASR training knobs (training.yaml), "
        "both beside cluster.yaml. Each edit is validated 300 ms after you stop typing: by the "
        "installed DeepSpeed with the cluster's real world size, by the tuning matrix of the "
        "seed guide, and by the cluster (bf16 needs compute capability 8.0, the memory estimate "
        "against each GPU, output_dir on shared storage, the data lists on every node, known "
        "incompatibilities of the installed versions). Findings appear at their field: "
        "red errors, yellow warnings, dim notes, each with why and a fix.\n\n"
        "Tabs: Form (F2), JSON (F3, the raw text: edit it freely, syntax errors show line:col), "
        "Diff (F4, against the saved files or a preset), Report (F5, every finding and the "
        "memory estimate with how it is made). Tab / shift+tab move between fields; escape "
        "leaves a field so that 1-5, ? and q work again. Keys the form does not know are kept, "
        "and a form edit changes only its value in the JSON. Nothing is written until ctrl+s, "
        "and then only a file whose values changed; saving a config with errors asks first, "
        "naming them, and a file changed on disk since it was read asks too: reload theirs (r), "
        "overwrite with mine (o) or see the three-way diff (d). A new ds_config.json starts from "
        "the profile's deepspeed_config, else from the default preset for the nodes' GPUs and "
        "FunASR version (fp32 or bf16, and why); svconsole validate checks the same files and "
        "prints the same summary line.")

    #: Actions that change a node or a file: refused in read-only mode (screens/app.py).
    WRITES: ClassVar[dict[str, str]] = {"save": "saving ds_config.json and training.yaml"}
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", id="config.save", priority=True),
        Binding("ctrl+r", "probe", "Probe nodes", id="config.probe", priority=True),
        Binding("f2", "show_tab('tab-form')", "Form", id="config.form"),
        Binding("f3", "show_tab('tab-json')", "JSON", id="config.json"),
        Binding("f4", "show_tab('tab-diff')", "Diff", id="config.diff"),
        Binding("f5", "show_tab('tab-report')", "Report", id="config.report"),
        Binding("escape", "leave_field", "Leave field", id="config.leave", show=False),
    ]

    DEFAULT_CSS = """
    ConfigScreen #config-summary, ConfigScreen #config-status {
        height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis;
    }
    ConfigScreen #config-summary { background: $boost; }
    ConfigScreen #config-status { color: $text-muted; }
    ConfigScreen TabbedContent { height: 1fr; }
    ConfigScreen TabPane { padding: 0; }
    ConfigScreen .section { padding: 1 1 0 1; text-style: bold; color: $accent; }
    ConfigScreen #form-general { padding: 0 1; height: auto; }
    ConfigScreen #json-text { height: 1fr; }
    ConfigScreen #json-findings { height: auto; max-height: 6; padding: 0 1; }
    ConfigScreen #diff-target { width: 40; }
    ConfigScreen #diff-text, ConfigScreen #report-text { padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.files: ConfigFiles | None = None
        self.ds_text = ""
        self.profile: TrainingProfile | None = None
        self.profile_issues: dict[str, str] = {}
        self.spec: dsconfig.ClusterSpec | None = None
        self.deepspeed: str | None = None   # "loading", a version, or the import problem
        self.report: Report | None = None
        """The last validation's report (with the data lists and the profile's own checks)."""
        self._facts_source = "cluster facts: reading the cache…"
        self._facts_at: float | None = None
        self._facts_ready = False
        self._waiting_for_nodes = False
        self._unsubscribe: Callable[[], None] = lambda: None
        self._up: tuple[str, ...] = ()
        #: Each node's last known up (True) or not: the data lists are looked for again when
        #: one of the checked nodes changes, so their findings follow the nodes.
        self._node_up: dict[str, bool] = {}
        #: A node changed while a data check was under way: check again when it answers.
        self._data_again = False
        self._data: tuple[tuple[str, str] | None, list[Finding]] = (None, [])
        self._data_pending = False
        self._generation = 0
        self._validated = -1
        self._timer: Timer | None = None
        self._rows: dict[str, FieldRow] = {}
        self._filling: dict[str, list[str]] = {}
        """Values the screen put in each input itself, whose Changed messages are still on
        their way (they are not edits, and never touch the JSON)."""
        self._valid_doc: dsconfig.DSDocument | None = None
        """The last valid JSON: the form shows its values while the text is invalid."""
        self._json_error: str | None = None
        self._general: list[Finding] = []
        self.diff = ""
        """The unified diff the Diff tab shows."""

    # -------------------------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield from self.compose_header()
        yield Static("reading the files…", id="config-summary")
        yield Static("", id="config-status")
        with TabbedContent(id="config-tabs", initial="tab-form"):
            with TabPane("Form", id="tab-form"), VerticalScroll(id="form"):
                yield Static(id="form-general")
                for title, specs in FORM:
                    yield Static(title, classes="section")
                    for spec in specs:
                        row = FieldRow(spec)
                        self._rows[spec.key] = row
                        yield row
            with TabPane("JSON", id="tab-json"):
                yield JsonEditor.code_editor("", language="json", id="json-text",
                                             soft_wrap=False)
                yield Static(id="json-findings")
            with TabPane("Diff", id="tab-diff"):
                yield Select(DIFF_TARGETS, value="saved", allow_blank=False, id="diff-target")
                with VerticalScroll():
                    yield Static(id="diff-text")
            with TabPane("Report", id="tab-report"), VerticalScroll():
                yield Static(id="report-text")
        yield from self.compose_footer()

    def on_mount(self) -> None:
        self.deepspeed = "loading"
        self.warm_up_deepspeed()
        self.load_facts(probe=False)
        self._unsubscribe = follow_node_states(self, self.console.pool)
        # Two small local files, read before the first paint (the form is never shown empty).
        self._use_files(read_files(self.console.cluster))

    def on_unmount(self) -> None:
        self._unsubscribe()

    # -------------------------------------------------------------------------------- API

    @property
    def has_errors(self) -> bool:
        """True when the last validation found errors (or it has not run yet)."""
        return self.report is None or not self.report.ok

    def unsaved_work(self) -> str | None:
        """What leaving now would lose, as a sentence (``None``: nothing): the app asks before
        it quits or reloads the cluster."""
        if self.files is None:
            return None
        files, lost = self.files, []
        if files.ds_saved is not None and self.ds_text != files.ds_saved:
            lost.append(f"edits of {files.ds_path.name}")
        elif files.ds_saved is None and self.ds_text != files.ds_text:
            lost.append(f"edits of the new {files.ds_path.name}")
        if self.profile is not None and self.profile != files.profile:
            keys = files.profile.changed_keys(self.profile)
            lost.append(f"edits of {files.profile_path.name} ({', '.join(keys)})")
        lost += [f"the value typed for {key} in {files.profile_path.name}"
                 for key in self.profile_issues]
        return ("Config: unsaved " + "; ".join(lost) + ".") if lost else None

    @property
    def settled(self) -> bool:
        """Nothing pending: files read, DeepSpeed loaded, cluster known, data lists looked
        for, and the latest edit validated."""
        return (self.files is not None and self.deepspeed != "loading" and self._facts_ready
                and not self._data_pending and self._timer is None
                and self._validated == self._generation)

    # -------------------------------------------------------------------------------- workers

    @work(thread=True, exclusive=True, group="config-deepspeed", name="import deepspeed",
          exit_on_error=False)
    def warm_up_deepspeed(self) -> None:
        version = dsconfig.warm_up()
        self.post_message(DeepSpeedLoaded(version, dsconfig.deepspeed_problem()))

    @work(thread=True, exclusive=True, group="config-facts", name="read the cluster facts",
          exit_on_error=False)
    def load_facts(self, probe: bool) -> None:
        cluster = self.console.cluster
        cache = FactsCache(state_dir(), cluster.name)
        facts = {}
        note = ""
        if not probe:
            try:
                facts = {k: v for k, v in cache.load().items() if k in cluster.names()}
            except FactsCacheError as exc:
                note = f" ({exc})"
        source = "cached facts"
        if not facts:  # CPU-only nodes' facts count too: their training stack is checked
            if not probe:
                self.post_message(ClusterSpecReady(
                    None, f"no cached facts{note}: the nodes are probed once one is up "
                    "(ctrl+r: now)", waiting=True))
                return
            self.post_message(ClusterSpecReady(
                None, f"probing {len(cluster.nodes)} node(s) for their GPUs…{note}"))
            facts = probe_all(self.console.pool, cluster, cache=cache)
            source = "facts probed"
        spec = dsconfig.ClusterSpec.from_facts(cluster, facts)
        times = [f.collected_at for f in facts.values() if f.collected_at]
        up = tuple(name for name, f in facts.items() if f.ok)
        self.post_message(ClusterSpecReady(spec, source, min(times) if times else None, up))

    @work(thread=True, exclusive=True, group="config-data", name="look for the data lists",
          exit_on_error=False)
    def check_data(self, profile: TrainingProfile, nodes: tuple[str, ...]) -> None:
        pool = self.console.pool
        found = dsconfig.check_data_on_nodes(lambda n, c: pool.run(n, c, timeout=20), nodes,
                                             profile)
        paths = (profile.train_data_set_list, profile.valid_data_set_list)
        self.post_message(DataListsChecked(paths, found))

    @work(thread=True, exclusive=True, group="config-validate", name="validate the config",
          exit_on_error=False)
    def validate(self, text: str, name: str, profile: TrainingProfile | None,
                 spec: dsconfig.ClusterSpec | None, extra: list[Finding], generation: int) -> None:
        report = dsconfig.validate(text, name=name, profile=profile, cluster=spec)
        report.add(extra)
        if not get_current_worker().is_cancelled:
            self.post_message(ConfigValidated(report, generation))

    @work(thread=True, exclusive=True, group="config-save", name="save the config",
          exit_on_error=False)
    def write_files(self, files: ConfigFiles, ds_text: str, profile: TrainingProfile,
                    save_ds: bool, save_pf: bool) -> None:
        written, notes = [], []
        if save_ds:
            written.append(dsconfig.save(files.ds_path, ds_text))
        elif self._ds_changed(files, ds_text):
            notes.append(f"{files.ds_path.name} NOT saved: it is not valid JSON")
        if save_pf:
            written.append(save_profile(profile, files.profile_path))
        self.post_message(ConfigSaved(files, written, notes))

    # -------------------------------------------------------------------------------- messages

    def _use_files(self, files: ConfigFiles) -> None:
        self.files = files
        self.profile = files.profile
        self.profile_issues.clear()
        self.ds_text = files.ds_text
        self.query_one("#json-text", TextArea).load_text(files.ds_text)
        self._fill_form()
        self._start_data_check()
        self._changed(now=True)

    def _offer_default_preset(self) -> None:
        """A new JSON from the default preset, untouched: the preset for the cluster now known
        (fp32 or bf16 by its GPUs and versions)."""
        files = self.files
        if (files is None or files.ds_saved is not None or files.shipped is None
                or files.shipped.origin != "preset"):
            return
        name, why = dsconfig.default_preset(self.spec)
        if self.ds_text != files.ds_text:  # edited: the text stays, the note says the default
            files.shipped = dataclasses.replace(
                files.shipped, why=why if name == files.shipped.preset
                else f"for this cluster the default is {name}: {why}")
            files.notes = [files.shipped.note, *files.notes[1:]]
            return
        text = dsconfig.preset_text(name)
        files.shipped = dsconfig.ShippedJSON(files.ds_path, text, "preset", None, name, why)
        files.notes = [files.shipped.note, *files.notes[1:]]
        if text != files.ds_text:
            files.ds_text = self.ds_text = text
            self.query_one("#json-text", TextArea).load_text(text)
            self._fill_form(only="ds")

    def on_deep_speed_loaded(self, message: DeepSpeedLoaded) -> None:
        self.deepspeed = message.version or f"not installed: {message.problem}"
        self._changed(now=True)

    def on_cluster_spec_ready(self, message: ClusterSpecReady) -> None:
        if message.spec is None:
            self._facts_source = message.source
            self._waiting_for_nodes = message.waiting
            if message.waiting:
                self._facts_ready = True  # nothing to wait for: validate without a cluster
                if any(self._is_up(s) for s in self.console.pool.statuses().values()):
                    self.action_probe()
            self._show_status()
            return
        self.spec, self._facts_at, self._up = message.spec, message.collected_at, message.up
        self._facts_source = message.source
        self._facts_ready = True
        self._offer_default_preset()
        self._start_data_check()
        self._changed(now=True)

    def on_node_status_changed(self, message: NodeStatusChanged) -> None:
        node, up = message.status.node, self._is_up(message.status)
        changed = self._node_up.get(node, up) != up
        self._node_up[node] = up
        if self._waiting_for_nodes and up:
            self.action_probe()
        elif changed and node in self._up:  # "not readable on node1" goes once it is back
            self._data_again = self._data_pending
            self._start_data_check()

    @staticmethod
    def _is_up(status: NodeStatus) -> bool:
        return str(getattr(status.state, "value", status.state)).lower() == "up"

    def on_data_lists_checked(self, message: DataListsChecked) -> None:
        self._data = (message.paths, message.findings)
        self._data_pending = False
        if self.profile and (self._data_again
                             or message.paths != self._data_paths(self.profile)):
            self._data_again = False
            self._start_data_check()
        self._changed(now=True)

    def on_config_validated(self, message: ConfigValidated) -> None:
        if message.generation < self._validated:
            return
        self._validated = message.generation
        self.report = message.report
        self._show_findings(message.report)

    def on_config_saved(self, message: ConfigSaved) -> None:
        files = message.files
        names = {p.name for p in message.written}
        if files.ds_path.name in names:
            files.ds_saved = files.ds_path.read_text(encoding="utf-8")
            files.ds_stamp = FileStamp.of_text(files.ds_path, files.ds_saved)
            files.notes = [n for n in files.notes if not n.startswith(files.ds_path.name)]
        if files.profile_path.name in names and self.profile is not None:
            files.profile_saved = files.profile_path.read_text(encoding="utf-8")
            files.profile_stamp = FileStamp.of_text(files.profile_path, files.profile_saved)
            files.profile = self.profile
            files.notes = [n for n in files.notes if not n.startswith(files.profile_path.name)]
        self.files = files
        self.notify(f"saved {', '.join(sorted(names))} (previous versions kept as .bak)"
                    + "".join(f"\n{n}" for n in message.notes),
                    severity="warning" if message.notes else "information")
        self._changed(now=True)

    # -------------------------------------------------------------------------------- edits

    @on(Input.Changed)
    def _field_changed(self, event: Input.Changed) -> None:
        spec = FIELDS.get(event.input.name or "")
        if spec is None or self.files is None or self.profile is None:
            return
        filled = self._filling.get(spec.key)
        if filled and event.value in filled:
            del filled[:filled.index(event.value) + 1]
            return  # the screen filled this value in itself: not an edit
        if spec.kind == "ds":
            literal = literal_of(event.value)
            if literal is None and event.input.has_focus:
                return  # cleared to type anew: the key goes only if it is left blank (blur)
            self._set_json_value(spec.key, literal, event.value)
            return
        self.profile_issues.pop(spec.key, None)
        current = self.profile.get(spec.key)
        try:
            profile = self.profile.replace(spec.key, profile_value(event.value, current))
        except ProfileError as exc:
            self.profile_issues[spec.key] = "; ".join(i.message for i in exc.issues)
            self._changed()
            return
        if profile != self.profile:
            self.profile = profile
            if spec.key in _DATA_KEYS:
                self._start_data_check()
        self._changed()

    @on(Input.Blurred)
    def _field_left(self, event: Input.Blurred) -> None:
        """A DeepSpeed field left blank: its key is removed from the JSON."""
        spec = FIELDS.get(event.input.name or "")
        if spec is not None and spec.kind == "ds" and not event.value.strip():
            self._set_json_value(spec.key, None, event.value)

    def _set_json_value(self, key: str, literal: str | None, typed: str) -> None:
        """A form edit: only that value's characters change in the JSON (its key stays in
        its place; a new key goes at the end of its object)."""
        if self.files is None:
            return
        doc = dsconfig.parse(self.ds_text, self.files.ds_path.name)
        if doc.data is None or typed == shown_value(doc, key):
            return  # the text already says this (the form was filled from it)
        text = set_value(doc, key, literal)
        if text != self.ds_text:
            self._edit_json(text)
            self._changed()

    @on(TextArea.Changed, "#json-text")
    def _json_changed(self, event: TextArea.Changed) -> None:
        text = event.text_area.text
        if self.files is None or text == self.ds_text:
            return
        self.ds_text = text
        self._fill_form(only="ds")
        self._changed()

    @on(Select.Changed, "#diff-target")
    def _diff_target_changed(self) -> None:
        self._show_diff()

    def _edit_json(self, text: str) -> None:
        """Make the editor say ``text`` by replacing only the characters that differ (a form
        edit: its undo history, cursor and scroll stay)."""
        area = self.query_one("#json-text", TextArea)
        old = area.text
        self.ds_text = text
        start = len(os.path.commonprefix([old, text]))
        tail = len(os.path.commonprefix([old[start:][::-1], text[start:][::-1]]))
        doc = area.document
        area.replace(text[start:len(text) - tail], doc.get_location_from_index(start),
                     doc.get_location_from_index(len(old) - tail))

    def _fill_form(self, only: str | None = None) -> None:
        """Put the current values in the inputs (only those that differ, so focus and cursor
        stay where they are). While the JSON is invalid its fields keep the last valid JSON's
        values, read-only, and the form says where the error is."""
        if self.files is None or self.profile is None:
            return
        doc = dsconfig.parse(self.ds_text, self.files.ds_path.name)
        if doc.data is not None:
            self._valid_doc, self._json_error = doc, None
        else:
            bad = doc.findings[0] if doc.findings else None
            self._json_error = (f"JSON has an error at line {bad.line}: {bad.message}"
                                if bad and bad.line else "JSON has an error: "
                                + (bad.message if bad else "not an object"))
        shown = doc if doc.data is not None else self._valid_doc
        for key, row in self._rows.items():
            spec = row.spec
            if only and spec.kind != only:
                continue
            if spec.kind == "ds":
                value = shown_value(shown, key) if shown is not None else ""
                row.input.disabled = doc.data is None
            else:
                value = shown_profile_value(self.profile.get(key))
            if row.input.value != value and not (row.input.has_focus and spec.kind == "profile"):
                self._filling.setdefault(key, []).append(value)
                row.input.value = value
        self._show_general()

    def _changed(self, now: bool = False) -> None:
        """Something changed: validate again, now or after the debounce delay."""
        self._generation += 1
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if now:
            self._validate_now()
        else:
            self._timer = self.set_timer(DEBOUNCE_S, self._validate_now)
        self._show_status()
        self._show_diff()

    def _validate_now(self) -> None:
        self._timer = None
        if self.files is None or self.deepspeed == "loading":
            self._show_status()
            return
        extra = [f for f in self._data[1] if self._data[0] == self._data_paths(self.profile)]
        extra += [Finding("error", "json", key, message, "the training profile's own check",
                          "type a value of the field's type", None, None,
                          self.files.profile_path.name)
                  for key, message in self.profile_issues.items()]
        shipped = self.files.shipped
        if self.files.ds_saved is None and shipped is not None and self.ds_text == shipped.text:
            extra += shipped.findings()  # as svconsole validate says it
        self.validate(self.ds_text, self.files.ds_path.name, self.profile, self.spec, extra,
                      self._generation)

    def _start_data_check(self) -> None:
        if self.profile is None or not self._facts_ready:
            return
        if not self._up:
            self._data = (self._data_paths(self.profile), [Finding(
                "info", "cluster", "train_data_set_list",
                "data lists not looked for: no node answered the probe")])
            return
        if self._data_pending:
            return  # the answer's handler starts the next check if the paths moved on
        self._data_pending = True
        self.check_data(self.profile, self._up)

    @staticmethod
    def _data_paths(profile: TrainingProfile | None) -> tuple[str, str] | None:
        return (profile.train_data_set_list, profile.valid_data_set_list) if profile else None

    # -------------------------------------------------------------------------------- showing

    def _show_status(self) -> None:
        summary = self.query_one("#config-summary", Static)
        if self.files is None:
            summary.update("reading the files…")
        elif self.deepspeed == "loading":
            summary.update(Text("DeepSpeed loading… (validation starts when it is imported)",
                                style="yellow"))
        elif self.report is None:
            summary.update("validating…")
        else:
            report = self.report
            style = "bold red" if report.errors else ("yellow" if report.warnings else "green")
            line = Text(report.summary, style=style)
            if self._validated != self._generation:
                line.append("  (validating…)", style="dim")
            summary.update(line)
        parts = []
        if self.deepspeed and self.deepspeed != "loading":
            parts.append(f"DeepSpeed {self.deepspeed}" if not self.deepspeed.startswith("not")
                         else "DeepSpeed " + self.deepspeed.split(":")[0] +
                         ": its checks did not run")
        if self.spec is not None:
            age = f", {age_text(time.time() - self._facts_at)}" if self._facts_at else ""
            parts.append(f"{self.spec.describe()} ({self._facts_source}{age})")
        else:
            parts.append(self._facts_source)
        if self.files is not None:
            dirty = []
            if self._ds_changed(self.files, self.ds_text) or self.files.ds_saved is None:
                dirty.append(self.files.ds_path.name)
            if self.files.profile_saved is None or self.profile != self.files.profile:
                dirty.append(self.files.profile_path.name)
            parts.append("unsaved: " + ", ".join(dirty) if dirty else "saved")
            parts += self.files.notes
            if self.files.profile_problem:
                parts.append(f"profile unusable, default shown: {self.files.profile_problem}")
        self.query_one("#config-status", Static).update(" · ".join(parts))

    def _show_findings(self, report: Report) -> None:
        by_field: dict[str, list[Finding]] = {key: [] for key in self._rows}
        general = []
        for finding in report.findings:
            key = field_for(finding.field)
            (by_field[key] if key else general).append(finding)
        for key, row in self._rows.items():
            row.show(by_field[key])
        self._general = general
        self._show_general()
        json_found = [f for f in report.findings if f.layer == "json"
                      and f.file == (self.files.ds_path.name if self.files else None)]
        self.query_one("#json-findings", Static).update(
            Text("\n").join(finding_text(f, where=True) for f in json_found)
            if json_found else Text("JSON text: no syntax errors, no duplicate keys", style="dim"))
        parts: list[Text] = [Text(report.summary, style="bold")]
        parts += [finding_text(f, full=True, where=True) for f in report.findings]
        parts.append(Text("\nMemory per GPU", style="bold"))
        if report.estimate is not None:
            parts.append(Text(report.estimate.explain()))
            for node in (self.spec.nodes if self.spec else ()):
                if node.memory_gib:
                    pct = 100 * report.estimate.fraction_of(node.memory_gib)
                    parts.append(Text(f"{node.name}: {pct:.0f}% of {node.memory_gib:.1f} GiB "
                                      f"({node.gpu_name or 'GPU'})"))
        else:
            parts.append(Text("no estimate (see the findings above)", style="dim"))
        self.query_one("#report-text", Static).update(Text("\n").join(parts))
        self._show_status()

    def _show_general(self) -> None:
        """The findings of no field, under the JSON's error when there is one."""
        parts = [finding_text(f) for f in self._general]
        if self._json_error:
            parts.insert(0, Text(f"{self._json_error} (the form shows the last valid JSON; fix "
                                 "it in the JSON tab, F3)", style="bold red"))
        self.query_one("#form-general", Static).update(Text("\n").join(parts))

    @staticmethod
    def _ds_changed(files: ConfigFiles, text: str) -> bool:
        """Whether ``text`` differs from the saved JSON (a new file differs from nothing only
        when edited: saving the shipped text as it is still writes it)."""
        return text != (files.ds_saved if files.ds_saved is not None else files.ds_text)

    def _show_diff(self) -> None:
        if self.files is None:
            return
        target = self.query_one("#diff-target", Select).value
        files = self.files
        blocks: list[Syntax | Text] = []
        texts = []
        if target == "saved":
            pairs = [(files.ds_saved, self.ds_text, files.ds_path.name),
                     (files.profile_saved,
                      profile_text(self.profile, files.profile_saved) if self.profile else "",
                      files.profile_path.name)]
        else:
            pairs = [(dsconfig.preset_text(str(target)), self.ds_text, f"{target}.json")]
        for old, new, name in pairs:
            label = name if old is not None else f"{name} (not saved yet)"
            diff = "".join(difflib.unified_diff(
                (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
                f"{label}", f"{name} (edited)"))
            texts.append(diff)
            blocks.append(Syntax(diff, "diff", theme="ansi_dark", word_wrap=True) if diff
                          else Text(f"{name}: no difference", style="dim"))
        self.diff = "".join(texts)
        self.query_one("#diff-text", Static).update(Group(*blocks))

    # -------------------------------------------------------------------------------- actions

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        pane = self.query_one(f"#{tab}", TabPane)
        focusable = [w for w in pane.query("Input, TextArea, Select") if not w.disabled]
        if focusable:
            focusable[0].focus()

    def action_leave_field(self) -> None:
        self.query_one("#config-tabs Tabs", Tabs).focus()

    def action_probe(self) -> None:
        self._waiting_for_nodes = False
        self._facts_ready = False
        self.load_facts(probe=True)
        self._show_status()

    def action_save(self) -> None:
        """Write the files whose values changed; a file changed on disk since it was read asks
        first (reload theirs / overwrite with mine / three-way diff), errors ask too."""
        if self.files is None or self.profile is None:
            return
        focused = self.focused
        spec = FIELDS.get(focused.name or "") if isinstance(focused, Input) else None
        if spec is not None and spec.kind == "ds" and not focused.value.strip():
            self._set_json_value(spec.key, None, "")  # a field cleared and not left yet
        files = self.files
        valid = dsconfig.parse(self.ds_text, files.ds_path.name).data is not None
        save_ds = valid and (files.ds_saved is None or self.ds_text != files.ds_saved)
        save_pf = files.profile_saved is None or self.profile != files.profile
        if not (save_ds or save_pf or self.profile_issues or self._ds_changed(files,
                                                                              self.ds_text)):
            self.notify("nothing to save: no value changed")
            return
        outside = [path for path in files.outside_edits()
                   if (path == files.ds_path and save_ds) or (path == files.profile_path
                                                              and save_pf)]
        if not outside:
            self._confirm_and_write(save_ds, save_pf)
            return
        diff = ""
        for path in outside:
            try:
                theirs: str | None = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                theirs = None
            if path == files.ds_path:
                diff += three_way_diff(path.name, files.ds_saved, theirs, self.ds_text)
            else:
                diff += three_way_diff(path.name, files.profile_saved, theirs,
                                       profile_text(self.profile, files.profile_saved))

        def chosen(choice: OutsideChoice | None) -> None:
            if choice == "reload":
                self._reload_theirs(outside)
            elif choice == "overwrite":
                self._confirm_and_write(save_ds, save_pf)

        self.app.push_screen(OutsideEdit([p.name for p in outside], diff), chosen)

    def _reload_theirs(self, paths: list[Path]) -> None:
        """Read these files again from disk, dropping this screen's edits of them; edits of
        the other file stay (unsaved)."""
        if self.files is None or self.profile is None:
            return
        mine, fresh = self.files, read_files(self.console.cluster, self.spec)
        if mine.ds_path not in paths:
            fresh.ds_text, fresh.ds_saved, fresh.ds_stamp, fresh.shipped = (
                self.ds_text, mine.ds_saved, mine.ds_stamp, mine.shipped)
        if mine.profile_path not in paths:
            fresh.profile, fresh.profile_saved, fresh.profile_stamp = (
                mine.profile, mine.profile_saved, mine.profile_stamp)
        profile = self.profile if mine.profile_path not in paths else fresh.profile
        issues = dict(self.profile_issues) if mine.profile_path not in paths else {}
        self._use_files(fresh)
        self.profile, self.profile_issues = profile, issues
        self._fill_form()
        self._changed(now=True)
        self.notify(f"reloaded {', '.join(p.name for p in paths)} from disk")

    def _confirm_and_write(self, save_ds: bool, save_pf: bool) -> None:
        if self.files is None or self.profile is None:
            return
        files, text, profile = self.files, self.ds_text, self.profile
        notes = [] if save_ds or not self._ds_changed(files, text) else [
            f"{files.ds_path.name} is not valid JSON and cannot be saved: only the training "
            "profile would be written"]
        notes += [f"{files.profile_path.name}: {key}: the last valid value "
                  f"({shown_profile_value(profile.get(key))}) is saved, not what is typed"
                  for key in self.profile_issues]
        if self.report is not None and self.report.ok and not notes:
            self.write_files(files, text, profile, save_ds, save_pf)
            return
        errors = self.report.errors if self.report else []
        if self.report is None:
            notes.append("the config has not been validated yet")

        def answered(yes: bool | None) -> None:
            if yes:
                self.write_files(files, text, profile, save_ds, save_pf)

        self.app.push_screen(ConfirmSave(errors, notes), answered)


SCREEN = ConfigScreen
