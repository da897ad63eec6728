"""Headless subcommands of ``svconsole``; each module has ``register(subparsers)``."""
