"""Are these pip requirements satisfied in this interpreter? (sent to a node's training Python)

    ENV/bin/python - 'torch>=2.12.1' 'numpy' < reqcheck.py

Prints one line per requirement (``torch 2.13.0: ok``, ``numpy: not installed``) and exits 0
when all are met, 1 otherwise. Uses ``packaging`` (or pip's copy) when the environment has it;
a venv made without pip has neither, so simple specifiers (``== != >= <= > <``, comma-joined)
are also understood without them. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import operator
import re
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    from packaging.requirements import Requirement
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:
        Requirement = None  # type: ignore[assignment,misc]

_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
        ">": operator.gt, "<": operator.lt}


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.3.0+cu121`` -> (2, 3)), trailing zeros dropped."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    parts = [int(p) for p in match.group(1).split(".")] if match else [0]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse(text: str):
    """(distribution name, predicate on an installed version string)."""
    if Requirement is not None:
        req = Requirement(text)
        return req.name, lambda have: req.specifier.contains(have, prereleases=True)
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", text)
    if not match:
        raise ValueError(f"cannot read requirement {text!r}")
    clauses = []
    for clause in filter(None, (c.strip() for c in match.group(2).split(","))):
        op = next((o for o in sorted(_OPS, key=len, reverse=True) if clause.startswith(o)), None)
        if op is None:
            raise ValueError(f"cannot read specifier {clause!r} in {text!r}")
        clauses.append((_OPS[op], _release(clause[len(op):])))
    return match.group(1), lambda have: all(f(_release(have), v) for f, v in clauses)


def check(requirements: list[str]) -> int:
    """Print the state of each requirement; the number not met."""
    missing = 0
    for text in requirements:
        name, ok = parse(text)
        try:
            have = version(name)
        except PackageNotFoundError:
            print(f"{name}: not installed (wants {text})")
            missing += 1
            continue
        met = ok(have)
        print(f"{name} {have}: {'ok' if met else 'does not match ' + text}")
        missing += not met
    return missing


if __name__ == "__main__":
    sys.exit(1 if check(sys.argv[1:]) else 0)
