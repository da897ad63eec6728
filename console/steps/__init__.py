"""Guided bring-up: steps as data (``catalog``), idempotent file edits (``edits``), package
profiles (``profiles``), environment measurements (``measure``) and the runner (``runner``)."""

from console.steps.catalog import CATALOG, STEPS, get_steps
from console.steps.model import PHASES, Phase, SetupOptions, Step, StepState
from console.steps.profiles import PROFILES, get_profile
from console.steps.runner import (
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
