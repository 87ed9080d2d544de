"""Base-image pins: the table in images/base-images.txt, checked against the Dockerfiles.

    python3 images/pins.py check        # exit 1, one line per problem, unless every pin is real
    python3 images/pins.py build-args   # --build-arg NAME=REF ... for `docker build` (checks first)

A pin is `name[:tag]@sha256:<64 hex>`; anything else (a bare tag, the UNRESOLVED placeholder) is a
problem. Each Dockerfile must start every stage `FROM ${NAME}` for a pinned NAME it declares with
`ARG NAME` before its first FROM, or `FROM <stage>` for an earlier stage, or a literal pinned
reference. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
TABLE = HERE / "base-images.txt"
REPO = r"(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9][a-z0-9._/-]*"  # [registry[:port]/]path
TAG = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
PINNED = re.compile(rf"{REPO}{TAG}@sha256:[0-9a-f]{{64}}")
NAME = re.compile(r"[A-Z][A-Z0-9_]*")
FROM = re.compile(r"FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
ARG = re.compile(r"ARG\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def load(text: str) -> dict[str, str]:
    """NAME -> reference from the table's text; raises ValueError on a malformed line."""
    pins: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not NAME.fullmatch(parts[0]) or parts[0] in pins:
            raise ValueError(f"line {number}: expected a new 'NAME REFERENCE', got {line!r:.80}")
        pins[parts[0]] = parts[1]
    return pins


def pin_problems(pins: dict[str, str]) -> list[str]:
    return [
        f"{name}: {ref} is not pinned by a sha256 digest (resolve it: see base-images.txt)"
        for name, ref in pins.items()
        if not PINNED.fullmatch(ref)
    ]


def dockerfile_problems(name: str, text: str, pins: dict[str, str]) -> list[str]:
    """Every FROM in the Dockerfile `name` reaches a pinned image."""
    problems, declared, stages, seen_from = [], set(), set(), False
    for line in text.splitlines():
        line = line.strip()
        if m := ARG.match(line):
            if not seen_from:
                declared.add(m.group(1))
            continue
        if not (m := FROM.match(line)):
            continue
        seen_from = True
        image, stage = m.group(1), m.group(2)
        var = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", image)
        if var:
            if var.group(1) not in pins:
                problems.append(f"{name}: FROM {image}: {var.group(1)} is not in base-images.txt")
            elif var.group(1) not in declared:
                problems.append(f"{name}: FROM {image}: no 'ARG {var.group(1)}' before it")
        elif image not in stages and not PINNED.fullmatch(image):
            problems.append(f"{name}: FROM {image} is not pinned by digest")
        if stage:
            stages.add(stage)
    if not seen_from:
        problems.append(f"{name}: no FROM line")
    return problems


def problems(table: Path = TABLE, dockerfiles: list[Path] | None = None) -> list[str]:
    pins = load(table.read_text())
    found = pin_problems(pins)
    for path in sorted(dockerfiles if dockerfiles is not None else HERE.glob("*.Dockerfile")):
        found += dockerfile_problems(path.name, path.read_text(), pins)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("check", "build-args"):
        print("usage: pins.py check | build-args", file=sys.stderr)
        return 2
    try:
        found = problems()
    except (OSError, ValueError) as e:
        print(f"images/base-images.txt: {e}", file=sys.stderr)
        return 1
    for line in found:
        print(f"image pin: {line}", file=sys.stderr)
    if found:
        return 1
    if argv[0] == "build-args":
        print(" ".join(f"--build-arg {n}={r}" for n, r in load(TABLE.read_text()).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
