"""A webhook delivery's signature, checked as its receiver must before trusting it."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

#: How far from now a delivery's signed time may be: one replayed later is refused.
WEBHOOK_TOLERANCE_S = 300


class WebhookSignatureError(ValueError):
    """The delivery was not signed with the secret, was altered, or is too old (or too far
    ahead) to trust."""


def verify_webhook(
    secret: str,
    signature: str,
    body: bytes,
    *,
    tolerance_s: int = WEBHOOK_TOLERANCE_S,
    now: float | None = None,
) -> Any:
    """Checks a delivery and answers the event it carries (``{"id", "type", "created_at",
    "tenant", "data"}``): ``signature`` is its ``Koder-Signature`` header (``t=<unix
    seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``), ``body`` the raw request body
    exactly as received (not re-encoded JSON), ``secret`` the one the webhook's creation
    answered. The HMAC is compared in constant time and ``t`` must be within ``tolerance_s``
    of ``now`` (the clock by default). Raises :class:`WebhookSignatureError`."""
    stamp = None
    signatures: list[str] = []
    for part in signature.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            stamp = value
        elif key == "v1":
            signatures.append(value)
    if stamp is None or not (stamp.isascii() and stamp.isdigit()) or not signatures:
        raise WebhookSignatureError(f"{signature!r} is not t=<seconds>,v1=<hex>")
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256)
    want = mac.hexdigest().encode()
    # Every candidate is compared (no early exit), each in constant time.
    if not [s for s in signatures if hmac.compare_digest(s.encode(), want)]:
        raise WebhookSignatureError("no signature matches the body under this secret")
    skew = (time.time() if now is None else now) - int(stamp)
    if abs(skew) > tolerance_s:
        raise WebhookSignatureError(f"signed {skew:.0f} s from now")
    return json.loads(body)
