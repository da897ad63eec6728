"""console.training.metrics (the bounded per-run store) and ``svconsole metrics --log``."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from console.cli import Context
from console.commands import metrics as metrics_command
from console.training.logparse import (
    BestModel,
    CheckpointSaved,
    TrainStep,
    ValResult,
    parse_file,
    parse_line,
    parse_lines,
)
from console.training.metrics import HISTORY_COLUMNS, MetricsStore, Series

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "logs"
FP32 = LOGS / "funasr-sensevoicesmall-zero1-fp32-bs6000.log"
BF16_FAIL = LOGS / "funasr-sensevoicesmall-zero1-bf16-dtype-failure.log"
SMI_CSV = FIXTURES / "h200" / "nvidia-smi-during-funasr-training.csv"
TRAIN_LINE = next(line for line in FP32.read_text().splitlines() if " - train, rank: 0," in line)


def train_line(rank: int = 0, step: int = 5, loss: str = "151.133", *, epoch: int = 0,
               step_in_epoch: int | None = None, stamp: str | None = None) -> str:
    """The real line with another rank, step, loss (and timestamp)."""
    line = (TRAIN_LINE.replace("rank: 0,", f"rank: {rank},")
            .replace("total step: 5,", f"total step: {step},")
            .replace("step_in_epoch: 5,", f"step_in_epoch: {step_in_epoch or step},")
            .replace("epoch: 0/3", f"epoch: {epoch}/3")
            .replace("(loss_avg_rank: 151.133)", f"(loss_avg_rank: {loss})"))
    return line.replace("2026-11-30 00:15:55,439", stamp) if stamp else line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- Series -----------------------------------------------------------------------------------

def test_series_is_bounded_and_keeps_a_spike() -> None:
    s = Series(capacity=500)
    n = 200_000
    for x in range(n):
        s.add(x, 1.0 + (x % 7) * 0.01 if x != 123_457 else 1.139e14)
    assert len(s) <= 500 and s.count == n and s.per_bucket >= n // 500
    pts = s.points()
    spike = [p for p in pts if p[3] == 1.139e14]
    assert len(spike) == 1
    bucket = next(b for b in s.buckets if b.high == 1.139e14)
    assert bucket.x_first <= 123_457 <= bucket.x_last
    assert min(p[2] for p in pts) == 1.0  # the lows survive too
    assert sum(b.count for b in s.buckets) == n
    assert pts[-1][0] == n - 1 and s.last == (n - 1, 1.0 + ((n - 1) % 7) * 0.01)


def test_series_nan_and_inf() -> None:
    s = Series(capacity=2)
    for x, y in enumerate([math.nan, math.nan, 2.0, 4.0, math.inf, 1.0]):
        s.add(x, y)
    d = s.to_dict()
    assert d["count"] == 6 and len(d["x"]) == 2
    assert d["mean"][0] == 3.0 and d["min"][0] == 2.0  # nan left out of the stats
    assert d["mean"][1] is None and d["max"][1] is None and d["min"][1] == 1.0  # inf as null
    only_nan = Series(capacity=4)
    only_nan.add(0, math.nan)
    assert only_nan.to_dict()["mean"] == [None]
    with pytest.raises(ValueError):
        Series(capacity=1)


# --- the store ----------------------------------------------------------------------------------

def test_real_run_into_the_store(tmp_path: Path) -> None:
    events = list(parse_file(str(FP32)))
    steps = [e for e in events if isinstance(e, TrainStep)]
    with MetricsStore(tmp_path / "history.csv") as store:
        store.add_all(events, node="gpu1")
        val = store.series("val_loss")
        assert val is not None
        assert [(p[0], p[1]) for p in val.points()] == [
            (30, e.value) for e in events if isinstance(e, ValResult)][:1] + [
            (60, 94.1798324584961), (90, 94.04896545410156)]
        [rank] = store.ranks()
        assert (rank.rank, rank.node, rank.last_step, rank.loss) == (0, "gpu1", 90, steps[-1].loss)
        assert rank.gpu_peak_gb == steps[-1].mem_peak_gb and rank.lr == steps[-1].lr
        times = [e.timings["total_time"] for e in steps]
        assert rank.step_time_s == statistics.median(times[-20:])
        assert 0.28 <= rank.step_time_s <= 0.45  # the H200 reading
        p = store.progress()
        assert (p.epoch, p.max_epoch, p.steps_per_epoch, p.total_step) == (2, 3, 30, 90)
        assert p.funasr_eta_hours == 0.003 and p.steps_per_s == pytest.approx(1 / rank.step_time_s)
        kinds = [type(i.event) for i in store.feed()]
        assert kinds.count(CheckpointSaved) == 2 and kinds.count(BestModel) == 3
        assert store.grad_sync()["rank0"]["verdict"] == "normal"
        assert store.findings() == []
        names = store.series_names()
        for name in ("loss/rank0", "lr/rank0", "stat/loss_ctc/rank0", "timing/total_time/rank0",
                     "mem/peak_gb/rank0", "grad_sync_ms/rank0", "loss/mean"):
            assert name in names
        lr = store.series("lr/rank0")
        assert lr is not None and [p[1] for p in lr.points()] == [e.lr for e in steps]
        doc = json.loads(json.dumps(store.to_json(), allow_nan=False))
        assert doc["ranks"][0]["last_step"] == 90
        assert doc["loss_mean"]["x"] == [e.total_step for e in steps]
    with (tmp_path / "history.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(steps)
    assert [float(r["loss"]) for r in rows] == [e.loss for e in steps]
    assert json.loads(rows[0]["stats"]) == steps[0].stats


def test_mean_over_interleaved_ranks() -> None:
    lines = []
    for step in (5, 10, 15):
        lines += [train_line(0, step, f"{step}.0"), train_line(1, step, f"-{step}.5")]
    store = MetricsStore()
    store.add_all(parse_lines(lines[:-1]))
    # step 15 has only rank 0 so far: shown with the ranks seen
    assert store.mean_loss() == [(5, -0.25, -0.25, -0.25), (10, -0.25, -0.25, -0.25),
                                 (15, 15.0, 15.0, 15.0)]
    store.add(parse_line(lines[-1]))  # rank 1's step 15: the same point, updated
    assert store.mean_loss() == [(5, -0.25, -0.25, -0.25), (10, -0.25, -0.25, -0.25),
                                 (15, -0.25, -0.25, -0.25)]
    assert len(store.series("loss/mean")) == 0  # type: ignore[arg-type]  # all still open
    store.close()
    assert [p[0] for p in store.mean_loss()] == [5, 10, 15]
    assert len(store.series("loss/mean")) == 3  # type: ignore[arg-type]  # final at the end


def two_nodes_read_apart() -> tuple[list, list]:
    """The real log as node0 (rank 0) and as node1 (rank 1, its train lines only)."""
    events = list(parse_file(str(FP32)))
    return events, [replace(e, rank=1) for e in events if isinstance(e, TrainStep)]


def test_mean_and_validation_of_a_log_read_ahead_of_another() -> None:
    node0, node1 = two_nodes_read_apart()
    steps = [e for e in node0 if isinstance(e, TrainStep)]
    vals = [e.value for e in node0 if isinstance(e, ValResult)]
    store = MetricsStore()
    store.add_all(node1, node="node1")  # a reattached follower read node1 to its end first
    store.add_all(node0, node="node0")
    mean = store.mean_loss()
    assert [p[0] for p in mean] == [e.total_step for e in steps]  # each step once, in order
    assert [p[1] for p in mean] == pytest.approx([e.loss for e in steps])
    val = store.series("val_loss")
    assert val is not None and [(p[0], p[1]) for p in val.points()] == [
        (30, vals[0]), (60, vals[1]), (90, vals[2])]  # where each belongs, not at step 90
    points = val.points()
    store.add_all(node0, node="node0")  # the same lines again: nothing counted twice
    assert store.mean_loss() == mean
    assert store.series("val_loss").points() == points  # type: ignore[union-attr]
    store.close()


def test_mean_window_is_bounded_and_old_steps_are_final() -> None:
    node0, node1 = two_nodes_read_apart()
    steps = [e for e in node0 if isinstance(e, TrainStep)]
    store = MetricsStore(mean_window=8)
    store.add_all(node1, node="node1")
    assert len(store._open_means) == 8  # noqa: SLF001 - the bound
    store.add_all(node0, node="node0")
    mean = store.mean_loss()
    xs = [p[0] for p in mean]
    assert xs == sorted(set(xs)) == [e.total_step for e in steps]  # no step charted twice
    # rank 0 came after the first 82 steps were final: those are rank 1's alone (the same
    # losses here), the last 8 were still open and count both ranks
    assert [p[1] for p in mean] == pytest.approx([e.loss for e in steps])
    final = store.series("loss/mean")
    assert final is not None and final.count == len(steps) - 8
    store.close()
    assert final.count == len(steps) and store.mean_loss() == mean
    with pytest.raises(ValueError, match="mean_window must be at least 1"):
        MetricsStore(mean_window=0)


def test_validation_point_from_the_val_line() -> None:
    val_line = train_line(0, 30, "94.5", epoch=1).replace("] - train, ", "] - val, ")
    stamp = TRAIN_LINE.split(" - ", 1)[0]
    store = MetricsStore()
    store.add_all(parse_lines([train_line(0, 30), val_line,
                               f"{stamp} - current_val: 94.4, best_val_loss: inf",
                               train_line(0, 60, epoch=1)]), node="node0")
    store.add_all(parse_lines([train_line(1, 90, epoch=2)]), node="node1")  # read ahead
    store.add(parse_line(f"{stamp} - current_val: 94.1, best_val_loss: 94.4"), node="node0")
    store.add(parse_line(f"{stamp} - current_val: 94.0, best_val_loss: 94.1"), node="node0")
    val = store.series("val_loss")
    # epoch 1's result at the val line's step; the next two (no epoch known) keyed by node0's
    # step: the second replaces the first
    assert val is not None and [(p[0], p[1]) for p in val.points()] == [(30, 94.4), (60, 94.0)]
    assert store.series("val_loss/rank0").points() == [(30, 94.5, 94.5, 94.5)]  # type: ignore[union-attr]
    store.close()


def test_hundred_thousand_steps_stay_bounded(tmp_path: Path) -> None:
    store = MetricsStore(tmp_path / "h.csv", capacity=200, max_events=50)
    n = 100_000
    for i in range(n):
        step = i // 2 + 1
        loss = 1.139e14 if i == 77_777 else 2.0 + (i % 13) * 0.05
        store.add(TrainStep(rank=i % 2, total_step=step, epoch=0, max_epoch=1, loss_avg_rank=loss,
                            lr=1e-4, stats={"loss_ctc": loss}, timings={"total_time": 0.3},
                            mem_usage_gb=3.5, text=f"step {step} rank {i % 2}", line_no=i + 1),
                  node="n0")
        if i % 1000 == 0:
            store.add(CheckpointSaved(path=f"/out/model.pt.ep{i}", line_no=i + 1))
    for name in store.series_names():
        series = store.series(name)
        assert series is not None and len(series) <= 200, name
    assert len(store.feed()) == 50
    assert len(store._open_means) <= store.mean_window  # noqa: SLF001 - open means: bounded
    assert len(store.mean_loss()) <= 200
    loss1 = store.series("loss/rank1")
    assert loss1 is not None and loss1.count == n // 2
    assert max(p[3] for p in loss1.points()) == 1.139e14  # the spike survives downsampling
    [spike] = [f for f in store.findings() if f.id == "loss-divergence"]
    assert spike.rank == 1 and spike.line_no == 77_778 and "1.139e+14" in spike.detail
    store.close()
    assert store.series("loss/mean").count == n // 2  # type: ignore[union-attr]  # each step once
    with (tmp_path / "h.csv").open() as f:
        assert sum(1 for _ in f) == n + 1  # the full history, on disk


def test_nan_and_spike_lines_from_real_format() -> None:
    store = MetricsStore()
    for i, loss in enumerate(["150.1", "-3.2", "120.0", "99.0", "130.5", "101.2", "88.8", "140.0",
                              "95.0", "110.0", "1.139e+14", "nan"]):
        store.add(parse_line(train_line(0, 5 * (i + 1), loss), line_no=i + 1), node="n0")
    found = [f for f in store.findings() if f.id == "loss-divergence"]
    assert len(found) == 1 and found[0].count == 2  # the spike, then the nan line (once)
    assert found[0].evidence[0].endswith(train_line(0, 55, "1.139e+14").split(" - ", 1)[1])
    assert found[0].line_no == 11
    doc = store.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["series"]["loss/rank0"]["mean"][-1] is None  # nan as null
    assert doc["series"]["loss/rank0"]["mean"][1] == -3.2
    store.close()


def test_step_time_from_timestamps_and_eta() -> None:
    store = MetricsStore()
    for k, step in enumerate((5, 10, 15)):
        line = train_line(0, step, stamp=f"2026-11-30 01:00:0{2 * k},000")
        line = line.split(", {'data_load'")[0]  # no timings dict
        store.add(parse_line(line))
    p = store.progress()
    assert p.step_time_s == pytest.approx(0.4)
    # epoch 0 of 3, step 15 of 30: 15 + 2 * 30 steps left
    assert p.eta_s == pytest.approx(75 * 0.4)
    store.close()


def test_stalled_rank_with_a_clock() -> None:
    clock = Clock()
    store = MetricsStore(clock=clock, min_stall_s=30.0)
    for step in range(1, 101):
        clock.now += 1.0
        for rank in (0, 1) if step <= 50 else (0,):
            store.add(parse_line(train_line(rank, step, "2.0"), line_no=step * 2 + rank),
                      node=f"node{rank}")
    [stall] = [f for f in store.findings() if f.id == "stalled-rank"]
    assert (stall.rank, stall.node) == (1, "node1")
    assert "silent for 50 s" in stall.detail and "total step: 50," in stall.evidence[0]
    rows = {r.rank: r for r in store.ranks()}
    assert rows[1].seconds_since == 50.0 and rows[0].seconds_since == 0.0
    clock.now += 1000  # everyone silent: a pause, not a stalled rank
    assert not [f for f in store.findings() if f.id == "stalled-rank"]
    store.close()


def test_gradient_sync_verdict_from_deepspeed_lines() -> None:
    store = MetricsStore()
    for i in range(10):
        store.add(parse_line(f"[Rank 1] time (ms) | fwd: 84.21 | bwd: 199.80 | bwd_inner: 177.25 | "
                             f"bwd_allreduce: {2400 + i}.41 | step: 42.07", line_no=i + 1))
        store.add(parse_line("[Rank 0] time (ms) | fwd: 84.21 | bwd: 199.80 | bwd_inner: 177.25 | "
                             "bwd_allreduce: 22.41 | step: 42.07"))
    series = store.series("grad_sync_ms/rank1")
    assert series is not None and [p[0] for p in series.points()] == list(range(1, 11))
    sync = store.grad_sync()
    assert sync["rank0"]["verdict"] == "normal" and sync["rank1"]["verdict"] == "bad"
    [slow] = [f for f in store.findings() if f.id == "slow-gradient-sync"]
    assert slow.rank == 1 and slow.line_no == 10 and "bad" in slow.detail
    store.close()


def test_low_gpu_util_from_real_samples() -> None:
    store = MetricsStore()
    with SMI_CSV.open() as f:
        for row in csv.reader(f, skipinitialspace=True):
            if float(row[2]) > 1000:  # while the training process held GPU memory
                t = datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                store.add_gpu_sample("h200", 0, t, float(row[1]))
    [low] = store.findings()
    assert (low.id, low.node) == ("low-gpu-util", "h200") and "below 50%" in low.detail
    store.close()


def test_csv_and_png_exports(tmp_path: Path) -> None:
    store = MetricsStore()
    store.add_all(parse_file(str(FP32)))
    store.add(parse_line(train_line(0, 95, "1.139e+14")))
    out = store.to_csv(tmp_path / "m.csv")
    with out.open() as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == HISTORY_COLUMNS and len(rows) == 1 + 19
    png = store.to_png(tmp_path / "m.png", title="fp32 bs6000")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    store.close()


def test_history_file_is_appended_across_stores(tmp_path: Path) -> None:
    path = tmp_path / "run" / "history.csv"
    for step in (5, 10):
        with MetricsStore(path) as store:
            store.add(parse_line(train_line(0, step)))
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["total_step"] for r in rows] == ["5", "10"]


# --- svconsole metrics --------------------------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="svconsole")
    metrics_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["metrics", *argv])
    out = io.StringIO()
    return args.func(args, Context(out=out, interactive=False)), out.getvalue()


@pytest.fixture()
def nan_log(tmp_path: Path) -> Path:
    path = tmp_path / "node1.log"
    lines = [train_line(1, 5, "nan"), train_line(1, 10, "-0.5"), "[rank1]: garbage \x00 line"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_json(nan_log: Path) -> None:
    code, text = run_cli("--log", str(FP32), str(nan_log), "--json")
    assert code == 0
    doc = json.loads(text)
    assert [f["node"] for f in doc["files"]] == [FP32.stem, "node1"]
    train = [r for r in doc["lines"] if r["kind"] == "train"]
    assert len(train) == 20
    first = train[0]
    assert (first["rank"], first["epoch"], first["total_step"], first["loss_avg_rank"],
            first["lr"]) == (0, 0, 5, 151.133, 0.0006)
    assert first["stat_loss_ctc"] == 141.118 and first["total_time_s"] == 0.439
    assert first["mem_peak_gb"] == 20.901
    nan_row = next(r for r in train if r["node"] == "node1")
    assert nan_row["loss_avg_rank"] is None and nan_row["rank"] == 1  # nan as null
    assert train[-1]["loss_avg_rank"] == -0.5
    assert {r["kind"] for r in doc["lines"]} >= {"ds_timers", "eta", "best", "checkpoint"}
    assert not [r for r in doc["lines"] if r["kind"] == "unparsed"]
    assert "NaN" not in text


def test_cli_all_keeps_unparsed(nan_log: Path) -> None:
    code, text = run_cli("--log", str(nan_log), "--json", "--all")
    rows = json.loads(text)["lines"]
    assert [r["kind"] for r in rows] == ["train", "train", "unparsed"]
    assert rows[2]["text"] == "[rank1]: garbage \x00 line" and rows[2]["rank"] == 1


def test_cli_csv_to_file(tmp_path: Path, nan_log: Path) -> None:
    out = tmp_path / "lines.csv"
    code, text = run_cli("--log", str(nan_log), "--csv", str(out))
    assert code == 0 and str(out) in text
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["rank"], r["total_step"], r["loss_avg_rank"]) for r in rows] == [
        ("train", "1", "5", ""), ("train", "1", "10", "-0.5")]


def test_cli_png(tmp_path: Path) -> None:
    code, text = run_cli("--log", str(FP32), "--png", str(tmp_path / "loss.png"))
    assert code == 0 and (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_summary_names_the_fault_and_fix() -> None:
    code, text = run_cli("--log", str(BF16_FAIL))
    assert code == 1
    assert "ERROR: bf16 dtype mismatch in FunASR's forward [bf16-dtype-mismatch]" in text
    assert "rank 0" in text and "but got Float and BFloat16" in text and "fix: " in text
    code, text = run_cli("--log", str(FP32))
    assert code == 0 and "faults: none found" in text and "validation loss: 94.44 (step 30)" in text
    assert "gradient sync (median bwd_allreduce; < 500 ms normal, > 2000 ms bad): rank0 " in text


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    assert run_cli("run-42")[0] == 2  # no such run here, nor on the (local) cluster's nodes
    assert "run-42" in capsys.readouterr().err
    assert run_cli()[0] == 2
    assert run_cli("run-42", "--log", str(FP32))[0] == 2
    assert "one of the two" in capsys.readouterr().err
    missing = tmp_path / "nope.log"
    assert run_cli("--log", str(missing))[0] == 2
    assert f"{missing}: No such file or directory" in capsys.readouterr().err


def test_cli_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    from console.cli import main

    assert main(["metrics", "--log", str(FP32), "--csv"]) == 0
    assert capsys.readouterr().out.startswith("node,line,kind,rank,time,epoch,max_epoch,total_step")


# --- run stalls, stragglers, estimated gradient sync ----------------------------------------

def timed_line(rank: int, step: int, *, data: float = 0.002, fwd: float = 0.1,
               bwd: float = 0.2, opt: float = 0.05, total: float | None = None) -> str:
    """A real train line with these phase times (total: their sum unless given)."""
    total = data + fwd + bwd + opt if total is None else total
    timings = (f"{{'data_load': '{data:.3f}', 'forward_time': '{fwd:.3f}', "
               f"'backward_time': '{bwd:.3f}', 'optim_time': '{opt:.3f}', "
               f"'total_time': '{total:.3f}'}}")
    line = train_line(rank, step)
    start = line.index("{'data_load'")
    return line[:start] + timings + line[line.index("}", start) + 1:]


def test_run_stall_names_every_silent_rank_and_the_one_behind() -> None:
    clock = Clock()
    store = MetricsStore(clock=clock)
    for step in range(1, 31):
        clock.now += 0.5
        for rank in (0, 1, 2):
            if step == 30 and rank == 1:
                continue  # rank 1 froze before its step 30 line; the others wait in all_reduce
            store.add(parse_line(train_line(rank, step), line_no=step), node=f"node{rank}")
    assert store.run_stall() is None
    clock.now += 59.0
    assert not [f for f in store.findings() if f.id == "run-stalled"]
    clock.now += 2.0
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert (stall.rank, stall.node, stall.severity.value) == (1, "node1", "error")
    assert stall.detail.startswith("no step line from any rank for 61 s (threshold 60 s")
    assert "ranks 0, 1, 2 stopped logging" in stall.detail
    assert "behind: rank 1 on node1 at step 29, the others at step 30" in stall.detail
    assert len(stall.evidence) == 3 and "total step: 29," in stall.evidence[1]
    assert stall.evidence[1].startswith("rank 1 on node1, 62 s ago: [2026-11-30")  # 0.5 s earlier
    # the one-rank detector stays quiet: nobody logs, so nobody is singled out by it
    assert not [f for f in store.findings() if f.id == "stalled-rank"]
    # a diagnosis of this stall is shown in it, and names the rank it found
    since = store.run_stall().since
    store.set_stall_diagnosis(since, "all reachable: see svconsole stacks; rank 2 on node2 is "
                              "stopped (state T)", rank=2, node="node2")
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert (stall.rank, stall.node) == (2, "node2")
    assert stall.detail.endswith("diagnosis: all reachable: see svconsole stacks; rank 2 on "
                                 "node2 is stopped (state T)")
    # steps again: the stall and its diagnosis are over
    store.add(parse_line(train_line(1, 30)), node="node1")
    assert store.run_stall() is None
    assert not [f for f in store.findings() if f.id == "run-stalled"]
    clock.now += 1000
    store.run_ended()
    assert store.run_stall() is None
    store.close()


def test_run_stall_threshold_follows_the_step_time_and_the_startup_allowance() -> None:
    clock = Clock()
    store = MetricsStore(clock=clock, startup_allowance_s=300)
    store.watch_run(clock.now)
    clock.now += 299
    assert store.run_stall() is None
    clock.now += 2
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert stall.detail == ("no step line from any rank 301 s after the start (start-up "
                            "allowance 300 s)")
    for step in range(1, 6):  # slow steps: 40 s each, so the threshold is 120 s
        clock.now += 40
        store.add(parse_line(timed_line(0, step, fwd=10, bwd=20, opt=10)), node="n0")
        store.add(parse_line(timed_line(1, step, fwd=10, bwd=20, opt=10)), node="n1")
    clock.now += 110
    assert store.run_stall() is None
    clock.now += 11
    stall = store.run_stall()
    assert stall is not None and stall.threshold_s == pytest.approx(120.0, abs=0.1)
    assert "3 x median step 40.00 s" in stall.detail() and stall.behind == ()
    store.close()


DATALOADER_LINE = ("[2026-11-30 00:15:40,000][root][INFO] - rank: {rank}, dataloader start "
                   "from step: 0, batch_num: 3, batch_num_after_step: 3")


def test_a_quiet_start_up_is_a_stall_once_the_ranks_show_why() -> None:
    """Before the first step, a log quiet for startup_quiet_s is suspected (worth a look at the
    ranks), not a stall; confirmed by the ranks it is one at once, naming the rank, until a
    line comes. After the allowance the plain start-up stall takes over."""
    clock = Clock()
    store = MetricsStore(clock=clock, startup_allowance_s=900)
    store.watch_run(clock.now)
    clock.now += 20
    store.add(parse_line(DATALOADER_LINE.format(rank=1)), node="n1")
    clock.now += 29
    assert store.suspected_stall() is None  # quiet 29 s
    clock.now += 2
    quiet = store.suspected_stall()
    assert quiet is not None and quiet.since == 1020.0 and quiet.startup
    assert quiet.silent_s == pytest.approx(31.0)
    assert not [f for f in store.findings() if f.id == "run-stalled"]  # a lead, not a stall
    store.confirm_stall(quiet, "stacks: rank 1 on n1 is stopped (state T)", rank=1, node="n1")
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert (stall.rank, stall.node) == (1, "n1")
    assert stall.detail.startswith("no step line yet, and no line from any rank for 31 s (51 s "
                                   "after the start;") and "is stopped (state T)" in stall.detail
    clock.now += 5
    store.add(parse_line(DATALOADER_LINE.format(rank=0)), node="n0")
    assert not [f for f in store.findings() if f.id == "run-stalled"]  # the start-up goes on
    assert store.suspected_stall() is None
    clock.now += 900
    assert store.suspected_stall() is None  # past the allowance: the plain start-up stall
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert "start-up allowance 900 s" in stall.detail
    store.close()


def test_a_silence_after_steps_is_a_stall_before_the_minimum_once_the_ranks_show_why() -> None:
    """After steps, a silence of max(3x median step, early_stall_s) is suspected; confirmed,
    the stall names the rank at once and keeps its diagnosis when the minimum is reached; a
    step ends it."""
    clock = Clock()
    store = MetricsStore(clock=clock)
    for step in range(1, 6):
        clock.now += 1
        for rank in (0, 1):
            store.add(parse_line(timed_line(rank, step)), node=f"n{rank}")
    clock.now += 19
    assert store.suspected_stall() is None  # 19 s < 20 s
    clock.now += 2
    quiet = store.suspected_stall()
    assert quiet is not None and not quiet.startup and quiet.threshold_s == 20.0
    assert store.run_stall() is None and not [f for f in store.findings()
                                              if f.id == "run-stalled"]
    store.confirm_stall(quiet, "stacks: rank 1 on n1 is stopped (state T)", rank=1, node="n1")
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert (stall.rank, stall.node) == (1, "n1")
    assert stall.detail.startswith("no step line from any rank for 21 s (looked at after 20 s, "
                                   "before the 60 s minimum")
    clock.now += 40  # the minimum: the plain stall, with the diagnosis already made
    assert store.suspected_stall() is None
    [stall] = [f for f in store.findings() if f.id == "run-stalled"]
    assert (stall.rank, stall.node) == (1, "n1") and "diagnosis: stacks: rank 1" in stall.detail
    store.add(parse_line(timed_line(0, 6)), node="n0")
    assert not [f for f in store.findings() if f.id == "run-stalled"]
    store.close()


def test_straggler_named_with_its_slow_phase_and_the_others_not() -> None:
    store = MetricsStore()
    for step in range(1, 31):
        jitter = 0.004 * (step % 3)
        # rank 2 is slow in forward; the others wait for it in backward's all-reduce
        store.add(parse_line(timed_line(0, step, fwd=0.10 + jitter, bwd=0.35)), node="n0")
        store.add(parse_line(timed_line(1, step, fwd=0.10, bwd=0.35 + jitter)), node="n1")
        store.add(parse_line(timed_line(2, step, fwd=0.25, bwd=0.20)), node="n2")
    [straggler] = store.stragglers()
    assert (straggler.rank, straggler.node, straggler.phase) == (2, "n2", "forward_time")
    assert straggler.steps == 20 and straggler.excess == pytest.approx(0.43, abs=0.02)
    [finding] = [f for f in store.findings() if f.id == "straggler"]
    assert (finding.rank, finding.node) == (2, "n2")
    assert finding.detail.startswith("rank 2 on n2 is a straggler: 0.502 s a step of its own "
                                     "against 0.35")
    assert "slow phase forward: 0.250 s against 0.10" in finding.detail
    rows = {r.rank: r for r in store.ranks()}
    assert rows[2].rel_time == pytest.approx(0.43, abs=0.02)
    assert rows[0].rel_time == pytest.approx(0.0, abs=0.03)
    # the wait shows as estimated gradient sync on the waiting ranks: 150 ms, normal
    assert rows[0].grad_sync_est_ms == pytest.approx(150, abs=10)
    assert rows[2].grad_sync_est_ms == pytest.approx(0)
    sync = store.grad_sync()
    assert sync["rank0"]["estimated"] and sync["rank0"]["verdict"] == "normal"
    series = store.series("grad_sync_est_ms/rank1")
    assert series is not None and series.count == 30
    store.close()


def test_no_straggler_in_a_balanced_run_or_below_the_window() -> None:
    store = MetricsStore()
    for step in range(1, 5):
        for rank in (0, 1, 2):
            store.add(parse_line(timed_line(rank, step, fwd=0.3 if rank == 1 else 0.1)))
    assert store.stragglers() == []  # 4 steps: below the minimum window of 5
    balanced = MetricsStore()
    for step in range(1, 41):
        for rank in (0, 1, 2):
            wobble = 0.01 * ((step + rank) % 4)  # every rank the slowest now and then
            balanced.add(parse_line(timed_line(rank, step, fwd=0.1 + wobble)))
    assert balanced.stragglers() == []
    assert not [f for f in balanced.findings() if f.id in ("straggler", "slow-gradient-sync")]
    with pytest.raises(ValueError, match="at least 5"):
        MetricsStore(straggler_window=4)
    store.close()
    balanced.close()


def test_estimated_gradient_sync_thresholds_raise_findings() -> None:
    store = MetricsStore()
    for step in range(1, 11):
        store.add(parse_line(timed_line(0, step, bwd=2.6, fwd=0.1)), node="n0")
        store.add(parse_line(timed_line(1, step, bwd=0.3, fwd=2.4)), node="n1")
    [slow] = [f for f in store.findings() if f.id == "slow-gradient-sync"]
    assert (slow.rank, slow.node) == (0, "n0")
    assert slow.detail.startswith("estimated gradient sync 2300 ms a step")
    assert slow.detail.endswith("over the last 10 steps: bad")
    store.close()


def test_exporter_serves_each_ranks_time_relative_to_the_median() -> None:
    from console.exporter import EngineCollector, RunWatcher, _Families

    store = MetricsStore()
    for step in range(1, 21):
        store.add(parse_line(timed_line(0, step, fwd=0.10, bwd=0.35)), node="n0")
        store.add(parse_line(timed_line(1, step, fwd=0.25, bwd=0.20)), node="n1")
    watcher = RunWatcher(None, None)  # type: ignore[arg-type]  # serves attached runs only
    watcher.attach("run-x", store, nodes=["n0", "n1"])
    collector = EngineCollector(None, None, watcher)  # type: ignore[arg-type]
    out = _Families()
    collector._runs(out, store.clock())
    [family] = [f for f in out if f.name == "svconsole_run_step_time_relative"]
    got = {s.labels["rank"]: s.value for s in family.samples}
    median = statistics.median([0.352, 0.502])
    assert got == pytest.approx({"0": 0.352 / median - 1, "1": 0.502 / median - 1}, abs=0.01)
    assert [(f.id, f.rank) for f in store.findings()] == [("straggler", 1)]
    store.close()
