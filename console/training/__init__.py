"""Training runs: ``dsconfig`` (DeepSpeed JSON validation with DeepSpeed's own models),
``profile`` (training.yaml), ``launch`` (plans, pre-flight, detached launch), ``runs`` (run
records, find, stop, resume), ``follow`` (logs followed by byte offset), ``logparse`` (FunASR,
DeepSpeed and torchrun lines), ``faults`` (the fault catalog) and ``metrics`` (the bounded
per-run store).

May import the layers below: ``console.bringup`` (the NCCL env file setup writes),
``console.cluster``, ``console.gpu``, ``console.ssh``, ``console.atomic`` and
``console.subscribers``; never the exporter or the commands."""
