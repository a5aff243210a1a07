"""docs/dev-interfaces.md shows every setting the code reads, and nothing else (one table per component).

The tables are generated: ``python tools/settings_doc.py --write`` rewrites them.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.tools import load_tool

DOC = Path(__file__).resolve().parents[3] / "docs" / "dev-interfaces.md"
SECTION = re.compile(r"<!-- settings: (?P<name>[^>]+?) -->\n(?P<body>.*?)<!-- /settings -->", re.S)


def test_every_settings_table_in_the_doc_is_the_codes() -> None:
    found = {m["name"]: m["body"].strip() for m in SECTION.finditer(DOC.read_text())}
    want = load_tool("settings_doc").tables()
    assert set(found) == set(want), "a component's settings section is missing from the doc"
    for name, table in want.items():
        assert found[name] == table, f"{name}: run `python tools/settings_doc.py --write`"


def test_every_variable_of_the_code_is_in_the_doc_and_back() -> None:
    text = DOC.read_text()
    documented = {
        name for m in SECTION.finditer(text) for name in re.findall(r"^\| `([A-Z_]+)` \|", m["body"], re.M)
    }
    from kube_gpu_scheduler.check import settings as check_settings
    from kube_gpu_scheduler.scheduler.runtime import settings as scheduler_settings
    from kube_gpu_scheduler.webhook import settings as webhook_settings

    code = {
        s.env for t in (scheduler_settings.TABLE, webhook_settings.TABLE, check_settings.TABLE) for s in t
    }
    assert documented == code
