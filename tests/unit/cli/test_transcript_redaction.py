"""What `inspect`'s transcript shows of a tool call's arguments and result: secrets replaced,
whether by their name or by their shape, everything else kept, and long values cut."""

from __future__ import annotations

import json

from liyagent.transcript import REDACTED, SUMMARY_CHARS, redact, summary


def test_secrets_are_replaced_by_name_and_by_shape() -> None:
    args = {
        "api_key": "abc",
        "apiKey": "abc",
        "X-Auth-Token": "abc",
        "client_secret": "abc",
        "headers": {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="},
        "items": [{"password": "hunter2"}, "Bearer eyJhbGciOi.eyJzdWIiOiIx.c2lnbmF0dXJl"],
        "note": "use sk-proj-0123456789abcdef for the call",
        "aws": "AKIAABCDEFGHIJKLMNOP",
        "github": "ghp_0123456789abcdefghij",
        "ticket": "T-1",
        "idem_key": "lya-0268a02b638eba",
        "monkey": "kept",
        "max_tokens": 256,
    }
    shown = redact(args)
    text = json.dumps(shown)
    for secret in ("abc", "hunter2", "dXNlcjpw", "sk-proj", "AKIAABCD", "ghp_0123", "eyJhbGci"):
        assert secret not in text, secret
    assert shown["api_key"] == shown["apiKey"] == shown["X-Auth-Token"] == REDACTED
    assert shown["headers"] == {"Authorization": REDACTED}
    assert shown["note"] == f"use {REDACTED} for the call"
    # Not secrets: ids, keys of idempotency, counts and words that merely contain "key".
    assert shown["ticket"] == "T-1" and shown["idem_key"] == "lya-0268a02b638eba"
    assert shown["monkey"] == "kept" and shown["max_tokens"] == 256


def test_a_summary_is_one_line_cut_to_its_length() -> None:
    short = summary({"b": 1, "a": "x"})
    assert short == '{"a": "x", "b": 1}'
    long = summary({"text": "word " * 200, "token": "t0ps3cret"})
    assert len(long) == SUMMARY_CHARS and long.endswith("…") and "t0ps3cret" not in long
    assert "\n" not in summary({"text": "two\nlines"})
