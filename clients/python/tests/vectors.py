"""The shared vectors under clients/vectors/ (keys.json, rejections.json), as
Submission objects and requests for the Python client's tests."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from conftest import REPO
from oncegate import Submission

VECTORS = REPO / "clients" / "vectors"


def _body(doc: dict[str, Any], field: str) -> bytes:
    return base64.b64decode(doc.get(f"{field}_b64", "")) * doc.get(f"{field}_repeat", 1)


def submission_of(doc: dict[str, Any]) -> Submission:
    return Submission(
        award_id=doc["award_id"],
        submission_timestamp=doc["submission_timestamp"],
        payload=_body(doc, "payload"),
        amount_cents=int(doc["amount_cents"]),
        idempotency_key=doc.get("idempotency_key"),
    )


@dataclass(frozen=True)
class KeyVector:
    doc: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.doc[name]
        except KeyError:
            raise AttributeError(name) from None

    def payload(self) -> bytes:
        return _body(self.doc, "payload")

    def submission(self) -> Submission:
        return submission_of(self.doc)


def key_vectors() -> list[KeyVector]:
    return [KeyVector(v) for v in json.loads((VECTORS / "keys.json").read_text("utf-8"))["keys"]]


def rejections() -> list[dict[str, Any]]:
    return json.loads((VECTORS / "rejections.json").read_text("utf-8"))["rejections"]


def request_body(doc: dict[str, Any], field: str) -> bytes:
    return _body(doc, field)
