"""GPU telemetry: ``telemetry`` (one streaming NVML agent per node, ring buffers, staleness, the
guide's 6.1 classification, the simulated H200 replay).

Sits beside ``console.cluster``'s probe and inventory, above ``console.ssh``: may import
``console.ssh``, ``console.cluster.model``, ``console.atomic`` and ``console.subscribers``."""
