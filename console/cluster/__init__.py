"""The cluster: ``model`` (cluster.yaml: nodes, ssh settings, the loader with file:line errors,
the round-trip editor), ``probe`` (one-round-trip facts per node and their cache) and
``inventory`` (tiers, consistency and verdicts from those facts).

``model`` is the ground floor: it imports only ``console.atomic`` and the standard library, and
every other package may import it. ``probe`` and ``inventory`` sit above ``console.ssh`` (they
ask nodes through the pool) and may import ``model``, ``console.ssh``, ``console.atomic`` and
``console.subscribers``. This ``__init__`` re-exports nothing, so importing the model never
pulls in the probe."""
