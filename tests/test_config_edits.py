"""The Config screen never loses an edit: keys in a burst or a paste land exactly where they were
typed, the form shows the last valid JSON while the text is invalid, a file changed on disk
while the screen is open is never overwritten silently, untouched files are not rewritten, and
``unsaved_work`` says what leaving would lose. Driven with Textual's Pilot on the same local
cluster as tests/test_config_screen.py (its fixtures and helpers)."""

from __future__ import annotations

import json
import time

import pytest
from textual import events
from textual.keys import _character_to_key
from textual.widgets import TextArea

from console.training import dsconfig
from screens.config_widgets import ConfirmSave, FieldRow, OutsideEdit
from tests import test_config_screen as base
from tests.test_config_screen import open_config, settle, type_into, write_data_lists

setup = base.setup  # the fixtures: a local 3-node cluster with H200 facts, files in tmp_path
_deepspeed_imported = base._deepspeed_imported

PROFILE = """\
# the operator's own comment
train_data_set_list: {train}
valid_data_set_list: {valid}
output_dir: /data/shared/exp
dataset_conf: {{batch_size: 6000, batch_type: token, sort_size: 64, num_workers: 14}}
train_conf:
  max_epoch: 20
  keep_nbest_models: 2
extra: {{disable_update: true, dataset_conf.batch_sampler: BatchSampler, train_conf.avg_nbest_model: 2}}
"""


def burst(pilot, keys: list[str]) -> None:
    """Send keys as a terminal does when they come faster than the app handles them: all
    queued at once, no pause between them (Pilot's press waits after each key)."""
    app = pilot.app
    for key in keys:
        name = _character_to_key(key) if len(key) == 1 and not key.isalnum() else key
        app._driver.send_message(events.Key(name, key if len(key) == 1 else None))


async def until(pilot, condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def json_tab(pilot):
    screen = await open_config(pilot)
    await pilot.press("f3")
    area = screen.query_one("#json-text", TextArea)
    assert area.has_focus
    return screen, area


def field(screen, key: str):
    return screen.query_one(f"#row-{key.replace('.', '--')}", FieldRow).input


async def test_the_issues_burst_lands_where_it_was_typed(setup):
    """C-Home Down Down End Left BSpace 1 6 in one burst: the JSON is invalid between the
    backspace and the 1 (the form's fill of that moment must not come back as an edit)."""
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen, area = await json_tab(pilot)
        before = area.text
        assert before.splitlines()[2] == '  "gradient_accumulation_steps": 1,'
        for _ in range(2):  # the issue saw it 2 of 2 tries
            burst(pilot, ["ctrl+home", "down", "down", "end", "left", "backspace", "1", "6"])
            expected = before.replace('"gradient_accumulation_steps": 1,',
                                      '"gradient_accumulation_steps": 16,')
            await until(pilot, lambda want=expected: area.text == want
                        or area.text.count("16") > 1, "the burst to be typed")
            await settle(pilot)
            assert area.text == expected
            assert area.cursor_location == (2, len('  "gradient_accumulation_steps": 16'))
            assert field(screen, "gradient_accumulation_steps").value == "16"
            area.load_text(before)
            await settle(pilot)


async def test_a_200_key_burst_and_a_paste_are_exact(setup):
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen, area = await json_tab(pilot)
        before = area.text
        # 200 keys with no delay: a new key typed on a new line 2 (the JSON is invalid for
        # most of the burst, the form refilled meanwhile), then 8 characters of line 4 (the
        # value of gradient_accumulation_steps and more) rewritten as a run of 1s
        note = "x" * 150
        keys = ["ctrl+home", "end", "enter", " ", " ", *'"my_note": "', *note, '"', ",",
                "ctrl+home", "down", "down", "down", "end", "left", *["backspace"] * 8]
        ones = "1" * (200 - len(keys))
        keys += list(ones)
        assert len(keys) == 200
        lines = before.splitlines(keepends=True)
        lines.insert(1, f'  "my_note": "{note}",\n')
        cut = len(lines[3].rstrip("\n")) - 1  # end, left: before the line's trailing ","
        lines[3] = lines[3][:cut - 8] + ones + lines[3][cut:]
        expected = "".join(lines)
        burst(pilot, keys)
        await until(pilot, lambda: len(area.text) >= len(expected), "the burst to be typed")
        await settle(pilot)
        assert area.text == expected and screen.ds_text == expected
        assert area.cursor_location == (3, cut - 8 + len(ones))
        # every key the form manages is still there (a long burst once wiped them)
        for key in ("train_micro_batch_size_per_gpu", "steps_per_print", "gradient_clipping",
                    "zero_optimization.stage", "zero_optimization.reduce_bucket_size"):
            assert field(screen, key).value, key

        # a paste: a whole zero_optimization value replaced at once, through invalid JSON
        area.load_text(before)
        await settle(pilot)
        start = before.index('"stage": 1')
        location = area.document.get_location_from_index(start + len('"stage": '))
        area.selection = (location, (location[0], location[1] + 1))
        # as the terminal driver sends it: to the app, which hands it to the focused editor
        pilot.app._driver.send_message(events.Paste('3,\n    "stage3_max_live_parameters": 1e9'))
        expected = before.replace('"stage": 1', '"stage": 3,\n    "stage3_max_live_parameters": 1e9')
        await until(pilot, lambda: area.text != before, "the paste")
        await settle(pilot)
        assert area.text == expected and screen.ds_text == expected
        assert field(screen, "zero_optimization.stage").value == "3"
        assert field(screen, "zero_optimization.stage3_max_live_parameters").value == "1e9"


async def test_the_form_shows_the_last_valid_json_while_it_is_invalid(setup):
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen, area = await json_tab(pilot)
        before = area.text
        area.text = before.replace('"steps_per_print": 100,', '"steps_per_print": 100')
        await settle(pilot)
        general = str(screen.query_one("#form-general").render())
        assert "JSON has an error at line 5: Expecting ',' delimiter" in general
        assert field(screen, "steps_per_print").value == "100"
        assert field(screen, "zero_optimization.stage").value == "1"
        assert field(screen, "steps_per_print").disabled
        assert area.text == before.replace('"steps_per_print": 100,', '"steps_per_print": 100')
        area.text = before
        await settle(pilot)
        assert "JSON has an error" not in str(screen.query_one("#form-general").render())


async def test_a_form_edit_changes_only_its_value_in_place(setup):
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        area = screen.query_one("#json-text", TextArea)
        area.cursor_location = (10, 4)
        before = area.text
        await type_into(pilot, screen, "gradient_clipping", "1.5")
        await type_into(pilot, screen, "zero_optimization.reduce_bucket_size", "2e8")
        assert area.text == before.replace('"gradient_clipping": 5', '"gradient_clipping": 1.5') \
            .replace('"reduce_bucket_size": 5e8', '"reduce_bucket_size": 2e8')
        assert list(json.loads(area.text)) == list(json.loads(before)), "key order kept"
        assert area.cursor_location == (10, 4), "the editor's cursor stays"


async def test_untouched_files_are_not_rewritten_and_outside_edits_are_never_lost(setup):
    """The issue's case: with Config open, output_dir and max_epoch changed with an editor;
    ctrl+s no longer reverts them, rewrites nothing untouched, and asks before it would."""
    make, directory = setup
    write_data_lists(directory)
    profile_text = PROFILE.format(train=directory / "train.jsonl", valid=directory / "val.jsonl")
    profile_file, ds_file = directory / "training.yaml", directory / "ds_config.json"
    profile_file.write_text(profile_text)
    ds_file.write_text(dsconfig.preset_text("zero1_fp32"))
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        assert screen.unsaved_work() is None
        await pilot.press("ctrl+s")
        await pilot.pause(0.3)
        assert not (directory / "training.yaml.bak").exists()
        assert not (directory / "ds_config.json.bak").exists()
        assert profile_file.read_text() == profile_text

        # an editor changes training.yaml; the screen edits only the JSON: no question, and
        # training.yaml keeps the editor's values
        theirs = profile_text.replace("/data/shared/exp", "/data/shared/exp2") \
            .replace("max_epoch: 20", "max_epoch: 7")
        profile_file.write_text(theirs)
        await type_into(pilot, screen, "steps_per_print", "50")
        assert "ds_config.json" in screen.unsaved_work()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: ds_file.with_suffix(".json.bak").exists(), "the JSON saved")
        assert json.loads(ds_file.read_text())["steps_per_print"] == 50
        assert profile_file.read_text() == theirs, "the outside edit is kept"
        assert not (directory / "training.yaml.bak").exists()

        # now the screen edits training.yaml too: the save asks
        await type_into(pilot, screen, "dataset_conf.num_workers", "8")
        lost = screen.unsaved_work()
        assert lost == "Config: unsaved edits of training.yaml (dataset_conf.num_workers)."
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(pilot.app.screen, OutsideEdit), "the question")
        dialog = pilot.app.screen
        assert "training.yaml changed on disk" in str(dialog.query_one("Static").render())
        assert "-  max_epoch: 20\n+  max_epoch: 7" in dialog.diff           # theirs
        assert "num_workers: 14}" in dialog.diff and "num_workers: 8}" in dialog.diff  # mine
        await pilot.press("d")
        assert dialog.has_class("show-diff")
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert profile_file.read_text() == theirs, "cancel writes nothing"

        # reload theirs: the editor's values appear, the screen's edit of that file is dropped
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(pilot.app.screen, OutsideEdit), "the question")
        await pilot.press("r")
        await settle(pilot)
        assert screen.profile.train_conf.max_epoch == 7
        assert screen.profile.output_dir == "/data/shared/exp2"
        assert field(screen, "train_conf.max_epoch").value == "7"
        assert screen.profile.dataset_conf.num_workers == 14
        assert screen.unsaved_work() is None and profile_file.read_text() == theirs

        # overwrite with mine: only my key's line changes; theirs is kept as .bak
        await type_into(pilot, screen, "dataset_conf.num_workers", "8")
        again = theirs.replace("keep_nbest_models: 2", "keep_nbest_models: 3")
        profile_file.write_text(again)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(pilot.app.screen, OutsideEdit), "the question")
        await pilot.press("o")
        await until(pilot, lambda: (directory / "training.yaml.bak").exists(), "the save")
        await settle(pilot)
        written = profile_file.read_text()
        assert (directory / "training.yaml.bak").read_text() == again
        assert written == theirs.replace("num_workers: 14}", "num_workers: 8}"), \
            "overwrite with mine: the file says what the screen shows, each other line as it was"
        assert screen.unsaved_work() is None


async def test_a_field_left_blank_removes_its_key(setup):
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        before = screen.ds_text
        screen.action_show_tab("tab-form")
        clipping = field(screen, "gradient_clipping")
        clipping.focus()
        clipping.value = ""
        await settle(pilot)
        assert '"gradient_clipping": 5' in screen.ds_text, "not while the field is being retyped"
        await pilot.press("tab")
        await settle(pilot)
        assert "gradient_clipping" not in screen.ds_text
        assert json.loads(screen.ds_text) == {k: v for k, v in json.loads(before).items()
                                              if k != "gradient_clipping"}


async def test_q_with_unsaved_config_edits_asks_then_saves_and_quits(setup):
    """The app's leave prompt (screens/leave.py) asks the Config screen what would be lost:
    cancel keeps the edit, save writes it (through the screen's own error dialog) and quits."""
    leave = pytest.importorskip("screens.leave")
    make, directory = setup
    write_data_lists(directory)
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        await type_into(pilot, screen, "dataset_conf.num_workers", "8")
        await type_into(pilot, screen, "steps_per_print", "50")
        screen.action_leave_field()
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, leave.LeaveDialog), "the question")
        text = " ".join(str(s.render()) for s in app.screen.query("Static"))
        assert "Config: unsaved edits of the new ds_config.json; edits of training.yaml " \
            "(dataset_conf.num_workers)." in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, "back to the Config screen")
        assert app.is_running and field(screen, "steps_per_print").value == "50"
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, leave.LeaveDialog), "the question")
        await pilot.press("s")
        await until(pilot, lambda: not app.is_running or isinstance(app.screen, ConfirmSave),
                    "the save")
        if app.is_running:  # the config has errors (the data lists of the H200 facts' cluster)
            await pilot.press("y")
        await until(pilot, lambda: not app.is_running, "the app to quit after saving", 60)
    assert json.loads((directory / "ds_config.json").read_text())["steps_per_print"] == 50
    assert "num_workers: 8" in (directory / "training.yaml").read_text()


async def test_facts_arriving_after_an_edit_never_replace_the_text(setup):
    """The default preset follows the cluster only while the new JSON is untouched."""
    from console.training.dsconfig import ClusterSpec
    from screens.messages import ClusterSpecReady

    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        assert screen.ds_text == dsconfig.preset_text("seed_zero1_bf16")  # H200s, funasr 1.2.6
        await type_into(pilot, screen, "steps_per_print", "50")
        edited = screen.ds_text
        v100 = ClusterSpec.from_overrides(8, "V100", versions={"funasr": "1.2.6"})
        screen.post_message(ClusterSpecReady(v100, "probed"))
        await settle(pilot)
        assert screen.ds_text == edited and screen.query_one("#json-text").text == edited
        status = str(screen.query_one("#config-status").render())
        assert "for this cluster the default is zero1_fp32: fp32: the GPUs of node0 lack bf16" \
            in status
        assert not [f for f in screen.report.findings if "preset was checked" in f.message]
        assert "bf16 needs compute capability 8.0" in " ".join(
            f.message for f in screen.report.errors)


async def test_the_report_says_each_thing_once(setup):
    make, _ = setup
    async with make().run_test(size=(120, 40)) as pilot:
        screen = await open_config(pilot)
        await type_into(pilot, screen, "dataset_conf.batch_size", "80000")  # over 85% of a GPU
        report = str(screen.query_one("#report-text").render())
        assert report.count(dsconfig.ESTIMATE_METHOD[:60]) == 1, "the memory paragraph once"
        assert "above 85%" in report or "above 95%" in report, report
        lines = [ln for ln in report.splitlines() if ln.startswith(("✗", "!", "i"))]
        assert len(lines) == len(set(lines)), "each finding once"
