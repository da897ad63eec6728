"""Locate the programs in ``scripts/`` that svconsole sends to the nodes."""

from __future__ import annotations

import sys
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


def local_python() -> str:
    """The interpreter that runs svconsole's node-side programs (probe, GPU agent) on the local
    node: the Python running svconsole, which has svconsole's dependencies (nvidia-ml-py among
    them) whatever ``python3`` on PATH is. Remote nodes run them with their own Python."""
    return sys.executable
