"""The ':' command line: verbs and arguments parsed (with the reason when not), completion of
verbs and of node names, and the dialog returning the command."""

from __future__ import annotations

import pytest
from textual.app import App

from screens.cmdline import Command, CommandError, CommandLine, CommandSuggester, parse


def test_verbs_and_arguments():
    assert parse(":nodes") == Command("nodes")
    assert parse("logs node2") == Command("logs", ("node2",))
    assert parse(":stop 20261201-0915") == Command("stop", ("20261201-0915",))
    assert parse(":q") == Command("quit")
    assert parse(":gp") == Command("gpus") and parse(":log node1") == Command("logs", ("node1",))
    assert parse(":sta") == Command("stacks")           # a unique start
    with pytest.raises(CommandError, match="no such command .*did you mean :setup, :stop, "
                                           ":stacks"):
        parse(":s")                                      # not unique
    with pytest.raises(CommandError, match=":zz: no such command"):
        parse(":zz")
    with pytest.raises(CommandError, match=":gpus takes no argument"):
        parse(":gpus node1")
    with pytest.raises(CommandError, match="type a command"):
        parse(":")


async def test_completion_of_verbs_and_node_names():
    s = CommandSuggester({"logs": ["node0", "node1", "node2"]})
    assert await s.get_suggestion(":st") == ":stop"
    assert await s.get_suggestion(":logs node") == ":logs node0"
    assert await s.get_suggestion(":logs node2") is None
    assert await s.get_suggestion(":zz") is None


class Host(App):
    def __init__(self):
        super().__init__()
        self.got: list = []

    def on_mount(self) -> None:
        self.push_screen(CommandLine({"logs": ["node0", "node1"]}), self.got.append)


async def test_the_dialog_returns_the_command_or_says_what_is_wrong():
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for key in "bogus":
            await pilot.press(key)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CommandLine) and app.got == []
        assert "no such command" in str(app.screen.query_one("#cmd-help").render())
        box = app.screen.query_one("Input")
        box.value = ":logs no"
        box.cursor_position = len(box.value)
        await pilot.pause(0.3)
        await pilot.press("right")            # take the completion
        await pilot.press("enter")
        await pilot.pause()
        assert app.got == [Command("logs", ("node0",))]


async def test_colon_opens_the_command_line_and_runs_it_in_the_app():
    from test_app import offline_cluster

    from console.ssh.pool import Pool
    from screens.app import SVConsoleApp

    cluster = offline_cluster()
    pool = Pool(cluster)
    app = SVConsoleApp(cluster, pool, health_interval=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("colon")
            await pilot.pause()
            assert isinstance(app.screen, CommandLine)
            for key in "gpus":
                await pilot.press(key)
            await pilot.press("enter")
            await pilot.pause()
            assert app.current_mode == "gpus"
            await pilot.press("colon", "n", "o", "d", "e", "s", "enter")
            await pilot.pause()
            assert app.current_mode == "nodes"
    finally:
        pool.close()
