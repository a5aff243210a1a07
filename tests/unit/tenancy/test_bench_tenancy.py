"""The tenancy phase of the bench waits for its CRD the way the apiserver reports it."""

from __future__ import annotations

import pytest

from bench.tenancy import established


@pytest.mark.parametrize(
    ("crd", "expected"),
    [
        # just created: the establishing controller has not run yet (CI saw this: a TypeError)
        ({"status": {"conditions": None, "acceptedNames": {"kind": ""}}}, False),
        ({"status": None}, False),
        ({}, False),
        ({"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}}, False),
        ({"status": {"conditions": [{"type": "Established", "status": "False"}]}}, False),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True"},
                        {"type": "Established", "status": "True"},
                    ]
                }
            },
            True,
        ),
    ],
)
def test_a_crd_is_established_only_when_its_condition_says_so(crd: dict, expected: bool) -> None:
    assert established(crd) is expected
