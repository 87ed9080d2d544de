"""A Hugging Face `tokenizer.json` behind the `Tokenizer` protocol (the `tokenizers` package).

Loads from a local file or directory or a gs:// URI. Added/special tokens are looked up by their
text; `encode` sets `encode_special_tokens` so their spellings inside text stay plain text, and adds
no BOS/EOS: the chat format decides every special token in a sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as _HFTokenizer

from asyncrl import storage


class HFTokenizer:
    def __init__(self, tokenizer: _HFTokenizer) -> None:
        self._tok = tokenizer
        self._tok.encode_special_tokens = True
        self._special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}

    @classmethod
    def load(cls, uri: str) -> HFTokenizer:
        """From tokenizer.json, or a directory (local or gs://) that holds it."""
        path = uri if uri.endswith(".json") else storage.join(uri, "tokenizer.json")
        return cls(_HFTokenizer.from_str(storage.read_bytes(path).decode("utf-8")))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def special_id(self, token: str) -> int:
        return self._special[token]

    def has_special(self, token: str) -> bool:
        return token in self._special
