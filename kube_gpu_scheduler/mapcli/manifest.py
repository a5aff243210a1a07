"""Find ``gpu-scheduling-map`` annotations in Kubernetes YAML, with their line numbers.

Works on PyYAML's node graph (``compose_all``) rather than on loaded objects so
that every value keeps its position in the file: a problem on line 3 of a
literal-block annotation that starts on line 40 of ``helm template`` output is
reported as line 43 of the file. The annotation's value is handed to
:func:`kube_gpu_scheduler.domain.schedmap.parse` unchanged; nothing here parses the map.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kube_gpu_scheduler.domain.resources import gpu_requesting_containers, requests_gpu
from kube_gpu_scheduler.domain.rules import (
    FOLDED_MAP,
    MISSPELT_ANNOTATION,
    NO_ORDINALS,
    Finding,
    emits,
    gpu_resource_requested,
    map_not_on_template,
    node_name_on_pod,
    other_scheduler,
    pod_template_findings,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION

_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_MANIFEST_HINT = re.compile(r"^[ \t]*(?:-[ \t]+)?(?:apiVersion|kind)[ \t]*:", re.MULTILINE)
DEFAULT_SCHEDULER_NAME = "gpu-scheduler"
# libyaml when PyYAML was built with it: ~80x faster on a large `helm template` output.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ManifestError(Exception):
    """The input is not YAML; ``line``/``column`` are 1-based when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.message = message
        self.line = line
        self.column = column
        super().__init__(message)


@dataclass(frozen=True)
class Note:
    """A warning about a document, with the file line it concerns (1-based) when known."""

    message: str
    file_line: int | None = None
    reason: str = ""  # the rule's reason (kube_gpu_scheduler.domain.rules)


@dataclass
class FoundMap:
    """One annotation found in a document."""

    document: int  # 1-based position among the YAML documents
    kind: str | None
    namespace: str | None
    name: str | None
    path: str  # where the annotation sits, e.g. spec.template.metadata.annotations
    text: str | None  # None when the value is not a string (then ``value_error`` says why)
    value_error: str | None
    key_line: int  # file line of the annotation's key (1-based)
    replicas: int | None = None
    ordinal_start: int = 0
    pod_labels: dict[str, str] | None = None  # for kind Pod: its labels (the ordinal may come from them)
    notes: list[Note] = field(default_factory=list)
    _style: str | None = None
    _start0: int = 0
    _end0: int = 0

    @property
    def label(self) -> str:
        """``StatefulSet default/w``; ``StatefulSet w`` without a namespace; ``document 3`` without a kind."""
        if not self.kind and not self.name:
            return f"document {self.document}"
        who = f"{self.namespace}/{self.name}" if self.namespace else (self.name or "(unnamed)")
        return f"{self.kind or 'object'} {who}"

    def file_line(self, map_line: int) -> int | None:
        """The file line of line ``map_line`` (1-based) of the annotation's text, when it can be known.

        Known for literal block scalars (``|``, ``|-``, ``|2``), whose lines are the
        text's lines, and for scalars written on a single line of the file.
        Folded (``>``) and multi-line quoted scalars rearrange lines: unknown.
        """
        if map_line < 1:
            return None
        if self._style == "|":
            return self._start0 + 1 + map_line
        if self._start0 == self._end0:
            return self._start0 + 1
        return None


def looks_like_manifest(text: str) -> bool:
    """True when the text has an ``apiVersion:`` or ``kind:`` key: a raw map never does."""
    return bool(_MANIFEST_HINT.search(text))


def _get(node: Node | None, key: str) -> Node | None:
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and k.value == key:
                return v
    return None


def _path(node: Node | None, *keys: str) -> Node | None:
    for key in keys:
        node = _get(node, key)
    return node


def _str(node: Node | None) -> str | None:
    if isinstance(node, ScalarNode) and node.tag == _STR_TAG:
        return str(node.value)
    return None


def _int(node: Node | None) -> int | None:
    if isinstance(node, ScalarNode) and node.tag == _INT_TAG and re.fullmatch(r"[0-9]{1,9}", node.value):
        return int(node.value)
    return None


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _string_map(node: Node | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode):
                out[str(k.value)] = str(v.value)
    return out


def _annotation(annotations: Node | None) -> tuple[Node, Node] | None:
    if isinstance(annotations, MappingNode):
        for k, v in annotations.value:
            if isinstance(k, ScalarNode) and k.value == ANNOTATION:
                return k, v
    return None


@emits(MISSPELT_ANNOTATION)
def _misspelt(annotations: Node | None) -> list[Note]:
    notes: list[Note] = []
    if isinstance(annotations, MappingNode):
        for k, _ in annotations.value:
            if not isinstance(k, ScalarNode) or k.value == ANNOTATION:
                continue
            key = str(k.value)
            bare = key.rsplit("/", 1)[-1]
            if difflib.get_close_matches(bare, [ANNOTATION], n=1, cutoff=0.8):
                notes.append(
                    Note(
                        f"annotation {key!r} looks like a misspelling of {ANNOTATION!r}",
                        _line(k),
                        MISSPELT_ANNOTATION,
                    )
                )
    return notes


def _plain(node: Node | None) -> Any:
    """A YAML node as plain data (scalars stay strings; null is None), for the rules."""
    if isinstance(node, MappingNode):
        return {str(k.value): _plain(v) for k, v in node.value if isinstance(k, ScalarNode)}
    if isinstance(node, SequenceNode):
        return [_plain(v) for v in node.value]
    if isinstance(node, ScalarNode) and node.tag != "tag:yaml.org,2002:null":
        return str(node.value)
    return None


def _pod_spec_notes(spec: Node | None, where: str, scheduler_name: str, pod: bool = False) -> list[Note]:
    """The rules' findings on a pod spec (``pod``: a Pod's own, else a template's), at their lines."""
    if spec is None:
        return []
    plain = _plain(spec)
    if not isinstance(plain, dict):
        return []
    findings: list[Finding] = []
    if pod:
        if plain.get("nodeName"):
            findings.append(node_name_on_pod(str(plain["nodeName"]), scheduler_name))
        scheduler = str(plain.get("schedulerName") or "default-scheduler")
        if scheduler != scheduler_name:
            findings.append(other_scheduler(scheduler, scheduler_name, width=1000))
    else:
        findings = pod_template_findings(plain, scheduler_name, where)
    notes = [Note(f.message, _line(_at(spec, where, f.path) or spec), f.reason) for f in findings]
    requesters = gpu_requesting_containers(plain)
    if requesters:
        # At the first container asking the device plugin for GPUs.
        lines = [
            _line(resources)
            for group in ("initContainers", "containers")
            for c in _items(_get(spec, group))
            if (resources := _get(c, "resources")) is not None and requests_gpu(_plain(resources))
        ]
        finding = gpu_resource_requested(requesters, "this pod" if pod else "the pod template", width=1000)
        notes.append(Note(finding.message, lines[0] if lines else _line(spec), finding.reason))
    return notes


def _items(node: Node | None) -> list[Node]:
    return list(node.value) if isinstance(node, SequenceNode) else []


def _at(spec: Node, where: str, path: str | None) -> Node | None:
    """The node of field ``path`` (``where.schedulerName``) under the pod spec at ``where``."""
    if not path or not path.startswith(where + "."):
        return None
    return _path(spec, *path[len(where) + 1 :].split("."))


@emits(FOLDED_MAP)
def _found(doc_no: int, doc: Node, path: str, annotations: Node | None, hit: tuple[Node, Node]) -> FoundMap:
    key, value = hit
    meta = _get(doc, "metadata")
    text: str | None = None
    error: str | None = None
    if isinstance(value, ScalarNode) and value.tag == _STR_TAG:
        text = str(value.value)
    elif isinstance(value, ScalarNode):
        shown = value.value if value.value else "null"
        error = (
            f"the {ANNOTATION} annotation must be a string, found {shown!r} "
            f"({value.tag.rsplit(':', 1)[-1]}); quote it or use a '|' block"
        )
    else:
        what = "mapping" if isinstance(value, MappingNode) else "list"
        error = f"the {ANNOTATION} annotation must be a string, found a {what}"
    notes = _misspelt(annotations)
    if isinstance(value, ScalarNode) and value.style == ">":
        notes.append(
            Note(
                f"the {ANNOTATION} annotation is a folded block ('>'), which joins its lines with "
                "spaces: use a literal block ('|') to keep one entry per line",
                _line(key),
                FOLDED_MAP,
            )
        )
    return FoundMap(
        document=doc_no,
        kind=_str(_get(doc, "kind")),
        namespace=_str(_get(meta, "namespace")),
        name=_str(_get(meta, "name")),
        path=path,
        text=text,
        value_error=error,
        key_line=_line(key),
        notes=notes,
        _style=value.style if isinstance(value, ScalarNode) else None,
        _start0=int(value.start_mark.line),
        _end0=int(value.end_mark.line),
    )


@emits(NO_ORDINALS)
def _scan(doc_no: int, doc: Node, scheduler_name: str, out: list[FoundMap], missing: list[Note]) -> None:
    kind = _str(_get(doc, "kind"))
    if kind and kind.endswith("List"):
        items = _get(doc, "items")
        if isinstance(items, SequenceNode):
            for item in items.value:
                _scan(doc_no, item, scheduler_name, out, missing)
        return
    meta_ann = _path(doc, "metadata", "annotations")
    tmpl_ann = _path(doc, "spec", "template", "metadata", "annotations")
    if kind == "Pod":
        hit = _annotation(meta_ann)
        if hit is None:
            missing.extend(_misspelt(meta_ann))
            return
        found = _found(doc_no, doc, "metadata.annotations", meta_ann, hit)
        found.pod_labels = _string_map(_path(doc, "metadata", "labels"))
        found.notes.extend(_pod_spec_notes(_get(doc, "spec"), "spec", scheduler_name, pod=True))
        out.append(found)
        return
    hit = _annotation(tmpl_ann)
    own = _annotation(meta_ann)
    if hit is None:
        missing.extend(_misspelt(tmpl_ann))
        if own is not None:
            # On the controller's own metadata the annotation never reaches a pod.
            found = _found(doc_no, doc, "metadata.annotations", meta_ann, own)
            misplaced = map_not_on_template(kind or "object")
            found.notes.append(Note(misplaced.message, found.key_line, misplaced.reason))
            out.append(found)
        return
    found = _found(doc_no, doc, "spec.template.metadata.annotations", tmpl_ann, hit)
    if kind == "StatefulSet":
        found.replicas = _int(_path(doc, "spec", "replicas"))
        found.ordinal_start = _int(_path(doc, "spec", "ordinals", "start")) or 0
    else:
        found.notes.append(
            Note(
                f"only StatefulSet pods have ordinals; the pods of a {kind or 'object'} do not "
                "get the map's placement",
                found.key_line,
                NO_ORDINALS,
            )
        )
    found.notes.extend(
        _pod_spec_notes(_path(doc, "spec", "template", "spec"), "spec.template.spec", scheduler_name)
    )
    out.append(found)


def find_maps(text: str, scheduler_name: str = DEFAULT_SCHEDULER_NAME) -> tuple[list[FoundMap], list[Note]]:
    """Every annotation in a (multi-document) YAML text, and notes about near-miss annotation keys.

    Raises :class:`ManifestError` when the text is not YAML.
    """
    found: list[FoundMap] = []
    missing: list[Note] = []
    try:
        docs = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = " ".join(str(x) for x in (err.context, err.problem) if x)
        if mark is None:
            raise ManifestError(f"invalid YAML: {problem}") from err
        raise ManifestError(f"invalid YAML: {problem}", mark.line + 1, mark.column + 1) from err
    except yaml.YAMLError as err:
        raise ManifestError(f"invalid YAML: {err}") from err
    for number, doc in enumerate(docs, start=1):
        if isinstance(doc, MappingNode):
            _scan(number, doc, scheduler_name, found, missing)
    return found, missing
