"""The README stays a front door, and the charts' values have one table.

- README.md has a line budget: what does not fit moves to docs/ (or, for dated measurements,
  to CHANGELOG.md).
- Its first code block, before any section, is the two commands that do all set-up: the demo
  and the whole test suite; .ci/run runs exactly that test command.
- Only the generated chart READMEs (tools/chart_readme.py, `make chart-docs`) tabulate the
  charts' values: a markdown table in README.md, docs/ or argocd/ whose rows start with values
  keys restates them, and drifts (docs/charts.md once did, in 45 places).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


def _repo() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    raise RuntimeError(f"no pyproject.toml above {here}")


REPO = _repo()
README = REPO / "README.md"
README_BUDGET = 300  # lines
CHARTS = ("gpu-scheduler-chart", "gpu-scheduler-check-chart")
CODE_SPAN = re.compile(r"`([^`]+)`")


def test_the_readme_keeps_to_its_budget() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_BUDGET, (
        f"README.md has {len(lines)} lines, over its budget of {README_BUDGET}: it is the front door. "
        "Move details to docs/ (configuration: docs/charts.md, operations: docs/operate.md, the test "
        "suite: docs/testing.md) and dated measurements to CHANGELOG.md (the current figures: "
        "bench/story.md, copied into docs/benchmarks.md)"
    )


def _first_block(text: str) -> tuple[str, str]:
    """(the text before the first code block, that block's body)."""
    m = re.search(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    assert m, "README.md has no code block"
    return text[: m.start()], m.group(1)


def _commands(block: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readme_opens_with_the_two_set_up_commands_and_ci_runs_its_test_command() -> None:
    before, block = _first_block(README.read_text())
    assert "\n## " not in before, "README.md's first code block must come before its first section"
    commands = _commands(block)
    assert commands == ["make demo", "make test"], (
        f"README.md's first code block should be the demo and the whole test suite, found {commands}"
    )
    ci = _commands((REPO / ".ci" / "run").read_text())
    runs = [c for c in ci if not c.startswith(("set ", "cd "))]
    assert runs == [commands[1]], (
        f".ci/run must run exactly the README's test command {commands[1]!r}, runs {runs}"
    )


def _keys(node: Any, prefix: str = "") -> set[str]:
    """Every dotted path of a values tree: `scheduler`, `scheduler.name`, ..."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= _keys(v, path)
    return out


def values_keys() -> set[str]:
    keys: set[str] = set()
    for chart in CHARTS:
        keys |= _keys(yaml.safe_load((REPO / chart / "values.yaml").read_text()))
    return keys


def _tables(text: str) -> list[list[tuple[int, str]]]:
    """The markdown tables of a text outside code blocks: lists of (line number, line)."""
    tables: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.lstrip().startswith("|"):
            current.append((number, line))
            continue
        if current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def values_rows(text: str, keys: set[str]) -> list[tuple[int, str]]:
    """The rows of every table that restates values: two or more rows whose first cell starts
    with a values key in backticks (`| `image.tag` | ... |`), dotted (`image.tag`), or any key
    under a header that names a key or a default (`| key | default | description |`)."""
    found: list[tuple[int, str]] = []
    for table in _tables(text):
        header = table[0][1].lower()
        tabulates_values = bool(re.search(r"\b(key|default|setting|value)s?\b", header))
        rows = []
        for number, line in table[1:]:
            first = line.strip().strip("|").split("|", 1)[0].strip()
            m = CODE_SPAN.match(first)
            if m and m.group(1) in keys and ("." in m.group(1) or tabulates_values):
                rows.append((number, m.group(1)))
        if len(rows) >= 2:
            found += rows
    return found


def _docs() -> list[Path]:
    return [README, REPO / "argocd" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_no_doc_restates_the_values_table() -> None:
    keys = values_keys()
    assert {"scheduler.name", "injection.mode", "check.expectNoGPU"} <= keys
    restated = {
        str(doc.relative_to(REPO)): rows for doc in _docs() if (rows := values_rows(doc.read_text(), keys))
    }
    assert not restated, (
        "only the charts' generated READMEs (make chart-docs) tabulate values; link to them "
        "(gpu-scheduler-chart/README.md#values) and improve a row through its values.yaml comment. "
        "Tables restating values: "
        + "; ".join(
            f"{doc}: " + ", ".join(f"line {n} `{key}`" for n, key in rows) for doc, rows in restated.items()
        )
    )


def test_the_detector_finds_a_restated_table_and_spares_others() -> None:
    keys = values_keys()
    restating = '| key | default | description |\n|---|---|---|\n| `image.tag` | `""` | x |\n| `replicaCount` | `1` | y |\n'
    assert [key for _, key in values_rows(restating, keys)] == ["image.tag", "replicaCount"]
    one_mention = "| your cluster | set |\n|---|---|\n| `dra.enabled=true` | DRA |\n| `replicaCount` | z |\n"
    assert values_rows(one_mention, keys) == []
    # A key in the header and field names that happen to be top-level keys are not a values table.
    modes = "| `injection.mode` | injects |\n|---|---|\n| `webhook` | a |\n| `schedulerName` | b |\n"
    assert values_rows(modes, keys) == []
    settings = "| setting | default | what it does |\n|---|---|---|\n| `replicaCount` | 1 | a |\n| `tolerations` | [] | b |\n"
    assert [key for _, key in values_rows(settings, keys)] == ["replicaCount", "tolerations"]
    fenced = "```\n| `image.tag` | a |\n| `replicaCount` | b |\n```\n"
    assert values_rows(fenced, keys) == []
    # The generated tables are what it finds, so the chart READMEs are left out on purpose.
    generated = (REPO / "gpu-scheduler-chart" / "README.md").read_text()
    assert len(values_rows(generated, keys)) > 50
