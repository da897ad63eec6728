"""``svconsole launch``: start a training run on every node, detached, after pre-flight checks.

``svconsole launch [--profile FILE] [--entry train_ds|cpu-wrapper] [--nproc-per-node N]
[--master-port P] [--env KEY=VALUE]... [--resume [RUN] | --fresh] [--dry-run] [--force] [--yes]
[--json]``

The nodes are asked what the launch needs, the plan is built and shown in full (every node's
torchrun command, environment, working directory and log file), and the pre-flight checks run
(nodes up, same torch/deepspeed/funasr, master port free, output_dir writable, data present, no
other run alive, DeepSpeed config valid for the real world size). A failed check stops the launch
unless ``--force``. The launch is confirmed on the terminal unless ``--yes``. The run goes on
when svconsole exits; ``svconsole logs RUN --follow`` follows it, ``svconsole stop RUN`` stops it.

An output_dir that already holds a checkpoint (``model.pt``) is named in the checks with its
epoch and step, and the launch needs a choice: ``--resume`` continues from it
(``train_conf.resume=true``; refused when the checkpoint ends the last epoch: raise max_epoch),
``--fresh`` moves the old output_dir aside to ``<output_dir>.<time>`` (nothing is deleted) and
starts anew, ``--force`` launches as it is. ``--resume RUN`` launches again with the profile and
options of RUN (a ``--profile`` given as well replaces RUN's profile, e.g. with more epochs).

Exit status: 0 launched (or ``--dry-run`` with every check ok), 1 a check failed or the launch
failed, 2 bad input or not confirmed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.cluster.redact import ENV_NAME, redact, redact_text
from console.commands.runs import confirm

ENTRIES = ("train_ds", "cpu-wrapper")
"""console.training.launch.ENTRIES, repeated here so that ``--help`` does not import the engine."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch", help="start training on every node (detached), after pre-flight checks",
        description=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", metavar="FILE",
                        help="training profile (default: training.yaml beside cluster.yaml)")
    parser.add_argument("--entry", choices=ENTRIES,
                        help="train_ds (FunASR's train_ds.py, default) or cpu-wrapper (no CUDA)")
    parser.add_argument("--nproc-per-node", type=int, metavar="N",
                        help="processes per node (default: its GPUs; 1 with cpu-wrapper)")
    parser.add_argument("--master-port", type=int, metavar="P",
                        help="rendezvous port (default: cluster.yaml's master_port)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for the training on every node (repeatable)")
    parser.add_argument("--ds-config", metavar="FILE",
                        help="the DeepSpeed JSON to ship to the nodes for this run (default: "
                             "ds_config.json beside cluster.yaml, as the Config screen saves it, "
                             "when it exists; 'profile': the profile's deepspeed_config path as "
                             "it is on the nodes)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--resume", metavar="RUN", nargs="?", const="",
                        help="continue from output_dir's checkpoint (train_conf.resume=true); "
                             "with RUN, with that run's profile and options")
    choice.add_argument("--fresh", action="store_true",
                        help="move an output_dir holding a checkpoint aside and start anew")
    parser.add_argument("--dry-run", action="store_true",
                        help="show the plan and the checks, start nothing")
    parser.add_argument("--force", action="store_true", help="launch even if a check failed")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--json", action="store_true",
                        help="print {ok, checks, plan, run} as JSON (needs --yes to launch)")
    parser.set_defaults(func=handler)


def _env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {redact_text(pair)!r}: expected KEY=VALUE")
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"--env {key!r}: a variable name is letters, digits and _, "
                             f"not starting with a digit")
        if "\0" in value:
            raise ValueError(f"--env {key}: the value holds a NUL byte")
        out[key] = value
    return out


def handler(args: argparse.Namespace, ctx: Context) -> int:
    from dataclasses import replace

    if not args.dry_run:
        ctx.check_writable("launch (--dry-run runs the pre-flight only)")

    from console.training.launch import (
        LaunchError,
        LaunchOptions,
        launch,
        prepare,
        resume_options,
        resume_profile,
    )
    from console.training.profile import (
        ProfileError,
        default_profile,
        ds_config_path_for,
        load_profile,
        profile_path_for,
    )
    from console.training.runs import RunNotFound, resolve_run

    try:
        env = _env(args.env)
        previous = resolve_run(ctx.pool, ctx.state_dir, args.resume) if args.resume else None
        resuming = args.resume is not None
        profile_file = Path(args.profile) if args.profile else profile_path_for(ctx.cluster.path)
        if args.profile or (previous is None and profile_file.exists()):
            profile = load_profile(profile_file)
            if resuming:
                profile = profile.replace("train_conf.resume", True)
        elif previous is not None:
            profile = resume_profile(previous)
        else:
            profile = default_profile()
            if resuming:
                profile = profile.replace("train_conf.resume", True)
        ds_file = (None if args.ds_config == "profile" else Path(args.ds_config) if args.ds_config
                   else ds_config_path_for(ctx.cluster.path))
        ds_json = (ds_file.read_text(encoding="utf-8")
                   if ds_file is not None and (args.ds_config or ds_file.exists()) else None)
    except (ValueError, ProfileError, RunNotFound, OSError) as exc:
        print(f"svconsole launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = resume_options(previous) if previous is not None else LaunchOptions()
    changes = {k: v for k, v in (("entry", args.entry), ("nproc_per_node", args.nproc_per_node),
                                  ("master_port", args.master_port),
                                  ("deepspeed_json", ds_json)) if v is not None}
    options = replace(options, **changes, env={**options.env, **env},
                      checkpoint="resume" if resuming else "fresh" if args.fresh else "refuse")

    with contextlib.redirect_stdout(sys.stderr):  # deepspeed's logger prints on stdout
        prep = prepare(ctx.pool, profile, options)
    out: dict = prep.to_dict()
    if not args.json:
        if prep.plan is not None:
            print(prep.plan.describe(), file=ctx.out)
            print(file=ctx.out)
        for check in prep.checks:
            print(check, file=ctx.out)
    if prep.failures and not args.force:
        return _finish(args, ctx, out, EXIT_FAILED, "not launched: a pre-flight check failed "
                       "(fix it, or --force)")
    if prep.plan is None or args.dry_run:
        return _finish(args, ctx, out, EXIT_FAILED if prep.plan is None else EXIT_OK,
                       "dry run: nothing started" if prep.plan else "no plan: nothing started")
    if not args.yes and (args.json or not confirm(ctx, f"Launch run {prep.plan.run_id} on "
                                                   f"{prep.plan.nnodes} node(s)?")):
        return _finish(args, ctx, out, EXIT_USAGE, "not launched: not confirmed (--yes)")
    try:
        record = launch(ctx.pool, prep, ctx.state_dir, force=args.force,
                        resumed_from=previous.id if previous else None)
    except LaunchError as exc:
        return _finish(args, ctx, out, EXIT_FAILED, str(exc))
    out["run"] = redact(record.to_dict())
    return _finish(args, ctx, out, EXIT_OK,
                   f"launched run {record.id}; follow it with: svconsole logs {record.id} --follow")


def _finish(args: argparse.Namespace, ctx: Context, out: dict, code: int, message: str) -> int:
    out["message"] = message
    if args.json:
        print(json.dumps(out, indent=2), file=ctx.out)
    else:
        print(message, file=ctx.out if code == EXIT_OK else sys.stderr)
    return code
