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

    def note(name, seconds, after=None):
        deadline = time.time() + 30
        while after and not any(after in line for line in open(os.environ["ALONE_TIMES"] + ".started")):
            if time.time() > deadline:
                break
            time.sleep(0.05)  # until the test named `after` has started (at most 30 s)
        start = time.time()
        with open(os.environ["ALONE_TIMES"] + ".started", "a") as out:
            out.write(name + "\\n")
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
BESIDE = textwrap.dedent(
    """
    import pytest
    from note import note

    @pytest.mark.beside_alone(reason="the longest chain")
    def test_x(): note("beside.x", 0.3, after="alone.first")
    @pytest.mark.beside_alone(reason="the longest chain")
    def test_y(): note("beside.y", 0.3)
    @pytest.mark.beside_alone(reason="the longest chain")
    def test_z(): note("beside.z", 0.3)
    @pytest.mark.beside_alone(reason="the longest chain")
    def test_w(): note("beside.w", 0.3)
    """
)
ALONE = textwrap.dedent(
    """
    import pytest
    from note import note

    def test_before(): note("alone.before", 0.2)

    @pytest.mark.alone(reason="it must not share the machine")
    def test_first(): note("alone.first", 1.0)

    @pytest.mark.alone(reason="it must not share the machine")
    def test_second(): note("alone.second", 0.5)
    """
)


def test_alone_tests_never_overlap_another_workers_test(tmp_path: Path) -> None:
    (tmp_path / "note.py").write_text(NOTE)
    for i in range(4):
        (tmp_path / f"test_others{i}.py").write_text(OTHERS)
    (tmp_path / "test_alone_sample.py").write_text(ALONE)
    (tmp_path / "test_beside_sample.py").write_text(BESIDE)
    times = tmp_path / "times.jsonl"
    (tmp_path / "times.jsonl.started").write_text("")
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
    assert len(runs) == 19, sorted(runs)
    first, second = runs["alone.first"][0], runs["alone.second"][1]
    during = {name for name, (s, e) in runs.items() if s < second and e > first}
    # The two alone tests hold the machine from the first's start to the second's end, but for
    # the tests marked beside_alone.
    overlapping = sorted(n for n in during if not n.startswith(("alone.", "beside.")))
    assert not overlapping, f"ran beside the alone tests ({first:.2f}-{second:.2f}): {overlapping}"
    # A beside_alone test started while the alone one held the room (it waited for it to start).
    assert "beside.x" in during, (runs["beside.x"], first, second)
    # The others did run in parallel with each other: the lock is not a global one.
    others = sorted((s, e) for name, (s, e) in runs.items() if name.startswith("test_"))
    assert any(b[0] < a[1] for a, b in itertools.pairwise(others)), "no two tests ever ran at once"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
