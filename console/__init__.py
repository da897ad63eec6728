"""svconsole's engine: cluster model, SSH pool, probes, setup steps, DeepSpeed validation,
launcher, log parsers and GPU telemetry. Nothing here imports Textual or ``screens``."""

__version__ = "0.1.0"
