"""Chart values: every one documented in helm/oncegate/README.md, and the
renamed ones still honoured.

Every chart value is documented in helm/oncegate/README.md (the helm-docs
convention: one table of values, `key` | default | description), and the
table names no value the chart does not have.

A value documented by its parent (`resources` for `resources.requests.cpu`)
counts: a map a user sets as a whole is described as one.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
from typing import Any, Iterator

import yaml

CHART = pathlib.Path(__file__).resolve().parents[1] / "oncegate"


def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Each value's dotted path; an empty map or a list is a value."""
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from leaves(value, path)
        else:
            yield path


def documented() -> list[str]:
    """The first column of the README's table of values."""
    text = (CHART / "README.md").read_text()
    _, _, table = text.partition("\n## Values\n")
    assert table, "helm/oncegate/README.md has no '## Values' section"
    return re.findall(r"^\| `([^`]+)` \|", table, re.M)


def test_every_value_is_documented_in_the_charts_readme() -> None:
    keys = set(documented())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:n]) in keys for n in range(1, len(parts) + 1))

    missing = [p for p in leaves(values) if not covered(p)]
    assert not missing, f"values.yaml values not in helm/oncegate/README.md's table: {missing}"


def test_the_readme_documents_no_value_the_chart_lacks() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = list(leaves(values))
    stale = [k for k in documented() if k not in paths and not any(p.startswith(k + ".") for p in paths)]
    assert not stale, f"helm/oncegate/README.md documents values the chart does not have: {stale}"


# --------------------------------------------------------------------------
# renamed values (templates/_deprecated.tpl)


def renamed_values() -> dict[str, str]:
    """The chart's table of renamed values, `old.path: new.path`."""
    text = (CHART / "templates" / "_deprecated.tpl").read_text()
    body = text.split('{{- define "oncegate.renamedValues" -}}', 1)[1].split("{{- end -}}", 1)[0]
    return yaml.safe_load(body) or {}


def schema_entry(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    for key in path.split("."):
        schema = (schema.get("properties") or {}).get(key)
        if schema is None:
            return None
    return schema


def test_every_renamed_value_is_still_accepted_and_names_its_successor() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = set(documented())
    for old, new in renamed_values().items():
        entry = schema_entry(schema, old)
        assert entry is not None, f"values.schema.json must still accept {old} (renamed to {new})"
        assert entry.get("deprecated") is True and new in entry.get("description", ""), entry
        assert schema_entry(schema, new) is not None, f"{old}'s successor {new} is not a value"
        assert old in keys, f"helm/oncegate/README.md must still list {old}, naming {new}"


def test_a_value_given_under_its_old_name_is_honoured_with_a_warning(tmp_path: pathlib.Path) -> None:
    """The mechanism, on a copy of the chart with one rename in its table:
    `logFormat` as if it had been renamed from `oldLogFormat`."""
    import helm_python as helm

    chart = tmp_path / "oncegate"
    shutil.copytree(CHART, chart)
    tpl = chart / "templates" / "_deprecated.tpl"
    tpl.write_text(
        tpl.read_text().replace(
            '{{- define "oncegate.renamedValues" -}}\n',
            '{{- define "oncegate.renamedValues" -}}\noldLogFormat: logFormat\n',
        )
    )
    schema_path = chart / "values.schema.json"
    schema = json.loads(schema_path.read_text())
    schema["properties"]["oldLogFormat"] = {
        "type": "string",
        "deprecated": True,
        "description": "renamed to logFormat",
    }
    schema_path.write_text(json.dumps(schema))
    loaded = helm.Chart.load(chart)

    rendered = loaded.render({"oldLogFormat": "text"}, name="rel", namespace="ns", is_install=True)
    notes = "".join(v for k, v in rendered.items() if k.endswith("NOTES.txt"))
    assert "the value oldLogFormat is deprecated: it was used as logFormat" in notes, notes
    sidecar = "".join(v for k, v in rendered.items() if k.endswith("deployment.yaml"))
    assert "ONCEGATE_LOG_FORMAT\n" in sidecar and '"text"' in sidecar.split("ONCEGATE_LOG_FORMAT", 1)[1][:40]

    plain = loaded.render({}, name="rel", namespace="ns", is_install=True)
    plain_notes = "".join(v for k, v in plain.items() if k.endswith("NOTES.txt"))
    assert "deprecated" not in plain_notes, "no warning when only the new name is used"
    plain_sidecar = "".join(v for k, v in plain.items() if k.endswith("deployment.yaml"))
    assert '"json"' in plain_sidecar.split("ONCEGATE_LOG_FORMAT", 1)[1][:40], "the default is json"
