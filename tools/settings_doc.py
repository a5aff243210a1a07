"""The settings sections of docs/dev-interfaces.md, generated from the components' tables.

``python tools/settings_doc.py`` prints them; ``python tools/settings_doc.py --write``
rewrites the doc. ``tests/unit/house/test_settings_doc.py`` fails when the doc and the
code differ. This lives outside the library because it imports every component's
settings: :mod:`kube_gpu_scheduler.base.config` (the mechanism) imports none of its users.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kube_gpu_scheduler.base.config import markdown_table
from kube_gpu_scheduler.check import settings as check_settings
from kube_gpu_scheduler.scheduler.runtime import settings as scheduler_settings
from kube_gpu_scheduler.webhook import settings as webhook_settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "dev-interfaces.md"


def tables() -> dict[str, str]:
    """Every component's settings table, by the heading it stands under in docs/dev-interfaces.md."""
    return {
        "Scheduler settings": markdown_table(
            scheduler_settings.TABLE, scheduler_settings.Settings, flags=True
        ),
        "Webhook settings": markdown_table(webhook_settings.TABLE, webhook_settings.Settings),
        "Check settings": markdown_table(check_settings.TABLE, check_settings.Settings),
    }


def write_doc(path: Path = DOC) -> None:
    """Replace each ``<!-- settings: NAME -->`` section of ``path`` with the generated table."""
    text = path.read_text()
    for heading, table in tables().items():
        start = f"<!-- settings: {heading} -->\n"
        head, sep, rest = text.partition(start)
        if not sep:
            raise KeyError(f"{path} has no section {start.strip()}")
        text = head + start + table + "\n" + rest[rest.index("<!-- /settings -->") :]
    path.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_doc()
    else:
        for heading, table in tables().items():
            print(f"## {heading}\n\n{table}\n")
