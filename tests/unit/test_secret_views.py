"""The de-obfuscated views the secret scanner examines (engram_memory.policy.views)."""

from __future__ import annotations

import base64

from engram_memory.policy.views import View, derived_views, normalize

TOKEN = "AKIA" + "QZ7RT4MX2PLK9WNB"


def _views(text: str) -> dict[str, View]:
    return {view.name: view for view in derived_views(text)}


def test_normalize_folds_full_width_and_drops_format_characters() -> None:
    full_width = "".join(chr(ord(char) + 0xFEE0) for char in TOKEN)
    assert normalize(full_width) == TOKEN
    assert normalize("\u200b".join(TOKEN)) == TOKEN
    assert normalize("AK\u00adIA\ufeff") == "AKIA"  # soft hyphen, byte-order mark
    assert normalize("a\u00a0b") == "a b"  # no-break space
    assert normalize("plain ascii") == "plain ascii"


def test_ascii_prose_without_tokens_gets_only_the_reversed_view() -> None:
    text = "I went to the park with my kids on Sunday."
    views = list(derived_views(text))
    assert [view.name for view in views] == ["reversed"]
    assert views[0].text == text[::-1] and not views[0].full


def test_spaced_and_line_split_tokens_are_joined_but_prose_is_not_glued_to_them() -> None:
    joined = _views(f"my key is {' '.join(TOKEN)} thanks")["joined"]
    # The run alone, and the run with the short word before it (a group of a key may read as a
    # word); the rest of the sentence is never glued to it.
    assert joined.text.splitlines() == [TOKEN, "is" + TOKEN] and not joined.full
    split = _views(f"remember this: {TOKEN[:9]}\n{TOKEN[9:]} (from Ana)")["joined"]
    assert split.text.splitlines() == [TOKEN]


def test_a_token_in_groups_keeps_groups_that_read_as_words() -> None:
    token = "glpa t-iA P7c- JfGB kkha pnfs s955 rmu0"
    joined = _views(f"the token {token} (from Ana)")["joined"]
    assert "glpat-iAP7c-JfGBkkhapnfss955rmu0" in joined.text.splitlines()


def test_hyphenated_groups_are_dehyphenated() -> None:
    grouped = "-".join(TOKEN[i : i + 4] for i in range(0, len(TOKEN), 4))
    assert TOKEN in _views(f"key {grouped} here")["dehyphenated"].text.splitlines()


def test_base64_and_hex_of_text_are_decoded_into_a_full_view() -> None:
    sentence = f"deploy with {TOKEN} today"
    decoded = _views(base64.b64encode(sentence.encode()).decode())["decoded"]
    assert decoded.text == sentence and decoded.full
    assert _views(sentence.encode().hex())["decoded"].text == sentence
    url_safe = base64.urlsafe_b64encode(sentence.encode()).rstrip(b"=").decode()
    assert _views(url_safe)["decoded"].text == sentence


def test_blobs_that_decode_to_binary_are_not_decoded() -> None:
    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    random_base64 = base64.b64encode(bytes(range(7, 55))).decode()
    for text in (digest, random_base64, "request 3f2b9c1e-8d4a-4b6f-9e2d-7a1c5b3e9f00"):
        assert "decoded" not in _views(text)


def test_decoded_text_gets_its_own_views_once() -> None:
    sentence = "key " + "\u200b".join(TOKEN)
    views = list(derived_views(base64.b64encode(sentence.encode()).decode()))
    assert [view.name for view in views if view.text == sentence] == ["decoded"]
    assert [(view.name, view.full) for view in views if view.text == f"key {TOKEN}"] == [
        ("normalized", True)
    ]


def test_views_are_distinct_and_never_repeat_the_text() -> None:
    text = f"key {' '.join(TOKEN)} and {TOKEN[::-1]}"
    texts = [view.text for view in derived_views(text)]
    assert text not in texts and len(texts) == len(set(texts))
