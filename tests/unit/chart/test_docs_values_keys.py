"""Docs that cannot drift: every values key the README and docs/ name exists in a chart's
values.schema.json (issue 41).

What counts as a values key: each key of `--set`, `--set-string` and `--set-file` (always), and a
backquoted dotted path (`prometheusRule.enabled`, `webhook.caBundle=...`) whose first part is a
top-level key of either chart, or, with an unknown first part, whose rest is a path of two parts
or more of a chart (`metrics.prometheusRule.enabled`: a key under a wrong parent). A key is
known when either chart's schema has it (maps and free-form objects take any key below them)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support.charts import CHARTS, REPO

DOCS = [REPO / "README.md", REPO / "argocd" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SET_FLAG = re.compile(r"--set(?:-string|-file)?[ =]+(['\"]?)(\S+?)\1(?=[\s`)]|$)")
BACKQUOTED = re.compile(r"`([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)+)(?:=[^`]*)?`")
# Backquoted dotted words that look like values keys and are not: file names, and these.
FILE_SUFFIXES = {"py", "yaml", "yml", "md", "json", "sock", "txt", "sh", "toml", "go", "tpl", "tgz"}
OBJECT_FIELDS = {"spec", "status", "metadata", "template", "data"}  # a Kubernetes object's, not values
NOT_VALUES = {
    "resources.claims": "a container's field (docs/dra.md)",
    "sharing.warning": "a module, kube_gpu_scheduler.domain.sharing",
}


def schemas() -> list[dict[str, Any]]:
    return [json.loads((chart / "values.schema.json").read_text()) for chart in CHARTS]


def split_key(key: str) -> list[str]:
    """A --set key's parts: split on unescaped dots, `[N]` list indexes dropped."""
    parts = re.split(r"(?<!\\)\.", key)
    return [re.sub(r"\[\d+\]", "", p).replace("\\.", ".") for p in parts if p]


def resolves(node: Mapping[str, Any], parts: list[str]) -> bool:
    if not parts:
        return True
    for alt in [*node.get("oneOf", []), *node.get("anyOf", [])]:
        if resolves(alt, parts):
            return True
    if node.get("type") == "array" or "items" in node:
        return resolves(node.get("items") or {}, parts)
    props = node.get("properties") or {}
    if parts[0] in props:
        return resolves(props[parts[0]], parts[1:])
    extra = node.get("additionalProperties", True)
    if isinstance(extra, dict):
        return resolves(extra, parts[1:])
    # A free-form object (affinity, podAnnotations: no properties of its own) takes any key.
    return not props and extra is not False and node.get("type") in ("object", None) and "enum" not in node


def known(parts: list[str], charts: Iterable[Mapping[str, Any]]) -> bool:
    return any(resolves(s, parts) for s in charts)


def keys_in(text: str, charts: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(line, key) of every values key the text names."""
    tops = {k for s in charts for k in s["properties"]}
    found: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in SET_FLAG.finditer(line):
            for assignment in re.split(r",(?![^{]*\})", m.group(2)):
                key = re.split(r"(?<!\\)=", assignment, maxsplit=1)[0]
                if key:
                    found.append((n, key))
        for m in BACKQUOTED.finditer(line):
            parts = m.group(1).split(".")
            if parts[-1] in FILE_SUFFIXES or parts[0] in OBJECT_FIELDS or m.group(1) in NOT_VALUES:
                continue
            if parts[0] in tops or (len(parts) > 2 and known(parts[1:], charts) and parts[1] in tops):
                found.append((n, m.group(1)))
    return found


def problems(paths: Iterable[Path], charts: list[dict[str, Any]]) -> list[str]:
    out = []
    for path in paths:
        for n, key in keys_in(path.read_text(), charts):
            if not known(split_key(key), charts):
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                out.append(f"{where}:{n}: `{key}` is not a value of either chart (values.schema.json)")
    return sorted(set(out))


def test_every_documented_values_key_exists() -> None:
    assert problems(DOCS, schemas()) == []


def test_the_check_finds_a_wrong_key_and_names_file_line_and_key(tmp_path: Path) -> None:
    doc = tmp_path / "operate.md"
    doc.write_text(
        "Alerts:\n"
        "helm upgrade gs ./gpu-scheduler-chart --set prometheusRule.enabled=true\n"
        "- `metrics.prometheusRule.enabled`: the old name\n"
        "  --set 'webhook.enabeld=true,replicaCount=2' and `webhook.caBundle=...` and `spec.nodeSelector`\n"
        "  --set nodeSelector.kubernetes\\.io/os=null --set 'tolerations[0].key=x' `affinity.nodeAffinity`\n"
    )
    assert problems([doc], schemas()) == [
        f"{doc}:3: `metrics.prometheusRule.enabled` is not a value of either chart (values.schema.json)",
        f"{doc}:4: `webhook.enabeld` is not a value of either chart (values.schema.json)",
    ]
