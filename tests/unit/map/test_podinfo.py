"""A pod's ordinal and its entry in the map."""

from __future__ import annotations

import pytest

from kube_gpu_scheduler.domain.podinfo import POD_INDEX_LABEL, entry_for, map_text, ordinal_of, pod_map
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, Entry, MapError


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        ("w-0", None, 0),
        ("w-12", {}, 12),
        ("my-app-2-7", {}, 7),
        ("w-3", {POD_INDEX_LABEL: "5"}, 5),  # the label wins over the name
        ("no-ordinal", {POD_INDEX_LABEL: "4"}, 4),
        ("no-ordinal", {}, None),
        ("w-", {}, None),
        ("w3", {}, None),
        (None, None, None),
        ("", {}, None),
        ("w-007", {}, 7),
        # A label that is not a number is ignored: the name decides.
        ("w-2", {POD_INDEX_LABEL: "x"}, 2),
        ("w-2", {POD_INDEX_LABEL: ""}, 2),
        ("w-2", {POD_INDEX_LABEL: "-1"}, 2),
    ],
)
def test_ordinal_of(name: str | None, labels: dict[str, str] | None, expected: int | None) -> None:
    assert ordinal_of(name, labels) == expected


@pytest.mark.parametrize("digit", ["٣", "²", "\uff13", "߃", "३"])
def test_unicode_digits_are_not_ordinals(digit: str) -> None:
    assert ordinal_of(f"w-{digit}", {}) is None
    assert ordinal_of("no-ordinal", {POD_INDEX_LABEL: digit}) is None
    assert ordinal_of("w-1", {POD_INDEX_LABEL: digit}) == 1


def test_trailing_newline_is_not_an_ordinal() -> None:
    assert ordinal_of("w-3\n", {}) is None
    assert ordinal_of("x", {POD_INDEX_LABEL: "4\n"}) is None


def test_absurdly_long_numbers_are_not_ordinals() -> None:
    assert ordinal_of("w-" + "1" * 5000, {}) is None
    assert ordinal_of("x", {POD_INDEX_LABEL: "1" * 5000}) is None


def test_label_value_of_wrong_type_is_ignored() -> None:
    assert ordinal_of("w-1", {POD_INDEX_LABEL: 3}) == 1  # type: ignore[dict-item]


def meta(name: str, text: str | None, labels: dict[str, str] | None = None) -> dict[str, object]:
    out: dict[str, object] = {"name": name, "namespace": "ns"}
    if text is not None:
        out["annotations"] = {ANNOTATION: text, "other": "x"}
    if labels is not None:
        out["labels"] = labels
    return out


def test_map_text() -> None:
    assert map_text(meta("w-0", "0=a:0")) == "0=a:0"
    assert map_text(meta("w-0", None)) is None
    assert map_text(None) is None
    assert map_text({"annotations": None}) is None
    assert map_text({"annotations": {ANNOTATION: 5}}) is None


def test_pod_map() -> None:
    smap = pod_map(meta("w-0", "0=a:0\n1=b:1"))
    assert smap is not None and list(smap) == [0, 1]
    assert pod_map(meta("w-0", None)) is None
    with pytest.raises(MapError):
        pod_map(meta("w-0", "nonsense"))


def test_entry_for() -> None:
    text = "0=a:0\n1=b:1,2"
    assert entry_for(meta("w-1", text)) == (1, Entry(1, "b", (1, 2)))
    assert entry_for(meta("w-0", text, {POD_INDEX_LABEL: "1"})) == (1, Entry(1, "b", (1, 2)))
    assert entry_for(meta("w-5", text)) == (5, None)
    assert entry_for(meta("w-1", None)) == (1, None)
    assert entry_for(meta("nope", text)) == (None, None)
    # The admission request's name wins over metadata.name (generateName pods).
    assert entry_for({"generateName": "w-", "annotations": {ANNOTATION: text}}, name="w-0") == (
        0,
        Entry(0, "a", (0,)),
    )
    with pytest.raises(MapError):
        entry_for(meta("w-0", "0=a"))
