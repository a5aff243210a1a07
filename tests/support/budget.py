"""The suite's time budget: a pytest plugin (registered by tests/conftest.py) that fails a test
whose run takes longer than its budget, so the suite cannot silently grow back (issue 29).

* A test's call may take :data:`CALL_BUDGET` seconds (ini ``duration_budget``); its setup
  and teardown (fixtures, a control plane started for a module) :data:`FIXTURE_BUDGET`
  (ini ``fixture_budget``), each.
* A test that needs longer says why, and how long it may take::

      @pytest.mark.slow(reason="the real node stopped and started again", budget=120)

  Its ``budget`` (seconds) replaces both; a ``slow`` mark without a ``reason`` or with a
  budget under the default is an error.
* pytest-timeout's limit (``timeout`` in pyproject.toml, for hangs) is raised to 1.25 times the
  budget of a test whose budget is longer, so that its budget is what stops it.
* ``--no-duration-budget`` reports nothing (a debugging run under a profiler, a loaded machine).

A test over its budget fails with the time it took and the budget it had; the report of a test
that already failed is left as it was. The suite's slowest tests are printed at the end of each
run (``--durations=20`` in pyproject.toml's addopts).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

CALL_BUDGET = 120.0
FIXTURE_BUDGET = 300.0
MARK = "slow"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "duration_budget", "seconds a test's call may take without a slow mark", default=str(CALL_BUDGET)
    )
    parser.addini(
        "fixture_budget",
        "seconds a test's setup or teardown may take without a slow mark",
        default=str(FIXTURE_BUDGET),
    )
    parser.addoption(
        "--no-duration-budget",
        action="store_true",
        default=False,
        help="do not fail tests that take longer than their budget (tests/support/budget.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(reason, budget): the test may take up to `budget` seconds (its call, and its setup "
        "and teardown each) instead of the suite's budget; `reason` says why (tests/support/budget.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        call, fixtures, _ = budgets(item)  # a malformed mark fails the run before any test runs
        # pytest-timeout (ini ``timeout``, for hangs) must not stop a slow test before its budget
        # does: a test given 900 s is stopped at 1.25 times that, not at 600 s.
        limit = max(call, fixtures) * 1.25
        timeout = float(item.config.getini("timeout") or 0)
        marked = item.get_closest_marker(MARK) is not None
        if marked and timeout and limit > timeout and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))


def budgets(item: pytest.Item) -> tuple[float, float, str]:
    """(call budget, setup/teardown budget, why) of ``item``."""
    call = float(item.config.getini("duration_budget"))
    fixtures = float(item.config.getini("fixture_budget"))
    mark = item.get_closest_marker(MARK)
    if mark is None:
        return call, fixtures, "the suite's budget"
    reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
    budget = mark.kwargs.get("budget", mark.args[1] if len(mark.args) > 1 else None)
    if not reason or budget is None:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK} needs a reason and a budget (seconds)")
    if float(budget) <= call:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.{MARK}(budget={budget}) is within the suite's {call:g} s: drop the mark"
        )
    return float(budget), max(float(budget), fixtures), f"@pytest.mark.{MARK}: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if item.config.getoption("no_duration_budget") or not report.passed:
        return
    call_budget, fixture_budget, why = budgets(item)
    budget = call_budget if report.when == "call" else fixture_budget
    if report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: its {report.when} took {report.duration:.1f} s, over its budget of "
            f"{budget:g} s ({why}). Make it faster, or mark it "
            f'@pytest.mark.{MARK}(reason="why it needs longer", budget=SECONDS) (tests/support/budget.py)'
        )
