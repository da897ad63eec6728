"""Guided bring-up: steps as data (``catalog``), idempotent file edits (``edits``), package
profiles (``profiles``), environment measurements (``measure``) and the runner (``runner``).

Owns everything that changes a node to make it ready for training. May import the layers
below it: ``console.cluster`` (model, probe, inventory), ``console.gpu``, ``console.ssh``,
``console.atomic`` and ``console.subscribers``; never ``console.training``, the exporter or the
commands."""

from console.bringup.catalog import CATALOG, STEPS, get_steps
from console.bringup.model import PHASES, Phase, SetupOptions, Step, StepState
from console.bringup.profiles import PROFILES, get_profile
from console.bringup.runner import (
    OutputLine,
    RunEvent,
    Runner,
    RunSummary,
    StateChanged,
    load_summary,
    retry_selection,
)

__all__ = ["CATALOG", "PHASES", "PROFILES", "STEPS", "OutputLine", "Phase", "RunEvent",
           "RunSummary", "Runner", "SetupOptions", "StateChanged", "Step", "StepState",
           "get_profile", "get_steps", "load_summary", "retry_selection"]
