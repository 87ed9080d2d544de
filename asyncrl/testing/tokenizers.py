"""A small Hugging Face BPE tokenizer trained in-process, standing in for a real tokenizer.json."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from asyncrl.tokenize.byte import SPECIAL_TOKENS

CORPUS = [
    "What is 17 * 23? Use the calculator tool.",
    '{"name": "calculator", "arguments": {"expression": "17 * 23"}}',
    "The answer is 391. Look up the price of apples and oranges.",
    "user assistant system tool lookup key value result error",
]


def write_bpe_tokenizer(directory: Path, vocab_size: int = 600) -> Path:
    """Train a byte-level BPE with the chat special tokens on a tiny corpus; write it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return path
