"""keys.yaml: bindings remapped by id, bad ids and keys named with file:line:col, conflicts
reported, and a remap really answering in the running app."""

from __future__ import annotations

from test_app import offline_cluster

from console.ssh.pool import Pool
from screens.app import SVConsoleApp
from screens.keymap import bindings, load_keymap, valid_key


def write(tmp_path, text: str):
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return path


def test_every_screen_binding_is_known_by_id():
    known = bindings()
    for bid in ("screen.gpus", "app.quit", "app.help", "gpus.next_node", "nodes.export",
                "logs.search"):
        assert bid in known, bid
    assert known["app.quit"].keys == ("q",) and known["app.quit"].scope == "app"


def test_bad_ids_and_keys_are_named_with_their_line(tmp_path):
    path = write(tmp_path, "screen.gpus: f5\n"
                           "gpus.next_nod: j\n"
                           "app.help: ctrl+nothing\n")
    result = load_keymap(path)
    assert result.keymap == {"screen.gpus": "f5"}
    assert f"{path}:2:1: gpus.next_nod: no binding has this id (did you mean gpus.next_node" \
        in result.problems[0]
    assert f"{path}:3:1: app.help: not a key: ctrl+nothing" in result.problems[1]


def test_a_remap_onto_a_taken_key_is_a_conflict(tmp_path):
    path = write(tmp_path, "gpus.next_node: q\n")      # the app's quit
    result = load_keymap(path)
    (problem,) = result.problems
    assert "gpus.next_node: key q is also app.quit (Quit)" in problem and ":1:1:" in problem
    # keys of different screens do not clash
    assert load_keymap(write(tmp_path, "nodes.export: ctrl+o\n")).problems == ()


def test_unreadable_file_is_reported_not_raised(tmp_path):
    result = load_keymap(write(tmp_path, "a: [\n"))
    assert result.keymap == {} and "cannot read it" in result.problems[0]
    assert load_keymap(tmp_path / "none.yaml").problems == ()


def test_key_names():
    assert all(valid_key(k) for k in ("a", "S", "?", "f5", "ctrl+s", "escape", "space",
                                       "shift+tab", "question_mark"))
    assert not any(valid_key(k) for k in ("", "f99", "ctrl+nothing", "two words"))


async def test_a_remapped_key_answers_in_the_app(tmp_path):
    result = load_keymap(write(tmp_path, "screen.gpus: f5\n"))
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            app.set_keymap(result.keymap)
            await pilot.press("f5")
            await pilot.pause()
            assert app.current_mode == "gpus"
    finally:
        pool.close()


async def test_keys_yaml_is_applied_at_start_and_its_problems_said(tmp_path, monkeypatch):
    monkeypatch.setenv("SVCONSOLE_KEYS", str(write(tmp_path, "screen.gpus: f5\nnope.x: a\n")))
    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert any("nope.x: no binding has this id" in n.message
                       for n in app._notifications)
            await pilot.press("f5")
            await pilot.pause()
            assert app.current_mode == "gpus"
    finally:
        pool.close()
