#!/usr/bin/env python3
"""Writes tests/vectors/keys.json: idempotency keys computed independently by
Python's hashlib, exactly as DESIGN §1's reference. The Rust tests check that
oncegate derives the same keys. Run: python3 tests/vectors/make_key_vectors.py"""
import base64
import hashlib
import json
import os
import random

rng = random.Random(20261129)


def key(award_id: str, ts: str, payload: bytes) -> str:
    digest = hashlib.sha256(payload).hexdigest()
    return hashlib.sha256(f"{award_id}|{ts}|{digest}".encode()).hexdigest()


cases = [
    ("A-1", "2026-01-01T00:00:00Z", b""),
    ("AWD-2026-0001", "2026-11-29T10:57:45Z", b'{"amount_cents": 125000}'),
    ("AWD-2026-0001", "2026-11-29T10:57:45+00:00", b'{"amount_cents": 125000}'),
    ("AWD-2026-0001", "2026-11-29T10:57:45.000Z", b'{"amount_cents": 125000}'),
    ("Ünïcødé-授予-🎓", "2026-02-28T23:59:59.999999-05:00", "naïve café".encode()),
    ("x" * 128, "1999-12-31T23:59:60Z", bytes(range(256))),
]
alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.é漢字🎓 "
for _ in range(60):
    award = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))).strip() or "A"
    ts = f"20{rng.randint(10, 39)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}" + rng.choice(["Z", "+00:00", ".5Z", ".123456+02:00", "-07:30"])
    payload = os.urandom(0) + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
    cases.append((award, ts, payload))

vectors = [
    {"award_id": a, "submission_timestamp": t, "payload_b64": base64.b64encode(p).decode(), "key": key(a, t, p)}
    for a, t, p in cases
]
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keys.json")
with open(path, "w", encoding="utf-8") as f:
    json.dump(vectors, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"wrote {len(vectors)} vectors to {path}")
