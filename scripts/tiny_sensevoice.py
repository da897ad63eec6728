"""A tiny SenseVoice training set and model directory, for trying the real training path on CPU.

`python tiny_sensevoice.py make DIR [--samples N] [--seconds S] [--seed K]` writes, under DIR:

- ``wav/*.wav``: synthetic 16 kHz mono 16-bit clips (a few tones plus noise), deterministic for a
  seed.
- ``train.jsonl`` / ``valid.jsonl``: SenseVoice data lines as FunASR's ``SenseVoiceCTCDataset``
  reads them: ``key``, ``source`` (absolute wav path), ``source_len`` (10 ms frames, as FunASR's
  ``scp2jsonl`` counts them), ``target``, ``target_len`` (words when the text has spaces, else
  characters, again as ``scp2jsonl`` counts), ``text_language`` (``<|zh|>``, ``<|en|>``...),
  ``emo_target`` (``<|NEUTRAL|>``...), ``event_target`` (``<|Speech|>``...) and
  ``with_or_wo_itn`` (``<|withitn|>`` / ``<|woitn|>``).
- ``model/``: a scaled-down SenseVoiceSmall laid out like the hub directory: ``config.yaml``
  (SenseVoiceEncoderSmall with output_size 64, 2 heads, 128 linear units, 2 blocks, 1 tp block),
  ``configuration.json`` (its ``file_path_metas`` name the config and the tokenizer) and a tiny
  sentencepiece tokenizer. No ``model.pt``: FunASR starts from random weights and downloads
  nothing.
- ``ds_zero1_fp32.json``: a DeepSpeed ZeRO-1 fp32 config with no ``optimizer`` block, so FunASR
  builds its own torch AdamW (``optim: adamw``) and hands it to DeepSpeed, as FunASR's own
  ``examples/deepspeed_conf/ds_stage1.json`` does; no FusedAdam JIT build is involved.
- ``overrides.txt``: the ``++key=value`` overrides for ``train_ds.py`` (one a line) that run this
  set for 2 epochs with DeepSpeed on CPU (gloo), writing to ``DIR/exp``.

SenseVoiceSmall hard-codes token ids in its model code (``funasr/models/sense_voice/model.py``):
the language tokens it reads from the first target position (24884 zh, 24885 en, 24888 yue,
24892 ja, 24896 ko, 24992 nospeech), the text-normalisation tokens it reads from the fourth
(25016 withitn, 25017 woitn) and the emotion ids it uses at inference (25001-25004, 25009). The
tokenizer therefore has at least 25018 pieces: the three sentencepiece meta pieces, then
user-defined symbols that put every special at exactly its id (placeholders in between), then
the characters of the tiny corpus. The event-token ids are not read by the model code; this
generator places them at 24993-25000, which need not match the hub tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SAMPLE_RATE = 16000
"""SenseVoice's input rate (frontend_conf.fs)."""

FRAME_MS = 10
"""source_len counts 10 ms frames, as FunASR's scp2jsonl does."""

MERGES = 32
"""BPE merges asked for beyond the specials and the corpus characters (fewer if the corpus is
too small for them)."""

LANGUAGE_IDS = {"zh": 24884, "en": 24885, "yue": 24888, "ja": 24892, "ko": 24896, "nospeech": 24992}
"""Language token ids SenseVoiceSmall hard-codes (``lid_int_dict``)."""

EMOTION_IDS = {
    "HAPPY": 25001,
    "SAD": 25002,
    "ANGRY": 25003,
    "NEUTRAL": 25004,
    "FEARFUL": 25005,
    "DISGUSTED": 25006,
    "SURPRISED": 25007,
    "EMO_UNKNOWN": 25009,
}
"""Emotion token ids (SenseVoiceSmall's ``emo_dict`` names 25001-25004 and 25009)."""

EVENT_IDS = {
    "Speech": 24993,
    "BGM": 24994,
    "Applause": 24995,
    "Laughter": 24996,
    "Cry": 24997,
    "Sneeze": 24998,
    "Breath": 24999,
    "Cough": 25000,
}
"""Event token ids: chosen here; the model code does not read them."""

ITN_IDS = {"withitn": 25016, "woitn": 25017}
"""Text-normalisation token ids SenseVoiceSmall hard-codes (``textnorm_int_dict``)."""

META_PIECES = 3
"""sentencepiece's own pieces first: <unk> 0 (CTC blank), <s> 1 (sos), </s> 2 (eos)."""

ENCODER_CONF = {
    "output_size": 64,
    "attention_heads": 2,
    "linear_units": 128,
    "num_blocks": 2,
    "tp_blocks": 1,
    "dropout_rate": 0.1,
    "positional_dropout_rate": 0.1,
    "attention_dropout_rate": 0.1,
    "input_layer": "pe",
    "pos_enc_class": "SinusoidalPositionEncoder",
    "normalize_before": True,
    "kernel_size": 11,
    "sanm_shfit": 0,
    "selfattention_layer_type": "sanm",
}
"""The hub encoder (512, 4 heads, 2048 units, 50 blocks, 20 tp blocks) scaled down."""

BPE_MODEL = "tiny_spectok.bpe.model"
DS_CONFIG = "ds_zero1_fp32.json"
OVERRIDES = "overrides.txt"

_ENGLISH = ("hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
            "train", "model", "speech", "voice", "small", "cluster", "node", "rank")
_CHINESE = "你好世界今天天气很好我们训练语音模型小的集群节点"
_LANGUAGES = ("zh", "en")
_EMOTIONS = ("NEUTRAL", "HAPPY", "SAD")
_EVENTS = ("Speech", "BGM")


@dataclass(frozen=True)
class Sample:
    """One utterance: its wav file and the SenseVoice labels written to jsonl."""

    key: str
    source: Path
    source_len: int
    target: str
    target_len: int
    language: str
    emotion: str
    event: str
    itn: bool

    def jsonl(self) -> str:
        """The jsonl line FunASR's SenseVoice dataset reads."""
        return json.dumps(
            {
                "key": self.key,
                "source": str(self.source),
                "source_len": self.source_len,
                "target": self.target,
                "target_len": self.target_len,
                "text_language": f"<|{self.language}|>",
                "emo_target": f"<|{self.emotion}|>",
                "event_target": f"<|{self.event}|>",
                "with_or_wo_itn": "<|withitn|>" if self.itn else "<|woitn|>",
            },
            ensure_ascii=False,
        )


@dataclass(frozen=True)
class TinySet:
    """What `make` wrote; every path is absolute."""

    root: Path
    model_dir: Path
    train_jsonl: Path
    valid_jsonl: Path
    ds_config: Path
    overrides_file: Path
    samples: tuple[Sample, ...]
    vocab_size: int

    def overrides(
        self,
        output_dir: str | Path,
        *,
        max_epoch: int = 2,
        deepspeed: bool = True,
        batch_tokens: int = 500,
    ) -> list[str]:
        """Hydra ``++`` overrides for ``train_ds.py`` that train this set on CPU with gloo.

        ``deepspeed`` picks DeepSpeed (this set's ZeRO-1 config) or plain DDP.
        """
        return [
            f"++model={self.model_dir}",
            f"++train_data_set_list={self.train_jsonl}",
            f"++valid_data_set_list={self.valid_jsonl}",
            "++dataset_conf.data_split_num=1",
            "++dataset_conf.batch_sampler=BatchSampler",
            "++dataset_conf.batch_type=token",
            f"++dataset_conf.batch_size={batch_tokens}",
            "++dataset_conf.sort_size=64",
            "++dataset_conf.num_workers=0",
            f"++train_conf.max_epoch={max_epoch}",
            "++train_conf.log_interval=1",
            "++train_conf.resume=true",
            "++train_conf.validate_interval=100000",
            "++train_conf.save_checkpoint_interval=100000",
            "++train_conf.keep_nbest_models=5",
            "++train_conf.avg_nbest_model=2",
            "++train_conf.avg_keep_nbest_models_type=loss",
            f"++train_conf.use_deepspeed={'true' if deepspeed else 'false'}",
            f"++train_conf.deepspeed_config={self.ds_config}",
            "++optim_conf.lr=0.0002",
            "++backend=gloo",
            "++device=cpu",
            "++disable_update=true",
            f"++output_dir={Path(output_dir).resolve()}",
        ]


def special_tokens() -> dict[int, str]:
    """Every special piece this tokenizer puts at a fixed id, by id."""
    table: dict[int, str] = {}
    for names in (LANGUAGE_IDS, EMOTION_IDS, EVENT_IDS, ITN_IDS):
        for name, piece_id in names.items():
            table[piece_id] = f"<|{name}|>"
    return table


def user_defined_symbols() -> list[str]:
    """The user-defined symbols, in id order from META_PIECES: specials and placeholders."""
    specials = special_tokens()
    return [specials.get(i, f"<|unused{i}|>") for i in range(META_PIECES, max(specials) + 1)]


def write_tokenizer(path: Path, corpus: Sequence[str]) -> int:
    """Train the tiny sentencepiece model at `path`; check every special's id; return its size."""
    import io

    import sentencepiece as spm

    symbols = user_defined_symbols()
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=buffer,
        model_type="bpe",
        vocab_size=META_PIECES + len(symbols) + len(set("".join(corpus))) + MERGES,
        hard_vocab_limit=False,
        user_defined_symbols=symbols,
        add_dummy_prefix=False,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=buffer.getvalue())
    for piece_id, piece in special_tokens().items():
        got = processor.encode(piece)
        if got != [piece_id]:
            raise RuntimeError(f"{path}: special {piece} encodes to {got}, expected [{piece_id}]")
    _write_atomic(path, buffer.getvalue())
    return processor.get_piece_size()


def synth_wav(path: Path, seconds: float, rng: random.Random) -> int:
    """Write a mono 16-bit clip of a few tones and noise; return its sample count."""
    import numpy as np

    count = int(round(seconds * SAMPLE_RATE))
    t = np.arange(count) / SAMPLE_RATE
    signal = np.zeros(count)
    for _ in range(3):
        freq = rng.uniform(120.0, 2000.0)
        signal += rng.uniform(0.1, 0.3) * np.sin(2 * math.pi * freq * t + rng.uniform(0, math.pi))
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0.0, 0.05, count)
    pcm = np.clip((signal + noise) * 32767 * 0.5, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(pcm.tobytes())
    return count


def _transcript(language: str, rng: random.Random) -> tuple[str, int]:
    """A short random sentence and its target_len (words with spaces, else characters)."""
    if language == "en":
        words = rng.choices(_ENGLISH, k=rng.randint(3, 6))
        return " ".join(words), len(words)
    text = "".join(rng.choices(_CHINESE, k=rng.randint(4, 8)))
    return text, len(text)


def make_samples(wav_dir: Path, count: int, seconds: float, seed: int) -> list[Sample]:
    """Synthesise `count` clips of about `seconds` each, with labels cycling through languages."""
    rng = random.Random(seed)
    wav_dir.mkdir(parents=True, exist_ok=True)
    samples = []
    for i in range(count):
        key = f"tiny{i:04d}"
        source = (wav_dir / f"{key}.wav").resolve()
        length = seconds * rng.uniform(0.8, 1.2)
        frames = synth_wav(source, length, rng) * 1000 // SAMPLE_RATE // FRAME_MS
        language = _LANGUAGES[i % len(_LANGUAGES)]
        target, target_len = _transcript(language, rng)
        samples.append(Sample(key, source, frames, target, target_len, language,
                              rng.choice(_EMOTIONS), rng.choice(_EVENTS), rng.random() < 0.5))
    return samples


def model_config(bpe_model: str) -> dict:
    """config.yaml of the scaled-down SenseVoiceSmall (the hub file's keys, smaller numbers)."""
    return {
        "encoder": "SenseVoiceEncoderSmall",
        "encoder_conf": dict(ENCODER_CONF),
        "model": "SenseVoiceSmall",
        "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2, "ignore_id": -1},
        "tokenizer": "SentencepiecesTokenizer",
        "tokenizer_conf": {"bpemodel": bpe_model, "unk_symbol": "<unk>", "split_with_space": True},
        "frontend": "WavFrontend",
        "frontend_conf": {"fs": SAMPLE_RATE, "window": "hamming", "n_mels": 80,
                          "frame_length": 25, "frame_shift": FRAME_MS, "lfr_m": 7, "lfr_n": 6,
                          "cmvn_file": None},
        "specaug": "SpecAugLFR",
        "specaug_conf": {"apply_time_warp": False, "time_warp_window": 5, "time_warp_mode": "bicubic",
                         "apply_freq_mask": True, "freq_mask_width_range": [0, 30], "lfr_rate": 6,
                         "num_freq_mask": 1, "apply_time_mask": True, "time_mask_width_range": [0, 12],
                         "num_time_mask": 1},
        "dataset": "SenseVoiceCTCDataset",
        "dataset_conf": {"index_ds": "IndexDSJsonl", "batch_sampler": "EspnetStyleBatchSampler",
                         "data_split_num": 1, "batch_type": "token", "batch_size": 500,
                         "max_token_length": 2000, "min_token_length": 10,
                         "max_source_length": 2000, "min_source_length": 10,
                         "max_target_length": 200, "min_target_length": 0, "shuffle": True,
                         "num_workers": 0, "sos": 1, "eos": 2, "IndexDSJsonl": "IndexDSJsonl",
                         "retry": 20},
        "train_conf": {"accum_grad": 1, "grad_clip": 5, "max_epoch": 2, "keep_nbest_models": 5,
                       "avg_nbest_model": 2, "log_interval": 1, "resume": True,
                       "validate_interval": 100000, "save_checkpoint_interval": 100000},
        "optim": "adamw",
        "optim_conf": {"lr": 0.0002},
        "scheduler": "warmuplr",
        "scheduler_conf": {"warmup_steps": 10},
    }


def configuration_json() -> dict:
    """configuration.json as on the hub: file_path_metas make FunASR join paths to the model dir."""
    return {
        "framework": "pytorch",
        "task": "auto-speech-recognition",
        "model": {"type": "funasr"},
        "pipeline": {"type": "funasr-pipeline"},
        "model_name_in_hub": {"ms": "", "hf": ""},
        "file_path_metas": {"config": "config.yaml", "tokenizer_conf": {"bpemodel": BPE_MODEL}},
    }


def deepspeed_config() -> dict:
    """DeepSpeed ZeRO-1, fp32, no optimizer block (FunASR passes its torch AdamW in)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 100,
        "gradient_clipping": 5.0,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {
            "stage": 1,
            "offload_optimizer": {"device": "none"},
            "allgather_partitions": True,
            "allgather_bucket_size": 50000000,
            "overlap_comm": False,
            "reduce_scatter": True,
            "reduce_bucket_size": 50000000,
            "contiguous_gradients": True,
        },
    }


def make(directory: str | Path, *, samples: int = 8, seconds: float = 1.5, seed: int = 0) -> TinySet:
    """Write the tiny set under `directory` (created if missing) and describe it."""
    import yaml

    if samples < 2:
        raise ValueError(f"--samples: need at least 2 (one for validation), got {samples}")
    if not 0.5 <= seconds <= 20:
        raise ValueError(f"--seconds: must be between 0.5 and 20, got {seconds}")
    root = Path(directory).resolve()
    model_dir = root / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    made = make_samples(root / "wav", samples, seconds, seed)
    n_valid = max(1, samples // 4)
    train, valid = made[n_valid:], made[:n_valid]
    _write_atomic(root / "train.jsonl", "".join(s.jsonl() + "\n" for s in train))
    _write_atomic(root / "valid.jsonl", "".join(s.jsonl() + "\n" for s in valid))

    corpus = [s.target for s in made] + list(_ENGLISH) + list(_CHINESE)
    vocab_size = write_tokenizer(model_dir / BPE_MODEL, corpus)
    _write_atomic(model_dir / "config.yaml",
                  yaml.safe_dump(model_config(BPE_MODEL), sort_keys=False, allow_unicode=True))
    _write_atomic(model_dir / "configuration.json", json.dumps(configuration_json(), indent=2) + "\n")
    _write_atomic(root / DS_CONFIG, json.dumps(deepspeed_config(), indent=2) + "\n")
    tiny = TinySet(root, model_dir, root / "train.jsonl", root / "valid.jsonl", root / DS_CONFIG,
                   root / OVERRIDES, tuple(made), vocab_size)
    _write_atomic(root / OVERRIDES, "\n".join(tiny.overrides(root / "exp")) + "\n")
    return tiny


def _write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a temp file in the same directory and rename (this runs on nodes, where
    svconsole's console package may be absent, so it does not import console.atomic)."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="write the tiny set, model directory, DeepSpeed config, overrides")
    mk.add_argument("directory")
    mk.add_argument("--samples", type=int, default=8, help="number of clips (default 8)")
    mk.add_argument("--seconds", type=float, default=1.5, help="mean clip length (default 1.5)")
    mk.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        tiny = make(args.directory, samples=args.samples, seconds=args.seconds, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{tiny.root}: {len(tiny.samples)} clips, tokenizer {tiny.vocab_size} pieces, "
          f"model {tiny.model_dir}, overrides {tiny.overrides_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
