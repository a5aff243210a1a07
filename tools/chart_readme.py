#!/usr/bin/env python3
"""The values table of each chart's README, generated from its values.yaml and values.schema.json.

    tools/chart_readme.py            # rewrite the table in gpu-scheduler-chart/README.md and
                                     # gpu-scheduler-check-chart/README.md (make chart-docs)
    tools/chart_readme.py --check    # exit 1 when a README's table is not what it would write

A row per key documented in values.yaml with a ``# --`` comment (helm-docs' convention, as the
cert-manager, prometheus-community and argo-helm charts write them): the key's path, its type
from the schema, its default from values.yaml and the comment. The table sits between the
markers ``<!-- values:start -->`` and ``<!-- values:end -->``; the rest of the README is prose.
The chart unit tests (test_chart_release.py) keep the tables in step and every value documented.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHARTS = ("gpu-scheduler-chart", "gpu-scheduler-check-chart")
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def documented(values_text: str) -> list[tuple[str, str]]:
    """(dotted path, description) of every key preceded by a ``# --`` comment, in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] | None = None
    for raw in values_text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if comment is not None:
                comment.append(stripped[1:].strip())
            continue
        m = KEY.match(raw)
        if not m:
            if not stripped:
                comment = None
            continue
        indent = len(m.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group("key")))
        if comment is not None:
            out.append((".".join(k for _, k in stack), " ".join(comment).strip()))
            comment = None
    return out


def lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def schema_type(schema: dict[str, Any], path: str) -> str:
    node: dict[str, Any] = schema
    for part in path.split("."):
        node = (node.get("properties") or {}).get(part) or {}
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in node["enum"])
    kinds = node.get("type")
    if isinstance(kinds, list):
        return " \\| ".join(kinds)
    if kinds:
        return str(kinds)
    alternatives = node.get("oneOf") or node.get("anyOf") or []
    found = [str(a.get("type")) for a in alternatives if a.get("type")]
    return " \\| ".join(found) if found else ""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def default(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return f"`{cell(text)}`" if len(text) <= 80 else "see values.yaml"


def table(chart: Path) -> str:
    values_text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    schema = json.loads((chart / "values.schema.json").read_text())
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for path, text in documented(values_text):
        rows.append(
            f"| `{path}` | {schema_type(schema, path)} | {default(lookup(values, path))} | {cell(text)} |"
        )
    return "\n".join(rows) + "\n"


def readme_with_table(readme_text: str, new_table: str) -> str:
    if START not in readme_text or END not in readme_text:
        raise ValueError(f"the README has no {START} ... {END} markers")
    head, rest = readme_text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{new_table}{END}{tail}"


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: tools/chart_readme.py [--check]", file=sys.stderr)
        return 2
    stale = []
    for name in CHARTS:
        readme = REPO / name / "README.md"
        text = readme.read_text()
        new = readme_with_table(text, table(REPO / name))
        if new != text:
            stale.append(str(readme.relative_to(REPO)))
            if not check:
                readme.write_text(new)
    if check and stale:
        print(f"chart-readme: out of date: {', '.join(stale)} (run make chart-docs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
