"""The tiny SenseVoice set and FunASR's real trainer on CPU, launched with the real torchrun.

The slow tests run funasr/bin/train_ds.py (through scripts/sv_train_cpu.py) with DeepSpeed
ZeRO-1 over gloo: 2 local ranks, a resume, and two single-rank "nodes" on 127.0.0.1. DeepSpeed
JIT-compiles its shared-memory comm op on first use (about 35 s, needs g++); it is cached in
TORCH_EXTENSIONS_DIR (default here: ~/.cache/svconsole/torch_extensions), so later runs skip it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import types
import wave
from pathlib import Path

import pytest
import yaml
from svconsole_scripts import sv_train_cpu, tiny_sensevoice

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "scripts" / "sv_train_cpu.py"
TRAIN_LINE = re.compile(
    r"\] - train, rank: (?P<rank>\d+), epoch: (?P<epoch>\d+)/(?P<max>\d+), .*?"
    r"\(loss_avg_rank: (?P<loss>[^)]+)\)"
)
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tiny_sensevoice.TinySet:
    return tiny_sensevoice.make(tmp_path_factory.mktemp("tiny"), samples=8, seconds=1.5)


# ---------------------------------------------------------------- the generator


def test_jsonl_lines_carry_sensevoice_fields(tiny: tiny_sensevoice.TinySet) -> None:
    lines = [json.loads(line) for path in (tiny.train_jsonl, tiny.valid_jsonl)
             for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 8
    assert len(tiny.valid_jsonl.read_text().splitlines()) == 2
    for row in lines:
        assert set(row) == {"key", "source", "source_len", "target", "target_len", "text_language",
                            "emo_target", "event_target", "with_or_wo_itn"}
        source = Path(row["source"])
        assert source.is_absolute() and source.is_file()
        with wave.open(str(source)) as clip:
            assert (clip.getframerate(), clip.getnchannels(), clip.getsampwidth()) == (16000, 1, 2)
            assert row["source_len"] == clip.getnframes() * 1000 // 16000 // 10
        words = row["target"].split()
        assert row["target_len"] == (len(words) if " " in row["target"] else len(row["target"]))
        assert row["text_language"] in ("<|zh|>", "<|en|>")
        assert row["with_or_wo_itn"] in ("<|withitn|>", "<|woitn|>")
        assert re.fullmatch(r"<\|[A-Za-z_]+\|>", row["emo_target"])
        assert re.fullmatch(r"<\|[A-Za-z]+\|>", row["event_target"])


def test_generation_is_deterministic(tmp_path: Path, tiny: tiny_sensevoice.TinySet) -> None:
    again = tiny_sensevoice.make(tmp_path, samples=8, seconds=1.5)
    assert [s.target for s in again.samples] == [s.target for s in tiny.samples]
    first, second = tiny.samples[0].source, again.samples[0].source
    assert first.read_bytes() == second.read_bytes()


def test_tokenizer_puts_specials_at_the_ids_sensevoice_hard_codes(
    tiny: tiny_sensevoice.TinySet,
) -> None:
    sentencepiece = pytest.importorskip("sentencepiece")
    processor = sentencepiece.SentencePieceProcessor()
    processor.load(str(tiny.model_dir / tiny_sensevoice.BPE_MODEL))
    assert processor.get_piece_size() == tiny.vocab_size >= 25018
    # ids from funasr/models/sense_voice/model.py (lid_int_dict, textnorm_int_dict, emo_dict)
    for token, token_id in {"<|zh|>": 24884, "<|en|>": 24885, "<|yue|>": 24888, "<|ja|>": 24892,
                            "<|ko|>": 24896, "<|nospeech|>": 24992, "<|withitn|>": 25016,
                            "<|woitn|>": 25017, "<|HAPPY|>": 25001, "<|NEUTRAL|>": 25004,
                            "<|EMO_UNKNOWN|>": 25009}.items():
        assert processor.encode(token) == [token_id], token
    assert [processor.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    for sample in tiny.samples:  # every target label is one piece, and the text encodes
        for label in (f"<|{sample.emotion}|>", f"<|{sample.event}|>"):
            assert len(processor.encode(label)) == 1
        assert 0 not in processor.encode(sample.target)


def test_model_dir_is_laid_out_like_the_hub_and_funasr_resolves_it(
    tiny: tiny_sensevoice.TinySet,
) -> None:
    config = yaml.safe_load((tiny.model_dir / "config.yaml").read_text())
    assert config["model"] == "SenseVoiceSmall" and config["encoder"] == "SenseVoiceEncoderSmall"
    assert {k: config["encoder_conf"][k] for k in
            ("output_size", "attention_heads", "linear_units", "num_blocks", "tp_blocks")} == {
        "output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2,
        "tp_blocks": 1}
    meta = json.loads((tiny.model_dir / "configuration.json").read_text())["file_path_metas"]
    assert meta["tokenizer_conf"]["bpemodel"] == tiny_sensevoice.BPE_MODEL
    assert not (tiny.model_dir / "model.pt").exists()

    download = pytest.importorskip("funasr.download.download_model_from_hub")
    kwargs = download.download_model(model=str(tiny.model_dir), is_training=True)
    assert kwargs["tokenizer_conf"]["bpemodel"] == str(tiny.model_dir / tiny_sensevoice.BPE_MODEL)
    assert kwargs["model"] == "SenseVoiceSmall" and "init_param" not in kwargs


def test_deepspeed_config_and_overrides(tiny: tiny_sensevoice.TinySet) -> None:
    ds = json.loads(tiny.ds_config.read_text())
    assert ds["zero_optimization"]["stage"] == 1
    assert "optimizer" not in ds  # FunASR passes its torch AdamW to DeepSpeed
    assert not ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    lines = tiny.overrides_file.read_text().splitlines()
    assert lines == tiny.overrides(tiny.root / "exp")
    assert all(line.startswith("++") and "=" in line for line in lines)
    for needed in ("++backend=gloo", "++device=cpu", "++disable_update=true",
                   "++train_conf.avg_keep_nbest_models_type=loss",
                   "++train_conf.use_deepspeed=true", f"++model={tiny.model_dir}"):
        assert needed in lines


def test_bad_arguments_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        tiny_sensevoice.main(["make", str(tmp_path), "--samples", "1"])
    assert exited.value.code == 2
    assert "--samples: need at least 2" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--seconds"):
        tiny_sensevoice.make(tmp_path, seconds=0.1)


# ---------------------------------------------------------------- the wrapper


def test_wrapper_names_a_hook_that_moved() -> None:
    trainer_ds = pytest.importorskip("funasr.train_utils.trainer_ds")
    import torch

    train_ds = types.SimpleNamespace(Trainer=trainer_ds.Trainer, torch=torch)
    moved = types.SimpleNamespace(Trainer=trainer_ds.Trainer)  # no DDP name any more
    with pytest.raises(sv_train_cpu.HookMoved, match=r"funasr\.train_utils\.trainer_ds\.DDP"):
        sv_train_cpu.patch_for_cpu(train_ds, moved)
    other = types.SimpleNamespace(Trainer=object, torch=torch)
    with pytest.raises(sv_train_cpu.HookMoved, match="no longer uses"):
        sv_train_cpu.patch_for_cpu(other, trainer_ds)
    assert trainer_ds.Trainer.warp_model.__name__ == "warp_model"  # nothing patched


# ---------------------------------------------------------------- real training


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR",
                   str(Path.home() / ".cache" / "svconsole" / "torch_extensions"))
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _torchrun(cwd: Path, log: Path, launcher: list[str], overrides: list[str]) -> subprocess.Popen:
    """Start the real torchrun on the wrapper in its own process group, output to `log`."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), *launcher, str(WRAPPER), *overrides]
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=cwd, env=_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait(procs: list[subprocess.Popen], timeout: float = RUN_TIMEOUT) -> list[int]:
    """Wait for every launcher; on timeout kill their process groups and fail."""
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pytest.fail(f"torchrun still running after {timeout} s")


def _train_lines(*logs: Path) -> list[tuple[int, int, int, float]]:
    """(rank, epoch, max_epoch, loss) of every FunASR train line in the logs."""
    rows = []
    for log in logs:
        for match in TRAIN_LINE.finditer(log.read_text(errors="replace")):
            rows.append((int(match["rank"]), int(match["epoch"]), int(match["max"]),
                         float(match["loss"])))
    return rows


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@pytest.fixture
def training_stack() -> None:
    """Skip (saying why) where the training extras or g++ are absent."""
    for module in ("torch", "deepspeed", "funasr", "kaldi_native_fbank", "sentencepiece"):
        pytest.importorskip(module)
    if shutil.which("g++") is None:
        pytest.skip("g++ missing: DeepSpeed cannot build its CPU comm op")


@pytest.mark.slow
def test_deepspeed_zero1_two_ranks_trains_then_resumes(
    training_stack: None, tiny: tiny_sensevoice.TinySet, tmp_path: Path
) -> None:
    out = tmp_path / "exp"
    log = tmp_path / "train.log"
    launcher = ["--nproc-per-node", "2", "--master-port", str(_free_port())]
    (rc,) = _wait([_torchrun(tmp_path, log, launcher, tiny.overrides(out, max_epoch=2))])
    assert rc == 0, _tail(log)
    rows = _train_lines(log)
    assert {(rank, epoch) for rank, epoch, _, _ in rows} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert all(math.isfinite(loss) and loss > 0 for *_, loss in rows)
    text = log.read_text(errors="replace")
    assert "use_deepspeed: True" in text and "val, rank: 0, epoch: 2/2" in text
    for tag in ("model.pt", "model.pt.ep1", "model.pt.ep2", "model.pt.best"):
        assert (out / tag / "mp_rank_00_model_states.pt").is_file(), tag
        for rank in (0, 1):  # ZeRO-1: each rank saved its own optimizer partition
            assert (out / tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").is_file()

    resumed = tmp_path / "resume.log"
    launcher = ["--nproc-per-node", "2", "--master-port", str(_free_port())]
    (rc,) = _wait([_torchrun(tmp_path, resumed, launcher, tiny.overrides(out, max_epoch=3))])
    assert rc == 0, _tail(resumed)
    assert f"Checkpoint loaded successfully from '{out / 'model.pt'}'" in resumed.read_text()
    rows = _train_lines(resumed)
    assert {(rank, epoch, top) for rank, epoch, top, _ in rows} == {(0, 2, 3), (1, 2, 3)}
    assert (out / "model.pt.ep3" / "mp_rank_00_model_states.pt").is_file()


@pytest.mark.slow
def test_two_nodes_on_loopback_train_together(
    training_stack: None, tiny: tiny_sensevoice.TinySet, tmp_path: Path
) -> None:
    out = tmp_path / "exp"
    port = str(_free_port())
    logs = [tmp_path / f"node{rank}.log" for rank in (0, 1)]
    procs = [
        _torchrun(tmp_path, logs[rank],
                  ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                   "--master-addr", "127.0.0.1", "--master-port", port],
                  tiny.overrides(out, max_epoch=1))
        for rank in (0, 1)
    ]
    codes = _wait(procs)
    assert codes == [0, 0], _tail(logs[0]) + _tail(logs[1])
    assert {rank for rank, *_ in _train_lines(logs[0])} == {0}
    assert {rank for rank, *_ in _train_lines(logs[1])} == {1}
    assert all(math.isfinite(loss) for *_, loss in _train_lines(*logs))
    assert (out / "model.pt.ep1" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()
