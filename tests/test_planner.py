"""The resource planner on real logs: the ETA of a finished tiny CPU run measured at 25 % of its
steps is within 20 % of its real duration, the epoch overhead is measured at each boundary, the
band narrows and holds the truth; storage is measured with du/df on real sshd nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.cli import main
from console.training.logparse import TrainStep, parse_file
from console.training.planner import GUIDE_TABLE, estimate_storage, estimate_time

LOGS = Path(__file__).parent / "fixtures" / "logs"


def train_lines(name: str) -> tuple[list[TrainStep], float, float]:
    events = list(parse_file(LOGS / name))
    times = [e.time for e in events if e.time is not None]
    return [e for e in events if isinstance(e, TrainStep)], min(times), max(times)


def predicted_total(steps: list[TrainStep], k: int, start: float) -> tuple[float, object]:
    est = estimate_time(steps[:k])
    assert est is not None
    return est.at - start + est.eta_s, est


def test_eta_at_a_quarter_of_a_tiny_run_is_within_20_percent():
    steps, start, end = train_lines("tiny-cpu-4epoch-node0.log")
    real = end - start
    k = len(steps) // 4
    total, est = predicted_total(steps, k, start)
    assert est.fraction == pytest.approx(0.25, abs=0.02)
    assert abs(total - real) / real < 0.20, (total, real)
    assert est.eta_low_s <= end - est.at <= est.eta_high_s
    assert est.epoch_overhead_s is None and "no epoch has ended yet" in est.notes[0]


def test_boundaries_measure_the_epoch_overhead_and_narrow_the_band():
    steps, start, end = train_lines("tiny-cpu-4epoch-node0.log")
    widths = []
    for k in (len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4):
        total, est = predicted_total(steps, k, start)
        widths.append((est.eta_high_s - est.eta_low_s) / (end - start))
        if k > 15:   # past the first epoch's end
            assert est.epoch_overhead_s is not None and 0.1 < est.epoch_overhead_s < 2.0
            assert abs(total - (end - start)) / (end - start) < 0.10
    assert widths == sorted(widths, reverse=True), widths


def test_h200_run_overhead_is_the_checkpoint_save():
    steps, start, end = train_lines("funasr-sensevoicesmall-zero1-fp32-bs6000.log")
    est = estimate_time(steps[:8])   # in the second epoch
    assert est.steps_per_epoch == 30 and est.max_epoch == 3 and est.steps_total == 90
    assert 15 < est.epoch_overhead_s < 20      # validation + the SenseVoiceSmall save
    assert est.step_s == pytest.approx(0.38, abs=0.05)
    assert est.epoch_s == pytest.approx(30 * est.step_s + est.epoch_overhead_s)


def test_no_estimate_without_two_timed_lines():
    steps, _, _ = train_lines("tiny-cpu-4epoch-node0.log")
    assert estimate_time([]) is None and estimate_time(steps[:1]) is None


def test_storage_is_measured_on_a_node(loopback, tmp_path):
    out = loopback.shared_dir / "plan-exp"
    for ep in (1, 2):
        (out / f"model.pt.ep{ep}").mkdir(parents=True, exist_ok=True)
        (out / f"model.pt.ep{ep}" / "states.pt").write_bytes(b"\0" * 1_000_000)
    (out / "log.txt").write_bytes(b"x" * 10_000)
    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool

    cluster = load_cluster(loopback.cluster_yaml)
    with Pool(cluster) as pool:
        est = estimate_storage(pool, "node0", str(out), str(loopback.shared_dir),
                               keep_nbest=5, max_epoch=10)
        assert est.checkpoint_bytes >= 1_000_000 and est.used_bytes >= 2_010_000
        # 5 kept + model.pt, model.pt.best and the average: 8 checkpoints, plus the log
        assert est.projected_bytes >= 8_000_000 and est.fits is True and est.free_bytes > 0
        tight = estimate_storage(pool, "node0", str(out), str(loopback.shared_dir),
                                 keep_nbest=10 ** 6, max_epoch=10 ** 6)
        assert tight.fits is False and "keep_nbest_models" in tight.findings[0]
        missing = estimate_storage(pool, "node0", str(out / "nope"), str(loopback.shared_dir),
                                   keep_nbest=5, max_epoch=1)
        assert missing.projected_bytes is None and "does not exist" in missing.findings[0]


def test_plan_cli_shows_the_guide_table_for_a_planned_run(loopback, capsys, monkeypatch,
                                                          tmp_path):
    monkeypatch.setenv("SVCONSOLE_STATE_DIR", str(tmp_path / "state"))
    assert main(["--config", str(loopback.cluster_yaml), "plan", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["guide"]] == [r.name for r in GUIDE_TABLE]
    assert doc["guide"][1] == {"name": "standard", "nodes": 3, "gpus": "12×A100",
                               "days": "3-5 days", "storage": "2 TB"}
