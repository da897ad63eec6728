"""Locate the programs in ``scripts/`` that svconsole sends to the nodes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def script_path(name: str) -> Path:
    """Path of a node-side program shipped in ``scripts/`` (package ``svconsole_scripts``)."""
    here = Path(__file__).resolve().parents[2] / "scripts" / name
    if here.exists():
        return here
    return Path(str(resources.files("svconsole_scripts").joinpath(name)))


def script_text(name: str) -> str:
    return script_path(name).read_text(encoding="utf-8")
