"""Bring-up steps without SSH: the generated commands run for real on this machine against
temporary copies of /etc/exports, /etc/fstab, the sysctl file and authorized_keys (twice: one
line each), the NCCL env file, the driver check on a machine without NVIDIA GPU, and the
node-side burn-in script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from console.bringup import edits
from console.bringup.catalog import CATALOG, get_steps, sysctl_settings
from console.bringup.measure import flag_slow, latency_verdict
from console.bringup.model import (
    EXIT_NOT_APPLICABLE,
    Command,
    Phase,
    SetupOptions,
    Step,
    StepContext,
    nccl_env_file,
)
from console.bringup.runner import order_steps
from console.cluster.model import load_cluster

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
BIN = str(Path(sys.executable).parent)

CLUSTER = """\
cluster:
  name: t
  shared_dir: {shared}
  master: head
  master_port: 29500
nodes:
  - name: head
    host: 127.0.0.1
    role: head
  - name: w1
    host: 10.0.0.2
  - name: w2
    host: 10.0.0.3
"""

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa svconsole@head"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb svconsole@w1"


@pytest.fixture
def cluster(tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(shared=tmp_path / "shared"))
    return load_cluster(path)


def run(command: Command) -> subprocess.CompletedProcess[str]:
    """Run a step's command here, as a node would (python3 is this test's interpreter)."""
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", command.text], input=command.stdin or "", text=True,
                          capture_output=True, env=env, timeout=60)


def edit_commands(commands: list[Command]) -> list[Command]:
    return [c for c in commands if c.stdin_name == "console/bringup/edits.py"]


def ctx(cluster, node: str, options: SetupOptions, gathered=None) -> StepContext:
    return StepContext(cluster, cluster.node(node), options, gathered or {})


def test_exports_edit_twice_one_line_per_client_and_no_wildcard(cluster, tmp_path) -> None:
    exports = tmp_path / "exports"
    shared = cluster.shared_dir
    exports.write_text(f"/home 10.0.0.0/8(ro)\n{shared} *(rw,sync,no_subtree_check)\n")
    options = SetupOptions(exports_file=str(exports))
    step = CATALOG["nfs-server"]
    check = edit_commands(step.check(ctx(cluster, "head", options)))[0]
    assert run(check).returncode == 1  # needs the change
    for _ in range(2):
        for command in edit_commands(step.apply(ctx(cluster, "head", options))):
            assert run(command).returncode == 0
    lines = exports.read_text().splitlines()
    assert "/home 10.0.0.0/8(ro)" in lines
    for host in ("10.0.0.2", "10.0.0.3"):
        assert lines.count(f"{shared} {host}(rw,sync,no_subtree_check)") == 1
    assert not any("*" in line for line in lines)
    assert lines.count("# BEGIN svconsole shared") == 1
    assert not any("127.0.0.1" in line for line in lines)  # the head does not export to itself
    assert run(check).returncode == 0


def test_fstab_edit_replaces_old_mount_and_stays_one_line(cluster, tmp_path) -> None:
    fstab = tmp_path / "fstab"
    shared = cluster.shared_dir
    fstab.write_text(f"UUID=abc / ext4 defaults 0 1\n10.9.9.9:{shared} {shared} nfs defaults 0 0\n")
    options = SetupOptions(fstab_file=str(fstab))
    step = CATALOG["nfs-mount"]
    for _ in range(2):
        for command in edit_commands(step.apply(ctx(cluster, "w1", options))):
            assert run(command).returncode == 0, command.text
    lines = fstab.read_text().splitlines()
    assert lines == ["UUID=abc / ext4 defaults 0 1",
                     f"127.0.0.1:{shared} {shared} nfs defaults,_netdev 0 0"]
    check = edit_commands(step.check(ctx(cluster, "w1", options)))
    assert [run(c).returncode for c in check] == [0]


def test_sysctl_file_twice_one_block_valid_keys_no_rdma(cluster, tmp_path) -> None:
    conf = tmp_path / "90-svconsole.conf"
    options = SetupOptions(sysctl_file=str(conf))
    step = CATALOG["net-tuning"]
    for _ in range(2):
        for command in edit_commands(step.apply(ctx(cluster, "w2", options))):
            assert run(command).returncode == 0
    text = conf.read_text()
    assert not re.search(r"tcp_congestion_control\s*=\s*rdma", text)
    settings = dict(line.split(" = ") for line in text.splitlines() if " = " in line)
    assert settings == sysctl_settings(options)
    for key, value in settings.items():
        assert Path("/proc/sys", *key.split(".")).exists(), f"{key} is not a kernel setting"
        assert all(word.isdigit() for word in value.split())
    assert text.count("# BEGIN svconsole net-tuning") == 1


def test_authorized_keys_from_gathered_keys_twice(cluster, tmp_path) -> None:
    options = SetupOptions(ssh_dir=str(tmp_path / "{node}"))
    banner = "Welcome to w2 (banner noise)\n"
    gathered = {"head": KEY_A + "\n", "w1": banner + KEY_B + "\n", "w2": "ssh-ed25519 AAAAC3x c\n"}
    step = CATALOG["ssh-trust"]
    keys = tmp_path / "w2" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_text(KEY_A.replace("svconsole@head", "old-comment") + "\n")
    for _ in range(2):
        for command in step.apply(ctx(cluster, "w2", options, gathered)):
            assert run(command).returncode == 0
    lines = keys.read_text().splitlines()
    assert lines == [KEY_A, KEY_B]  # the old comment's line was replaced, not duplicated
    assert keys.stat().st_mode & 0o777 == 0o644  # an existing file keeps its mode
    assert all(run(c).returncode == 0 for c in step.check(ctx(cluster, "w2", options, gathered)))
    for command in step.apply(ctx(cluster, "w1", options, gathered)):
        assert run(command).returncode == 0
    fresh = tmp_path / "w1" / "authorized_keys"
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.read_text().splitlines() == [KEY_A, "ssh-ed25519 AAAAC3x c"]


def test_ensure_line_and_block_text() -> None:
    text = "a 1\nb 2\na 3\n"
    once = edits.ensure_line_text(text, "a 9", match=r"^a\s")
    assert once == "a 9\nb 2\n"
    assert edits.ensure_line_text(once, "a 9", match=r"^a\s") == once
    block = edits.ensure_block_text("x\n", "t", "k = 1")
    again = edits.ensure_block_text(block, "t", "k = 2")
    assert again == "x\n# BEGIN svconsole t\nk = 2\n# END svconsole t\n"


def test_edits_program_check_mode_on_missing_file(tmp_path) -> None:
    target = tmp_path / "sub" / "f.conf"
    argv = ["ensure-line", str(target), "x = 1", "--check"]
    assert edits.main(argv) == 1 and not target.exists()
    assert edits.main(argv[:-1]) == 0 and target.read_text() == "x = 1\n"
    assert edits.main(argv) == 0


def test_nccl_env_file_written_once_with_a_real_interface(cluster, tmp_path) -> None:
    options = SetupOptions()
    step = CATALOG["nccl-env"]
    c = ctx(cluster, "w1", options)
    assert run(step.check(c)[0]).returncode == 1
    for _ in range(2):
        result = run(step.apply(c)[0])
        assert result.returncode == 0, result.stderr
    text = Path(nccl_env_file(cluster, "w1")).read_text()
    iface = re.search(r'NCCL_SOCKET_IFNAME="([^"]+)"', text).group(1)
    assert Path("/sys/class/net", iface).exists()
    assert "NCCL_TIMEOUT" not in text and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text
    assert re.search(r"NCCL_IB_(DISABLE|HCA)=", text)
    assert run(step.check(c)[0]).returncode == 0
    assert run(step.verify(c)[0]).returncode == 0


@pytest.mark.skipif(Path("/proc/driver/nvidia").exists(), reason="this machine has a GPU driver")
def test_driver_check_says_not_applicable_without_nvidia_gpu(cluster) -> None:
    step = CATALOG["nvidia-driver"]
    c = ctx(cluster, "w1", SetupOptions(driver="535"))
    result = run(step.check(c)[0])
    if "no NVIDIA GPU" in result.stdout:
        assert result.returncode == EXIT_NOT_APPLICABLE
    assert run(step.verify(c)[0]).returncode not in (0,)  # no driver here: never "done"
    assert "nvidia-driver-535-server" in step.apply(c)[0].text


def test_python_packages_check_reads_installed_versions(cluster) -> None:
    options = SetupOptions(env_path=str(Path(sys.executable).parent.parent), profile="seed-2024")
    result = run(CATALOG["python-packages"].check(ctx(cluster, "w1", options))[0])
    # torch here is far newer than the seed's torch<=2.3: the check must say so and fail
    assert result.returncode == 1
    assert re.search(r"^torch \S+: does not match torch<=2.3$", result.stdout, re.M)


def test_step_targets_and_dependency_order(cluster) -> None:
    assert CATALOG["nfs-server"].nodes(cluster) == ["head"]
    assert CATALOG["nfs-mount"].nodes(cluster) == ["w1", "w2"]
    ordered = [s.id for s in order_steps(list(reversed(get_steps(["python-env",
                                                                   "python-packages"]))))]
    assert ordered == ["python-env", "python-packages"]
    a = Step("a", "A", Phase.SOFTWARE, depends=("b",))
    b = Step("b", "B", Phase.SOFTWARE, depends=("a",))
    with pytest.raises(ValueError, match="cycle"):
        order_steps([a, b])
    with pytest.raises(ValueError, match="unknown step"):
        get_steps(["nope"])


def test_burnin_without_gpu_says_so() -> None:
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, str(SCRIPTS / "burnin.py"), "--seconds", "0.1"],
                            capture_output=True, text=True, timeout=120)
    line = next(t for t in result.stdout.splitlines() if t.startswith("SVBURN "))
    report = json.loads(line[7:])
    import torch

    if torch.cuda.is_available():
        assert report["gpus"] and all(g["tflops"] for g in report["gpus"])
    else:
        assert result.returncode == 0 and report["gpus"] == []
        assert "no CUDA GPU" in report["note"]


def test_slow_gpu_flagged_against_peers_and_latency_verdicts() -> None:
    gpus = [{"node": f"n{i // 4}", "index": i % 4, "tflops": {"bf16": 600.0 + i}}
            for i in range(8)]
    gpus[5]["tflops"]["bf16"] = 300.0
    flagged = flag_slow(gpus, 0.8)
    assert len(flagged) == 1 and flagged[0].startswith("n1 GPU 1: bf16 300.0")
    assert "RDMA" in latency_verdict(45.0)
    assert "slow" in latency_verdict(500.0)


def test_collective_bus_bandwidth_formula() -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import collective_bench
    finally:
        sys.path.remove(str(SCRIPTS))
    assert collective_bench.bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert collective_bench.bus_bandwidth(10.0, 2) == pytest.approx(10.0)


def test_ssh_key_made_once_by_nodes_sharing_a_home(cluster, tmp_path) -> None:
    options = SetupOptions(ssh_dir=str(tmp_path / "ssh"))
    step = CATALOG["ssh-key"]
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    commands = [step.apply(ctx(cluster, n, options))[0] for n in ("w1", "w2")]
    procs = [subprocess.Popen(["bash", "-c", c.text], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    public = (tmp_path / "ssh" / "id_ed25519.pub").read_text()
    assert public.startswith("ssh-ed25519 ") and public.count("\n") == 1
    assert run(step.check(ctx(cluster, "w1", options))[0]).returncode == 0
    assert run(step.verify(ctx(cluster, "w1", options))[0]).returncode == 0
