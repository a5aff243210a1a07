"""tests/support/charts.py remembers helm template's results for the run: a changed chart file,
values file or value renders anew; the same inputs are not rendered twice."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import charts
from tests.support.charts import SCHEDULER_CHART, render, template


def test_a_changed_chart_or_values_file_renders_anew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(SCHEDULER_CHART, chart)
    values = tmp_path / "values.yaml"
    values.write_text("scheduler:\n  logLevel: INFO\n")
    calls: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if args[1:2] == ["template"]:  # helm template (not the tool lookup's own commands)
            calls.append(args)
        return real_run(args, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(charts.subprocess, "run", counting_run)

    def rendered() -> str:
        return "\n".join(str(d) for d in render(chart, [values], {"scheduler": {"name": "memo"}}))

    first = rendered()
    assert rendered() == first and len(calls) == 1, "the same inputs rendered twice"
    # A template edited in place: rendered anew, with the edit.
    notes = chart / "templates" / "serviceaccount.yaml"
    notes.write_text(
        notes.read_text() + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: memo-edit\n"
    )
    assert "memo-edit" in rendered() and len(calls) == 2
    # A values file changed in place, then a value given: each rendered anew.
    values.write_text("scheduler:\n  logLevel: DEBUG\n")
    assert "DEBUG" in rendered() and len(calls) == 3
    assert "other" in "\n".join(str(d) for d in render(chart, [values], {"scheduler": {"name": "other"}}))
    assert len(calls) == 4
    # helm's failure is remembered as it came: the caller still sees it.
    broken = template(chart, values={"injection": {"mode": "no-such-mode"}})
    again = template(chart, values={"injection": {"mode": "no-such-mode"}})
    assert broken.returncode != 0 and again is broken and len(calls) == 5
