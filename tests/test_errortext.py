"""Error text made safe for a terminal, and tracebacks capped (pure logic,
no database)."""

from __future__ import annotations

from pgfence import errortext


def test_one_line_escapes_control_characters_ansi_newlines_and_bidi_overrides():
    hostile = "red \x1b[31mALERT\x1b[0m\r\nline two\ttab \x07bell \u202edesrever\x00 back\\slash \x9b c1 é ok"
    assert errortext.one_line(hostile) == (
        "red \\x1b[31mALERT\\x1b[0m\\r\\nline two\\ttab \\x07bell \\u202edesrever\\x00 back\\\\slash "
        "\\x9b c1 é ok")
    assert all(c.isprintable() for c in errortext.one_line(hostile))


def test_printable_keeps_lines_and_escapes_each():
    assert errortext.printable("a\x1b[2J\nb\r\n\x1b]0;title\x07") == "a\\x1b[2J\nb\\r\n\\x1b]0;title\\x07"


def test_first_line_is_the_first_non_empty_line_escaped():
    assert errortext.first_line("\n  \nRuntimeError: \x1b[1mboom\nmore") == "RuntimeError: \\x1b[1mboom"
    assert errortext.first_line("") == ""


def test_cap_keeps_short_text_and_cuts_long_text_to_the_exact_cap():
    assert errortext.cap("short", limit=100, head=10) == "short"
    text = "H" * 50 + "x" * 1000 + "T" * 50
    capped = errortext.cap(text, limit=200, head=40)
    assert len(capped) == 200
    assert capped.startswith("H" * 40 + "\n... [1100 characters, cut to 200] ...\n")
    assert capped.endswith("x" * 50 + "T" * 50)


def test_format_traceback_names_the_function_and_the_exception_line_and_is_capped():
    def charge_card():
        raise ValueError("card declined: " + "z" * 100_000)

    try:
        charge_card()
    except ValueError as exc:
        text = errortext.format_traceback(exc)
    assert len(text) == errortext.TRACEBACK_CAP
    assert text.startswith("Traceback (most recent call last):\n")
    head = text[:errortext.TRACEBACK_HEAD]
    assert ", in charge_card\n" in head and 'raise ValueError("card declined: " + "z" * 100_000)' in head
    assert text.endswith("z" * 1000)   # the end of the exception line
