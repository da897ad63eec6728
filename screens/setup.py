"""Placeholder until this screen is built: it names its issue."""

from screens.placeholder import SetupScreen as SCREEN

__all__ = ["SCREEN"]
