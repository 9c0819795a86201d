"""The HMAC-SHA256 signature of webhook requests, both ways.

The signed bytes are the timestamp (whole seconds since the epoch, as sent), a dot, and the raw
body: ``f"{timestamp}.".encode() + body``. The headers are

    X-Hermes-Timestamp: 1767225600
    X-Hermes-Signature: sha256=<hex HMAC-SHA256 of the signed bytes with the shared secret>

A receiver recomputes the HMAC over the body as received (never a re-encoded copy), compares it
in constant time, and refuses a timestamp outside its replay window.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-Hermes-Timestamp"
SIGNATURE_HEADER = "X-Hermes-Signature"
DELIVERY_HEADER = "X-Hermes-Delivery"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Hermes-Signature`` value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The timestamp and signature headers for sending ``body`` now."""
    timestamp = str(int(time.time() if now is None else now))
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }


def verify(
    secret: str,
    timestamp: str | None,
    given: str | None,
    body: bytes,
    *,
    window_s: float,
    now: float | None = None,
) -> str | None:
    """Why a request is refused (``None`` when its signature is good and its timestamp inside
    the window)."""
    if not timestamp or not given:
        return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
    try:
        sent = int(timestamp)
    except ValueError:
        return f"{TIMESTAMP_HEADER} is not whole seconds since the epoch"
    if abs((time.time() if now is None else now) - sent) > window_s:
        return f"{TIMESTAMP_HEADER} is outside the replay window ({window_s:g} s)"
    # As bytes: compare_digest refuses a str that is not ASCII (a header may carry any byte).
    expected = signature(secret, timestamp, body).encode()
    if not hmac.compare_digest(expected, given.strip().encode("utf-8", "replace")):
        return "bad signature"
    return None
