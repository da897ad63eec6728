"""``svconsole hostfile``: convert between DeepSpeed hostfiles and cluster.yaml.

* ``svconsole hostfile import FILE [-o cluster.yaml]`` writes a new cluster.yaml from the hosts of
  FILE, or adds them to an existing one (a host already there gets its ``gpus`` updated; the
  file's comments stay, the previous version is kept as ``cluster.yaml.bak``).
* ``svconsole hostfile export [-o FILE] [--slots N]`` writes the hostfile of the loaded cluster
  (slots from each node's ``gpus``, or N for every node).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from console.atomic import atomic_write, backup_path
from console.cli import EXIT_OK, Context
from console.cluster.model import (
    ClusterEditor,
    cluster_from_hostfile,
    export_hostfile,
    import_hostfile,
    parse_cluster,
    read_text,
)


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (1 to 65535)")
    return value


def _slots(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a GPU count")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hostfile",
        help="import or export a DeepSpeed hostfile",
        description="Convert between DeepSpeed hostfiles (`host slots=N` lines) and cluster.yaml.",
    )
    actions = parser.add_subparsers(dest="hostfile_action", metavar="ACTION", required=True)

    imp = actions.add_parser(
        "import",
        help="make or extend cluster.yaml from a hostfile",
        description="Write a new cluster.yaml for the hosts of FILE, or add them to an existing "
        "one (its comments are kept, the old version saved as .bak).",
    )
    imp.add_argument("file", metavar="FILE", help="DeepSpeed hostfile ('-' reads standard input)")
    imp.add_argument(
        "-o",
        "--output",
        default="cluster.yaml",
        help="cluster.yaml to write (default: %(default)s)",
    )
    imp.add_argument("--user", help="SSH user of the imported nodes")
    imp.add_argument("--port", type=_port, help="SSH port of the imported nodes")
    imp.add_argument("--name", help="cluster name (new file only)")
    imp.add_argument(
        "--shared-dir",
        default="/data/shared",
        help="shared_dir (new file only; default: %(default)s)",
    )
    imp.set_defaults(func=import_command)

    exp = actions.add_parser(
        "export",
        help="write the cluster's DeepSpeed hostfile",
        description="Print (or write, with -o) a DeepSpeed hostfile for the loaded cluster.",
    )
    exp.add_argument("-o", "--output", help="file to write (default: standard output)")
    exp.add_argument(
        "--slots", type=_slots, help="slots for every node (default: the count of its gpus)"
    )
    exp.set_defaults(func=export_command)


def import_command(args: argparse.Namespace, ctx: Context) -> int:
    """Create or extend ``args.output`` from the hostfile ``args.file``."""
    ctx.check_writable(f"hostfile import (it writes {args.output})")
    text = sys.stdin.read() if args.file == "-" else read_text(Path(args.file), args.file)
    entries = import_hostfile(text, source="<stdin>" if args.file == "-" else args.file)
    output = Path(args.output)
    if not output.exists():
        new_text = cluster_from_hostfile(
            entries, name=args.name, user=args.user, port=args.port, shared_dir=args.shared_dir
        )
        cluster = parse_cluster(new_text, args.output, output)  # never write a file we would refuse
        atomic_write(output, new_text, backup=False)
        print(
            f"{args.output}: written with {len(cluster.nodes)} nodes ({', '.join(cluster.names())})",
            file=ctx.out,
        )
        return EXIT_OK
    editor = ClusterEditor(output)
    added, updated = editor.merge_hostfile(entries, user=args.user, port=args.port)
    if not added and not updated:
        print(f"{args.output}: already has these hosts; nothing changed", file=ctx.out)
        return EXIT_OK
    editor.save()
    changes = [
        f"{label} {', '.join(names)}"
        for label, names in (("added", added), ("updated", updated))
        if names
    ]
    print(
        f"{args.output}: {'; '.join(changes)} (previous version: {backup_path(output)})",
        file=ctx.out,
    )
    return EXIT_OK


def export_command(args: argparse.Namespace, ctx: Context) -> int:
    """Print or write the DeepSpeed hostfile of ``ctx.cluster``."""
    cluster = ctx.cluster
    counts = None if args.slots is None else {name: args.slots for name in cluster.names()}
    text = export_hostfile(cluster, counts)
    if args.output is None:
        ctx.out.write(text)
    else:
        ctx.check_writable(f"hostfile export -o {args.output} (print it instead: no -o)")
        atomic_write(args.output, text, backup=True)
        print(f"{args.output}: {len(cluster.nodes)} nodes", file=ctx.out)
    return EXIT_OK
