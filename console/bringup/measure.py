"""Environment verification (the seed's section 7.1, step 3) as measurement steps.

Each measurement runs on the nodes through the pool and returns numbers, not just "ok":

* latency: TCP round trips between every pair of nodes (a tiny echo server on one node, the
  client on the other, timed on the node). The seed's target of < 20 us is an RDMA figure; over
  TCP, tens of microseconds is the best case, and the report says so plainly;
* collective bandwidth: ``scripts/collective_bench.py`` on all nodes at once (NCCL where GPUs
  exist, gloo otherwise; with the node's NCCL env file when the nccl-env step wrote one),
  reporting algorithm and bus bandwidth;
* iperf3 from the first node to each other node, when iperf3 is installed;
* GPU burn-in: ``scripts/burnin.py`` on every node, TFLOP/s per GPU, slow GPUs flagged;
* storage: sequential write (with fsync) and read on ``shared_dir``, every node at the same time;
* the master port: a real listener on the master and a connection from every worker.

Output parsing only trusts lines that start with a tag (``SVRTT {...}``), so a login banner on
a node does not break it.
"""

from __future__ import annotations

import itertools
import json
import shlex
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from console.bringup.model import (
    Emit,
    MeasureResult,
    NodeOutcome,
    Phase,
    SetupOptions,
    Step,
    StepState,
    nccl_env_file,
    says,
)
from console.cluster.model import Cluster
from console.ssh.remote import script_path

if TYPE_CHECKING:
    from console.ssh.pool import Pool, Result

q = shlex.quote
T = TypeVar("T")
R = TypeVar("R")

RDMA_TARGET_US = 20.0
LATENCY_NOTE = (
    "The seed guide's target of < 20 us between nodes is an RDMA (InfiniBand/RoCE) figure. "
    "These are TCP round trips through the kernel: tens of microseconds is the best TCP can "
    "do, so a TCP result above 20 us is expected and says nothing about RDMA; NCCL over "
    "InfiniBand bypasses TCP."
)


def node_python(cluster: Cluster) -> str:
    """The interpreter used on the nodes: the training one (``cluster.python``) or python3."""
    return q(cluster.python) if cluster.python else "python3"


def marked(text: str, tag: str) -> Any:
    """The JSON after the last line starting with ``tag`` (None if there is none)."""
    found = None
    for line in text.splitlines():
        if line.startswith(tag + " "):
            found = line[len(tag) + 1:]
    return None if found is None else json.loads(found)


def parallel(fn: Callable[[T], R], items: Sequence[T], limit: int) -> list[R]:
    """``fn`` over ``items`` in threads (at most ``limit`` at once: the cluster's
    ``ssh.max_parallel``), results in order."""
    if not items:
        return []
    with ThreadPoolExecutor(max(1, min(limit, len(items))), thread_name_prefix="svconsole-measure") as ex:
        return list(ex.map(fn, items))


def _emit_result(emit: Emit, result: Result) -> None:
    for line in (result.stdout + result.stderr).splitlines():
        emit(result.node, line)
    if result.error:
        emit(result.node, f"[{result.error}]")


def _failure(result: Result) -> str:
    """Why a command failed, in one line."""
    if result.error:
        return result.error
    lines = [t for t in (result.stderr or result.stdout).splitlines() if t.strip()]
    return f"exit {result.exit}: {lines[-1] if lines else 'no output'}"


class _Server:
    """A server process on a node (through ``pool.stream``), ready once it printed ``tag``."""

    def __init__(self, pool: Pool, node: str, command: str, tag: str, emit: Emit,
                 timeout: float = 60.0) -> None:
        self.node = node
        self.stream = pool.stream(node, command, stdin=b"", timeout=timeout)
        self.ready: str | None = None
        self.lines: list[str] = []
        for line in self.stream:
            emit(node, line.text)
            self.lines.append(line.text)
            if line.text.startswith(tag):
                self.ready = line.text[len(tag):].strip()
                break

    def error(self) -> str:
        return self.stream.error or (self.lines[-1] if self.lines else "server printed nothing")

    def close(self) -> None:
        self.stream.close()


def _free_port(pool: Pool, cluster: Cluster, node: str) -> int | str:
    """A TCP port that is free on ``node`` right now (the kernel picks it), or why none."""
    code = ("import socket; s = socket.socket(); s.bind(('', 0)); "
            "print('SVPORT', s.getsockname()[1])")
    result = pool.run(node, f"{node_python(cluster)} -c {q(code)}", timeout=30)
    for line in result.stdout.splitlines():
        if line.startswith("SVPORT "):
            return int(line.split()[1])
    return f"{node}: cannot run {node_python(cluster)}: {_failure(result)}"


# ------------------------------------------------------------------------------ latency

ECHO_SERVER = """\
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", 0)); s.listen(1); s.settimeout(float(sys.argv[1]))
print("SVPORT", s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); c.settimeout(60)
while True:
    d = c.recv(64)
    if not d:
        break
    c.sendall(d)
"""

ECHO_CLIENT = """\
import json, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.create_connection((host, port), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for i in range(count + 20):
    t = time.perf_counter(); c.sendall(b"x")
    if not c.recv(1):
        raise SystemExit("echo server closed the connection")
    if i >= 20:
        rtts.append((time.perf_counter() - t) * 1e6)
c.close(); rtts.sort()
print("SVRTT", json.dumps({"count": count, "min_us": rtts[0], "median_us": rtts[len(rtts) // 2],
                            "p99_us": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))]}))
"""


@dataclass
class PairLatency:
    """TCP round trips from ``client`` to ``server`` (microseconds), or why none were measured."""

    server: str
    client: str
    min_us: float | None = None
    median_us: float | None = None
    p99_us: float | None = None
    error: str | None = None


def latency_verdict(median_us: float) -> str:
    """What a TCP round trip means against the seed's RDMA target."""
    if median_us < RDMA_TARGET_US:
        return "under 20 us (same host, or an unusually short path)"
    if median_us < 200:
        return "normal for TCP; the < 20 us target needs RDMA"
    if median_us < 1000:
        return "slow for a cluster network (check the path, switches, power saving)"
    return "very slow (> 1 ms): not a local cluster link"


def pair_latency(pool: Pool, cluster: Cluster, server: str, client: str, count: int,
                 emit: Emit) -> PairLatency:
    """Echo server on ``server``, ``count`` round trips timed on ``client``."""
    py = node_python(cluster)
    pair = PairLatency(server, client)
    srv = _Server(pool, server, f"{py} -c {q(ECHO_SERVER)} 30", "SVPORT", emit)
    try:
        if srv.ready is None:
            pair.error = f"echo server on {server}: {srv.error()}"
            return pair
        host = cluster.node(server).host
        result = pool.run(client, f"{py} -c {q(ECHO_CLIENT)} {q(host)} {srv.ready} {count}",
                          timeout=60 + count / 100)
        _emit_result(emit, result)
        data = marked(result.stdout, "SVRTT") if result.ok else None
        if data is None:
            pair.error = f"client on {client}: {_failure(result)}"
            return pair
        pair.min_us, pair.median_us, pair.p99_us = data["min_us"], data["median_us"], data["p99_us"]
        return pair
    finally:
        srv.close()


def measure_latency(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                    emit: Emit) -> MeasureResult:
    pairs = [pair_latency(pool, cluster, a, b, options.latency_count, emit)
             for a, b in itertools.combinations(nodes, 2)]
    outcomes: dict[str, NodeOutcome] = {}
    for name in nodes:
        mine = [p for p in pairs if name in (p.server, p.client)]
        if not mine:
            outcomes[name] = NodeOutcome(StepState.NOT_APPLICABLE, "one node: no pair to measure")
            continue
        bad = [p for p in mine if p.error]
        parts = [f"{p.client if p.server == name else p.server} {p.median_us:.0f} us"
                 for p in mine if p.median_us is not None]
        detail = "median round trip to " + ", ".join(parts) if parts else ""
        if bad:
            outcomes[name] = NodeOutcome(StepState.FAILED, "; ".join(p.error or "" for p in bad))
        else:
            outcomes[name] = NodeOutcome(StepState.DONE, detail)
    summary = [LATENCY_NOTE] + [
        f"{p.server} <-> {p.client}: " + (
            f"median {p.median_us:.1f} us, min {p.min_us:.1f} us, p99 {p.p99_us:.1f} us "
            f"({latency_verdict(p.median_us)})" if p.median_us is not None else f"failed: {p.error}")
        for p in pairs]
    return MeasureResult(outcomes, {"pairs": [asdict(p) for p in pairs],
                                    "rdma_target_us": RDMA_TARGET_US}, summary)


# ------------------------------------------------------------------------------ master port

LISTENER = """\
import json, socket, sys, time
port, expected, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("", port))
except OSError as e:
    print("SVBUSY", json.dumps(f"cannot listen on port {port}: {e.strerror}"), flush=True)
    raise SystemExit(3)
s.listen(64); print("SVLISTEN", port, flush=True)
deadline = time.monotonic() + timeout
while expected > 0 and time.monotonic() < deadline:
    s.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        c, addr = s.accept()
    except socket.timeout:
        break
    c.sendall(b"svconsole\\n"); c.close(); expected -= 1; print("SVACCEPT", json.dumps(addr[0]))
"""

CONNECTOR = """\
import json, socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    ok = c.recv(16).startswith(b"svconsole"); c.close()
    print("SVCONNECT", json.dumps("ok" if ok else "connected, but another program answered"))
except OSError as e:
    print("SVCONNECT", json.dumps(f"cannot connect: {e.strerror or e}"))
"""


def check_master_port(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                      emit: Emit) -> MeasureResult:
    """A listener on the master's ``master_port``, a connection from each selected worker."""
    master = cluster.master_node
    port = cluster.master_port
    workers = [n for n in nodes if n != master.name]
    py = node_python(cluster)
    srv = _Server(pool, master.name, f"{py} -c {q(LISTENER)} {port} {len(workers)} 30",
                  "SVLISTEN", emit)
    outcomes: dict[str, NodeOutcome] = {}
    try:
        if srv.ready is None:
            busy = marked("\n".join(srv.lines), "SVBUSY")
            reason = f"{busy} (is a training already running?)" if busy else srv.error()
            outcomes = {n: NodeOutcome(StepState.FAILED, f"master {master.name}: {reason}")
                        for n in nodes}
            return MeasureResult(outcomes, {"port": port, "error": reason}, [reason])

        def connect(name: str) -> tuple[str, str]:
            result = pool.run(name, f"{py} -c {q(CONNECTOR)} {q(master.host)} {port}", timeout=30)
            _emit_result(emit, result)
            return name, (marked(result.stdout, "SVCONNECT") if result.ok else None) or _failure(result)

        answers = dict(parallel(connect, workers, cluster.ssh.max_parallel))
    finally:
        srv.close()
    for name in nodes:
        if name == master.name:
            outcomes[name] = NodeOutcome(StepState.DONE, f"listening on port {port} works")
        else:
            verdict = answers[name]
            state = StepState.DONE if verdict == "ok" else StepState.FAILED
            detail = (f"reaches {master.name}:{port}" if verdict == "ok"
                      else f"{master.name}:{port}: {verdict} (firewall?)")
            outcomes[name] = NodeOutcome(state, detail)
    return MeasureResult(outcomes, {"port": port, "workers": answers},
                         [f"{n}: {o.detail}" for n, o in outcomes.items()])


# ------------------------------------------------------------------------------ collective


PRIVATE_DIR = 'd=$(mktemp -d "${TMPDIR:-/tmp}/svconsole.XXXXXXXXXX") && echo "SVDIR $d"'
"""Makes a private directory on a node (``mktemp -d``: mode 0700, owned by the SSH user, a name
nobody can guess) and prints it after a tag (a login banner may print before it)."""


@contextmanager
def node_script(pool: Pool, node: str, name: str) -> Iterator[str]:
    """``scripts/<name>`` copied into a fresh private directory on the node (never a predictable
    path in a world-writable one such as /tmp); yields its path; the directory is removed after.
    RuntimeError when the node cannot make the directory or take the file."""
    from console.ssh.pool import RemoteError

    made = pool.run(node, PRIVATE_DIR, timeout=30)
    found = [line[len("SVDIR "):] for line in made.stdout.splitlines() if line.startswith("SVDIR /")]
    if not made.ok or not found:
        raise RuntimeError(f"{node}: cannot make a private directory with mktemp -d: "
                           f"{_failure(made)}")
    directory = found[-1]
    try:
        remote = f"{directory}/{name}"
        try:
            pool.put(node, script_path(name).read_bytes(), remote)
        except RemoteError as exc:
            raise RuntimeError(str(exc)) from None
        yield remote
    finally:
        pool.run(node, f"rm -rf -- {q(directory)}", timeout=30)


def measure_collective(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                       emit: Emit) -> MeasureResult:
    """all_reduce bus bandwidth over torch.distributed, every selected node at once."""
    master = cluster.master_node.name
    order = ([master] if master in nodes else []) + [n for n in nodes if n != master]
    port = _free_port(pool, cluster, order[0])
    if isinstance(port, str):
        reason = port
        return MeasureResult({n: NodeOutcome(StepState.FAILED, reason) for n in order}, {}, [reason])
    host = cluster.node(order[0]).host

    def run(rank_node: tuple[int, str]) -> tuple[str, Result | str]:
        rank, name = rank_node
        try:
            with node_script(pool, name, "collective_bench.py") as path:
                env = q(nccl_env_file(cluster, name))
                cmd = (f"if [ -f {env} ]; then . {env}; fi; "
                       f"{node_python(cluster)} {q(path)} --node-rank {rank} "
                       f"--nnodes {len(order)} --master-addr {q(host)} --master-port {port} "
                       f"--size-mb {options.bench_mb:g} --iters {options.bench_iters} "
                       f"--timeout 120")
                result = pool.run(name, cmd, timeout=300)
        except RuntimeError as exc:
            return name, str(exc)
        _emit_result(emit, result)
        return name, result

    # every rank at once, whatever max_parallel says: a collective waits for all of them
    results = dict(parallel(run, list(enumerate(order)), len(order)))
    report = None
    for name in order:
        res = results[name]
        if not isinstance(res, str) and res.ok and report is None:
            report = marked(res.stdout, "SVBENCH")
    outcomes = {}
    for name in order:
        res = results[name]
        if isinstance(res, str):
            outcomes[name] = NodeOutcome(StepState.FAILED, res)
        elif not res.ok:
            errors = [t for t in res.stdout.splitlines() if t.startswith("SVBENCH-ERROR")]
            outcomes[name] = NodeOutcome(StepState.FAILED, errors[-1] if errors else _failure(res))
        else:
            outcomes[name] = NodeOutcome(StepState.DONE, "joined the all_reduce")
    summary = []
    if report is not None:
        summary.append(
            f"all_reduce of {report['size_bytes'] / 2**20:.0f} MiB over {report['backend']}, "
            f"{report['world_size']} ranks on {report['nnodes']} nodes: "
            f"algbw {report['algbw_gbps']:.2f} GB/s, busbw {report['busbw_gbps']:.2f} GB/s")
        if report["nnodes"] == 1:
            summary.append("one node only: no network link in this measurement")
    return MeasureResult(outcomes, {"report": report}, summary)


# ------------------------------------------------------------------------------ iperf3


def _iperf_json(text: str) -> dict | None:
    """iperf3 -J output, after whatever a banner printed before it."""
    start = text.find("\n{")
    body = text if text.startswith("{") else (text[start + 1:] if start >= 0 else "")
    try:
        return json.loads(body)
    except ValueError:
        return None


def measure_iperf(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                  emit: Emit) -> MeasureResult:
    """TCP throughput from the first selected node to each other one (iperf3 -J)."""
    have = dict(parallel(lambda n: (n, pool.run(n, "command -v iperf3", timeout=30).ok), nodes,
                         cluster.ssh.max_parallel))
    missing = [n for n in nodes if not have[n]]
    outcomes = {n: NodeOutcome(StepState.NOT_APPLICABLE, "iperf3 is not installed")
                for n in missing}
    present = [n for n in nodes if have[n]]
    if len(present) < 2:
        for n in present:
            outcomes[n] = NodeOutcome(StepState.NOT_APPLICABLE, "no second node with iperf3")
        return MeasureResult(outcomes, {"links": []}, ["iperf3: fewer than two nodes have it"])
    server = present[0]
    links = []
    for client in present[1:]:
        port = _free_port(pool, cluster, server)
        if isinstance(port, str):
            links.append({"server": server, "client": client, "error": port})
            continue
        srv = _Server(pool, server, f"timeout {options.iperf_seconds + 60} iperf3 -s -1 "
                                    f"--forceflush -p {port}", "Server listening", emit,
                      timeout=options.iperf_seconds + 60)
        try:
            if srv.ready is None:
                links.append({"server": server, "client": client, "error": srv.error()})
                continue
            result = pool.run(client, f"iperf3 -c {q(cluster.node(server).host)} -p {port} "
                                      f"-t {options.iperf_seconds} -J",
                              timeout=options.iperf_seconds + 60)
            data = _iperf_json(result.stdout)
            if not result.ok or data is None or "end" not in data:
                links.append({"server": server, "client": client,
                              "error": (data or {}).get("error") or _failure(result)})
                continue
            bps = data["end"]["sum_received"]["bits_per_second"]
            emit(client, f"iperf3 to {server}: {bps / 1e9:.2f} Gbit/s")
            links.append({"server": server, "client": client, "gbit_s": bps / 1e9})
        finally:
            srv.close()
    for link in links:
        state = StepState.FAILED if "error" in link else StepState.DONE
        text = link.get("error") or f"{link['gbit_s']:.2f} Gbit/s to {server}"
        outcomes[link["client"]] = NodeOutcome(state, text)
    outcomes[server] = NodeOutcome(
        StepState.FAILED if any("error" in link for link in links) else StepState.DONE,
        f"iperf3 server for {len(links)} node(s)")
    summary = [f"{link['client']} -> {server}: " + (
        f"{link['gbit_s']:.2f} Gbit/s" if "gbit_s" in link else f"failed: {link['error']}")
        for link in links]
    return MeasureResult(outcomes, {"links": links}, summary)


# ------------------------------------------------------------------------------ GPU burn-in


def flag_slow(gpus: Iterable[dict[str, Any]], ratio: float) -> list[str]:
    """Lines naming each GPU whose TFLOP/s is below ``ratio`` times the median of all GPUs
    (per dtype). Each dict has ``node``, ``index`` and ``tflops`` {dtype: value}."""
    gpus = list(gpus)
    flagged = []
    dtypes = sorted({d for g in gpus for d in g.get("tflops", {})})
    for dtype in dtypes:
        values = [g["tflops"][dtype] for g in gpus if dtype in g.get("tflops", {})]
        if len(values) < 2:
            continue
        median = statistics.median(values)
        for g in gpus:
            value = g.get("tflops", {}).get(dtype)
            if value is not None and value < ratio * median:
                flagged.append(f"{g['node']} GPU {g['index']}: {dtype} {value:.1f} TFLOP/s, "
                               f"{value / median:.0%} of the median {median:.1f}")
    return flagged


def measure_burnin(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                   emit: Emit) -> MeasureResult:
    def run(name: str) -> tuple[str, dict | str]:
        try:
            with node_script(pool, name, "burnin.py") as path:
                result = pool.run(name, f"{node_python(cluster)} {q(path)} --seconds "
                                        f"{options.burnin_seconds:g} --size {options.burnin_size}",
                                  timeout=120 + 4 * 2 * 8 * options.burnin_seconds)
        except RuntimeError as exc:
            return name, str(exc)
        _emit_result(emit, result)
        data = marked(result.stdout, "SVBURN")
        return name, data if data is not None else _failure(result)

    reports = dict(parallel(run, nodes, cluster.ssh.max_parallel))
    gpus = [dict(g, node=n) for n, r in reports.items() if isinstance(r, dict) for g in r["gpus"]]
    slow = flag_slow(gpus, options.slow_gpu_ratio)
    outcomes = {}
    for name in nodes:
        r = reports[name]
        if isinstance(r, str):
            outcomes[name] = NodeOutcome(StepState.FAILED, r)
        elif not r["gpus"]:
            outcomes[name] = NodeOutcome(StepState.NOT_APPLICABLE, r["note"])
        else:
            problems = [f"GPU {g['index']}: {e}" for g in r["gpus"] for e in g["errors"]
                        if "skipped" not in e]
            problems += [s for s in slow if s.startswith(f"{name} ")]
            rates = ", ".join(f"GPU {g['index']} " + "/".join(f"{d} {v:.0f}" for d, v in
                                                              g["tflops"].items())
                              for g in r["gpus"])
            outcomes[name] = NodeOutcome(StepState.FAILED if problems else StepState.DONE,
                                         "; ".join(problems) or f"TFLOP/s: {rates}")
    summary = slow or ([f"{len(gpus)} GPU(s), none far slower than its peers"] if gpus
                       else ["no GPU on the selected nodes: nothing to burn in"])
    return MeasureResult(outcomes, {"nodes": reports, "slow": slow}, summary)


# ------------------------------------------------------------------------------ storage

STORAGE = """\
import json, os, secrets, sys, time
folder, name, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(folder, exist_ok=True)
# shared_dir is shared with other users: never follow a symlink planted there (O_NOFOLLOW on the
# folder and the file), and write a new file of our own (O_EXCL, a random name), never an old one.
try:
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
except OSError as e:
    raise SystemExit(f"refusing {folder}: {e.strerror} (a symlink is never followed there)")
path = f"{name}.{secrets.token_hex(8)}.bin"
block = os.urandom(1 << 20)
t = time.perf_counter()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
try:
    try:
        for _ in range(mb):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    write = time.perf_counter() - t
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t, n = time.perf_counter(), 0
        while True:
            d = os.read(fd, 1 << 20)
            if not d:
                break
            n += len(d)
        read = time.perf_counter() - t
    finally:
        os.close(fd)
finally:
    os.unlink(path, dir_fd=dfd)
print("SVSTORE", json.dumps({"mb": mb, "bytes_read": n, "write_mb_s": mb / write,
                             "read_mb_s": n / 2**20 / read}))
"""


def measure_storage(pool: Pool, cluster: Cluster, nodes: list[str], options: SetupOptions,
                    emit: Emit) -> MeasureResult:
    """Every node writes then reads ``storage_mb`` MiB on shared_dir at the same time."""
    py = node_python(cluster)

    def run(name: str) -> tuple[str, dict | str]:
        folder = f"{cluster.shared_dir}/.svconsole-io"
        result = pool.run(name, f"{py} -c {q(STORAGE)} {q(folder)} {q(name)} {options.storage_mb}",
                          timeout=120 + options.storage_mb / 10)
        _emit_result(emit, result)
        data = marked(result.stdout, "SVSTORE") if result.ok else None
        return name, data if data is not None else _failure(result)

    reports = dict(parallel(run, nodes, cluster.ssh.max_parallel))
    outcomes = {}
    for name in nodes:
        r = reports[name]
        if isinstance(r, str):
            outcomes[name] = NodeOutcome(StepState.FAILED, r)
        else:
            outcomes[name] = NodeOutcome(
                StepState.DONE, f"write {r['write_mb_s']:.0f} MB/s, read {r['read_mb_s']:.0f} MB/s")
    ok = [r for r in reports.values() if isinstance(r, dict)]
    summary = [f"{len(ok)} node(s) at once on {cluster.shared_dir}: total write "
               f"{sum(r['write_mb_s'] for r in ok):.0f} MB/s, read "
               f"{sum(r['read_mb_s'] for r in ok):.0f} MB/s (MiB/s)"] if ok else []
    return MeasureResult(outcomes, {"nodes": reports}, summary)


STEPS: tuple[Step, ...] = (
    Step("latency", "Latency between node pairs (TCP)", Phase.VERIFICATION,
         changes=says("runs a TCP echo server on one node and times round trips from the "
                       "other, for every pair"), measure=measure_latency),
    Step("collective", "Collective bandwidth (all_reduce)", Phase.VERIFICATION,
         changes=says("runs scripts/collective_bench.py on all nodes at once "
                       "(torch.distributed; NCCL with GPUs, gloo without)"),
         measure=measure_collective),
    Step("iperf3", "TCP throughput (iperf3)", Phase.VERIFICATION,
         changes=says("iperf3 server on the first node, client on each other node"),
         measure=measure_iperf),
    Step("gpu-burnin", "GPU burn-in (matmul TFLOP/s)", Phase.VERIFICATION,
         changes=says("runs scripts/burnin.py (bf16/fp32 matmuls) on every GPU"),
         measure=measure_burnin),
    Step("storage", "Shared storage throughput", Phase.VERIFICATION,
         changes=lambda c, o: f"writes and reads {o.storage_mb} MiB per node in "
                              f"{c.shared_dir}/.svconsole-io (removed afterwards)",
         measure=measure_storage),
)

MASTER_PORT = Step(
    "master-port", "Master port reachable (rendezvous)", Phase.CONFIGURATION,
    changes=lambda c, o: f"listens on {c.master_node.name}:{c.master_port} for a moment and "
                         f"connects from every worker",
    measure=check_master_port)

MEASUREMENTS: dict[str, Step] = {s.id: s for s in (*STEPS, MASTER_PORT)}
"""Every measurement step by id (``svconsole verify --steps``)."""
