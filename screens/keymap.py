"""The operator's own keys: ``~/.config/svconsole/keys.yaml`` (or ``$SVCONSOLE_KEYS``) remaps
any binding by its id, the way k9s' hotkeys and posting's keymap do.

```yaml
# binding id: key (or several, comma-separated)
training.stop: S
gpus.next_node: j,n
screen.gpus: f5
```

Every binding of every screen and dialog has an id (``svconsole`` lists them in help). The file
is checked at start: an unknown id (with the nearest known ones), a key Textual does not know,
and two bindings of one screen (or one of a screen and one of the app) that would answer the
same key are each reported with ``keys.yaml:LINE:COL``; the remaps that are fine still apply.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding
from textual.keys import Keys

#: The modules whose classes carry bindings (screens and their dialogs).
MODULES = ("screens.keys", "screens.nodes", "screens.node_form", "screens.setup",
           "screens.setup_widgets", "screens.config", "screens.config_widgets",
           "screens.training", "screens.training_widgets", "screens.gpus", "screens.help",
           "screens.logview", "screens.stacks")
#: The app-wide scope: its keys answer on every screen.
GLOBAL = "app"

_KEY_NAMES = {k.value for k in Keys} | {"space", "question_mark", "slash", "colon", "escape",
                                        "enter", "tab", "delete", "backspace", "home", "end",
                                        "pageup", "pagedown", "up", "down", "left", "right"}
_MODIFIERS = ("ctrl+", "shift+", "alt+", "meta+", "super+")


def default_path() -> Path:
    explicit = os.environ.get("SVCONSOLE_KEYS")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "svconsole" / "keys.yaml"


@dataclass(frozen=True)
class Bound:
    """One binding as the keymap sees it: its id, the class (scope) that holds it, its keys."""

    id: str
    scope: str
    keys: tuple[str, ...]
    description: str


def bindings(modules: Iterable[str] = MODULES) -> dict[str, Bound]:
    """Every binding with an id, by id (the app's under :data:`GLOBAL`)."""
    out: dict[str, Bound] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        holders = [(GLOBAL, module.GLOBAL_BINDINGS)] if name == "screens.keys" else [
            (f"{name}.{cls.__name__}", cls.__dict__.get("BINDINGS", ()))
            for cls in vars(module).values()
            if isinstance(cls, type) and cls.__module__ == name]
        for scope, items in holders:
            for b in items:
                if isinstance(b, Binding) and b.id:
                    out.setdefault(b.id, Bound(b.id, scope, tuple(
                        k.strip() for k in b.key.split(",")), b.description))
    return out


def valid_key(key: str) -> bool:
    """A key Textual can deliver: one printable character, or a key name with modifiers."""
    if len(key) == 1 and key.isprintable() and not key.isspace():
        return True
    base = key
    for _ in range(3):
        for mod in _MODIFIERS:
            if base.startswith(mod):
                base = base[len(mod):]
    return base in _KEY_NAMES or (len(base) == 1 and base.isprintable()) or (
        base.startswith("f") and base[1:].isdigit() and 1 <= int(base[1:]) <= 24)


@dataclass(frozen=True)
class KeymapResult:
    keymap: dict[str, str]
    """What to hand to ``App.set_keymap``: binding id -> keys (comma-separated)."""
    problems: tuple[str, ...]


def check_keymap(doc: object, source: str, known: Mapping[str, Bound]) -> KeymapResult:
    """Check a parsed keys.yaml (a ruamel round-trip mapping, for positions)."""
    problems: list[str] = []

    def where(key: object) -> str:
        try:
            line, col = doc.lc.key(key)  # type: ignore[union-attr]
            return f"{source}:{line + 1}:{col + 1}"
        except (AttributeError, KeyError, TypeError):
            return source

    if doc is None:
        return KeymapResult({}, ())
    if not isinstance(doc, Mapping):
        return KeymapResult({}, (f"{source}: must be a mapping of binding id: key",))
    keymap: dict[str, str] = {}
    for binding_id, value in doc.items():
        bid = str(binding_id)
        if bid not in known:
            near = difflib.get_close_matches(bid, known, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            problems.append(f"{where(binding_id)}: {bid}: no binding has this id{hint}")
            continue
        keys = [k.strip() for k in str(value).split(",")] if value is not None else []
        bad = [k for k in keys if not valid_key(k)]
        if not keys or bad:
            shown = ", ".join(bad) if bad else repr(value)
            problems.append(f"{where(binding_id)}: {bid}: not a key: {shown} (a character, or "
                            "a name such as f5, ctrl+s, escape, space)")
            continue
        keymap[bid] = ",".join(keys)
    problems += conflicts(known, keymap, where)
    return KeymapResult(keymap, tuple(problems))


def conflicts(known: Mapping[str, Bound], keymap: Mapping[str, str], where=lambda k: "keys.yaml"
              ) -> list[str]:
    """Two bindings that answer the same key in one scope, or in a scope and the app's, once
    the remaps apply; each named once, with the remap that caused it."""
    effective = {bid: (tuple(keymap[bid].split(",")) if bid in keymap else b.keys)
                 for bid, b in known.items()}
    out: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for bid, keys in effective.items():
        if bid not in keymap:
            continue
        scope = known[bid].scope
        for other, other_keys in effective.items():
            if other == bid:
                continue
            other_scope = known[other].scope
            if other_scope not in (scope, GLOBAL) and scope != GLOBAL:
                continue
            for key in set(keys) & set(other_keys):
                pair = tuple(sorted((bid, other)))
                if (pair[0], pair[1], key) in seen:
                    continue
                seen.add((pair[0], pair[1], key))
                out.append(f"{where(bid)}: {bid}: key {key} is also {other} "
                           f"({known[other].description or other}); one of them never answers")
    return out


def load_keymap(path: Path | None = None, known: Mapping[str, Bound] | None = None
                ) -> KeymapResult:
    """Read and check keys.yaml; no file is no remap. Never raises for bad input."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    path = path or default_path()
    if not path.is_file():
        return KeymapResult({}, ())
    try:
        doc = YAML(typ="rt").load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        return KeymapResult({}, (f"{path}{at}: cannot read it: "
                                 f"{getattr(exc, 'problem', None) or exc}",))
    return check_keymap(doc, str(path), known if known is not None else bindings())
