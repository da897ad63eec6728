"""The Config screen: the DeepSpeed JSON and the training profile, validated as you type.

Two files beside cluster.yaml (the current directory for the embedded default): ``ds_config.json``
and ``training.yaml``. A missing file starts from the seed preset / the packaged profile and is
written only when the operator saves (ctrl+s: atomic, the old file kept as ``.bak``).

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

import difflib
import time
from typing import TYPE_CHECKING

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
    field_for,
    finding_text,
    literal_of,
    profile_value,
    read_files,
    set_value,
    shown_profile_value,
    shown_value,
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
        "leaves a field so that 1-5, ? and q work again. Keys the form does not know are kept. "
        "Nothing is written until ctrl+s; saving a config with errors asks first, naming them.")

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
        self._data: tuple[tuple[str, str] | None, list[Finding]] = (None, [])
        self._data_pending = False
        self._generation = 0
        self._validated = -1
        self._timer: Timer | None = None
        self._rows: dict[str, FieldRow] = {}
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
                yield TextArea.code_editor("", language="json", id="json-text",
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
        if not any(f.gpus for f in facts.values()):
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
                    save_ds: bool) -> None:
        written, notes = [], []
        if save_ds:
            written.append(dsconfig.save(files.ds_path, ds_text))
        else:
            notes.append(f"{files.ds_path.name} NOT saved: it is not valid JSON")
        written.append(save_profile(profile, files.profile_path))
        self.post_message(ConfigSaved(files, written, notes))

    # -------------------------------------------------------------------------------- messages

    def _use_files(self, files: ConfigFiles) -> None:
        self.files = files
        self.profile = files.profile
        self.ds_text = files.ds_text
        self.query_one("#json-text", TextArea).load_text(files.ds_text)
        self._fill_form()
        self._start_data_check()
        self._changed(now=True)

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
        self._start_data_check()
        self._changed(now=True)

    def on_node_status_changed(self, message: NodeStatusChanged) -> None:
        if self._waiting_for_nodes and self._is_up(message.status):
            self.action_probe()

    @staticmethod
    def _is_up(status: NodeStatus) -> bool:
        return str(getattr(status.state, "value", status.state)).lower() == "up"

    def on_data_lists_checked(self, message: DataListsChecked) -> None:
        self._data = (message.paths, message.findings)
        self._data_pending = False
        if self.profile and message.paths != self._data_paths(self.profile):
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
        files.ds_saved = self.ds_text if any(p.name == files.ds_path.name
                                             for p in message.written) else files.ds_saved
        files.profile_saved = (profile_text(self.profile, files.profile_saved) if self.profile
                               else files.profile_saved)
        files.notes = []
        self.files = files
        names = ", ".join(p.name for p in message.written)
        self.notify(f"saved {names} (previous versions kept as .bak)"
                    + "".join(f"\n{n}" for n in message.notes),
                    severity="warning" if message.notes else "information")
        self._show_status()
        self._show_diff()

    # -------------------------------------------------------------------------------- edits

    @on(Input.Changed)
    def _field_changed(self, event: Input.Changed) -> None:
        spec = FIELDS.get(event.input.name or "")
        if spec is None or self.files is None or self.profile is None:
            return
        if spec.kind == "ds":
            doc = dsconfig.parse(self.ds_text, self.files.ds_path.name)
            if doc.data is None or event.value == shown_value(doc, spec.key):
                return  # the text already says this (the form was filled from it)
            text = set_value(doc, spec.key, literal_of(event.value))
            if text != self.ds_text:
                self.ds_text = text
                self.query_one("#json-text", TextArea).text = text
                self._changed()
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

    def _fill_form(self, only: str | None = None) -> None:
        """Put the current values in the inputs (only those that differ, so focus and cursor
        stay where they are)."""
        if self.files is None or self.profile is None:
            return
        doc = dsconfig.parse(self.ds_text, self.files.ds_path.name)
        for key, row in self._rows.items():
            spec = row.spec
            if only and spec.kind != only:
                continue
            if spec.kind == "ds":
                value = shown_value(doc, key)
                row.input.disabled = doc.data is None
            else:
                value = shown_profile_value(self.profile.get(key))
            if row.input.value != value and not (row.input.has_focus and spec.kind == "profile"):
                row.input.value = value

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
            parts.append(f"world size {self.spec.world_size} on {len(self.spec.nodes)} node(s) "
                         f"({self._facts_source}{age})")
        else:
            parts.append(self._facts_source)
        if self.files is not None:
            dirty = []
            if self.ds_text != self.files.ds_saved:
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
        self.query_one("#form-general", Static).update(
            Text("\n").join(finding_text(f) for f in general))
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
        if self.files is None or self.profile is None:
            return
        files, text, profile = self.files, self.ds_text, self.profile
        save_ds = dsconfig.parse(text, files.ds_path.name).data is not None
        notes = [] if save_ds else [f"{files.ds_path.name} is not valid JSON and cannot be "
                                    "saved: only the training profile would be written"]
        notes += [f"{files.profile_path.name}: {key}: the last valid value "
                  f"({shown_profile_value(profile.get(key))}) is saved, not what is typed"
                  for key in self.profile_issues]
        if self.report is not None and self.report.ok and save_ds and not self.profile_issues:
            self.write_files(files, text, profile, save_ds)
            return
        errors = self.report.errors if self.report else []
        if self.report is None:
            notes.append("the config has not been validated yet")

        def answered(yes: bool | None) -> None:
            if yes:
                self.write_files(files, text, profile, save_ds)

        self.app.push_screen(ConfirmSave(errors, notes), answered)


SCREEN = ConfigScreen
