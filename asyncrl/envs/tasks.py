"""Built-in task families with deterministic generators and fixed held-out splits.

`calculator`: multiply or add multi-digit numbers, which a small model cannot do in its head but can
with the calculator tool. `lookup`: find the prices of two items in a per-task table with the lookup
tool, then combine them with the calculator (several steps). A task is a pure function of
(family, split, index, seed): the held-out split draws from its own stream, so it never changes
when the training set grows, and no held-out task is a training task.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from asyncrl.types import Task

FAMILIES = ("calculator", "lookup")
ITEMS = (
    "apple", "pear", "plum", "fig", "kiwi", "lime", "date", "melon",
    "grape", "peach", "mango", "lemon", "cherry", "guava", "papaya", "quince",
)  # fmt: skip


def _rng(family: str, split: str, index: int, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{family}/{split}/{seed}/{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def calculator_task(split: str, index: int, seed: int = 0) -> Task:
    rng = _rng("calculator", split, index, seed)
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    op = rng.choice(["*", "+"])
    answer = a * b if op == "*" else a + b
    return Task(
        id=f"calculator/{split}/{index}",
        family="calculator",
        prompt=f"{a}{op}{b}=?",
        answer=str(answer),
        environment="tool",
    )


def lookup_task(split: str, index: int, seed: int = 0) -> Task:
    rng = _rng("lookup", split, index, seed)
    items = rng.sample(ITEMS, 4)
    table = tuple((item, str(rng.randint(10, 99))) for item in items)
    x, y = rng.sample(items, 2)
    prices = dict(table)
    return Task(
        id=f"lookup/{split}/{index}",
        family="lookup",
        prompt=f"{x}+{y}=?",
        answer=str(int(prices[x]) + int(prices[y])),
        environment="tool",
        table=table,
    )


GENERATORS = {"calculator": calculator_task, "lookup": lookup_task}


def make_task(family: str, split: str, index: int, seed: int = 0) -> Task:
    if family not in GENERATORS:
        raise ValueError(f"unknown task family {family!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[family](split, index, seed)


def task_stream(families: tuple[str, ...], split: str, size: int, seed: int = 0) -> Iterator[Task]:
    """`size` tasks per family, interleaved family by family, in a fixed order."""
    for index in range(size):
        for family in families:
            yield make_task(family, split, index, seed)


def heldout(families: tuple[str, ...], size: int, seed: int = 0) -> list[Task]:
    return list(task_stream(families, "heldout", size, seed))


class EpochOrder:
    """The training stream: epoch after epoch over a task list, each epoch in its own seeded order.

    Task n is a pure function of (tasks, seed, n) (`at(n)`), so a restored data cursor can re-issue
    group n and continue from any position.
    """

    def __init__(self, tasks: list[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("the training split is empty")
        self.tasks, self.seed = tasks, seed
        self._epoch, self._order = -1, tasks

    def at(self, n: int) -> Task:
        epoch, i = divmod(n, len(self.tasks))
        if epoch != self._epoch:
            self._order = list(self.tasks)
            random.Random(f"{self.seed}/{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self._order[i]
