"""The DeepSpeed config editor's engine: parse, validate in three layers, estimate memory, save.

A bad DeepSpeed config costs a multi-node launch, a 10-minute NCCL timeout or an OOM hours in.
:func:`validate` finds those problems before launch; each :class:`Finding` names the field, says
why and proposes a fix. The layers:

``json``
    The text itself: syntax errors with line and column, duplicate keys (DeepSpeed refuses a file
    with duplicate keys at launch; Python's ``json`` would silently keep the last one).
``deepspeed``
    DeepSpeed's own rules, run by the installed package (``DeepSpeedConfig`` and its pydantic
    section models) with the cluster's real world size, its messages shown verbatim; plus what it
    lets through silently: unknown top-level keys (with the closest valid key), ``"auto"`` values
    (dropped), values of the wrong type. When deepspeed cannot be imported, one ``info`` finding
    says this layer did not run.
``matrix``
    The seed guide's tuning matrix (its section 5.1), as warnings with its reasoning.
``cluster``
    The real cluster (:class:`ClusterSpec`, from the inventory or from overrides): bf16 needs
    compute capability 8.0 on every GPU; the memory estimate (:func:`estimate_memory`) against
    each GPU with the seed's 85% / 95% thresholds; output_dir on shared storage; known
    incompatibilities of the installed versions (``console.training.faults``). The data files are checked
    by :func:`check_data_on_nodes` / :func:`check_jsonl`, which need I/O.

Importing deepspeed takes seconds (it imports torch): it happens once, on first use, or ahead
of time in a background worker through :func:`warm_up`.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import difflib
import functools
import itertools
import json
import logging
import posixpath
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

from console.atomic import atomic_write
from console.training import faults
from console.training.profile import TrainingProfile

Severity = Literal["error", "warning", "info"]
Layer = Literal["json", "deepspeed", "matrix", "cluster"]
Path_ = tuple[str | int, ...]

#: Presets shipped in ``console/data``: FunASR's ``examples/deepspeed_conf/ds_stage{0..3}.json``,
#: the seed guide's config (its section 4.1) and the same with bf16 off (the config that trained
#: on the H200 with funasr 1.4.16, and on CPUs).
PRESETS = ("ds_stage0", "ds_stage1", "ds_stage2", "ds_stage3", "seed_zero1_bf16", "zero1_fp32")
BF16_PRESET, FP32_PRESET = "seed_zero1_bf16", "zero1_fp32"


# ------------------------------------------------------------------------------------------------
# Findings


@dataclass(frozen=True)
class Finding:
    """One problem (or note) about the config, the profile or the cluster.

    ``field`` is a dotted path (``zero_optimization.stage``; profile keys such as
    ``dataset_conf.batch_size``), ``line``/``col`` its place in ``file`` when known, ``reason``
    why it matters and ``fix`` what to do.
    """

    severity: Severity
    layer: Layer
    field: str
    message: str
    reason: str = ""
    fix: str = ""
    line: int | None = None
    col: int | None = None
    file: str | None = None

    def __str__(self) -> str:
        where = ":".join(str(p) for p in (self.file, self.line, self.col) if p is not None)
        parts = [where, self.severity, self.field, self.message]
        return ": ".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """All findings of one validation, the memory estimate, and the summary line."""

    findings: list[Finding]
    estimate: MemoryEstimate | None = None
    world_size: int | None = None

    def add(self, findings: Iterable[Finding]) -> None:
        """Add findings (e.g. of the data checks), keeping errors first, then by line; a
        finding already in the report is not added twice."""
        self.findings = _unique([*self.findings, *findings])

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self) -> list[Finding]:
        return self.of("error")

    @property
    def warnings(self) -> list[Finding]:
        return self.of("warning")

    @property
    def ok(self) -> bool:
        """No errors: the launch may go ahead."""
        return not self.errors

    @property
    def summary(self) -> str:
        """``"2 errors / 1 warning / fix the errors before launch"`` or ``"... / ready to launch"``."""
        e, w = len(self.errors), len(self.warnings)
        verdict = "ready to launch" if e == 0 else "fix the errors before launch"
        return f"{e} error{'s' * (e != 1)} / {w} warning{'s' * (w != 1)} / {verdict}"

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "ok": self.ok, "world_size": self.world_size,
                "findings": [f.to_json() for f in self.findings],
                "estimate": self.estimate.to_json() if self.estimate else None}


# ------------------------------------------------------------------------------------------------
# The JSON text: data, positions of every key, duplicates, syntax errors


@dataclass
class DSDocument:
    """A DeepSpeed JSON text, parsed: ``data`` is ``None`` when the text is not valid JSON."""

    name: str
    text: str
    data: dict[str, Any] | None
    positions: dict[Path_, tuple[int, int]]
    findings: list[Finding]

    def where(self, fld: str) -> tuple[int | None, int | None]:
        """Line and column of a dotted field, or of its nearest enclosing key."""
        path = split_field(fld)
        while path:
            if path in self.positions:
                return self.positions[path]
            path = path[:-1]
        return None, None

    def finding(self, severity: Severity, layer: Layer, fld: str, message: str,
                reason: str = "", fix: str = "") -> Finding:
        """A finding about ``fld`` placed at its line in this document."""
        line, col = self.where(fld)
        return Finding(severity, layer, fld, message, reason, fix, line, col, self.name)


def split_field(fld: str) -> Path_:
    """``"a.b[2].c"`` -> ``("a", "b", 2, "c")``."""
    out: list[str | int] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", fld):
        out.append(int(part[1:-1]) if part.startswith("[") else part)
    return tuple(out)


def join_field(path: Iterable[str | int]) -> str:
    """Inverse of :func:`split_field`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def parse(text: str, name: str = "ds_config.json") -> DSDocument:
    """Parse a DeepSpeed JSON text; problems of the text itself become ``json`` findings."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        bad = Finding("error", "json", "", exc.msg, "the file is not valid JSON: neither FunASR nor "
                      "DeepSpeed can read it", "fix the JSON at this line and column",
                      exc.lineno, exc.colno, name)
        return DSDocument(name, text, None, {}, [bad])
    scan = _Scanner(text)
    scan.value(scan.skip(0), ())
    doc = DSDocument(name, text, None, scan.positions, [])
    for path, (line, col), (first, _) in scan.duplicates:
        doc.findings.append(Finding(
            "error", "json", join_field(path), f"duplicate key (first at line {first})",
            "DeepSpeed refuses a config file with duplicate keys ('Duplicate keys in DeepSpeed "
            "config'), and other readers silently keep only the last one",
            "keep one of the two entries", line, col, name))
    if not isinstance(data, dict):
        doc.findings.append(Finding("error", "json", "", "the top level must be a JSON object",
                                    "DeepSpeed reads its settings from an object of keys",
                                    'start the file with "{"', 1, 1, name))
        return doc
    doc.data = data
    return doc


class _Scanner:
    """Walks a valid JSON text, recording where each key and array item starts."""

    _NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
    _WS = re.compile(r"[ \t\n\r]*")

    def __init__(self, text: str) -> None:
        self.text = text
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.positions: dict[Path_, tuple[int, int]] = {}
        self.duplicates: list[tuple[Path_, tuple[int, int], tuple[int, int]]] = []

    def pos(self, i: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, i)
        return line, i - self.line_starts[line - 1] + 1

    def skip(self, i: int) -> int:
        return self._WS.match(self.text, i).end()  # type: ignore[union-attr]

    def value(self, i: int, path: Path_) -> int:
        ch = self.text[i]
        if ch == "{":
            return self._object(i + 1, path)
        if ch == "[":
            return self._array(i + 1, path)
        if ch == '"':
            return json.decoder.scanstring(self.text, i + 1)[1]
        for literal in ("true", "false", "null"):
            if self.text.startswith(literal, i):
                return i + len(literal)
        return self._NUMBER.match(self.text, i).end()  # type: ignore[union-attr]

    def _object(self, i: int, path: Path_) -> int:
        i = self.skip(i)
        seen: dict[str, tuple[int, int]] = {}
        while self.text[i] != "}":
            key, end = json.decoder.scanstring(self.text, i + 1)
            here = self.pos(i)
            sub = (*path, key)
            if key in seen:
                self.duplicates.append((sub, here, seen[key]))
            else:
                seen[key] = here
                self.positions[sub] = here
            i = self.skip(self.skip(end) + 1)  # past ':'
            i = self.skip(self.value(i, sub))
            if self.text[i] == ",":
                i = self.skip(i + 1)
        return i + 1

    def _array(self, i: int, path: Path_) -> int:
        i = self.skip(i)
        index = 0
        while self.text[i] != "]":
            self.positions[(*path, index)] = self.pos(i)
            i = self.skip(self.value(i, (*path, index)))
            if self.text[i] == ",":
                i = self.skip(i + 1)
            index += 1
        return i + 1


def dumps(data: Mapping[str, Any]) -> str:
    """The JSON text the editor writes: 2-space indent, key order kept, unknown keys kept."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def save(path: str | Path, data: Mapping[str, Any] | str) -> Path:
    """Write a DeepSpeed config atomically, keeping the old file as ``.bak``.

    ``data`` is the config (every key kept, known to the form or not) or a JSON text, which must
    parse; a text is written as it is, so its formatting survives.
    """
    if isinstance(data, str):
        json.loads(data)  # refuse to save what no reader can load
        text = data if data.endswith("\n") else data + "\n"
    else:
        text = dumps(data)
    return atomic_write(path, text, backup=True)


@dataclass(frozen=True)
class ShippedJSON:
    """The DeepSpeed JSON that ``svconsole launch`` would ship, as the Config screen and
    ``svconsole validate`` both find it, in launch's order: ``ds_config.json`` beside
    cluster.yaml (``origin="edited"``), else the profile's ``train_conf.deepspeed_config``
    (``"profile"``), else the default preset for the cluster (``"preset"``: nothing to ship
    yet). ``path`` is where the Config screen saves it; ``source`` the file read."""

    path: Path
    text: str
    origin: Literal["edited", "profile", "preset"]
    source: Path | None = None
    preset: str | None = None
    why: str = ""

    @property
    def note(self) -> str:
        """Where the text comes from, for a status line; empty for the saved file."""
        if self.origin == "profile":
            return f"{self.path.name} is new, from the profile's deepspeed_config {self.source}"
        if self.origin == "preset":
            return f"{self.path.name} is new, from the {self.preset} preset ({self.why})"
        return ""

    def findings(self) -> list[Finding]:
        """What the verdict should say about the origin (one note for a preset)."""
        if self.origin != "preset":
            return []
        return [Finding("info", "json", "", f"{self.path.name} is not saved yet: the {self.preset} "
                        f"preset was checked ({self.why})",
                        "neither it nor the profile's deepspeed_config is on this machine; "
                        "launch ships ds_config.json once it is saved",
                        "save it in the Config screen (ctrl+s)", file=self.path.name)]


def shipped_json(ds_path: Path, profile: TrainingProfile, cluster: ClusterSpec | None = None
                 ) -> ShippedJSON:
    """The DeepSpeed JSON launch would ship (see :class:`ShippedJSON`); ``ds_path`` is
    ``ds_config.json`` beside cluster.yaml. Raises OSError/UnicodeDecodeError for a file that
    exists but cannot be read."""
    if ds_path.exists():
        return ShippedJSON(ds_path, ds_path.read_text(encoding="utf-8"), "edited", ds_path)
    configured = profile.train_conf.deepspeed_config
    if configured and Path(configured).is_file():
        return ShippedJSON(ds_path, Path(configured).read_text(encoding="utf-8"), "profile",
                           Path(configured))
    name, why = default_preset(cluster)
    return ShippedJSON(ds_path, preset_text(name), "preset", None, name, why)


def preset_text(name: str) -> str:
    """The JSON text of a shipped preset (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return resources.files("console").joinpath("data", f"{name}.json").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# DeepSpeed, imported once


@dataclass(frozen=True)
class _DeepSpeed:
    version: str
    config: ModuleType            # deepspeed.runtime.config
    constants: ModuleType         # deepspeed.runtime.constants
    zero_config: type             # DeepSpeedZeroConfig
    estimate_zero2: Callable[..., tuple[int, int]]
    estimate_zero3: Callable[..., tuple[int, int, int]]


_IMPORT_LOCK = threading.Lock()
_CONFIG_LOCK = threading.Lock()


@functools.cache
def _load_deepspeed() -> _DeepSpeed | str:
    """The deepspeed pieces this module uses, or the reason they cannot be imported."""
    # DeepSpeed's logger writes to the sys.stdout of its import: make that stderr, so that
    # machine-readable output (``--json``) stays clean. For those seconds, prints of other
    # threads go to stderr too.
    with _IMPORT_LOCK, contextlib.redirect_stdout(sys.stderr):
        try:
            import deepspeed
            import deepspeed.runtime.config as ds_config
            import deepspeed.runtime.constants as ds_constants
            from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            from deepspeed.runtime.zero.stage_1_and_2 import (
                estimate_zero2_model_states_mem_needs,
            )
        except Exception as exc:  # any failure (missing, broken torch) means: this layer is off
            return f"{type(exc).__name__}: {exc}"
        return _DeepSpeed(str(getattr(deepspeed, "__version__", "?")), ds_config, ds_constants,
                          DeepSpeedZeroConfig, estimate_zero2_model_states_mem_needs,
                          estimate_zero3_model_states_mem_needs)


def warm_up() -> str | None:
    """Import deepspeed now (slow: call it from a background worker); returns its version, or
    ``None`` when it cannot be imported (:func:`deepspeed_problem` says why)."""
    ds = _load_deepspeed()
    return ds.version if isinstance(ds, _DeepSpeed) else None


def deepspeed_problem() -> str | None:
    """Why deepspeed cannot be used on this machine, or ``None`` when it can."""
    ds = _load_deepspeed()
    return ds if isinstance(ds, str) else None


class _FixedWorld:
    """Stands in for ``deepspeed.comm`` in ``deepspeed.runtime.config``: rank 0 of ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_rank(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def get_world_size(self, *args: Any, **kwargs: Any) -> int:
        return self.n


class _Recorder(dict):  # type: ignore[type-arg]
    """A config dict that records which top-level keys DeepSpeed looks up, in order.

    DeepSpeedConfig shallow-copies it (``copy.copy``), which keeps the class and shares ``log``.
    """

    def __init__(self, data: Mapping[str, Any], log: list[str]) -> None:
        super().__init__(data)
        self.log = log

    def get(self, key: Any, default: Any = None) -> Any:
        self.log.append(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.log.append(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.log.append(key)  # type: ignore[arg-type]
        return super().__contains__(key)

    def keys(self) -> Any:
        outer = self

        class _Keys:
            def __contains__(self, key: object) -> bool:
                return outer.__contains__(key)

            def __iter__(self) -> Iterator[Any]:
                return iter(dict.keys(outer))

            def __len__(self) -> int:
                return dict.__len__(outer)

        return _Keys()


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _deepspeed_world(ds: _DeepSpeed, world_size: int) -> Iterator[_Capture]:
    """DeepSpeed's config module sees a process group of ``world_size`` ranks (rank 0), and its
    logger's warnings are captured instead of printed; both undone on exit. One at a time: the
    patched ``dist`` is a module global."""
    capture = _Capture()
    logger = logging.getLogger("DeepSpeed")
    with _CONFIG_LOCK:
        saved, handlers, propagate = ds.config.dist, logger.handlers, logger.propagate
        ds.config.dist = _FixedWorld(world_size)
        logger.handlers, logger.propagate = [capture], False  # nothing printed, all kept
        try:
            yield capture
        finally:
            ds.config.dist = saved
            logger.handlers, logger.propagate = handlers, propagate


def _run_deepspeed(ds: _DeepSpeed, data: Mapping[str, Any], world_size: int
                   ) -> tuple[BaseException | None, list[str], list[str]]:
    """Build ``DeepSpeedConfig``: the exception it raised, its warnings, the keys it read."""
    log: list[str] = []
    with _deepspeed_world(ds, world_size) as capture:
        try:
            ds.config.DeepSpeedConfig(_Recorder(copy.deepcopy(dict(data)), log))
            error = None
        except Exception as exc:  # every exception is a verdict on the config, shown verbatim
            error = exc
    return error, capture.messages, log


@functools.cache
def _known_top_level_keys() -> frozenset[str]:
    """The top-level keys the installed DeepSpeed reads: recorded while it parses a minimal
    config (every section getter looks its key up)."""
    ds = _load_deepspeed()
    if not isinstance(ds, _DeepSpeed):
        return frozenset()
    _, _, log = _run_deepspeed(ds, {"train_micro_batch_size_per_gpu": 1}, 1)
    return frozenset(k for k in log if isinstance(k, str))


#: Top-level keys whose DeepSpeed default is ``None`` (so their type cannot be read from it).
_INT_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "steps_per_print")


@functools.cache
def _top_level_types() -> dict[str, type]:
    """Expected type of scalar top-level keys, from DeepSpeed's ``<KEY>_DEFAULT`` constants."""
    ds = _load_deepspeed()
    if not isinstance(ds, _DeepSpeed):
        return {}
    consts = vars(ds.constants)
    types: dict[str, type] = {k: int for k in _INT_KEYS}
    for name, key in consts.items():
        default = consts.get(f"{name}_DEFAULT", None)
        if name.isupper() and isinstance(key, str) and isinstance(default, (bool, int, float)):
            types.setdefault(key, type(default))
    return types


# ------------------------------------------------------------------------------------------------
# Layer 1: DeepSpeed's rules


def check_deepspeed(doc: DSDocument, world_size: int | None) -> list[Finding]:
    """DeepSpeed's own verdict on ``doc.data`` for ``world_size`` ranks, plus what it lets
    through silently (unknown keys, ``"auto"``, wrong types). Needs ``doc.data``.

    ``world_size=None`` (unknown): the batch arithmetic is left out (``train_batch_size`` is
    not given to DeepSpeed when another batch key is), everything else is checked."""
    data = doc.data or {}
    if world_size is None:
        world_size = 1
        if "train_batch_size" in data and ("train_micro_batch_size_per_gpu" in data
                                           or "gradient_accumulation_steps" in data):
            data = {k: v for k, v in data.items() if k != "train_batch_size"}
    out = _auto_values(doc, data) + _string_typed(doc, data) + _funasr_reads(doc, data)
    ds = _load_deepspeed()
    if not isinstance(ds, _DeepSpeed):
        out.append(Finding(
            "info", "deepspeed", "", "DeepSpeed's own checks did NOT run: deepspeed cannot be "
            f"imported on this machine ({ds})",
            "the batch arithmetic, the section schemas and unknown keys are unchecked",
            "install deepspeed on the console machine (pip install deepspeed), or validate on a "
            "training node"))
        return out
    error, warnings, log = _run_deepspeed(ds, data, world_size)
    if error is not None:
        out += _deepspeed_error(doc, data, error, log)
    for message in warnings:
        out.append(doc.finding("warning", "deepspeed", _field_in(message, data), message,
                               f"DeepSpeed {ds.version} warns about this config"))
    out += _unknown_top_level(doc, data) + _top_level_type_errors(doc, data)
    return out


def _deepspeed_error(doc: DSDocument, data: Mapping[str, Any], error: BaseException,
                     log: list[str]) -> list[Finding]:
    errors = getattr(error, "errors", None)
    if callable(errors) and type(error).__name__ == "ValidationError":
        section = _section_of(error, data, log)
        title = getattr(error, "title", "")
        out = []
        for item in errors():
            loc = [p for p in item.get("loc", ()) if p != "__root__"]
            fld = join_field([*section, *loc])
            shown = item.get("input")
            message = item.get("msg", str(error))
            if item.get("type") != "missing" and not isinstance(shown, dict):
                message += f" (got {json.dumps(shown) if _jsonable(shown) else repr(shown)})"
            out.append(doc.finding("error", "deepspeed", fld, message,
                                   f"DeepSpeed's {title or 'schema'} refuses it",
                                   _pydantic_fix(item)))
        return out
    message = str(error) or type(error).__name__
    if not isinstance(error, AssertionError):
        message = f"{type(error).__name__}: {message}"
    fld = _field_in(message, data)
    fix = ""
    if "train_batch_size" in message and "world_size" in message:
        fix = ("make train_batch_size = train_micro_batch_size_per_gpu x "
               "gradient_accumulation_steps x world size, or drop train_batch_size and let "
               "DeepSpeed compute it")
    return [doc.finding("error", "deepspeed", fld, message,
                        "DeepSpeed raises this when the engine starts, on every rank", fix)]


def _section_of(error: BaseException, data: Mapping[str, Any], log: list[str]) -> Path_:
    """The top-level key whose pydantic model raised ``error``: the last dict-valued key
    DeepSpeed looked up that holds the error's first loc (or, failing that, the last one)."""
    first = next(iter(error.errors() or [{}])).get("loc", ("",))[:1]
    looked = [k for k in reversed(log) if isinstance(data.get(k), dict)]
    for key in looked:
        if first and first[0] in data[key]:
            return (key,)
    return (looked[0],) if looked else ()


def _pydantic_fix(item: Mapping[str, Any]) -> str:
    kind = item.get("type", "")
    if kind == "extra_forbidden":
        return "remove the key, or correct its spelling (see DeepSpeed's config documentation)"
    if kind == "missing":
        return "add the key"
    expected = (item.get("ctx") or {}).get("expected")
    return f"use one of {expected}" if expected else "give a value of the expected type"


def _field_in(message: str, data: Mapping[str, Any]) -> str:
    """The field of ``data`` (or top-level key known to DeepSpeed) a message names first:
    ``cpu_offload`` -> ``zero_optimization.cpu_offload``; "vocabulary size" matches too."""
    paths = list(_key_paths(data)) + [(k,) for k in _known_top_level_keys() if k not in data]
    hits = []
    for path in paths:
        name = str(path[-1])
        for spelling in {name, name.replace("_", " ")}:
            m = re.search(rf"\b{re.escape(spelling)}\b", message)
            if m:
                hits.append((m.start(), -len(path), join_field(path)))
    return min(hits)[2] if hits else ""


def _key_paths(data: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Every key path of nested dicts (``("zero_optimization", "stage")``)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*path, key)
            yield from _key_paths(value, (*path, key))


def _unknown_top_level(doc: DSDocument, data: Mapping[str, Any]) -> list[Finding]:
    known = _known_top_level_keys()
    out = []
    for key in data:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        out.append(doc.finding(
            "warning", "deepspeed", key, f"unknown top-level key{hint}",
            "DeepSpeed ignores top-level keys it does not know, silently: this setting has no "
            "effect",
            f"rename it to '{close[0]}'" if close else "remove it, or check DeepSpeed's docs"))
    return out


def _walk(data: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _walk(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _walk(value, (*path, index))
    else:
        yield path, data


AUTO_REASON = ("filled only by the HF Trainer integration or DeepSpeed autotuning; FunASR passes "
               "it as is")


def _auto_values(doc: DSDocument, data: Mapping[str, Any]) -> list[Finding]:
    return [doc.finding(
        "warning", "deepspeed", join_field(path), f'{join_field(path)} is "auto", {AUTO_REASON}',
        "DeepSpeed then drops the key silently (its default applies) or fails on it",
        f"write the value you want for {join_field(path)}")
        for path, value in _walk(data) if value == "auto"]


_LOOKS_TYPED = re.compile(r"(?i)\s*(true|false|[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?)\s*")


def _string_typed(doc: DSDocument, data: Mapping[str, Any]) -> list[Finding]:
    """Numbers and booleans written as strings inside sections (pydantic converts them silently)."""
    return [doc.finding(
        "warning", "deepspeed", join_field(path),
        f"{json.dumps(value)} is a string; a number or true/false is expected",
        "DeepSpeed's schema converts it silently, other readers (FunASR reads bf16/fp16 "
        "'enabled' itself) see a string, which is always true",
        f"write it without quotes: {value.strip().lower()}")
        for path, value in _walk(data)
        if len(path) > 1 and isinstance(value, str) and _LOOKS_TYPED.fullmatch(value)]


def _top_level_type_errors(doc: DSDocument, data: Mapping[str, Any]) -> list[Finding]:
    out = []
    for key, want in _top_level_types().items():
        if key not in data or data[key] == "auto" or data[key] is None:
            continue
        value = data[key]
        if want is bool:
            bad = not isinstance(value, bool)
        elif want is int:
            bad = isinstance(value, bool) or not (
                isinstance(value, int) or (isinstance(value, float) and value.is_integer()))
        else:
            bad = isinstance(value, bool) or not isinstance(value, (int, float))
        if bad:
            kind = {bool: "true or false", int: "a whole number", float: "a number"}[want]
            out.append(doc.finding(
                "error", "deepspeed", key, f"must be {kind}, got {json.dumps(value)}",
                "DeepSpeed reads top-level values without checking their type: this fails or "
                "misbehaves later, in the engine", f"write {kind}"))
    return out


def _funasr_reads(doc: DSDocument, data: Mapping[str, Any]) -> list[Finding]:
    """FunASR's trainer reads ``bf16.enabled`` / ``fp16.enabled`` itself, with ``[...]``."""
    return [doc.finding(
        "error", "deepspeed", key, f"the {key} block has no 'enabled' key",
        f"FunASR's trainer reads {key}['enabled'] directly and stops with a KeyError",
        f'add "enabled": true or false to {key}')
        for key in ("bf16", "fp16") if isinstance(data.get(key), dict) and "enabled" not in data[key]]


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------------------------
# The cluster as the checks see it


@dataclass(frozen=True)
class GPUModel:
    """A GPU known by name: compute capability and memory as nvidia-smi reports it (GiB)."""

    name: str
    cc: str
    memory_gib: float


#: Known GPUs, most specific name first (nominal nvidia-smi totals; the inventory's reading wins).
GPU_MODELS: tuple[GPUModel, ...] = (
    GPUModel("A100-80GB", "8.0", 80.0), GPUModel("A100-40GB", "8.0", 40.0),
    GPUModel("A100", "8.0", 40.0), GPUModel("A800-80GB", "8.0", 80.0),
    GPUModel("H100-NVL", "9.0", 93.6), GPUModel("H100", "9.0", 79.6), GPUModel("H800", "9.0", 79.6),
    GPUModel("H200", "9.0", 140.4), GPUModel("H20", "9.0", 95.6),
    GPUModel("L40S", "8.9", 45.0), GPUModel("L40", "8.9", 45.0), GPUModel("L4", "8.9", 22.5),
    GPUModel("A10G", "8.6", 22.5), GPUModel("A10", "8.6", 22.5), GPUModel("A30", "8.0", 24.0),
    GPUModel("A6000", "8.6", 48.0), GPUModel("RTX-4090", "8.9", 24.0),
    GPUModel("RTX-3090", "8.6", 24.0), GPUModel("V100-32GB", "7.0", 32.0),
    GPUModel("V100", "7.0", 16.0), GPUModel("T4", "7.5", 15.0), GPUModel("P100", "6.0", 16.0),
)


def _tokens(name: str) -> set[str]:
    return set(re.findall(r"[A-Z0-9]+", name.upper()))


def gpu_model(name: str) -> GPUModel | None:
    """The known GPU a name means: ``"A100"``, ``"a100-80gb"``, ``"NVIDIA A100-SXM4-80GB"``,
    ``"rtx 3090"``. Plain ``A100`` / ``V100`` mean the smaller memory size."""
    have = _tokens(name)
    for model in GPU_MODELS:
        if _tokens(model.name) <= have:
            return model
    return None


@dataclass(frozen=True)
class NodeSpec:
    """One node as the checks need it: the ranks launch would start there (``gpu_count``: its
    GPUs, or its processes with the CPU entry) and its GPUs (the smallest when they differ)."""

    name: str
    gpu_count: int
    gpu_name: str | None = None
    cc: str | None = None
    memory_gib: float | None = None
    cpu_cores: int | None = None
    versions: tuple[tuple[str, str], ...] = ()
    """The training stack's versions on the node (torch, deepspeed, funasr...)."""


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster the config will run on; ``source`` says where the facts came from."""

    nodes: tuple[NodeSpec, ...]
    shared_dir: str | None = None
    source: str = "overrides"
    notes: tuple[str, ...] = ()
    """Nodes left out and why (no facts, probe failed)."""
    unknown: tuple[str, ...] = ()
    """Nodes whose number of ranks is not known (no facts and no ``gpus:``): the world size is
    then unknown, and batch checks are skipped."""
    entry: str = "train_ds"
    """The launch entry the ranks were counted for: ``train_ds`` or ``cpu-wrapper``."""

    @property
    def world_size(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    @property
    def world_known(self) -> bool:
        """Whether :attr:`world_size` is what launch would run (every node's ranks known)."""
        return not self.unknown and self.world_size > 0

    def describe(self) -> str:
        """``world size 3 (cpu-wrapper entry, 1 process per node) on 3 node(s)``, or why the
        world size is unknown: the status line of the screen and the CLI."""
        if not self.world_known:
            why = (f"no facts for {', '.join(self.unknown)}" if self.unknown
                   else "no rank on any node")
            return f"world size unknown ({why}) on {len(self.nodes) + len(self.unknown)} node(s)"
        per = sorted({n.gpu_count for n in self.nodes})
        unit, units = ("process", "processes") if self.entry == "cpu-wrapper" else ("GPU", "GPUs")
        each = f"{'/'.join(str(c) for c in per)} {unit if per == [1] else units} per node"
        return (f"world size {self.world_size} ({self.entry} entry, {each}) on "
                f"{len(self.nodes)} node(s)")

    @property
    def gpus_per_node(self) -> int:
        return max((n.gpu_count for n in self.nodes), default=0)

    @classmethod
    def from_facts(cls, cluster: Any, facts: Mapping[str, Any], *, entry: str | None = None,
                   nproc_per_node: int | None = None) -> ClusterSpec:
        """The ranks launch would start, from ``console.cluster.model.Cluster`` and the probe's
        ``NodeFacts`` per node (those of any age: a stale reading still names the training
        stack).

        Per node, as ``console.training.launch`` counts them: ``nproc_per_node`` when given;
        with the ``cpu-wrapper`` entry one process; else the node's ``gpus`` in cluster.yaml,
        else the GPUs its facts list. ``entry=None`` is the entry that can run here: the CPU
        entry when no node has a GPU (by its facts or ``gpus:``), else ``train_ds``. A node
        whose count cannot be known (no facts, no ``gpus:``) is in :attr:`unknown`. The
        versions of each node's training Python are kept whatever its GPUs.
        """
        def gpus_of(node: Any) -> list[Any]:
            f = facts.get(node.name)
            return [g for g in (getattr(f, "gpus", None) or [])
                    if node.gpus is None or g.index in node.gpus]

        if entry is None:
            any_gpu = any(node.gpus or gpus_of(node) for node in cluster.nodes)
            known = all(node.gpus is not None or _readable(facts.get(node.name))
                        for node in cluster.nodes)
            entry = "cpu-wrapper" if known and not any_gpu else "train_ds"
        nodes, notes, unknown = [], [], []
        for node in cluster.nodes:
            f = facts.get(node.name)
            gpus = gpus_of(node)
            if nproc_per_node is not None:
                count: int | None = nproc_per_node
            elif entry == "cpu-wrapper":
                count = 1
            elif node.gpus is not None:
                count = len(node.gpus)
            elif gpus or _readable(f):
                count = len(gpus)
            else:
                count = None
            if count is None:
                unknown.append(node.name)
                notes.append(f"{node.name}: {'no facts' if f is None else f.error or 'no facts'}")
                continue
            if count == 0:
                notes.append(f"{node.name}: {getattr(f, 'gpu_error', None) or 'no GPU found'}: "
                             "the train_ds entry cannot run there (the cpu-wrapper entry can)")
            ccs = [g.compute_capability for g in gpus if g.compute_capability]
            mems = [g.memory_total_mb / 1024 for g in gpus if g.memory_total_mb]
            versions = ({k: v for k, v in f.versions().items() if v}
                        if f is not None and hasattr(f, "versions") else {})
            cores = (f.cpu_usable or f.cpu_cores) if f is not None else None
            nodes.append(NodeSpec(
                node.name, count, gpus[0].name if gpus else None,
                min(ccs, key=_cc_tuple) if ccs else None, min(mems) if mems else None,
                cores, tuple(sorted(versions.items()))))
        return cls(tuple(nodes), cluster.shared_dir, "inventory", tuple(notes), tuple(unknown),
                   entry)

    @classmethod
    def from_overrides(cls, world_size: int, gpu: str | None = None, cc: str | None = None,
                       mem_gb: float | None = None, *, nodes: int = 1,
                       cpu_cores: int | None = None, shared_dir: str | None = None,
                       versions: Mapping[str, str] | None = None) -> ClusterSpec:
        """A uniform cluster: ``world_size`` GPUs over ``nodes`` nodes; ``gpu`` a known name
        (:func:`gpu_model`), ``cc`` and ``mem_gb`` (GiB) override what the name implies."""
        if world_size < 1 or nodes < 1 or world_size % nodes:
            raise ValueError(f"world size {world_size} does not split evenly over {nodes} nodes")
        model = gpu_model(gpu) if gpu else None
        if gpu and model is None:
            known = ", ".join(m.name for m in GPU_MODELS)
            raise ValueError(f"unknown GPU {gpu!r}: give --cc and --gpu-mem-gb, or one of {known}")
        spec = NodeSpec(
            "", world_size // nodes, model.name if model else gpu,
            cc or (model.cc if model else None),
            mem_gb if mem_gb is not None else (model.memory_gib if model else None),
            cpu_cores, tuple(sorted((versions or {}).items())))
        return cls(tuple(dataclasses.replace(spec, name=f"node{i}") for i in range(nodes)),
                   shared_dir, "overrides")


def _readable(facts: Any) -> bool:
    """Facts that describe the node: this probe's, or an earlier one's kept as stale."""
    return facts is not None and bool(facts.ok or getattr(facts, "stale", False))


def _cc_tuple(cc: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in cc.split("."))
    except ValueError:
        return (0,)


# ------------------------------------------------------------------------------------------------
# The memory estimate


GIB = 1024**3


@dataclass(frozen=True)
class Calibration:
    """The measured run the activation term is fitted to (tests/fixtures has its log)."""

    params: float = 234.00e6          # SenseVoiceSmall, full size ("234.00 M" in the log)
    token_batch: int = 6000
    peak_allocated_gib: float = 21.164    # "peak: 21.164 GB" (FunASR prints GiB)
    peak_reserved_gib: float = 28.031     # "cache_peak: 28.031 GB"
    nvidia_smi_used_gib: float = 30407 / 1024   # memory.used at the same time (MiB)
    ds_config: tuple[tuple[str, Any], ...] = (
        ("train_micro_batch_size_per_gpu", 1), ("gradient_accumulation_steps", 1),
        ("zero_optimization", {"stage": 1, "allgather_partitions": True,
                               "allgather_bucket_size": 5e8, "overlap_comm": True,
                               "reduce_scatter": True, "reduce_bucket_size": 5e8,
                               "contiguous_gradients": True}))
    """The seed's ZeRO-1 config with bf16 off, as run (ds_fp32_zero1.json), one H200."""


CALIBRATION = Calibration()

#: SenseVoiceSmall's largest tensor (the CTC output layer, 512 x 25058), for ZeRO-3.
LARGEST_LAYER_PARAMS = 12.8e6
#: Frames per utterance assumed when batch_type is "example" (10 s at 10 ms frames).
FRAMES_PER_EXAMPLE = 1000
#: The seed guide's GPU memory thresholds (its section 6.1): normal < 85%, abnormal > 95%.
MEMORY_WARN, MEMORY_ERROR = 0.85, 0.95

ESTIMATE_METHOD = (
    "Per GPU: model states from DeepSpeed's own estimator (estimate_zero2/zero3_model_states_"
    "mem_needs; ZeRO-0/1 keep gradients whole, added back), plus the ZeRO reduce bucket "
    "(reduce_bucket_size elements, twice with overlap_comm), plus activations, which dominate and "
    "grow with the token batch: fitted to one real run (SenseVoiceSmall, ZeRO-1 fp32, token batch "
    "6000, one H200: 21.2 GiB peak allocated, 28.0 GiB reserved, 29.7 GiB in nvidia-smi). "
    "Reserved memory and the CUDA context scale as in that run. Expect it within about +-30% for "
    "SenseVoiceSmall with token batching: activations depend on the utterance lengths (attention "
    "grows with the square of the length); 16-bit activations are assumed half of fp32 (not "
    "measured: bf16 training failed with funasr 1.4); other models are rougher.")


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated GPU memory per rank, in GiB; ``in_use_gib`` is what nvidia-smi would show."""

    model_states_gib: float
    buckets_gib: float
    activations_gib: float
    allocated_gib: float
    reserved_gib: float
    in_use_gib: float
    notes: tuple[str, ...] = ()
    method: str = ESTIMATE_METHOD

    def fraction_of(self, total_gib: float) -> float:
        return self.in_use_gib / total_gib

    def explain(self) -> str:
        """A few lines for the UI: the parts and how the estimate is made."""
        parts = (f"model states {self.model_states_gib:.1f} + buckets {self.buckets_gib:.1f} + "
                 f"activations {self.activations_gib:.1f} = {self.allocated_gib:.1f} GiB "
                 f"allocated; {self.reserved_gib:.1f} GiB reserved; about {self.in_use_gib:.1f} "
                 "GiB in nvidia-smi")
        return "\n".join([parts, *self.notes, self.method])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _enabled(data: Mapping[str, Any], *keys: str) -> bool:
    return any(isinstance(data.get(k), dict) and data[k].get("enabled") is True for k in keys)


def _model_states(ds: _DeepSpeed, zero: Any, params: float, largest: float, gpus_per_node: int,
                  nodes: int) -> tuple[float, list[str]]:
    """Bytes of parameters, gradients and optimizer states per GPU, from DeepSpeed's estimators."""
    stage = int(zero.stage)
    offload_opt = str(getattr(zero.offload_optimizer, "device", "none") or "none") \
        not in ("none", "OffloadDeviceEnum.none")
    offload_param = str(getattr(zero.offload_param, "device", "none") or "none") \
        not in ("none", "OffloadDeviceEnum.none")
    n = gpus_per_node * nodes
    p = int(params)
    if stage == 3:
        _, gpu, _ = ds.estimate_zero3(p, int(largest), gpus_per_node, nodes,
                                      cpu_offload=offload_opt, cpu_offload_params=offload_param)
        return gpu, ["ZeRO-3: DeepSpeed's stage-3 estimator"]
    if stage == 0:
        _, gpu = ds.estimate_zero2(p, 1, 1, cpu_offload=offload_opt)
        return gpu, ["ZeRO-0: nothing partitioned (stage-2 estimator for one GPU)"]
    _, gpu = ds.estimate_zero2(p, gpus_per_node, nodes, cpu_offload=offload_opt)
    notes = [f"ZeRO-{stage}: DeepSpeed's stage-2 estimator for {n} GPUs"]
    if stage == 1 and n > 1 and not offload_opt:
        gpu += int(6 * p * (1 - 1 / n))  # 16-bit + 32-bit gradients, whole on every rank
        notes.append("ZeRO-1 keeps gradients whole: 6 bytes/parameter added back")
    return gpu, notes


def estimate_memory(data: Mapping[str, Any], *, token_batch: int, batch_type: str = "token",
                    params: float = CALIBRATION.params,
                    largest_layer_params: float = LARGEST_LAYER_PARAMS,
                    gpus_per_node: int = 1, nodes: int = 1) -> MemoryEstimate | None:
    """Estimate GPU memory per rank for a DeepSpeed config and a FunASR batch.

    ``None`` when deepspeed (its estimators and zero schema) is not importable or the
    ``zero_optimization`` block is invalid (layer 1 reports that). See :data:`ESTIMATE_METHOD`.
    """
    ds = _load_deepspeed()
    if not isinstance(ds, _DeepSpeed):
        return None
    per_token = _activation_bytes_per_token(ds)
    if per_token is None:
        return None
    return _estimate(ds, data, token_batch, batch_type, params, largest_layer_params,
                     gpus_per_node, nodes, per_token)


def _estimate(ds: _DeepSpeed, data: Mapping[str, Any], token_batch: int, batch_type: str,
              params: float, largest: float, gpus_per_node: int, nodes: int,
              per_token: float) -> MemoryEstimate | None:
    try:
        zero = ds.zero_config(**(data.get("zero_optimization") or {}))
    except Exception:  # layer 1 reports the invalid block
        return None
    half = _enabled(data, "bf16", "bfloat16", "fp16")
    states, notes = _model_states(ds, zero, params, largest, gpus_per_node, nodes)
    stage = int(zero.stage)
    bucket_bytes = 0.0
    if stage > 0 and zero.contiguous_gradients:
        element = 2 if half and stage >= 2 else 4  # ZeRO-1 stages an fp32 accumulator
        bucket_bytes = float(zero.reduce_bucket_size) * element * (2 if zero.overlap_comm else 1)
    tokens = token_batch * (FRAMES_PER_EXAMPLE if batch_type == "example" else 1)
    if batch_type == "example":
        notes.append(f"batch_type example: {FRAMES_PER_EXAMPLE} frames per utterance assumed")
    activations = per_token * tokens * (0.5 if half else 1.0)
    allocated = (states + bucket_bytes + activations) / GIB
    c = CALIBRATION
    reserved = allocated * c.peak_reserved_gib / c.peak_allocated_gib
    return MemoryEstimate(states / GIB, bucket_bytes / GIB, activations / GIB, allocated,
                          reserved, reserved + (c.nvidia_smi_used_gib - c.peak_reserved_gib),
                          tuple(notes))


@functools.cache
def _activation_bytes_per_token(ds: _DeepSpeed) -> float | None:
    """Activation bytes per token (fp32), fitted so the calibration run's estimate matches it."""
    c = CALIBRATION
    base = _estimate(ds, dict(c.ds_config), c.token_batch, "token", c.params,
                     LARGEST_LAYER_PARAMS, 1, 1, 0.0)
    if base is None:
        return None
    return (c.peak_allocated_gib - base.allocated_gib) * GIB / c.token_batch


# ------------------------------------------------------------------------------------------------
# Layer 2: the tuning matrix (seed guide 5.1)


def _profile_finding(profile: TrainingProfile, severity: Severity, layer: Layer, key: str,
                     message: str, reason: str, fix: str) -> Finding:
    return Finding(severity, layer, key, message, reason, fix, profile.line_of(key), None,
                   str(profile.path) if profile.path else "<default training.yaml>")


def check_matrix(doc: DSDocument, profile: TrainingProfile | None,
                 cluster: ClusterSpec | None) -> list[Finding]:
    """The seed's tuning matrix as warnings: token batch 4000-16000, bf16 on, allgather bucket
    1e8-1e9, gradient accumulation 1-8, data loader workers about half the CPU cores."""
    data = doc.data or {}
    out: list[Finding] = []
    zero = data.get("zero_optimization") if isinstance(data.get("zero_optimization"), dict) else {}
    bucket = zero.get("allgather_bucket_size")
    if isinstance(bucket, (int, float)) and not isinstance(bucket, bool) \
            and not 1e8 <= bucket <= 1e9:
        out.append(doc.finding(
            "warning", "matrix", "zero_optimization.allgather_bucket_size",
            f"{bucket:.0e} is outside the recommended 1e8-1e9",
            "the bucket size balances communication latency (small buckets: many messages) "
            "against bandwidth and memory (large buckets)", "use 5e8 (FunASR's presets)"))
    accum = data.get("gradient_accumulation_steps")
    bf16_advice = _bf16_off(data) and bf16_would_train(data, cluster)[0] == "trains"
    if isinstance(accum, int) and not isinstance(accum, bool) and not 1 <= accum <= 8:
        out.append(doc.finding(
            "warning", "matrix", "gradient_accumulation_steps",
            f"{accum} is outside the recommended 1-8",
            "accumulation relieves memory at the cost of fewer optimizer steps; beyond 8 the "
            "effective batch grows large and updates become rare", "use 1-8; to save memory, "
            f"lower the token batch{' or enable bf16' if bf16_advice else ''} first"))
    if _bf16_off(data):
        verdict, why = bf16_would_train(data, cluster)
        if verdict == "trains":
            out.append(doc.finding(
                "warning", "matrix", "bf16.enabled", "bf16 is off",
                f"the tuning matrix recommends bf16 (30%+ less GPU memory), and it trains here: "
                f"{why}", 'set "bf16": {"enabled": true}'))
        elif verdict == "unconfirmed":
            out.append(doc.finding(
                "info", "matrix", "bf16.enabled", "bf16 is off",
                f"the tuning matrix recommends bf16 where it trains; here {why}"))
    if profile is not None:
        out += _matrix_profile(profile, cluster)
    return out


def _bf16_off(data: Mapping[str, Any]) -> bool:
    """bf16 is off (absent or ``false``); ``"auto"`` and other values are not "off"."""
    section = data.get("bf16", data.get("bfloat16"))
    return section is None or (isinstance(section, dict) and section.get("enabled", False)
                               is False)


def bf16_would_train(data: Mapping[str, Any], cluster: ClusterSpec | None
                     ) -> tuple[Literal["trains", "blocked", "unconfirmed", "unknown"], str]:
    """Whether this config with bf16 on would train on this cluster, and why: ``blocked`` (a
    GPU below compute capability 8.0, no GPU at all, or a known failure with the nodes'
    versions), ``unconfirmed`` (a known failure whose versions are not known here),
    ``unknown`` (no cluster, or a GPU whose capability is unknown) or ``trains``."""
    if cluster is None or not cluster.nodes:
        return "unknown", "the cluster is not known"
    bf16 = {**data, "bf16": {"enabled": True}}
    bf16.pop("bfloat16", None)
    hits = _incompatibilities(bf16, cluster)
    confirmed = [f for f in hits if f.severity == "error"]
    if confirmed:
        return "blocked", f"{confirmed[0].message} ({confirmed[0].reason})"
    old = [n.name for n in cluster.nodes if n.cc and _cc_tuple(n.cc) < (8, 0)]
    if old:
        return "blocked", f"the GPUs of {', '.join(old)} lack bf16 (compute capability < 8.0)"
    if cluster.entry == "cpu-wrapper" or not any(n.gpu_name or n.cc for n in cluster.nodes):
        return "blocked", "no GPU: the ranks train on CPUs"
    unknown = [n.name for n in cluster.nodes if not n.cc]
    if unknown:
        return "unknown", f"compute capability unknown on {', '.join(unknown)}"
    if hits:
        return "unconfirmed", f"{hits[0].message} is possible ({hits[0].reason})"
    ccs = sorted({n.cc for n in cluster.nodes if n.cc})
    return "trains", f"compute capability {', '.join(ccs)} and no known failure with the " \
        "nodes' versions"


def default_preset(cluster: ClusterSpec | None) -> tuple[str, str]:
    """The preset a new DeepSpeed JSON starts from on this cluster, and why: the seed's bf16
    config where bf16 trains with the GPUs and versions found, else the same in fp32."""
    verdict, why = bf16_would_train(json.loads(preset_text(BF16_PRESET)), cluster)
    if verdict == "trains":
        return BF16_PRESET, f"bf16: {why}"
    if verdict == "unknown":
        return FP32_PRESET, f"fp32 until bf16 is known to train: {why}"
    return FP32_PRESET, f"fp32: {why}"


def _matrix_profile(profile: TrainingProfile, cluster: ClusterSpec | None) -> list[Finding]:
    out = []
    conf = profile.dataset_conf
    if conf.batch_type == "token" and not 4000 <= conf.batch_size <= 16000:
        low = conf.batch_size < 4000
        out.append(_profile_finding(
            profile, "warning", "matrix", "dataset_conf.batch_size",
            f"token batch {conf.batch_size} is outside the recommended 4000-16000",
            "small batches leave the GPU idle (utilisation below 50%)" if low else
            "large batches risk running out of GPU memory on long utterances",
            "raise it towards 6000-8000" if low else "lower it to 16000 or less"))
    cores = [n.cpu_cores for n in cluster.nodes if n.cpu_cores] if cluster else []
    if cores and cluster and cluster.gpus_per_node:
        ranks = cluster.gpus_per_node
        want = max(1, min(cores) // 2 // ranks)
        if not want / 2 <= conf.num_workers <= want * 2:
            kind = "training process" if cluster.entry == "cpu-wrapper" else "GPU process"
            out.append(_profile_finding(
                profile, "warning", "matrix", "dataset_conf.num_workers",
                f"{conf.num_workers} workers per {kind}; about {want} recommended",
                f"the matrix says data loading should use half the CPU cores: the smallest node "
                f"has {min(cores)} cores and runs {ranks} {kind}{'es' * (ranks != 1)}, each with "
                "its own workers; too few starve the ranks, too many overload the CPUs",
                f"set dataset_conf.num_workers to {want}"))
    return out


# ------------------------------------------------------------------------------------------------
# Layer 3: the cluster


def check_cluster(doc: DSDocument, profile: TrainingProfile | None,
                  cluster: ClusterSpec) -> tuple[list[Finding], MemoryEstimate | None]:
    """bf16 against compute capability, the memory estimate against each GPU, output_dir on
    shared storage, known incompatibilities of the nodes' versions."""
    data = doc.data or {}
    out: list[Finding] = [Finding("info", "cluster", "", f"node left out: {note}")
                          for note in cluster.notes]
    if _enabled(data, "bf16", "bfloat16"):
        old = [f"{n.name} ({n.gpu_name or 'GPU'}, cc {n.cc})" for n in cluster.nodes
               if n.cc and _cc_tuple(n.cc) < (8, 0)]
        if old:
            out.append(doc.finding(
                "error", "cluster", "bf16.enabled",
                f"bf16 needs compute capability 8.0 or newer; lacking: {', '.join(old)}",
                "bf16 kernels need Ampere (cc 8.0) or newer; older GPUs emulate it slowly or fail",
                'set "bf16": {"enabled": false} (fp32), or train on A100/H100-class GPUs'))
        unknown = [n.name for n in cluster.nodes if not n.cc]
        if unknown and cluster.entry != "cpu-wrapper":
            out.append(doc.finding("info", "cluster", "bf16.enabled",
                                   f"compute capability unknown on {', '.join(unknown)}"))
    estimate = None
    if profile is not None:
        estimate = estimate_memory(
            data, token_batch=profile.dataset_conf.batch_size,
            batch_type=profile.dataset_conf.batch_type, params=profile.params_millions * 1e6,
            gpus_per_node=max(cluster.gpus_per_node, 1), nodes=max(len(cluster.nodes), 1))
        out += _memory_findings(data, profile, cluster, estimate)
        out += _output_dir(profile, cluster)
    out += _incompatibilities(data, cluster)
    return out, estimate


def _memory_findings(data: Mapping[str, Any], profile: TrainingProfile, cluster: ClusterSpec,
                     estimate: MemoryEstimate | None) -> list[Finding]:
    """The estimate against each GPU (the estimate's own explanation is the report's memory
    paragraph, not repeated here)."""
    if estimate is None:
        problem = deepspeed_problem()
        return [Finding("info", "cluster", "dataset_conf.batch_size",
                        "no GPU memory estimate: " + (
                            f"it needs DeepSpeed's estimators ({problem})" if problem
                            else "the zero_optimization block is invalid"))]
    out = []
    reported: set[str] = set()
    levels: tuple[tuple[Severity, float], ...] = (("error", MEMORY_ERROR),
                                                   ("warning", MEMORY_WARN))
    for level, limit in levels:
        over = [n for n in cluster.nodes if n.memory_gib and n.name not in reported
                and estimate.fraction_of(n.memory_gib) > limit]
        reported.update(n.name for n in over)
        if over:
            worst = min(over, key=lambda n: n.memory_gib or 0)
            pct = 100 * estimate.fraction_of(worst.memory_gib or 1)
            bf16_advice = _bf16_off(data) and bf16_would_train(data, cluster)[0] == "trains"
            out.append(_profile_finding(
                profile, level, "cluster", "dataset_conf.batch_size",
                f"estimated {estimate.in_use_gib:.1f} GiB per GPU is {pct:.0f}% of "
                f"{worst.memory_gib:.1f} GiB on {', '.join(n.name for n in over)} "
                f"(above {limit:.0%})",
                "the seed's thresholds: GPU memory normal below 85%, abnormal above 95%; "
                "activations grow with the token batch (see the memory estimate)",
                "lower dataset_conf.batch_size" + (
                    ", enable bf16," if bf16_advice else "") + " or use a higher ZeRO stage"))
    if cluster.entry == "cpu-wrapper":
        out.append(Finding("info", "cluster", "dataset_conf.batch_size",
                           f"estimated {estimate.in_use_gib:.1f} GiB per GPU on GPUs; these ranks "
                           "train on CPUs (the cpu-wrapper entry)"))
    elif not any(n.memory_gib for n in cluster.nodes):
        out.append(Finding("info", "cluster", "dataset_conf.batch_size",
                           f"estimated {estimate.in_use_gib:.1f} GiB per GPU; GPU memory unknown "
                           "(give --gpu or --gpu-mem-gb)"))
    return out


def _output_dir(profile: TrainingProfile, cluster: ClusterSpec) -> list[Finding]:
    if not cluster.shared_dir or len(cluster.nodes) < 2:
        return []
    out_dir = posixpath.normpath(profile.output_dir)
    shared = posixpath.normpath(cluster.shared_dir)
    if out_dir == shared or out_dir.startswith(shared.rstrip("/") + "/"):
        return []
    return [_profile_finding(
        profile, "error", "cluster", "output_dir",
        f"{profile.output_dir} is not under the shared directory {cluster.shared_dir}",
        "resume reads output_dir/model.pt on every rank, and checkpoints are written in parts by "
        "several ranks: on local disks the nodes resume differently or lose checkpoints",
        f"put it under {cluster.shared_dir}")]


def _incompatibilities(data: Mapping[str, Any], cluster: ClusterSpec) -> list[Finding]:
    """Known failures of this config with the nodes' versions (``console.training.faults``' catalog).
    A failure whose versions are not known is a warning (unconfirmed), not an error."""
    by_versions: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for node in cluster.nodes:
        stack = node.versions + ((("compute_capability", node.cc),) if node.cc else ())
        by_versions.setdefault(stack, []).append(node.name)
    out: list[Finding] = []
    for versions, names in by_versions.items():
        have = dict(versions)
        for hit in faults.config_incompatibilities(data, have):
            fault = hit.fault
            if fault.id in _CHECKED_HERE:
                continue
            unknown = [v.package for v in fault.versions if v.package not in have]
            severity: Severity = fault.severity.value  # type: ignore[assignment]
            if unknown and severity == "error":
                severity = "warning"
            nodes = f" on {', '.join(names)}" if len(by_versions) > 1 else ""
            out.append(Finding(
                severity, "cluster", _fault_field(hit.evidence),
                f"{fault.title}{nodes} (fault {fault.id})",
                "; ".join(p for p in (", ".join(hit.evidence), hit.detail,
                                      "unconfirmed: " + ", ".join(unknown) + " version unknown"
                                      if unknown else "") if p),
                fault.advice))
    return out


#: Catalog entries that :func:`check_cluster` reports itself, naming the nodes.
_CHECKED_HERE = frozenset({"bf16-unsupported-gpu"})


def _fault_field(evidence: Iterable[str]) -> str:
    """The config field a catalog trigger's evidence names (``"bf16.enabled = True"``)."""
    first = next(iter(evidence), "")
    m = re.match(r"\s*([A-Za-z_][\w.]*)", first)
    return m.group(1) if m else ""


# ------------------------------------------------------------------------------------------------
# The data files


#: The fields FunASR's SenseVoice dataset reads from each jsonl line.
SENSEVOICE_FIELDS = ("key", "source", "source_len", "target", "target_len", "text_language",
                     "emo_target", "event_target", "with_or_wo_itn")
_TAG = re.compile(r"<\|[^|<>]+\|>")


def _line_problem(obj: Any) -> tuple[str, str] | None:
    """(field, problem) for the first thing wrong with one parsed jsonl line."""
    if not isinstance(obj, dict):
        return "", "the line is not a JSON object"
    for name in SENSEVOICE_FIELDS:
        if name not in obj:
            return name, "missing"
        value = obj[name]
        if name.endswith("_len"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return name, f"must be a positive whole number, got {json.dumps(value)}"
        elif not isinstance(value, str) or not value:
            return name, f"must be a non-empty string, got {json.dumps(value)}"
        elif name in ("text_language", "emo_target", "event_target", "with_or_wo_itn") \
                and not _TAG.fullmatch(value):
            return name, f"must be a tag like <|zh|>, got {json.dumps(value)}"
    return None


def check_jsonl_lines(lines: Iterable[str], name: str, first_line: int = 1) -> str | None:
    """The first bad line of SenseVoice training data, as ``file:line: field: problem``;
    ``None`` when every line given is fine. Blank lines are skipped."""
    for number, text in enumerate(lines, first_line):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"{name}:{number}: not JSON: {exc.msg} (column {exc.colno})"
        problem = _line_problem(obj)
        if problem:
            fld, why = problem
            return f"{name}:{number}: {fld + ': ' if fld else ''}{why}"
    return None


def check_jsonl(path: str | Path, sample: int = 200) -> str | None:
    """Check the first ``sample`` lines of a local jsonl file (see :func:`check_jsonl_lines`);
    an unreadable or empty file is a problem too."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(itertools.islice(f, sample))
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: {getattr(exc, 'strerror', None) or exc}"
    if not any(line.strip() for line in lines):
        return f"{path}: the file is empty"
    return check_jsonl_lines(lines, str(path))


class RunResult(Protocol):
    """What :func:`check_data_on_nodes` needs of a command's result (``console.ssh.pool.Result``)."""

    @property
    def ok(self) -> bool: ...
    stdout: str
    stderr: str


def check_data_on_nodes(run: Callable[[str, str], RunResult], nodes: Iterable[str],
                        profile: TrainingProfile, sample: int = 50) -> list[Finding]:
    """The train/valid jsonl must be readable on every node; a sample of the first readable
    copy is checked for the SenseVoice fields. ``run(node, cmd)`` is e.g. ``pool.run``."""
    out = []
    for key in ("train_data_set_list", "valid_data_set_list"):
        path = profile.get(key)
        missing: list[str] = []
        unasked: list[str] = []
        checked = False
        for node in nodes:
            result = run(node, f"head -n {int(sample)} -- {shlex.quote(path)}")
            if getattr(result, "error", None):   # the node did not answer: nothing is known
                unasked.append(f"{node} ({result.error})")
                continue
            if not result.ok:
                missing.append(node)
                continue
            if not checked:
                checked = True
                bad = check_jsonl_lines(result.stdout.splitlines(), f"{node}:{path}")
                if bad is None and not result.stdout.strip():
                    bad = f"{node}:{path}: the file is empty"
                if bad:
                    out.append(_profile_finding(
                        profile, "error", "cluster", key, bad,
                        "FunASR drops or fails on lines without the SenseVoice fields, often "
                        "late in an epoch", "fix the data list (FunASR's sensevoice2jsonl "
                        "writes these fields)"))
        if missing:
            out.append(_profile_finding(
                profile, "error", "cluster", key,
                f"{path} is not readable on {', '.join(missing)}",
                "every rank opens the data list itself", "put it on the shared storage, or copy "
                "it to the same path on every node"))
        if unasked:
            out.append(_profile_finding(
                profile, "warning", "cluster", key,
                f"{path} could not be checked on {', '.join(unasked)}: the node did not answer",
                "every rank opens the data list itself", "check again (ctrl+r) once the node "
                "is up"))
    return out


# ------------------------------------------------------------------------------------------------
# Everything together


def validate(text: str, *, name: str = "ds_config.json", profile: TrainingProfile | None = None,
             cluster: ClusterSpec | None = None) -> Report:
    """Validate a DeepSpeed JSON text in all layers that the inputs allow.

    Without ``cluster`` DeepSpeed's checks run for a world size of 1 and the cluster layer is
    skipped (an ``info`` finding says so); without ``profile`` the batch, workers and memory
    checks are skipped.
    """
    doc = parse(text, name)
    findings = list(doc.findings)
    if doc.data is None:
        return Report(findings)
    world = cluster.world_size if cluster is not None and cluster.world_known else None
    if world is None:
        why = ("no cluster known" if cluster is None else
               f"no facts for {', '.join(cluster.unknown)}" if cluster.unknown else
               "no node would run a rank")
        findings.append(Finding(
            "warning", "cluster", "train_batch_size", "world size unknown: batch checks skipped",
            f"{why}: train_batch_size = micro batch x accumulation x world size cannot be "
            "checked, so a wrong value fails only at launch",
            "probe the nodes (ctrl+r in the Config screen, svconsole nodes), set gpus: in "
            "cluster.yaml, or give --world-size"))
    findings += check_deepspeed(doc, world)
    findings += check_matrix(doc, profile, cluster)
    estimate = None
    if cluster is None:
        findings.append(Finding("info", "cluster", "", "cluster checks skipped: no cluster known",
                                fix="give the world size and GPU (or probe the nodes)"))
    else:
        more, estimate = check_cluster(doc, profile, cluster)
        findings += more
    if profile is None:
        findings.append(Finding("info", "matrix", "", "no training profile: batch size, data "
                                "workers and memory not checked"))
    return Report(_unique(findings), estimate, world)


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    """Each finding once (the same severity, field and message), errors first, then by line."""
    seen: set[tuple[str, str, str, str | None]] = set()
    out = []
    for f in findings:
        key = (f.severity, f.field, f.message, f.file)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return sorted(out, key=_finding_order)


def _finding_order(f: Finding) -> tuple[int, int]:
    return {"error": 0, "warning": 1, "info": 2}[f.severity], f.line or 0


__all__ = [
    "CALIBRATION", "ClusterSpec", "DSDocument", "ESTIMATE_METHOD", "Finding", "GPU_MODELS",
    "MemoryEstimate", "NodeSpec", "PRESETS", "Report", "SENSEVOICE_FIELDS", "check_cluster",
    "check_data_on_nodes", "check_deepspeed", "check_jsonl", "check_jsonl_lines", "check_matrix",
    "bf16_would_train", "default_preset", "deepspeed_problem", "dumps", "estimate_memory", "gpu_model", "parse", "preset_text", "save",
    "validate", "warm_up",
]
