"""Tokenizers round-trip; chat rendering's model-produced mask is exact; tool calls parse."""

import json
import random

import pytest

from asyncrl import storage
from asyncrl.testing.tokenizers import write_bpe_tokenizer
from asyncrl.tokenize import ByteTokenizer, ChatFormat, Conversation, render
from asyncrl.tokenize.call_json import (
    MAX_CALL_CHARS,
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    check_call_text,
)
from asyncrl.tokenize.hf import HFTokenizer
from asyncrl.tokenize.tool_calls import parse_turn
from asyncrl.types import Message, Role, ToolCall

TEXTS = ["", "hello", "17 * 23 = 391", "naïve café — 東京 🚀", "<|im_end|> is only text here"]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    return HFTokenizer.load(str(write_bpe_tokenizer(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(params=["byte", "hf"])
def tokenizer(request, hf_tokenizer):
    return ByteTokenizer() if request.param == "byte" else hf_tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_spellings_in_text_never_become_special_tokens(tokenizer):
    ids = tokenizer.encode("<|im_end|><tool_call>")
    assert tokenizer.special_id("<|im_end|>") not in ids
    assert tokenizer.special_id("<tool_call>") not in ids


def test_hf_tokenizer_loads_from_gcs(gcs_bucket, tmp_path):
    path = write_bpe_tokenizer(tmp_path)
    uri = storage.join(gcs_bucket, "tok")
    storage.write_bytes(storage.join(uri, "tokenizer.json"), path.read_bytes())
    tok = HFTokenizer.load(uri)
    assert tok.decode(tok.encode("The answer is 391.")) == "The answer is 391."


CONVERSATION = [
    Message(role=Role.SYSTEM, content="You can call tools."),
    Message(role=Role.USER, content="What is 17 * 23?"),
    Message(
        role=Role.ASSISTANT,
        content="Let me compute.",
        tool_calls=(ToolCall(name="calculator", arguments_json='{"expression": "17 * 23"}'),),
    ),
    Message(role=Role.TOOL, name="calculator", content="391"),
    Message(role=Role.ASSISTANT, content="The answer is 391."),
]


@pytest.mark.parametrize("fmt_name", ["chatml", "llama3"])
def test_mask_marks_exactly_the_assistant_turns(tokenizer, fmt_name):
    fmt = ChatFormat(fmt_name, tokenizer)
    tokens, mask = render(fmt, CONVERSATION)
    assert len(tokens) == len(mask)
    # The masked tokens, in order, are each assistant body followed by its end-of-turn token.
    expected = []
    for m in CONVERSATION:
        if m.role == Role.ASSISTANT:
            expected += [*fmt.body(m), fmt.end_of_turn]
    assert [t for t, k in zip(tokens, mask, strict=True) if k] == expected
    # Every masked run starts right after an assistant header.
    header = list(fmt.header(Role.ASSISTANT))
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    assert len(starts) == 2
    for i in starts:
        assert tokens[i - len(header) : i] == header


def test_appending_turns_never_retokenizes_earlier_ones(tokenizer):
    fmt = ChatFormat("chatml", tokenizer)
    conv = Conversation.of(fmt, CONVERSATION[:2])
    conv.begin_assistant()
    before = list(conv.tokens)
    sampled = [*tokenizer.encode("The answer"), fmt.end_of_turn]
    conv.add_sampled(sampled)
    assert conv.tokens[: len(before)] == before
    assert conv.tokens[len(before) : len(before) + len(sampled)] == sampled
    assert conv.mask[len(before) : len(before) + len(sampled)] == [1] * len(sampled)
    assert sum(conv.mask) == len(sampled)


def test_length_truncated_turn_is_closed_with_an_unmasked_end_token():
    tok = ByteTokenizer()
    fmt = ChatFormat("chatml", tok)
    conv = Conversation.of(fmt, CONVERSATION[:2])
    conv.begin_assistant()
    conv.add_sampled(tok.encode("no end"))
    assert conv.tokens[-2:] == [fmt.end_of_turn, *tok.encode("\n")]
    assert conv.mask[-2:] == [0, 0]


@pytest.mark.parametrize("fmt_name", ["chatml", "llama3"])
def test_rendered_tool_calls_parse_back(tokenizer, fmt_name):
    fmt = ChatFormat(fmt_name, tokenizer)
    call = ToolCall(name="lookup", arguments_json='{"key": "apple"}')
    msg = Message(role=Role.ASSISTANT, content="", tool_calls=(call, call))
    parsed = parse_turn(fmt, [*fmt.body(msg), fmt.end_of_turn])
    assert parsed.error is None
    assert parsed.tool_calls == (call, call)


@pytest.mark.parametrize(
    ("pieces", "error"),
    [
        (["<tool_call>", '{"name": "x"'], "never closed"),
        (["<tool_call>", "{nope}", "</tool_call>"], "not valid JSON"),
        (["<tool_call>", '["x"]', "</tool_call>"], 'string "name"'),
        (["<tool_call>", '{"name": "x", "arguments": 3}', "</tool_call>"], "must be a JSON object"),
        (["</tool_call>"], "without <tool_call>"),
    ],
)
def test_malformed_tool_calls_are_reported_not_raised(pieces, error):
    tok = ByteTokenizer()
    fmt = ChatFormat("chatml", tok)
    tokens = []
    for p in pieces:
        tokens += [tok.special_id(p)] if tok.has_special(p) else tok.encode(p)
    parsed = parse_turn(fmt, tokens)
    assert parsed.tool_calls == ()
    assert error in parsed.error


def test_plain_answer_has_no_calls():
    tok = ByteTokenizer()
    fmt = ChatFormat("chatml", tok)
    parsed = parse_turn(fmt, [*tok.encode("391"), fmt.end_of_turn])
    assert parsed == parse_turn(fmt, tok.encode("391"))
    assert parsed.content == "391" and parsed.error is None


NESTED = '{"name": "x", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
BIG_INT = '{"name": "x", "arguments": {"a": ' + "7" * 5000 + "}}"


@pytest.mark.parametrize(
    ("fmt_name", "text", "error"),
    [
        ("chatml", NESTED, f"nests deeper than {MAX_DEPTH} levels"),
        ("chatml", BIG_INT, f"number longer than {MAX_NUMBER_CHARS} characters"),
        ("chatml", '{"a": "' + "x" * MAX_CALL_CHARS + '"}', f"the limit is {MAX_CALL_CHARS}"),
        ("llama3", NESTED.replace("arguments", "parameters"), "nests deeper than"),
        ("llama3", BIG_INT.replace("arguments", "parameters"), "number longer than"),
    ],
)
def test_the_parser_itself_refuses_calls_over_the_limits(fmt_name, text, error):
    tok = ByteTokenizer()
    fmt = ChatFormat(fmt_name, tok)
    body = tok.encode(text)
    tokens = [fmt.call_open, *body, fmt.call_close] if fmt_name == "chatml" else body
    parsed = parse_turn(fmt, [*tokens, fmt.end_of_turn])
    assert parsed.tool_calls == () and error in parsed.error


def _reference_check(text):
    """The limits as stated, written plainly: depth and number runs outside strings."""
    if len(text) > MAX_CALL_CHARS:
        return "size"
    depth = number = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
            continue
        number = number + 1 if ch in "0123456789+-.eE" else 0
        if number > MAX_NUMBER_CHARS:
            return "number"
        in_string = ch == '"'
        depth += (ch in "[{") - (ch in "]}")
        if depth > MAX_DEPTH:
            return "depth"
    return None


def _random_call_text(rng):
    parts = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.choice(["open", "close", "digits", "string", "word"])
        n = rng.choice([1, 5, 20, MAX_DEPTH - 1, MAX_DEPTH, MAX_NUMBER_CHARS, MAX_NUMBER_CHARS + 1])
        if kind == "open":
            parts.append("".join(rng.choice("[{") for _ in range(n)))
        elif kind == "close":
            parts.append("]" * n)
        elif kind == "digits":
            parts.append("".join(rng.choice("0123456789.eE-") for _ in range(n)))
        elif kind == "string":
            inner = "".join(rng.choice('[{9e\\"a') for _ in range(n))
            parts.append('"' + inner + '"')
        else:
            parts.append(rng.choice(["true", "false", ", ", ": ", "null"]))
    return "".join(parts)


def test_call_limits_agree_with_the_plain_reference():
    rng = random.Random(0)
    kinds = {"depth": "nests deeper", "number": "number longer", "size": "characters long"}
    seen = set()
    for _ in range(3000):
        text = _random_call_text(rng)
        expected = _reference_check(text)
        problem = check_call_text(text)
        assert (problem is None) == (expected is None), text
        if expected is not None:
            assert kinds[expected] in problem, text
        seen.add(expected)
    assert seen == {None, "depth", "number"}  # the grid reaches each outcome


def _reference_parse(fmt, tokens):
    """Token by token, as plainly as it can be written: (content, call texts, error or None)."""
    body = [t for t in tokens if t not in fmt.stop_tokens]
    text, calls, i = [], [], 0  # text: the tokens outside calls, each run decoded on its own

    def content():
        return "".join(fmt.tok.decode(run) for run in text).strip()

    while i < len(body):
        if body[i] == fmt.call_close:
            return content(), calls, "without"
        if body[i] != fmt.call_open:
            if i == 0 or body[i - 1] in (fmt.call_open, fmt.call_close):
                text.append([])
            text[-1].append(body[i])
            i += 1
            continue
        if fmt.call_close not in body[i + 1 :]:
            return content(), calls, "never closed"
        end = body.index(fmt.call_close, i + 1)
        call = fmt.tok.decode(body[i + 1 : end]).strip()
        try:
            json.loads(call)
        except ValueError:
            return content(), calls, "tool call is not valid JSON"
        calls.append(call)
        i = end + 1
    return content(), calls, None


def test_parse_turn_agrees_with_a_token_by_token_reference():
    tok = ByteTokenizer()
    fmt = ChatFormat("chatml", tok)
    call = [fmt.call_open, *tok.encode('{"name": "f", "arguments": {"x": 1}}'), fmt.call_close]
    pieces = [tok.encode(" some text "), tok.encode("é"), call, [fmt.call_open], [fmt.call_close],
              [fmt.end_of_turn]]  # fmt: skip
    rng = random.Random(0)
    outcomes = set()
    for _ in range(500):
        tokens = [t for _ in range(rng.randint(0, 6)) for t in rng.choice(pieces)]
        content, texts, error = _reference_parse(fmt, tokens)
        parsed = parse_turn(fmt, tokens)
        assert parsed.content == content, tokens
        if error is None:
            assert parsed.error is None and len(parsed.tool_calls) == len(texts), tokens
        else:
            assert error in parsed.error, tokens
        outcomes.add(error)
    assert outcomes == {None, "without", "never closed", "tool call is not valid JSON"}
