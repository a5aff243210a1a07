"""The suite's time budget (tests/support/budget.py) fails a test that takes too long, unless a
``slow`` mark says why and how long it may take; the suite prints its slowest tests."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localcluster.cluster import REPO
from tests.support import budget

TESTS = textwrap.dedent(
    """
    import time
    import pytest

    @pytest.fixture
    def slow_fixture():
        time.sleep(0.6)
        yield

    def test_quick():
        pass

    def test_over():
        time.sleep(0.6)

    @pytest.mark.slow(reason="it sleeps on purpose", budget=5)
    def test_marked():
        time.sleep(0.6)

    def test_fails_and_is_slow():
        time.sleep(0.6)
        assert False, "its own failure"

    def test_slow_setup(slow_fixture):
        pass
    """
)


def run(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_budget_sample.py").write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.budget",
            "-o",
            "duration_budget=0.3",
            "-o",
            "fixture_budget=0.3",
            "-rA",
            "--durations=3",
            *args,
            str(tmp_path / "test_budget_sample.py"),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def outcomes(out: str) -> dict[str, str]:
    """test name -> PASSED, FAILED or ERROR, from the -rA summary."""
    found = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            found[rest.split("::", 1)[1].split()[0]] = word
    return found


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_test_over_its_budget_fails_unless_marked_slow(tmp_path: Path, workers: list[str]) -> None:
    """Also on pytest-xdist's workers, as `make test` runs."""
    res = run(tmp_path, TESTS, *workers)
    assert res.returncode == 1, res.stdout + res.stderr
    assert outcomes(res.stdout) == {
        "test_quick": "PASSED",
        "test_over": "FAILED",
        "test_marked": "PASSED",
        "test_fails_and_is_slow": "FAILED",
        "test_slow_setup": "ERROR",
    }, res.stdout
    assert re.search(
        r"test_over: its call took \d+\.\d s, over its budget of 0\.3 s \(the suite's budget\)", res.stdout
    )
    assert re.search(r"test_slow_setup: its setup took \d+\.\d s, over its budget of 0\.3 s", res.stdout)
    # A failing test keeps its own failure.
    assert "its own failure" in res.stdout
    assert "test_fails_and_is_slow: its call took" not in res.stdout
    # The slowest tests are printed.
    assert "slowest 3 durations" in res.stdout


def test_the_budget_can_be_switched_off(tmp_path: Path) -> None:
    res = run(tmp_path, TESTS, "--no-duration-budget", "-k", "not fails")
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(outcomes(res.stdout).values()) == {"PASSED"}, res.stdout


def test_pytest_timeout_does_not_stop_a_slow_test_before_its_budget(tmp_path: Path) -> None:
    """pytest-timeout's limit (here 0.6 s) is raised to 1.25 times a longer budget (2 s):
    the marked test passes, the unmarked one is still stopped by pytest-timeout."""
    source = textwrap.dedent(
        """
        import time
        import pytest

        @pytest.mark.slow(reason="it sleeps on purpose", budget=2)
        def test_marked():
            time.sleep(1)

        def test_hangs():
            time.sleep(1)
        """
    )
    res = run(tmp_path, source, "-o", "timeout=0.6", "-o", "duration_budget=1.5")
    assert outcomes(res.stdout) == {"test_marked": "PASSED", "test_hangs": "FAILED"}, res.stdout
    assert "Timeout (>0.6s) from pytest-timeout" in res.stdout, res.stdout


@pytest.mark.parametrize(
    ("mark", "error"),
    [
        ("@pytest.mark.slow(budget=5)", "needs a reason and a budget"),
        ('@pytest.mark.slow(reason="why")', "needs a reason and a budget"),
        ('@pytest.mark.slow(reason="why", budget=0.2)', "is within the suite's 0.3 s: drop the mark"),
    ],
)
def test_a_slow_mark_says_why_and_how_long(tmp_path: Path, mark: str, error: str) -> None:
    res = run(tmp_path, f"import pytest\n\n{mark}\ndef test_x():\n    pass\n")
    assert res.returncode != 0 and error in res.stdout + res.stderr, res.stdout + res.stderr


def test_the_suite_registers_the_budget() -> None:
    """tests/conftest.py loads the plugin, and pyproject.toml prints the 20 slowest tests."""
    from tests import conftest

    assert "tests.support.budget" in conftest.pytest_plugins
    assert "--durations=20" in (REPO / "pyproject.toml").read_text()
    assert budget.CALL_BUDGET == 120 and budget.FIXTURE_BUDGET >= budget.CALL_BUDGET
