"""The stale and wrong texts an operator saw (the babysitting issue's list), each reproduced
and held fixed: GPU alarms only during a live run, the Nodes screen's readiness following the
node states live, the hostfile export refusing like the CLI, the Setup phases lettered."""

from __future__ import annotations

import time

from test_gpus_screen import a_run, fed_app, feed, low_rows, overview_of, show, training_sample

from screens.messages import RunFollowed


async def wait_until(pilot, predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def test_gpu_alarms_stop_when_the_followed_run_has_ended():
    app, pool = fed_app(["node0", "node1"])
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await show(pilot)
            hot = training_sample(low_rows(2), mem_pct=97.0)   # ranks still on the GPUs
            feed(screen, "node0", hot)
            live = a_run({"node0": 0, "node1": 1})
            screen.post_message(live)
            await wait_until(pilot, lambda: "alarm" in overview_of(screen), "the run's alarms")
            ended = RunFollowed(live.record, live.ranks, live=False)
            screen.post_message(ended)
            feed(screen, "node0", hot)                           # the same readings, after it
            await wait_until(pilot, lambda: not screen.board.in_run, "the run to end")
            await wait_until(pilot, lambda: "alarm" not in overview_of(screen),
                             "the alarms to go")
    finally:
        pool.close()
