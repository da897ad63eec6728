"""The cluster model: what ``cluster.yaml`` describes.

Skeleton of the data classes (the contract in docs/design.md); the loader is filled in next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class SSHSettings:
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    known_hosts: str = "~/.config/svconsole/known_hosts"
    host_key_policy: Literal["accept-new", "strict"] = "accept-new"
    jump_host: str | None = None
    connect_timeout: float = 10.0
    max_parallel: int = 32


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    role: Literal["head", "worker"] = "worker"
    gpus: tuple[int, ...] | None = None
    local: bool = False
    line: int | None = None


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    shared_dir: str = "/data/shared"
    master: str = ""
    master_port: int = 26669
    ssh: SSHSettings = field(default_factory=SSHSettings)
    python: str | None = None
    path: Path | None = None

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def master_node(self) -> Node:
        return self.node(self.master or self.nodes[0].name)
