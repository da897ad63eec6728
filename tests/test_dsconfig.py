"""The DeepSpeed config engine: each kind of bad config gives its finding, the seed's config is
valid on a real-sized cluster, the memory estimate matches the H200 run, and the layer that needs
deepspeed says so when deepspeed is missing. DeepSpeed itself (0.19.x, CPU) does the checking."""

from __future__ import annotations

import argparse
import copy
import io
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from console.cli import Context
from console.cluster.probe import GPUInfo, NodeFacts
from console.commands import validate as validate_cmd
from console.training import dsconfig
from console.training.dsconfig import ClusterSpec, Finding, gpu_model
from console.training.profile import default_profile

FIXTURES = Path(__file__).parent / "fixtures" / "dsconfig"
SEED = json.loads(dsconfig.preset_text("seed_zero1_bf16"))
A100_3x4 = ClusterSpec.from_overrides(12, "A100", nodes=3, cpu_cores=32, shared_dir="/data/shared")
#: A stack bf16 trains with (funasr before 1.4), and the one it fails with (funasr 1.4.x).
OLD_STACK = {"funasr": "1.2.6", "deepspeed": "0.16.4", "torch": "2.6.0"}
NEW_STACK = {"funasr": "1.4.16", "deepspeed": "0.19.8", "torch": "2.13.0"}
A100_OLD = ClusterSpec.from_overrides(12, "A100", nodes=3, cpu_cores=32, shared_dir="/data/shared",
                                      versions=OLD_STACK)


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_loaded() -> None:
    assert dsconfig.warm_up() is not None, dsconfig.deepspeed_problem()


def _text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)


def _with(change: Callable[[dict[str, Any]], None], base: dict[str, Any] = SEED) -> str:
    data = copy.deepcopy(base)
    change(data)
    return _text(data)


def _fp32(data: dict[str, Any]) -> None:
    data["bf16"]["enabled"] = False


@dataclass
class Case:
    id: str
    text: str
    severity: str
    layer: str
    field: str
    message: str                     # regex searched in the message
    cluster: ClusterSpec | None = A100_3x4
    profile_changes: tuple[tuple[str, Any], ...] = ()
    line: int | None = None


DUPLICATE = '{\n  "train_micro_batch_size_per_gpu": 1,\n  "steps_per_print": 100,\n' \
            '  "steps_per_print": 10\n}\n'
BROKEN = '{\n  "train_micro_batch_size_per_gpu": 1\n  "steps_per_print": 100\n}\n'

CASES = [
    Case("pydantic-enum", _with(lambda d: d["zero_optimization"].update(stage=7)),
         "error", "deepspeed", "zero_optimization.stage", r"^Input should be 0, 1, 2, 3"),
    Case("batch-product", _with(lambda d: d.update(train_batch_size=8)),
         "error", "deepspeed", "train_batch_size", r"8 != 1 \* 1 \* 12"),
    Case("unknown-zero-key", _with(lambda d: d["zero_optimization"].update(reduce_bucket=5)),
         "error", "deepspeed", "zero_optimization.reduce_bucket", "Extra inputs are not permitted"),
    Case("offload-device", _with(lambda d: d["zero_optimization"].update(
        offload_optimizer={"device": "gpu"})), "error", "deepspeed",
         "zero_optimization.offload_optimizer.device", "Input should be 'none', 'cpu' or 'nvme'"),
    Case("unknown-top-level", _with(lambda d: d.update(gradient_acumulation_steps=2)),
         "warning", "deepspeed", "gradient_acumulation_steps",
         "did you mean 'gradient_accumulation_steps'"),
    Case("auto", _with(lambda d: d["zero_optimization"].update(reduce_bucket_size="auto")),
         "warning", "deepspeed", "zero_optimization.reduce_bucket_size", '"auto"'),
    Case("deepspeed-warning", _with(lambda d: d["zero_optimization"].update(cpu_offload=True)),
         "warning", "deepspeed", "zero_optimization.cpu_offload",
         "^Config parameter cpu_offload is deprecated use offload_optimizer instead$"),
    Case("top-level-type", _with(lambda d: d.update(steps_per_print="often")),
         "error", "deepspeed", "steps_per_print", "must be a whole number"),
    Case("string-number", _with(lambda d: d["zero_optimization"].update(overlap_comm="true")),
         "warning", "deepspeed", "zero_optimization.overlap_comm", "is a string"),
    Case("bf16-without-enabled", _with(lambda d: d.update(bf16={})),
         "error", "deepspeed", "bf16", "no 'enabled' key"),
    Case("duplicate-key", DUPLICATE, "error", "json", "steps_per_print",
         r"duplicate key \(first at line 3\)", line=4),
    Case("broken-json", BROKEN, "error", "json", "", "Expecting ',' delimiter", line=3),
    Case("bf16-cc70", dsconfig.preset_text("seed_zero1_bf16"), "error", "cluster", "bf16.enabled",
         r"lacking: node0 \(V100, cc 7.0\), node1", ClusterSpec.from_overrides(8, "V100", nodes=2)),
    Case("memory-over-95", _with(_fp32), "error", "cluster", "dataset_conf.batch_size",
         r"estimated .* GiB per GPU is \d+% of 15.0 GiB on node0 \(above 95%\)",
         ClusterSpec.from_overrides(4, "T4"), (("dataset_conf.batch_size", 16000),)),
    Case("memory-over-85", _with(_fp32), "warning", "cluster", "dataset_conf.batch_size",
         r"of 40.0 GiB on node0 \(above 85%\)", ClusterSpec.from_overrides(1, "A100-40GB"),
         (("dataset_conf.batch_size", 8000),)),
    Case("matrix-allgather", _with(lambda d: d["zero_optimization"].update(
        allgather_bucket_size=5e7)), "warning", "matrix",
         "zero_optimization.allgather_bucket_size", "outside the recommended 1e8-1e9"),
    Case("matrix-accumulation", _with(lambda d: d.update(gradient_accumulation_steps=16)),
         "warning", "matrix", "gradient_accumulation_steps", "outside the recommended 1-8"),
    Case("matrix-token-batch", dsconfig.preset_text("seed_zero1_bf16"), "warning", "matrix",
         "dataset_conf.batch_size", "token batch 2000 is outside the recommended 4000-16000",
         profile_changes=(("dataset_conf.batch_size", 2000),)),
    Case("matrix-workers", dsconfig.preset_text("seed_zero1_bf16"), "warning", "matrix",
         "dataset_conf.num_workers", "16 workers per GPU process; about 4 recommended",
         profile_changes=(("dataset_conf.num_workers", 16),)),
    Case("matrix-bf16-off", _with(_fp32), "warning", "matrix", "bf16.enabled", "bf16 is off",
         A100_OLD),
    Case("matrix-bf16-off-unconfirmed", _with(_fp32), "info", "matrix", "bf16.enabled",
         "bf16 is off"),
    Case("bf16-funasr-1.4", dsconfig.preset_text("seed_zero1_bf16"), "error", "cluster",
         "bf16.enabled", r"bf16 dtype mismatch .*\(fault bf16-dtype-mismatch\)",
         ClusterSpec.from_overrides(12, "A100", nodes=3, versions=NEW_STACK)),
    Case("output-dir-not-shared", dsconfig.preset_text("seed_zero1_bf16"), "error", "cluster",
         "output_dir", "is not under the shared directory /data/shared",
         profile_changes=(("output_dir", "/home/me/out"),)),
    Case("fusedadam", _with(lambda d: d.update(optimizer={"type": "AdamW", "params": {"lr": 1e-4}})),
         "warning", "cluster", "optimizer.type", "FusedAdam", ClusterSpec.from_overrides(8, "H100")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_kind_of_bad_config_gives_its_finding(case: Case) -> None:
    profile = default_profile()
    for key, value in case.profile_changes:
        profile = profile.replace(key, value)
    report = dsconfig.validate(case.text, name="ds.json", profile=profile, cluster=case.cluster)
    hits = [f for f in report.findings
            if (f.severity, f.layer, f.field) == (case.severity, case.layer, case.field)
            and re.search(case.message, f.message)]
    assert hits, "\n".join(map(str, report.findings))
    if case.line is not None:
        assert hits[0].line == case.line
    assert hits[0].reason and (hits[0].fix or case.severity != "error")
    assert report.ok is (not report.errors)


def test_broken_json_is_reported_as_file_line_col() -> None:
    report = dsconfig.validate(BROKEN, name="conf/ds.json")
    assert [str(f) for f in report.findings] == [
        "conf/ds.json:3:3: error: Expecting ',' delimiter"]
    assert report.summary == "1 error / 0 warnings / fix the errors before launch"


def test_seed_config_is_valid_on_three_nodes_of_four_a100() -> None:
    report = dsconfig.validate(_text(SEED), profile=default_profile(), cluster=A100_3x4)
    assert report.errors == [], "\n".join(map(str, report.errors))
    assert report.world_size == 12
    assert report.summary.endswith("ready to launch")
    assert report.estimate is not None and report.estimate.in_use_gib < 0.85 * 40


@pytest.mark.parametrize("name", dsconfig.PRESETS)
def test_presets_pass_deepspeed_on_a100s(name: str) -> None:
    report = dsconfig.validate(dsconfig.preset_text(name), profile=default_profile(),
                               cluster=A100_3x4)
    assert not [f for f in report.findings if f.layer in ("json", "deepspeed")], report.findings
    assert report.ok


def test_pydantic_error_is_deepspeed_text_verbatim() -> None:
    text = _with(lambda d: d["zero_optimization"].update(stage=7))
    [hit] = [f for f in dsconfig.validate(text, cluster=A100_3x4).errors]
    assert hit.message == "Input should be 0, 1, 2, 3 or 3 (got 7)"
    assert "DeepSpeedZeroConfig" in hit.reason
    assert (hit.line, hit.col) == (10, 5)


def test_deepspeed_prints_nothing_while_validating(capfd: pytest.CaptureFixture[str]) -> None:
    text = _with(lambda d: d["zero_optimization"].update(cpu_offload=True))
    capfd.readouterr()
    assert dsconfig.validate(text, cluster=A100_3x4).warnings
    out, err = capfd.readouterr()
    assert "deprecated" not in out + err


def test_world_size_is_supplied_and_dist_restored() -> None:
    import deepspeed.runtime.config as ds_config

    before = ds_config.dist
    text = _with(lambda d: d.update(train_batch_size=12))
    assert dsconfig.validate(text, cluster=A100_3x4).ok
    assert not dsconfig.validate(text, cluster=ClusterSpec.from_overrides(8, "A100")).ok
    assert ds_config.dist is before


def test_validation_is_thread_safe_with_different_world_sizes() -> None:
    """train_batch_size 4 is right for 4 GPUs only; threads with other sizes run at once."""
    text = _with(lambda d: d.update(train_batch_size=4))
    verdicts: list[tuple[int, bool]] = []

    def run(world: int) -> None:
        for _ in range(5):
            report = dsconfig.validate(text, cluster=ClusterSpec.from_overrides(world))
            verdicts.append((world, report.ok))

    threads = [threading.Thread(target=run, args=(w,)) for w in (4, 8, 4, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(verdicts) == 20
    assert all(ok == (world == 4) for world, ok in verdicts), verdicts


def test_known_top_level_keys_come_from_deepspeed() -> None:
    known = dsconfig._known_top_level_keys()
    assert {"train_batch_size", "zero_optimization", "bf16", "fp16", "optimizer", "scheduler",
            "gradient_clipping", "wall_clock_breakdown", "steps_per_print"} <= known
    assert "gradient_acumulation_steps" not in known


def test_no_cluster_skips_the_batch_checks_and_says_so() -> None:
    """Without a cluster the world size is unknown: never a silent 1."""
    report = dsconfig.validate(_with(lambda d: d.update(train_batch_size=7)))
    assert report.ok and report.world_size is None
    assert [f.message for f in report.warnings] == ["world size unknown: batch checks skipped"]
    assert any("cluster checks skipped" in f.message for f in report.of("info"))


# ---------------------------------------------------------------- memory estimate


def _h200_run() -> dict[str, float]:
    """The measured numbers, read from the fixture log and nvidia-smi series."""
    log = (FIXTURES / "sensevoicesmall-zero1-fp32-bs6000.log").read_text()
    params = float(re.search(r"Total Number of model parameters: ([\d.]+) M", log).group(1))
    peaks = [float(x) for x in re.findall(r", peak: ([\d.]+) GB", log)]
    reserved = [float(x) for x in re.findall(r"cache_peak: ([\d.]+) GB", log)]
    usage = [float(x) for x in re.findall(r"usage: ([\d.]+) GB", log)]
    stamps = re.findall(r"^\[\d+-\d+-\d+ (\d+:\d+:\d+)", log, re.M)
    used = [int(row.split(",")[2]) for row in
            (FIXTURES / "nvidia-smi-during-funasr-training.csv").read_text().splitlines()
            if stamps[0] <= row.split()[1][:8] <= stamps[-1]]
    return {"params": params * 1e6, "peak": max(peaks), "reserved": max(reserved),
            "steady": max(usage), "smi": max(used) / 1024}


def test_memory_estimate_matches_the_h200_run_within_5_percent() -> None:
    run = _h200_run()
    assert run["params"] == dsconfig.CALIBRATION.params
    fp32_zero1 = json.loads(_with(_fp32))  # the seed's config with bf16 off, as run
    est = dsconfig.estimate_memory(fp32_zero1, token_batch=6000, params=run["params"])
    assert est is not None
    assert est.allocated_gib == pytest.approx(run["peak"], rel=0.05)        # 21.2 GiB
    assert est.reserved_gib == pytest.approx(run["reserved"], rel=0.05)     # 28.0 GiB
    assert est.in_use_gib == pytest.approx(run["smi"], rel=0.05)            # 29.7 GiB
    # DeepSpeed's estimator (with gradients) bounds what stays allocated between steps
    assert run["steady"] < est.model_states_gib < 1.5 * run["steady"]
    assert est.activations_gib > est.model_states_gib + est.buckets_gib  # activations dominate
    assert "one real run" in est.explain() and "+-30%" in est.method


def test_memory_estimate_grows_with_batch_and_shrinks_with_bf16_and_zero() -> None:
    fp32 = json.loads(_with(_fp32))
    small = dsconfig.estimate_memory(fp32, token_batch=4000)
    big = dsconfig.estimate_memory(fp32, token_batch=16000)
    bf16 = dsconfig.estimate_memory(SEED, token_batch=16000)
    zero2 = json.loads(_with(lambda d: d["zero_optimization"].update(stage=2), json.loads(
        _with(_fp32))))
    z2_many = dsconfig.estimate_memory(zero2, token_batch=6000, gpus_per_node=8)
    z2_one = dsconfig.estimate_memory(zero2, token_batch=6000)
    assert small and big and bf16 and z2_many and z2_one
    assert small.allocated_gib < big.allocated_gib
    assert bf16.activations_gib == pytest.approx(big.activations_gib / 2)
    assert z2_many.model_states_gib < z2_one.model_states_gib


# ---------------------------------------------------------------- deepspeed missing


def test_without_deepspeed_the_layer_says_it_did_not_run(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(_text(SEED))
    code = (
        "import sys, json\n"
        "sys.modules['deepspeed'] = None\n"
        "from console.training import dsconfig\n"
        "from console.training.profile import default_profile\n"
        "spec = dsconfig.ClusterSpec.from_overrides(12, 'A100', nodes=3)\n"
        f"r = dsconfig.validate(open({str(tmp_path / 'ds.json')!r}).read(),"
        " profile=default_profile(), cluster=spec)\n"
        "print(json.dumps(r.to_json()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[1], check=True)
    report = json.loads(out.stdout)
    infos = [f["message"] for f in report["findings"] if f["severity"] == "info"]
    assert any("DeepSpeed's own checks did NOT run" in m for m in infos), infos
    assert any("no GPU memory estimate" in m for m in infos), infos
    assert report["estimate"] is None
    assert report["ok"]  # nothing else is wrong with the seed's config


# ---------------------------------------------------------------- text layer and saving


def test_positions_of_nested_keys_and_array_items() -> None:
    doc = dsconfig.parse('{"a": {\n  "b": [1,\n   {"c": 2}]}}', "x.json")
    assert doc.where("a.b") == (2, 3)
    assert doc.where("a.b[1].c") == (3, 5)
    assert doc.where("a.b[1].missing") == (3, 4)
    assert dsconfig.split_field("a.b[1].c") == ("a", "b", 1, "c")
    assert dsconfig.join_field(("a", "b", 1, "c")) == "a.b[1].c"


def test_top_level_must_be_an_object() -> None:
    [f] = dsconfig.validate("[1, 2]").findings
    assert (f.severity, f.layer, f.message) == ("error", "json", "the top level must be a JSON object")


def test_save_keeps_unknown_keys_and_a_backup(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    data = {**SEED, "my_team_note": {"owner": "ops", "ticket": 42}}
    dsconfig.save(path, data)
    assert json.loads(path.read_text()) == data
    data2 = {**data, "steps_per_print": 10}
    dsconfig.save(path, data2)
    assert json.loads(path.read_text())["my_team_note"] == {"owner": "ops", "ticket": 42}
    assert json.loads((tmp_path / "ds.json.bak").read_text()) == data
    with pytest.raises(json.JSONDecodeError):
        dsconfig.save(path, "{broken")
    assert json.loads(path.read_text()) == data2


# ---------------------------------------------------------------- cluster spec


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("A100", "A100"), ("a100-40gb", "A100-40GB"),
    ("NVIDIA A10", "A10"), ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"), ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    ("NVIDIA L40S", "L40S"), ("Quadro K420", None),
])
def test_gpu_names(name: str, expected: str | None) -> None:
    model = gpu_model(name)
    assert (model.name if model else None) == expected


def test_overrides_need_an_even_split_and_a_known_gpu() -> None:
    with pytest.raises(ValueError, match="does not split evenly"):
        ClusterSpec.from_overrides(10, "A100", nodes=3)
    with pytest.raises(ValueError, match="unknown GPU 'K420'"):
        ClusterSpec.from_overrides(4, "K420")
    spec = ClusterSpec.from_overrides(4, cc="7.5", mem_gb=15)
    assert [(n.cc, n.memory_gib, n.gpu_count) for n in spec.nodes] == [("7.5", 15, 4)]


def test_cluster_from_probe_facts() -> None:
    from console.cluster.model import Cluster, Node

    cluster = Cluster(name="c", shared_dir="/data/shared", nodes=(
        Node("a", "10.0.0.1"), Node("b", "10.0.0.2", gpus=(1,)), Node("c", "10.0.0.3")))
    h200 = [GPUInfo(i, "NVIDIA H200", memory_total_mb=143771, compute_capability="9.0")
            for i in range(2)]
    facts = {
        "a": NodeFacts("a", ok=True, cpu_cores=64, gpus=h200,
                       python={"funasr": "1.4.16", "deepspeed": "0.19.8"}),
        "b": NodeFacts("b", ok=True, cpu_cores=16, cpu_usable=8, gpus=[
            GPUInfo(0, "Tesla V100-SXM2-16GB", memory_total_mb=16384, compute_capability="7.0"),
            GPUInfo(1, "NVIDIA A100-SXM4-80GB", memory_total_mb=81920, compute_capability="8.0")]),
    }
    spec = ClusterSpec.from_facts(cluster, facts)
    assert spec.world_size == 3 and spec.source == "inventory"
    a, b = spec.nodes
    assert (a.gpu_count, a.cc, round(a.memory_gib, 1), a.cpu_cores) == (2, "9.0", 140.4, 64)
    assert dict(a.versions) == {"funasr": "1.4.16", "deepspeed": "0.19.8"}
    assert (b.gpu_count, b.gpu_name, b.cc, b.cpu_cores) == (1, "NVIDIA A100-SXM4-80GB", "8.0", 8)
    assert spec.notes == ("c: no facts",)
    # funasr 1.4.16 on node a confirms the bf16 failure: an error there
    report = dsconfig.validate(_text(SEED), profile=default_profile(), cluster=spec)
    [hit] = [f for f in report.errors if "dtype" in f.message]
    assert hit.field == "bf16.enabled" and "on a" in hit.message


# ---------------------------------------------------------------- data files

GOOD = {"key": "utt1", "source": "/d/a.wav", "source_len": 420, "target": "hello",
        "target_len": 5, "text_language": "<|en|>", "emo_target": "<|NEUTRAL|>",
        "event_target": "<|Speech|>", "with_or_wo_itn": "<|woitn|>"}


@pytest.mark.parametrize("line,problem", [
    ({**GOOD}, None),
    ({k: v for k, v in GOOD.items() if k != "emo_target"}, "train.jsonl:3: emo_target: missing"),
    ({**GOOD, "source_len": "420"}, 'train.jsonl:3: source_len: must be a positive whole number'),
    ({**GOOD, "text_language": "en"}, 'train.jsonl:3: text_language: must be a tag like <|zh|>'),
    ("{not json", "train.jsonl:3: not JSON"),
])
def test_jsonl_first_bad_line(line: Any, problem: str | None) -> None:
    lines = [json.dumps(GOOD), "", line if isinstance(line, str) else json.dumps(line),
             "{also bad"]
    got = dsconfig.check_jsonl_lines(lines, "train.jsonl")
    if problem is None:
        assert got == "train.jsonl:4: not JSON: Expecting property name enclosed in double " \
                      "quotes (column 2)"
    else:
        assert got is not None and got.startswith(problem)


def test_data_lists_on_every_node(tmp_path: Path) -> None:
    """``run`` really runs the command, in a directory per node (the nodes' filesystems)."""
    for node, lines in (("n0", [GOOD, GOOD]), ("n1", [GOOD, {**GOOD, "target_len": 0}])):
        (tmp_path / node / "data").mkdir(parents=True)
        (tmp_path / node / "data" / "train.jsonl").write_text(
            "\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / "n1" / "data" / "val.jsonl").write_text(json.dumps({**GOOD, "key": ""}) + "\n")

    @dataclass
    class Ran:
        returncode: int
        stdout: str
        stderr: str

        @property
        def ok(self) -> bool:
            return self.returncode == 0

    def run(node: str, cmd: str) -> Ran:
        p = subprocess.run(["bash", "-c", cmd], cwd=tmp_path / node, capture_output=True,
                           text=True, timeout=10)
        return Ran(p.returncode, p.stdout, p.stderr)

    profile = default_profile().replace("train_data_set_list", "data/train.jsonl") \
        .replace("valid_data_set_list", "data/val.jsonl")
    found = dsconfig.check_data_on_nodes(run, ["n0", "n1"], profile)
    messages = sorted(f.message for f in found)
    assert messages == ["data/val.jsonl is not readable on n0",
                        "n1:data/val.jsonl:1: key: must be a non-empty string, got \"\""]
    assert all(f.severity == "error" and f.layer == "cluster" for f in found)
    # n0's copy is the one sampled for train.jsonl; n1's bad line 2 is found when n1 comes first
    [bad] = dsconfig.check_data_on_nodes(run, ["n1"], profile.replace(
        "valid_data_set_list", "data/train.jsonl"))[:1]
    assert bad.message.startswith("n1:data/train.jsonl:2: target_len")


def test_a_node_that_did_not_answer_is_not_called_unreadable():
    """Seen on the tour: an unreachable node's data list was reported "not readable"."""
    from console.ssh.pool import Result

    def run(node: str, cmd: str) -> Result:
        return Result(node, None, "", "", 0.0, "node2 down since 3 s: connection refused")

    profile = default_profile()
    found = dsconfig.check_data_on_nodes(run, ["node2"], profile)
    assert found and all(f.severity == "warning" for f in found)
    assert all("could not be checked on node2 (node2 down since 3 s: connection refused)"
               in f.message and "not readable" not in f.message for f in found)


# ---------------------------------------------------------------- the CLI


def _cli(tmp_path: Path, *argv: str) -> tuple[int, str]:
    (tmp_path / "cluster.yaml").write_text(
        "cluster:\n  name: lab\n  shared_dir: /data/shared\n"
        "nodes:\n  - name: n0\n    host: 10.0.0.1\n")
    parser = argparse.ArgumentParser()
    validate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["validate", *argv])
    out = io.StringIO()
    ctx = Context(str(tmp_path / "cluster.yaml"), out=out, interactive=False)
    try:
        return args.func(args, ctx), out.getvalue()
    finally:
        ctx.close()


def test_cli_seed_on_a100s_passes_and_v100s_fail(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(_text(SEED))
    rc, out = _cli(tmp_path, str(ds), "--world-size", "12", "--nodes", "3", "--gpu", "A100")
    assert rc == 0, out
    assert out.splitlines()[0] == "cluster (overrides): 3 nodes, world size 12; A100 cc 8.0 40 GiB"
    assert out.splitlines()[-1].endswith("ready to launch")
    rc, out = _cli(tmp_path, str(ds), "--world-size", "8", "--gpu", "V100", "--json")
    report = json.loads(out)
    assert rc == 1 and not report["ok"]
    assert {f["field"] for f in report["findings"] if f["severity"] == "error"} == {
        "bf16.enabled", "dataset_conf.batch_size"}


def test_cli_reads_the_profile_beside_cluster_yaml(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(_text(SEED))
    (tmp_path / "training.yaml").write_text(
        f"output_dir: /scratch/out\ntrain_conf:\n  deepspeed_config: {ds}\n")
    rc, out = _cli(tmp_path, "--world-size", "8", "--nodes", "2", "--cc", "8.0",
                   "--gpu-mem-gb", "80")
    assert rc == 1
    assert f"{tmp_path / 'training.yaml'}:1: error: output_dir: /scratch/out is not under the " \
           "shared directory /data/shared" in out


def test_cli_checks_the_edited_ds_config_json_that_launch_ships(tmp_path: Path) -> None:
    """ds_config.json beside cluster.yaml (the Config screen's file) wins over the profile's
    path, as in svconsole launch."""
    profile_ds = tmp_path / "ds.json"
    profile_ds.write_text(_text(SEED))
    (tmp_path / "training.yaml").write_text(
        f"output_dir: /data/shared/out\ntrain_conf:\n  deepspeed_config: {profile_ds}\n")
    args = ("--world-size", "8", "--nodes", "2", "--cc", "8.0", "--gpu-mem-gb", "80", "--json")
    rc, out = _cli(tmp_path, *args)
    assert rc == 0 and json.loads(out)["ok"], out
    edited = json.loads(_text(SEED))
    edited["zero_optimization"]["stage"] = 7
    (tmp_path / "ds_config.json").write_text(json.dumps(edited, indent=2))
    rc, out = _cli(tmp_path, *args)
    report = json.loads(out)
    assert rc == 1 and "zero_optimization.stage" in {f["field"] for f in report["findings"]
                                                    if f["severity"] == "error"}


def test_cli_bad_input_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(tmp_path, str(tmp_path / "none.json"), "--world-size", "1")[0] == 2
    assert "none.json: No such file or directory" in capsys.readouterr().err
    assert _cli(tmp_path, "x.json", "--gpu", "A100")[0] == 2
    assert "give --world-size too" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("dataset_conf:\n  batch_size: lots\n")
    assert _cli(tmp_path, "--profile", str(tmp_path / "bad.yaml"), "--world-size", "1")[0] == 2
    assert f"{tmp_path / 'bad.yaml'}:2: dataset_conf.batch_size: must be a whole number" in \
        capsys.readouterr().err


def test_finding_str_and_report_json() -> None:
    f = Finding("warning", "matrix", "gradient_accumulation_steps", "too many", line=3, col=5,
                file="ds.json")
    assert str(f) == "ds.json:3:5: warning: gradient_accumulation_steps: too many"
    report = dsconfig.Report([f])
    assert report.summary == "0 errors / 1 warning / ready to launch"
    assert json.loads(json.dumps(report.to_json()))["findings"][0]["line"] == 3


def test_data_lists_over_loopback_sshd(loopback: Any, tmp_path: Path) -> None:
    """The same check through the real SSH pool: ``pool.run`` on every node."""
    from console.cluster.model import load_cluster
    from console.ssh.pool import Pool

    data = loopback.shared_dir / "dsconfig-test"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "key": 3}))
    profile = default_profile().replace("train_data_set_list", str(data / "train.jsonl")) \
        .replace("valid_data_set_list", str(data / "val.jsonl"))
    cluster = load_cluster(loopback.cluster_yaml)
    pool = Pool(cluster)
    try:
        found = dsconfig.check_data_on_nodes(pool.run, cluster.names(), profile)
    finally:
        pool.close()
    assert [f.message for f in found] == [
        f"node0:{data / 'train.jsonl'}:2: key: must be a non-empty string, got 3",
        f"{data / 'val.jsonl'} is not readable on node0, node1, node2, node3"]


# ---------------------------------------------------------------- world size and versions as launch sees them


def _cpu_cluster(n: int = 3, funasr: str = "1.4.16") -> tuple[Any, dict[str, NodeFacts]]:
    """The loopback cluster's shape: n nodes without GPUs, every one with the training stack."""
    from console.cluster.model import Cluster, Node

    cluster = Cluster(name="lb", shared_dir="/data/shared",
                      nodes=tuple(Node(f"node{i}", f"127.0.1.{i + 1}") for i in range(n)))
    facts = {f"node{i}": NodeFacts(f"node{i}", ok=True, cpu_cores=2, gpu_error="no NVIDIA driver",
                                   python={**NEW_STACK, "funasr": funasr})
             for i in range(n)}
    return cluster, facts


def test_cpu_only_nodes_count_the_cpu_entry_and_keep_their_versions() -> None:
    cluster, facts = _cpu_cluster()
    spec = ClusterSpec.from_facts(cluster, facts)
    assert spec.entry == "cpu-wrapper" and spec.world_known and spec.world_size == 3
    assert spec.describe() == "world size 3 (cpu-wrapper entry, 1 process per node) on 3 node(s)"
    assert all(dict(n.versions)["funasr"] == "1.4.16" for n in spec.nodes)
    two = ClusterSpec.from_facts(cluster, facts, nproc_per_node=2)
    assert two.world_size == 6 and "2 processes per node" in two.describe()
    # the seed's bf16 preset is not ready there: the fault's id, and its fix
    report = dsconfig.validate(dsconfig.preset_text("seed_zero1_bf16"), profile=default_profile(),
                               cluster=spec)
    assert not report.ok and report.summary.endswith("fix the errors before launch")
    [hit] = report.errors
    assert hit.field == "bf16.enabled" and "(fault bf16-dtype-mismatch)" in hit.message
    assert "Train in fp32 (bf16.enabled false)" in hit.fix and "funasr 1.4.16" in hit.reason
    # a train_batch_size for the wrong world size fails here, not only at pre-flight
    wrong = dsconfig.validate(_with(lambda d: d.update(train_batch_size=1),
                                    json.loads(dsconfig.preset_text("zero1_fp32"))),
                              cluster=spec)
    assert any("1 != 1 * 1 * 3" in f.message for f in wrong.errors), wrong.findings


def test_the_default_preset_trains_with_the_versions_found() -> None:
    cluster, facts = _cpu_cluster()
    name, why = dsconfig.default_preset(ClusterSpec.from_facts(cluster, facts))
    assert name == "zero1_fp32" and why.startswith("fp32: bf16 dtype mismatch") and "1.4.16" in why
    report = dsconfig.validate(dsconfig.preset_text(name), profile=default_profile(),
                               cluster=ClusterSpec.from_facts(cluster, facts))
    assert report.ok, report.findings
    assert not [f for f in report.findings if "bf16" in f.message + f.fix], report.findings
    # GPUs with bf16 and a FunASR that trains in bf16: the seed's bf16 config
    assert dsconfig.default_preset(A100_OLD)[0] == "seed_zero1_bf16"
    assert dsconfig.default_preset(A100_OLD)[1].startswith("bf16: compute capability 8.0")
    v100 = ClusterSpec.from_overrides(8, "V100", versions=OLD_STACK)
    assert dsconfig.default_preset(v100) == (
        "zero1_fp32", "fp32: the GPUs of node0 lack bf16 (compute capability < 8.0)")
    assert dsconfig.default_preset(None)[0] == "zero1_fp32"


def test_unknown_ranks_are_said_never_a_silent_one() -> None:
    from console.cluster.model import Cluster, Node

    cluster = Cluster(name="c", nodes=(Node("a", "10.0.0.1"), Node("b", "10.0.0.2", gpus=(0, 1))))
    spec = ClusterSpec.from_facts(cluster, {})
    assert not spec.world_known and spec.unknown == ("a",)
    assert spec.describe() == "world size unknown (no facts for a) on 2 node(s)"
    report = dsconfig.validate(_with(lambda d: d.update(train_batch_size=5)), cluster=spec)
    [warning] = [f for f in report.warnings if f.field == "train_batch_size"]
    assert warning.message == "world size unknown: batch checks skipped"
    assert "no facts for a" in warning.reason and report.ok and report.world_size is None
    # gpus: in cluster.yaml counts without facts
    both = Cluster(name="c", nodes=(Node("a", "1", gpus=(0,)), Node("b", "2", gpus=(0, 1))))
    assert ClusterSpec.from_facts(both, {}).world_size == 3


# ---------------------------------------------------------------- a consistent report

#: 20 configs: the presets, hand-made edge cases, and public configs' shapes (Hugging Face's
#: ds_config_zero2/zero3.json with "auto", DeepSpeedExamples' BERT fp16 + Lamb, Megatron-style).
_HF_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
_HF_ZERO3 = {
    **{k: v for k, v in _HF_ZERO2.items() if k != "zero_optimization"},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True, "contiguous_gradients": True,
                          "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
}
_BERT = {"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 32, "steps_per_print": 1000,
         "prescale_gradients": False,
         "optimizer": {"type": "Lamb", "params": {"lr": 11e-3, "weight_decay": 0.01,
                                                  "bias_correction": False,
                                                  "max_coeff": 0.3, "min_coeff": 0.01}},
         "gradient_clipping": 1.0, "fp16": {"enabled": True, "loss_scale": 0}}
_MEGATRON = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4,
             "steps_per_print": 10, "gradient_clipping": 1.0,
             "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
             "wall_clock_breakdown": True}

REPORT_CONFIGS: dict[str, str] = {
    **{name: dsconfig.preset_text(name) for name in dsconfig.PRESETS},
    "hf-zero2-auto": _text(_HF_ZERO2),
    "hf-zero3-auto": _text(_HF_ZERO3),
    "bert-fp16-lamb": _text(_BERT),
    "megatron-bf16": _text(_MEGATRON),
    "bf16-auto": _with(lambda d: d["bf16"].update(enabled="auto")),
    "bf16-and-fp16": _with(lambda d: d.update(fp16={"enabled": True})),
    "fp32-accumulation-16": _with(lambda d: (_fp32(d), d.update(gradient_accumulation_steps=16))),
    "adamw-fused": _with(lambda d: d.update(optimizer={"type": "AdamW", "params": {"lr": 1e-4}})),
    "adamw-torch": _with(lambda d: d.update(optimizer={"type": "AdamW", "params": {
        "lr": 1e-4, "torch_adam": True}})),
    "no-precision-keys": _text({"train_micro_batch_size_per_gpu": 1}),
    "zero3-offload-fp32": _with(lambda d: (_fp32(d), d.update(zero_optimization={
        "stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}))),
    "small-buckets-bf16": _with(lambda d: d["zero_optimization"].update(
        allgather_bucket_size=1e6, reduce_bucket_size=1e6)),
    "empty": "{}",
    "string-bools": _with(lambda d: d["bf16"].update(enabled="false")),
}
REPORT_CLUSTERS = {
    "a100-old-stack": A100_OLD,
    "h100-new-stack": ClusterSpec.from_overrides(8, "H100", versions=NEW_STACK),
    "v100": ClusterSpec.from_overrides(8, "V100-32GB", nodes=2, versions=OLD_STACK),
    "cpu-new-stack": ClusterSpec.from_facts(*_cpu_cluster()),
    "unknown": None,
}
_CLAIMS = (  # (pattern in a message or fix, (setting, on?))
    (r'"bf16": \{"enabled": true\}|\benable bf16\b|\bbf16 on\b', ("bf16", True)),
    (r'"bf16": \{"enabled": false\}|bf16\.enabled false|[Tt]rain in fp32|\bdisable bf16\b',
     ("bf16", False)),
    (r'"fp16": \{"enabled": true\}|\benable fp16\b', ("fp16", True)),
    (r'"fp16": \{"enabled": false\}|\bdisable fp16\b', ("fp16", False)),
    (r"\benable ([a-z_.]+)", None),
    (r"\bdisable ([a-z_.]+)", None),
)


def _claims(text: str) -> set[tuple[str, bool]]:
    out = set()
    for pattern, claim in _CLAIMS:
        for m in re.finditer(pattern, text):
            if claim is not None:
                out.add(claim)
            else:
                out.add((m.group(1), m.group(0).startswith("enable")))
    return out


def test_twenty_configs_get_reports_that_never_contradict_themselves() -> None:
    assert len(REPORT_CONFIGS) == 20
    profile = default_profile()
    for cluster_name, cluster in REPORT_CLUSTERS.items():
        for name, text in REPORT_CONFIGS.items():
            report = dsconfig.validate(text, profile=profile, cluster=cluster)
            where = f"{name} on {cluster_name}:\n" + "\n".join(
                f"{f} | fix: {f.fix}" for f in report.findings)
            advice = set().union(*(_claims(f.message + " " + f.fix) for f in report.findings))
            clashes = {s for s, on in advice if (s, not on) in advice}
            assert not clashes, where
            keys = [(f.severity, f.field, f.message) for f in report.findings]
            assert len(keys) == len(set(keys)), "each finding once: " + where
            explain = report.estimate.method if report.estimate else "\0"
            assert not [f for f in report.findings if explain in f.reason], where
            fused = [f for f in report.findings if "FusedAdam" in f.message]
            assert not fused or cluster_name == "h100-new-stack", "Hopper only: " + where
            if name == "adamw-fused" and cluster_name == "h100-new-stack":
                assert fused, where
            bf16_advice = [f for f in report.findings if ("bf16", True) in _claims(f.fix)]
            assert not bf16_advice or cluster_name == "a100-old-stack", where
            for f in report.findings:
                if '"auto"' in f.message:
                    assert f.message.startswith(f.field + ' is "auto", ') and \
                        "filled only by the HF Trainer integration or DeepSpeed autotuning; " \
                        "FunASR passes it as is" in f.message, where


def test_cli_without_any_json_checks_the_default_preset_and_says_so(tmp_path: Path,
                                                                    capsys: Any) -> None:
    """Neither ds_config.json nor the profile's deepspeed_config on this machine: the preset
    the Config screen would offer is checked, and a finding says so (as the screen does)."""
    (tmp_path / "training.yaml").write_text(
        f"output_dir: /data/shared/out\ntrain_conf:\n  deepspeed_config: {tmp_path / 'no.json'}\n")
    rc, out = _cli(tmp_path, "--world-size", "8", "--nodes", "2", "--gpu", "A100")
    assert rc == 0, out
    assert "info: ds_config.json is not saved yet: the zero1_fp32 preset was checked (fp32: " \
           "bf16 dtype mismatch in FunASR's forward (fault bf16-dtype-mismatch) is possible" in out
    assert _cli(tmp_path, "--world-size", "8", "--entry", "cpu-wrapper")[0] == 2
    assert "--entry and --nproc-per-node count the ranks of the probed cluster" in \
        capsys.readouterr().err
