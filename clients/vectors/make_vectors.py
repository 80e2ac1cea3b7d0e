#!/usr/bin/env python3
"""Writes clients/vectors/keys.json and rejections.json: the shared vectors every
client (Rust, Python, Java, Go, TypeScript) is tested against.

* keys.json: valid submissions and their idempotency keys, computed here
  independently with Python's hashlib, exactly as DESIGN §1's reference. Every
  entry must be accepted by the server and by each client's validation, and
  give this key.
* rejections.json: invalid requests (Submit, SubmitBatch, Lookup, Begin,
  Complete, Release) with the status code, the field and the exact message the
  server answers. The Rust tests check each against the server itself, over
  gRPC; each client's own validation must give the same code and message.

refused_chars.json (the code points an award id may not contain, by category,
from the server's Unicode tables) is written by the Rust test
`vectors::refused_chars_table_is_the_servers` with ONCEGATE_WRITE_VECTORS=1.

Encoding (see README.md): payloads are base64 (`payload_b64`), optionally
repeated `payload_repeat` times (large payloads); int64 values
(`amount_cents`) are decimal strings, so no JSON reader rounds them.

Run: python3 clients/vectors/make_vectors.py
"""
import base64
import hashlib
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1024 * 1024
TS = "2026-11-29T10:57:45Z"
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


def key(award_id: str, ts: str, payload: bytes) -> str:
    digest = hashlib.sha256(payload).hexdigest()
    return hashlib.sha256(f"{award_id}|{ts}|{digest}".encode()).hexdigest()


def payload_fields(unit: bytes, repeat: int = 1) -> dict:
    fields = {"payload_b64": base64.b64encode(unit).decode()}
    if repeat != 1:
        fields["payload_repeat"] = repeat
    return fields


# -- keys.json ----------------------------------------------------------------

# (name, award_id, timestamp, payload unit, repeat, amount, producer key)
EDGES = [
    ("empty payload", "A-1", "2026-01-01T00:00:00Z", b"", 1, 1, None),
    ("json payload", "AWD-2026-0001", "2026-11-29T10:57:45Z", b'{"amount_cents": 125000}', 1, 125000, None),
    ("same instant, +00:00 offset: another key (verbatim)", "AWD-2026-0001", "2026-11-29T10:57:45+00:00",
     b'{"amount_cents": 125000}', 1, 125000, None),
    ("same instant, .000 fraction: another key (verbatim)", "AWD-2026-0001", "2026-11-29T10:57:45.000Z",
     b'{"amount_cents": 125000}', 1, 125000, None),
    ("unicode award id, microseconds, negative offset", "Ünïcødé-授予-🎓", "2026-02-28T23:59:59.999999-05:00",
     "naïve café".encode(), 1, 5, None),
    ("128 characters, leap second, every byte value", "x" * 128, "1999-12-31T23:59:60Z", bytes(range(256)), 1, 7, None),
    ("128 four-byte characters (512 bytes)", "🎓" * 128, TS, b"p", 1, 1, None),
    ("128 CJK characters", "授" * 128, TS, b"p", 1, 1, None),
    ("NFC e-acute", "caf\u00e9", TS, b"p", 1, 1, None),
    ("NFD e + combining acute: another key (never normalised)", "cafe\u0301", TS, b"p", 1, 1, None),
    ("emoji with variation selector and skin tone", "AWD-\u263a\ufe0f-\U0001f44d\U0001f3fd", TS, b"p", 1, 1, None),
    ("interior spaces (ASCII, no-break, ideographic)", "AWD 2026\u00a0/\u3000é-1", TS, b"p", 1, 1, None),
    ("right-to-left letters (no bidi controls)", "منحة-2026", TS, b"p", 1, 1, None),
    ("a character of Unicode 15 (newer than some runtimes' tables)", "AWD-\U0001fae8", TS, b"p", 1, 1, None),
    ("a character of Unicode 16", "AWD-\U0001fae9", TS, b"p", 1, 1, None),
    ("punctuation and symbols", "AWD:2026/01#(a)[b]{c}<d>€$", TS, b"p", 1, 1, None),
    ("one character", "A", TS, b"p", 1, 1, None),
    ("payload exactly 1 MiB (the default limit)", "AWD-LARGE", TS, bytes(range(256)), MIB // 256, 1, None),
    ("payload of 64 KiB of zeros", "AWD-LARGE", TS, b"\x00", 65536, 1, None),
    ("payload not UTF-8", "AWD-BYTES", TS, b"\xff\xfe\x00\xc3\x28", 1, 1, None),
    ("lowercase t and z", "AWD-TS", "2026-11-29t10:57:45z", b"p", 1, 1, None),
    ("year 0000 (a leap year)", "AWD-TS", "0000-02-29T00:00:00Z", b"p", 1, 1, None),
    ("year 9999, last second", "AWD-TS", "9999-12-31T23:59:59Z", b"p", 1, 1, None),
    ("leap day of a 400-year", "AWD-TS", "2000-02-29T12:00:00Z", b"p", 1, 1, None),
    ("leap second in any hour's last minute", "AWD-TS", "2026-11-29T10:59:60+05:30", b"p", 1, 1, None),
    ("offset +23:59", "AWD-TS", "2026-11-29T10:57:45+23:59", b"p", 1, 1, None),
    ("offset -23:59", "AWD-TS", "2026-11-29T10:57:45-23:59", b"p", 1, 1, None),
    ("offset -00:00", "AWD-TS", "2026-11-29T10:57:45-00:00", b"p", 1, 1, None),
    ("nine fractional digits", "AWD-TS", "2026-11-29T10:57:45.123456789Z", b"p", 1, 1, None),
    ("timestamp of exactly 64 bytes", "AWD-TS", "2026-11-29T10:57:45." + "1" * 43 + "Z", b"p", 1, 1, None),
    ("amount_cents at the int64 maximum", "AWD-AMOUNT-MAX", TS, b"p", 1, I64_MAX, None),
    ("producer key: a UUID", "AWD-PK", TS, b"p", 1, 1, "6f1c2d3e-4b5a-4c6d-8e7f-0123456789ab"),
    ("producer key: 128 characters of every allowed kind", "AWD-PK", TS, b"p", 1, 1,
     ("Az09-_.:" * 16)),
    ("producer key: one character", "AWD-PK", TS, b"p", 1, 1, "k"),
]


def key_vectors() -> list[dict]:
    rng = random.Random(20261129)
    cases = list(EDGES)
    # Random cases (the first 60 keys of the earlier tests/vectors/keys.json).
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.é漢字🎓 "
    for i in range(60):
        award = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))).strip() or "A"
        ts = (f"20{rng.randint(10, 39)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
              f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
              + rng.choice(["Z", "+00:00", ".5Z", ".123456+02:00", "-07:30"]))
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
        cases.append((f"random {i}", award, ts, payload, 1, 1 + i, None))
    out = []
    for name, award, ts, unit, repeat, amount, producer_key in cases:
        payload = unit * repeat
        v = {"name": name, "award_id": award, "submission_timestamp": ts, **payload_fields(unit, repeat),
             "amount_cents": str(amount)}
        if producer_key is not None:
            v["idempotency_key"] = producer_key
        v["payload_sha256"] = hashlib.sha256(payload).hexdigest()
        v["derived_key"] = key(award, ts, payload)
        v["key"] = producer_key if producer_key is not None else v["derived_key"]
        out.append(v)
    return out


# -- rejections.json ------------------------------------------------------------

FORMAT = "submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)"
SEPARATOR = FORMAT + ": date and time must be separated by 'T'"
KEY_LENGTH = "idempotency_key must be 1 to 128 characters when set"
KEY_CHARS = "idempotency_key may contain only ASCII letters, digits and - _ . :"
NAMESPACE_CHARS = "namespace may contain only lowercase ASCII letters, digits and . _ -"
TOKEN = "lease_token is not a token Begin issued (at most 64 ASCII letters and digits)"
WHITE = "award_id must not begin or end with white space"


def printable(category: str, cp: int) -> str:
    return f"award_id must be printable, found {category} U+{cp:04X}"


def submission(award_id="AWD-1", ts=TS, unit=b"{}", repeat=1, amount=100, idempotency_key=None) -> dict:
    s = {"award_id": award_id, "submission_timestamp": ts, **payload_fields(unit, repeat), "amount_cents": str(amount)}
    if idempotency_key is not None:
        s["idempotency_key"] = idempotency_key
    return s


def submit(name, field, message, code="INVALID_ARGUMENT", **fields):
    return {"name": name, "rpc": "Submit", "request": submission(**fields), "code": code, "field": field,
            "message": message}


AWARD_ID = [
    ("empty", "", "award_id is required"),
    ("129 characters", "x" * 129, "award_id is 129 characters, at most 128 allowed"),
    ("129 four-byte characters", "🎓" * 129, "award_id is 129 characters, at most 128 allowed"),
    ("contains |", "AWD|1", "award_id must not contain '|'"),
    ("| is named before a control character", "AWD|\x07", "award_id must not contain '|'"),
    ("BEL", "AWD\x071", printable("control character", 0x07)),
    ("NUL", "AWD\x001", printable("control character", 0x00)),
    ("line feed", "AWD\n1", printable("control character", 0x0A)),
    ("trailing tab (control before white space)", "AWD-1\t", printable("control character", 0x09)),
    ("DEL", "AWD\x7f1", printable("control character", 0x7F)),
    ("NEL U+0085", "AWD\x851", printable("control character", 0x85)),
    ("zero-width space", "AWD\u200b1", printable("format character", 0x200B)),
    ("zero-width joiner in an emoji sequence", "AWD-\U0001f468\u200d\U0001f469", printable("format character", 0x200D)),
    ("right-to-left override", "AWD\u202e1", printable("format character", 0x202E)),
    ("leading byte order mark", "\ufeffAWD-1", printable("format character", 0xFEFF)),
    ("soft hyphen", "AWD\u00ad1", printable("format character", 0xAD)),
    ("Arabic letter mark", "AWD\u061c1", printable("format character", 0x61C)),
    ("tag character (plane 14)", "AWD\U000e00411", printable("format character", 0xE0041)),
    ("line separator", "AWD\u20281", printable("line or paragraph separator", 0x2028)),
    ("paragraph separator", "AWD\u20291", printable("line or paragraph separator", 0x2029)),
    ("private use (BMP)", "AWD\ue0001", printable("private-use character", 0xE000)),
    ("private use (plane 15)", "AWD\U000f00001", printable("private-use character", 0xF0000)),
    ("private use (plane 16, last)", "AWD\U0010fffd", printable("private-use character", 0x10FFFD)),
    ("unassigned U+0378", "AWD\u03781", printable("unassigned character", 0x378)),
    ("noncharacter U+FFFF", "AWD\uffff", printable("unassigned character", 0xFFFF)),
    ("noncharacter U+FDD0", "AWD\ufdd0", printable("unassigned character", 0xFDD0)),
    ("noncharacter U+10FFFF", "AWD\U0010ffff", printable("unassigned character", 0x10FFFF)),
    ("unassigned plane 3 tail U+3FFFD", "AWD\U0003fffd", printable("unassigned character", 0x3FFFD)),
    ("the first refused character is named", "AWD\u200b\x07", printable("format character", 0x200B)),
    ("leading space", " AWD-1", WHITE),
    ("trailing space", "AWD-1 ", WHITE),
    ("trailing no-break space", "AWD-1\u00a0", WHITE),
    ("leading ideographic space", "\u3000AWD-1", WHITE),
    ("trailing em space", "AWD-1\u2003", WHITE),
    ("leading ogham space mark", "\u1680AWD-1", WHITE),
    ("trailing narrow no-break space", "AWD-1\u202f", WHITE),
    ("only a space", " ", WHITE),
]

TIMESTAMP = [
    ("empty", "", "submission_timestamp is required"),
    ("65 bytes", "2026-11-29T10:57:45." + "1" * 44 + "Z", "submission_timestamp is longer than 64 bytes"),
    ("33 two-byte characters (66 bytes)", "é" * 33, "submission_timestamp is longer than 64 bytes"),
    ("trailing line feed", "2026-11-29T10:00:00Z\n", "submission_timestamp must not contain control characters, found U+000A"),
    ("NUL as separator (control named first)", "2026-11-29\x0010:00:00Z",
     "submission_timestamp must not contain control characters, found U+0000"),
    ("NEL", "2026-11-29T10:00:00\x85Z", "submission_timestamp must not contain control characters, found U+0085"),
    ("space as separator", "2026-11-29 10:00:00Z", SEPARATOR),
    ("x as separator", "2026-11-29x10:00:00Z", SEPARATOR),
    ("byte 10 inside a two-byte character", "2026-11-2é10:00:00Z", SEPARATOR),
    ("date only", "2026-11-29", FORMAT),
    ("date and T only", "2026-11-29T", FORMAT),
    ("words", "yesterday", FORMAT),
    ("not a leap year", "2025-02-29T10:00:00Z", FORMAT),
    ("century not a leap year", "1900-02-29T10:00:00Z", FORMAT),
    ("April 31", "2026-04-31T10:00:00Z", FORMAT),
    ("month 00", "2026-00-10T10:00:00Z", FORMAT),
    ("month 13", "2026-13-29T10:57:45Z", FORMAT),
    ("day 00", "2026-11-00T10:00:00Z", FORMAT),
    ("hour 24", "2026-11-29T24:00:00Z", FORMAT),
    ("minute 60", "2026-11-29T10:60:00Z", FORMAT),
    ("second 60 outside a minute's end", "2026-11-29T10:00:60Z", FORMAT),
    ("second 61", "2026-11-29T10:59:61Z", FORMAT),
    ("empty fraction", "2026-11-29T10:00:00.Z", FORMAT),
    ("offset without colon", "2026-11-29T10:00:00+2400", FORMAT),
    ("offset hour 24", "2026-11-29T10:00:00+24:00", FORMAT),
    ("offset minute 60", "2026-11-29T10:00:00+23:60", FORMAT),
    ("no offset", "2026-11-29T10:00:00", FORMAT),
    ("no seconds", "2026-11-29T10:00Z", FORMAT),
    ("trailing space", "2026-11-29T10:00:00Z ", FORMAT),
    ("Z and an offset", "2026-11-29T10:00:00Z+01:00", FORMAT),
    ("leading + (byte 10 is a digit)", "+2026-11-29T10:00:00Z", SEPARATOR),
    ("five-digit year (byte 10 is a digit)", "20260-11-29T10:00:00Z", SEPARATOR),
    ("full-width digit (three bytes: byte 10 is a digit)", "２026-11-29T10:00:00Z", SEPARATOR),
    ("full-width digit, T at byte 10", "２6-11-29T10:00:00Z", FORMAT),
    ("letter in the month", "2026-1a-29T10:00:00Z", FORMAT),
]

PRODUCER_KEY = [
    ("empty", "", KEY_LENGTH),
    ("129 characters", "k" * 129, KEY_LENGTH),
    ("65 two-byte characters (130 bytes: counted in bytes)", "é" * 65, KEY_LENGTH),
    ("64 two-byte characters (128 bytes)", "é" * 64, KEY_CHARS),
    ("space", "a b", KEY_CHARS),
    ("slash", "a/b", KEY_CHARS),
    ("Cyrillic", "ключ", KEY_CHARS),
    ("pipe", "a|b", KEY_CHARS),
]


def submit_rejections() -> list[dict]:
    out = [submit(f"award_id: {n}", "award_id", m, award_id=a) for n, a, m in AWARD_ID]
    out += [submit(f"submission_timestamp: {n}", "submission_timestamp", m, ts=t) for n, t, m in TIMESTAMP]
    out += [
        submit("amount_cents: 0", "amount_cents", "amount_cents must be greater than 0, got 0", amount=0),
        submit("amount_cents: -1", "amount_cents", "amount_cents must be greater than 0, got -1", amount=-1),
        submit("amount_cents: the int64 minimum", "amount_cents",
               f"amount_cents must be greater than 0, got {I64_MIN}", amount=I64_MIN),
    ]
    out.append(dict(submit("payload: one byte over the default limit", "payload",
                           f"payload is {MIB + 1} bytes, the limit is {MIB} bytes", code="RESOURCE_EXHAUSTED",
                           unit=b"\x00", repeat=MIB + 1), max_payload_bytes=MIB))
    out += [submit(f"idempotency_key: {n}", "idempotency_key", m, idempotency_key=k) for n, k, m in PRODUCER_KEY]
    # Several bad fields: the first in the server's order is named
    # (award_id, submission_timestamp, amount_cents, payload, idempotency_key).
    out += [
        submit("order: award_id before submission_timestamp", "award_id", "award_id is required",
               award_id="", ts="yesterday", amount=0, idempotency_key=""),
        submit("order: submission_timestamp before amount_cents", "submission_timestamp", FORMAT,
               ts="yesterday", amount=0, idempotency_key=""),
        submit("order: amount_cents before payload", "amount_cents", "amount_cents must be greater than 0, got 0",
               amount=0, unit=b"\x00", repeat=MIB + 1),
        dict(submit("order: payload before idempotency_key", "payload",
                    f"payload is {MIB + 1} bytes, the limit is {MIB} bytes", code="RESOURCE_EXHAUSTED",
                    unit=b"\x00", repeat=MIB + 1, idempotency_key=""), max_payload_bytes=MIB),
    ]
    return out


def other_rejections() -> list[dict]:
    def req(rpc, name, field, message, code="INVALID_ARGUMENT", **request):
        return {"name": name, "rpc": rpc, "request": request, "code": code, "field": field, "message": message}

    def begin(name, field, message, code="INVALID_ARGUMENT", namespace="payments", key="k-1", unit=b"{}", repeat=1,
              lease_ttl=None):
        r = {"namespace": namespace, "idempotency_key": key, **{
            ("request_b64" if k == "payload_b64" else "request_repeat"): v
            for k, v in payload_fields(unit, repeat).items()}}
        if lease_ttl is not None:
            r["lease_ttl"] = {"seconds": str(lease_ttl[0]), "nanos": lease_ttl[1]}
        return req("Begin", name, field, message, code, **r)

    token = "0123456789abcdef0123456789abcdef"

    def fenced(rpc, name, field, message, code="INVALID_ARGUMENT", namespace="payments", key="k-1",
               lease_token=token, **extra):
        return req(rpc, name, field, message, code, namespace=namespace, idempotency_key=key,
                   lease_token=lease_token, **extra)

    def complete(name, field, message, code="INVALID_ARGUMENT", unit=b"{}", repeat=1, **kw):
        resp = {("response_b64" if k == "payload_b64" else "response_repeat"): v
                for k, v in payload_fields(unit, repeat).items()}
        return fenced("Complete", name, field, message, code, **kw, **resp)

    def release(name, field, message, reason="provider refused", **kw):
        return fenced("Release", name, field, message, reason=reason, **kw)

    out = [
        req("Lookup", "idempotency_key: empty", "idempotency_key", KEY_LENGTH, idempotency_key=""),
        req("Lookup", "idempotency_key: 129 characters", "idempotency_key", KEY_LENGTH, idempotency_key="0" * 129),
        req("Lookup", "idempotency_key: slash", "idempotency_key", KEY_CHARS, idempotency_key="a/b"),
        req("Lookup", "idempotency_key: 64 two-byte characters", "idempotency_key", KEY_CHARS,
            idempotency_key="é" * 64),
        {"name": "1001 items, one over the default limit", "rpc": "SubmitBatch",
         "request": {"submission": submission(), "count": 1001}, "code": "RESOURCE_EXHAUSTED",
         "field": "submissions", "message": "submissions has 1001 items, at most 1000 allowed",
         "max_batch_items": 1000},
        begin("namespace: empty", "namespace", "namespace is required", namespace=""),
        begin("namespace: 65 characters", "namespace", "namespace is 65 characters, at most 64 allowed",
              namespace="a" * 65),
        # Measured in bytes, reported in characters (as the server does).
        begin("namespace: 33 two-byte characters (66 bytes)", "namespace",
              "namespace is 33 characters, at most 64 allowed", namespace="é" * 33),
        begin("namespace: uppercase", "namespace", NAMESPACE_CHARS, namespace="Payments"),
        begin("namespace: slash", "namespace", NAMESPACE_CHARS, namespace="pay/ments"),
        begin("namespace: 32 two-byte characters", "namespace", NAMESPACE_CHARS, namespace="é" * 32),
        begin("idempotency_key: empty (required)", "idempotency_key", "idempotency_key is required", key=""),
        begin("idempotency_key: 129 characters", "idempotency_key", KEY_LENGTH, key="k" * 129),
        begin("idempotency_key: space", "idempotency_key", KEY_CHARS, key="a b"),
        begin("request: one byte over 1 MiB", "request", f"request is {MIB + 1} bytes, the limit is {MIB} bytes",
              code="RESOURCE_EXHAUSTED", unit=b"\x00", repeat=MIB + 1),
        begin("lease_ttl: zero", "lease_ttl", "lease_ttl must be greater than 0", lease_ttl=(0, 0)),
        begin("lease_ttl: negative seconds", "lease_ttl", "lease_ttl must be greater than 0", lease_ttl=(-1, 0)),
        begin("lease_ttl: negative nanos", "lease_ttl", "lease_ttl must be greater than 0", lease_ttl=(1, -1)),
        begin("lease_ttl: 15 min 1 s", "lease_ttl", "lease_ttl is 15m 1s, at most 15m allowed", lease_ttl=(901, 0)),
        begin("lease_ttl: 15 min 1 ns", "lease_ttl", "lease_ttl is 15m 1ns, at most 15m allowed",
              lease_ttl=(900, 1)),
        begin("lease_ttl: nanos over a second are clamped", "lease_ttl",
              "lease_ttl is 15m 999ms 999us 999ns, at most 15m allowed", lease_ttl=(900, 1_500_000_000)),
        begin("lease_ttl: 1 h 2 min 3.004005006 s", "lease_ttl",
              "lease_ttl is 1h 2m 3s 4ms 5us 6ns, at most 15m allowed", lease_ttl=(3723, 4_005_006)),
        begin("lease_ttl: 2 days", "lease_ttl", "lease_ttl is 2days, at most 15m allowed", lease_ttl=(172800, 0)),
        begin("lease_ttl: 400 days (humantime's 30.44-day months, 365.25-day years)", "lease_ttl",
              "lease_ttl is 1year 1month 4days 7h 26m 24s, at most 15m allowed", lease_ttl=(34560000, 0)),
        begin("order: namespace before idempotency_key", "namespace", "namespace is required", namespace="", key=""),
        begin("order: request size before lease_ttl", "request",
              f"request is {MIB + 1} bytes, the limit is {MIB} bytes", code="RESOURCE_EXHAUSTED",
              unit=b"\x00", repeat=MIB + 1, lease_ttl=(0, 0)),
        complete("response: one byte over 1 MiB", "response",
                 f"response is {MIB + 1} bytes, the limit is {MIB} bytes", code="RESOURCE_EXHAUSTED",
                 unit=b"\x00", repeat=MIB + 1),
        complete("order: response size before namespace", "response",
                 f"response is {MIB + 1} bytes, the limit is {MIB} bytes", code="RESOURCE_EXHAUSTED",
                 unit=b"\x00", repeat=MIB + 1, namespace=""),
        complete("namespace: empty", "namespace", "namespace is required", namespace=""),
        complete("idempotency_key: empty", "idempotency_key", "idempotency_key is required", key=""),
        complete("lease_token: empty", "lease_token", "lease_token is required", lease_token=""),
        complete("lease_token: a dash", "lease_token", TOKEN, lease_token="0123-4567"),
        complete("lease_token: 65 characters", "lease_token", TOKEN, lease_token="a" * 65),
        complete("lease_token: non-ASCII letters", "lease_token", TOKEN, lease_token="tökén"),
        release("reason: 257 characters", "reason", "reason is longer than 256 characters", reason="r" * 257),
        release("reason: 257 two-byte characters", "reason", "reason is longer than 256 characters",
                reason="é" * 257),
        release("reason: a line feed", "reason", "reason must not contain control characters", reason="a\nb"),
        release("reason: DEL", "reason", "reason must not contain control characters", reason="a\x7fb"),
        release("order: reason before namespace", "reason", "reason must not contain control characters",
                reason="a\tb", namespace=""),
        release("namespace: uppercase", "namespace", NAMESPACE_CHARS, namespace="Pay"),
        release("lease_token: empty", "lease_token", "lease_token is required", lease_token=""),
    ]
    return out


ABOUT_KEYS = ("Valid submissions and their keys (DESIGN §1): key = sha256(award_id|submission_timestamp|"
              "sha256(payload) hex) hex, or idempotency_key when set. payload = base64 payload_b64 repeated "
              "payload_repeat times (default 1); amount_cents is an int64 as a decimal string. Every entry is "
              "accepted by the server and by each client's validation. Written by make_vectors.py.")
ABOUT_REJECTIONS = ("Requests the server refuses: gRPC status code name, the field, the exact message. "
                    "request fields as in keys.json (request_b64/response_b64 and _repeat for effect bodies; "
                    "lease_ttl seconds as a decimal string). max_payload_bytes / max_batch_items: the server "
                    "limit the vector assumes (the defaults). Written by make_vectors.py.")


def write(name: str, doc: dict) -> None:
    path = os.path.join(HERE, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    write("keys.json", {"about": ABOUT_KEYS, "keys": key_vectors()})
    write("rejections.json", {"about": ABOUT_REJECTIONS, "rejections": submit_rejections() + other_rejections()})
