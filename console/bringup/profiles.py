"""Package profiles for the training environment, as data.

The seed guide pinned 2024 versions (torch<=2.3, numpy<=1.26.4, deepspeed==0.14.0, ...); the
SenseVoice repository now asks for torch>=2.12.1 and funasr>=1.3.26. Neither is hard-coded in a
step: the operator picks a profile, and sees its pins before anything is installed
(``svconsole setup --steps python-packages --dry-run``, or the confirmation prompt).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """A named list of pip requirement specifiers."""

    name: str
    description: str
    requirements: tuple[str, ...]

    def pins(self) -> str:
        return ", ".join(self.requirements)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "seed-2024",
            "the seed guide's 2024 pins (section 3.2); old, kept to reproduce earlier runs",
            ("torch<=2.3", "torchaudio", "modelscope", "huggingface_hub", "funasr>=1.1.3",
             "numpy<=1.26.4", "gradio", "fastapi>=0.111.1", "deepspeed==0.14.0",
             "accelerate==0.27.2"),
        ),
        Profile(
            "current",
            "what SenseVoice's requirements ask for now",
            ("torch>=2.12.1", "torchaudio", "funasr>=1.3.26", "deepspeed", "accelerate",
             "modelscope", "huggingface_hub", "kaldi-native-fbank", "numpy"),
        ),
        Profile(
            "test",
            "one tiny package (svconsole-selftest), for trying the step offline with "
            "--find-links DIR --no-index",
            ("svconsole-selftest>=0.1",),
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown package profile {name!r}; known: {', '.join(PROFILES)}") from None
