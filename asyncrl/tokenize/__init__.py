"""Tokenizers (byte-level for tiny models, Hugging Face for real ones), chat formats, tool calls."""

from __future__ import annotations

from asyncrl.config.model import TokenizerConfig
from asyncrl.tokenize.base import Tokenizer
from asyncrl.tokenize.byte import ByteTokenizer
from asyncrl.tokenize.chat import ChatFormat, Conversation, render


def build_tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    if cfg.kind == "byte":
        return ByteTokenizer()
    from asyncrl.tokenize.hf import HFTokenizer

    assert cfg.path is not None  # TokenizerConfig validates this
    return HFTokenizer.load(cfg.path)


def build_chat_format(cfg: TokenizerConfig, tokenizer: Tokenizer | None = None) -> ChatFormat:
    return ChatFormat(cfg.chat_format, tokenizer or build_tokenizer(cfg))


__all__ = [
    "ByteTokenizer",
    "ChatFormat",
    "Conversation",
    "Tokenizer",
    "build_chat_format",
    "build_tokenizer",
    "render",
]
