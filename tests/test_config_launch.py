"""One verdict everywhere, and the default preset trains: on a real loopback cluster (CPU-only
nodes whose training Python has funasr 1.4.16), ``svconsole validate`` with no argument and the
Config screen check the same files and print the same summary line, the seed's bf16 preset is
``not ready`` (the fault's id and fix) in both, and the preset the screen offers, saved there with
ctrl+s, trains a tiny SenseVoice for real through ``svconsole launch``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from console.cli import main
from console.cluster.model import load_cluster
from console.ssh.pool import Pool
from console.training import dsconfig, runs
from console.training.launch import shipped_ds_config
from screens.app import SVConsoleApp
from screens.config_widgets import ConfirmSave
from tests.test_config_screen import open_config, settle
from tests.test_launch import _needs_training_stack, cli, tagged, tiny_profile, train_rows, wait_for


def cli_out(*argv: str) -> tuple[int, str]:
    """svconsole in this process, its output captured here (also while a Textual app, which
    captures prints itself, is running)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue()


def summary_of(screen) -> str:
    return str(screen.query_one("#config-summary").render())


async def wait_saved(pilot, path, text: str) -> None:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < deadline, f"{path} was not saved"
        await pilot.pause(0.05)


@pytest.mark.slow
async def test_validate_and_the_screen_agree_and_the_default_preset_trains(
        fresh_loopback, tmp_path, capsys, monkeypatch):
    _needs_training_stack()
    from svconsole_scripts import tiny_sensevoice

    lb = fresh_loopback(2)
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    tiny = tiny_sensevoice.make(lb.shared_dir / "tiny", samples=8, seconds=1.5)
    out = lb.shared_dir / "exp"
    profile = tiny_profile(tiny, out, max_epoch=1)
    profile["train_conf"]["deepspeed_config"] = str(lb.shared_dir / "not-written-yet.json")
    (lb.directory / "training.yaml").write_text(yaml.safe_dump(profile))
    ds_file = lb.directory / "ds_config.json"
    common = ["--config", str(lb.cluster_yaml)]

    # 1. nothing saved yet: validate checks the default preset, which trains with funasr 1.4.16
    code, stdout, _ = cli(capsys, *common, "validate")
    lines = stdout.splitlines()
    assert code == 0, stdout
    assert lines[0].startswith("cluster (inventory): world size 2 (cpu-wrapper entry, 1 process "
                               "per node) on 2 node(s)"), stdout
    assert "the zero1_fp32 preset was checked (fp32: bf16 dtype mismatch" in stdout
    fresh = lines[-1]
    assert fresh.startswith("0 errors / ") and fresh.endswith(" / ready to launch")

    cluster = load_cluster(lb.cluster_yaml)
    pool = Pool(cluster)
    state = tmp_path / "state"
    try:
        app = SVConsoleApp(cluster, pool, health_interval=None)
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_config(pilot)
            assert summary_of(screen) == fresh, "the screen and validate agree"
            status = str(screen.query_one("#config-status").render())
            assert "world size 2 (cpu-wrapper entry" in status
            assert "ds_config.json is new, from the zero1_fp32 preset (fp32:" in status
            assert screen.ds_text == dsconfig.preset_text("zero1_fp32")

            # 2. every preset saved there: validate (no argument) prints the screen's summary;
            # the seed's bf16 preset is not ready, with the fault's id and fix, in both
            area = screen.query_one("#json-text")
            for name in dsconfig.PRESETS:
                area.text = dsconfig.preset_text(name)
                await settle(pilot)
                shown = summary_of(screen)
                await pilot.press("ctrl+s")
                await pilot.pause()
                if isinstance(pilot.app.screen, ConfirmSave):
                    await pilot.press("y")
                await wait_saved(pilot, ds_file, dsconfig.preset_text(name))
                await settle(pilot)
                code, stdout = cli_out(*common, "validate")
                assert stdout.splitlines()[-1] == shown, (name, stdout)
                assert code == (0 if shown.endswith("ready to launch") else 1), (name, stdout)
                if name == "seed_zero1_bf16":
                    assert shown.startswith("1 error / ") and not screen.report.ok
                    [error] = screen.report.errors
                    assert "(fault bf16-dtype-mismatch)" in error.message
                    assert "Train in fp32 (bf16.enabled false)" in error.fix
                    assert "funasr 1.4.16" in error.reason
                    assert "bf16-dtype-mismatch" in stdout and "Train in fp32" in stdout
                    # and launch's pre-flight refuses it too, before any rank dies on it
                    code, stdout = cli_out(*common, "launch", "--entry", "cpu-wrapper",
                                           "--dry-run", "--json")
                    [check] = [c for c in json.loads(stdout)["checks"]
                               if c["name"] == "deepspeed config"]
                    assert code == 1 and not check["ok"], check
                    assert "(fault bf16-dtype-mismatch)" in check["message"], check

            # 3. the default preset, saved last there with ctrl+s: launch trains it
            assert dsconfig.PRESETS[-1] == "zero1_fp32"
            good = summary_of(screen)
            assert good == fresh and screen.unsaved_work() is None
        code, stdout, _ = cli(capsys, *common, "validate")
        assert code == 0 and stdout.splitlines()[-1] == good, stdout
        assert json.loads(ds_file.read_text()) == json.loads(dsconfig.preset_text("zero1_fp32"))

        cache = os.environ.get("TORCH_EXTENSIONS_DIR",
                               str(Path.home() / ".cache" / "svconsole" / "torch_extensions"))
        launch = [*common, "launch", "--entry", "cpu-wrapper", "--env",
                  f"TORCH_EXTENSIONS_DIR={cache}", "--yes", "--json"]
        code, stdout, err = cli(capsys, *launch)
        reply = json.loads(stdout)
        failed = [c for c in reply["checks"] if not c["ok"]]
        if code and failed and all(c["name"] == "no other run" for c in failed):
            # the loopback nodes are this machine, where other tests' runs may be training
            code, stdout, err = cli(capsys, *launch, "--force")
            reply = json.loads(stdout)
            failed = [c for c in reply["checks"] if not c["ok"]]
        assert code == 0, (reply["message"], failed, err)
        assert not [c for c in failed if c["name"] != "no other run"], failed
        record = runs.RunRecord.from_dict(reply["run"])
        wait_for(lambda: not tagged(record.id), 600, "the run to end")
        status = runs.run_status(pool, record)
        assert status.state == "finished", [open(n.log).read()[-3000:] for n in record.nodes]
        rows = train_rows(record)
        assert {(node, rank) for node, rank, *_ in rows} == {("node0", 0), ("node1", 1)}
        assert all(loss > 0 for *_, loss in rows)
        shipped = Path(shipped_ds_config(str(out), record.id))
        assert json.loads(shipped.read_text()) == json.loads(dsconfig.preset_text("zero1_fp32"))
    finally:
        for rec in runs.load_index(state):
            if tagged(rec.id):
                runs.stop_run(pool, rec, grace=2)
        pool.close()
