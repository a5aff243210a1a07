"""How `make test` shares the suite among its pytest-xdist workers (tests/conftest.py): the
long units first, each named test still existing (a renamed test would silently fall back to
its module's unit, and the suite would quietly take minutes longer or run the injection
policy's heaviest tests side by side)."""

from __future__ import annotations

import re

from localcluster.cluster import REPO
from tests.conftest import AT_SCALE, GROUPS, LONG_UNITS, REAL_NODE_GROUP, unit_rank, work_unit


def test_every_long_unit_and_grouped_test_exists() -> None:
    for nodeid in GROUPS:
        path, _, test = nodeid.partition("::")
        assert re.search(rf"^def {re.escape(test)}\(", (REPO / path).read_text(), re.M), nodeid
    for unit in LONG_UNITS:
        assert unit in (REAL_NODE_GROUP, *GROUPS.values()) or (REPO / unit).is_file(), unit
    assert len(set(LONG_UNITS)) == len(LONG_UNITS)


def test_a_group_is_one_unit_and_its_module_s_others_share_another() -> None:
    first = next(iter(GROUPS))
    module = first.split("::")[0]
    assert {work_unit(n) for n in GROUPS} == {AT_SCALE}
    assert work_unit(f"{module}::test_something_else") == module
    assert work_unit("tests/node/test_host.py::test_x") == REAL_NODE_GROUP
    assert work_unit("tests/integration/test_demo.py::test_demo[dra]") == REAL_NODE_GROUP


def test_long_units_come_first_the_alone_one_then_longest_first_and_the_rest_keep_their_order() -> None:
    grouped = list(GROUPS)
    ids = [
        "tests/unit/test_a.py::test_1",
        "tests/integration/test_injection_policy.py::test_small",
        grouped[1],
        "tests/node/test_host.py::test_x",
        "tests/unit/test_b.py::test_2",
        grouped[0],
        LONG_UNITS[2] + "::test_y",
    ]
    ordered = sorted(ids, key=unit_rank)
    # The at-scale group (it runs alone) first, then the real node's, then the others.
    assert ordered[:4] == [
        grouped[1],
        grouped[0],
        "tests/node/test_host.py::test_x",
        LONG_UNITS[2] + "::test_y",
    ]
    assert ordered[4:] == [ids[0], ids[1], ids[4]]
