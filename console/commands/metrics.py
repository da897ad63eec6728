"""``svconsole metrics``: training metrics from FunASR logs.

* ``svconsole metrics --log FILE... [--json [OUT] | --csv [OUT] | --png OUT] [--all]`` parses
  existing FunASR/DeepSpeed/torchrun log files, no cluster needed: one row per understood line
  (kind, node, line, rank, epoch, total step, loss, lr, stats, timings, GPU memory, ...), the
  per-rank summary, validation losses and the faults found with their fix. JSON numbers are
  numbers, nan/inf are null. ``--png`` draws loss and learning rate over total step.
  Each file is one node's log; the node is named after the file (``node0.log`` -> ``node0``).
* ``svconsole metrics RUN [--json|--csv|--png]``: the same for a launched run (its id, a unique
  prefix or ``latest``), reading each node's log over the SSH pool as it is now.

Exit status: 0 fine, 1 when an error-level fault was found, 2 for bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from console.training.faults import Severity
from console.training.logparse import Event, Unparsed, parse_file
from console.training.metrics import MetricsStore, json_safe

#: Columns that lead the CSV; the others follow in the order they first appear.
LEAD_COLUMNS = ("node", "line", "kind", "rank", "time", "epoch", "max_epoch", "total_step",
                "loss_avg_rank", "lr")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="training metrics and faults from FunASR logs",
        description="Parse FunASR training logs (train/val lines per rank, checkpoints, ETA, "
                    "DeepSpeed timers, tracebacks) into metrics and named faults. With --log, "
                    "works on log files without any cluster.",
    )
    parser.add_argument("run", metavar="RUN", nargs="?",
                        help="a launched run: its id, a unique prefix, or 'latest' "
                             "(its logs are read over SSH from every node)")
    parser.add_argument("--log", metavar="FILE", nargs="+", action="extend", default=[],
                        help="log file(s) to parse, one per node")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", metavar="OUT", nargs="?", const="-",
                     help="write JSON (to OUT, default standard output)")
    out.add_argument("--csv", metavar="OUT", nargs="?", const="-",
                     help="write one CSV row per parsed line (to OUT, default standard output)")
    out.add_argument("--png", metavar="OUT", help="draw loss and learning rate to a PNG file")
    parser.add_argument("--all", action="store_true",
                        help="also list lines that were not understood (kind 'unparsed')")
    parser.set_defaults(func=handler)


@dataclass
class _Parsed:
    """What the command read: rows per line, per-file counts, and the run's store."""

    store: MetricsStore
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)


def handler(args: argparse.Namespace, ctx: Context) -> int:
    if (args.run is None) == (not args.log):
        print("svconsole metrics: give a RUN or --log FILE... (one of the two)", file=sys.stderr)
        return EXIT_USAGE
    with MetricsStore() as store:
        parsed = _Parsed(store)
        if args.run is not None:
            failed = _read_run(args.run, parsed, ctx, keep_unparsed=args.all)
            if failed:
                print(f"svconsole metrics: {failed}", file=sys.stderr)
                return EXIT_USAGE
            sources = [args.run]
        else:
            for name in args.log:
                try:
                    _read(str(name), ((Path(name).stem, e) for e in parse_file(name)), parsed,
                          keep_unparsed=args.all)
                except OSError as exc:
                    print(f"svconsole metrics: {name}: {exc.strerror or exc}", file=sys.stderr)
                    return EXIT_USAGE
            sources = [Path(n).name for n in args.log]
        findings = store.findings()
        status = EXIT_FAILED if any(f.severity is Severity.ERROR for f in findings) else EXIT_OK
        if args.png:
            store.to_png(args.png, title=", ".join(sources))
            print(f"wrote {args.png}", file=ctx.out)
        elif args.json:
            doc = {"files": parsed.files, **store.to_json(), "lines": parsed.rows}
            _emit(args.json, json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n", ctx)
        elif args.csv:
            _emit(args.csv, _csv_text(parsed.rows), ctx)
        else:
            _summary(parsed, ctx)
        return status


def _read_run(run: str, parsed: _Parsed, ctx: Context, *, keep_unparsed: bool) -> str | None:
    """Read a launched run's logs from its nodes; the error text, or None."""
    from console.training.evidence import add_kernel_evidence
    from console.training.follow import FollowError, read_run
    from console.training.runs import RunNotFound, resolve_run

    try:
        record = resolve_run(ctx.pool, ctx.state_dir, run)
    except RunNotFound as exc:
        return str(exc)
    by_node: dict[str, list[Event]] = {}
    try:
        for node, event in read_run(ctx.pool, record):
            by_node.setdefault(node, []).append(event)
    except FollowError as exc:
        return f"run {record.run_id}: {exc}"
    for node in record.nodes:
        events = by_node.get(node.node, [])
        _read(f"{node.node}:{node.log}", ((node.node, e) for e in events), parsed,
              keep_unparsed=keep_unparsed)
    add_kernel_evidence(ctx.pool, parsed.store, set())  # a SIGKILLed rank: the kernel's word
    return None


def _read(path: str, events: Iterable[tuple[str, Event]], parsed: _Parsed, *,
          keep_unparsed: bool) -> None:
    """Add one node's log (``(node, event)`` in line order) to the rows and the store."""
    counts: Counter[str] = Counter()
    lines = 0
    node = ""
    for node, event in events:
        lines += 1
        counts[event.kind] += 1
        parsed.store.add(event, node=node)
        if keep_unparsed or not isinstance(event, Unparsed):
            parsed.rows.append(_row(event, node))
    parsed.files.append({"path": path, "node": node or Path(path).stem, "lines": lines,
                         "kinds": dict(counts)})


def _row(event: Event, node: str) -> dict[str, Any]:
    """A flat record of one line: nested stats/timings/timers become columns."""
    data = event.to_dict()
    data.pop("offset")
    text = data.pop("text")
    row: dict[str, Any] = {"node": node, "line": data.pop("line_no")}
    for key, value in data.items():
        if key == "stats":
            row.update({f"stat_{k}": v for k, v in value.items()})
        elif key in ("timings", "timers"):
            row.update({f"{k}_{'s' if key == 'timings' else 'ms'}": v for k, v in value.items()})
        elif key == "overrides":
            row[key] = " ".join(value)
        else:
            row[key] = value
    if isinstance(event, Unparsed):
        row["text"] = text
    return row


def _csv_text(rows: list[dict[str, Any]]) -> str:
    columns = list(LEAD_COLUMNS)
    seen = set(columns)
    for row in rows:
        for key in row:
            if key not in seen:
                seen.add(key)
                columns.append(key)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in json_safe(row).items()})
    return buf.getvalue()


def _emit(target: str, text: str, ctx: Context) -> None:
    if target == "-":
        ctx.out.write(text)
        return
    from console.atomic import atomic_write

    atomic_write(target, text, backup=False)
    print(f"wrote {target}", file=ctx.out)


def _num(value: float | None, fmt: str = ".4g") -> str:
    return "-" if value is None else format(value, fmt)


def _summary(parsed: _Parsed, ctx: Context) -> None:
    out = ctx.out
    store = parsed.store
    for f in parsed.files:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(f["kinds"].items()))
        print(f"{f['path']} (node {f['node']}): {f['lines']} lines: {kinds}", file=out)
    p = store.progress()
    if p.total_step is not None:
        print(f"progress: epoch {p.epoch}/{p.max_epoch}, step {p.step_in_epoch}/"
              f"{p.steps_per_epoch} of the epoch, total step {p.total_step}, "
              f"step time {_num(p.step_time_s, '.3f')} s, "
              f"{_num(p.steps_per_s, '.2f')} steps/s", file=out)
    ranks = store.ranks()
    if ranks:
        print(f"{'rank':>4}  {'node':<12} {'epoch':>5} {'step':>7} {'loss':>10} {'lr':>10} "
              f"{'step s':>7} {'GPU GB':>7} {'peak GB':>7} {'sync ms':>8}", file=out)
        for r in ranks:
            print(f"{r.rank:>4}  {r.node or '-':<12} {_num(r.epoch, 'd'):>5} "
                  f"{_num(r.last_step, 'd'):>7} {_num(r.loss):>10} {_num(r.lr, '.3e'):>10} "
                  f"{_num(r.step_time_s, '.3f'):>7} {_num(r.gpu_mem_gb, '.2f'):>7} "
                  f"{_num(r.gpu_peak_gb, '.2f'):>7} {_num(r.grad_sync_ms, '.1f'):>8}", file=out)
    sync = store.grad_sync()
    if sync:
        parts = ", ".join(f"{rank} {v['median_ms']:.1f} ms ({v['verdict']})" for rank, v in sync.items())
        print(f"gradient sync (median bwd_allreduce; < 500 ms normal, > 2000 ms bad): {parts}",
              file=out)
    val = store.series("val_loss")
    if val is not None:
        pts = ", ".join(f"{_num(y)} (step {x:g})" for x, y, _, _ in val.points())
        print(f"validation loss: {pts}", file=out)
    findings = store.findings()
    if not findings:
        print("faults: none found", file=out)
    for f in findings:
        where = ", ".join(x for x in (f"node {f.node}" if f.node else "",
                                      f"rank {f.rank}" if f.rank is not None else "",
                                      f"line {f.line_no}" if f.line_no else "") if x)
        print(f"{f.severity.value.upper()}: {f.fault.title} [{f.id}] ({where})", file=out)
        for line in f.evidence[:3]:
            print(f"    | {line[:200]}", file=out)
        if f.detail:
            print(f"    {f.detail}", file=out)
        print(f"    fix: {f.fault.advice}", file=out)
