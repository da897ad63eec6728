"""The cluster: ``model`` (cluster.yaml: nodes, ssh settings, the loader with file:line errors,
the round-trip editor), ``probe`` (one-round-trip facts per node and their cache) and
``inventory`` (tiers, consistency and verdicts from those facts).

``model`` is the ground floor: it imports only ``console.atomic`` and the standard library, and
every other package may import it. ``probe`` and ``inventory`` sit above ``console.ssh`` (they
ask nodes through the pool) and may import ``model``, ``console.ssh``, ``console.atomic`` and
``console.subscribers``. ``redact`` (what counts as a secret, and the one function that hides
secret values in plans, logs, JSON and the TUI) sits on the ground floor beside
``console.atomic`` and imports only the standard library. This ``__init__`` re-exports nothing, so importing the model never
pulls in the probe."""
