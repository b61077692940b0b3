"""The quality gate's near-duplicate signatures (policy/quality.py)."""

from __future__ import annotations

import random
from unittest import mock

import pytest
from rensa import RMinHash

from engram_memory.engine.ports import Neighbour
from engram_memory.policy import quality

P = quality.memo_partition("tenant", "workspace")


def _set_signature(text: str) -> list[int]:
    """The signature of the text's set of shingles, as the gate first computed it."""
    normal = quality.normalize(text)
    shingles = {
        normal[i : i + quality.SHINGLE] for i in range(max(1, len(normal) - quality.SHINGLE + 1))
    }
    signature = RMinHash(num_perm=quality.NUM_PERM, seed=27)
    signature.update(sorted(shingles))
    return list(signature.digest())


def test_a_signature_is_that_of_the_set_of_shingles_whatever_their_order_and_repeats() -> None:
    rng = random.Random(26)
    words = ["adoption", "agency", "LGBTQ+", "support", "Caroline:", "ok", "2023", "ÉTÉ", "ﬁne"]
    texts = ["", "ab", "abcde", "aaaaaaaaaaaaaaaa", "la la la la la la la"]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(50)]
    for text in texts:
        assert list(quality._signature(text, P).digest()) == _set_signature(text), text


def test_near_duplicates_are_found_and_others_are_not() -> None:
    text = "Caroline chose the agency because it helps LGBTQ+ folks with adoption."
    neighbours = [
        Neighbour(
            "mem_a", "Caroline chose the agency, because it helps LGBTQ+ folks with adoption!"
        ),
        Neighbour("mem_b", "Melanie painted a sunrise over the lake last summer."),
    ]
    found = quality.resembled(
        text, neighbours, quality.DEFAULT_NEAR_DUPLICATE_THRESHOLD, partition=P
    )
    assert [record_id for record_id, _ in found] == ["mem_a"]


def test_band_keys_are_the_signature_cut_into_bands_and_equal_for_equal_normal_texts() -> None:
    text = "The billing service retries failed card charges three times, an hour apart."
    keys = quality.band_keys(text, partition=P)
    assert len(keys) == quality.BANDS == len(set(keys))
    assert all(-(2**63) <= key < 2**63 for key in keys)
    same_normal_text = text.upper().replace(",", " ;")
    assert quality.band_keys(same_normal_text, partition=P) == keys
    # A changed word changes the bands that hold its shingles' minima, not every band.
    changed = quality.band_keys(text.replace("three", "four"), partition=P)
    assert 0 < len(set(changed) & set(keys)) < quality.BANDS
    unrelated = quality.band_keys(
        "Invoices go out on the first working day of each month.", partition=P
    )
    assert not set(unrelated) & set(keys)
    assert quality.band_keys(" ,;! ", partition=P) == []


def test_a_remembered_signature_is_the_signature_and_the_memo_holds_no_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An admission signs one text up to three times (its neighbours, the comparison, the
    record's sketch): the signature is made once, and the memo keeps only keyed digests."""
    monkeypatch.setattr(quality, "_signatures", {})
    monkeypatch.setattr(quality, "_SIGNATURE_MEMO_ENTRIES", 3)
    signed = mock.Mock(wraps=quality._signed)
    monkeypatch.setattr(quality, "_signed", signed)
    text = "Melanie painted a lake at sunrise last summer, with her kids beside her"
    first = quality.band_keys(text, partition=P)
    assert quality.band_keys(text, partition=P) == first
    assert quality.band_keys(text + " ", partition=P) == first  # the same normal text
    assert quality.resembled(text, [Neighbour("mem_1", text)], 0.7, partition=P) == [("mem_1", 1.0)]
    made = [call.args[0] for call in signed.call_args_list]
    assert made == [text, text + " "]
    assert all(text.encode() not in digest for digest in quality._signatures)
    for index in range(5):
        quality.band_keys(f"another text entirely, number {index}", partition=P)
        assert len(quality._signatures) <= 3
    assert quality.band_keys(text, partition=P) == first  # made again after the memo started over
    assert [call.args[0] for call in signed.call_args_list].count(text) == 2


def test_a_signature_is_reused_within_a_scope_and_never_across_scopes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memo saves an admission its second and third signature of the same text; a
    signature made for one workspace is not reused for another, whose admission would then be
    faster for a text the first one holds (a timing that tells what another workspace has)."""
    text = "Melanie ran a charity race for mental health last Saturday."
    here, there = quality.memo_partition("t1", "w1"), quality.memo_partition("t1", "w2")
    monkeypatch.setattr(quality, "_signatures", {})
    with mock.patch.object(quality, "_signed", wraps=quality._signed) as signed:
        keys = quality.band_keys(text, partition=here)
        assert quality.band_keys(text, partition=here) == keys
        quality.resembled(text, [Neighbour("mem_a", text)], 0.7, partition=here)
        assert signed.call_count == 1  # one signature for the text, made once in its scope
        assert quality.band_keys(text, partition=there) == keys  # the same keys ...
        assert signed.call_count == 2  # ... from a signature made for that scope
        other_tenant = quality.memo_partition("t2", "w1")
        quality.band_keys(text, partition=other_tenant)
        assert signed.call_count == 3


def test_band_keys_are_made_once_with_the_signature_and_handed_out_as_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An admission asks for its text's band keys twice (its neighbours, its record's sketch),
    and the idle time may have asked first (``anticipate``): cut from the signature once."""
    monkeypatch.setattr(quality, "_signatures", {})
    cut = mock.Mock(wraps=quality._bands_of)
    monkeypatch.setattr(quality, "_bands_of", cut)
    text = "Caroline joined the adoption agency's info session on Friday."
    quality.band_keys(text, partition=P)  # the idle time's
    keys = quality.band_keys(text, partition=P)
    keys.append(0)  # the caller's own list
    assert quality.band_keys(text, partition=P) == keys[:-1]
    assert cut.call_count == 1
    assert len(keys) == quality.BANDS + 1
