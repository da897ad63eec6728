"""Idempotent edits of configuration files (/etc/exports, /etc/fstab, sysctl.d, authorized_keys).

The same code runs here (import it) and on a node: the bring-up sends this file as a program on
the node's ``python3`` standard input (stdlib only, Python >= 3.8)::

    python3 - ensure-line /etc/fstab 'head:/data /data nfs defaults 0 0' --match '^\\S+\\s+/data\\s'
    python3 - ensure-block /etc/sysctl.d/90-svconsole.conf net-tuning 'net.core.rmem_max = 1'
    python3 - ... --check     # exit 0 when the file already holds it, 1 when it would change

A re-run never adds a second line: an existing line matching ``--match`` is replaced instead,
and a marked block (``# BEGIN svconsole NAME`` .. ``# END svconsole NAME``) is rewritten in
place. Files are replaced atomically, keeping their mode (new files get ``--mode``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

BEGIN = "# BEGIN svconsole {name}"
END = "# END svconsole {name}"


def ensure_line_text(text: str, line: str, match: str | None = None) -> str:
    """``text`` holding ``line`` exactly once: kept if present; else the first line matching
    the regex ``match`` is replaced by it (and later matching lines dropped); else appended."""
    lines = text.splitlines()
    pattern = re.compile(match) if match else None
    out: list[str] = []
    placed = False
    for existing in lines:
        same = existing == line
        matching = same or (pattern is not None and pattern.search(existing) is not None)
        if matching:
            if not placed:
                out.append(line)
                placed = True
            continue
        out.append(existing)
    if not placed:
        out.append(line)
    return "\n".join(out) + "\n"


def ensure_block_text(text: str, name: str, body: str, drop: str | None = None) -> str:
    """``text`` with one marked block ``name`` holding ``body`` (replaced where it was).
    Lines outside the block that match the regex ``drop`` are removed (e.g. an old export of
    the same directory to ``*``)."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    block = [begin, *body.rstrip("\n").splitlines(), end]
    lines = text.splitlines()
    if begin in lines and end in lines[lines.index(begin):]:
        start = lines.index(begin)
        stop = lines.index(end, start)
        before, after = lines[:start], lines[stop + 1:]
    else:
        before, after = lines, []
    if drop:
        pattern = re.compile(drop)
        before = [line for line in before if not pattern.search(line)]
        after = [line for line in after if not pattern.search(line)]
    return "\n".join(before + block + after) + "\n"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _replace(path: str, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, then rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    try:
        st = os.stat(path)
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        owner = None
    fd, tmp = tempfile.mkstemp(prefix=".svconsole-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if owner is not None and hasattr(os, "chown"):
            try:
                os.chown(tmp, *owner)
            except PermissionError:
                pass
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _apply(path: str, new_text: str, mode: int, check_only: bool) -> bool:
    """True when the file already held ``new_text``; otherwise writes it (unless check_only)."""
    old = _read(path)
    if old == new_text:
        return True
    if not check_only:
        _replace(path, new_text, mode)
    return False


def ensure_line(path: str, line: str, match: str | None = None, *, mode: int = 0o644,
                check_only: bool = False) -> bool:
    """Make ``path`` hold ``line`` once (see :func:`ensure_line_text`). Returns True when the
    file was already right, False when it was (or, with ``check_only``, would be) changed."""
    path = os.path.expanduser(path)
    return _apply(path, ensure_line_text(_read(path), line, match), mode, check_only)


def ensure_block(path: str, name: str, body: str, *, drop: str | None = None,
                 mode: int = 0o644, check_only: bool = False) -> bool:
    """Make ``path`` hold the marked block ``name`` with ``body`` (see :func:`ensure_block_text`)."""
    path = os.path.expanduser(path)
    return _apply(path, ensure_block_text(_read(path), name, body, drop), mode, check_only)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 - (svconsole edits)")
    sub = parser.add_subparsers(dest="op", required=True)
    line = sub.add_parser("ensure-line")
    line.add_argument("path")
    line.add_argument("line")
    line.add_argument("--match")
    block = sub.add_parser("ensure-block")
    block.add_argument("path")
    block.add_argument("name")
    block.add_argument("body")
    block.add_argument("--drop", help="regex: remove matching lines outside the block")
    for p in (line, block):
        p.add_argument("--mode", default="644", help="octal mode of a new file")
        p.add_argument("--check", action="store_true", help="only tell: exit 0 if already right")
    args = parser.parse_args(argv)
    mode = int(args.mode, 8)
    try:
        if args.op == "ensure-line":
            right = ensure_line(args.path, args.line, args.match, mode=mode, check_only=args.check)
        else:
            right = ensure_block(args.path, args.name, args.body, drop=args.drop, mode=mode,
                                 check_only=args.check)
    except OSError as exc:
        print(f"svconsole edit: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.path}: {'already holds it' if right else 'needs the change'}")
        return 0 if right else 1
    print(f"{args.path}: {'unchanged' if right else 'updated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
