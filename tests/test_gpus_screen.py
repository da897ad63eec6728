"""The GPUs screen: panels, heat grid, thresholds, stale nodes, and the live agents.

Fed tests post the collectors' own message (:class:`GPUTelemetry` carrying a
:class:`TelemetryUpdate`) with samples parsed from the H200 fixtures (the agent's simulated source
replaying ``nvml.json``, the nvidia-smi CSV recorded during FunASR training) or written by the real
agent on this GPU-less machine; the live test runs the agents over the loopback cluster's sshd.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.text import Text
from test_telemetry import agent_pids  # tests/ is on sys.path (conftest.py lives there)

import screens.app
from console.cluster.model import Cluster, Node, load_cluster
from console.gpu.telemetry import (
    GPUProcess,
    NodeStatus,
    Sample,
    TelemetryUpdate,
    agent_module,
    parse_sample,
    parse_smi_csv,
)
from console.ssh.pool import Pool
from console.ssh.remote import script_path
from console.training.metrics import RankStatus
from console.training.runs import NodeRun, RunRecord
from screens.app import SVConsoleApp
from screens.gpu_widgets import LEVEL_STYLES, UNJUDGED_STYLE, HeatGrid, short_name
from screens.gpus import GPUsScreen
from screens.messages import GPUTelemetry, RunFollowed

H200 = Path(__file__).parent / "fixtures" / "h200"
NOW = 2_000_000.0            # the screen's clock in fed tests: no wall-clock time on screen
APP_CSS = str(Path(screens.app.__file__).with_name(SVConsoleApp.CSS_PATH))
SMI_FIELDS = ["timestamp", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu"]


# -------------------------------------------------------------------------- data


def cluster_of(names: list[str]) -> Cluster:
    """Nodes nobody answers for (TEST-NET addresses): the fed tests start no agent."""
    nodes = tuple(Node(name=n, host=f"192.0.2.{i % 250 + 1}", port=22 + i // 250, user=None,
                       identity_file=None) for i, n in enumerate(names))
    return Cluster(name="sv-h200", nodes=nodes, shared_dir="/data/shared", master=names[0])


def sim_sample(step: int, *, gpus: int = 8, age: float = 0.4,
               rank_base: int | None = None) -> Sample:
    """The agent's simulated line ``step`` samples into the H200 load series, as parsed by the
    console; ``rank_base`` gives each GPU's process torchrun ranks (rank_base + GPU index)."""
    source = agent_module().SimSource(str(H200 / "nvml.json"), gpus)
    for _ in range(step):
        source.read()
    readings, errors = source.read()
    if rank_base is not None:
        for g in readings:
            for p in g["procs"]:
                p.update(rank=rank_base + g["index"], local_rank=g["index"], cmd="python train.py")
    line = json.dumps({"t": NOW - age, "seq": step, "source": "simulated",
                       "host": {"cpu_pct": 12.0, "mem_total_mb": 515000, "mem_used_mb": 40210,
                                "load1": 1.0, "load5": 1.0, "load15": 1.0},
                       "gpus": readings, "errors": errors})
    sample = parse_sample(line)
    assert sample is not None
    return dataclasses.replace(sample, received=NOW - age)


def training_sample(rows: list[int], *, age: float = 0.3, mem_pct: float | None = None) -> Sample:
    """Real nvidia-smi rows recorded during FunASR training on the H200 (one GPU per row), with the
    limits of the H200's query-gpu.csv; ``mem_pct`` overrides the memory used."""
    lines = (H200 / "nvidia-smi-during-funasr-training.csv").read_text().splitlines()
    ident = parse_smi_csv((H200 / "query-gpu.csv").read_text(),
                          ["index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total",
                           "memory.used", "utilization.gpu", "utilization.memory",
                           "temperature.gpu", "power.draw", "power.limit", "clocks.sm",
                           "clocks.mem", "pstate", "compute_cap"]).gpus[0]
    readings = parse_smi_csv("\n".join(lines[r] for r in rows), SMI_FIELDS).gpus
    gpus = []
    for i, g in enumerate(readings):
        used = g.mem_used_mb if mem_pct is None else ident.mem_total_mb * mem_pct / 100
        gpus.append(dataclasses.replace(
            g, index=i, name=ident.name, uuid=f"{ident.uuid}-{i}", mem_total_mb=ident.mem_total_mb,
            mem_used_mb=used, power_limit_w=ident.power_limit_w,
            procs=(GPUProcess(pid=4100 + i, used_mb=used, cmd="python -m funasr.bin.train_ds",
                              rank=i, local_rank=i),)))
    return Sample(t=NOW - age, seq=1, source="nvidia-smi", host=None, gpus=tuple(gpus),
                  received=NOW - age)


def low_rows(n: int) -> list[int]:
    """Rows of the training CSV whose utilisation is in the seed's warn range (10-50%)."""
    lines = (H200 / "nvidia-smi-during-funasr-training.csv").read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if 10 <= float(line.split(",")[1]) < 50]
    assert len(rows) >= n
    return rows[:n]


def in_use(sample: Sample) -> int:
    return sum(1 for g in sample.gpus if g.procs or g.util_gpu)


_NO_GPU_LINE: list[str] = []


def no_gpu_sample(age: float = 0.2) -> Sample:
    """What the real agent says on this machine (no NVIDIA GPU), with its reason."""
    if not _NO_GPU_LINE:
        out = subprocess.run([sys.executable, str(script_path("gpu_agent.py")), "--count", "1"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        _NO_GPU_LINE.append(out.splitlines()[0])
    sample = parse_sample(_NO_GPU_LINE[0])
    assert sample is not None and sample.no_gpu and sample.reason, _NO_GPU_LINE[0]
    return dataclasses.replace(sample, received=NOW - age)


def a_run(node_ranks: dict[str, int], slowest: tuple[int, str, float] | None = None) -> RunFollowed:
    record = RunRecord(id="20261130-004512-3fa2", created=NOW - 600, cluster="sv-h200",
                       output_dir="/data/shared/out", master="node0",
                       nodes=[NodeRun(n, r, f"/tmp/{n}.log", f"/tmp/{n}.pid", f"/tmp/{n}.exit")
                              for n, r in node_ranks.items()])
    ranks = []
    if slowest is not None:
        rank, node, seconds = slowest
        ranks = [RankStatus(r, n, 0, 10, 1.0, 1e-4, seconds if r == rank else seconds / 2,
                            None, None, None, 0.5) for r, n in ((0, "node0"), (rank, node))]
    return RunFollowed(record, ranks)


# -------------------------------------------------------------------------- app


class FedApp(SVConsoleApp):
    """The app with a GPUs screen that starts no agents: the tests post the collectors' messages."""

    CSS_PATH = APP_CSS
    MODES = {**SVConsoleApp.MODES,
             "gpus": lambda: GPUsScreen(start_telemetry=False, clock=lambda: NOW)}


def fed_app(names: list[str]) -> tuple[FedApp, Pool]:
    cluster = cluster_of(names)
    pool = Pool(cluster)
    return FedApp(cluster, pool, health_interval=None), pool


def feed(screen: GPUsScreen, node: str, sample: Sample | None = None,
         status: NodeStatus = NodeStatus.LIVE, reason: str = "") -> None:
    screen.post_message(GPUTelemetry(TelemetryUpdate(node, status, sample=sample, reason=reason)))


async def show(pilot) -> GPUsScreen:
    await pilot.press("5")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, GPUsScreen)
    return screen


async def settle(pilot) -> None:
    """Wait until the messages so far are handled and the redraw they asked for is done (no
    fixed wait: see test_training_screen.settle)."""
    from test_training_screen import settle as settled

    await settled(pilot)


def panel_text(screen: GPUsScreen, node: str) -> str:
    return "\n".join(t.plain for t in screen.panels[node].lines())


def styles_of(text: Text) -> set[str]:
    return {str(span.style) for span in text.spans}


def overview_of(screen: GPUsScreen) -> str:
    return str(screen.query_one("#gpu-overview").render())


@pytest.fixture
def three_nodes():
    app, pool = fed_app(["node0", "node1", "node2"])
    yield app
    pool.close()


# -------------------------------------------------------------------------- fed tests


async def test_panels_show_fixture_readings_no_gpu_reason_and_waiting_node(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        busy = sim_sample(30)                   # the H200 under its matmul load
        feed(screen, "node0", busy)
        feed(screen, "node1", no_gpu_sample())
        await settle(pilot)
        node0 = panel_text(screen, "node0")
        g0 = busy.gpus[0]
        assert len(node0.splitlines()) == 8     # compact at 80x24: a line per GPU
        assert f"{g0.util_gpu:.0f}%" in node0.splitlines()[0]
        assert f"{g0.temp_c:.0f}°C" in node0
        assert f"{g0.power_w:.0f}/{g0.power_limit_w:.0f}W" in node0
        assert screen.panels["node0"].border_subtitle == "SIMULATED"
        node1 = panel_text(screen, "node1")
        assert node1.startswith("no NVIDIA GPU on this node: ")
        assert no_gpu_sample().reason in " ".join(node1.split())    # wrapped, all of it
        assert screen.panels["node1"].border_subtitle == ""
        assert "starting the GPU agent" in panel_text(screen, "node2")
        ov = overview_of(screen)
        assert f"GPUs {in_use(busy)}/8 in use" in ov
        hottest = max(busy.gpus, key=lambda g: g.temp_c)
        assert f"hottest node0:{hottest.index} {hottest.temp_c:.0f}°C" in ov
        assert "no run" in ov and "SIMULATED" in ov and "no GPU: node1" in ov


async def test_detail_shows_history_processes_and_ranks_of_the_run(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        for step in range(20, 30):
            feed(screen, "node0", sim_sample(step, rank_base=8))
            await pilot.pause()
        screen.post_message(a_run({"node0": 1, "node1": 0}, slowest=(5, "node1", 1.84)))
        await pilot.press("d")                  # full detail
        await settle(pilot)
        text = panel_text(screen, "node0")
        last = sim_sample(29, rank_base=8)
        proc = last.gpus[2].procs[0]
        assert f"pid {proc.pid}" in text
        assert "rank 10 (node 1, local 2)  python train.py" in text
        assert screen.panels["node0"].border_title.startswith("node0 (node rank 1) · live")
        util_line = next(line for line in text.splitlines() if line.strip().startswith("util"))
        assert any(ch in util_line for ch in "▁▂▃▄▅▆▇█")   # the sparkline
        assert "slowest: rank 5 on node1, 1.84 s/step" in overview_of(screen)


async def test_thresholds_colour_and_advise_only_during_a_run(three_nodes):
    low = training_sample(low_rows(2), mem_pct=97.0)  # FunASR starving the GPUs
    assert all(g.util_gpu < 50 for g in low.gpus)
    async with three_nodes.run_test(size=(160, 48)) as pilot:
        screen = await show(pilot)
        # ranks come from the agent: a torchrun on the GPUs is a run even before one is followed
        quiet = dataclasses.replace(
            low, gpus=tuple(dataclasses.replace(g, procs=()) for g in low.gpus))
        feed(screen, "node0", quiet)
        await settle(pilot)
        lines = screen.panels["node0"].lines()
        assert "adjust batch_size" not in "\n".join(t.plain for t in lines)
        assert not styles_of(lines[1]) & {LEVEL_STYLES[lv] for lv in LEVEL_STYLES}
        assert UNJUDGED_STYLE in styles_of(lines[1])
        assert "alarm" not in overview_of(screen)

        feed(screen, "node0", low)
        screen.post_message(a_run({"node0": 0}))
        await settle(pilot)
        lines = screen.panels["node0"].lines()
        text = "\n".join(t.plain for t in lines)
        assert "utilisation below 50%: adjust batch_size" in text
        assert "memory above 95%: mixed precision" in text
        assert "bold dark_orange" in styles_of(lines[1]) and "bold red" in styles_of(lines[2])
        assert "4 alarms" in overview_of(screen)

        # the recording never reached the normal 70-90%: the same reading at 80%
        normal = training_sample(low_rows(1))
        normal = dataclasses.replace(
            normal, gpus=(dataclasses.replace(normal.gpus[0], util_gpu=80.0),))
        feed(screen, "node0", normal)
        await settle(pilot)
        lines = screen.panels["node0"].lines()
        assert "adjust batch_size" not in "\n".join(t.plain for t in lines)
        assert LEVEL_STYLES[next(iter(LEVEL_STYLES))] in styles_of(lines[1])   # green: normal


async def test_idle_gpus_during_a_run_are_not_alarms(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        feed(screen, "node0", sim_sample(0, gpus=3))    # the series starts idle: 0%, no process
        screen.post_message(a_run({"node0": 0}))
        await settle(pilot)
        assert screen.board.in_run
        assert "alarm" not in overview_of(screen)
        assert "!" not in panel_text(screen, "node0")


async def test_stale_node_is_shown_stale_with_its_age(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        feed(screen, "node0", sim_sample(30, age=7.0))
        feed(screen, "node0", None, NodeStatus.STALE, "no sample for 2.1 s")
        feed(screen, "node1", sim_sample(30))
        await settle(pilot)
        panel = screen.panels["node0"]
        assert panel.border_title == "node0 · STALE 7 s · SIMULATED"
        assert panel.has_class("-stale")
        assert panel_text(screen, "node0").startswith(
            "no sample for 2.1 s: the values below are 7 s old")
        ov = overview_of(screen)
        assert "nodes 1/3 live" in ov and "stale: node0 (7 s)" in ov
        assert f"GPUs {in_use(sim_sample(30))}/8 in use" in ov   # the stale node's are not counted
        assert screen.panels["node1"].border_title == "node1 · live · SIMULATED"
        feed(screen, "node0", None, NodeStatus.DOWN, "agent ended (exit -1): connection lost")
        await settle(pilot)
        assert panel.border_title == "node0 · down, last sample 7 s ago · SIMULATED"
        assert panel.has_class("-down")
        assert panel_text(screen, "node0").startswith("agent ended (exit -1): connection lost: "
                                                      "the values below are 7 s old")
        feed(screen, "node0", sim_sample(31))   # it comes back
        await settle(pilot)
        assert panel.border_title == "node0 · live · SIMULATED" and not panel.has_class("-stale")


async def test_heat_grid_of_64_nodes_by_8_gpus_shows_every_node():
    names = [f"gpu-node-{i:03d}" for i in range(64)]
    app, pool = fed_app(names)
    try:
        for size in ((80, 24), (160, 48)):
            async with app.run_test(size=size) as pilot:
                screen = await show(pilot)
                for i, name in enumerate(names):
                    feed(screen, name, sim_sample(i))
                await settle(pilot)
                grid = screen.query_one(HeatGrid)
                rows = grid.rows(grid.content_size.width)
                text = "\n".join(r.plain for r in rows)
                labels = [short_name(n, HeatGrid.NAME_WIDTH) for n in names]
                assert len(set(labels)) == 64
                assert all(text.count(label) == 1 for label in labels)
                assert all(r.cell_len <= grid.content_size.width for r in rows)
                assert text.count(HeatGrid.CELL) == 64 * 8
                container = screen.query_one("#gpu-heat")
                assert container.size.height <= size[1] * 0.35 + 1
                assert container.virtual_size.height == len(rows)   # the rest by scrolling
                container.scroll_end(animate=False)
                await pilot.pause()
                assert container.scroll_y == container.max_scroll_y
                assert len(screen.panels) == 64
            app, pool2 = fed_app(names)
            pool.close()
            pool = pool2
    finally:
        pool.close()


async def test_keys_move_between_nodes_and_toggle_grid_and_detail(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        for n in ("node0", "node1", "node2"):
            feed(screen, n, sim_sample(30))
        await settle(pilot)
        await pilot.press("n")
        assert screen.focused is screen.panels["node0"]
        await pilot.press("n")
        assert screen.focused is screen.panels["node1"]
        await pilot.pause()
        panels = screen.query_one("#gpu-panels")
        assert screen.panels["node1"].region.y == panels.region.y      # scrolled to its top
        await pilot.press("n")
        assert screen.focused is screen.panels["node2"]
        await pilot.press("n")
        assert screen.focused is screen.panels["node0"]
        await pilot.press("p")
        assert screen.focused is screen.panels["node2"]
        heat = screen.query_one("#gpu-heat")
        await pilot.press("g")
        assert not heat.display
        await pilot.press("g")
        assert heat.display
        assert not screen.panels["node0"].detail
        await pilot.press("d")
        await pilot.pause()
        assert all(p.detail for p in screen.panels.values())
        assert "GPU0 NVIDIA H200" in panel_text(screen, "node0")
        ids = {b.id for b in GPUsScreen.BINDINGS}
        assert ids == {"gpus.next_node", "gpus.previous_node", "gpus.toggle_grid",
                       "gpus.toggle_detail"}


async def test_hidden_screen_does_not_render_then_catches_up(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        feed(screen, "node0", sim_sample(0))
        await settle(pilot)
        before = screen.panels["node0"].view
        await pilot.press("1")
        await pilot.pause()
        feed(screen, "node0", sim_sample(30))
        await settle(pilot)
        assert screen.board.nodes["node0"].sample.seq == 30     # the model keeps up
        assert screen.panels["node0"].view is before             # the widgets do not
        await pilot.press("5")
        await pilot.pause()
        shown = screen.panels["node0"].view.gpus[0].reading
        assert shown.util_gpu == sim_sample(30).gpus[0].util_gpu


async def test_a_burst_of_samples_collapses_but_a_status_never_hides_a_sample(three_nodes):
    async with three_nodes.run_test(size=(80, 24)) as pilot:
        screen = await show(pilot)
        samples = [sim_sample(step) for step in range(20)]
        for s in samples:                       # posted faster than the screen takes them
            feed(screen, "node0", s)
        feed(screen, "node0", None, NodeStatus.STALE, "no sample for 2.0 s")
        feed(screen, "node1", None, NodeStatus.DOWN, "connection refused")
        feed(screen, "node1", None, NodeStatus.STARTING)
        await settle(pilot)
        node0, node1 = screen.board.nodes["node0"], screen.board.nodes["node1"]
        assert node0.version < len(samples)    # the queue collapsed
        assert node0.sample is samples[-1] and node0.status == NodeStatus.STALE
        assert node1.version == 1 and node1.status == NodeStatus.STARTING


def test_simulation_is_chosen_by_env_or_app_attribute(tmp_path):
    from console.gpu.telemetry import simulation_fixture

    assert simulation_fixture(None, {}) is None
    env = {"SVCONSOLE_GPU_SIMULATE": str(H200 / "nvml.json")}
    assert simulation_fixture(None, env) == H200 / "nvml.json"
    assert simulation_fixture(str(H200 / "nvml.json"), {}) == H200 / "nvml.json"
    with pytest.raises(ValueError, match="SVCONSOLE_GPU_SIMULATE=.*nope.json: no such file"):
        simulation_fixture(None, {"SVCONSOLE_GPU_SIMULATE": str(tmp_path / "nope.json")})


# -------------------------------------------------------------------------- snapshots


def fed_snapshot(names: list[str]):
    async def run_before(pilot) -> None:
        screen = await show(pilot)
        for step in range(10, 40, 3):
            feed(screen, "node0", training_sample(low_rows(4),
                                                  mem_pct=60 + step))
            feed(screen, "node1", sim_sample(step))
            await pilot.pause()
        feed(screen, "node2", sim_sample(30, age=12.0))
        feed(screen, "node2", None, NodeStatus.STALE, "no sample for 2.3 s")
        feed(screen, "node3", Sample(
            t=NOW, seq=0, source=None, host=None, no_gpu=True, received=NOW - 0.2,
            reason="NVML: NVMLError_LibraryNotFound: NVML Shared Library Not Found; "
                   "nvidia-smi: not found on PATH"))
        screen.post_message(a_run({"node0": 0, "node1": 1}, slowest=(3, "node0", 0.45)))
        await settle(pilot)
    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot(snap_compare, size):
    app, pool = fed_app(["node0", "node1", "node2", "node3"])
    try:
        assert snap_compare(app, terminal_size=size, run_before=fed_snapshot(app.cluster.names()))
    finally:
        pool.close()


# -------------------------------------------------------------------------- live agents


async def test_live_screen_shows_each_nodes_no_gpu_reason_and_leaves_no_agent(loopback):
    interval = round(0.6 + time.time_ns() % 1000 / 10_000, 4)   # marks this test's agents
    marker = f"--interval {interval}"
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)

    class LiveApp(SVConsoleApp):
        CSS_PATH = APP_CSS
        MODES = {**SVConsoleApp.MODES, "gpus": lambda: GPUsScreen(interval=interval)}

    app = LiveApp(cluster, pool, health_interval=None)
    seen: list[int] = []
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await show(pilot)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await pilot.pause(0.2)
                if all(p.view.no_gpu for p in screen.panels.values()):
                    break
            for name in cluster.names():
                text = panel_text(screen, name)
                assert text.startswith("no NVIDIA GPU on this node: NVML"), (name, text)
                assert screen.panels[name].view.status == NodeStatus.LIVE
                assert screen.panels[name].border_subtitle == ""      # real, not simulated
            assert f"nodes {len(cluster.nodes)}/{len(cluster.nodes)} live" in overview_of(screen)
            seen = agent_pids(marker)
            assert len(seen) == len(cluster.nodes)
        deadline = time.monotonic() + 10
        while agent_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent_pids(marker) == [], "gpu_agent processes left after the app exited"
    finally:
        pool.close()
