"""``svconsole validate``: check a DeepSpeed config and the training profile before a launch.

``svconsole validate [DS_JSON] [--profile FILE] [--entry train_ds|cpu-wrapper]
[--nproc-per-node N] [--world-size N [--nodes K]] [--gpu NAME|--cc X.Y] [--gpu-mem-gb G]
[--cpu-cores C] [--json]``

Without ``--world-size`` the cluster comes from the inventory: every node of cluster.yaml is probed
(GPUs, compute capability, memory, CPU cores, the training Python's versions) and the data lists
are looked for on each node; the world size is what launch would start (each node's GPUs from
``gpus:`` or its facts; with the CPU entry, which is the one that can run when no node has a GPU,
its processes per node). When it cannot be known, a finding says the batch checks were skipped.
With ``--world-size`` the cluster is the one described by the options (no node is contacted).
Without ``DS_JSON``, the files are exactly those the Config screen edits and launch ships:
``ds_config.json`` beside cluster.yaml when it exists, else the profile's
``train_conf.deepspeed_config``, else the default preset for the cluster (said so); the profile
is ``training.yaml`` beside cluster.yaml, else the packaged default. The last line is the Config
screen's summary line. Exit 1 when there are errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.training import dsconfig
from console.training.dsconfig import ClusterSpec, Finding, Report
from console.training.profile import (
    ProfileError,
    TrainingProfile,
    default_profile,
    ds_config_path_for,
    load_profile,
    profile_path_for,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate", help="check a DeepSpeed config against DeepSpeed, the tuning matrix and the "
        "cluster", description=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ds_json", nargs="?", metavar="DS_JSON",
                        help="DeepSpeed config (default: ds_config.json beside cluster.yaml, as "
                             "the Config screen saves it and launch ships it; else the "
                             "profile's deepspeed_config)")
    parser.add_argument("--profile", metavar="FILE",
                        help="training profile (default: training.yaml beside cluster.yaml)")
    parser.add_argument("--entry", choices=("train_ds", "cpu-wrapper"),
                        help="the launch entry whose ranks are counted (default: cpu-wrapper "
                             "when no node has a GPU, else train_ds), as svconsole launch")
    parser.add_argument("--nproc-per-node", type=_positive, metavar="N",
                        help="processes per node, as svconsole launch (default: its GPUs; 1 "
                             "with cpu-wrapper)")
    parser.add_argument("--world-size", type=_positive, metavar="N",
                        help="GPUs in all; describe the cluster instead of probing it")
    parser.add_argument("--nodes", type=_positive, default=1, metavar="K",
                        help="nodes the GPUs are spread over (with --world-size; default 1)")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", metavar="NAME", help="GPU model, e.g. A100-80GB, H200, V100, T4")
    gpu.add_argument("--cc", metavar="X.Y", help="compute capability, e.g. 8.0")
    parser.add_argument("--gpu-mem-gb", type=float, metavar="G",
                        help="GPU memory in GiB as nvidia-smi shows it (overrides --gpu's)")
    parser.add_argument("--cpu-cores", type=_positive, metavar="C",
                        help="CPU cores per node (for the data loader workers)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=handler)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be 1 or more")
    return value


def handler(args: argparse.Namespace, ctx: Context) -> int:
    def fail(message: str) -> int:
        print(f"svconsole validate: {message}", file=sys.stderr)
        return EXIT_USAGE

    overrides = args.world_size is not None
    if not overrides and (args.gpu or args.cc or args.gpu_mem_gb or args.cpu_cores):
        return fail("--gpu, --cc, --gpu-mem-gb and --cpu-cores describe a cluster: give "
                    "--world-size too")
    cluster_file = ctx.cluster.path
    profile_file = Path(args.profile) if args.profile else profile_path_for(cluster_file)
    try:
        if args.profile or profile_file.exists():
            profile = load_profile(profile_file)
        else:
            profile = default_profile()
    except ProfileError as exc:
        return fail(str(exc))
    shared_dir = ctx.cluster.shared_dir if cluster_file else None
    extra: list[Finding] = []
    spec: ClusterSpec | None
    if overrides and (args.entry or args.nproc_per_node):
        return fail("--entry and --nproc-per-node count the ranks of the probed cluster: "
                    "with --world-size, give the ranks there")
    if overrides:
        try:
            spec = ClusterSpec.from_overrides(
                args.world_size, args.gpu, args.cc, args.gpu_mem_gb, nodes=args.nodes,
                cpu_cores=args.cpu_cores, shared_dir=shared_dir)
        except ValueError as exc:
            return fail(str(exc))
        extra = _local_data(profile)
    else:
        spec, extra = _inventory(ctx, profile, args.entry, args.nproc_per_node)
        if spec is None:
            return fail("probing the cluster is not available here; describe it with "
                        "--world-size N [--nodes K] --gpu NAME")

    try:
        if args.ds_json:
            ds_path = Path(args.ds_json)
            text = ds_path.read_text(encoding="utf-8")
        else:
            shipped = dsconfig.shipped_json(ds_config_path_for(cluster_file), profile, spec)
            ds_path, text = shipped.source or shipped.path, shipped.text
            extra += shipped.findings()
    except (OSError, UnicodeDecodeError) as exc:
        where = args.ds_json or ds_config_path_for(cluster_file)
        return fail(f"{where}: {getattr(exc, 'strerror', None) or exc}")

    report = dsconfig.validate(text, name=str(ds_path), profile=profile, cluster=spec)
    report.add(extra)
    if args.json:
        print(json.dumps(report.to_json(), indent=2), file=ctx.out)
    else:
        _print(report, spec, ctx)
    return EXIT_OK if report.ok else EXIT_FAILED


def _inventory(ctx: Context, profile: TrainingProfile, entry: str | None,
               nproc_per_node: int | None) -> tuple[ClusterSpec | None, list[Finding]]:
    """The cluster as probed now (facts the probe could not refresh are taken from the
    cache, as the Config screen does), and the data lists looked for on every node."""
    try:
        from console.cluster.probe import FactsCache, probe_all
    except ImportError:
        return None, []
    facts = probe_all(ctx.pool, ctx.cluster, cache=FactsCache(ctx.state_dir, ctx.cluster.name))
    spec = ClusterSpec.from_facts(ctx.cluster, facts, entry=entry, nproc_per_node=nproc_per_node)
    up = [name for name, f in facts.items() if f.ok]
    return spec, dsconfig.check_data_on_nodes(ctx.pool.run, up, profile)


def _local_data(profile: TrainingProfile) -> list[Finding]:
    """With a described cluster no node is contacted: the data lists are checked here when this
    machine has them."""
    out = []
    for key in ("train_data_set_list", "valid_data_set_list"):
        path = Path(profile.get(key))
        if not path.exists():
            out.append(Finding("info", "cluster", key, f"{path} not checked: not on this "
                                        "machine (probe the cluster to look on the nodes)"))
            continue
        bad = dsconfig.check_jsonl(path)
        if bad:
            out.append(Finding("error", "cluster", key, bad,
                                        "FunASR fails on lines without the SenseVoice fields",
                                        "fix the data list", profile.line_of(key), None,
                                        str(profile.path or "<training profile>")))
    return out


def _print(report: Report, spec: ClusterSpec, ctx: Context) -> None:
    out = ctx.out
    gpus = ", ".join(sorted({f"{n.gpu_name or '?'} cc {n.cc or '?'} "
                             f"{n.memory_gib or 0:.0f} GiB" for n in spec.nodes
                             if n.gpu_name or n.cc}))
    if spec.source == "overrides":
        print(f"cluster ({spec.source}): {len(spec.nodes)} nodes, world size {spec.world_size}"
              f"{'; ' + gpus if gpus else ''}", file=out)
    else:
        print(f"cluster ({spec.source}): {spec.describe()}{'; ' + gpus if gpus else ''}",
              file=out)
    for f in report.findings:
        print(str(f), file=out)
        for label, text in (("why", f.reason), ("fix", f.fix)):
            if text:
                print(f"    {label}: {text}", file=out)
    if report.estimate is not None:
        print("memory per GPU: " + report.estimate.explain().splitlines()[0], file=out)
    print(report.summary, file=out)
