"""§9 through the engine: obfuscated secrets are rejected at admission and never echoed.

The gate de-obfuscates (joins, normalizes, decodes) to find a secret; neither the text as
captured nor the de-obfuscated secret may reach the envelope, the audit trail, the store or logs.
"""

from __future__ import annotations

import base64
import logging

import pytest

from engram_testing import Harness

KEY = "AKIA" + "QZ7RT4MX2PLK9WNB"
TOKEN = "gh" + "p_" + "Zq4" * 12
PASSWORD = "Kestrel" + "24!gEx"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"deploy key {chr(0x200B).join(KEY)} for staging", KEY),
        (base64.b64encode(f"token {TOKEN} for CI".encode()).decode(), TOKEN),
        (f"the staging key is {' '.join(KEY)}", KEY),
        ("my gmail " + "pass" + f"word is {PASSWORD}", PASSWORD),
    ],
    ids=["zero-width key", "base64 token", "spaced key", "password in prose"],
)
def test_an_obfuscated_secret_is_rejected_without_echoing_it(
    harness: Harness, caplog: pytest.LogCaptureFixture, text: str, secret: str
) -> None:
    caplog.set_level(logging.DEBUG)
    envelope = harness.admission(text, "admit-key-000031")
    assert envelope["output"]["value"]["outcome"]["status"] == "rejected"
    surfaces = [
        repr(envelope),
        repr(harness.audit.events),
        repr(harness.store.table_snapshot()),
        caplog.text,
    ]
    for shown in (secret, text):
        assert all(shown not in surface for surface in surfaces)
