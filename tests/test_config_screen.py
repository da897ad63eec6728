"""The Config screen, driven with Textual's Pilot: findings appear and clear as fields are
edited, the raw JSON view, the diff, saving (atomic, .bak, unknown keys kept) and snapshots.

The cluster is three local nodes (run through subprocesses, no SSH), whose GPUs come from the
facts cache of a real H200 inventory (tests/fixtures/nodes/facts-cache.json) in a private state
directory; deepspeed is imported once for the module.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from console.cluster.model import Cluster, Node
from console.cluster.probe import FactsCache, NodeFacts
from console.ssh.pool import Pool
from console.training import dsconfig
from screens.app import SVConsoleApp
from screens.config import ConfigScreen
from screens.config_widgets import ConfirmSave, FieldRow
from screens.messages import ConfigValidated

FIXTURES = Path(__file__).parent / "fixtures"
CLUSTER = "sv-h200"


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_imported() -> None:
    """Import deepspeed once (seconds); the screens' warm-up then finds it loaded."""
    assert dsconfig.warm_up(), dsconfig.deepspeed_problem()


def write_facts(state: Path, cc: str | None = None, gpu: str | None = None) -> None:
    """The H200 fixture's facts, collected now, in ``state``; ``cc``/``gpu`` replace every
    GPU's compute capability and name (a V100 cluster)."""
    doc = json.loads((FIXTURES / "nodes" / "facts-cache.json").read_text())
    facts = {}
    for name, data in doc["nodes"].items():
        data["collected_at"] = time.time()
        for g in data["gpus"]:
            g["compute_capability"] = cc or g["compute_capability"]
            g["name"] = gpu or g["name"]
        facts[name] = NodeFacts.from_json(data)
    FactsCache(state, CLUSTER).save(facts)


def local_cluster(directory: Path) -> Cluster:
    nodes = tuple(Node(name=f"node{i}", host="localhost", local=True,
                       role="head" if i == 0 else "worker") for i in range(3))
    return Cluster(name=CLUSTER, shared_dir="/data/shared", master="node0", nodes=nodes,
                   path=directory / "cluster.yaml")


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """(app factory, config directory): facts in a private state dir, files in tmp_path."""
    state = tmp_path / "state"
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(state))
    write_facts(state)
    pools = []

    def make() -> SVConsoleApp:
        cluster = local_cluster(tmp_path)
        pool = Pool(cluster)
        pools.append(pool)
        return SVConsoleApp(cluster, pool, health_interval=None)

    yield make, tmp_path
    for pool in pools:
        pool.close()


async def settle(pilot, timeout: float = 60.0) -> ConfigScreen:
    """Wait until the Config screen has nothing pending (DeepSpeed, facts, validation)."""
    screen = pilot.app.screen
    assert isinstance(screen, ConfigScreen)
    deadline = time.monotonic() + timeout
    await pilot.pause()  # let queued edits (Changed messages) reach the screen first
    while not screen.settled:
        assert time.monotonic() < deadline, "the Config screen did not settle"
        await pilot.pause(0.05)
    await pilot.pause()
    return screen


async def open_config(pilot) -> ConfigScreen:
    await pilot.press("3")
    return await settle(pilot)


async def type_into(pilot, screen: ConfigScreen, key: str, text: str) -> None:
    """Focus the field, replace its text by typing, and wait for the validation."""
    screen.action_show_tab("tab-form")
    field = screen.query_one(f"#row-{key.replace('.', '--')}", FieldRow).input
    field.focus()
    field.value = ""
    await pilot.press(*text)
    await settle(pilot)


def at(screen: ConfigScreen, key: str) -> str:
    """The findings shown at a field, as text."""
    row = screen.query_one(f"#row-{key.replace('.', '--')}", FieldRow)
    shown = row.query_one(".field-findings")
    return str(shown.render()) if row.has_class("has-findings") else ""


def write_data_lists(directory: Path) -> None:
    """Valid SenseVoice train/valid lists, and a profile using them (the nodes are local)."""
    line = {"key": "a", "source": "/x.wav", "source_len": 10, "target": "hi", "target_len": 2,
            "text_language": "<|en|>", "emo_target": "<|NEUTRAL|>",
            "event_target": "<|Speech|>", "with_or_wo_itn": "<|woitn|>"}
    for name in ("train.jsonl", "val.jsonl"):
        (directory / name).write_text(json.dumps(line) + "\n")
    (directory / "training.yaml").write_text(
        f"train_data_set_list: {directory / 'train.jsonl'}\n"
        f"valid_data_set_list: {directory / 'val.jsonl'}\n"
        "dataset_conf:\n  num_workers: 14\n")


async def test_findings_appear_at_their_field_and_clear(setup):
    make, _ = setup
    posted = []
    async with make().run_test(size=(120, 40), message_hook=posted.append) as pilot:
        screen = await open_config(pilot)
        assert "DeepSpeed 0." in str(screen.query_one("#config-status").render())
        assert at(screen, "zero_optimization.stage") == ""
        # DeepSpeed's pydantic error, at the field, verbatim
        await type_into(pilot, screen, "zero_optimization.stage", "7")
        shown = at(screen, "zero_optimization.stage")
        assert "Input should be 0, 1, 2, 3" in shown and "(got 7)" in shown
        assert screen.has_errors and '"stage": 7' in screen.ds_text
        await type_into(pilot, screen, "zero_optimization.stage", "1")
        assert "Input should be" not in at(screen, "zero_optimization.stage")
        assert '"stage": 1' in screen.ds_text
        # the tuning matrix
        await type_into(pilot, screen, "gradient_accumulation_steps", "16")
        shown = at(screen, "gradient_accumulation_steps")
        assert "16 is outside the recommended 1-8" in shown and "fix:" in shown
        await type_into(pilot, screen, "gradient_accumulation_steps", "4")
        assert at(screen, "gradient_accumulation_steps") == ""
        # a profile field: the profile's own check, then the matrix
        await type_into(pilot, screen, "dataset_conf.batch_size", "lots")
        assert "must be a whole number, got 'lots'" in at(screen, "dataset_conf.batch_size")
        await type_into(pilot, screen, "dataset_conf.batch_size", "2000")
        shown = at(screen, "dataset_conf.batch_size")
        assert "whole number" not in shown and "token batch 2000 is outside" in shown

        # debounced: a burst of edits gives one validation, after the edits stop
        def validations() -> int:  # a message bubbles (screen, app): count each once
            return len({id(m) for m in posted if isinstance(m, ConfigValidated)})

        before = validations()
        field = screen.query_one("#row-train_conf--max_epoch", FieldRow).input
        for typed in ("1", "12", "123", "1234", "12345", "123456"):
            field.value = typed
        await pilot.pause()
        assert not screen.settled, "the validation waits for the edits to stop"
        await settle(pilot)
        assert validations() - before == 1, "six edits within 300 ms: one validation"
        assert screen.profile.train_conf.max_epoch == 123456


async def test_bf16_on_cc_70_is_an_error_naming_the_nodes(setup, tmp_path):
    make, _ = setup
    write_facts(tmp_path / "state", cc="7.0", gpu="Tesla V100-SXM2-32GB")
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        # the JSON offered by default trains on these GPUs: fp32, and it says why
        assert screen.ds_text == dsconfig.preset_text("zero1_fp32")
        assert "ds_config.json is new, from the zero1_fp32 preset (fp32: the GPUs of node0, " \
            "node1, node2 lack bf16" in str(screen.query_one("#config-status").render())
        assert at(screen, "bf16.enabled") == ""
        assert not [f for f in screen.report.findings if "bf16" in f.field]
        await type_into(pilot, screen, "bf16.enabled", "true")
        shown = at(screen, "bf16.enabled")
        assert "bf16 needs compute capability 8.0" in shown
        assert all(f"node{i} (Tesla V100-SXM2-32GB, cc 7.0)" in shown for i in range(3))
        await type_into(pilot, screen, "bf16.enabled", "false")
        assert "compute capability" not in at(screen, "bf16.enabled")


async def test_summary_diff_and_the_json_view(setup):
    make, directory = setup
    write_data_lists(directory)
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        summary = str(screen.query_one("#config-summary").render())
        assert summary.startswith("0 errors / ") and summary.endswith("/ ready to launch")
        assert not screen.has_errors
        assert "cached facts, just now" in str(screen.query_one("#config-status").render())
        # the diff against a preset
        await pilot.press("f4")
        screen.query_one("#diff-target").value = "ds_stage3"
        await pilot.pause()
        assert '-  "zero_force_ds_cpu_optimizer": false,' in screen.diff
        assert '+    "stage": 1,' in screen.diff
        # the raw JSON: a duplicate key, then broken JSON, each with line:col
        await pilot.press("f3")
        area = screen.query_one("#json-text")
        assert area.has_focus
        area.text = '{\n  "steps_per_print": 10,\n  "steps_per_print": 20\n}\n'
        await settle(pilot)
        shown = str(screen.query_one("#json-findings").render())
        assert "ds_config.json:3:3 steps_per_print: duplicate key (first at line 2)" in shown
        area.text = '{\n  "steps_per_print": 10\n  "gradient_clipping": 1\n}\n'
        await settle(pilot)
        shown = str(screen.query_one("#json-findings").render())
        assert "ds_config.json:3:3: Expecting ',' delimiter" in shown
        assert screen.query_one(FieldRow).input.disabled, "the form waits for valid JSON"
        assert str(screen.query_one("#config-summary").render()).startswith("1 error / ")


async def test_save_asks_naming_the_errors_then_writes_atomically_keeping_unknown_keys(setup):
    make, directory = setup
    write_data_lists(directory)
    saved = json.loads(dsconfig.preset_text("ds_stage3"))
    saved["my_own_key"] = {"kept": True}
    (directory / "ds_config.json").write_text(json.dumps(saved, indent=2))
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        await type_into(pilot, screen, "steps_per_print", "50")
        await type_into(pilot, screen, "dataset_conf.num_workers", "8")
        await type_into(pilot, screen, "zero_optimization.stage", "7")
        await pilot.press("ctrl+s")
        await pilot.pause()
        dialog = pilot.app.screen
        assert isinstance(dialog, ConfirmSave)
        text = str(dialog.query_one("Static").render())
        assert "zero_optimization.stage: Input should be" in text
        await pilot.press("n")
        await pilot.pause(0.3)
        assert json.loads((directory / "ds_config.json").read_text()) == saved
        await pilot.press("ctrl+s", "y")
        for _ in range(200):
            if (directory / "ds_config.json.bak").exists() and (directory / "training.yaml.bak").exists():
                break
            await pilot.pause(0.05)
        await pilot.pause()
        assert "saved" in str(screen.query_one("#config-status").render())
    data = json.loads((directory / "ds_config.json").read_text())
    assert data["steps_per_print"] == 50 and data["zero_optimization"]["stage"] == 7
    assert data["my_own_key"] == {"kept": True}, "keys the form does not know are kept"
    assert data["zero_force_ds_cpu_optimizer"] is False
    assert json.loads((directory / "ds_config.json.bak").read_text()) == saved
    assert "num_workers: 8" in (directory / "training.yaml").read_text()
    assert "num_workers: 14" in (directory / "training.yaml.bak").read_text()
    assert sorted(p.name for p in directory.iterdir() if p.is_file()) == [
        "ds_config.json", "ds_config.json.bak", "train.jsonl", "training.yaml",
        "training.yaml.bak", "val.jsonl"], "no temporary file left"


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_snapshot(snap_compare, monkeypatch, size):
    # a fixed directory: the findings show the data lists' paths, and pytest's numbered
    # tmp_path would change the picture from one run to the next
    import shutil

    fixed = Path("/tmp/svconsole-config-snapshot")
    shutil.rmtree(fixed, ignore_errors=True)
    fixed.mkdir(parents=True)
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(fixed / "state"))
    write_facts(fixed / "state")
    cluster = local_cluster(fixed)
    pool = Pool(cluster)

    async def open_and_settle(pilot) -> None:
        await open_config(pilot)

    try:
        assert snap_compare(SVConsoleApp(cluster, pool, health_interval=None),
                            run_before=open_and_settle, terminal_size=size)
    finally:
        pool.close()
        shutil.rmtree(fixed, ignore_errors=True)
