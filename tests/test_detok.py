"""Incremental UTF-8 and stop strings (unit level)."""

import openai

from turbospark.engine.detok import StopMatcher, Utf8Stream


def test_utf8_split_across_tokens_is_held():
    s = Utf8Stream()
    data = "héllo 🐉".encode()
    out = "".join(s.feed(data[i : i + 1]) for i in range(len(data))) + s.flush()
    assert out == "héllo 🐉"
    s2 = Utf8Stream()
    dragon = "🐉".encode()
    assert s2.feed(dragon[:2]) == ""  # never a broken character
    assert s2.feed(dragon[2:]) == "🐉"


def test_stop_string_across_pieces_is_not_leaked():
    m = StopMatcher(["STOP"])
    emitted = []
    for piece in ["hello S", "T", "O", "P and more"]:
        text, hit = m.feed(piece)
        emitted.append(text)
        if hit:
            break
    assert "".join(emitted) == "hello "
    assert hit


def test_partial_match_released_when_it_diverges():
    m = StopMatcher(["</end>"])
    assert m.feed("a </e") == ("a ", False)
    assert m.feed("nd") == ("", False)
    assert m.feed("x") == ("</endx", False)
    assert m.flush() == ""


def test_earliest_of_several_stops_wins():
    m = StopMatcher(["world", "lo w"])
    assert m.feed("hello world") == ("hel", True)


def test_no_stops_passes_through():
    m = StopMatcher([])
    assert m.feed("abc") == ("abc", False)


def test_a_character_cut_at_the_end_is_left_out_not_replaced():
    dragon = "🐉".encode()
    for cut in (1, 2, 3):
        s = Utf8Stream()
        assert s.feed(b"ok " + dragon[:cut]) == "ok "
        assert s.flush(cut=True) == ""  # never U+FFFD for half a character
        s = Utf8Stream()
        assert s.feed(b"ok " + dragon[:cut]) == "ok "
        assert s.flush() == "\ufffd"  # the model itself ended there
    # bytes that can never become a character are U+FFFD, mid-text and at
    # the end: the start of a surrogate (held back by the decoder) included
    s = Utf8Stream()
    assert s.feed(b"a\xffb") == "a\ufffdb"
    assert s.feed(b"\xed\xa0") == ""
    assert s.flush(cut=True) == "\ufffd\ufffd"
    s = Utf8Stream()
    assert s.feed(b"x\xe2\x28") == "x\ufffd("
    assert s.flush(cut=True) == ""


def test_the_real_model_cut_inside_an_emoji_sends_no_replacement_character(base_url):
    """SmolLM2 writes 🌍 as three tokens; budgets that end inside it give the
    text before it, streamed and not, never U+FFFD."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x")
    prompt = "🌍 " * 30
    texts = []
    for budget in range(1, 7):
        r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=budget, temperature=0)
        assert r.usage.completion_tokens == budget
        text = r.choices[0].text
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model="smollm2", prompt=prompt, max_tokens=budget, temperature=0, stream=True
            )
            if c.choices
        )
        assert "\ufffd" not in text and streamed == text
        texts.append(text)
    assert "🌍" in texts[-1]
    for shorter, longer in zip(texts, texts[1:]):
        assert longer.startswith(shorter)
    # some budget really ended inside the emoji: a token more, no text more
    assert any(a == b for a, b in zip(texts, texts[1:])), texts


def test_indent_stop_ends_where_a_later_line_is_indented_less():
    """llama.cpp's n_indent: the first line is never judged; a later line
    indented less than n (a blank line too) ends the text before its first
    character, its indentation kept; text split anywhere gives the same."""
    from turbospark.engine.detok import IndentStop

    def run(n: int, pieces: list[str]) -> tuple[str, bool]:
        stop, out = IndentStop(n), ""
        for p in pieces:
            emit, cut = stop.feed(p)
            out += emit
            if cut:
                return out, True
        return out, False

    text = "x = 1\n    y = 2\n\tz\n  w\nq"
    assert run(4, [text]) == ("x = 1\n    y = 2\n\t", True)  # (a tab counts as one)
    assert run(1, [text]) == ("x = 1\n    y = 2\n\tz\n  w\n", True)
    assert run(1, ["a\n b\n  c"]) == ("a\n b\n  c", False)
    assert run(4, list(text)) == run(4, [text])  # one character at a time
    assert run(4, ["no newline at all"]) == ("no newline at all", False)
    assert run(2, ["a\n  b\n\nc"]) == ("a\n  b\n", True)  # a blank line ends it
    assert run(2, ["a\n   \n  b\n c"]) == ("a\n   \n  b\n ", True)  # (an indented blank line is a line)
    assert run(0, [text]) == (text, False)
