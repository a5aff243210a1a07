"""How `make test` shares the suite among its pytest-xdist workers (tests/conftest.py): the
long units first, each named unit still existing (a renamed test would silently fall back to
its module's unit, and the suite would quietly take minutes longer)."""

from __future__ import annotations

import re

from localcluster.cluster import REPO
from tests.conftest import LONG_UNITS, OWN_UNITS, REAL_NODE_GROUP, unit_rank, work_unit


def test_every_long_unit_names_a_module_or_a_test_that_exists() -> None:
    for unit in LONG_UNITS:
        if unit == REAL_NODE_GROUP:
            continue
        path, _, test = unit.partition("::")
        text = (REPO / path).read_text()
        assert not test or re.search(rf"^def {re.escape(test)}\(", text, re.M), unit
    assert len(set(LONG_UNITS)) == len(LONG_UNITS)


def test_a_test_of_its_own_is_a_unit_and_its_module_s_others_share_one() -> None:
    own = sorted(OWN_UNITS)[0]
    module = own.split("::")[0]
    assert work_unit(own) == own
    assert work_unit(f"{module}::test_something_else") == module
    assert work_unit("tests/node/test_host.py::test_x") == REAL_NODE_GROUP
    assert work_unit("tests/integration/test_demo.py::test_demo[dra]") == REAL_NODE_GROUP


def test_long_units_come_first_longest_first_and_the_rest_keep_their_order() -> None:
    ids = [
        "tests/unit/test_a.py::test_1",
        "tests/integration/test_injection_policy.py::test_small",
        LONG_UNITS[2],
        "tests/node/test_host.py::test_x",
        "tests/unit/test_b.py::test_2",
        LONG_UNITS[1] + "::test_y",
    ]
    ordered = sorted(ids, key=unit_rank)
    assert ordered[:3] == ["tests/node/test_host.py::test_x", LONG_UNITS[1] + "::test_y", LONG_UNITS[2]]
    assert ordered[3:] == [ids[0], ids[1], ids[4]]
