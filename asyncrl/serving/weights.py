"""The weights root shared by the trainer and its replicas: `v<version>/` folders, one per publish.

The trainer writes a version folder, tells the replicas its name, and prunes old versions once
every live replica has answered; a replica loads only a folder it resolves inside its own root.
Invariant: a peer's publish can name `v<version>` under the replica's root and nothing else (no
absolute path, no `..`, no URI, no symlink leading out), whatever the peer sends.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from asyncrl.serving.wire import ErrorCode, WireError

VERSION_NAME = re.compile(r"v(0|[1-9][0-9]{0,9})")


def folder_name(version: int) -> str:
    return f"v{version}"


def resolve(root: Path, name: object, version: int) -> Path:
    """The folder a publish of `version` named `name` loads, or `WireError(BAD_PATH)`."""
    refused = WireError(
        ErrorCode.BAD_PATH, "a publish names the folder v<version> under the replica's weights root"
    )
    if not isinstance(name, str) or name != folder_name(version):
        raise refused
    base = root.resolve()
    folder = (base / name).resolve()
    if folder.parent != base:  # a symlinked version folder that leads out of the root
        raise refused
    return folder


def versions(root: Path) -> list[int]:
    """Versions with a folder (or a link) under `root`, ascending."""
    if not root.is_dir():
        return []
    found = (VERSION_NAME.fullmatch(p.name) for p in root.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def prune(root: Path, newest: int, keep: int) -> list[int]:
    """Remove version folders at or below `newest - keep` (newer ones may still be announced);
    returns the versions removed. Only `v<N>` entries are touched; a link is unlinked, not followed.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    removed = []
    for version in versions(root):
        if version > newest - keep:
            continue
        path = root / folder_name(version)
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(version)
    return removed
