"""Secrets out of sight: the one place that decides what is a secret and hides it.

A name is a secret's when it matches ``*TOKEN*``, ``*KEY*``, ``*SECRET*`` or ``*PASSWORD*``
(ignoring case: ``HF_TOKEN``, ``WANDB_API_KEY``, ``aws_secret_access_key``). Its value is shown
as ``********`` in plans, logs, JSON output and the TUI; the value itself stays where it is
needed (the training's environment, the run record written mode 0600).

- :func:`redact_env`: an environment mapping with secret values hidden;
- :func:`redact_text`: free text (a command line, a log line) with every ``NAME=value``
  assignment of a secret environment variable hidden (upper-case names only, the environment's
  own style, so ``ssh -o StrictHostKeyChecking=yes`` stays as it is);
- :func:`redact`: JSON-like data: every ``env`` mapping inside it through :func:`redact_env`,
  every string through :func:`redact_text`;
- :func:`restore_env`: an environment shown redacted and then edited, with each value still
  ``********`` given back its real one (a form never shows a secret, nor loses it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "********"

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
"""Matches a secret's name anywhere in it (the globs ``*TOKEN*|*KEY*|*SECRET*|*PASSWORD*``)."""

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What an environment variable's name may be (letters, digits, _; no leading digit)."""

_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_])(?P<name>[A-Z_][A-Z0-9_]*)=(?P<value>"
    r"(?:'[^']*'|\"(?:[^\"\\]|\\.)*\"|\\.|[^\s'\"\\])+)"
)
"""``NAME=value`` with a shell word as value (quoted, escaped or bare)."""


def is_secret(name: str) -> bool:
    """True when ``name`` (an environment variable or a setting) names a secret."""
    return SECRET_NAME.search(name) is not None


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` with the value of every secret name replaced by ``********``."""
    return {k: (REDACTED if is_secret(str(k)) else v) for k, v in env.items()}


def restore_env(edited: Mapping[str, str], original: Mapping[str, str]) -> dict[str, str]:
    """``edited`` (``original`` as :func:`redact_env` showed it, then changed by the operator)
    with every value left as ``********`` given back from ``original``."""
    return {k: (original[k] if v == REDACTED and k in original else v) for k, v in edited.items()}


def redact_text(text: str) -> str:
    """``text`` with the value of every ``NAME=value`` of a secret name replaced."""
    if "=" not in text:
        return text

    def hide(m: re.Match[str]) -> str:
        return f"{m['name']}={REDACTED}" if is_secret(m["name"]) else m[0]

    return _ASSIGNMENT.sub(hide, text)


def redact(data: Any) -> Any:
    """A copy of JSON-like ``data`` (dicts, lists, strings...) fit to show: every mapping under
    a key named ``env`` through :func:`redact_env`, every string through :func:`redact_text`."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, Mapping):
        out = {}
        for key, value in data.items():
            if key == "env" and isinstance(value, Mapping):
                value = redact_env(value)
            out[key] = redact(value)
        return out
    if isinstance(data, (list, tuple)):
        return [redact(v) for v in data]
    return data
