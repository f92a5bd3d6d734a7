"""Incremental UTF-8 and stop strings (unit level)."""

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
