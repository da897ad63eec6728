#!/usr/bin/env python3
"""Screenshots (SVG) of svconsole's five screens and its help, for the documentation.

    python scripts/screenshots.py [--config CLUSTER_YAML] [--out docs/screens] [--size 120x36]

The real app runs headless (Textual's ``App.run_test``) against a real cluster: with
``--config``, the one that file names (for the walkthrough's pictures, the loopback cluster of
docs/walkthrough.md after its run, with the same ``SVCONSOLE_STATE_DIR``, so the Setup grid and
the Training screen show what was done); without it, a loopback cluster of three nodes started
in a temporary directory and stopped at the end. Each screen is shown, given ``--settle`` seconds
to probe and draw, and saved with ``App.save_screenshot`` as ``nodes.svg``, ``setup.svg``,
``config.svg``, ``training.svg``, ``gpus.svg`` and ``help.svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

SHOTS = (("1", "nodes"), ("2", "setup"), ("3", "config"), ("4", "training"), ("5", "gpus"),
         ("?", "help"))
"""(key pressed, file name) in the order taken; help opens over the GPUs screen."""


async def take(cluster_yaml: Path, out: Path, size: tuple[int, int], settle: float) -> list[Path]:
    """Open the app on ``cluster_yaml``, show each screen, save an SVG of each into ``out``."""
    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool
    from screens.app import SVConsoleApp

    out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(cluster_yaml)
    pool = Pool(cluster)
    saved = []
    try:
        app = SVConsoleApp(cluster, pool)
        async with app.run_test(size=size) as pilot:
            for key, name in SHOTS:
                await pilot.press(key)
                await pilot.pause(settle)
                saved.append(Path(app.save_screenshot(f"{name}.svg", str(out))))
    finally:
        pool.close()
    return saved


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not WIDTHxHEIGHT: {text!r}") from None
    return width, height


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="cluster.yaml (default: a fresh loopback "
                                                    "cluster of three nodes)")
    parser.add_argument("--out", type=Path, default=Path("docs/screens"),
                        help="directory of the SVG files (default docs/screens)")
    parser.add_argument("--size", type=_size, default=(120, 36), help="terminal size (120x36)")
    parser.add_argument("--settle", type=float, default=6.0,
                        help="seconds each screen gets to probe and draw (default 6)")
    args = parser.parse_args(argv)
    if args.config is not None:
        saved = asyncio.run(take(args.config, args.out, args.size, args.settle))
    else:
        from console.ssh.loopback import LoopbackCluster

        with tempfile.TemporaryDirectory(prefix="svshots-") as tmp, \
                LoopbackCluster(tmp, 3, base_port=None) as lb:
            saved = asyncio.run(take(lb.cluster_yaml, args.out, args.size, args.settle))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
