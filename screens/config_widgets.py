"""The pieces of the Config screen: the form's fields, edits of the JSON text, the files, and
the widgets that show a field with its findings and confirm a save with errors.

The DeepSpeed JSON text is the one source of truth: a form edit changes only the value it is
about (:func:`set_value`), so the operator's formatting (``5e8``), key order and every key the
form does not know stay as they are, and the diff against the saved file shows just that line.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, Static, TextArea

from console.training import dsconfig
from console.training.profile import (
    ProfileError,
    TrainingProfile,
    default_profile,
    ds_config_path_for,
    load_profile,
    profile_path_for,
)

if TYPE_CHECKING:
    from console.cluster.model import Cluster
    from console.training.dsconfig import Finding

Kind = Literal["ds", "profile"]


@dataclass(frozen=True)
class FieldSpec:
    """One field of the form: ``key`` is the dotted path in the DeepSpeed JSON (``kind="ds"``)
    or in the training profile (``kind="profile"``); ``hint`` shows when the key is not set."""

    key: str
    kind: Kind
    help: str
    hint: str = ""
    choices: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The key without the section its title names (``zero_optimization.``...)."""
        for section in _TITLED_SECTIONS:
            if self.key.startswith(section):
                return self.key[len(section):]
        return self.key


#: Sections whose name the form's titles carry, so their fields show the rest of the key.
_TITLED_SECTIONS = ("zero_optimization.", "dataset_conf.", "train_conf.")


_BOOL = ("true", "false")
_DEVICE = ("none", "cpu", "nvme")


def _ds(key: str, help: str, hint: str = "", choices: tuple[str, ...] = ()) -> FieldSpec:
    return FieldSpec(key, "ds", help, hint, choices)


def _pf(key: str, help: str, choices: tuple[str, ...] = ()) -> FieldSpec:
    return FieldSpec(key, "profile", help, "", choices)


#: The form: (section title, fields). Keys of the JSON not listed here are kept as they are.
FORM: tuple[tuple[str, tuple[FieldSpec, ...]], ...] = (
    ("DeepSpeed: batch", (
        _ds("train_micro_batch_size_per_gpu", "Samples per GPU per step (FunASR batches by "
            "tokens itself: keep 1).", "not set"),
        _ds("gradient_accumulation_steps", "Steps whose gradients add up before one optimizer "
            "step (matrix: 1-8).", "not set: 1"),
        _ds("train_batch_size", "micro batch x accumulation x world size; leave it out and "
            "DeepSpeed computes it.", "not set: computed"),
    )),
    ("DeepSpeed: precision", (
        _ds("bf16.enabled", "bfloat16 training: needs compute capability 8.0 (A100/H100).",
            "not set: false", _BOOL),
        _ds("fp16.enabled", "float16 training with loss scaling.", "not set: false", _BOOL),
    )),
    ("DeepSpeed: zero_optimization", (
        _ds("zero_optimization.stage", "ZeRO stage 0-3: what is partitioned over the ranks.",
            "not set: 0"),
        _ds("zero_optimization.allgather_bucket_size", "Elements per all-gather (matrix: "
            "1e8-1e9).", "not set: 5e8"),
        _ds("zero_optimization.reduce_bucket_size", "Elements per reduce; its buffer counts in "
            "the memory estimate.", "not set: 5e8"),
        _ds("zero_optimization.overlap_comm", "Overlap reduction with the backward pass (doubles "
            "the bucket buffers).", "not set: false", _BOOL),
        _ds("zero_optimization.reduce_scatter", "Reduce-scatter instead of all-reduce.",
            "not set: true", _BOOL),
        _ds("zero_optimization.contiguous_gradients", "Copy gradients into one buffer.",
            "not set: true", _BOOL),
        _ds("zero_optimization.offload_optimizer.device", "Optimizer states on cpu/nvme "
            "(slower, less GPU memory).", "not set: none", _DEVICE),
        _ds("zero_optimization.offload_param.device", "Parameters on cpu/nvme (ZeRO-3 only).",
            "not set: none", _DEVICE),
        _ds("zero_optimization.stage3_max_live_parameters", "ZeRO-3: parameters resident "
            "before release.", "not set: 1e9"),
        _ds("zero_optimization.stage3_max_reuse_distance", "ZeRO-3: reuse distance before a "
            "parameter is released.", "not set: 1e9"),
        _ds("zero_optimization.stage3_prefetch_bucket_size", "ZeRO-3: elements prefetched.",
            "not set: 5e7"),
        _ds("zero_optimization.stage3_param_persistence_threshold", "ZeRO-3: parameters below "
            "this size are not partitioned.", "not set: 1e5"),
        _ds("zero_optimization.stage3_gather_16bit_weights_on_model_save", "ZeRO-3: gather the "
            "whole model when saving.", "not set: false", _BOOL),
    )),
    ("DeepSpeed: other", (
        _ds("gradient_clipping", "Clip the gradient norm (0: off).", "not set: 0"),
        _ds("steps_per_print", "Steps between DeepSpeed's own log lines.", "not set: 10"),
        _ds("wall_clock_breakdown", "Time forward/backward/step (slows training a little).",
            "not set: false", _BOOL),
    )),
    ("Training profile: model and data", (
        _pf("model", "Model name on the hub (iic/SenseVoiceSmall) or a model directory on the "
            "nodes."),
        _pf("train_data_set_list", "Training jsonl, the same path on every node."),
        _pf("valid_data_set_list", "Validation jsonl, the same path on every node."),
        _pf("output_dir", "Checkpoints and logs; on shared storage (resume reads it on every "
            "rank)."),
    )),
    ("Training profile: dataset_conf", (
        _pf("dataset_conf.batch_size", "Token batch with batch_type token (matrix: "
            "4000-16000)."),
        _pf("dataset_conf.batch_type", "token, example or length.", ("token", "example",
                                                                     "length")),
        _pf("dataset_conf.sort_size", "Samples sorted by length before batching."),
        _pf("dataset_conf.num_workers", "Data loader workers per GPU process (matrix: half "
            "the CPU cores in all)."),
        _pf("dataset_conf.data_split_num", "Slices of the training list (one in memory at a "
            "time)."),
    )),
    ("Training profile: train_conf and optim_conf", (
        _pf("train_conf.max_epoch", "Epochs to train."),
        _pf("train_conf.log_interval", "Steps between log lines."),
        _pf("train_conf.validate_interval", "Steps between validations."),
        _pf("train_conf.save_checkpoint_interval", "Steps between checkpoints."),
        _pf("train_conf.keep_nbest_models", "Checkpoints kept."),
        _pf("train_conf.avg_keep_nbest_models_type", "Rank checkpoints by loss (SenseVoice "
            "reports no accuracy) or acc.", ("loss", "acc")),
        _pf("train_conf.resume", "Resume from output_dir/model.pt.", _BOOL),
        _pf("train_conf.use_deepspeed", "Train with DeepSpeed (this JSON).", _BOOL),
        _pf("train_conf.deepspeed_config", "Where the nodes read this JSON (copy it there)."),
        _pf("optim_conf.lr", "Learning rate."),
    )),
)

FIELDS: dict[str, FieldSpec] = {spec.key: spec for _, specs in FORM for spec in specs}


def field_for(finding_field: str) -> str | None:
    """The form field a finding is shown at: the field itself, the first field inside it
    (``fp16`` -> ``fp16.enabled``), or the field it lies in; ``None`` when the form has none."""
    if not finding_field:
        return None
    if finding_field in FIELDS:
        return finding_field
    inside = [k for k in FIELDS if k.startswith(finding_field + ".")]
    if inside:
        return inside[0]
    parent = finding_field.rpartition(".")[0]
    return field_for(parent) if parent else None


# ------------------------------------------------------------------------------------------------
# The JSON text, edited in place

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def _offset(text: str, line: int, col: int) -> int:
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    return starts[line - 1] + col - 1


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _key_span(text: str, doc: dsconfig.DSDocument, path: tuple[str, ...]
              ) -> tuple[int, int, int]:
    """Offsets of a key's opening quote, and of its value's start and end."""
    key_at = _offset(text, *doc.positions[path])
    _, i = json.decoder.scanstring(text, key_at + 1)  # type: ignore[attr-defined]
    i = _skip(text, _skip(text, i) + 1)  # past ':'
    _, end = _DECODER.raw_decode(text, i)
    return key_at, i, end


def shown_value(doc: dsconfig.DSDocument, key: str) -> str:
    """A JSON value as the form shows it: the literal as written (``5e8``), strings unquoted;
    ``""`` when the key is not set."""
    path = tuple(key.split("."))
    if doc.data is None or path not in doc.positions:
        return ""
    _, start, end = _key_span(doc.text, doc, path)
    literal = doc.text[start:end]
    value = json.loads(literal)
    return value if isinstance(value, str) else literal


def literal_of(typed: str) -> str | None:
    """What an input's text becomes in the JSON: a JSON literal as typed (``5e8``, ``true``),
    anything else as a string; ``None`` when blank (the key is removed)."""
    typed = typed.strip()
    if not typed:
        return None
    try:
        json.loads(typed)
    except ValueError:
        return json.dumps(typed)
    return typed


def set_value(doc: dsconfig.DSDocument, key: str, literal: str | None) -> str:
    """The JSON text with ``key`` (dotted) set to ``literal``, or removed when ``None``.

    Only that value changes; a missing key is added at the end of its object (missing parent
    objects are created), indented like its neighbours. ``doc`` must hold valid JSON.
    """
    text, path = doc.text, tuple(key.split("."))
    if path in doc.positions:
        key_at, start, end = _key_span(text, doc, path)
        if literal is not None:
            return text[:start] + literal + text[end:]
        before = text[:key_at].rstrip()
        if before.endswith(","):
            return before[:-1] + text[end:]
        after = _skip(text, end)
        if text[after] == ",":
            return text[:key_at] + text[_skip(text, after + 1):]
        return before + text[after:]
    if literal is None:
        return text
    depth = len(path) - 1
    while depth and (path[:depth] not in doc.positions
                     or not isinstance(_get(doc.data, path[:depth]), dict)):
        depth -= 1
    if depth:
        key_at, start, end = _key_span(text, doc, path[:depth])
        own = doc.positions[path[:depth]][1] - 1
    else:
        start, end, own = _skip(text, 0), _DECODER.raw_decode(text, _skip(text, 0))[1], 0
    children = [col for p, (_, col) in doc.positions.items()
                if len(p) == depth + 1 and p[:depth] == path[:depth]]
    indent = " " * (children[0] - 1 if children else own + 2)
    entry = _entry(path[depth:], literal, indent)
    close = end - 1
    last = len(text[:close].rstrip()) - 1
    if last == start:  # empty object
        return f"{text[:start + 1]}\n{indent}{entry}\n{' ' * own}{text[close:]}"
    return f"{text[:last + 1]},\n{indent}{entry}{text[last + 1:]}"


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _entry(keys: tuple[str, ...], literal: str, indent: str) -> str:
    if len(keys) == 1:
        return f"{json.dumps(keys[0])}: {literal}"
    inner = _entry(keys[1:], literal, indent + "  ")
    return f"{json.dumps(keys[0])}: {{\n{indent}  {inner}\n{indent}}}"


def profile_value(typed: str, current: Any) -> Any:
    """An input's text as the profile field's type (the type of ``current``); text that does
    not convert is passed as it is, so the profile's own check names the problem."""
    typed = typed.strip()
    try:
        if isinstance(current, bool):
            return {"true": True, "false": False}.get(typed.lower(), typed)
        if isinstance(current, int):
            return int(typed)
        if isinstance(current, float):
            return float(typed)
    except ValueError:
        return typed
    return typed


def shown_profile_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ------------------------------------------------------------------------------------------------
# The files


@dataclass(frozen=True)
class FileStamp:
    """What a file held when it was read: its content hash and mtime (``None``: no file)."""

    sha256: str | None
    mtime: float | None = None

    @classmethod
    def of_text(cls, path: Path, text: str | None) -> FileStamp:
        if text is None:
            return cls(None)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = None
        return cls(hashlib.sha256(text.encode()).hexdigest(), mtime)

    @classmethod
    def of(cls, path: Path) -> FileStamp:
        """The file as it is now."""
        try:
            return cls.of_text(path, path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return cls(None)

    def changed(self, path: Path) -> bool:
        """Whether the file no longer holds what was read (its content; the mtime alone, as
        from ``touch``, is no change)."""
        return FileStamp.of(path).sha256 != self.sha256


@dataclass
class ConfigFiles:
    """The DeepSpeed JSON and the training profile the screen edits, as read from disk.

    ``ds_saved`` / ``profile_saved`` are the texts on disk (``None``: no file yet: the JSON
    starts from what launch would ship, ``shipped``, the profile from the packaged default);
    ``ds_stamp`` / ``profile_stamp`` what the files held when read (a save compares them with
    the disk); ``profile_problem`` says why an existing profile could not be used.
    """

    ds_path: Path
    ds_text: str
    ds_saved: str | None
    profile_path: Path
    profile: TrainingProfile
    profile_saved: str | None
    profile_problem: str | None = None
    notes: list[str] = field(default_factory=list)
    shipped: dsconfig.ShippedJSON | None = None
    ds_stamp: FileStamp = FileStamp(None)
    profile_stamp: FileStamp = FileStamp(None)

    def outside_edits(self) -> list[Path]:
        """The files changed on disk since they were read (by an editor, another console)."""
        return [path for path, stamp in ((self.ds_path, self.ds_stamp),
                                         (self.profile_path, self.profile_stamp))
                if stamp.changed(path)]


def read_files(cluster: Cluster, spec: dsconfig.ClusterSpec | None = None) -> ConfigFiles:
    """Read the JSON and the profile beside cluster.yaml (the current directory for the
    embedded default); nothing is written. A missing JSON starts from what launch would ship
    (``dsconfig.shipped_json``: the profile's deepspeed_config, else the default preset for
    ``spec``), as ``svconsole validate`` checks it."""
    ds_path = ds_config_path_for(cluster.path)
    ds_saved = ds_path.read_text(encoding="utf-8") if ds_path.exists() else None
    profile_path = profile_path_for(cluster.path)
    profile_saved = profile_path.read_text(encoding="utf-8") if profile_path.exists() else None
    problem = None
    profile = default_profile()
    if profile_saved is not None:
        try:
            profile = load_profile(profile_path)
        except ProfileError as exc:
            problem = str(exc)
    try:
        shipped = dsconfig.shipped_json(ds_path, profile, spec)
    except (OSError, UnicodeDecodeError):
        name, why = dsconfig.default_preset(spec)
        shipped = dsconfig.ShippedJSON(ds_path, dsconfig.preset_text(name), "preset", None,
                                       name, why)
    notes = [shipped.note] if shipped.note else []
    if profile_saved is None:
        notes.append(f"{profile_path.name} is new, from the default profile")
    return ConfigFiles(ds_path, ds_saved if ds_saved is not None else shipped.text, ds_saved,
                       profile_path, profile, profile_saved, problem, notes, shipped,
                       FileStamp.of_text(ds_path, ds_saved),
                       FileStamp.of_text(profile_path, profile_saved))


def three_way_diff(name: str, base: str | None, theirs: str | None, mine: str) -> str:
    """What changed on disk since it was read (``base`` to ``theirs``) and what this screen
    changed (``base`` to ``mine``), as two unified diffs of the same base."""
    base_lines = (base or "").splitlines(keepends=True)
    parts = []
    for label, text in (("on disk (theirs)", theirs or ""), ("in the console (mine)", mine)):
        diff = "".join(difflib.unified_diff(base_lines, text.splitlines(keepends=True),
                                            f"{name} (as read)", f"{name} {label}"))
        parts.append(diff or f"{name} {label}: no change\n")
    return "".join(parts)


# ------------------------------------------------------------------------------------------------
# Widgets

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
SEVERITY_MARK = {"error": "✗", "warning": "!", "info": "i"}


def finding_text(finding: Finding, *, full: bool = False, where: bool = False) -> Text:
    """A finding in its severity's colour: message, then why and fix (the first line of the
    reason unless ``full``)."""
    style = SEVERITY_STYLE[finding.severity]
    text = Text()
    text.append(f"{SEVERITY_MARK[finding.severity]} ", style=style)
    if where:
        place = ":".join(str(p) for p in (finding.file, finding.line, finding.col)
                         if p is not None)
        head = " ".join(p for p in (place, finding.field) if p)
        if head:
            text.append(head + ": ", style="bold")
    text.append(finding.message, style=style)
    reason = finding.reason if full else finding.reason.split("\n", 1)[0]
    for label, part in (("why", reason), ("fix", finding.fix)):
        if part:
            text.append(f"\n  {label}: ", style="dim bold")
            text.append(part, style="dim" if label == "why" else "")
    return text


class JsonEditor(TextArea):
    """The JSON tab's editor: keys take effect in the order they arrive, however fast.

    A plain TextArea inserts a typed character at once, but runs its own bindings (arrows,
    home/end, backspace...) only after the key has bubbled up to the app through every
    ancestor's queue: in a burst (a fast typist, tmux send-keys, a busy screen) characters
    overtake the moves before them and land elsewhere (``16{`` on line 1). Here the editor's
    own bindings run in its key handler, in order with the characters; keys it does not bind
    (the screen's F2-F5, ctrl+s) go on as before. ctrl+home / ctrl+end go to the start / end
    of the text, as in other editors."""

    BINDINGS = [
        Binding("ctrl+home", "document_start", "Start of text", show=False),
        Binding("ctrl+end", "document_end", "End of text", show=False),
    ]

    def action_document_start(self) -> None:
        self.move_cursor((0, 0))

    def action_document_end(self) -> None:
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            if binding.priority:
                continue
            event.stop()
            event.prevent_default()
            self._restart_blink()
            await self.app.run_action(binding.action, self)
            return
        await super()._on_key(event)


class FieldRow(Vertical):
    """One field: its name, an input, and the findings at it (hidden when there are none)."""

    DEFAULT_CSS = """
    FieldRow { height: auto; padding: 0 1; }
    FieldRow > Horizontal { height: 1; }
    FieldRow Label { width: 36; padding-right: 1; color: $text-muted; }
    FieldRow Input { height: 1; border: none; padding: 0 1; width: 1fr; background: $boost; }
    FieldRow Input:focus { border: none; background: $primary 30%; }
    FieldRow .field-findings { display: none; padding-left: 4; height: auto; }
    FieldRow.has-findings .field-findings { display: block; }
    """

    def __init__(self, spec: FieldSpec) -> None:
        super().__init__(id="row-" + spec.key.replace(".", "--"))
        self.spec = spec
        self._shown: list[Finding] = []

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(self.spec.label)
            suggester = (SuggestFromList(self.spec.choices, case_sensitive=False)
                         if self.spec.choices else None)
            field_input = Input(placeholder=self.spec.hint, suggester=suggester,
                                name=self.spec.key, select_on_focus=False)
            field_input.tooltip = self.spec.help
            yield field_input
        yield Static(classes="field-findings")

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    def show(self, findings: list[Finding]) -> None:
        """Show these findings at the field (nothing is redrawn when they did not change)."""
        if findings == self._shown:
            return
        self._shown = findings
        text = Text("\n").join(finding_text(f) for f in findings)
        self.query_one(".field-findings", Static).update(text)
        self.set_class(bool(findings), "has-findings")


OutsideChoice = Literal["reload", "overwrite"]


class OutsideEdit(ModalScreen["OutsideChoice | None"]):
    """A file to be saved changed on disk since it was read: reload theirs, overwrite with
    mine, or look at the three-way diff first (escape: neither, nothing written)."""

    DEFAULT_CSS = """
    OutsideEdit { align: center middle; }
    OutsideEdit > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 90%;
        border: round $warning; padding: 0 1; background: $surface; }
    OutsideEdit #outside-diff { display: none; }
    OutsideEdit.show-diff #outside-diff { display: block; }
    """
    BINDINGS = [
        Binding("r", "answer('reload')", "Reload theirs", id="config.outside.reload"),
        Binding("o", "answer('overwrite')", "Overwrite with mine", id="config.outside.overwrite"),
        Binding("d", "toggle_diff", "Three-way diff", id="config.outside.diff"),
        Binding("escape", "answer(None)", "Cancel", id="config.outside.cancel"),
    ]

    def __init__(self, changed: list[str], diff: str) -> None:
        super().__init__()
        self._changed, self.diff = changed, diff

    def compose(self) -> ComposeResult:
        names = " and ".join(self._changed)
        text = Text(f"{names} changed on disk since the Config screen read "
                    f"{'them' if len(self._changed) > 1 else 'it'}.\n", style="bold")
        text.append("Saving now would overwrite those changes.\n\n")
        for key, what in (("r", f"reload theirs (your edits of {names} are dropped)"),
                          ("o", "overwrite with mine (their changes are lost; kept in .bak)"),
                          ("d", "show / hide the three-way diff"), ("escape", "cancel")):
            text.append(key, style="bold")
            text.append(f": {what}\n")
        with VerticalScroll():
            yield Static(text)
            yield Static(Text(self.diff), id="outside-diff")

    def action_toggle_diff(self) -> None:
        self.toggle_class("show-diff")

    def action_answer(self, answer: OutsideChoice | None) -> None:
        self.dismiss(answer)


class ConfirmSave(ModalScreen[bool]):
    """Saving with errors: the errors are named, and the operator says yes or no."""

    DEFAULT_CSS = """
    ConfirmSave { align: center middle; }
    ConfirmSave > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 90%;
        border: round $error; padding: 0 1; background: $surface; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Save anyway", id="config.confirm.yes"),
        Binding("n,escape", "answer(False)", "Cancel", id="config.confirm.no"),
    ]

    def __init__(self, errors: list[Finding], notes: list[str]) -> None:
        super().__init__()
        self._errors, self._notes = errors, notes

    def compose(self) -> ComposeResult:
        text = Text(f"Save with {len(self._errors)} error{'s' * (len(self._errors) != 1)}?\n",
                    style="bold")
        for finding in self._errors:
            text.append("\n")
            text.append_text(finding_text(finding, where=True))
        for note in self._notes:
            text.append(f"\n\n{note}", style="yellow")
        text.append("\n\nA launch refuses a config with errors unless you override it.\n",
                    style="dim")
        text.append("y", style="bold")
        text.append(": save anyway   ")
        text.append("n / escape", style="bold")
        text.append(": cancel")
        with VerticalScroll():
            yield Static(text)

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
