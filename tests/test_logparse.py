"""console.training.logparse on real FunASR / DeepSpeed / torchrun lines (tests/fixtures/logs, cut from
the H200 runs in shared/fixtures/h200) and on their pathological variants."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.training.logparse import (
    BestModel,
    CheckpointSaved,
    DeepSpeedTimers,
    EarlyStop,
    Eta,
    Event,
    ExceptionRaised,
    HydraError,
    LogParser,
    NoImprovement,
    Phase,
    TracebackLine,
    TrainStep,
    Unparsed,
    ValResult,
    ValStep,
    WorkerExit,
    parse_file,
    parse_line,
    parse_lines,
)

LOGS = Path(__file__).parent / "fixtures" / "logs"
FP32 = LOGS / "funasr-sensevoicesmall-zero1-fp32-bs6000.log"
BF16_FAIL = LOGS / "funasr-sensevoicesmall-zero1-bf16-dtype-failure.log"
FUSED_FAIL = LOGS / "deepspeed-fusedadam-jit-failure.log"
DS_RUN = LOGS / "deepspeed-zero1-bf16-run.log"


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def first(path: Path, needle: str) -> str:
    return next(line for line in lines_of(path) if needle in line)


TRAIN_LINE = first(FP32, " - train, rank: 0, epoch: 0/3, data_slice: 0/1, step_in_slice: 5/30")


def test_real_train_line_every_field() -> None:
    ev = parse_line(TRAIN_LINE, line_no=7, offset=99)
    assert isinstance(ev, TrainStep) and ev.kind == "train"
    assert (ev.line_no, ev.offset, ev.text, ev.level) == (7, 99, TRAIN_LINE, "INFO")
    assert (ev.rank, ev.epoch, ev.max_epoch) == (0, 0, 3)
    assert (ev.data_slice, ev.data_slices, ev.step_in_slice, ev.steps_in_slice) == (0, 1, 5, 30)
    assert (ev.step_in_epoch, ev.total_step) == (5, 5)
    assert (ev.loss, ev.loss_avg_slice, ev.ppl, ev.acc, ev.lr) == (
        151.133, 364.813, 2.732e158, 0.0, 6.0e-4)
    assert ev.stats == {"loss_ctc": 141.118, "loss_rich": 10.015, "loss": 151.133, "acc_rich": 0.0}
    assert ev.timings == {"data_load": 0.008, "forward_time": 0.097, "backward_time": 0.278,
                          "optim_time": 0.054, "total_time": 0.439}
    assert (ev.mem_usage_gb, ev.mem_peak_gb, ev.mem_cache_gb, ev.mem_cache_peak_gb) == (
        3.559, 20.901, 24.301, 24.301)
    # Hydra's asctime, read as local time
    assert ev.time is not None and abs(ev.time % 60 - 55.439) < 1e-6


def test_every_train_line_of_the_real_run() -> None:
    steps = [e for e in parse_file(str(FP32)) if isinstance(e, TrainStep)]
    assert len(steps) == sum(" - train, rank: " in line for line in lines_of(FP32)) == 18
    assert [e.total_step for e in steps] == list(range(5, 95, 5))
    assert all(e.lr and 3e-4 < e.lr < 1e-3 for e in steps)
    assert all(len(e.stats) == 4 and len(e.timings) == 5 for e in steps)


@pytest.mark.parametrize("value, expected", [
    ("nan", math.nan), ("-inf", -math.inf), ("inf", math.inf), ("-3.250", -3.25),
    ("1.139e+14", 1.139e14),
])
def test_pathological_losses(value: str, expected: float) -> None:
    line = TRAIN_LINE.replace("(loss_avg_rank: 151.133)", f"(loss_avg_rank: {value})") \
        .replace("('loss', 151.133)", f"('loss', {value})")
    ev = parse_line(line)
    assert isinstance(ev, TrainStep)
    for got in (ev.loss, ev.stats["loss"]):
        assert got is not None
        assert (math.isnan(got) and math.isnan(expected)) or got == expected
    assert ev.to_dict()["loss_avg_rank"] == (expected if math.isfinite(expected) else None)


def test_val_line_with_lr_zero() -> None:
    # the validation tag and lr 0 as trainer_ds.log writes them with tag="val"
    line = (TRAIN_LINE.replace(" - train, ", " - val, ").replace("(lr: 6.000e-04)", "(lr: 0.000e+00)")
            .replace("step_in_slice: 5/30", "step_in_slice: 3/3"))
    ev = parse_line(line)
    assert isinstance(ev, ValStep) and ev.kind == "val"
    assert ev.lr == 0.0 and ev.steps_in_slice == 3 and ev.loss == 151.133


def test_without_hydra_prefix_and_with_torchrun_prefix() -> None:
    bare = TRAIN_LINE.split("[INFO] - ", 1)[1]
    ev = parse_line(bare)
    assert isinstance(ev, TrainStep) and ev.time is None and ev.total_step == 5
    ev = parse_line("[rank1]: " + bare.replace("rank: 0,", "rank: 1,"))
    assert isinstance(ev, TrainStep) and ev.rank == 1
    ev = parse_line("[rank3]:" + TRAIN_LINE)
    assert isinstance(ev, TrainStep) and ev.rank == 0 and ev.level == "INFO"  # line's own rank


def test_interleaved_ranks() -> None:
    r1 = TRAIN_LINE.replace("rank: 0,", "rank: 1,").replace("loss_avg_rank: 151.133",
                                                              "loss_avg_rank: -2.5")
    events = list(parse_lines([TRAIN_LINE, r1, TRAIN_LINE.replace("total step: 5", "total step: 10"),
                               r1.replace("total step: 5", "total step: 10")]))
    assert [(e.rank, e.total_step, e.loss) for e in events] == [  # type: ignore[attr-defined]
        (0, 5, 151.133), (1, 5, -2.5), (0, 10, 151.133), (1, 10, -2.5)]
    assert [e.line_no for e in events] == [1, 2, 3, 4]


def test_checkpoint_best_val_eta_phase_lines_of_the_real_run() -> None:
    events = list(parse_file(str(FP32)))
    by_kind: dict[type, list[Event]] = {}
    for e in events:
        by_kind.setdefault(type(e), []).append(e)
    saved = by_kind[CheckpointSaved]
    assert [e.path for e in saved] == [  # type: ignore[attr-defined]
        "/data/shared/outputs/fp32_bs6000/model.pt.ep1", "/data/shared/outputs/fp32_bs6000/model.pt.ep2"]
    best = by_kind[BestModel]
    assert [(e.metric, e.value) for e in best] == [  # type: ignore[attr-defined]
        ("loss", 94.4361), ("loss", 94.1798), ("loss", 94.049)]
    assert all(e.path.endswith("model.pt.best") for e in best)  # type: ignore[attr-defined]
    val = by_kind[ValResult]
    assert [e.value for e in val] == [94.43608856201172, 94.1798324584961, 94.04896545410156]  # type: ignore[attr-defined]
    assert math.isinf(val[0].best_before) and val[0].to_dict()["best_before"] is None  # type: ignore[attr-defined,arg-type]
    phases = [(e.phase, e.epoch) for e in by_kind[Phase]]  # type: ignore[attr-defined]
    assert phases[:3] == [("train", 0), ("validate", 1), ("save", 1)]
    etas = by_kind[Eta]
    # FunASR logs the ETA after an empty message: the figures are on a line of their own
    assert [(e.scope, e.rank, e.elapsed_hours, e.remaining_hours) for e in etas] == [  # type: ignore[attr-defined]
        ("slice", 0, 0.004, 0.012), ("epoch", 0, 0.009, 0.026), ("slice", 0, 0.004, 0.007),
        ("epoch", 0, 0.008, 0.017), ("slice", 0, 0.003, 0.003)]
    assert etas[0].data_slices == 1 and etas[0].slices_remaining == 1 and etas[0].epochs == 3  # type: ignore[attr-defined]


def test_early_stop_and_no_improvement_lines() -> None:
    # formats of funasr/bin/train_ds.py and trainer_ds.py (1.4.16)
    p = "[2026-11-30 01:02:03,004][root][INFO] - "
    ev = parse_line(p + "Early stopping triggered at epoch 7")
    assert isinstance(ev, EarlyStop) and ev.epoch == 7
    ev = parse_line(p + "No val_loss improvement for 2/3 epochs")
    assert isinstance(ev, ValResult) and not ev.improved and (ev.epochs_no_improve, ev.patience) == (2, 3)
    ev = parse_line(p + "No improvement in loss: 95.1000 > 94.0490, /out/model.pt.ep3")
    assert isinstance(ev, NoImprovement) and (ev.metric, ev.value, ev.best) == ("loss", 95.1, 94.049)
    ev = parse_line(p + "Update best acc: 0.9100, /out/model.pt.best")
    assert isinstance(ev, BestModel) and (ev.metric, ev.value) == ("acc", 0.91)


def test_hydra_error_traceback_and_exit_of_the_real_failure() -> None:
    events = list(parse_file(str(BF16_FAIL)))
    hydra = [e for e in events if isinstance(e, HydraError)]
    assert len(hydra) == 1
    assert "++train_conf.use_deepspeed=true" in hydra[0].overrides
    assert "++dataset_conf.batch_size=6000" in hydra[0].overrides
    exc = [e for e in events if isinstance(e, ExceptionRaised)]
    assert (exc[0].exc_type, exc[0].rank) == ("RuntimeError", 0)
    assert exc[0].message == "mat1 and mat2 must have the same dtype, but got Float and BFloat16"
    assert exc[1].exc_type.endswith("ChildFailedError")
    frames = [e for e in events if isinstance(e, TracebackLine) and e.file]
    assert any(e.file.endswith("funasr/train_utils/trainer_ds.py") and e.rank == 0 for e in frames)
    exits = [e for e in events if isinstance(e, WorkerExit)]
    assert [(e.exitcode, e.local_rank, e.pid) for e in exits] == [(1, 0, 1348)]


def test_sigkill_exit_line() -> None:
    line = ("E1130 03:12:50.274000 1326 torch/distributed/elastic/multiprocessing/api.py:986] "
            "failed (exitcode: -9) local_rank: 3 (pid: 4242) of binary: /opt/venv/bin/python")
    ev = parse_line(line)
    assert isinstance(ev, WorkerExit) and (ev.exitcode, ev.local_rank, ev.pid) == (-9, 3, 4242)


def test_deepspeed_wall_clock_breakdown_variants() -> None:
    events = [e for e in parse_file(str(DS_RUN)) if isinstance(e, DeepSpeedTimers)]
    lines = [line for line in lines_of(DS_RUN) if line.startswith("[Rank 0] time (ms)")]
    assert len(events) == len(lines) > 100
    variants = {tuple(e.timers) for e in events}
    assert variants == {
        ("optimizer_allgather", "optimizer_gradients", "optimizer_step"),
        ("fwd_microstep", "bwd_microstep", "bwd_inner_microstep", "bwd_allreduce_microstep",
         "step_microstep"),
        ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"),
    }
    step = next(e for e in events if "bwd_allreduce" in e.timers)
    assert step.timers == {"fwd": 173.39, "bwd": 50.32, "bwd_inner": 47.92, "bwd_allreduce": 2.21,
                           "step": 608.62}
    assert step.allreduce_ms == 2.21 and step.rank == 0
    # DeepSpeed's logger prefix in front (log_dist through the logger)
    ev = parse_line("[2026-11-30 00:15:52,325] [INFO] [logging.py:107:log_dist] "
                    "[Rank 3] time (ms) | fwd: 84.21 | bwd: 199.80 | bwd_allreduce: 2500.5 | step: 42.07")
    assert isinstance(ev, DeepSpeedTimers) and ev.rank == 3 and ev.allreduce_ms == 2500.5
    assert ev.level == "INFO"


def test_deepspeed_warning_prefix_is_read() -> None:
    line = first(FP32, "[WARNING] [torch_autocast.py")
    ev = parse_line(line)
    assert isinstance(ev, Unparsed) and ev.level == "WARNING" and ev.time is not None


# --- incremental parsing ----------------------------------------------------------------------

def _key(e: Event) -> tuple:
    return (type(e), e.line_no, e.offset, e.text, e.rank)


def test_random_chunks_give_the_same_events_as_whole_lines() -> None:
    data = FP32.read_bytes() + b"[2026-11-30 00:17:07,000][root][INFO] - Early stopping triggered at epoch 3"
    reference = [_key(e) for e in parse_lines(data.decode().split("\n"))]
    rng = random.Random(6)
    for _ in range(5):
        parser = LogParser()
        got = []
        pos = 0
        while pos < len(data):
            n = rng.choice([1, 2, 3, 7, 64, 1000, 4096, 100_000])
            got += parser.feed(data[pos:pos + n])
            pos += n
        assert parser.pending > 0  # the last line has no newline yet
        got += parser.flush()
        assert [_key(e) for e in got] == reference
        assert parser.offset == len(data)


def test_resume_from_offset_neither_loses_nor_repeats() -> None:
    data = BF16_FAIL.read_bytes()
    full = [_key(e) for e in parse_file(str(BF16_FAIL))]
    rng = random.Random(110)
    for cut in rng.sample(range(len(data)), 20):
        first_half = LogParser()
        events = first_half.feed(data[:cut])  # connection drops mid-line
        resumed = LogParser(offset=first_half.offset, line_no=first_half.line_no)
        events += resumed.feed(data[first_half.offset:]) + resumed.flush()
        assert [_key(e) for e in events] == full
        # the offsets point at the lines' real bytes
        for e in events[:3] + events[-3:]:
            assert data[e.offset:].startswith(e.text.encode())


def test_feed_line_counts_bytes_like_feed() -> None:
    text = "[rank0]: RuntimeError: 例外 nan\n" + TRAIN_LINE + "\n"
    a = LogParser()
    by_bytes = a.feed(text.encode())
    b = LogParser()
    by_lines = [b.feed_line(t) for t in text.split("\n")[:-1]]
    assert [_key(e) for e in by_bytes] == [_key(e) for e in by_lines]
    assert a.offset == b.offset == len(text.encode())


def test_crlf_carriage_returns_bad_bytes_and_runaway_lines() -> None:
    parser = LogParser(max_line=64)
    events = parser.feed(b"progress 10%\rprogress 90%\r\n\xff\xfe broken\n" + b"x" * 150 + b"\n")
    assert events[0].text == "progress 90%"
    assert events[1].text == "\ufffd\ufffd broken"
    assert [len(e.text) for e in events[2:]] == [64, 64, 22]
    assert parser.offset == 27 + 10 + 151
    assert parser.pending == 0
    # the same cut whatever the chunking
    again = LogParser(max_line=64)
    pieces = [again.feed(bytes([b])) for b in b"x" * 150 + b"\n"]
    assert [len(e.text) for p in pieces for e in p] == [64, 64, 22]
    exact = LogParser(max_line=64)
    assert [len(e.text) for e in exact.feed(b"y" * 64 + b"\n")] == [64]


# --- tolerance --------------------------------------------------------------------------------

REAL_LINES = [line for line in lines_of(FP32) + lines_of(BF16_FAIL) + lines_of(FUSED_FAIL)
              if line.strip()][::7] + [TRAIN_LINE]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parse_line_never_raises_on_random_text(text: str) -> None:
    text = text.replace("\n", " ")
    ev = parse_line(text)
    assert isinstance(ev, Event) and ev.text == text
    ev.to_dict()


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(REAL_LINES), st.data())
def test_parse_line_never_raises_on_mutated_real_lines(line: str, data: st.DataObject) -> None:
    chars = list(line)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, max(len(chars) - 1, 0)))
        op = data.draw(st.sampled_from(["delete", "replace", "insert", "cut"]))
        junk = data.draw(st.sampled_from(["", "9" * 30, "-", "e+", "nan", ")", "(", "'", "/", ": ",
                                          ", ", "[", "]", "{", "}", "\x00", "é"]))
        if op == "delete" and chars:
            del chars[i]
        elif op == "replace" and chars:
            chars[i:i + 1] = list(junk)
        elif op == "insert":
            chars[i:i] = list(junk)
        else:
            chars = chars[:i]
    text = "".join(chars)
    ev = parse_line(text)
    assert ev.text == text
    ev.to_dict()


# --- lines as they come: prefixes cut anywhere, other loggers in front ------------------------

def test_train_and_val_lines_with_the_prefix_cut_anywhere() -> None:
    """A pasted log keeps any tail of Hydra's prefix, and even a tail of the tag itself."""
    tag_at = TRAIN_LINE.index("train, rank: ")
    val_line = TRAIN_LINE.replace(" - train, ", " - val, ")
    for line, cls, start in ((TRAIN_LINE, TrainStep, tag_at), (val_line, ValStep, tag_at)):
        tag_len = 5 if cls is TrainStep else 3
        for cut in range(start + tag_len):  # every cut before the tag ends
            ev = parse_line(line[cut:])
            assert isinstance(ev, cls), (cut, line[cut:cut + 30])
            assert (ev.rank, ev.total_step, ev.loss) == (0, 5, 151.133)
            assert ev.stats["loss_ctc"] == 141.118 and ev.mem_peak_gb == 20.901
            if cut < start - 8:  # "[INFO] - " or a part of it with the level left
                assert ev.level == "INFO", cut


@pytest.mark.parametrize("prefix, rank", [
    ("[rank3]:", 0), ("[rank3]: ", 0), ("[default0]:", 0), ("[default1]: ", 0),
    ("2026-11-30 00:15:55,439 - root - INFO - ", 0), ("I1130 00:15:55.439000 1326 trainer.py:88] ", 0),
    ("node2: ", 0), ("\x1b[32m", 0),
])
def test_train_lines_behind_other_loggers(prefix: str, rank: int) -> None:
    message = TRAIN_LINE.split("[INFO] - ", 1)[1]
    for line in (prefix + message, prefix + TRAIN_LINE):
        ev = parse_line(line)
        assert isinstance(ev, TrainStep), line[:60]
        assert (ev.rank, ev.total_step, ev.step_in_slice, ev.loss) == (rank, 5, 5, 151.133)
        assert ev.text == line


def test_a_local_rank_prefix_is_not_taken_for_the_global_rank() -> None:
    ev = parse_line("[default1]: RuntimeError: CUDA out of memory.")
    assert isinstance(ev, ExceptionRaised) and ev.rank is None
    assert parse_line("[rank5]: RuntimeError: CUDA out of memory.").rank == 5


def test_step_words_elsewhere_are_not_step_lines() -> None:
    for line in ("retrain, rank: 0, total step: 5", "pre-val, rank: 1, total step: 2",
                 "[2026-11-30 00:15:55,439][root][INFO] - rank: 0, total step: 5",
                 "the train, rank: high"):
        assert not isinstance(parse_line(line), TrainStep | ValStep), line


def test_the_fast_path_reads_what_the_general_path_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """FunASR 1.4's own layout is read by one regex; every real line, and its pathological and
    prefixed variants, gives the same event as the field-by-field path."""
    import re

    import console.training.logparse as lp

    lines = [line for line in lines_of(FP32) if " - train, " in line or " - val, " in line]
    lines += [TRAIN_LINE.replace("(loss_avg_rank: 151.133)", f"(loss_avg_rank: {v})")
              .replace("('loss', 151.133)", f"('loss', {v})") for v in ("nan", "-inf", "1.139e+14",
                                                                          "-3.25", "oops")]
    lines += ["[rank2]: " + TRAIN_LINE, TRAIN_LINE[30:], TRAIN_LINE.replace(" - train,", " - val,")]
    fast = [parse_line(line, line_no=i, offset=7 * i).to_dict() for i, line in enumerate(lines)]
    monkeypatch.setattr(lp, "_STEP_LINE", re.compile(r"(?!)"))
    slow = [parse_line(line, line_no=i, offset=7 * i).to_dict() for i, line in enumerate(lines)]
    assert fast == slow
    assert all(d["kind"] in ("train", "val") for d in fast) and len(fast) > 20
