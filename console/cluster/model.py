"""The cluster model: what ``cluster.yaml`` describes, how it is loaded, checked and edited.

* :func:`load_cluster` reads and checks a ``cluster.yaml``; every problem is reported at once as a
  :class:`ConfigIssue` (``cluster.yaml:14:5: nodes[2].host: required``) inside one
  :class:`ClusterConfigError`. It raises nothing else, whatever the file holds.
* :func:`load_or_default` is what the CLI and the app use: ``--config``, ``./cluster.yaml``,
  ``~/.config/svconsole/cluster.yaml``, or else :func:`local_cluster` (this machine, no SSH).
* :meth:`Cluster.ssh_params` gives the connection settings of a node with the ``ssh:`` defaults
  applied and local paths expanded.
* :func:`import_hostfile` / :func:`export_hostfile` convert from and to DeepSpeed hostfiles.
* :class:`ClusterEditor` changes a ``cluster.yaml`` and keeps the user's comments and layout.
"""

from __future__ import annotations

import contextlib
import difflib
import getpass
import io
import ipaddress
import json
import math
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, MarkedYAMLError
from ruamel.yaml.scalarbool import ScalarBoolean
from ruamel.yaml.scalarstring import DoubleQuotedScalarString
from ruamel.yaml.tokens import CommentToken
from ruamel.yaml.util import load_yaml_guess_indent

from console.atomic import atomic_write

USER_CONFIG = Path("~/.config/svconsole/cluster.yaml")
"""The per-user cluster.yaml, used when there is none in the current directory."""
LOCAL_SHARED_DIR = "~/.local/share/svconsole/shared"
"""``shared_dir`` of the embedded one-node default (not created until something needs it)."""

HostKeyPolicy = Literal["accept-new", "strict"]
Role = Literal["head", "worker"]


@dataclass(frozen=True)
class SSHSettings:
    """The ``ssh:`` section: connection defaults for every node."""

    user: str | None = None
    """Login name; None means the local user name (as ``ssh`` does)."""
    port: int = 22
    identity_file: str | None = None
    """Private key file (raw, ``~`` not expanded); ssh-agent keys are tried as well."""
    known_hosts: str = "~/.config/svconsole/known_hosts"
    """svconsole's own known_hosts file (raw path); the system ones are read too."""
    host_key_policy: HostKeyPolicy = "accept-new"
    """``accept-new`` records the key of a node seen for the first time; ``strict`` refuses it."""
    jump_host: str | None = None
    """``[user@]host[:port]`` of a bastion all connections go through; a comma-separated chain
    (``bastion,inner``) goes through each in turn, as OpenSSH's ProxyJump."""
    connect_timeout: float = 10.0
    max_parallel: int = 32
    """How many nodes one fan-out talks to at the same time."""
    config_file: str = "~/.ssh/config"
    """The OpenSSH client config whose Host blocks apply (raw path; see console.ssh.sshconfig)."""
    use_ssh_config: bool = True
    """False: ignore ``config_file`` (only cluster.yaml and the defaults apply)."""
    origins: tuple[tuple[str, str], ...] = ()
    """``(key, "cluster.yaml:LINE")`` for each key written in the ``ssh:`` section."""

    def origin(self, key: str) -> str | None:
        """Where ``key`` was set (``cluster.yaml:7 ssh.port``), None if it is a default."""
        return dict(self.origins).get(key)


@dataclass(frozen=True)
class Node:
    """One machine of the cluster. ``port``, ``user`` and ``identity_file`` already have the
    ``ssh:`` defaults applied."""

    name: str
    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    role: Role = "worker"
    gpus: tuple[int, ...] | None = None
    """CUDA_VISIBLE_DEVICES on that node; None: all of its GPUs, (): none."""
    local: bool = False
    """Run through local subprocesses, not SSH."""
    line: int | None = None
    """Line of cluster.yaml where the node is declared (for messages)."""
    origins: tuple[tuple[str, str], ...] = ()
    """``(field, "cluster.yaml:LINE key")`` for host, port, user and identity_file when
    cluster.yaml sets them (on the node or in ``ssh:``); a field not listed is a default, which
    an ssh_config Host block may replace."""

    def origin(self, key: str) -> str | None:
        return dict(self.origins).get(key)


@dataclass(frozen=True)
class JumpHost:
    """A parsed ``ssh.jump_host``."""

    host: str
    port: int = 22
    user: str | None = None
    port_given: bool = False
    """Whether the text named the port (else an ssh_config Port may apply)."""


@dataclass(frozen=True)
class SSHParams:
    """Everything needed to connect to one node: defaults applied, local paths expanded."""

    node: str
    host: str
    port: int
    user: str
    identity_file: Path | None
    known_hosts: Path
    host_key_policy: HostKeyPolicy
    connect_timeout: float
    jump: JumpHost | None
    """The bastion to go through, its user defaulting to ``ssh.user`` (or the local user)."""
    local: bool


@dataclass(frozen=True)
class Cluster:
    """A whole ``cluster.yaml`` (or the embedded one-node default)."""

    name: str
    nodes: tuple[Node, ...]
    shared_dir: str = "/data/shared"
    """Directory that every node sees (NFS from the head node); a path on the nodes."""
    master: str = ""
    """Node that hosts torchrun's rendezvous."""
    master_port: int = 26669
    ssh: SSHSettings = field(default_factory=SSHSettings)
    python: str | None = None
    """Training interpreter on the nodes (a venv's or conda env's bin/python); None: python3."""
    path: Path | None = None
    """File it came from; None for the embedded default."""
    id: str | None = None
    """``cluster.id``: this cluster's identity, written by svconsole on first use (see
    ``console.cluster.identity``); it survives renames and tells apart two clusters on the
    same hosts."""
    read_only: bool = False
    """``cluster.read_only``: nothing that changes a node or a file (setup apply, launch, stop,
    save); ``svconsole --read-only`` does the same for one session."""

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def master_node(self) -> Node:
        return self.node(self.master or self.nodes[0].name)

    def local_path(self, raw: str) -> Path:
        """A path from cluster.yaml as this machine sees it: ``~`` expanded, a relative path
        taken from the directory of cluster.yaml (or the current directory)."""
        p = Path(raw).expanduser()
        if p.is_absolute():
            return p
        base = self.path.parent if self.path is not None else Path.cwd()
        return base / p

    def ssh_params(self, node: Node | str) -> SSHParams:
        """The effective SSH settings of ``node`` (a :class:`Node` or its name)."""
        n = self.node(node) if isinstance(node, str) else node
        ssh = self.ssh
        jump = None
        if ssh.jump_host:
            j = parse_jump_chain(ssh.jump_host)[-1]
            jump = JumpHost(j.host, j.port, j.user or ssh.user or local_user())
        return SSHParams(
            node=n.name,
            host=n.host,
            port=n.port,
            user=n.user or local_user(),
            identity_file=self.local_path(n.identity_file) if n.identity_file else None,
            known_hosts=self.local_path(ssh.known_hosts),
            host_key_policy=ssh.host_key_policy,
            connect_timeout=ssh.connect_timeout,
            jump=jump,
            local=n.local,
        )


def local_user() -> str:
    """This machine's user name (what ``ssh`` logs in as when no User is given)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "root"


# --------------------------------------------------------------------------------------------
# Issues


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a file: ``str()`` gives ``file:line:col: field: message``."""

    file: str
    line: int | None
    col: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        return ": ".join(part for part in (where, self.field, self.message) if part)


class ReadOnlyError(PermissionError):
    """An action that would change a node or a file, refused in read-only mode."""

    def __init__(self, action: str) -> None:
        super().__init__(f"read-only (svconsole --read-only, or cluster.read_only in "
                         f"cluster.yaml): {action} is disabled, since it would change a node or "
                         "a file")
        self.action = action


def check_writable(cluster: Cluster, action: str) -> None:
    """Raise :class:`ReadOnlyError` naming ``action`` when ``cluster`` is read-only."""
    if cluster.read_only:
        raise ReadOnlyError(action)


class ClusterConfigError(Exception):
    """A cluster.yaml (or hostfile) that cannot be used; ``issues`` lists every problem."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class _Invalid(Exception):
    """A value a field checker refuses; the argument is the message."""


# --------------------------------------------------------------------------------------------
# Field checkers: each returns the value as the model stores it, or raises _Invalid.

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"(?!-)[A-Za-z0-9._:%\[\]-]+")
_USER = re.compile(r"(?!-)[A-Za-z0-9._][A-Za-z0-9._$-]*")
_GPU_INDEX = re.compile(r"[0-9]{1,6}")
_CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{7,63}")


def _describe(value: Any) -> str:
    """How a value is shown in a message."""
    if value is None:
        return "nothing"
    if _is_bool(value):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        text = str(value)
        return repr(text if len(text) <= 40 else text[:37] + "...")
    if isinstance(value, (int, float)):
        return repr(int(value) if isinstance(value, int) else float(value))
    return f"a {type(value).__name__} value"


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, ScalarBoolean))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not _is_bool(value)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        hint = " (put it in quotes)" if isinstance(value, (int, float)) else ""
        raise _Invalid(f"must be a string, got {_describe(value)}{hint}")
    if not value.strip():
        raise _Invalid("must not be empty")
    return str(value)


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = _string(value)
        if not pattern.fullmatch(text):
            raise _Invalid(f"must be {what}, got {_describe(text)}")
        return text

    return check


_node_name = _matching(
    _NODE_NAME, "letters, digits, '.', '_' or '-' (starting with a letter or digit)"
)
_host = _matching(_HOST, "a host name or IP address")
_user = _matching(_USER, "a user name")
_cluster_id = _matching(_CLUSTER_ID, "8 to 64 letters, digits, '.', '_' or '-' (svconsole "
                        "generates it: leave it as it is)")


def _port(value: Any) -> int:
    if not _is_int(value) or not 1 <= value <= 65535:
        raise _Invalid(f"must be a port number from 1 to 65535, got {_describe(value)}")
    return int(value)


def _positive_int(value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise _Invalid(f"must be a whole number of at least 1, got {_describe(value)}")
    return int(value)


def _seconds(value: Any) -> float:
    if (
        not isinstance(value, (int, float))
        or _is_bool(value)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _Invalid(f"must be a number of seconds above 0, got {_describe(value)}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not _is_bool(value):
        raise _Invalid(f"must be true or false, got {_describe(value)}")
    return bool(value)


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise _Invalid(f"must be {' or '.join(allowed)}, got {_describe(value)}")
        return str(value)

    return check


def _one_line(value: Any) -> str:
    """A string (a path, a name) that goes to the nodes: one line, no control characters."""
    text = _string(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise _Invalid(f"must be one line without control characters, got {_describe(text)}")
    return text


def _shared_dir(value: Any) -> str:
    text = _one_line(value)
    if not (text.startswith("/") or text.startswith("~")):
        raise _Invalid(f"must be an absolute path (or start with ~), got {_describe(text)}")
    if re.search(r"[\s#\"'\\]", text):
        raise _Invalid(f"must be a path without blanks, quotes, '#' or backslashes (it is one "
                       f"field of /etc/exports and /etc/fstab), got {_describe(text)}")
    return text


def parse_gpus(value: Any) -> tuple[int, ...]:
    """GPU indices from ``"0,1,2,3"``, a YAML list ``[0, 1]`` or a single index; ``""`` is none.

    Raises ValueError with a message for anything else (negative, repeated, not a number)."""
    what = 'GPU indices separated by commas, like "0,1,2,3"'
    if _is_int(value):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = [] if not value.strip() else [part.strip() for part in value.split(",")]
    elif isinstance(value, list):
        items = list(value)
    else:
        raise ValueError(f"must be {what}, got {_describe(value)}")
    indices: list[int] = []
    for item in items:
        if _is_int(item) and item >= 0:
            index = int(item)
        elif isinstance(item, str) and _GPU_INDEX.fullmatch(item):
            index = int(item)
        else:
            raise ValueError(f"must be {what}, got {_describe(value)}")
        if index in indices:
            raise ValueError(f"GPU {index} is listed twice")
        indices.append(index)
    return tuple(indices)


def _gpus(value: Any) -> tuple[int, ...]:
    try:
        return parse_gpus(value)
    except ValueError as e:
        raise _Invalid(str(e)) from None


def parse_jump_host(text: str) -> JumpHost:
    """Split ``[user@]host[:port]`` (IPv6 in brackets: ``[fd00::1]:2222``; bare ``fd00::1`` is a
    host without a port) or ``ssh://[user@]host[:port]``; ValueError if malformed. The one parser
    of SSH addresses: cluster.yaml's jump_host, ssh_config's ProxyJump and the pool use it."""
    text = text.removeprefix("ssh://")
    user, _, rest = text.rpartition("@")
    port_text = ""
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise ValueError(f"bad jump host {text!r}")
        port_text = tail[1:]
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host = rest
    if not _HOST.fullmatch(host) or (user and not _USER.fullmatch(user)):
        raise ValueError(f"bad jump host {text!r}")
    port = 22
    if port_text:
        if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"bad port in jump host {text!r}")
        port = int(port_text)
    return JumpHost(host=host, port=port, user=user or None, port_given=bool(port_text))


def parse_jump_chain(text: str) -> tuple[JumpHost, ...]:
    """A comma-separated chain of :func:`parse_jump_host` addresses, first hop first."""
    return tuple(parse_jump_host(part.strip()) for part in text.split(","))


def _jump_host(value: Any) -> str:
    text = _string(value)
    try:
        parse_jump_chain(text)
    except ValueError:
        raise _Invalid(f"must be [user@]host[:port] (or a comma-separated chain of them), "
                       f"got {_describe(text)}") from None
    return text


@dataclass(frozen=True)
class _Field:
    check: Callable[[Any], Any]
    required: bool = False


_CLUSTER_FIELDS = {
    "name": _Field(_one_line),
    "shared_dir": _Field(_shared_dir),
    "master": _Field(_node_name),
    "master_port": _Field(_port),
    "python": _Field(_one_line),
    "id": _Field(_cluster_id),
    "read_only": _Field(_boolean),
}
_SSH_FIELDS = {
    "user": _Field(_user),
    "port": _Field(_port),
    "identity_file": _Field(_one_line),
    "known_hosts": _Field(_one_line),
    "host_key_policy": _Field(_choice("accept-new", "strict")),
    "jump_host": _Field(_jump_host),
    "connect_timeout": _Field(_seconds),
    "max_parallel": _Field(_positive_int),
    "config_file": _Field(_string),
    "use_ssh_config": _Field(_boolean),
}
_NODE_FIELDS = {
    "name": _Field(_node_name, required=True),
    "host": _Field(_host),  # required unless the node is local
    "port": _Field(_port),
    "user": _Field(_user),
    "identity_file": _Field(_one_line),
    "role": _Field(_choice("head", "worker")),
    "gpus": _Field(_gpus),
    "local": _Field(_boolean),
}
_TOP_KEYS = ("cluster", "ssh", "nodes", "alerts")  # alerts: console.alerts.rules checks it


# --------------------------------------------------------------------------------------------
# Positions in the round-trip document (ruamel counts from 0; messages count from 1)

Pos = tuple[int | None, int | None]
_NOWHERE: Pos = (None, None)


def _one_based(pair: Any) -> Pos:
    try:
        return int(pair[0]) + 1, int(pair[1]) + 1
    except (TypeError, ValueError, IndexError):
        return _NOWHERE


def _own_pos(obj: Any) -> Pos:
    lc = getattr(obj, "lc", None)
    return _one_based((getattr(lc, "line", None), getattr(lc, "col", None)))


def _key_pos(mapping: Any, key: Any) -> Pos:
    try:
        return _one_based(mapping.lc.key(key))
    except (AttributeError, KeyError, TypeError):
        return _own_pos(mapping)


def _value_pos(mapping: Any, key: Any) -> Pos:
    try:
        return _one_based(mapping.lc.value(key))
    except (AttributeError, KeyError, TypeError):
        return _key_pos(mapping, key)


def _item_pos(seq: Any, index: int) -> Pos:
    try:
        return _one_based(seq.lc.item(index))
    except (AttributeError, KeyError, IndexError, TypeError):
        return _own_pos(seq)


# --------------------------------------------------------------------------------------------
# The checks


class _Checker:
    """Walks a parsed document and collects every issue (:meth:`fail` raises them in file order)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.issues: list[ConfigIssue] = []

    def add(self, pos: Pos, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.source, pos[0], pos[1], path, message))

    def fail(self) -> ClusterConfigError:
        big = 1 << 62
        self.issues.sort(
            key=lambda i: (big if i.line is None else i.line, big if i.col is None else i.col)
        )
        return ClusterConfigError(self.issues)

    def fields(self, value: Any, path: str, pos: Pos, spec: Mapping[str, _Field]) -> dict[str, Any]:
        """Check a mapping against ``spec``; return its valid values (null means absent)."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            self.add(pos, path, f"must be a mapping, got {_describe(value)}")
            return {}
        prefix = f"{path}." if path else ""
        self.unknown_keys(value, prefix, spec)
        found: dict[str, Any] = {}
        for name, f in spec.items():
            raw = value.get(name)
            if raw is None:
                if f.required:
                    where = (
                        _key_pos(value, name)
                        if name in value
                        else (_own_pos(value) if value else pos)
                    )
                    self.add(where, prefix + name, "required")
                continue
            try:
                found[name] = f.check(raw)
            except _Invalid as e:
                self.add(_value_pos(value, name), prefix + name, str(e))
        return found

    def unknown_keys(self, mapping: Mapping[Any, Any], prefix: str, valid: Iterable[str]) -> None:
        valid = list(valid)
        for key in mapping:
            if isinstance(key, str) and key in valid:
                continue
            close = difflib.get_close_matches(str(key), valid, n=1) if isinstance(key, str) else []
            hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(valid)}"
            self.add(_key_pos(mapping, key), f"{prefix}{key}", f"unknown key ({hint})")


def _default_name(path: Path | None) -> str:
    """A cluster without ``cluster.name`` is named after its directory (or this machine)."""
    if path is not None:
        directory = path.expanduser().absolute().parent
        if directory != USER_CONFIG.expanduser().parent and directory.name:
            return directory.name
    return socket.gethostname() or "local"


def _check_document(doc: Any, source: str, path: Path | None) -> Cluster:
    c = _Checker(source)
    if doc is None:
        c.add((1, 1), "", "the file is empty (it needs at least a nodes: list)")
        raise c.fail()
    if not isinstance(doc, Mapping):
        where = _own_pos(doc) if _own_pos(doc) != _NOWHERE else (1, 1)
        c.add(where, "", f"must be a mapping with cluster, ssh and nodes, got {_describe(doc)}")
        raise c.fail()
    c.unknown_keys(doc, "", _TOP_KEYS)
    top = _own_pos(doc)
    sections = {
        name: c.fields(doc.get(name), name, _value_pos(doc, name) if name in doc else top, spec)
        for name, spec in (("cluster", _CLUSTER_FIELDS), ("ssh", _SSH_FIELDS))
    }
    ssh_doc = doc.get("ssh")
    file = Path(source).name  # origins name the file briefly: they are shown in narrow panes
    ssh = SSHSettings(**sections["ssh"], origins=tuple(
        (key, f"{file}:{_value_pos(ssh_doc, key)[0]} ssh.{key}") for key in sections["ssh"]))
    nodes, names = _check_nodes(c, doc, ssh)
    conf = sections["cluster"]
    master = conf.pop("master", None)
    if master is not None and master not in names and names:
        close = difflib.get_close_matches(master, names, n=1)
        hint = f"did you mean {close[0]}?" if close else f"nodes: {', '.join(names)}"
        c.add(
            _value_pos(doc["cluster"], "master"),
            "cluster.master",
            f"{master!r} is not a node ({hint})",
        )
    if c.issues:
        raise c.fail()
    if master is None:
        master = next((n.name for n in nodes if n.role == "head"), nodes[0].name)
    conf.setdefault("name", _default_name(path))
    return Cluster(nodes=tuple(nodes), master=master, ssh=ssh, path=path, **conf)


def _check_nodes(
    c: _Checker, doc: Mapping[str, Any], ssh: SSHSettings
) -> tuple[list[Node], list[str]]:
    """Check ``nodes:``; return the nodes that are valid, and every node name declared."""
    raw = doc.get("nodes")
    if raw is None:
        c.add(_key_pos(doc, "nodes") if "nodes" in doc else _own_pos(doc), "nodes", "required")
        return [], []
    if not isinstance(raw, list) or not raw:
        got = "an empty list" if isinstance(raw, list) else _describe(raw)
        c.add(_value_pos(doc, "nodes"), "nodes", f"must list at least one node, got {got}")
        return [], []
    nodes: list[Node] = []
    seen_names: dict[str, int] = {}
    seen_addresses: dict[tuple[str, int], int] = {}
    head: int | None = None
    for i, item in enumerate(raw):
        path = f"nodes[{i}]"
        pos = _item_pos(raw, i)
        if not isinstance(item, Mapping):
            c.add(pos, path, f"must be a mapping with name and host, got {_describe(item)}")
            continue
        count = len(c.issues)
        v = c.fields(item, path, pos, _NODE_FIELDS)
        local = v.get("local", False)
        if "host" not in v and not local and item.get("host") is None:
            c.add(
                _key_pos(item, "host") if "host" in item else _own_pos(item),
                f"{path}.host",
                "required",
            )
        name = v.get("name")
        if name is not None:
            if name in seen_names:
                j = seen_names[name]
                c.add(
                    _value_pos(item, "name"),
                    f"{path}.name",
                    f"duplicate node name {name!r} (also nodes[{j}])",
                )
            else:
                seen_names[name] = i
        port = v.get("port", ssh.port)
        if "host" in v and ("[" in v["host"] or v["host"].count(":") == 1):
            # "[fd00::1]", "[fd00::1]:2222", "10.0.0.5:2222": the one address parser splits them
            try:
                spec = parse_jump_host(v["host"])
                if spec.user:
                    raise ValueError
            except ValueError:
                c.add(_value_pos(item, "host"), f"{path}.host",
                      f"must be a host name or IP address (IPv6 in brackets, optionally "
                      f"with :port), got {_describe(v['host'])}")
            else:
                v["host"] = spec.host
                if spec.port_given:
                    if "port" in v and v["port"] != spec.port:
                        c.add(_value_pos(item, "port"), f"{path}.port",
                              f"{v['port']} contradicts the port in host ({spec.port})")
                    v["port"] = port = spec.port
        if "host" in v and not local:
            address = (v["host"].lower(), port)
            if address in seen_addresses:
                j = seen_addresses[address]
                c.add(
                    _value_pos(item, "host"),
                    f"{path}.host",
                    f"{v['host']}:{port} is already nodes[{j}]",
                )
            else:
                seen_addresses[address] = i
        if v.get("role") == "head":
            if head is not None:
                c.add(
                    _value_pos(item, "role"),
                    f"{path}.role",
                    f"only one node can be the head (nodes[{head}] is)",
                )
            else:
                head = i
        if len(c.issues) == count:
            origins = tuple(
                (key, f"{Path(c.source).name}:"  # a port written in host: host's line
                      f"{_value_pos(item, key if key in item else 'host')[0]} {path}.{key}")
                if key in v
                else (key, ssh.origin(key) or "")
                for key in ("host", "port", "user", "identity_file")
                if key in v or ssh.origin(key))
            nodes.append(
                Node(
                    name=name,
                    host=v.get("host", "localhost"),
                    port=port,
                    user=v.get("user", ssh.user),
                    identity_file=v.get("identity_file", ssh.identity_file),
                    role=v.get("role", "worker"),
                    gpus=v.get("gpus"),
                    local=local,
                    line=_own_pos(item)[0],
                    origins=origins,
                )
            )
    return nodes, list(seen_names)


# --------------------------------------------------------------------------------------------
# Loading


def _yaml() -> YAML:
    """A round-trip YAML instance (positions and comments kept, duplicate keys refused)."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _parse(text: str, source: str) -> Any:
    """YAML text to a round-trip document; any parser failure becomes a ClusterConfigError."""
    try:
        return _yaml().load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        pos = (mark.line + 1, mark.column + 1) if mark is not None else _NOWHERE
        message = f"invalid YAML: {e.problem or e.context}"
    except RecursionError:
        pos, message = _NOWHERE, "invalid YAML: nested too deeply"
    except Exception as e:  # noqa: BLE001 - any parser failure on untrusted text is bad input
        pos, message = _NOWHERE, f"invalid YAML: {e}"
    raise ClusterConfigError([ConfigIssue(source, pos[0], pos[1], "", message)])


def read_text(path: Path, source: str) -> str:
    """The UTF-8 text of a file, or a ClusterConfigError (naming it ``source``) saying why not."""
    try:
        data = path.expanduser().read_bytes()
    except FileNotFoundError:
        message = "no such file"
    except IsADirectoryError:
        message = "is a directory, not a file"
    except OSError as e:
        message = f"cannot read: {e.strerror or e}"
    else:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            col = e.start - data.rfind(b"\n", 0, e.start)
            issue = ConfigIssue(
                source, line, col, "", f"not UTF-8 text (byte {data[e.start]:#04x})"
            )
            raise ClusterConfigError([issue]) from None
    raise ClusterConfigError([ConfigIssue(source, None, None, "", message)])


def parse_cluster(text: str, source: str = "cluster.yaml", path: Path | None = None) -> Cluster:
    """Check cluster.yaml text; ``source`` names it in messages, ``path`` anchors relative paths."""
    return _check_document(_parse(text, source), source, path)


def load_cluster(path: str | Path) -> Cluster:
    """Load and check a cluster.yaml; raises ClusterConfigError (and nothing else) if it is bad.

    Messages name the file as given: ``cluster.yaml:14:5: nodes[2].host: required``."""
    source = str(path)
    p = Path(path).expanduser()
    return parse_cluster(read_text(p, source), source, p)


def find_config(explicit: str | None) -> Path | None:
    """The cluster.yaml to use: ``explicit`` (``--config``; returned even if it does not exist),
    else ``./cluster.yaml``, else ``~/.config/svconsole/cluster.yaml``, else None."""
    if explicit:
        return Path(explicit)
    for candidate in (Path("cluster.yaml"), USER_CONFIG.expanduser()):
        if candidate.is_file():
            return candidate
    return None


def local_cluster() -> Cluster:
    """The embedded default: this machine as a one-node cluster, run without SSH."""
    hostname = socket.gethostname() or "localhost"
    name = re.sub(r"[^A-Za-z0-9._-]", "-", hostname.split(".")[0]).lstrip("._-") or "local"
    node = Node(name=name, host="localhost", user=local_user(), role="head", local=True)
    return Cluster(
        name=hostname,
        nodes=(node,),
        shared_dir=str(Path(LOCAL_SHARED_DIR).expanduser()),
        master=name,
    )


def load_or_default(explicit: str | None) -> Cluster:
    """What ``svconsole`` runs on: the file :func:`find_config` picks, else :func:`local_cluster`.

    A ``--config`` file that does not exist is an error, never a silent fallback."""
    path = find_config(explicit)
    return local_cluster() if path is None else load_cluster(path)


# --------------------------------------------------------------------------------------------
# DeepSpeed hostfiles: ``host slots=N`` lines, ``#`` comments

_HOSTFILE_LINE = re.compile(r"(\S+)\s+slots=(\d+)\s*(?:#.*)?")


def import_hostfile(text: str, source: str = "hostfile") -> list[tuple[str, int]]:
    """The ``(host, slots)`` pairs of a DeepSpeed hostfile, in file order.

    Blank lines and ``#`` comments are allowed; every bad line is reported (file:line:col)."""
    issues: list[ConfigIssue] = []
    entries: list[tuple[str, int]] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        col = len(line) - len(line.lstrip()) + 1
        m = _HOSTFILE_LINE.fullmatch(stripped)
        if m is None:
            issues.append(
                ConfigIssue(
                    source, number, col, "", f'expected "HOST slots=N", got {_describe(stripped)}'
                )
            )
            continue
        host, digits = m.group(1), m.group(2)
        slots = int(digits) if len(digits) <= 6 else 0
        if not _HOST.fullmatch(host):
            issues.append(
                ConfigIssue(source, number, col, "", f"not a host name: {_describe(host)}")
            )
        elif host in first_line:
            issues.append(
                ConfigIssue(
                    source, number, col, "", f"{host} is already on line {first_line[host]}"
                )
            )
        elif slots < 1:
            issues.append(
                ConfigIssue(
                    source,
                    number,
                    col + m.start(2),
                    "",
                    "slots must be a number of GPUs from 1 to 999999",
                )
            )
        else:
            first_line[host] = number
            entries.append((host, slots))
    if not entries and not issues:
        issues.append(
            ConfigIssue(source, None, None, "", 'no hosts (expected lines "HOST slots=N")')
        )
    if issues:
        raise ClusterConfigError(issues)
    return entries


def hostfile_nodes(
    entries: Iterable[tuple[str, int]],
    *,
    user: str | None = None,
    port: int | None = None,
    taken: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """cluster.yaml node entries for hostfile pairs, named after the host (``node<i>`` for an IP
    address) and never reusing a name in ``taken``; ``gpus`` lists ``slots`` indices."""
    used = set(taken)
    result: list[dict[str, Any]] = []
    for host, slots in entries:
        name = _node_name_for(host, used)
        used.add(name)
        node: dict[str, Any] = {"name": name, "host": host}
        if port is not None:
            node["port"] = port
        if user is not None:
            node["user"] = user
        node["gpus"] = ",".join(str(i) for i in range(slots))
        result.append(node)
    return result


def _node_name_for(host: str, used: set[str]) -> str:
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
        base = ""
    except ValueError:
        base = host.split(".")[0]
    if base and _NODE_NAME.fullmatch(base):
        name, i = base, 2
        while name in used:
            name, i = f"{base}-{i}", i + 1
        return name
    i = 0
    while f"node{i}" in used:
        i += 1
    return f"node{i}"


def cluster_from_hostfile(
    entries: Iterable[tuple[str, int]],
    *,
    name: str | None = None,
    user: str | None = None,
    port: int | None = None,
    shared_dir: str = "/data/shared",
) -> str:
    """A new cluster.yaml (text, with comments) for hostfile pairs; the first host is the head
    and the master. ``user`` and ``port`` go to the ``ssh:`` defaults."""
    nodes = hostfile_nodes(entries)
    out = [
        "# cluster.yaml made from a DeepSpeed hostfile by `svconsole hostfile import`.",
        "# cluster.yaml.example describes every key.",
        "cluster:",
    ]
    if name is not None:
        out.append(f"  name: {_scalar(name)}")
    out += [
        f"  shared_dir: {_scalar(shared_dir)}  # on every node (NFS from the head node)",
        f"  master: {_scalar(nodes[0]['name'])}  # hosts torchrun's rendezvous",
        "  master_port: 26669",
        "ssh:  # defaults for every node",
    ]
    if user is not None:
        out.append(f"  user: {_scalar(user)}")
    out += [f"  port: {port or 22}", "  host_key_policy: accept-new  # or: strict", "nodes:"]
    for i, node in enumerate(nodes):
        out.append(f"  - name: {_scalar(node['name'])}")
        out.append(f"    host: {_scalar(node['host'])}")
        if i == 0:
            out.append("    role: head  # head | worker")
        out.append(f"    gpus: {_scalar(node['gpus'])}  # CUDA_VISIBLE_DEVICES on that node")
    return "\n".join(out) + "\n"


_PLAIN = re.compile(r"[A-Za-z_/~][A-Za-z0-9_./~-]*")


def _scalar(text: str) -> str:
    """``text`` as a YAML scalar: plain when that is unambiguous, else double-quoted."""
    if _PLAIN.fullmatch(text) and text.lower() not in {
        "true",
        "false",
        "yes",
        "no",
        "on",
        "off",
        "null",
        "y",
        "n",
    }:
        return text
    return json.dumps(text)


def export_hostfile(cluster: Cluster, gpus_per_node: Mapping[str, int] | None = None) -> str:
    """A DeepSpeed hostfile for ``cluster``: one ``host slots=N`` line per node.

    Slots come from ``gpus_per_node[name]`` when given, else from the node's ``gpus``; a node
    with no GPUs is left out (as a comment). ClusterConfigError names a node whose count is
    unknown."""
    lines = [f"# DeepSpeed hostfile for cluster {cluster.name} (svconsole hostfile export)"]
    unknown: list[ConfigIssue] = []
    for i, node in enumerate(cluster.nodes):
        if gpus_per_node is not None and node.name in gpus_per_node:
            slots = gpus_per_node[node.name]
        elif node.gpus is not None:
            slots = len(node.gpus)
        else:
            message = "not set, so the number of slots is unknown (set it, or give a count)"
            unknown.append(
                ConfigIssue(
                    str(cluster.path or "cluster"), node.line, None, f"nodes[{i}].gpus", message
                )
            )
            continue
        lines.append(
            f"{node.host} slots={slots}" if slots > 0 else f"# {node.host}: no GPUs ({node.name})"
        )
    if unknown:
        raise ClusterConfigError(unknown)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Editing cluster.yaml without losing the user's comments


class ClusterEditor:
    """Round-trip edits of a cluster.yaml: comments, key order, quoting and indentation stay.

    ``save()`` writes atomically (the old file kept as ``cluster.yaml.bak``) and refuses a
    document that :func:`load_cluster` would refuse. ``text`` starts from that text instead of
    the file (for a file that does not exist yet)."""

    def __init__(self, path: str | Path, text: str | None = None) -> None:
        self.path = Path(path)
        self.source = str(path)
        if text is None:
            text = read_text(self.path.expanduser(), self.source)
        mapping, sequence, offset = _guess_indent(text)
        self._yaml = _yaml()
        self._yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        doc = _parse(text, self.source)
        if doc is None:
            doc = CommentedMap()
        if not isinstance(doc, CommentedMap):
            _check_document(doc, self.source, self.path)  # raises with the loader's message
        self.doc: CommentedMap = doc

    # nodes

    def _nodes(self) -> CommentedSeq:
        nodes = self.doc.get("nodes")
        if nodes is None:
            nodes = self.doc["nodes"] = CommentedSeq()
        if not isinstance(nodes, CommentedSeq):
            raise ValueError(f"{self.source}: nodes is not a list")
        return nodes

    def _index(self, name: str) -> int:
        for i, item in enumerate(self._nodes()):
            if isinstance(item, Mapping) and item.get("name") == name:
                return i
        raise KeyError(f"no node named {name!r}")

    def node_names(self) -> list[str]:
        return [
            str(item["name"])
            for item in self._nodes()
            if isinstance(item, Mapping) and "name" in item
        ]

    def node_entry(self, name: str) -> Mapping[str, Any]:
        """The node's mapping as written (read-only use)."""
        return self._nodes()[self._index(name)]

    def add_node(self, entry: Mapping[str, Any]) -> None:
        """Append a node (a mapping of node keys); ValueError if its name is taken."""
        name = entry.get("name")
        if name in self.node_names():
            raise ValueError(f"a node named {name!r} already exists")
        nodes = self._nodes()
        new = CommentedMap((k, _yaml_value(k, v)) for k, v in entry.items())
        if nodes:
            # Comments after the old last node belong to what follows it: keep them after the new one.
            _give_following(new, _take_following(nodes[-1]))
        nodes.append(new)

    def update_node(self, name: str, changes: Mapping[str, Any]) -> None:
        """Set keys of a node; a value of None removes the key."""
        item = self._nodes()[self._index(name)]
        with _comments_stay_after(item):
            for key, value in changes.items():
                if value is None:
                    item.pop(key, None)
                else:
                    item[key] = _yaml_value(key, value)

    def remove_node(self, name: str) -> None:
        """Remove a node with the comments just above it; those after it stay in place."""
        nodes = self._nodes()
        i = self._index(name)
        following = _take_following(nodes[i])
        if i > 0:
            _take_following(nodes[i - 1])
            _give_following(nodes[i - 1], following)
        else:
            _replace_comment_before_first(self.doc, nodes, following)
        del nodes[i]

    def set(self, path: str, value: Any) -> None:
        """Set a dotted key such as ``ssh.port`` or ``cluster.master``; None removes it."""
        *parents, key = path.split(".")
        mapping = self.doc
        for part in parents:
            child = mapping.get(part)
            if child is None:
                if value is None:
                    return
                child = mapping[part] = CommentedMap()
            if not isinstance(child, CommentedMap):
                raise ValueError(f"{self.source}: {part} is not a mapping")
            mapping = child
        with _comments_stay_after(mapping):
            if value is None:
                mapping.pop(key, None)
            else:
                mapping[key] = value

    def merge_hostfile(
        self,
        entries: Iterable[tuple[str, int]],
        *,
        user: str | None = None,
        port: int | None = None,
    ) -> tuple[list[str], list[str]]:
        """Add the hostfile's hosts as nodes; a host already in the file gets its ``gpus`` set to
        the slot count instead. Returns the names (added, updated)."""
        ssh = self.doc.get("ssh")
        default_port = ssh.get("port", 22) if isinstance(ssh, Mapping) else 22
        known: dict[tuple[str, Any], str] = {}
        for item in self._nodes():
            if isinstance(item, Mapping) and isinstance(item.get("host"), str) and "name" in item:
                known[(item["host"].lower(), item.get("port", default_port))] = str(item["name"])
        added: list[str] = []
        updated: list[str] = []
        new_entries: list[tuple[str, int]] = []
        for host, slots in entries:
            existing = known.get((host.lower(), port if port is not None else default_port))
            if existing is None:
                new_entries.append((host, slots))
                continue
            gpus = ",".join(str(i) for i in range(slots))
            if str(self.node_entry(existing).get("gpus")) != gpus:
                self.update_node(existing, {"gpus": gpus})
                updated.append(existing)
        for node in hostfile_nodes(new_entries, user=user, port=port, taken=self.node_names()):
            self.add_node(node)
            added.append(node["name"])
        return added, updated

    # checking and saving

    def text(self) -> str:
        out = io.StringIO()
        self._yaml.dump(self.doc, out)
        return out.getvalue()

    def check(self) -> Cluster:
        """The cluster the edited document describes; ClusterConfigError (the loader's messages,
        positions as in the text that would be saved) if it is not valid."""
        return parse_cluster(self.text(), self.source, self.path)

    def validate(self) -> list[ConfigIssue]:
        """Every issue of the edited document (empty when it is valid)."""
        try:
            self.check()
        except ClusterConfigError as e:
            return e.issues
        return []

    def save(self) -> Cluster:
        """Write the document atomically, keeping the old file as ``<name>.bak``."""
        cluster = self.check()
        atomic_write(self.path.expanduser(), self.text(), backup=True)
        return cluster


_KEY_LINE = re.compile(r"( *)[^\s#-][^#]*:\s*(#.*)?")


def _guess_indent(text: str) -> tuple[int, int, int]:
    """The file's indentation as ruamel's (mapping, sequence, offset); the example's style
    (2, 4, 2) where the file does not show it."""
    mapping = 0
    lines = [
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    for line, after in zip(lines, lines[1:], strict=False):
        m = _KEY_LINE.fullmatch(line)
        inner = len(after) - len(after.lstrip(" "))
        if m and not after.lstrip().startswith("-") and inner > len(m.group(1)):
            mapping = inner - len(m.group(1))
            break
    try:
        _, sequence, offset = load_yaml_guess_indent(text)
    except Exception:  # noqa: BLE001 - the real parse reports the problem
        sequence, offset = None, None
    if offset is None or not sequence:
        offset = 2
        sequence = (mapping or 2) + offset
    return mapping or 2, sequence, offset


def _yaml_value(key: str, value: Any) -> Any:
    """A node value as it is written: ``gpus`` strings in double quotes, like the example."""
    return DoubleQuotedScalarString(value) if key == "gpus" and isinstance(value, str) else value


def _last_scalar_key(mapping: Any) -> Any:
    """The last key of a mapping whose value is a scalar (where ruamel keeps the comment lines
    that follow the mapping), or None."""
    if not isinstance(mapping, CommentedMap) or not mapping:
        return None
    key = list(mapping)[-1]
    return None if isinstance(mapping[key], (Mapping, list)) else key


def _take_following(mapping: Any) -> str:
    """Detach the full comment lines after ``mapping`` (its end-of-line comment stays)."""
    key = _last_scalar_key(mapping)
    slot = mapping.ca.items.get(key) if key is not None else None
    token = slot[2] if slot and len(slot) > 2 else None
    if token is None:
        return ""
    eol, _, following = token.value.partition("\n")
    token.value = eol + "\n"
    return following


@contextlib.contextmanager
def _comments_stay_after(mapping: Any) -> Iterator[None]:
    """Keys added or removed at the end of ``mapping`` go before the comment lines after it."""
    following = _take_following(mapping)
    try:
        yield
    finally:
        _give_following(mapping, following)


def _give_following(mapping: Any, following: str) -> None:
    """Put comment lines (as taken by :func:`_take_following`) after ``mapping``."""
    key = _last_scalar_key(mapping)
    if not following or key is None:
        return
    slot = mapping.ca.items.setdefault(key, [None, None, None, None])
    if slot[2] is None:
        slot[2] = CommentToken("\n", CommentMark(0))
    eol, _, rest = slot[2].value.partition("\n")
    slot[2].value = eol + "\n" + rest + following


def _replace_comment_before_first(doc: CommentedMap, nodes: CommentedSeq, following: str) -> None:
    """The first node is going: the comment lines above it give way to those below it."""
    slot = doc.ca.items.get("nodes")
    if slot and slot[2] is not None:  # "nodes:  # comment" holds the lines before the first node
        eol, _, _ = slot[2].value.partition("\n")
        slot[2].value = eol + "\n" + following
        return
    tokens = []
    for line in following.splitlines():
        stripped = line.lstrip()
        if stripped:
            tokens.append(CommentToken(stripped + "\n", CommentMark(len(line) - len(stripped))))
    if slot:
        slot[3] = tokens or None
    elif tokens:
        doc.ca.items["nodes"] = [None, None, None, tokens]
    nodes.ca.comment = [None, tokens] if tokens else None
