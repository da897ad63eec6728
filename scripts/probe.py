#!/usr/bin/env python3
"""svconsole node probe: every fact about one node that svconsole needs, in one run.

svconsole sends this file to a node over SSH as the program on stdin (``python3 - --nonce N ...``)
and reads back one JSON payload printed between two marker lines that carry the nonce::

    ===SVCONSOLE-PROBE-BEGIN <nonce>===
    {...}
    ===SVCONSOLE-PROBE-END <nonce>===

Whatever else the remote shell prints (a ``.bashrc`` banner, ``conda init`` chatter) stays outside
the markers and is ignored. Only the standard library is used (Python 3.8 or newer). Every fact is
collected on its own: one that fails is ``null`` in the payload and its reason is in ``errors``;
the probe itself always prints a payload.

Second mode (``--rtt name=host:port ...``): time a TCP connect from this node to each target.
svconsole runs that on the master node to measure the master-to-node round trip.

The parsing functions take raw text or dicts (``/proc`` files, ``nvidia-smi`` output, NVML
readings) so that they can be checked against recorded readings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

PAYLOAD_VERSION = 1
BEGIN = "===SVCONSOLE-PROBE-BEGIN {nonce}==="
END = "===SVCONSOLE-PROBE-END {nonce}==="

# What the training interpreter is asked about (distribution names for importlib.metadata).
PACKAGES = ("torch", "deepspeed", "funasr", "numpy")

# nvidia-smi fallback: one CSV line per GPU with these columns.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.total",
    "compute_cap",
    "persistence_mode",
    "ecc.mode.current",
    "pcie.link.gen.max",
    "pcie.link.width.max",
)
# Older drivers do not know compute_cap; the query is retried with these.
QUERY_FIELDS_BASIC = tuple(f for f in QUERY_FIELDS if f != "compute_cap")

# Filesystems that several nodes can mount (a shared_dir on anything else is node-local).
SHARED_FSTYPES = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cifs", "smb3", "fuse.glusterfs",
                  "glusterfs", "fuse.cephfs", "fuse.juicefs", "wekafs")

# Block devices that are not local disks.
_PSEUDO_BLOCK = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")


def reason(exc: BaseException) -> str:
    """One line that says why a fact could not be read."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def run_cmd(argv: list, timeout: float) -> str:
    """stdout of a program; raises with its stderr when it fails or runs too long."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout, text=True)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        last = err[-1] if err else "no output"
        raise RuntimeError(f"{os.path.basename(argv[0])} exited {proc.returncode}: {last}")
    return proc.stdout


# ---------------------------------------------------------------- system


def os_name(os_release: str) -> str:
    """PRETTY_NAME (else NAME VERSION) from the text of /etc/os-release."""
    values = {}
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    if "PRETTY_NAME" in values:
        return values["PRETTY_NAME"]
    return " ".join(v for v in (values.get("NAME"), values.get("VERSION")) if v)


def cpu_model(cpuinfo: str) -> str | None:
    """The CPU's model name from /proc/cpuinfo (x86 "model name", ARM "Hardware"/"Model")."""
    for key in ("model name", "Hardware", "Model", "cpu model"):
        for line in cpuinfo.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return None


def meminfo_mb(meminfo: str) -> tuple:
    """(MemTotal, MemAvailable) in MiB from /proc/meminfo."""
    values = {}
    for line in meminfo.splitlines():
        name, sep, rest = line.partition(":")
        if sep and rest.split():
            values[name.strip()] = int(rest.split()[0])  # kB
    return values["MemTotal"] // 1024, values["MemAvailable"] // 1024


def _unescape_mount(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, mounts: str) -> dict | None:
    """The mount (source, fstype, mountpoint) that holds ``path``, from /proc/mounts text."""
    best = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape_mount(parts[1])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best["mountpoint"])):
            best = {"source": _unescape_mount(parts[0]), "fstype": parts[2], "mountpoint": point}
    return best


def nfs_server(source: str) -> str | None:
    """The server of an NFS source ``host:/export`` (``[v6addr]:/export`` too)."""
    m = re.match(r"^\[([^\]]+)\]:", source) or re.match(r"^([^:/]+):", source)
    return m.group(1) if m else None


def disk_usage_gb(path: str) -> dict:
    st = os.statvfs(path)
    return {"total_gb": round(st.f_blocks * st.f_frsize / 1e9, 2),
            "free_gb": round(st.f_bavail * st.f_frsize / 1e9, 2)}


def shared_dir_facts(path: str, mounts: str) -> dict:
    """Where ``cluster.shared_dir`` lives on this node: exists, size, filesystem and its source."""
    facts = {"path": path, "exists": os.path.isdir(path), "total_gb": None, "free_gb": None,
             "fstype": None, "source": None, "mountpoint": None, "is_nfs": False,
             "server": None, "shared_fs": False}
    if not facts["exists"]:
        return facts
    real = os.path.realpath(path)
    facts.update(disk_usage_gb(real))
    mount = mount_of(real, mounts)
    if mount:
        facts.update(mount)
        facts["is_nfs"] = mount["fstype"] in ("nfs", "nfs4")
        facts["shared_fs"] = mount["fstype"] in SHARED_FSTYPES
        if facts["is_nfs"]:
            facts["server"] = nfs_server(mount["source"])
    return facts


def block_devices(sys_block: str = "/sys/block") -> list:
    """Local disks: name, size (GB), rotational, NVMe."""
    disks = []
    for name in sorted(os.listdir(sys_block)):
        if name.startswith(_PSEUDO_BLOCK):
            continue
        base = os.path.join(sys_block, name)
        size_gb = int(read_text(os.path.join(base, "size"))) * 512 / 1e9
        if size_gb <= 0:
            continue
        try:
            rotational = read_text(os.path.join(base, "queue", "rotational")).strip() == "1"
        except OSError:
            rotational = None
        disks.append({"name": name, "size_gb": round(size_gb, 1), "rotational": rotational,
                      "nvme": name.startswith("nvme")})
    return disks


# ---------------------------------------------------------------- network


def _ipv4_of(name: str) -> list:
    """Primary IPv4 address/prefix of an interface (SIOCGIFADDR / SIOCGIFNETMASK)."""
    import fcntl  # POSIX only; imported here so the parsers load anywhere

    req = struct.pack("256s", name[:15].encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
        except OSError:
            return []  # no IPv4 address
        mask = fcntl.ioctl(s.fileno(), 0x891B, req)[20:24]
    prefix = bin(struct.unpack("!I", mask)[0]).count("1")
    return [f"{addr}/{prefix}"]


def ipv6_addresses(if_inet6: str) -> dict:
    """{interface: ["addr/prefix", ...]} from the text of /proc/net/if_inet6."""
    out = {}
    for line in if_inet6.splitlines():
        parts = line.split()
        if len(parts) == 6:
            raw = bytes.fromhex(parts[0])
            addr = socket.inet_ntop(socket.AF_INET6, raw)
            out.setdefault(parts[5], []).append(f"{addr}/{int(parts[2], 16)}")
    return out


def _sys_int(path: str) -> int | None:
    try:
        value = int(read_text(path).strip())
    except (OSError, ValueError):
        return None  # virtual and down interfaces refuse to say
    return value if value >= 0 else None


def interfaces(sys_net: str = "/sys/class/net") -> list:
    """Network interfaces: name, addresses, speed (Mb/s, None when not reported), state, kind."""
    try:
        v6 = ipv6_addresses(read_text("/proc/net/if_inet6"))
    except OSError:
        v6 = {}
    out = []
    for name in sorted(os.listdir(sys_net)):
        base = os.path.join(sys_net, name)
        if_type = _sys_int(os.path.join(base, "type"))
        if name == "lo" or if_type == 772:
            kind = "loopback"
        elif if_type == 32:
            kind = "infiniband"
        elif os.path.exists(os.path.join(base, "device")):
            kind = "physical"
        else:
            kind = "virtual"
        try:
            state = read_text(os.path.join(base, "operstate")).strip()
        except OSError:
            state = None
        out.append({"name": name, "kind": kind, "state": state,
                    "addrs": _ipv4_of(name) + v6.get(name, []),
                    "speed_mbps": _sys_int(os.path.join(base, "speed")),
                    "mtu": _sys_int(os.path.join(base, "mtu"))})
    return out


def rdma_ports(sys_ib: str = "/sys/class/infiniband") -> list:
    """RDMA ports (InfiniBand or RoCE): device, port, state, rate (Gb/s), link layer."""
    if not os.path.isdir(sys_ib):
        return []
    ports = []
    for dev in sorted(os.listdir(sys_ib)):
        pdir = os.path.join(sys_ib, dev, "ports")
        for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else ():
            base = os.path.join(pdir, port)

            def attr(name, base=base):
                try:
                    return read_text(os.path.join(base, name)).strip()
                except OSError:
                    return None

            rate = re.match(r"([\d.]+)\s*Gb/sec", attr("rate") or "")
            state = attr("state") or ""
            ports.append({"device": dev, "port": int(port), "state": state.split(":")[-1].strip(),
                          "rate_gbps": float(rate.group(1)) if rate else None,
                          "link_layer": attr("link_layer")})
    return ports


# ---------------------------------------------------------------- GPUs


def _gpu(index, name, uuid=None, memory_total_mb=None, compute_capability=None,
         driver_version=None, cuda_driver_version=None, persistence=None, ecc=None,
         pcie_gen=None, pcie_width=None, nvlink_up=None) -> dict:
    """One GPU as the payload carries it (the fields of console.cluster.probe.GPUInfo)."""
    return dict(index=index, name=name, uuid=uuid, memory_total_mb=memory_total_mb,
                compute_capability=compute_capability, driver_version=driver_version,
                cuda_driver_version=cuda_driver_version, persistence=persistence, ecc=ecc,
                pcie_gen=pcie_gen, pcie_width=pcie_width, nvlink_up=nvlink_up)


def cuda_version_text(value: int | None) -> str | None:
    """NVML's CUDA driver version (13000) as text ("13.0")."""
    if not value:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def nvml_raw(pynvml) -> dict:
    """Read every GPU through NVML (the ``pynvml`` module of nvidia-ml-py) into plain data.

    Per GPU: index, name, uuid, pci, cc, mem_total (bytes), persistence, ecc_mode [current,
    pending], pcie_gen, pcie_width, nvlink (one {"active": bool} or {"error": text} per link).
    A field that NVML refuses is left out, so one unsupported call never loses the others.
    """
    pynvml.nvmlInit()
    try:
        def text(v):
            return v.decode() if isinstance(v, bytes) else v

        raw = {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
               "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g = {"index": i}
            calls = {
                "name": lambda h=h: text(pynvml.nvmlDeviceGetName(h)),
                "uuid": lambda h=h: text(pynvml.nvmlDeviceGetUUID(h)),
                "pci": lambda h=h: text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                "cc": lambda h=h: list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "mem_total": lambda h=h: pynvml.nvmlDeviceGetMemoryInfo(h).total,
                "persistence": lambda h=h: pynvml.nvmlDeviceGetPersistenceMode(h),
                "ecc_mode": lambda h=h: list(pynvml.nvmlDeviceGetEccMode(h)),
                "pcie_gen": lambda h=h: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                "pcie_width": lambda h=h: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
            }
            for key, call in calls.items():
                try:
                    g[key] = call()
                except Exception:  # noqa: BLE001  NVMLError_NotSupported and friends
                    pass
            links = []
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    links.append({"active": pynvml.nvmlDeviceGetNvLinkState(h, link) == 1})
                except Exception as exc:  # noqa: BLE001
                    links.append({"error": reason(exc)})
            g["nvlink"] = links
            raw["gpus"].append(g)
        return raw
    finally:
        pynvml.nvmlShutdown()


def gpus_from_nvml(raw: dict) -> list:
    """GPU facts from NVML readings (the shape :func:`nvml_raw` returns, as in nvml.json)."""
    cuda = cuda_version_text(raw.get("cuda_driver"))
    gpus = []
    for g in raw.get("gpus", []):
        mem = g.get("mem_total")
        if mem is None:  # recorded readings keep it in their idle snapshot
            mem = (g.get("idle") or {}).get("mem_total")
        cc = g.get("cc")
        ecc = g.get("ecc_mode")
        links = g.get("nvlink") or []
        answered = [lk for lk in links if "active" in lk]
        gpus.append(_gpu(
            g["index"], g.get("name") or "unknown", uuid=g.get("uuid"),
            memory_total_mb=round(mem / 1048576) if mem is not None else None,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
            driver_version=raw.get("driver"), cuda_driver_version=cuda,
            persistence=bool(g["persistence"]) if "persistence" in g else None,
            ecc=bool(ecc[0]) if ecc else None,
            pcie_gen=g.get("pcie_gen"), pcie_width=g.get("pcie_width"),
            nvlink_up=sum(1 for lk in answered if lk["active"]) if answered else None))
    return gpus


def _csv_value(text: str):
    text = text.strip()
    return None if text in ("", "[N/A]", "N/A", "[Not Supported]", "Not Supported") else text


def _csv_int(text):
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def _csv_flag(text):
    return None if text is None else text.lower() in ("enabled", "on", "1", "yes")


def gpus_from_query_csv(text: str, fields=QUERY_FIELDS, cuda_version: str | None = None,
                        nvlink: dict | None = None) -> list:
    """GPU facts from ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = dict(zip(fields, (_csv_value(v) for v in line.split(","))))  # noqa: B905 (3.8)
        index = _csv_int(row.get("index"))
        gpus.append(_gpu(
            index, row.get("name") or "unknown", uuid=row.get("uuid"),
            memory_total_mb=_csv_int(row.get("memory.total")),
            compute_capability=row.get("compute_cap"),
            driver_version=row.get("driver_version"), cuda_driver_version=cuda_version,
            persistence=_csv_flag(row.get("persistence_mode")),
            ecc=_csv_flag(row.get("ecc.mode.current")),
            pcie_gen=_csv_int(row.get("pcie.link.gen.max")),
            pcie_width=_csv_int(row.get("pcie.link.width.max")),
            nvlink_up=(nvlink or {}).get(index)))
    return gpus


def cuda_version_from_smi_xml(xml_text: str) -> str | None:
    """The CUDA driver version from ``nvidia-smi -q -x`` (``<cuda_version>13.0</cuda_version>``)."""
    import xml.etree.ElementTree as ET

    node = ET.fromstring(xml_text).find("cuda_version")
    return node.text.strip() if node is not None and node.text else None


def nvlink_from_status(text: str) -> dict:
    """{gpu index: links up} from ``nvidia-smi nvlink --status``; GPUs without links are absent.

    The output lists ``GPU <i>: <name> (UUID: ...)`` followed by ``Link <n>: <speed>`` lines,
    ``<inactive>`` for a link that is down.
    """
    up = {}
    gpu = None
    for line in text.splitlines():
        m = re.match(r"\s*GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
            continue
        m = re.match(r"\s*Link \d+:\s*(.*)$", line)
        if m and gpu is not None:
            active = "inactive" not in m.group(1).lower()
            up[gpu] = up.get(gpu, 0) + int(active)
    return up


def _no_gpu(tried: list) -> dict:
    return {"source": None, "gpus": [], "error": f"no NVIDIA GPU ({'; '.join(tried)})"}


def gpu_facts(timeout: float) -> dict:
    """GPUs through NVML, else nvidia-smi; else none, with the reason of each attempt."""
    tried = []
    try:
        import pynvml  # nvidia-ml-py

        return {"source": "nvml", "gpus": gpus_from_nvml(nvml_raw(pynvml)), "error": None}
    except ImportError:
        tried.append(f"NVML: nvidia-ml-py is not installed for {sys.executable}")
    except Exception as exc:  # noqa: BLE001  NVMLError_LibraryNotFound, DriverNotLoaded, ...
        tried.append(f"NVML: {reason(exc)}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        tried.append("nvidia-smi: not found on PATH")
        return _no_gpu(tried)
    try:
        fields = QUERY_FIELDS
        try:
            csv = run_cmd([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                          timeout)
        except RuntimeError as exc:
            if "valid field" not in str(exc):
                raise
            fields = QUERY_FIELDS_BASIC
            csv = run_cmd([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                          timeout)
        try:
            cuda = cuda_version_from_smi_xml(run_cmd([smi, "-q", "-x"], timeout))
        except Exception:  # noqa: BLE001  the GPUs are known; only the CUDA version is lost
            cuda = None
        try:
            links = nvlink_from_status(run_cmd([smi, "nvlink", "--status"], timeout))
        except Exception:  # noqa: BLE001
            links = {}
        gpus = gpus_from_query_csv(csv, fields, cuda, links)
    except Exception as exc:  # noqa: BLE001
        tried.append(f"nvidia-smi: {reason(exc)}")
        return _no_gpu(tried)
    if not gpus:
        return {"source": "nvidia-smi", "gpus": [], "error": "no NVIDIA GPU (nvidia-smi lists none)"}
    return {"source": "nvidia-smi", "gpus": gpus, "error": None}


# ---------------------------------------------------------------- training interpreter

_VERSIONS = """
import json, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None
out = {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3], "packages": {}}
for name in PACKAGES:
    try:
        out["packages"][name] = metadata.version(name) if metadata else None
    except Exception:
        out["packages"][name] = None
print(json.dumps(out))
""".replace("PACKAGES", repr(PACKAGES))

_TORCH = """
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
try:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["nccl_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def _last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON in its output")


def python_facts(python: str | None, timeout: float, torch_timeout: float) -> dict:
    """The training interpreter and its torch/CUDA/NCCL/deepspeed/funasr/numpy versions.

    ``python`` is cluster.python (a venv or conda ``bin/python``); ``python3`` on PATH otherwise.
    Versions come from the installed distributions' metadata; torch is imported (in its own
    process, under ``torch_timeout``) only for its CUDA and NCCL versions.
    """
    facts = {"path": python or "python3", "executable": None, "version": None, "error": None,
             "torch": None, "torch_cuda": None, "nccl": None, "deepspeed": None, "funasr": None,
             "numpy": None, "torch_imported": False}
    exe = os.path.expanduser(python) if python else shutil.which("python3")
    if not exe or not (os.path.isfile(exe) or shutil.which(exe)):
        facts["error"] = "training Python %s not found" % (python or "python3 (on PATH)")
        return facts
    try:
        info = _last_json_line(run_cmd([exe, "-c", _VERSIONS], timeout))
    except Exception as exc:  # noqa: BLE001
        facts["error"] = f"cannot run {exe}: {reason(exc)}"
        return facts
    facts.update(executable=info["executable"], version=info["version"])
    facts.update({name: info["packages"].get(name) for name in PACKAGES})
    if facts["torch"] and torch_timeout > 0:
        try:
            t = _last_json_line(run_cmd([exe, "-c", _TORCH], torch_timeout))
            facts.update(torch_cuda=t["cuda"], nccl=t["nccl"], torch_imported=True)
        except subprocess.TimeoutExpired:
            facts["error"] = f"import torch took longer than {torch_timeout:g}s"
        except Exception as exc:  # noqa: BLE001
            facts["error"] = f"import torch failed: {reason(exc)}"
    return facts


# ---------------------------------------------------------------- the probe


def collect(args) -> dict:
    """All facts of this node; a fact that fails is None and its reason is in ``errors``."""
    started = time.monotonic()
    payload = {"version": PAYLOAD_VERSION, "errors": {}}

    def fact(key, fn):
        try:
            payload[key] = fn()
        except Exception as exc:  # noqa: BLE001  one fact never kills the probe
            payload[key] = None
            payload["errors"][key] = reason(exc)

    def mounts():
        return read_text("/proc/mounts")

    fact("hostname", socket.gethostname)
    fact("fqdn", socket.getfqdn)
    fact("machine_id", lambda: read_text("/etc/machine-id").strip())
    fact("boot_id", lambda: read_text("/proc/sys/kernel/random/boot_id").strip())
    fact("os", lambda: os_name(read_text("/etc/os-release")))
    fact("kernel", platform.release)
    fact("arch", platform.machine)
    fact("cpu_model", lambda: cpu_model(read_text("/proc/cpuinfo")) or platform.processor())
    fact("cpu_cores", os.cpu_count)
    fact("cpu_usable", lambda: len(os.sched_getaffinity(0)))
    fact("memory", lambda: meminfo_mb(read_text("/proc/meminfo")))
    fact("load", os.getloadavg)
    fact("disk_root", lambda: disk_usage_gb("/"))
    fact("disks", block_devices)
    fact("shared", lambda: shared_dir_facts(args.shared_dir, mounts()))
    fact("net", interfaces)
    fact("rdma", rdma_ports)
    fact("gpu", lambda: gpu_facts(args.cmd_timeout))
    fact("python", lambda: python_facts(args.python, args.cmd_timeout, args.torch_timeout))
    payload["probe_python"] = sys.executable
    payload["elapsed_s"] = round(time.monotonic() - started, 4)
    payload["clock"] = time.time()
    return payload


def tcp_rtts(targets: list, timeout: float) -> dict:
    """{name: {"ms": connect time, "error": reason}} for targets ``name=host:port``."""
    out = {}
    for target in targets:
        name, _, hostport = target.partition("=")
        host, _, port = hostport.rpartition(":")
        t0 = time.perf_counter()
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                out[name] = {"ms": round((time.perf_counter() - t0) * 1000, 3), "error": None}
        except (OSError, ValueError) as exc:
            out[name] = {"ms": None, "error": reason(exc)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="svconsole-probe", description=__doc__.split("\n")[0])
    p.add_argument("--nonce", required=True, help="marks the payload's begin and end lines")
    p.add_argument("--shared-dir", default="/data/shared")
    p.add_argument("--python", default=None, help="training interpreter (default: python3)")
    p.add_argument("--cmd-timeout", type=float, default=20.0, help="per helper program (s)")
    p.add_argument("--torch-timeout", type=float, default=60.0,
                   help="for importing torch (s); 0 skips it")
    p.add_argument("--rtt", nargs="*", metavar="NAME=HOST:PORT",
                   help="only time TCP connects to these targets")
    args = p.parse_args(argv)
    if args.rtt is not None:
        payload = {"version": PAYLOAD_VERSION, "rtt": tcp_rtts(args.rtt, args.cmd_timeout),
                   "clock": time.time()}
    else:
        payload = collect(args)
    begin, end = BEGIN.format(nonce=args.nonce), END.format(nonce=args.nonce)
    sys.stdout.write(f"\n{begin}\n{json.dumps(payload)}\n{end}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
