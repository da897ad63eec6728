"""The training profile: defaults, line-numbered errors, ++overrides, atomic save."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.training.profile import (
    ProfileError,
    default_profile,
    hydra_value,
    load_profile,
    parse_profile,
    profile_path_for,
    profile_text,
    save_profile,
)


def test_default_profile_overrides_in_stable_order() -> None:
    overrides = default_profile().to_overrides()
    assert overrides == [
        "++model=iic/SenseVoiceSmall",
        "++train_data_set_list=/data/shared/SenseVoice/data/train.jsonl",
        "++valid_data_set_list=/data/shared/SenseVoice/data/val.jsonl",
        "++output_dir=/data/shared/SenseVoice/outputs",
        "++dataset_conf.batch_size=6000",
        "++dataset_conf.batch_type=token",
        "++dataset_conf.sort_size=1024",
        "++dataset_conf.num_workers=4",
        "++dataset_conf.data_split_num=1",
        "++train_conf.max_epoch=50",
        "++train_conf.log_interval=1",
        "++train_conf.validate_interval=2000",
        "++train_conf.save_checkpoint_interval=2000",
        "++train_conf.keep_nbest_models=20",
        "++train_conf.avg_keep_nbest_models_type=loss",
        "++train_conf.resume=true",
        "++train_conf.use_deepspeed=true",
        "++train_conf.deepspeed_config=/data/shared/SenseVoice/deepspeed_conf/ds_stage1.json",
        "++optim_conf.lr=0.0002",
        "++disable_update=true",
    ]


def test_a_file_changes_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "training.yaml"
    path.write_text("# mine\ndataset_conf:\n  batch_size: 8000\nextra:\n  seed: 7\n"
                    "  trust_remote_code: true\n")
    profile = load_profile(path)
    assert profile.dataset_conf.batch_size == 8000
    assert profile.dataset_conf.num_workers == 4          # the default
    assert profile.path == path
    assert profile.line_of("dataset_conf.batch_size") == 3
    assert profile.line_of("dataset_conf.num_workers") == 2   # its section's line
    assert profile.to_overrides()[-2:] == ["++seed=7", "++trust_remote_code=true"]


@pytest.mark.parametrize("text,issue", [
    ("dataset_conf:\n  batch_size: lots\n",
     "t.yaml:2: dataset_conf.batch_size: must be a whole number, got 'lots'"),
    ("dataset_conf:\n  batch_type: frames\n",
     "t.yaml:2: dataset_conf.batch_type: must be one of token, example, length, got 'frames'"),
    ("train_conf:\n  resume: yes please\n",
     "t.yaml:2: train_conf.resume: must be true or false, got 'yes please'"),
    ("train_conf:\n  max_epoch: 0\n", "t.yaml:2: train_conf.max_epoch: must be at least 1, got 0"),
    ("model: 12\n", "t.yaml:1: model: must be a string, got 12 (put it in quotes)"),
    ("optim_conf:\n  learning_rate: 0.1\n",
     "t.yaml:2: optim_conf.learning_rate: unknown key (put free-form overrides under 'extra')"),
    ("dataset_conf: 5\n", "t.yaml:1: dataset_conf: must be a mapping"),
    ("- a\n- b\n", "t.yaml:1:1: the file must be a mapping of keys"),
    ("model: [\n", "t.yaml:2:1: expected the node content, but found '<stream end>'"),
])
def test_bad_files_name_file_line_and_key(text: str, issue: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(text, "t.yaml")
    assert str(err.value).splitlines()[0] == issue


def test_all_problems_at_once_in_line_order() -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile("foo: 1\ndataset_conf:\n  num_workers: -1\n  sort_size: x\n", "t.yaml")
    assert [i.line for i in err.value.issues] == [1, 3, 4]


def test_missing_file_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"none.yaml: No such file or directory"):
        load_profile(tmp_path / "none.yaml")


def test_replace_checks_the_value() -> None:
    profile = default_profile()
    changed = profile.replace("dataset_conf.batch_size", 8000)
    assert changed.dataset_conf.batch_size == 8000 and profile.dataset_conf.batch_size == 6000
    with pytest.raises(ProfileError, match="dataset_conf.batch_size: must be a whole number"):
        profile.replace("dataset_conf.batch_size", "8k")
    assert profile.get("train_conf.use_deepspeed") is True


@pytest.mark.parametrize("value,text", [
    ("iic/SenseVoiceSmall", "iic/SenseVoiceSmall"), ("/data/my runs/out", "'/data/my runs/out'"),
    ("true", "'true'"), ("6000", "'6000'"), ("it's", "'it\\'s'"), (True, "true"), (2e-4, "0.0002"),
    (6000, "6000"),
])
def test_hydra_values_read_back_as_the_same_type(value: object, text: str) -> None:
    assert hydra_value(value) == text  # type: ignore[arg-type]


def test_save_is_atomic_with_a_backup_and_round_trips(tmp_path: Path) -> None:
    path = profile_path_for(tmp_path / "cluster.yaml")
    assert path == tmp_path / "training.yaml"
    first = default_profile().replace("output_dir", "/data/shared/run1")
    save_profile(first, path)
    assert load_profile(path) == first
    second = first.replace("train_conf.max_epoch", 3)
    save_profile(second, path)
    assert load_profile(path).train_conf.max_epoch == 3
    assert load_profile(tmp_path / "training.yaml.bak") == first
    with pytest.raises(ValueError, match="needs a path"):
        save_profile(default_profile())


def test_save_edits_an_existing_file_in_place_keeping_comments(tmp_path: Path) -> None:
    path = tmp_path / "training.yaml"
    path.write_text(
        "# the cluster's training profile\n"
        "output_dir: /data/shared/out   # on NFS, every rank resumes from it\n"
        "dataset_conf:\n"
        "  batch_size: 6000   # tokens\n"
        "extra:\n"
        "  dataset_conf.batch_sampler: BatchSampler  # kept as is\n"
        "  old_knob: 1\n")
    profile = load_profile(path)
    extra = {k: v for k, v in profile.extra.items() if k != "old_knob"}
    changed = (profile.replace("optim_conf.lr", 0.0003).replace("dataset_conf.batch_size", 8000)
               .replace("extra", extra))
    save_profile(changed, path)
    text = path.read_text()
    assert text == (
        "# the cluster's training profile\n"
        "output_dir: /data/shared/out   # on NFS, every rank resumes from it\n"
        "dataset_conf:\n"
        "  batch_size: 8000   # tokens\n"
        "extra:\n"
        "  dataset_conf.batch_sampler: BatchSampler  # kept as is\n"
        "optim_conf:\n"
        "  lr: 0.0003\n")
    assert load_profile(path).to_overrides() == changed.to_overrides()
    assert (tmp_path / "training.yaml.bak").read_text().endswith("  old_knob: 1\n")


WALKTHROUGH = """\
model: /demo/shared/tiny/model
train_data_set_list: /demo/shared/tiny/train.jsonl
valid_data_set_list: /demo/shared/tiny/valid.jsonl
output_dir: /demo/shared/exp
params_millions: 1.8
dataset_conf: {batch_size: 500, batch_type: token, sort_size: 64, num_workers: 0}
train_conf:
  max_epoch: 20     # a comment, spaced    like this
  log_interval: 1
  validate_interval: 100000
  save_checkpoint_interval: 100000
  keep_nbest_models: 2
  avg_keep_nbest_models_type: loss
  use_deepspeed: true
  deepspeed_config: /demo/shared/tiny/ds_zero1_fp32.json
optim_conf: {lr: 0.0002}
extra: {disable_update: true, dataset_conf.batch_sampler: BatchSampler, train_conf.avg_nbest_model: 2}
"""


def test_nothing_changed_nothing_rewritten(tmp_path: Path) -> None:
    """The walkthrough's profile (a long flow-style extra: line) saved untouched is the same
    bytes, and the file is not even rewritten (no .bak)."""
    path = tmp_path / "training.yaml"
    path.write_text(WALKTHROUGH)
    profile = load_profile(path)
    assert profile_text(profile, WALKTHROUGH) == WALKTHROUGH
    save_profile(profile, path)
    assert path.read_text() == WALKTHROUGH and not (tmp_path / "training.yaml.bak").exists()


@pytest.mark.parametrize("key,value,line", [
    # the comment stays at its column
    ("train_conf.max_epoch", 3, "  max_epoch: 3      # a comment, spaced    like this\n"),
    ("dataset_conf.num_workers", 2,
     "dataset_conf: {batch_size: 500, batch_type: token, sort_size: 64, num_workers: 2}\n"),
    ("output_dir", "/demo/shared/exp2", "output_dir: /demo/shared/exp2\n"),
])
def test_a_changed_value_changes_only_its_line(key: str, value: object, line: str) -> None:
    profile = parse_profile(WALKTHROUGH, "training.yaml").replace(key, value)
    text = profile_text(profile, WALKTHROUGH)
    old, new = WALKTHROUGH.splitlines(keepends=True), text.splitlines(keepends=True)
    assert len(old) == len(new)
    assert [b for a, b in zip(old, new, strict=True) if a != b] == [line]
    assert not [x for x in new if x.rstrip("\n") != x.rstrip()], "no trailing whitespace"
    assert parse_profile(text, "training.yaml") == profile


def test_an_added_key_is_one_added_line() -> None:
    profile = parse_profile(WALKTHROUGH, "training.yaml").replace("train_conf.resume", False)
    text = profile_text(profile, WALKTHROUGH)
    added = [x for x in text.splitlines() if x not in WALKTHROUGH.splitlines()]
    assert added == ["  resume: false"] and len(text.splitlines()) == 18
