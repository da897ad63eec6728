"""Run FunASR's real ``funasr/bin/train_ds.py`` on machines without CUDA.

Launch it exactly like ``train_ds.py``::

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        sv_train_cpu.py ++model=DIR ... ++backend=gloo ++device=cpu ++disable_update=true \\
        ++train_conf.avg_keep_nbest_models_type=loss

Where CUDA is available this does nothing but call train_ds's own ``main_hydra``, so the same
command line is safe on GPU nodes. Where it is absent, it first neutralises the few places where
funasr hard-codes CUDA and no ``++`` override reaches (seen in funasr 1.4.x):

1. ``train_ds.main`` calls ``torch.cuda.set_device(local_rank)`` after starting a DDP/FSDP process
   group: made a no-op.
2. ``Trainer.warp_model`` moves the model with ``model.cuda(local_rank)`` and wraps it in
   ``DDP(model, device_ids=[local_rank])``: during that call only, ``Module.cuda`` leaves the
   module where it is (on the CPU) and DDP is built without ``device_ids`` (CPU DDP over gloo).
3. ``train_ds.main`` sets ``trainer.device = int(LOCAL_RANK)``, which sends every batch to
   ``cuda:<rank>``: ``Trainer.device`` becomes a property that stores ``"cpu"`` for any CUDA
   device (an int or a ``"cuda..."`` string).

Everything else (model, data, DeepSpeed, checkpoints, logging) is funasr's code, unchanged. If a
funasr release moves one of these hooks, the wrapper stops with a message naming it instead of
training differently.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

PATCHES = (
    "torch.cuda.set_device: no-op",
    "Trainer.warp_model: Module.cuda keeps the model on the CPU, DDP without device_ids",
    "Trainer.device: CUDA devices stored as 'cpu'",
)
"""What `patch_for_cpu` changes, one line each (logged at start)."""


class HookMoved(RuntimeError):
    """funasr no longer has a hook this wrapper patches; training would not run as intended."""


def _require(owner: Any, name: str, where: str) -> Any:
    """Return `owner.name`, or raise HookMoved naming the funasr version and the hook."""
    if not hasattr(owner, name):
        import funasr

        raise HookMoved(
            f"sv_train_cpu: funasr {getattr(funasr, '__version__', '?')} has no {where}.{name}; "
            "this CPU wrapper was written for funasr 1.4.x and needs updating "
            "(on a machine with CUDA, run funasr/bin/train_ds.py directly)"
        )
    return getattr(owner, name)


def _cpu_device(device: Any) -> Any:
    """Map a CUDA device (an int index, 'cuda', 'cuda:1', torch.device) to 'cpu'."""
    text = str(device)
    if isinstance(device, int) or text.startswith("cuda"):
        return "cpu"
    return device


@contextlib.contextmanager
def _module_cuda_stays_on_cpu() -> Iterator[None]:
    """Within the block, ``Module.cuda(...)`` returns the module unchanged."""
    import torch

    original = torch.nn.Module.cuda
    torch.nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.cuda = original  # type: ignore[method-assign]


def patch_for_cpu(train_ds: Any, trainer_ds: Any) -> None:
    """Apply the three patches in the module docstring to the imported funasr modules."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    trainer_cls = _require(trainer_ds, "Trainer", "funasr.train_utils.trainer_ds")
    if _require(train_ds, "Trainer", "funasr.bin.train_ds") is not trainer_cls:
        raise HookMoved(
            "sv_train_cpu: funasr.bin.train_ds no longer uses funasr.train_utils.trainer_ds.Trainer; "
            "this CPU wrapper needs updating"
        )
    _require(train_ds, "torch", "funasr.bin.train_ds")
    _require(trainer_ds, "DDP", "funasr.train_utils.trainer_ds")
    warp_model: Callable[..., Any] = _require(trainer_cls, "warp_model",
                                              "funasr.train_utils.trainer_ds.Trainer")

    # 1. torch.cuda.set_device(local_rank) after init_process_group.
    torch.cuda.set_device = lambda device: None

    # 2. model.cuda(local_rank) and DDP(model, device_ids=[local_rank]) in warp_model.
    def cpu_ddp(module: Any, *args: Any, device_ids: Any = None, **kwargs: Any) -> Any:
        return DistributedDataParallel(module, *args, **kwargs)

    @functools.wraps(warp_model)
    def warp_model_on_cpu(self: Any, model: Any, **kwargs: Any) -> Any:
        with _module_cuda_stays_on_cpu():
            return warp_model(self, model, **kwargs)

    trainer_ds.DDP = cpu_ddp
    trainer_cls.warp_model = warp_model_on_cpu

    # 3. trainer.device = int(LOCAL_RANK) in train_ds.main (and "cuda" defaults).
    def get_device(self: Any) -> Any:
        return self.__dict__.get("_sv_cpu_device", "cpu")

    def set_device(self: Any, value: Any) -> None:
        self.__dict__["_sv_cpu_device"] = _cpu_device(value)

    trainer_cls.device = property(get_device, set_device, doc="Trainer device, CPU-only run")


def main() -> None:
    """Patch when CUDA is absent, then hand over to funasr's own Hydra entry point."""
    import torch

    try:
        from funasr.bin import train_ds
        from funasr.train_utils import trainer_ds
    except ImportError as exc:
        sys.exit(f"sv_train_cpu: cannot import funasr's trainer ({exc}); install funasr in "
                 f"{sys.executable}'s environment")
    main_hydra = getattr(train_ds, "main_hydra", None)
    if main_hydra is None:
        sys.exit("sv_train_cpu: funasr.bin.train_ds has no main_hydra; this wrapper needs updating")
    if not torch.cuda.is_available():
        try:
            patch_for_cpu(train_ds, trainer_ds)
        except HookMoved as exc:
            sys.exit(str(exc))
        print("sv_train_cpu: no CUDA; patched " + "; ".join(PATCHES), file=sys.stderr, flush=True)
    main_hydra()


if __name__ == "__main__":
    main()
