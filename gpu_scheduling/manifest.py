"""Find ``gpu-scheduling-map`` annotations in Kubernetes YAML, with their line numbers.

Works on PyYAML's node graph (``compose_all``) rather than on loaded objects so
that every value keeps its position in the file: a problem on line 3 of a
literal-block annotation that starts on line 40 of ``helm template`` output is
reported as line 43 of the file. The annotation's value is handed to
:func:`gpu_scheduling.schedmap.parse` unchanged; nothing here parses the map.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpu_scheduling.schedmap import ANNOTATION

_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_MANIFEST_HINT = re.compile(r"^[ \t]*(?:-[ \t]+)?(?:apiVersion|kind)[ \t]*:", re.MULTILINE)
GPU_RESOURCE = "nvidia.com/gpu"
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


def _misspelt(annotations: Node | None) -> list[Note]:
    notes: list[Note] = []
    if isinstance(annotations, MappingNode):
        for k, _ in annotations.value:
            if not isinstance(k, ScalarNode) or k.value == ANNOTATION:
                continue
            key = str(k.value)
            bare = key.rsplit("/", 1)[-1]
            if difflib.get_close_matches(bare, [ANNOTATION], n=1, cutoff=0.8):
                notes.append(Note(f"annotation {key!r} looks like a misspelling of {ANNOTATION!r}", _line(k)))
    return notes


def _pod_spec_notes(spec: Node | None, where: str, scheduler_name: str) -> list[Note]:
    notes: list[Note] = []
    if spec is None:
        return notes
    sched = _get(spec, "schedulerName")
    value = _str(sched)
    if value != scheduler_name:
        line = _line(sched) if sched is not None else _line(spec)
        shown = "not set" if value is None else repr(value)
        notes.append(
            Note(
                f"{where}.schedulerName is {shown}, not {scheduler_name!r}: "
                "the default scheduler will place these pods and ignore the map",
                line,
            )
        )
    for group in ("initContainers", "containers"):
        containers = _get(spec, group)
        if not isinstance(containers, SequenceNode):
            continue
        for c in containers.value:
            cname = _str(_get(c, "name")) or "?"
            for part in ("limits", "requests"):
                res = _path(c, "resources", part)
                if _get(res, GPU_RESOURCE) is not None:
                    gpu_node = _get(res, GPU_RESOURCE)
                    assert gpu_node is not None
                    notes.append(
                        Note(
                            f"container {cname!r} requests {GPU_RESOURCE} in resources.{part}: the device "
                            "plugin then chooses the GPUs and renumbers them from 0, so the map's "
                            "indices would point at the wrong GPUs",
                            _line(gpu_node),
                        )
                    )
                    break
    return notes


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
        found.notes.extend(_pod_spec_notes(_get(doc, "spec"), "spec", scheduler_name))
        out.append(found)
        return
    hit = _annotation(tmpl_ann)
    own = _annotation(meta_ann)
    if hit is None:
        missing.extend(_misspelt(tmpl_ann))
        if own is not None:
            # On the controller's own metadata the annotation never reaches a pod.
            found = _found(doc_no, doc, "metadata.annotations", meta_ann, own)
            found.notes.append(
                Note(
                    f"the {ANNOTATION} annotation is on the {kind or 'object'}'s own metadata, where it has "
                    "no effect: put it on spec.template.metadata.annotations",
                    found.key_line,
                )
            )
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
