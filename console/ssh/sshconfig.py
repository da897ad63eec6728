"""The user's OpenSSH client config (``~/.ssh/config``) as the pool applies it.

Operators keep their cluster in ``~/.ssh/config``: Host aliases with HostName, User, Port,
IdentityFile, ProxyJump through a bastion (often two hops), ConnectTimeout. svconsole reads that
file (cluster.yaml ``ssh.config_file``, default ``~/.ssh/config``; ``ssh.use_ssh_config: false``
turns it off) with paramiko's ``SSHConfig`` and applies what OpenSSH applies, cluster.yaml's
explicit values winning (:class:`Resolver`):

- ``HostName``, ``User``, ``Port``, ``IdentityFile`` (several, after cluster.yaml's),
  ``ConnectTimeout``, ``IdentitiesOnly``, ``ServerAliveInterval``;
- ``ProxyJump``: a chain of hops, each resolved through the file in turn and each with its own
  host-key check; the first hop's own ProxyJump applies, as with ``ssh -J``;
- ``HostKeyAlias``, ``UserKnownHostsFile``, ``GlobalKnownHostsFile`` and
  ``StrictHostKeyChecking`` (mapped onto svconsole's policy: ``yes``/``ask`` make it strict,
  ``accept-new`` keeps accept-new, ``no`` never makes it weaker than cluster.yaml's).

What svconsole cannot honour (``ProxyCommand``, ``Match exec``, ``RemoteCommand``, ...) is refused
for the hosts it applies to, with the Host block named (file and line). ``Include`` is followed.
Other options (ControlMaster, ForwardAgent, Ciphers, ...) do not change whom svconsole connects
to or what it trusts, and are ignored. fabric's own reading of the file is off (the pool builds
its connections from :class:`Endpoint`), so only this module's reading applies.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from console.cluster.model import Cluster, JumpHost, Node, local_user, parse_jump_chain
from console.ssh.hostkeys import Policy, known_hosts_name, stricter

DEFAULT_PORT = 22
DEFAULT_KEEPALIVE = 30
MAX_HOPS = 8
"""A ProxyJump chain (hops of hops included) longer than this is refused (a loop, surely)."""

REFUSED: dict[str, str] = {
    "proxycommand": "use ProxyJump instead",
    "remotecommand": "svconsole runs its own commands on the node",
    "localcommand": "svconsole runs no local command per connection",
    "proxyusefdpass": "use ProxyJump instead",
    "knownhostscommand": "list the keys in a known_hosts file instead",
    "bindaddress": "svconsole does not choose the local address",
    "bindinterface": "svconsole does not choose the local interface",
    "canonicalizehostname": "write the full host name in HostName instead",
    "certificatefile": "svconsole does not offer certificates: use a plain key",
    "tunnel": "svconsole opens no tun device",
}
"""Options svconsole cannot honour, and what to do instead. A value that turns the option off
(``none``/``no``) is fine."""
_OFF = ("none", "no", "false")

_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")  # paramiko's own SETTINGS_REGEX


class SSHConfigError(ValueError):
    """The ssh config cannot be read, or asks for what svconsole does not do (message says where)."""


@dataclass
class Block:
    """One ``Host``/``Match`` block of the config (index 0: the lines before the first one)."""

    where: str
    """``~/.ssh/config:12``"""
    header: str
    """``Host gpu*`` as written"""
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    """lower-case option -> (``file:line``, the option as written), its first line in the block"""

    def describe(self) -> str:
        return f"{self.where} ({self.header})"


class SSHConfigFile:
    """A parsed ssh config with, for every option, the block it comes from."""

    def __init__(self, shown: str, lines: list[tuple[str, str]]) -> None:
        self.shown = shown
        text = "\n".join(text for text, _ in lines)
        try:
            self.config = paramiko.SSHConfig.from_text(text)
        except Exception as exc:  # paramiko's ConfigParseError, bad Match criteria, ...
            raise SSHConfigError(f"{shown}: cannot read it: {exc}") from None
        self.blocks = [Block(f"{shown}:1", "top of file")]
        for text, where in lines:
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            match = _SETTING.match(stripped)
            if match is None:
                raise SSHConfigError(f"{where}: cannot read {stripped!r}")
            key = match.group(1).lower()
            if key in ("host", "match"):
                self.blocks.append(Block(where, stripped))
            else:
                self.blocks[-1].keys.setdefault(key, (where, match.group(1)))
        if len(self.blocks) != len(self.config._config):  # paramiko's blocks, in file order
            raise SSHConfigError(f"{shown}: cannot tell its Host blocks apart")

    @classmethod
    def load(cls, path: Path, shown: str) -> SSHConfigFile | None:
        """The file at ``path`` (``shown`` in messages), or None when there is none."""
        if not path.exists():
            return None
        return cls(shown, _read_lines(path, shown, path.parent, 0))

    def lookup(self, alias: str) -> tuple[dict[str, Any], dict[str, Block]]:
        """The options for ``alias`` (paramiko's lookup: first value wins, tokens expanded) and the
        block each option comes from. Raises SSHConfigError for ``Match exec`` (svconsole runs no
        command to decide) and for :data:`REFUSED` options that apply."""
        config = self.config
        for block, context in zip(self.blocks, config._config, strict=True):
            if any(m["type"] == "exec" for m in context.get("matches", [])):
                raise SSHConfigError(f"{block.describe()}: Match exec is not supported "
                                     f"(svconsole runs no command to choose settings)")
        values = dict(config.lookup(alias))
        origins: dict[str, Block] = {}
        options = paramiko.SSHConfigDict()
        for block, context in zip(self.blocks, config._config, strict=True):
            if not (config._pattern_matches(context.get("host", []), alias)
                    or config._does_match(context.get("matches", []), alias, False, True, options)):
                continue
            for key, value in context["config"].items():
                if key not in options:
                    options[key] = value
                    origins[key] = block
        for key, hint in REFUSED.items():
            value = values.get(key)
            if key in origins and value is not None and str(value).lower() not in _OFF:
                block = origins[key]
                written = block.keys.get(key, ("", key))[1]
                raise SSHConfigError(f"{block.describe()} sets {written}, which svconsole does "
                                     f"not support for {alias}: {hint}")
        return values, origins


def _read_lines(path: Path, shown: str, home_ssh: Path, depth: int) -> list[tuple[str, str]]:
    """The file's lines with their ``file:line``, ``Include`` files spliced in where they stand."""
    if depth > 16:
        raise SSHConfigError(f"{shown}: Include nested more than 16 deep")
    try:
        text = path.read_text()
    except OSError as exc:
        raise SSHConfigError(f"{shown}: cannot read it: {exc.strerror or exc}") from None
    out: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _SETTING.match(line.strip())
        if match is None or match.group(1).lower() != "include":
            out.append((line, f"{shown}:{number}"))
            continue
        for pattern in match.group(2).split():
            pattern = os.path.expanduser(pattern.strip('"'))
            if not os.path.isabs(pattern):
                pattern = str(home_ssh / pattern)
            for found in sorted(glob.glob(pattern)):
                out += _read_lines(Path(found), found, home_ssh, depth + 1)
    return out


# ------------------------------------------------------------------------------ endpoints


@dataclass(frozen=True)
class Endpoint:
    """One SSH endpoint as the pool connects to it: a node, or a jump host on the way."""

    name: str
    """The node's name, or the hop as written (``jump1``, ``admin@10.0.0.1:2222``)."""
    host: str
    """The address connected to (HostName applied)."""
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    """Private keys to offer, in order (paths expanded); none: the default ~/.ssh/id_* keys."""
    identities_only: bool = False
    """IdentitiesOnly yes: only those files, not ssh-agent's keys."""
    connect_timeout: float = 10.0
    host_key_name: str = ""
    """The name in known_hosts (:func:`console.ssh.hostkeys.known_hosts_name`)."""
    policy: Policy = "accept-new"
    known_hosts: tuple[Path, ...] | None = None
    """Read-only known_hosts files (UserKnownHostsFile + GlobalKnownHostsFile); None: the
    system defaults."""
    keepalive: int = DEFAULT_KEEPALIVE
    jumps: tuple[Endpoint, ...] = ()
    """The hops to go through, first hop first (each with its own ``jumps`` prefix)."""
    origins: tuple[tuple[str, str], ...] = ()
    """``(setting, where it came from)``: a cluster.yaml line, an ssh_config Host block, or
    ``default``."""
    error: str | None = None
    """Set when this endpoint cannot be connected as configured (the message says why)."""

    @property
    def address(self) -> str:
        """``user@host:port`` (an IPv6 address in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{self.port}"

    def describe(self) -> str:
        """``user@host:port via jump1,jump2``"""
        via = f" via {','.join(j.name for j in self.jumps)}" if self.jumps else ""
        return self.address + via

    @property
    def key(self) -> tuple[object, ...]:
        """Two endpoints with equal keys are one connection (a jump host shared by nodes)."""
        return (self.user, self.host, self.port, tuple(j.key for j in self.jumps))

    def origin(self, setting: str) -> str:
        return dict(self.origins).get(setting, "default")

    def explain(self) -> list[tuple[str, str, str]]:
        """``(setting, value, where it came from)`` for each setting an operator may ask about."""
        values = {
            "host": self.host, "port": str(self.port), "user": self.user,
            "identity_file": ", ".join(self.identity_files) or "~/.ssh/id_* and ssh-agent",
            "jumps": ",".join(j.name for j in self.jumps) or "none (direct)",
            "connect_timeout": f"{self.connect_timeout:g} s",
            "host_key_name": self.host_key_name, "policy": self.policy,
        }
        return [(label, values[key], self.origin(key)) for key, label in _EXPLAINED]

    def sources(self) -> str:
        """One line: where host, port, user, identity and jump hosts came from (the defaults
        named together at the end)."""
        given = [(label, where) for label, _, where in self.explain()[:5]]
        text = "; ".join(f"{label} {where}" for label, where in given if where != "default")
        defaults = [label for label, where in given if where == "default"]
        return "; ".join(t for t in (text, f"default {', '.join(defaults)}" if defaults else "") if t)

    def to_json(self) -> dict[str, Any]:
        return {
            "connection": self.describe(), "host": self.host, "port": self.port,
            "user": self.user, "via": [j.name for j in self.jumps],
            "identity_files": list(self.identity_files), "host_key_name": self.host_key_name,
            "host_key_policy": self.policy, "connect_timeout": self.connect_timeout,
            "origins": dict(self.origins), "error": self.error,
        }


_EXPLAINED = (("host", "host"), ("port", "port"), ("user", "user"),
              ("identity_file", "identity"), ("jumps", "via"),
              ("connect_timeout", "connect timeout"), ("host_key_name", "known_hosts name"),
              ("policy", "host key policy"))


def _policy_of(value: str | None) -> Policy | None:
    """StrictHostKeyChecking as one of svconsole's policies (None: no stricter than ours)."""
    value = (value or "").lower()
    if value in ("yes", "ask", "true"):
        return "strict"
    if value == "accept-new":
        return "accept-new"
    return None


class Resolver:
    """Works out every node's :class:`Endpoint` from cluster.yaml and the ssh config."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.file: SSHConfigFile | None = None
        self.file_error: str | None = None
        ssh = cluster.ssh
        if ssh.use_ssh_config and ssh.config_file:
            path = cluster.local_path(ssh.config_file)
            try:
                self.file = SSHConfigFile.load(path, ssh.config_file)
            except SSHConfigError as exc:
                self.file_error = str(exc)
            if self.file is None and self.file_error is None and ssh.origin("config_file"):
                self.file_error = f"{ssh.origin('config_file')}: no such file {path}"

    def _lookup(self, alias: str) -> tuple[dict[str, Any], dict[str, Block]]:
        if self.file_error is not None:
            raise SSHConfigError(self.file_error)
        if self.file is None:
            return {}, {}
        return self.file.lookup(alias)

    def node(self, node: Node) -> Endpoint:
        """The effective connection of a (not local) cluster node."""
        return self._endpoint(node.name, node.host, {
            "host": (node.host, node.origin("host") or "cluster.yaml"),
            **{k: (getattr(node, k), node.origin(k))
               for k in ("user", "port", "identity_file") if node.origin(k)},
        }, jumps=None, depth=0, jump_spec=self.cluster.ssh.jump_host)

    def _hop(self, text: str, spec: JumpHost, via: tuple[Endpoint, ...] | None,
             depth: int) -> Endpoint:
        ssh = self.cluster.ssh
        given: dict[str, tuple[Any, str]] = {"host": (spec.host, f"jump host {text}")}
        if spec.user:
            given["user"] = (spec.user, f"jump host {text}")
        if spec.port_given:
            given["port"] = (spec.port, f"jump host {text}")
        for key in ("user", "port", "identity_file"):
            if key not in given and ssh.origin(key):
                given[key] = (getattr(ssh, key), ssh.origin(key))
        return self._endpoint(text, spec.host, given, jumps=via, depth=depth, jump_spec=None,
                              cluster_wins=False)

    def _endpoint(self, name: str, alias: str, given: dict[str, tuple[Any, str]], *,
                  jumps: tuple[Endpoint, ...] | None, depth: int, jump_spec: str | None,
                  cluster_wins: bool = True) -> Endpoint:
        """``given``: cluster.yaml's values (and where from). For a node they win over the ssh
        config; for a hop only the spec's own user/port do (cluster.yaml's ``ssh:`` defaults
        are for nodes: a hop's Host block says more about it)."""
        ssh = self.cluster.ssh
        origins: dict[str, str] = {}
        try:
            values, blocks = self._lookup(alias)
        except SSHConfigError as exc:
            return Endpoint(name, alias, ssh.port, ssh.user or local_user(),
                            connect_timeout=ssh.connect_timeout, error=str(exc))

        def pick(setting: str, option: str, default: Any) -> Any:
            mine = given.get(setting)
            strong = mine is not None and (cluster_wins or mine[1].startswith("jump host"))
            if strong:
                origins[setting] = mine[1]
                return mine[0]
            if option in blocks and values.get(option) is not None:
                origins[setting] = blocks[option].describe()
                return values[option]
            if mine is not None:
                origins[setting] = mine[1]
                return mine[0]
            origins[setting] = "default"
            return default

        error = None
        if "hostname" in blocks:
            host = str(values["hostname"])
            origins["host"] = blocks["hostname"].describe()
        else:
            host = alias
            origins["host"] = given["host"][1]
        user = str(pick("user", "user", local_user()))
        try:
            port = int(pick("port", "port", DEFAULT_PORT))
            if not 1 <= port <= 65535:
                raise ValueError
        except ValueError:
            port, error = DEFAULT_PORT, f"{origins['port']}: Port must be a number 1-65535"
        identity: list[str] = []
        if "identity_file" in given:
            raw, where = given["identity_file"]
            identity.append(str(self.cluster.local_path(raw)))
            origins["identity_file"] = where
        listed = [os.path.expanduser(raw) for raw in values.get("identityfile", [])
                  if "identityfile" in blocks]
        # as ssh: files that do not exist are skipped, unless none does (then the error names it)
        present = [path for path in listed if os.path.exists(path)]
        for path in present if present or identity else listed[:1]:
            if path not in identity:
                identity.append(path)
        if "identityfile" in blocks:
            where = blocks["identityfile"].describe()
            origins["identity_file"] = (f"{origins['identity_file']}, then {where}"
                                        if "identity_file" in origins else where)
        origins.setdefault("identity_file", "default")
        timeout = ssh.connect_timeout
        origins["connect_timeout"] = ssh.origin("connect_timeout") or "default"
        if not ssh.origin("connect_timeout") and "connecttimeout" in blocks:
            try:
                timeout = float(values["connecttimeout"])
                origins["connect_timeout"] = blocks["connecttimeout"].describe()
            except ValueError:
                error = f"{blocks['connecttimeout'].describe()}: ConnectTimeout must be seconds"
        alias_name = values.get("hostkeyalias") if "hostkeyalias" in blocks else None
        key_name = known_hosts_name(host, port, alias_name)
        origins["host_key_name"] = (blocks["hostkeyalias"].describe() if alias_name
                                    else "HostName and Port")
        policy: Policy = ssh.host_key_policy
        origins["policy"] = ssh.origin("host_key_policy") or "default"
        theirs = _policy_of(values.get("stricthostkeychecking"))
        if theirs is not None and stricter(policy, theirs) != policy:
            policy = theirs
            origins["policy"] = blocks["stricthostkeychecking"].describe()
        known: tuple[Path, ...] | None = None
        if "userknownhostsfile" in blocks or "globalknownhostsfile" in blocks:
            files = []
            for option, default in (("userknownhostsfile", "~/.ssh/known_hosts"),
                                    ("globalknownhostsfile", "/etc/ssh/ssh_known_hosts")):
                written = str(values[option]) if option in blocks else default
                files += [Path(os.path.expanduser(f)) for f in written.split()]
                if option in blocks:
                    origins[option] = blocks[option].describe()
            known = tuple(files)
        keepalive = DEFAULT_KEEPALIVE
        if "serveraliveinterval" in blocks:
            try:
                keepalive = int(values["serveraliveinterval"])
            except ValueError:
                pass
        if jumps is None:
            jumps, jump_error = self._jumps(alias, jump_spec, values, blocks, origins, depth)
            error = error or jump_error
        elif jumps:
            origins["jumps"] = f"jump host {jumps[-1].name}'s chain"
        if error is None:
            error = next((f"jump host {j.name}: {j.error}" for j in jumps if j.error), None)
        return Endpoint(
            name=name, host=host, port=port, user=user, identity_files=tuple(identity),
            identities_only=str(values.get("identitiesonly", "")).lower() == "yes",
            connect_timeout=timeout, host_key_name=key_name, policy=policy,
            known_hosts=known, keepalive=keepalive,
            jumps=jumps, origins=tuple(origins.items()), error=error,
        )

    def _jumps(self, alias: str, jump_spec: str | None, values: dict[str, Any],
               blocks: dict[str, Block], origins: dict[str, str],
               depth: int) -> tuple[tuple[Endpoint, ...], str | None]:
        ssh = self.cluster.ssh
        if jump_spec:
            text, origins["jumps"] = jump_spec, ssh.origin("jump_host") or "cluster.yaml"
        elif "proxyjump" in blocks and str(values["proxyjump"]).lower() != "none":
            text, origins["jumps"] = str(values["proxyjump"]), blocks["proxyjump"].describe()
        else:
            origins["jumps"] = "default"
            return (), None
        if depth >= MAX_HOPS:
            return (), f"{origins['jumps']}: more than {MAX_HOPS} jump hosts (a ProxyJump loop?)"
        try:
            specs = parse_jump_chain(text)
        except ValueError as exc:
            return (), f"{origins['jumps']}: {exc}"
        hops: list[Endpoint] = []
        for part, spec in zip((p.strip() for p in text.split(",")), specs, strict=True):
            via = None if not hops else (*hops[-1].jumps, hops[-1])
            hops.append(self._hop(part, spec, via, depth + 1))
        last = hops[-1]
        return (*last.jumps, last), None
