"""data/text_stream.py: generated ids -> text handed out only once stable, whose pieces add
up to tokenizer.decode(ids), cut before the first stop string to appear. Real tokenizers:
UTF-8 bytes (a character over several tokens), a byte-level BPE trained here (merges that
split characters, as SmolLM2's and GPT-2's do) and MiniLM's WordPiece (`##` continuations)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.text_stream import INCOMPLETE, TextStream
from pipeline.data.tokenizer import Tokenizer

CORPUS = ["The capital of France is Paris.", "Zoë et Chloé mangent des crêpes à Noël.",
          "東京は日本の首都です。", "emoji 😀🎉 party time", "naïve café résumé"]


@functools.cache
def bpe() -> Tokenizer:
    """A byte-level BPE trained on CORPUS: its merges join bytes of different characters."""
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Raw(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>"))


@functools.cache
def wordpiece() -> Tokenizer:
    from tests.data.test_tokenizer import minilm_folder

    return Tokenizer.from_folder(minilm_folder(), "test")


def streamed(tok: Tokenizer, ids: list[int], stop=()) -> tuple[list[str], TextStream]:
    """Every piece the stream hands out (the last from finish), feeding ids until it stops."""
    stream, pieces = TextStream(tok, stop), []
    for token in ids:
        pieces.append(stream.add(token))
        if stream.stopped:
            break
    pieces.append(stream.finish())
    return pieces, stream


def first_stop(text: str, stops) -> str:
    """The text cut before the stop that ends first (then starts first), computed on the whole."""
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return text[:min(hits)[1]] if hits else text


@pytest.mark.parametrize("tok", [Tokenizer(), bpe()], ids=["bytes", "byte-level-bpe"])
@pytest.mark.parametrize("text", ["Zoë et Chloé 東京 😀 Paris", "日本の首都 🎉🎉 x", "plain ascii"])
def test_characters_split_over_tokens_come_out_whole(tok, text):
    ids = tok.encode(text, special_tokens=False)
    pieces, stream = streamed(tok, ids)
    assert "".join(pieces) == stream.text == tok.decode(ids) == text
    assert not any(INCOMPLETE in p for p in pieces)  # half a character is never handed out
    if tok.is_bytes:  # each multi-byte character waits for its last byte, then comes at once
        assert "😀" in pieces or "😀" not in text


def test_wordpiece_continuations_join_the_word_they_continue():
    tok = wordpiece()
    ids = tok.encode("unaffable tokenization works", special_tokens=False)
    assert len(ids) > 3  # the words are split into ## pieces
    pieces, stream = streamed(tok, ids)
    assert "".join(pieces) == stream.text == tok.decode(ids) == "unaffable tokenization works"


def test_a_stop_string_across_tokens_cuts_the_text_before_it_and_ends_the_stream():
    tok = Tokenizer()
    ids = tok.encode("Hello world. Goodbye", special_tokens=False)
    pieces, stream = streamed(tok, ids, stop=("ld. G",))
    assert stream.stopped and stream.text == "".join(pieces) == "Hello wor"
    assert len(stream.ids) == len("Hello world. G")  # no token after the one completing it
    with pytest.raises(RuntimeError):
        stream.add(65)


def test_a_possible_stop_is_held_back_and_released_when_it_does_not_complete():
    tok = Tokenizer()
    stream = TextStream(tok, stop=("###",))
    out = [stream.add(t) for t in tok.encode("ab##", special_tokens=False)]
    assert out == ["a", "b", "", ""]  # "##" may begin the stop: not handed out yet
    assert stream.finish() == "##" and stream.text == "ab##" and not stream.stopped


def test_the_stop_that_appears_first_wins_however_tokens_split_the_text():
    """"abcd" with stops ("abcd", "bc"): "bc" is complete first, one character at a time, so
    the reply is "a", whether "abcd" came as one token or four."""
    assert first_stop("xabcd", ("abcd", "bc")) == "xa"
    tok = bpe()
    for text in ("xabcd", "Paris Paris"):
        ids = tok.encode(text, special_tokens=False)
        _, stream = streamed(tok, ids, stop=("abcd", "bc", "is P"))
        assert stream.text == first_stop(text, ("abcd", "bc", "is P"))
    pieces, stream = streamed(Tokenizer(), list(b"xabcd"), stop=("abcd", "bc"))
    assert stream.text == "".join(pieces) == "xa"


def test_a_stop_at_the_start_gives_an_empty_reply():
    pieces, stream = streamed(Tokenizer(), list(b"\n\nrest"), stop=("\n",))
    assert stream.stopped and stream.text == "" and "".join(pieces) == ""


def test_an_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="empty"):
        TextStream(Tokenizer(), stop=("",))


def test_an_incomplete_character_at_the_end_is_handed_out_as_decode_gives_it():
    tok = Tokenizer()
    ids = list("é".encode()) + list("日".encode())[:2]
    pieces, stream = streamed(tok, ids)
    assert pieces[-1] == "\ufffd" and stream.text == tok.decode(ids) == "é\ufffd"


@settings(max_examples=150, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
       stops=st.lists(st.text(st.sampled_from("ab é日😀\n"), min_size=1, max_size=3), max_size=3),
       bpe_tokens=st.booleans())
def test_the_pieces_add_up_to_the_decoded_text_cut_at_the_first_stop(text, stops, bpe_tokens):
    tok = bpe() if bpe_tokens else Tokenizer()
    ids = tok.encode(text, special_tokens=False)
    pieces, stream = streamed(tok, ids, stops)
    assert "".join(pieces) == stream.text == first_stop(tok.decode(ids), stops)
    assert not any(INCOMPLETE in p for p in pieces[:-1]) or INCOMPLETE in text
