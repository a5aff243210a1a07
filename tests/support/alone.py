"""Tests that need the machine to themselves: a pytest plugin (registered by tests/conftest.py).

Under pytest-xdist (``make test``) the workers share the machine's cores, each with a control
plane of its own. A test whose outcome depends on how much CPU its apiserver gets says so::

    @pytest.mark.alone(reason="a 256 KiB map's admission against the create handler's 34 s deadline")

and runs (its setup, call and teardown) while no other worker runs a test but those marked
``beside_alone`` (the real node's chain, which sets the suite's wall time and leaves the
apiserver most of a core): the others finish the test they are in and wait before their next
one. Waiting is outside a test's phases, so it
counts against neither its budget (tests/support/budget.py) nor pytest-timeout's limit.

Why: the injection policy's at-scale tests keep their apiserver's CPU busy for minutes. Beside
two other workers on 2 cores a 256 KiB map's StatefulSet took longer than the apiserver's fixed
34 s create deadline (a 504), and the 10,000 generated maps took over 600 s where they take
about 150 s alone (CI at stop 36).

The lock is two ``flock`` files in the run's shared temporary directory: every test holds the
*room* shared; a test marked ``alone`` holds it exclusively. Tests enter through the *gate*,
which the ``alone`` test holds while it waits for the room to empty, so that tests starting
meanwhile cannot keep it waiting for ever. Consecutive ``alone`` tests on one worker hold the
room from the first to the last. Without xdist there is nothing to wait for. Each ``alone``
test's wait and time are appended to ``alone.log`` there.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Generator
from contextlib import ExitStack
from pathlib import Path

import pytest

MARK = "alone"
BESIDE = "beside_alone"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(reason): the test runs while no other pytest-xdist worker runs one; `reason` says why "
        "(tests/support/alone.py)",
    )
    config.addinivalue_line(
        "markers",
        f"{BESIDE}(reason): the test never waits for one marked {MARK}; `reason` says why (tests/support/alone.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in (MARK, BESIDE):
            mark = item.get_closest_marker(name)
            if mark is not None and not (mark.kwargs.get("reason") or mark.args):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs a reason")


def shared_dir(config: pytest.Config) -> Path | None:
    """The directory every worker of this run shares (the parent of each worker's basetemp), or
    None outside pytest-xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]


def enter(shared: Path, alone: bool) -> tuple[ExitStack, float]:
    """Hold the room (exclusively when ``alone``) until the returned stack is closed; also the
    seconds spent waiting for it."""
    started = time.monotonic()
    stack = ExitStack()
    gate = stack.enter_context((shared / "alone.gate").open("a"))
    room = stack.enter_context((shared / "alone.room").open("a"))
    if alone:
        fcntl.flock(gate, fcntl.LOCK_EX)  # tests starting from now on wait at the gate
        fcntl.flock(room, fcntl.LOCK_EX)  # until those in the room have finished
    else:
        fcntl.flock(gate, fcntl.LOCK_SH)
        fcntl.flock(room, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
    return stack, time.monotonic() - started  # closing the files releases the locks


# The room held by this worker's run of consecutive ``alone`` tests (a group of them, such as
# the injection policy's at-scale tests, is not interrupted by the other workers' tests).
HELD = pytest.StashKey[ExitStack]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    shared = shared_dir(item.config)
    if shared is None or item.get_closest_marker(BESIDE) is not None:
        yield
        return
    alone = item.get_closest_marker(MARK) is not None
    if not alone:
        stack, _ = enter(shared, alone=False)
        with stack:
            yield
        return
    waited = 0.0
    if HELD not in item.config.stash:
        item.config.stash[HELD], waited = enter(shared, alone=True)
    started = time.monotonic()
    try:
        yield
    finally:
        if nextitem is None or nextitem.get_closest_marker(MARK) is None:
            item.config.stash[HELD].close()
            del item.config.stash[HELD]
        with (shared / "alone.log").open("a") as log:  # what being alone cost, for whoever tunes the suite
            log.write(
                f"{item.nodeid}: waited {waited:.1f} s for the room, then ran {time.monotonic() - started:.1f} s\n"
            )
