"""Tests marked ``alone`` (tests/support/alone.py) run while no other pytest-xdist worker runs a
test: a real run on three workers, each test noting when it started and ended."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from localcluster.cluster import REPO

PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.alone")
# Each test appends (name, start, end) to the file named by $ALONE_TIMES.
NOTE = textwrap.dedent(
    """
    import json, os, time

    def note(name, seconds):
        start = time.time()
        time.sleep(seconds)
        with open(os.environ["ALONE_TIMES"], "a") as out:
            out.write(json.dumps([name, start, time.time()]) + "\\n")
    """
)
OTHERS = textwrap.dedent(
    """
    from note import note

    def test_a(): note(__name__ + ".a", 0.4)
    def test_b(): note(__name__ + ".b", 0.4)
    def test_c(): note(__name__ + ".c", 0.4)
    """
)
ALONE = textwrap.dedent(
    """
    import pytest
    from note import note

    def test_before(): note("alone.before", 0.2)

    @pytest.mark.alone(reason="it must not share the machine")
    def test_first(): note("alone.first", 0.5)

    @pytest.mark.alone(reason="it must not share the machine")
    def test_second(): note("alone.second", 0.5)
    """
)


def test_alone_tests_never_overlap_another_workers_test(tmp_path: Path) -> None:
    (tmp_path / "note.py").write_text(NOTE)
    for i in range(4):
        (tmp_path / f"test_others{i}.py").write_text(OTHERS)
    (tmp_path / "test_alone_sample.py").write_text(ALONE)
    times = tmp_path / "times.jsonl"
    res = subprocess.run(
        [*PYTEST, "-n", "3", "--dist", "loadscope", "-q", str(tmp_path)],
        check=False,
        cwd=REPO,
        env={**_env(), "ALONE_TIMES": str(times), "PYTHONPATH": f"{tmp_path}:{REPO}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    runs = {name: (start, end) for name, start, end in map(json.loads, times.read_text().splitlines())}
    assert len(runs) == 15, sorted(runs)
    first, second = runs["alone.first"][0], runs["alone.second"][1]
    # The two alone tests hold the machine from the first's start to the second's end.
    overlapping = [
        name for name, (s, e) in runs.items() if not name.startswith("alone.") and s < second and e > first
    ]
    assert not overlapping, f"ran beside the alone tests ({first:.2f}-{second:.2f}): {overlapping}"
    # The others did run in parallel with each other: the lock is not a global one.
    others = sorted((s, e) for name, (s, e) in runs.items() if not name.startswith("alone."))
    assert any(b[0] < a[1] for a, b in itertools.pairwise(others)), "no two tests ever ran at once"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
