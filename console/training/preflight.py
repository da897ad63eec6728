"""The pre-flight checks that mirror what really breaks a multi-node run, run from every node.

The inspection of :func:`console.training.launch.prepare` asks each node about itself (stack,
output_dir writable, data list readable, master port free). What stops real multi-host training
is between the nodes, and on one host it can never fail: a firewall that drops the master port,
a node where only ssh and the master port are open (torch's gloo pairs and NCCL's bootstrap and
rings connect to ephemeral ports between every pair of nodes), an output_dir that is a different
directory on one node, an interface variable naming an interface that is not there, audio files
that exist on one machine only. :func:`run_checks` makes each of them real, on all nodes in
parallel, in seconds (two rounds over SSH, ``scripts/preflight_node.py``):

1. ``listen`` on every node: a listener on an ephemeral port (on the master also one on
   master_port, bound like torchrun's store), a token file in output_dir on the master, and the
   node's facts (hostname and what it resolves to, interfaces, the route to the master);
2. ``connect`` on every node: each worker connects to master_addr:master_port, every node to
   every other node's ephemeral port (a timeout, a refusal, no route and another program answering
   are told apart), reads the master's token in output_dir, and samples the audio paths of the
   data lists (first, last and 20 random lines).

Each result is a :class:`~console.training.launch.Check` that names the node, what was seen and
the fix. :func:`reachability` is the network part alone, for a run that is already going (the
stall detector calls it when a run makes no progress): its master port then belongs to the run's
store, which answers instead of our listener.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import logging
import secrets
import shlex
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from console.ssh.pool import Pool, Stream
from console.ssh.remote import script_text
from console.training.runs import PREFIX, node_python

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from console.training.launch import Check, LaunchPlan
    from console.training.profile import TrainingProfile
    from console.training.runs import RunRecord

NODE_SCRIPT = "preflight_node.py"
CONNECT_TIMEOUT = 3.0
"""Seconds a probe connection may take: a dropped port is told by this timeout."""
LISTEN_DEADLINE = 40.0
"""The listeners end by themselves after this many seconds (if the console went away)."""
IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _check(name: str, ok: bool, message: str, node: str | None = None, *,
           warning: bool = False) -> Check:
    from console.training.launch import Check

    return Check(name, ok, message, node, warning=warning)


# ---------------------------------------------------------------- talking to the node script


LOADER = ("import base64, sys; exec(compile(base64.b64decode(sys.stdin.readline()), "
          "'preflight_node.py', 'exec'))")
"""Runs the node script sent as one base64 line on stdin; the rest of stdin stays open."""


def _command(pool: Pool, op: str, args: Mapping[str, Any]) -> str:
    payload = base64.b64encode(json.dumps(dict(args)).encode()).decode()
    return f"exec {shlex.quote(node_python(pool.cluster))} -c {shlex.quote(LOADER)} {op} {payload}"


def _script_line() -> str:
    return base64.b64encode(script_text(NODE_SCRIPT).encode()).decode() + "\n"


def _replies(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len(PREFIX) + 2:]) for line in lines
            if line.startswith(f"{PREFIX}J ")]


@dataclass
class _Listener:
    """One node's ``listen``: its first reply (ports, facts, storage) once it is ready."""

    node: str
    stream: Stream
    ready: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None
    error: str | None = None
    stderr: list[str] = field(default_factory=list)

    def read(self) -> None:
        for line in self.stream:
            if line.fd == "err":
                self.stderr.append(line.text)
                continue
            got = _replies([line.text])
            if got and self.reply is None:
                self.reply = got[0]
                self.ready.set()
        if self.reply is None:
            said = self.stderr[-1] if self.stderr else f"exit {self.stream.exit}"
            self.error = self.stream.error or said
        self.ready.set()


def _connect_call(pool: Pool, node: str, args: Mapping[str, Any], timeout: float
                  ) -> dict[str, Any]:
    result = pool.run(node, _command(pool, "connect", args), stdin=_script_line(),
                      timeout=timeout)
    got = _replies(result.stdout.splitlines())
    if got:
        return got[-1]
    said = result.stderr.strip().splitlines()
    return {"error": result.error or (said[-1] if said else f"no reply (exit {result.exit})")}


# ---------------------------------------------------------------- what the checks need


@dataclass(frozen=True)
class Target:
    """What the checks are about: the nodes (master first) with their hosts and run env."""

    master: str
    master_addr: str
    master_port: int
    hosts: dict[str, str]
    env: dict[str, dict[str, str]]
    output_dir: str | None = None
    cwd: dict[str, str] = field(default_factory=dict)
    data: tuple[str, ...] = ()

    @classmethod
    def of_plan(cls, plan: LaunchPlan, profile: TrainingProfile | None = None, *,
                storage: bool = True) -> Target:
        data = ()
        if profile is not None:
            data = tuple(dict.fromkeys(p for p in (profile.train_data_set_list,
                                                   profile.valid_data_set_list) if p))
        return cls(plan.master, plan.master_addr, plan.master_port,
                   {n.node: n.host for n in plan.nodes}, {n.node: dict(n.env) for n in plan.nodes},
                   plan.output_dir if storage else None, {n.node: n.cwd for n in plan.nodes}, data)


def _addresses(reply: Mapping[str, Any]) -> set[str]:
    facts = reply.get("facts") or {}
    found = {a for addrs in (facts.get("interfaces") or {}).values() for a in addrs}
    return found


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- running them


def run_checks(pool: Pool, target: Target, *, nodes: Iterable[str] | None = None,
               timeout: float = CONNECT_TIMEOUT, network_only: bool = False) -> list[Check]:
    """Listen on every node, then connect from every node; the checks of what was seen.
    ``nodes``: those to include (default: all of the target; unreachable ones are left out by
    the caller). ``network_only``: master port and peer ports only."""
    names = [n for n in target.hosts if nodes is None or n in set(nodes)]
    if target.master not in names or len(names) < 1:
        return []
    tokens = {n: secrets.token_hex(8) for n in names}
    script = _script_line()
    listeners: dict[str, _Listener] = {}
    for name in names:
        args = {"token": tokens[name], "deadline": LISTEN_DEADLINE,
                "ports": [target.master_port, 0] if name == target.master else [0],
                "master_addr": target.master_addr,
                "output_dir": target.output_dir if name == target.master and not network_only
                else None}
        stream = pool.stream(name, _command(pool, "listen", args), timeout=LISTEN_DEADLINE + 20)
        with contextlib.suppress(OSError, RuntimeError):
            stream.write(script)  # stdin stays open: closing it ends the listener
        listeners[name] = _Listener(name, stream)
    threads = [threading.Thread(target=li.read, daemon=True, name=f"preflight-{li.node}")
               for li in listeners.values()]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + pool.cluster.ssh.connect_timeout + 30
        for li in listeners.values():
            li.ready.wait(max(0.0, deadline - time.monotonic()))
        up = {n: li.reply for n, li in listeners.items() if li.reply is not None}
        checks = [_check("preflight listener", False,
                         f"could not run the network check on {n}: {li.error or 'no answer'}", n)
                  for n, li in listeners.items() if li.reply is None]
        results = _connect_round(pool, target, names, up, tokens, timeout, network_only)
    finally:
        for li in listeners.values():  # the listeners end, close their ports and remove the
            with contextlib.suppress(OSError):  # token file when their stdin closes
                li.stream.close_stdin()
        for t in threads:
            t.join(10)
        for li in listeners.values():
            li.stream.cancel()
    checks += _master_port_checks(target, names, up, results)
    checks += _peer_checks(target, names, up, results)
    if not network_only:
        checks += _storage_checks(target, names, up, results)
        checks += _interface_checks(target, names, up)
        checks += _hostname_checks(names, up)
        checks += _data_checks(target, names, results)
    return checks


def _peer_address(target: Target, name: str, reply: Mapping[str, Any]) -> str:
    """The address other nodes reach ``name`` at: the master_addr for the master, else the
    source address of its route to the master (what gloo and NCCL advertise), else its host."""
    if name == target.master:
        return target.master_addr
    route = (reply.get("facts") or {}).get("route") or {}
    return (None if route.get("local") else route.get("src")) or target.hosts[name]


def _connect_round(pool: Pool, target: Target, names: list[str], up: Mapping[str, dict],
                   tokens: Mapping[str, str], timeout: float, network_only: bool
                   ) -> dict[str, dict[str, Any]]:
    master = up.get(target.master) or {}
    busy = str(target.master_port) in (master.get("busy") or {})
    per_node: dict[str, dict[str, Any]] = {}
    for name in names:
        targets = []
        if name != target.master and (master.get("ports") or busy):
            targets.append({"id": "master", "host": target.master_addr,
                            "port": target.master_port,
                            "token": None if busy else tokens[target.master]})
        for other in names:
            port = ((up.get(other) or {}).get("ports") or {}).get("0")
            if other != name and port:
                targets.append({"id": f"peer:{other}", "port": port, "token": tokens[other],
                                "host": _peer_address(target, other, up[other])})
        args: dict[str, Any] = {"targets": targets, "timeout": timeout}
        if not network_only:
            token_file = master.get("token_file")
            if token_file and target.output_dir:
                args["storage"] = {"dir": target.output_dir,
                                   "file": token_file.rsplit("/", 1)[-1]}
            args["data"] = list(target.data)
            args["cwd"] = target.cwd.get(name)
        per_node[name] = args
    with ThreadPoolExecutor(max(1, len(names))) as executor:
        futures = {n: executor.submit(_connect_call, pool, n, a, timeout * 2 + 60)
                   for n, a in per_node.items()}
        return {n: f.result() for n, f in futures.items()}


def _probe(results: Mapping[str, dict], node: str, probe_id: str) -> dict[str, Any] | None:
    for p in results.get(node, {}).get("probes") or []:
        if p.get("id") == probe_id:
            return p
    return None


# ---------------------------------------------------------------- the checks


def _master_port_checks(target: Target, names: list[str], up: Mapping[str, dict],
                        results: Mapping[str, dict]) -> list[Check]:
    master = up.get(target.master)
    if master is None:
        return []
    busy = (master.get("busy") or {}).get(str(target.master_port))
    where = f"{target.master_addr}:{target.master_port}"
    own = _addresses(master) | set((master.get("facts") or {}).get("master_resolves") or [])
    port = target.master_port
    out = []
    for name in names:
        if name == target.master:
            continue
        if "error" in results.get(name, {}):
            out.append(_check("master port reachable", False,
                              f"could not run the check: {results[name]['error']}", name))
            continue
        p = _probe(results, name, "master")
        if p is None:
            continue
        result, resolved = p.get("result"), p.get("resolved")
        ok = result == "ok" or bool(busy and result == "foreign")
        if ok:
            note = (" (the port is in use on the master and what holds it answers: the run's "
                    "store, for a run that is going)") if busy else ""
            text = f"{name} -> {where} connects{note}"
        elif result == "resolve":
            text = (f"master_addr {target.master_addr} does not resolve on {name}: "
                    f"{p.get('error')}. Fix: use the master's IP address as its host "
                    f"in cluster.yaml, or add it to {name}'s /etc/hosts")
        elif resolved and own and resolved not in own:
            text = (f"wrong address: master_addr {target.master_addr} resolves to "
                    f"{resolved} on {name}, which is not an address of "
                    f"{target.master} (it has {', '.join(sorted(own))}); "
                    f"{result}: {p.get('error') or p.get('got') or ''}. Fix: set the "
                    f"master node's host to one of its own addresses")
        elif result == "timeout":
            text = (f"{name} -> {where}: {p.get('error') or 'timed out'}: a firewall "
                    f"on {target.master} (or between) drops port {port}; torchrun's "
                    f"rendezvous would hang. Fix: accept TCP {port} from the "
                    f"workers on {target.master} (e.g. nft add rule inet filter "
                    f"input tcp dport {port} accept)")
        elif result == "refused":
            text = (f"{name} -> {where}: connection refused although the check "
                    f"listens on port {port} of {target.master}: its firewall rejects "
                    f"the port. Fix: accept TCP {port} from the workers")
        elif result == "unreachable":
            text = (f"{name} -> {where}: no route ({p.get('error')}): wrong address "
                    f"or network. Fix: set the master's host to an address {name} "
                    f"reaches")
        elif result == "foreign":
            text = (f"{name} -> {where}: another program answered, not the check's "
                    f"listener on {target.master} ({p.get('got')!r}): master_addr "
                    f"points at another machine or a proxy. Fix: the master's own "
                    f"address")
        else:
            text = f"{name} -> {where}: {result}: {p.get('error')}"
        out.append(_check("master port reachable", ok, text, name))
    return out


def _peer_checks(target: Target, names: list[str], up: Mapping[str, dict],
                 results: Mapping[str, dict]) -> list[Check]:
    """One check per node: can every other node reach an ephemeral port on it?"""
    out = []
    for name in names:
        reply = up.get(name)
        port = ((reply or {}).get("ports") or {}).get("0")
        if reply is None or not port:
            continue
        address = _peer_address(target, name, reply)
        reached, failed = [], []
        for other in names:
            if other == name or "error" in results.get(other, {}):
                continue
            p = _probe(results, other, f"peer:{name}")
            if p is None:
                continue
            if p.get("result") == "ok":
                reached.append(other)
            else:
                failed.append((other, p))
        if not failed:
            out.append(_check("peer ports", True,
                              f"port {port} of {name} ({address}) reached from "
                              f"{', '.join(reached) or 'no other node'}", name))
            continue
        kinds = sorted({p.get("result", "?") for _, p in failed})
        why = {"timeout": f"timed out after {CONNECT_TIMEOUT:g} s: a firewall on {name} (or "
                          f"between) drops ports other than the ones it opens",
               "refused": f"refused: a firewall on {name} rejects them",
               "unreachable": f"no route to {address}",
               "foreign": "another program answered"}
        reasons = "; ".join(why.get(k, k) for k in kinds)
        out.append(_check(
            "peer ports", False,
            f"{name} ({address}) cannot be reached on an ephemeral port ({port}) from "
            f"{', '.join(o for o, _ in failed)}: {reasons}. gloo's pairs and NCCL's bootstrap "
            f"and rings connect to such ports between pairs of nodes, so the run can hang "
            f"after the rendezvous. Fix: accept TCP from the cluster's nodes on {name} "
            f"(e.g. nft add rule inet filter input ip saddr <cluster subnet> accept)", name))
    return out


def _storage_checks(target: Target, names: list[str], up: Mapping[str, dict],
                    results: Mapping[str, dict]) -> list[Check]:
    master = up.get(target.master) or {}
    ms = master.get("storage")
    if target.output_dir is None or ms is None:
        return []
    path = target.output_dir
    if "error" in ms:
        return [_check("shared output_dir", False, f"the master cannot write a token in "
                       f"{ms['error']}", target.master)]
    out = []
    for name in names:
        seen = results.get(name, {}).get("storage")
        if seen is None:
            if "error" in results.get(name, {}):
                out.append(_check("shared output_dir", False,
                                  f"could not run the check: {results[name]['error']}", name))
            continue
        if "error" in seen:
            out.append(_check("shared output_dir", False,
                              f"{seen['error']} on {name}. Fix: mount the cluster's shared "
                              f"storage at {path} on every node", name))
        elif seen.get("token") == (master.get("token_file") or "").rsplit("-", 1)[-1]:
            out.append(_check("shared output_dir", True,
                              f"{path} is the master's directory (its token is there)", name))
        else:
            same_fs = seen.get("dev") == ms.get("dev")
            hint = (" (same filesystem, another directory: a bind or private mount over it?)"
                    if same_fs and seen.get("ino") != ms.get("ino") else "")
            listing = ", ".join(seen.get("sample") or []) or "nothing"
            out.append(_check(
                "shared output_dir", False,
                f"{name} sees another directory at {path}: the token {target.master} wrote "
                f"there is missing; {name} sees {seen.get('entries', 0)} entries ({listing}), "
                f"device {seen.get('dev')} inode {seen.get('ino')}, the master device "
                f"{ms.get('dev')} inode {ms.get('ino')}{hint}. Checkpoints, logs and resume "
                f"would differ per node. Fix: mount the same shared storage at {path} on "
                f"every node", name))
    return out


def ifname_matches(spec: str, names: Iterable[str], *, nccl: bool) -> list[str]:
    """The interfaces that an ``*_SOCKET_IFNAME`` value selects. NCCL: comma-separated
    prefixes, ``=`` for exact names, ``^`` to exclude; gloo: exact names."""
    names = list(names)
    text = spec.strip()
    exclude = nccl and text.startswith("^")
    text = text.lstrip("^")
    exact = not nccl or text.startswith("=")
    items = [i.strip() for i in text.lstrip("=").split(",") if i.strip()]

    def hit(name: str) -> bool:
        return any(name == i if exact else name.startswith(i) for i in items)

    return [n for n in names if hit(n) != exclude]


def _interface_checks(target: Target, names: list[str], up: Mapping[str, dict]) -> list[Check]:
    out = []
    for name in names:
        reply = up.get(name)
        if reply is None:
            continue
        facts = reply.get("facts") or {}
        route = facts.get("route") or {}
        interfaces = facts.get("interfaces") or {}
        master_ip = (facts.get("master_resolves") or [target.master_addr])[0]
        dev = route.get("dev")
        local = bool(route.get("local") or dev == "lo")
        if local:
            # the master itself, or nodes sharing one network stack (a loopback cluster); a
            # worker that reaches itself instead is the master port check's "wrong address"
            holding = [i for i, addrs in interfaces.items() if master_ip in addrs and i != "lo"]
            dev = holding[0] if holding else "lo"
        if route.get("error") == "no ip command":
            out.append(_check("interface", True, f"not checked: {name} has no 'ip' command "
                              f"(iproute2) to tell the route to the master", name,
                              warning=True))
            continue
        if "error" in route or not dev:
            out.append(_check("interface", False,
                              f"no route from {name} to the master {master_ip}: "
                              f"{route.get('error', 'no interface')}", name))
            continue
        via = f"reaches the master {master_ip} through {dev}" + (
            f" (source {route['src']})" if route.get("src") and name != target.master else "")
        problems, notes = [], []
        for var in IFNAME_VARS:
            spec = target.env.get(name, {}).get(var)
            if spec is None:
                continue
            chosen = ifname_matches(spec, interfaces, nccl=var.startswith("NCCL"))
            if not chosen:
                problems.append(f"{var}={spec} selects no interface of {name} (it has "
                                f"{', '.join(sorted(interfaces))})")
            elif dev not in chosen and local:
                notes.append(f"{var}={spec} selects {', '.join(chosen)} (the master's address "
                             f"is local here: no route to compare)")
            elif dev not in chosen:
                problems.append(f"{var}={spec} selects {', '.join(chosen)}, but the route to "
                                f"the master goes through {dev}")
            else:
                notes.append(f"{var}={spec} carries it")
        if problems:
            out.append(_check("interface", False, f"{via}; " + "; ".join(problems) +
                              f". Fix: set it to {dev} for this node (the NCCL env file of "
                              f"setup, or --env)", name))
        else:
            out.append(_check("interface", True, via + ("; " + "; ".join(notes) if notes else
                              "; NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME not set"), name))
    return out


def _hostname_checks(names: list[str], up: Mapping[str, dict]) -> list[Check]:
    out = []
    for name in names:
        reply = up.get(name)
        if reply is None:
            continue
        facts = reply.get("facts") or {}
        host = facts.get("hostname")
        resolved = facts.get("hostname_resolves") or []
        own = _addresses(reply)
        if facts.get("hostname_error") or not resolved:
            text = f"hostname {host} does not resolve ({facts.get('hostname_error')})"
        elif all(_is_loopback(a) for a in resolved):
            text = f"hostname {host} resolves to {', '.join(resolved)} (loopback)"
        elif not set(resolved) & own:
            text = f"hostname {host} resolves to {', '.join(resolved)}, not an address of {name}"
        else:
            out.append(_check("hostname", True,
                              f"{host} resolves to {', '.join(resolved)}", name))
            continue
        out.append(_check("hostname", True,
                          f"{text}: torch 2.13's gloo copes, older stacks and some NCCL setups "
                          f"advertise that address to the peers. Fix: map {host} to the node's "
                          f"cluster address in /etc/hosts, or set GLOO_SOCKET_IFNAME/"
                          f"NCCL_SOCKET_IFNAME", name, warning=True))
    return out


def _data_checks(target: Target, names: list[str], results: Mapping[str, dict]) -> list[Check]:
    out = []
    for name in names:
        for path, seen in (results.get(name, {}).get("data") or {}).items():
            if "error" in seen:
                continue  # the inspection's "data" check says it (not readable)
            missing = seen.get("missing") or []
            if not missing:
                out.append(_check("data files", True,
                                  f"{path}: the {seen.get('checked', 0)} sampled audio files "
                                  f"(of {seen.get('lines', 0)} lines) exist", name))
                continue
            shown = "; ".join(f"line {m['line']}: {m['path']}" for m in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            out.append(_check("data files", False,
                              f"{path}: {len(missing)} of {seen.get('checked')} sampled audio "
                              f"files do not exist on {name}: {shown}{more}. Every rank would "
                              f"fail reading them. Fix: put the audio on storage every node "
                              f"mounts at the same path, or fix the paths in the list", name))
    return out


# ---------------------------------------------------------------- entry points


def preflight(pool: Pool, plan: LaunchPlan, profile: TrainingProfile, *,
              nodes: Iterable[str] | None = None) -> list[Check]:
    """Every check of this module for a prepared launch (``launch.prepare`` calls it)."""
    return run_checks(pool, Target.of_plan(plan, profile), nodes=nodes)


def shared_storage(pool: Pool, record_or_plan: RunRecord | LaunchPlan) -> list[Check]:
    """Is output_dir one directory on every node, while a run may be using it? A token file
    written on the master must be read back, with its content, on every other node (plain
    shell over the pool: the run holds the master port, so no listener is started). One
    check per node; the token is removed afterwards."""
    from console.training.launch import LaunchPlan

    plan = record_or_plan
    if not isinstance(plan, LaunchPlan):
        plan = LaunchPlan.from_dict(record_or_plan.plan)  # type: ignore[union-attr]
    out, token = plan.output_dir, secrets.token_hex(8)
    where = shlex.quote(f"{out}/svconsole")
    made = pool.run(plan.master, f"mkdir -p {where} && t=$(mktemp {where}/.shared-XXXXXX) && "
                                 f"printf %s {token} > \"$t\" && printf '\\n@svtoken %s\\n' \"$t\"",
                    timeout=30)
    # a login banner may come first: the path is on the line the marker starts
    path = next((line[len("@svtoken "):] for line in made.stdout.splitlines()
                 if line.startswith("@svtoken ")), "")
    if not made.ok or not path:   # no proof either way: nothing to say
        log.warning("shared output_dir: no token written in %s on %s: %s", out, plan.master,
                    (made.error or made.stderr or f"exit {made.exit}").strip())
        return []
    checks = []
    try:
        others = [n.node for n in plan.nodes if n.node != plan.master]
        seen = pool.run_all(f"cat -- {shlex.quote(path)} 2>&1", nodes=others, timeout=30)
        for node, result in seen.items():
            if result.ok and token in result.stdout:
                checks.append(_check("shared output_dir", True,
                                     f"{out} is the master's directory", node))
            else:
                said = (result.error or result.stdout or result.stderr or "").strip()[:200]
                checks.append(_check("shared output_dir", False,
                                     f"{node} sees another directory at {out}: the token "
                                     f"{plan.master} wrote there is not in it ({said})", node))
    finally:
        pool.run(plan.master, f"rm -f -- {shlex.quote(path)}", timeout=30)
    return checks


def reachability(pool: Pool, record_or_plan: RunRecord | LaunchPlan) -> list[Check]:
    """Master port and peer ports, from every node, for a run that may already be going (the
    stall detector's diagnosis). The checks that failed name the node and from where."""
    from console.training.launch import LaunchPlan

    plan = record_or_plan
    if not isinstance(plan, LaunchPlan):
        plan = LaunchPlan.from_dict(record_or_plan.plan)  # type: ignore[union-attr]
    return run_checks(pool, Target.of_plan(plan, storage=False), network_only=True)


__all__ = ["CONNECT_TIMEOUT", "Target", "ifname_matches", "preflight", "reachability",
           "run_checks", "shared_storage"]
