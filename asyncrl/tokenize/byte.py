"""A byte-level tokenizer with special tokens, for the tiny models.

Ids 0-255 are the UTF-8 bytes; ids from 256 are the special tokens below, which cover both
chat formats (ChatML, Llama 3) and the tool-call tags. The id space is fixed, so a checkpoint of a
tiny model stays valid whatever text it is used on.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.config.run import BYTE_TOKENIZER_VOCAB

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
assert 256 + len(SPECIAL_TOKENS) <= BYTE_TOKENIZER_VOCAB


class ByteTokenizer:
    def __init__(self) -> None:
        self._special = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
        self._by_id = {i: tok for tok, i in self._special.items()}

    @property
    def vocab_size(self) -> int:
        return BYTE_TOKENIZER_VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        try:  # the common case, no special token: one C call
            return bytes(ids if isinstance(ids, list | tuple) else list(ids)).decode(
                "utf-8", errors="replace"
            )
        except ValueError:  # an id outside 0-255: a special token (or invalid, raised below)
            return self._decode_with_specials(ids)

    def _decode_with_specials(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(self._by_id.get(i, ""))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def special_id(self, token: str) -> int:
        return self._special[token]

    def has_special(self, token: str) -> bool:
        return token in self._special
