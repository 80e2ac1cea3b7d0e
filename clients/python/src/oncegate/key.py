"""The idempotency key: DESIGN.md §1, byte-for-byte.

    payload_digest = sha256(payload).hexdigest()
    key = sha256(f"{award_id}|{submission_timestamp}|{payload_digest}".encode()).hexdigest()

64 lowercase hex characters. ``submission_timestamp`` is used verbatim, never
normalised. Never derive a key from broker offsets or delivery ids.
"""

from __future__ import annotations

import hashlib

Payload = bytes | bytearray | memoryview | str


def payload_bytes(payload: Payload) -> bytes:
    """The bytes that are hashed and sent; ``str`` is encoded as UTF-8."""
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    raise TypeError(f"payload must be bytes or str, not {type(payload).__name__}")


def derive_idempotency_key(award_id: str, submission_timestamp: str, payload: Payload) -> str:
    """The key the sidecar derives for a submission without an explicit key."""
    if not isinstance(award_id, str):
        raise TypeError(f"award_id must be str, not {type(award_id).__name__}")
    if not isinstance(submission_timestamp, str):
        raise TypeError(
            f"submission_timestamp must be str, not {type(submission_timestamp).__name__}"
        )
    payload_digest = hashlib.sha256(payload_bytes(payload)).hexdigest()
    material = f"{award_id}|{submission_timestamp}|{payload_digest}".encode("utf-8")
    return hashlib.sha256(material).hexdigest()
