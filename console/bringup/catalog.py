"""The bring-up catalog: the seed guide's sections 3 and 7.1 as steps, without its mistakes.

Every step is data (:class:`console.bringup.model.Step`); its commands are built from the cluster
and the options, so a dry run shows exactly what each node will run. What differs from the
seed, on purpose: no ``tcp_congestion_control=rdma`` (Linux has no such algorithm), the shared
directory belongs to a group with mode 2775 instead of ``chmod 777``, the NFS export names the
cluster's own nodes instead of ``*``, every file edit replaces its line instead of appending
(``tee -a``), and the package pins come from a chosen profile.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath

from console.bringup import measure
from console.bringup.model import (
    EXIT_NEEDS_REBOOT,
    EXIT_NOT_APPLICABLE,
    Command,
    Phase,
    SetupOptions,
    Step,
    StepContext,
    head_node,
    nccl_env_file,
    says,
)
from console.bringup.profiles import get_profile
from console.cluster.model import Cluster

q = shlex.quote
APT = "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600"
EDITS_NAME = "console/bringup/edits.py"


def node_program(name: str) -> str:
    """The text of a stdlib-only module of this package (``edits.py``, ``reqcheck.py``), sent
    to a node's Python on stdin."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


def shell_path(path: str) -> str:
    """``path`` quoted for the node's shell, with a leading ``~/`` left to the node's $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + q(path[2:])
    return q(path)


def edit(op: str, path: str, *args: str, check: bool = False, **flags: str) -> Command:
    """A call of the edits program on the node (``ensure-line`` or ``ensure-block``)."""
    words = ["python3", "-", op, shell_path(path), *(q(a) for a in args)]
    for name, value in flags.items():
        words += [f"--{name}", q(value)]
    if check:
        words.append("--check")
    return Command(" ".join(words), stdin=node_program("edits.py"), stdin_name=EDITS_NAME)


def dpkg_installed(package: str) -> str:
    return (f"dpkg-query -W -f='${{Status}}' {q(package)} 2>/dev/null "
            f"| grep -q 'install ok installed'")


def apt_install(*packages: str) -> Command:
    """Install with apt unless already installed; waits up to 10 min for another apt's lock."""
    names = " ".join(q(p) for p in packages)
    installed = " && ".join(dpkg_installed(p) for p in packages)
    return Command(f"{installed} || {{ {APT} update -q && {APT} install -y -q {names}; }}")


# --------------------------------------------------------------------------------- software


def _build_essential_check(ctx: StepContext) -> list[Command]:
    return [Command(dpkg_installed("build-essential"))]


def _build_essential_apply(ctx: StepContext) -> list[Command]:
    return [apt_install("build-essential")]


def _build_essential_verify(ctx: StepContext) -> list[Command]:
    return [Command("gcc --version | head -n 1 && make --version | head -n 1")]


NVIDIA_PRESENT = "grep -qsx 0x10de /sys/bus/pci/devices/*/vendor"


def driver_package(options: SetupOptions) -> str:
    return f"nvidia-driver-{options.driver}-server"


def _driver_check(ctx: StepContext) -> list[Command]:
    return [Command(
        f"if ! {NVIDIA_PRESENT}; then echo 'no NVIDIA GPU on this node: no driver needed'; "
        f"exit {EXIT_NOT_APPLICABLE}; fi; "
        "nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader"
    )]


def _driver_apply(ctx: StepContext) -> list[Command]:
    return [apt_install(driver_package(ctx.options))]


def _driver_verify(ctx: StepContext) -> list[Command]:
    package = driver_package(ctx.options)
    return [Command(
        "if nvidia-smi -L; then exit 0; fi; "
        f"if {dpkg_installed(package)}; then "
        f"echo {q(package + ' is installed but its kernel module is not loaded: reboot the node')}; "
        f"exit {EXIT_NEEDS_REBOOT}; fi; "
        f"echo {q(package + ' is not installed')}; exit 1"
    )]


def env_path(ctx: StepContext) -> str:
    """The training environment's directory on this node."""
    options = ctx.options
    if options.env_path:
        return ctx.path(options.env_path)
    if ctx.cluster.python:
        return str(PurePosixPath(ctx.cluster.python).parent.parent)
    return "~/sensevoice-env"


def env_python(ctx: StepContext) -> str:
    return shell_path(env_path(ctx) + "/bin/python")


def _env_check(ctx: StepContext) -> list[Command]:
    py = env_python(ctx)
    return [Command(f"test -x {py} && {py} -c 'import sys; print(sys.prefix, sys.version.split()[0])'")]


def _env_apply(ctx: StepContext) -> list[Command]:
    options, path = ctx.options, env_path(ctx)
    parent = shell_path(str(PurePosixPath(path).parent))
    if options.env_kind == "conda":
        create = (f"{q(options.conda)} create -y -p {shell_path(path)} "
                  f"python={q(options.python_version)}")
    else:
        flag = "" if options.venv_with_pip else " --without-pip"
        create = f"{q(ctx.path(options.base_python))} -m venv{flag} {shell_path(path)}"
    return [Command(f"mkdir -p {parent} && {create}")]


def _requirements(ctx: StepContext) -> tuple[str, ...]:
    return get_profile(ctx.options.profile).requirements


def _packages_check(ctx: StepContext) -> list[Command]:
    reqs = " ".join(q(r) for r in _requirements(ctx))
    return [Command(f"{env_python(ctx)} - {reqs}", stdin=node_program("reqcheck.py"),
                    stdin_name="console/bringup/reqcheck.py")]


def _packages_apply(ctx: StepContext) -> list[Command]:
    return [pip_install(ctx, _requirements(ctx))]


def pip_install(ctx: StepContext, requirements: tuple[str, ...]) -> Command:
    """pip install ``requirements`` into the training environment (offline options kept)."""
    options = ctx.options
    if options.env_kind == "venv" and not options.venv_with_pip:
        pip = f"{q(ctx.path(options.base_python))} -m pip --python {env_python(ctx)}"
    else:
        pip = f"{env_python(ctx)} -m pip"
    words = [pip, "install", "--disable-pip-version-check", "--progress-bar", "off"]
    if options.no_index:
        words.append("--no-index")
    if options.find_links:
        words += ["--find-links", shell_path(ctx.path(options.find_links))]
    words += [q(r) for r in requirements]
    return Command(" ".join(words))


PYSPY = "py-spy>=0.4"
"""What ``svconsole stacks`` needs beside the training Python (a binary wheel from PyPI)."""


def _pyspy(ctx: StepContext) -> str:
    return shell_path(env_path(ctx) + "/bin/py-spy")


def _pyspy_check(ctx: StepContext) -> list[Command]:
    return [Command(f"{_pyspy(ctx)} --version")]


def _pyspy_verify(ctx: StepContext) -> list[Command]:
    # py-spy attaches with ptrace: root may; others need kernel.yama.ptrace_scope 0 or the
    # capability. Said here (not failed): the setting is the operator's to change.
    scope = "/proc/sys/kernel/yama/ptrace_scope"
    note = (f'if [ "$(id -u)" != 0 ] && [ -r {scope} ] && [ "$(cat {scope})" != 0 ]; then '
            f'echo "note: kernel.yama.ptrace_scope is $(cat {scope}): py-spy cannot attach to '
            f'the ranks as $(id -un); run: sudo sysctl -w kernel.yama.ptrace_scope=0 (persist '
            f'in /etc/sysctl.d/10-ptrace.conf) or: sudo setcap cap_sys_ptrace+ep '
            f'{env_path(ctx)}/bin/py-spy"; fi')
    return [Command(f"{_pyspy(ctx)} --version && {{ {note}; }}")]


def _env_changes(cluster: Cluster, options: SetupOptions) -> str:
    return f"creates the training {options.env_kind} (path {options.env_path or 'from cluster.python'})"


def _packages_changes(cluster: Cluster, options: SetupOptions) -> str:
    profile = get_profile(options.profile)
    return f"pip installs profile {profile.name!r} into the training env: {profile.pins()}"


# --------------------------------------------------------------------------------- NFS


def nfs_path(cluster: Cluster) -> str:
    """shared_dir as a field of /etc/exports and /etc/fstab, which split lines at blanks and take
    ``#`` for a comment: such a path is refused (the loader refuses it too), never half-written."""
    shared = cluster.shared_dir
    if re.search(r"[\s#\"'\\]", shared) or any(ord(c) < 32 for c in shared):
        raise ValueError(f"shared_dir {shared!r}: /etc/exports and /etc/fstab cannot hold a path "
                         f"with blanks, quotes, '#' or backslashes")
    return shared


def nfs_clients(cluster: Cluster) -> list[str]:
    """The export's clients: every other node's address (never a wildcard)."""
    head = head_node(cluster)
    clients = []
    for node in cluster.nodes:
        if node.name == head.name or node.host in clients:
            continue
        if any(c in node.host for c in "*?[]/ "):
            raise ValueError(f"node {node.name}: host {node.host!r} cannot be an NFS client name")
        clients.append(node.host)
    return clients


def exports_block(cluster: Cluster, options: SetupOptions) -> str:
    """The lines svconsole keeps in /etc/exports: one per client node."""
    return "\n".join(f"{nfs_path(cluster)} {c}({options.export_options})"
                     for c in nfs_clients(cluster))


def _exported(shared: str) -> str:
    return rf"^{re.escape(shared)}\s"


def _nfs_server_check(ctx: StepContext) -> list[Command]:
    shared, group = ctx.cluster.shared_dir, ctx.options.shared_group
    if not nfs_clients(ctx.cluster):
        return [Command(f"echo 'one-node cluster: nothing to export'; exit {EXIT_NOT_APPLICABLE}")]
    return [
        Command(dpkg_installed("nfs-kernel-server")),
        Command(f'[ "$(stat -c %G:%a {q(shared)})" = {q(group + ":2775")} ]'),
        edit("ensure-block", ctx.options.exports_file, "shared", exports_block(ctx.cluster, ctx.options),
             check=True, drop=_exported(shared)),
        Command(f"exportfs -s | grep -q -- ^{q(shared)}"),
    ]


def _nfs_server_apply(ctx: StepContext) -> list[Command]:
    shared, group = q(ctx.cluster.shared_dir), q(ctx.options.shared_group)
    return [
        apt_install("nfs-kernel-server"),
        Command(f"getent group {group} >/dev/null || groupadd --system {group}"),
        Command(f"mkdir -p {shared} && chgrp {group} {shared} && chmod 2775 {shared}"),
        edit("ensure-block", ctx.options.exports_file, "shared", exports_block(ctx.cluster, ctx.options),
             drop=_exported(ctx.cluster.shared_dir)),
        Command("exportfs -ra"),
    ]


def _nfs_server_verify(ctx: StepContext) -> list[Command]:
    shared = q(ctx.cluster.shared_dir)
    return [Command(
        f"exportfs -s | grep -- ^{shared} && "
        f"if exportfs -s | grep -- ^{shared} | grep -q '\\*'; then "
        f"echo 'exported to a wildcard'; exit 1; fi"
    )]


def _nfs_server_changes(cluster: Cluster, options: SetupOptions) -> str:
    return (f"installs nfs-kernel-server; {cluster.shared_dir} owned by group "
            f"{options.shared_group}, mode 2775; {options.exports_file} block: "
            f"{exports_block(cluster, options)!r} (other exports of that directory are removed)")


def fstab_line(cluster: Cluster, options: SetupOptions) -> str:
    shared = nfs_path(cluster)
    return f"{head_node(cluster).host}:{shared} {shared} nfs {options.mount_options} 0 0"


def _fstab_match(shared: str) -> str:
    return rf"^\S+\s+{re.escape(shared)}\s"


def _fstab_edit(ctx: StepContext, check: bool) -> Command:
    shared = ctx.cluster.shared_dir
    return edit("ensure-line", ctx.options.fstab_file, fstab_line(ctx.cluster, ctx.options),
                check=check, match=_fstab_match(shared))


def _nfs_mount_check(ctx: StepContext) -> list[Command]:
    return [Command(f"findmnt -n -t nfs,nfs4 {q(ctx.cluster.shared_dir)}"), _fstab_edit(ctx, True)]


def _nfs_mount_apply(ctx: StepContext) -> list[Command]:
    shared = q(ctx.cluster.shared_dir)
    return [
        apt_install("nfs-common"),
        Command(f"mkdir -p {shared}"),
        _fstab_edit(ctx, False),
        Command(f"mountpoint -q {shared} || mount {shared}"),
    ]


def _nfs_mount_verify(ctx: StepContext) -> list[Command]:
    """The mount is there and writable: a new file of its own (mktemp: O_EXCL, a random name;
    the group shares the directory, so a fixed name could be a planted symlink), removed."""
    shared = q(ctx.cluster.shared_dir)
    probe = q(f".svconsole-mount-{ctx.node.name}.XXXXXXXX")
    return [Command(f"findmnt -n -o FSTYPE,SOURCE {shared} && "
                    f"probe=$(mktemp -p {shared} {probe}) && rm -f -- \"$probe\"")]


def _nfs_mount_changes(cluster: Cluster, options: SetupOptions) -> str:
    return f"installs nfs-common; {options.fstab_file} line {fstab_line(cluster, options)!r}; mounts it"


# --------------------------------------------------------------------------------- tuning


def sysctl_settings(options: SetupOptions) -> dict[str, str]:
    """Socket buffer limits for fast TCP between nodes (valid keys and values only; the seed's
    ``tcp_congestion_control=rdma`` is not one: RDMA bypasses TCP, tune it with NCCL_IB_*)."""
    top = options.socket_buffer_max
    return {
        "net.core.rmem_max": str(top),
        "net.core.wmem_max": str(top),
        "net.ipv4.tcp_rmem": f"4096 87380 {top}",
        "net.ipv4.tcp_wmem": f"4096 65536 {top}",
    }


def sysctl_body(options: SetupOptions) -> str:
    return "\n".join(f"{k} = {v}" for k, v in sysctl_settings(options).items())


def _sysctl_values_match(options: SetupOptions) -> Command:
    tests = [f'[ "$(sysctl -n {k} | xargs)" = {q(v)} ]'  # xargs: tabs -> single spaces
             for k, v in sysctl_settings(options).items()]
    return Command(" && ".join(tests))


def _sysctl_check(ctx: StepContext) -> list[Command]:
    o = ctx.options
    return [edit("ensure-block", o.sysctl_file, "net-tuning", sysctl_body(o), check=True),
            _sysctl_values_match(o)]


def _sysctl_apply(ctx: StepContext) -> list[Command]:
    o = ctx.options
    return [edit("ensure-block", o.sysctl_file, "net-tuning", sysctl_body(o)),
            Command(f"sysctl -p {q(o.sysctl_file)}")]


def _sysctl_verify(ctx: StepContext) -> list[Command]:
    return [_sysctl_values_match(ctx.options)]


def _nccl_command(ctx: StepContext, check: bool) -> Command:
    # The body: the node's own interface (found below, in $iface) in double quotes, everything
    # from the options single-quoted for this shell and quoted again for the shell that sources
    # the file, so no value is ever run by either.
    fixed = "\n".join([f"export NCCL_DEBUG={q(ctx.options.nccl_debug)}",
                       "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"])
    master = q(ctx.cluster.master_node.host)
    detect = (
        f"addr=$(getent ahostsv4 {master} | awk 'NR==1{{print $1}}'); "
        "iface=$(ip -o route get \"${addr:-127.0.0.1}\" | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'); "
        '[ -n "$iface" ] || { echo "no route to the master"; exit 1; }; '
        "hcas=$(ls /sys/class/infiniband 2>/dev/null | paste -sd, -); "
        'if [ -n "$hcas" ]; then '
        "ib=$(printf 'export NCCL_IB_DISABLE=0\\nexport NCCL_IB_HCA=%s' \"$hcas\"); "
        'else ib="export NCCL_IB_DISABLE=1"; fi; '
        "body=" + q("# svconsole setup (nccl-env): source this before torchrun\n")
        + '"export NCCL_SOCKET_IFNAME=\\"$iface\\"\nexport GLOO_SOCKET_IFNAME=\\"$iface\\"\n"'
        + q(fixed + "\n") + '"$ib"; '
    )
    path = nccl_env_file(ctx.cluster, ctx.node.name)
    tail = " --check" if check else ""
    return Command(f'{detect}python3 - ensure-block {q(path)} nccl "$body"{tail}',
                   stdin=node_program("edits.py"), stdin_name=EDITS_NAME)


def _nccl_check(ctx: StepContext) -> list[Command]:
    return [_nccl_command(ctx, True)]


def _nccl_apply(ctx: StepContext) -> list[Command]:
    return [_nccl_command(ctx, False)]


def _nccl_verify(ctx: StepContext) -> list[Command]:
    path = q(nccl_env_file(ctx.cluster, ctx.node.name))
    return [Command(f'( . {path} && echo "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME" '
                    f'&& ip link show "$NCCL_SOCKET_IFNAME" >/dev/null )')]


# --------------------------------------------------------------------------------- SSH


def _key_file(ctx: StepContext) -> str:
    return ctx.path(ctx.options.ssh_dir) + "/id_ed25519"


def _ssh_key_check(ctx: StepContext) -> list[Command]:
    return [Command(f"test -s {shell_path(_key_file(ctx) + '.pub')}")]


def _ssh_key_apply(ctx: StepContext) -> list[Command]:
    """Make the key under a lock: nodes that share a home directory (NFS) race otherwise."""
    key = shell_path(_key_file(ctx))
    folder = shell_path(ctx.path(ctx.options.ssh_dir))
    return [Command(f"mkdir -p -m 700 {folder} && ( flock 9 && {{ test -s {key}.pub || "
                    f"ssh-keygen -q -t ed25519 -N '' -C \"svconsole@$(hostname)\" -f {key} "
                    f"</dev/null; }} ) 9>{folder}/.svconsole-keygen.lock")]


def _ssh_key_verify(ctx: StepContext) -> list[Command]:
    return [Command(f"ssh-keygen -l -f {shell_path(_key_file(ctx) + '.pub')}")]


_PUBKEY = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-[a-z0-9-]+)\s+([A-Za-z0-9+/=]+)(\s.*)?$")


def public_key(text: str) -> str | None:
    """The last public-key line in ``text`` (a login banner may print before it)."""
    keys = [line.strip() for line in text.splitlines() if _PUBKEY.match(line.strip())]
    return keys[-1] if keys else None


def _peer_keys(ctx: StepContext) -> list[tuple[str, str]]:
    """(node, key line) of every other node, or a placeholder in a dry run."""
    out = []
    for name in ctx.cluster.names():
        if name == ctx.node.name:
            continue
        text = ctx.gathered.get(name)
        key = public_key(text) if text is not None else None
        out.append((name, key or f"<public key of {name}>"))
    return out


def _authorized(ctx: StepContext, check: bool) -> list[Command]:
    path = ctx.path(ctx.options.ssh_dir) + "/authorized_keys"
    commands = []
    for _name, key in _peer_keys(ctx):
        m = _PUBKEY.match(key)
        match = rf"^{re.escape(m.group(1))}\s+{re.escape(m.group(2))}(\s|$)" if m else re.escape(key)
        commands.append(edit("ensure-line", path, key, check=check, match=match, mode="600"))
    return commands


def _ssh_gather(ctx: StepContext) -> list[Command]:
    return [Command(f"cat {shell_path(_key_file(ctx) + '.pub')}")]


def _ssh_trust_verify(ctx: StepContext) -> list[Command]:
    commands = []
    for name in ctx.cluster.names():
        if name == ctx.node.name:
            continue
        node = ctx.cluster.node(name)
        user = f"{node.user}@" if node.user else ""
        commands.append(Command(
            f"ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=5 "
            f"-p {node.port} {q(user + node.host)} true && echo {q(f'ssh to {name}: ok')}"))
    return commands


# --------------------------------------------------------------------------------- catalog


STEPS: tuple[Step, ...] = (
    Step("build-essential", "Build tools (build-essential)", Phase.SOFTWARE, needs_root=True,
         changes=says("apt-get installs build-essential"),
         check=_build_essential_check, apply=_build_essential_apply,
         verify=_build_essential_verify, timeout=1800),
    Step("nvidia-driver", "NVIDIA server driver", Phase.SOFTWARE, needs_root=True,
         destructive=True,
         changes=lambda c, o: f"apt-get installs {driver_package(o)} (a kernel module: "
                              f"the node may need a reboot)",
         check=_driver_check, apply=_driver_apply, verify=_driver_verify, timeout=3600),
    Step("python-env", "Training Python environment", Phase.SOFTWARE,
         changes=_env_changes, check=_env_check, apply=_env_apply, verify=_env_check,
         timeout=900),
    Step("python-packages", "Training packages (profile)", Phase.SOFTWARE,
         depends=("python-env",), changes=_packages_changes,
         check=_packages_check, apply=_packages_apply, verify=_packages_check, timeout=3600),
    Step("py-spy", "py-spy for svconsole stacks", Phase.SOFTWARE, depends=("python-env",),
         changes=lambda c, o: f"pip installs {PYSPY} into the training env",
         check=_pyspy_check, apply=lambda ctx: [pip_install(ctx, (PYSPY,))],
         verify=_pyspy_verify, timeout=900),
    Step("nfs-server", "NFS export of shared_dir (head)", Phase.SOFTWARE, targets="head",
         needs_root=True, destructive=True, changes=_nfs_server_changes,
         check=_nfs_server_check, apply=_nfs_server_apply, verify=_nfs_server_verify),
    Step("nfs-mount", "NFS mount of shared_dir (workers)", Phase.SOFTWARE, targets="workers",
         depends=("nfs-server",), needs_root=True, destructive=True,
         changes=_nfs_mount_changes,
         check=_nfs_mount_check, apply=_nfs_mount_apply, verify=_nfs_mount_verify),
    *measure.STEPS,
    Step("net-tuning", "Network socket buffers (sysctl)", Phase.CONFIGURATION, needs_root=True,
         changes=lambda c, o: f"writes {o.sysctl_file}: {sysctl_body(o)!r}; sysctl -p",
         check=_sysctl_check, apply=_sysctl_apply, verify=_sysctl_verify),
    Step("nccl-env", "NCCL environment file", Phase.CONFIGURATION,
         changes=lambda c, o: f"writes {nccl_env_file(c, '<node>')}",
         check=_nccl_check, apply=_nccl_apply, verify=_nccl_verify),
    Step("ssh-key", "SSH key of each node", Phase.CONFIGURATION,
         changes=lambda c, o: f"creates {o.ssh_dir}/id_ed25519 where missing",
         check=_ssh_key_check, apply=_ssh_key_apply, verify=_ssh_key_verify),
    Step("ssh-trust", "Passwordless SSH between nodes", Phase.CONFIGURATION,
         depends=("ssh-key",),
         changes=lambda c, o: f"adds the other nodes' keys to {o.ssh_dir}/authorized_keys",
         gather=_ssh_gather, check=lambda ctx: _authorized(ctx, True),
         apply=lambda ctx: _authorized(ctx, False), verify=_ssh_trust_verify),
    measure.MASTER_PORT,
)

CATALOG: dict[str, Step] = {s.id: s for s in STEPS}


def get_steps(ids: list[str] | None = None) -> list[Step]:
    """The named steps in catalog order (all when ``ids`` is None); ValueError for unknown ids."""
    if ids is None:
        return list(STEPS)
    unknown = [i for i in ids if i not in CATALOG]
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(unknown)}; known: {', '.join(CATALOG)}")
    return [s for s in STEPS if s.id in ids]
