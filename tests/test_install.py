"""The README's install is what CI tests: the wheel that a plain ``pip install .`` builds ships
every package, data file and node-side script, and once installed into a fresh venv outside the
repository, ``svconsole`` starts from another directory, opens screens 1-5 and help, and its
headless commands run, all without a traceback.

The editable install the rest of the suite uses reads the modules from the checkout, so it can
never see a package left out of the wheel: these tests build and install the real one."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from tmux import Tmux

REPO = Path(__file__).resolve().parent.parent
#: What a build reads besides the packages (pyproject's ``readme``); copied with them.
BUILD_FILES = ("setup.py", "pyproject.toml", "README.md")
PACKAGE_ROOTS = ("console", "screens")
SCRIPTS = "scripts"
#: Never part of a package, wherever they lie.
JUNK = ("__pycache__", "*.pyc", "*.egg-info")
#: The error panel of a screen that failed (screens/broken.py) says this.
BROKEN_SCREEN = "The other screens keep working"


def build_wheel(out: Path, *, without: tuple[str, ...] = ()) -> Path:
    """Build the wheel from a fresh copy of the sources (less the files ``without`` names), so
    that a stale ``build/`` or egg-info of the checkout, which may still list a module left out
    since, cannot hide a missing package."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in BUILD_FILES:
        shutil.copy2(REPO / name, src / name)
    for name in (*PACKAGE_ROOTS, SCRIPTS):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns(*JUNK))
    for name in without:
        (src / name).unlink()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(src), "-w", str(out / "wheel")],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}\n{result.stderr}"
    wheels = list((out / "wheel").glob("svconsole-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def package_files() -> dict[str, Path]:
    """{path in the wheel: file in the checkout} for every file of every package of console/
    and screens/ (a directory with an ``__init__.py``): modules, styles, data."""
    files: dict[str, Path] = {}
    for root in PACKAGE_ROOTS:
        for init in (REPO / root).rglob("__init__.py"):
            package = init.parent
            if any(part == "__pycache__" for part in package.parts):
                continue
            for path in package.iterdir():
                if path.is_file() and path.suffix != ".pyc":
                    files[path.relative_to(REPO).as_posix()] = path
            # data directories without an __init__.py (console/data) belong to their package
            for sub in package.iterdir():
                if sub.is_dir() and sub.name != "__pycache__" and not (sub / "__init__.py").exists():
                    for path in sub.rglob("*"):
                        if path.is_file() and "__pycache__" not in path.parts:
                            files[path.relative_to(REPO).as_posix()] = path
    return files


def used_scripts() -> set[str]:
    """The files of scripts/ that console/ or screens/ name: as a string (``"probe.py"``) or as
    a module of ``svconsole_scripts``, the name scripts/ is installed under."""
    code = "\n".join(p.read_text(encoding="utf-8") for root in PACKAGE_ROOTS
                     for p in (REPO / root).rglob("*.py"))
    used = set()
    for path in (REPO / SCRIPTS).iterdir():
        if not path.is_file() or path.suffix == ".pyc":
            continue
        quoted = re.search(rf"[\"']{re.escape(path.name)}[\"']", code)
        imported = path.suffix == ".py" and re.search(
            rf"svconsole_scripts\.{path.stem}\b|from svconsole_scripts import .*\b{path.stem}\b",
            code)
        if quoted or imported:
            used.add(path.name)
    return used


def test_the_wheel_ships_every_package_and_every_script_the_code_uses(tmp_path):
    wheel = build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())

    packages = {p.rsplit("/", 1)[0] for p in package_files() if p.endswith("/__init__.py")}
    assert {"console", "console/ssh", "console/commands", "screens"} <= packages
    missing_packages = sorted(p for p in packages if f"{p}/__init__.py" not in shipped)
    assert not missing_packages, f"packages missing from {wheel.name}: {missing_packages}"

    missing_files = sorted(p for p in package_files() if p not in shipped)
    assert not missing_files, f"package files missing from {wheel.name}: {missing_files}"

    scripts = used_scripts()
    # the node-side programs the engine sends: if these are not found, the scan itself is broken
    assert {"probe.py", "gpu_agent.py", "launch_node.py"} <= scripts, scripts
    missing_scripts = sorted(s for s in scripts if f"svconsole_scripts/{s}" not in shipped)
    assert not missing_scripts, f"scripts the code uses, missing from {wheel.name}: {missing_scripts}"


def test_a_package_the_build_does_not_find_is_missing_from_the_wheel(tmp_path):
    """What the check above guards against: a subpackage the build does not find (here one
    whose ``__init__.py`` is gone) is silently left out, while the checkout's scan still names it."""
    shipped = set(zipfile.ZipFile(build_wheel(tmp_path, without=("console/ssh/__init__.py",)))
                  .namelist())
    assert "console/cluster/__init__.py" in shipped
    assert not any(p.startswith("console/ssh/") for p in shipped)
    assert "console/ssh" in {p.rsplit("/", 1)[0] for p in package_files()
                             if p.endswith("/__init__.py")}


# ------------------------------------------------------------------ the local default cluster


def test_local_default_cluster_probes_and_streams_gpus_with_svconsoles_python(tmp_path,
                                                                              monkeypatch):
    """With no cluster.yaml the console's machine is the one node: its probe and its GPU agent
    run with the Python that runs svconsole (it has nvidia-ml-py), not with whatever python3 is
    first on PATH; the training interpreter inspected is still python3."""
    from console.cluster.model import local_cluster
    from console.cluster.probe import probe_all
    from console.gpu.telemetry import Telemetry
    from console.ssh.pool import Pool

    # python3 on PATH: a Python without site-packages, so without nvidia-ml-py, as a system
    # python3 is next to svconsole's venv
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S "$@"\n')
    (bare / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bare}{os.pathsep}{os.environ['PATH']}")
    assert subprocess.run(["python3", "-c", "import pynvml"], capture_output=True).returncode
    assert importlib.util.find_spec("pynvml") is not None, "svconsole's Python lacks nvidia-ml-py"

    cluster = local_cluster()
    name = cluster.nodes[0].name
    pool = Pool(cluster)
    telemetry = Telemetry(pool, cluster, interval=0.5)
    try:
        facts = probe_all(pool, cluster, torch_timeout=0)[name]
        assert facts.ok, facts.error
        assert "nvidia-ml-py" not in (facts.gpu_error or ""), facts.gpu_error
        assert facts.python["path"] == "python3", facts.python

        collector = telemetry.collectors[name]
        assert collector.python == sys.executable
        telemetry.start()
        deadline = time.monotonic() + 120
        while collector.latest is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert collector.latest is not None, collector.reason
        assert "nvidia-ml-py" not in (collector.latest.reason or ""), collector.latest.reason
    finally:
        telemetry.stop(wait=10)
        pool.close()


# ------------------------------------------------------------------ the install a user makes


def assert_no_traceback(text: str, what: str) -> None:
    assert "Traceback (most recent call last)" not in text, f"{what}: traceback\n{text}"
    assert BROKEN_SCREEN not in text, f"{what}: a screen could not be built\n{text}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """svconsole installed from its wheel by plain ``pip install`` into a fresh venv outside the
    repository; the environment of a user of it (its bin first on PATH, a private HOME)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/test installs it)")
    base = tmp_path_factory.mktemp("install")
    wheel = build_wheel(base)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                          str(wheel)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, f"pip install {wheel.name} failed:\n{pip.stdout}\n{pip.stderr}"
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    # as the README runs it: ~/.svconsole/bin/svconsole by its path, the venv not activated
    # (so python3 on PATH is the system's, without svconsole's packages), nor the checkout's
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (
        Path(d).resolve().is_relative_to(REPO) or Path(d).resolve().is_relative_to(sys.prefix))]
    env.update(HOME=str(home), PATH=os.pathsep.join(path or ["/usr/bin", "/bin"]),
               PYTHONPATH="", TERM="xterm-256color")
    return {"venv": str(venv), "cwd": str(work), **{f"env:{k}": v for k, v in env.items()}}


def user_env(installed: dict[str, str]) -> dict[str, str]:
    return {k[4:]: v for k, v in installed.items() if k.startswith("env:")}


def run_installed(installed: dict[str, str], *args: str, timeout: float = 300):
    return subprocess.run([f"{installed['venv']}/bin/svconsole", *args], cwd=installed["cwd"],
                          env=user_env(installed), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_installed_wheel_is_used_and_pulls_no_torch(installed):
    python = f"{installed['venv']}/bin/python"
    where = subprocess.run(
        [python, "-c", "import console, screens, svconsole_scripts, importlib.util as u;"
                       "print(console.__file__); print(screens.__file__);"
                       "print(u.find_spec('torch') is None, u.find_spec('pynvml') is not None)"],
        cwd=installed["cwd"], env=user_env(installed), capture_output=True, text=True, check=True)
    console_file, screens_file, no_torch, has_nvml = where.stdout.split()
    site = f"{installed['venv']}/lib/"
    assert console_file.startswith(site) and screens_file.startswith(site), where.stdout
    assert no_torch == "True", "installing the console pulled torch"
    assert has_nvml == "True", "nvidia-ml-py (the GPU agent's NVML) is not installed"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("args", [["--version"], ["setup", "--dry-run"], ["validate"],
                                  ["gpus", "--once"]], ids=" ".join)
def test_installed_commands_run_without_a_traceback(installed, args):
    result = run_installed(installed, *args)
    output = result.stdout + result.stderr
    assert_no_traceback(output, f"svconsole {' '.join(args)}")
    # validate reports a config it cannot read as a usage error (2), never as a crash
    assert result.returncode in ((0, 1, 2) if args == ["validate"] else (0,)), output
    if args == ["--version"]:
        assert re.fullmatch(r"svconsole \d+\.\d+\S*\n", result.stdout), result.stdout
    if args == ["gpus", "--once"]:
        # the local node's agent runs with the Python that runs svconsole, which has NVML
        assert "nvidia-ml-py not importable" not in output, output
        assert "nvidia-ml-py is not installed" not in output, output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_installed_console_opens_every_screen_and_help(installed):
    from screens.keys import SCREENS

    titles = {"nodes": "Nodes", "setup": "Setup", "config": "Config", "training": "Training",
              "gpus": "GPUs"}
    command = f"{installed['venv']}/bin/svconsole"
    with Tmux(command, width=120, height=40, env=user_env(installed), cwd=installed["cwd"]) as tui:
        assert_no_traceback(tui.wait_for("nodes up", timeout=120), "start")
        for mode, key, _ in [*SCREENS[1:], SCREENS[0]]:
            tui.send(key)
            tui.send("?")  # help is titled with the class of the screen that is current
            screen = wait_match(tui, rf"│ {titles[mode]}\s+│", timeout=60)
            assert "Keys" in screen, screen
            assert_no_traceback(screen, f"screen {key} ({mode})")
            tui.send("Escape")
            wait_match(tui, r"^(?![\s\S]*│ Keys\s)", timeout=60)
        tui.send("q")
        screen = wait_match(tui, r"\[exited|Quit anyway", timeout=60)
        if "[exited" not in screen:  # a quit prompt (unsaved work): quit anyway, losing it
            tui.send("d")
            screen = wait_match(tui, r"\[exited", timeout=60)
        assert_no_traceback(screen, "quit")
        assert "[exited 0 ]" in screen, screen


def wait_match(tui: Tmux, pattern: str, timeout: float) -> str:
    """The screen, once ``pattern`` (a regular expression) matches it."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tui.screen()
        if re.search(pattern, screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not on screen after {timeout}s:\n{screen}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_installed_console_survives_a_module_left_out_of_the_wheel(installed):
    """The failure this issue started from: a module missing from the install. Its screen is an
    error panel naming the module and the exception; the other screens and quitting work."""
    site = next(Path(installed["venv"]).glob("lib/python3*/site-packages"))
    module = site / "screens" / "setup_widgets.py"
    aside = module.with_name("setup_widgets.py.aside")
    module.rename(aside)
    try:
        command = f"{installed['venv']}/bin/svconsole"
        with Tmux(command, width=120, height=40, env=user_env(installed),
                  cwd=installed["cwd"]) as tui:
            tui.wait_for("nodes up", timeout=120)
            tui.send("2")
            screen = tui.wait_for("The Setup screen could not be built", timeout=60)
            assert "module: screens.setup" in screen, screen
            assert "ModuleNotFoundError: No module named 'screens.setup_widgets'" in screen, screen
            for key, title in (("3", "Config"), ("5", "GPUs"), ("1", "Nodes")):
                tui.send(key)
                tui.send("?")
                screen = wait_match(tui, rf"│ {title}\s+│", timeout=60)
                assert BROKEN_SCREEN not in screen, screen
                tui.send("Escape")
                wait_match(tui, r"^(?![\s\S]*│ Keys\s)", timeout=60)
            tui.send("q")
            screen = wait_match(tui, r"\[exited", timeout=60)
            assert "Traceback (most recent call last)" not in screen, screen
            assert "[exited 0 ]" in screen, screen
    finally:
        aside.rename(module)
