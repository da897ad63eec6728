"""The alert rules: the ``alerts:`` section of cluster.yaml, every key optional.

```yaml
alerts:
  fault: true              # a fault of error severity found in the logs or by a detector
  stall: true              # no step line from a rank (the stall detector)
  straggler_minutes: 5     # a straggler that has persisted this long (0: never)
  run_end: true            # the run finished, failed, was stopped or lost
  node_down_s: 60          # a node of the cluster down for longer than this (0: never)
  gpu_minutes: 5           # a GPU outside the guide's 6.1 thresholds this long, in a run (0: never)
  rate_limit: 20           # at most this many messages per sink in any 10 minutes
  bell: true               # the terminal bell and a toast in the TUI
  webhooks:
    - url_file: ~/.config/svconsole/slack.url   # the URL is a secret: a file of mode 0600
      format: slack                              # generic (JSON), slack or feishu
    - url: https://hooks.example/T0/B0/x         # inline only if cluster.yaml itself is 0600
  exec: ["~/bin/page-me"]   # commands run with the alert as JSON on stdin
```

Bad values are reported as ``cluster.yaml:LINE:COL: alerts.FIELD: message``, every one at once.
A webhook URL is never put into a message: only its position in the list and its format.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from console.cluster.model import Cluster, ClusterConfigError, ConfigIssue, read_text

WebhookFormat = Literal["generic", "slack", "feishu"]
FORMATS: tuple[WebhookFormat, ...] = ("generic", "slack", "feishu")

#: The window of ``rate_limit`` (seconds).
RATE_WINDOW_S = 600.0


@dataclass(frozen=True)
class Webhook:
    """One webhook: where its URL comes from (never the URL in ``repr``) and its payload format."""

    url: str = field(repr=False)
    format: WebhookFormat = "generic"
    index: int = 0
    """Its position in ``alerts.webhooks`` (how messages name it)."""

    @property
    def label(self) -> str:
        return f"webhook #{self.index + 1} ({self.format})"


@dataclass(frozen=True)
class AlertRules:
    fault: bool = True
    stall: bool = True
    straggler_minutes: float = 5.0
    run_end: bool = True
    node_down_s: float = 60.0
    gpu_minutes: float = 5.0
    rate_limit: int = 20
    bell: bool = True
    webhooks: tuple[Webhook, ...] = ()
    exec: tuple[str, ...] = ()

    def with_sinks(self, webhooks: tuple[Webhook, ...] = (),
                   exec: tuple[str, ...] = ()) -> AlertRules:
        """These rules with more sinks (``svconsole watch --webhook/--exec``)."""
        return replace(self, webhooks=self.webhooks + webhooks, exec=self.exec + exec)


_BOOLS = ("fault", "stall", "run_end", "bell")
_NUMBERS = ("straggler_minutes", "node_down_s", "gpu_minutes")
_KEYS = (*_BOOLS, *_NUMBERS, "rate_limit", "webhooks", "exec")


def _pos(mapping: Any, key: Any, value: bool = True) -> tuple[int | None, int | None]:
    try:
        line, col = mapping.lc.value(key) if value else mapping.lc.key(key)
    except (AttributeError, KeyError, TypeError):
        try:
            line, col = mapping.lc.line, mapping.lc.col
        except AttributeError:
            return None, None
    return line + 1, col + 1


def _item_pos(seq: Any, index: int) -> tuple[int | None, int | None]:
    try:
        line, col = seq.lc.item(index)
    except (AttributeError, KeyError, IndexError, TypeError):
        return None, None
    return line + 1, col + 1


def private_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a private file (a regular file its owner alone can read), or None."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_mode & 0o077:
        return (f"{path} is mode {stat.S_IMODE(st.st_mode):04o}: it holds a secret, so others "
                f"must not read it (chmod 600 {path})")
    return None


def parse_alerts(section: Any, source: str, base: Path | None,
                 config_file: Path | None = None) -> AlertRules:
    """Check an ``alerts:`` mapping (a ruamel round-trip node, for positions). ``base``
    anchors relative ``url_file`` paths (cluster.yaml's directory); ``config_file`` is the file
    the section is in, which must be private when it holds a URL inline."""
    issues: list[ConfigIssue] = []

    def bad(where: tuple[int | None, int | None], name: str, message: str) -> None:
        issues.append(ConfigIssue(source, where[0], where[1], f"alerts.{name}", message))

    if section is None:
        return AlertRules()
    if not isinstance(section, Mapping):
        raise ClusterConfigError([ConfigIssue(source, None, None, "alerts",
                                              "must be a mapping of rule: value")])
    values: dict[str, Any] = {}
    for key, value in section.items():
        where = _pos(section, key)
        if key not in _KEYS:
            bad(_pos(section, key, value=False), str(key),
                f"unknown key (known: {', '.join(_KEYS)})")
        elif key in _BOOLS:
            if not isinstance(value, bool):
                bad(where, key, f"must be true or false, not {value!r}")
            else:
                values[key] = value
        elif key in _NUMBERS:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                bad(where, key, f"must be a number of {'seconds' if key.endswith('_s') else 'minutes'}"
                                f" >= 0 (0 turns it off), not {value!r}")
            else:
                values[key] = float(value)
        elif key == "rate_limit":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(where, key, f"must be a whole number >= 1 (messages per sink in 10 minutes), "
                                f"not {value!r}")
            else:
                values[key] = value
        elif key == "exec":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(c, str) and c.strip()
                                                      for c in items):
                bad(where, key, "must be a command or a list of commands")
            else:
                values[key] = tuple(items)
        elif key == "webhooks":
            hooks = _webhooks(value, where, bad, base, config_file)
            if hooks is not None:
                values[key] = hooks
    if issues:
        raise ClusterConfigError(sorted(issues, key=lambda i: (i.line or 0, i.col or 0)))
    return AlertRules(**values)


def _webhooks(value: Any, where: tuple[int | None, int | None], bad: Any, base: Path | None,
              config_file: Path | None) -> tuple[Webhook, ...] | None:
    if not isinstance(value, list):
        bad(where, "webhooks", "must be a list of {url_file: PATH, format: slack} entries")
        return None
    out: list[Webhook] = []
    ok = True
    for i, item in enumerate(value):
        name = f"webhooks[{i}]"
        at = _item_pos(value, i)
        if not isinstance(item, Mapping):
            bad(at, name, "must be a mapping with url_file (or url) and format")
            ok = False
            continue
        unknown = [k for k in item if k not in ("url", "url_file", "format")]
        for k in unknown:
            bad(_pos(item, k, value=False), f"{name}.{k}", "unknown key (known: url_file, url, "
                                                           "format)")
        fmt = item.get("format", "generic")
        if fmt not in FORMATS:
            bad(_pos(item, "format"), f"{name}.format",
                f"must be one of {', '.join(FORMATS)}, not {fmt!r}")
        url = _webhook_url(item, name, bad, base, config_file)
        if unknown or fmt not in FORMATS or url is None:
            ok = False
            continue
        out.append(Webhook(url, fmt, i))
    return tuple(out) if ok else None


def _webhook_url(item: Any, name: str, bad: Any, base: Path | None,
                 config_file: Path | None) -> str | None:
    if ("url" in item) == ("url_file" in item):
        where = _pos(item, "url", value=False) if "url" in item else _pos(item, None)
        bad(where, name, "give exactly one of url_file (a private file holding the URL) or url")
        return None
    if "url_file" in item:
        raw = item["url_file"]
        if not isinstance(raw, str) or not raw.strip():
            bad(_pos(item, "url_file"), f"{name}.url_file", "must be a path")
            return None
        path = Path(raw).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        problem = private_file_problem(path)
        if problem:
            bad(_pos(item, "url_file"), f"{name}.url_file", problem)
            return None
        url = path.read_text(encoding="utf-8").strip()
        where = _pos(item, "url_file")
    else:
        url = item["url"]
        where = _pos(item, "url")
        if config_file is not None:
            problem = private_file_problem(config_file)
            if problem:
                bad(where, f"{name}.url", f"a webhook URL is a secret, and {problem}; or move "
                                          "it to a url_file")
                return None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        bad(where, f"{name}.url", "must be an http:// or https:// URL")
        return None
    return url


def load_rules(cluster: Cluster) -> AlertRules:
    """The rules of ``cluster``'s file (defaults for the embedded cluster or no section).
    Raises :class:`ClusterConfigError` naming file, line and field for bad values."""
    if cluster.path is None:
        return AlertRules()
    from ruamel.yaml import YAML

    source = str(cluster.path)
    doc = YAML(typ="rt").load(read_text(Path(cluster.path), source))
    section = doc.get("alerts") if isinstance(doc, Mapping) else None
    return parse_alerts(section, source, Path(cluster.path).parent, Path(cluster.path))


def secret_values(rules: AlertRules) -> tuple[str, ...]:
    """The strings that must never be written anywhere (the webhook URLs)."""
    return tuple(w.url for w in rules.webhooks)


def cli_webhooks(values: list[str], fmt: WebhookFormat = "generic",
                 first: int = 0) -> tuple[Webhook, ...]:
    """Webhooks given on the command line (``svconsole watch --webhook``): a URL, or ``@PATH``
    for a private file holding it (a URL in argv shows in ``ps``). Raises ValueError saying
    what is wrong, never with the URL in the message."""
    out: list[Webhook] = []
    for i, value in enumerate(values):
        if value.startswith("@"):
            path = Path(value[1:]).expanduser()
            problem = private_file_problem(path)
            if problem:
                raise ValueError(f"--webhook {value}: {problem}")
            value = path.read_text(encoding="utf-8").strip()
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"--webhook #{i + 1}: not an http:// or https:// URL")
        out.append(Webhook(value, fmt, first + i))
    return tuple(out)
