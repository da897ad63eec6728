"""The training profile: the FunASR knobs that a launch passes to ``train_ds.py``.

FunASR takes its settings as Hydra ``++key=value`` overrides (``++dataset_conf.batch_size=6000``,
``++train_conf.use_deepspeed=true``...). The profile keeps them in a small YAML file beside
``cluster.yaml`` (``training.yaml``), with the same nesting as FunASR's own config, so that a key
in the file is the key on the command line. :meth:`TrainingProfile.to_overrides` gives the
overrides in a stable order.

Every key the file may hold has a default in the packaged ``console/data/training.yaml`` (values of
SenseVoice's ``finetune.sh``); a file only needs the keys it changes. Unknown keys are refused with
their line (a typo would otherwise be passed to FunASR and ignored); free-form overrides go under
``extra``. Saving is atomic and keeps the previous file as ``training.yaml.bak``.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from console.atomic import atomic_write
from console.cluster.model import ConfigIssue

#: Name of the profile file beside ``cluster.yaml``.
PROFILE_NAME = "training.yaml"
DS_CONFIG_NAME = "ds_config.json"
"""The DeepSpeed JSON the Config screen edits, beside cluster.yaml; the launch ships it."""

#: FunASR's batch types: ``token`` counts padded frames plus 1.2 x target tokens per batch,
#: ``example`` counts utterances, anything else counts source frames.
BATCH_TYPES = ("token", "example", "length")

Scalar = str | int | float | bool


@dataclass
class DatasetConf:
    """``dataset_conf``: how FunASR batches and loads the data."""

    batch_size: int
    """Batch size; with ``batch_type: token`` the frames (plus target tokens) per batch."""
    batch_type: str
    """``token`` (recommended for SenseVoice), ``example`` or ``length``."""
    sort_size: int
    """How many samples are sorted by length before batching."""
    num_workers: int
    """Data loader worker processes per GPU process (each rank has its own)."""
    data_split_num: int
    """Slices the training list is cut into (one slice in memory at a time)."""


@dataclass
class TrainConf:
    """``train_conf``: the trainer loop."""

    max_epoch: int
    log_interval: int
    """Steps between two log lines (every rank logs)."""
    validate_interval: int
    save_checkpoint_interval: int
    keep_nbest_models: int
    avg_keep_nbest_models_type: str
    """``loss`` or ``acc``; SenseVoice reports no accuracy, so ``loss``."""
    resume: bool
    """Resume from ``output_dir/model.pt`` (read on every rank: output_dir must be shared)."""
    use_deepspeed: bool
    deepspeed_config: str
    """Path of the DeepSpeed JSON as the nodes see it."""


@dataclass
class OptimConf:
    """``optim_conf``: the optimizer FunASR builds (when the DeepSpeed JSON has none)."""

    lr: float


@dataclass
class TrainingProfile:
    """One training setup; the nesting is FunASR's (``dataset_conf.batch_size``)."""

    model: str
    """Model name on the hub (``iic/SenseVoiceSmall``) or a model directory on the nodes."""
    train_data_set_list: str
    valid_data_set_list: str
    output_dir: str
    params_millions: float
    """Parameters of the model in millions; used by the memory estimate only (not passed)."""
    dataset_conf: DatasetConf
    train_conf: TrainConf
    optim_conf: OptimConf
    extra: dict[str, Scalar] = field(default_factory=dict)
    """Further overrides, passed as ``++key=value`` after the known ones, in file order."""
    path: Path | None = field(default=None, compare=False)
    """The file it was loaded from (``None`` for the packaged default)."""
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Line of each key in that file (``"dataset_conf.batch_size" -> 14``), for messages."""

    def get(self, key: str) -> Any:
        """The value at a dotted key (``"dataset_conf.batch_size"``)."""
        obj: Any = self
        for part in key.split("."):
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        return obj

    def replace(self, key: str, value: Any) -> TrainingProfile:
        """A copy with ``key`` set to ``value``, checked like a loaded file (raises ProfileError)."""
        tree = self.to_dict()
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        name = str(self.path) if self.path else "<profile>"
        return _build(tree, _Source(name, self.path, self.lines))

    def line_of(self, key: str) -> int | None:
        """Line of ``key`` (or of its nearest section) in the file it came from."""
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return None

    def changed_keys(self, other: TrainingProfile) -> list[str]:
        """The dotted keys whose values differ in ``other`` (``extra.<key>`` for overrides)."""
        mine, theirs = dict(_flatten(self.to_dict())), dict(_flatten(other.to_dict()))
        return [k for k in {**mine, **theirs} if mine.get(k) != theirs.get(k)]

    def to_dict(self) -> dict[str, Any]:
        """The file's content as plain data."""
        data = dataclasses.asdict(self)
        data.pop("path")
        data.pop("lines")
        return data

    def to_yaml(self) -> str:
        """The file's text (a fresh document: comments of the loaded file are not kept)."""
        out = io.StringIO()
        out.write("# svconsole training profile: FunASR ++overrides for train_ds.py\n")
        _yaml().dump(self.to_dict(), out)
        return out.getvalue()

    def to_overrides(self) -> list[str]:
        """``++key=value`` strings for ``train_ds.py``, known keys first in declaration order."""
        pairs: list[tuple[str, Scalar]] = []
        for key, value in _flatten(self.to_dict()):
            if key == "params_millions" or key.startswith("extra."):
                continue
            if key == "train_conf.deepspeed_config" and not value:
                continue
            pairs.append((key, value))
        pairs.extend(self.extra.items())
        return [f"++{key}={hydra_value(value)}" for key, value in pairs]


class ProfileError(ValueError):
    """A training profile that cannot be used; ``issues`` lists every problem with its line."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


_BARE = re.compile(r"[A-Za-z0-9_./:@+-]+")
_NOT_A_STRING = re.compile(r"(?i)(true|false|null|none|nan|inf|[-+]?[0-9.]+(e[-+]?[0-9]+)?)")


def hydra_value(value: Scalar) -> str:
    """A value as Hydra's override grammar reads it back as the same type.

    Strings that would read as something else (``true``, ``6000``) or hold special characters are
    single-quoted, with ``\\`` and ``'`` escaped.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if _BARE.fullmatch(value) and not _NOT_A_STRING.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ds_config_path_for(cluster_path: Path | None) -> Path:
    """Where the DeepSpeed JSON edited in svconsole lives: beside ``cluster.yaml`` (else the
    current directory)."""
    return (cluster_path.parent if cluster_path else Path.cwd()) / DS_CONFIG_NAME


def profile_path_for(cluster_path: Path | None) -> Path:
    """Where the profile of a cluster lives: beside its ``cluster.yaml`` (else the current
    directory)."""
    return (cluster_path.parent if cluster_path else Path.cwd()) / PROFILE_NAME


def default_profile() -> TrainingProfile:
    """The packaged default profile (SenseVoice's ``finetune.sh`` values)."""
    return parse_profile(_default_text(), "<default training.yaml>", defaults=False)


def load_profile(path: str | Path) -> TrainingProfile:
    """Read a profile file; keys it lacks take the default. Raises :class:`ProfileError`
    (unreadable file, bad YAML, unknown key, wrong type) naming the file, line and key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError([ConfigIssue(str(p), None, None, "", exc.strerror or str(exc))]) from exc
    return parse_profile(text, str(p), path=p)


def parse_profile(text: str, name: str, *, defaults: bool = True, path: Path | None = None
                  ) -> TrainingProfile:
    """Parse profile text (``name`` is used in messages); see :func:`load_profile`."""
    try:
        doc = _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise ProfileError([ConfigIssue(name, line, col, "", str(exc.problem))]) from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProfileError([ConfigIssue(name, 1, 1, "", "the file must be a mapping of keys")])
    lines: dict[str, int] = {}
    _collect_lines(doc, "", lines)
    tree = _merge(_plain(_yaml().load(_default_text())), _plain(doc)) if defaults else _plain(doc)
    return _build(tree, _Source(name, path, lines), unknown_from=_plain(doc))


def save_profile(profile: TrainingProfile, path: str | Path | None = None) -> Path:
    """Write the profile atomically (the old file is kept as ``.bak``); returns the path.

    An existing file is edited in place: its comments, order and layout stay, changed values
    are replaced, keys the profile no longer has are removed, and a key the file did not have is
    added only when its value differs from the default. When no value changed, nothing is
    written."""
    target = Path(path) if path is not None else profile.path
    if target is None:
        raise ValueError("save_profile needs a path for a profile that has none")
    try:
        existing = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        existing = None
    text = profile_text(profile, existing)
    if text == existing:
        return target
    return atomic_write(target, text, backup=True)


def profile_text(profile: TrainingProfile, existing: str | None = None) -> str:
    """The text :func:`save_profile` writes over a file whose text is ``existing``: that text
    itself when no value changed; else only the lines of the changed keys differ (a ruamel round
    trip, and every other line kept byte for byte: no rewrap, no trailing whitespace added)."""
    try:
        doc = _yaml().load(existing) if existing else None
    except MarkedYAMLError:
        doc = None
    if not isinstance(doc, dict) or existing is None:
        return profile.to_yaml()
    try:
        before: TrainingProfile | None = parse_profile(existing, "<existing>")
    except ProfileError:
        before = None
    if before == profile:
        return existing
    lines: dict[str, int] = {}
    _collect_lines(doc, "", lines)
    _update(doc, profile.to_dict(), _plain(_yaml().load(_default_text())))
    out = io.StringIO()
    _yaml().dump(doc, out)
    if before is None:
        return out.getvalue()
    changed = set(before.changed_keys(profile))
    touched = {lines[k] - 1 for k in lines
               if k in changed or any(c.startswith(k + ".") for c in changed)}
    return _merge_lines(existing, out.getvalue(), touched)


def _merge_lines(old: str, new: str, touched: set[int]) -> str:
    """``new`` where it differs from ``old`` on the lines in ``touched`` (0-based lines of
    ``old``) or by added lines; ``old`` everywhere else. Changed lines lose trailing blanks."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal" or (i1 < i2 and not touched.intersection(range(i1, i2))):
            out += a[i1:i2]
        else:
            out += [line.rstrip() + "\n" if line.endswith("\n") else line.rstrip()
                    for line in b[j1:j2]]
    return "".join(out)


def _update(doc: Any, new: dict[str, Any], default: Any) -> None:
    """Make the round-trip mapping ``doc`` say ``new`` (see :func:`save_profile`)."""
    default = default if isinstance(default, dict) else {}
    for key, value in new.items():
        if isinstance(value, dict):
            if isinstance(doc.get(key), dict):
                _update(doc[key], value, default.get(key))
            else:
                section = doc.get(key) if key in doc else CommentedMap()
                _update(section, value, default.get(key))
                if section or key in doc:
                    doc[key] = section
        elif key in doc:
            if _plain(doc[key]) != value:
                doc[key] = value
        elif value != default.get(key):
            doc[key] = value
    for key in [k for k in doc if k not in new]:
        del doc[key]


# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    name: str
    path: Path | None
    lines: dict[str, int]

    def issue(self, key: str, message: str) -> ConfigIssue:
        where = key
        line = None
        while where and line is None:
            line = self.lines.get(where)
            where = where.rpartition(".")[0]
        return ConfigIssue(self.name, line, None, key, message)


_SECTIONS = {"dataset_conf": DatasetConf, "train_conf": TrainConf, "optim_conf": OptimConf}


def _build(tree: dict[str, Any], src: _Source, unknown_from: dict[str, Any] | None = None
           ) -> TrainingProfile:
    """Check ``tree`` against the dataclasses and build the profile (all issues at once)."""
    issues: list[ConfigIssue] = []
    for key in _unknown_keys(unknown_from if unknown_from is not None else tree):
        issues.append(src.issue(key, "unknown key (put free-form overrides under 'extra')"))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingProfile):
        if f.name in ("path", "lines"):
            continue
        value = tree.get(f.name)
        if f.name in _SECTIONS:
            values[f.name] = _section(_SECTIONS[f.name], value, f.name, src, issues)
        elif f.name == "extra":
            values[f.name] = _extra(value, src, issues)
        else:
            values[f.name] = _typed(value, str(f.type), f.name, src, issues)
    if issues:
        raise ProfileError(sorted(issues, key=lambda i: i.line or 0))
    return TrainingProfile(**values, path=src.path, lines=dict(src.lines))


def _section(cls: type, value: Any, name: str, src: _Source, issues: list[ConfigIssue]) -> Any:
    if not isinstance(value, dict):
        issues.append(src.issue(name, "must be a mapping"))
        value = {}
    kwargs = {f.name: _typed(value.get(f.name), str(f.type), f"{name}.{f.name}", src, issues)
              for f in dataclasses.fields(cls)}
    return cls(**kwargs)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""A newline or another control character: never in a value that goes to the nodes."""
_OVERRIDE_KEY = re.compile(r"[A-Za-z0-9_.+-]+")


def _typed(value: Any, kind: str, key: str, src: _Source, issues: list[ConfigIssue]) -> Any:
    """Check one value against its annotation (``int``, ``float``, ``bool`` or ``str``)."""
    problem = None
    if value is None:
        problem = "required"
    elif kind == "bool" and not isinstance(value, bool):
        problem = f"must be true or false, got {value!r}"
    elif kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        problem = f"must be a whole number, got {value!r}"
    elif kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        problem = f"must be a number, got {value!r}"
    elif kind == "str" and not isinstance(value, str):
        problem = f"must be a string, got {value!r} (put it in quotes)"
    elif kind == "str" and _CONTROL.search(value):
        problem = f"must be one line without control characters, got {value!r}"
    elif kind == "int" and value < 1 and key != "dataset_conf.num_workers":
        problem = f"must be at least 1, got {value}"
    elif key == "dataset_conf.num_workers" and value < 0:
        problem = f"must be 0 or more, got {value}"
    elif key == "dataset_conf.batch_type" and value not in BATCH_TYPES:
        problem = f"must be one of {', '.join(BATCH_TYPES)}, got {value!r}"
    if problem:
        issues.append(src.issue(key, problem))
        return None
    return float(value) if kind == "float" else value


def _extra(value: Any, src: _Source, issues: list[ConfigIssue]) -> dict[str, Scalar]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        issues.append(src.issue("extra", "must be a mapping of override keys to values"))
        return {}
    out: dict[str, Scalar] = {}
    for key, item in value.items():
        if not isinstance(item, (str, int, float, bool)):
            issues.append(src.issue(f"extra.{key}", "must be a single value"))
        elif not _OVERRIDE_KEY.fullmatch(str(key)):
            issues.append(src.issue(f"extra.{key}", f"the override key {str(key)!r:.60} is "
                                    f"not letters, digits, '.', '_', '-' or '+' (no blanks, "
                                    f"'=' or control characters)"))
        elif isinstance(item, str) and _CONTROL.search(item):
            issues.append(src.issue(f"extra.{key}", f"must be one line without control "
                                    f"characters, got {item!r}"))
        else:
            out[str(key)] = item
    return out


def _unknown_keys(tree: dict[str, Any]) -> list[str]:
    known = {f.name for f in dataclasses.fields(TrainingProfile)} - {"path", "lines"}
    unknown = [k for k in tree if k not in known]
    for name, cls in _SECTIONS.items():
        section = tree.get(name)
        if isinstance(section, dict):
            fields = {f.name for f in dataclasses.fields(cls)}
            unknown += [f"{name}.{k}" for k in section if k not in fields]
    return unknown


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "extra":
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _plain(node: Any) -> Any:
    """ruamel's round-trip types as plain dicts, lists and scalars."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, (bool, ScalarBoolean)) or node is None:
        return node if node is None else bool(node)
    for kind in (int, float, str):
        if isinstance(node, kind):
            return kind(node)
    return node


def _collect_lines(node: Any, prefix: str, lines: dict[str, int]) -> None:
    for key in node:
        try:
            lines[prefix + str(key)] = node.lc.key(key)[0] + 1
        except (AttributeError, KeyError, TypeError):
            pass
        if isinstance(node[key], dict):
            _collect_lines(node[key], f"{prefix}{key}.", lines)


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.width = 4096  # never rewrap a long line (a flow mapping such as extra: {...})
    return yaml


def _default_text() -> str:
    return resources.files("console").joinpath("data", PROFILE_NAME).read_text(encoding="utf-8")
