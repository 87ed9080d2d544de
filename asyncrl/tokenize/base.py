"""The `Tokenizer` protocol shared by the byte tokenizer and the Hugging Face wrapper.

Special tokens are addressed by their text ("<|im_end|>") and are never produced by `encode`: text
that merely contains a special token's spelling (a tool's output, a user's message) encodes as plain
text, so no outside string can forge a turn boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token spellings inside `text` stay plain text."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text; special tokens decode to their spelling."""
        ...

    def special_id(self, token: str) -> int:
        """The id of a special token; KeyError when this tokenizer has none by that spelling."""
        ...

    def has_special(self, token: str) -> bool: ...
