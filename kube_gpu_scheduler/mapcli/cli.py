"""``gpu-scheduler-map``: check ``gpu-scheduling-map`` annotations before they reach a cluster.

``plan`` and ``status``, which read a live cluster, are :mod:`kube_gpu_scheduler.mapcli.commands`.

``gpu-scheduler-map validate [FILE|-]...`` reads a raw map, or Kubernetes YAML
(one or many documents: ``helm template`` or ``kustomize build`` output, a
``kubectl get -o yaml`` List) and checks every map it finds with the project's
one parser. Exit status: 0 all maps valid, 1 a map is invalid (or, with
``--strict``, a warning was given), 2 the input could not be read or is not
YAML. Tables go to stdout, problems to stderr as ``FILE:LINE: ...`` so that CI
logs and editors can point at them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kube_gpu_scheduler.base.argtypes import non_negative_int
from kube_gpu_scheduler.domain import sharing
from kube_gpu_scheduler.domain.rules import (
    GPU_COUNT_NEEDS_DRA,
    GPU_SHARED,
    INVALID_MAP,
    Finding,
    pci_needs_dra,
    replica_findings,
    resolve,
    unused_ordinals,
)
from kube_gpu_scheduler.domain.schedmap import ANNOTATION, MapError, SchedulingMap, parse, sharing_problems
from kube_gpu_scheduler.mapcli import topology
from kube_gpu_scheduler.mapcli.commands import add_commands, live_slices, run_plan, run_status, run_suggest
from kube_gpu_scheduler.mapcli.manifest import (
    DEFAULT_SCHEDULER_NAME,
    FoundMap,
    ManifestError,
    Note,
    find_maps,
    looks_like_manifest,
)

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2
_YAML_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class MapReport:
    """The verdict on one map."""

    source: str
    found: FoundMap | None  # None for a raw map
    smap: SchedulingMap | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    replicas: int | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def label(self) -> str | None:
        return self.found.label if self.found else None

    def file_line(self, map_line: int) -> int | None:
        return self.found.file_line(map_line) if self.found else map_line

    def to_json(self) -> dict[str, Any]:
        f = self.found
        entries = [
            {
                "ordinal": e.ordinal,
                "node": e.node,
                "gpus": list(e.gpus),
                **({"count": e.count} if e.count else {}),
                "gpu_kind": "count" if e.count else e.kind,
                "line": e.line,
                "file_line": self.file_line(e.line),
            }
            for e in (self.smap or {}).values()
        ]
        return {
            "source": self.source,
            "document": f.document if f else None,
            "kind": f.kind if f else None,
            "namespace": f.namespace if f else None,
            "name": f.name if f else None,
            "label": self.label,
            "path": f.path if f else None,
            "replicas": self.replicas,
            "ok": self.ok,
            "entries": entries,
            "errors": self.errors,
            "warnings": self.warnings,
        }


@dataclass
class InputReport:
    """One input (file or stdin): its maps, or why it could not be read."""

    source: str
    kind: str = "map"  # "map" or "manifest"
    error: str | None = None
    error_line: int | None = None
    error_column: int | None = None
    maps: list[MapReport] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "input": self.kind,
            "error": self.error,
            "line": self.error_line,
            "column": self.error_column,
            "warnings": [_note(n) for n in self.notes],
            "maps": [m.to_json() for m in self.maps],
        }


def _note(note: Note) -> dict[str, Any]:
    return {"file_line": note.file_line, "message": note.message, "reason": note.reason}


def _check_names(report: MapReport, dra: bool) -> None:
    """A GPU named by PCI bus ID, or a count entry (``auto(N)``), is a warning, unless the cluster
    runs DRA mode (``--dra``)."""
    if report.smap is None:
        return
    for x in pci_needs_dra(report.smap.values(), dra):
        counted = x.reason == GPU_COUNT_NEEDS_DRA
        first = next(
            e for e in report.smap.values() if (e.count > 0) == counted and (counted or e.kind == "pci")
        )
        report.warnings.append(
            {"file_line": report.file_line(first.line), "message": x.message, "reason": x.reason}
        )


def _check_ordinals(report: MapReport, replicas: int | None, start: int) -> None:
    """The ordinal rules (kube_gpu_scheduler.domain.rules): a Pod's own ordinal, or a StatefulSet's replicas."""
    f = report.found
    if f is None or f.kind != "Pod":
        report.replicas = replicas
    smap = report.smap
    if smap is None:
        return
    findings: list[Finding] = []
    if f is not None and f.kind == "Pod":
        pod = {"metadata": {"name": f.name, "labels": f.pod_labels, "annotations": {ANNOTATION: f.text}}}
        findings = list(resolve(pod).refusals)
    elif replicas is not None:
        findings = replica_findings(smap, start, replicas) + unused_ordinals(smap, start, replicas)
    line = f.key_line if f else None
    report.warnings.extend({"file_line": line, "message": x.message, "reason": x.reason} for x in findings)


def _check_sharing(report: MapReport, allowed: bool) -> None:
    """A map that shares GPUs: a warning naming each shared GPU, or (``--no-sharing``: the
    cluster forbids it) an error per entry that shares."""
    smap = report.smap
    if smap is None or not smap.shared():
        return
    refused = None if allowed else sharing_problems(smap, sharing.RELEASE_FORBIDS)
    if refused is not None:
        report.smap = None
        _record(report, refused)
        return
    first = min(smap.entries[o].line for ords in smap.shared().values() for o in ords[1:])
    report.warnings.append(
        {"file_line": report.file_line(first), "message": sharing.warning(smap), "reason": GPU_SHARED}
    )


def _check_text(report: MapReport, text: str) -> None:
    try:
        report.smap = parse(text)
    except MapError as err:
        _record(report, err)


def _record(report: MapReport, err: MapError) -> None:
    """Each of ``err``'s problems as an error of the report (and how many more there are)."""
    # Line 0 is the whole map (its size): point at the annotation's key.
    key_line = report.found.key_line if report.found else None
    for p in err.problems:
        report.errors.append(
            {
                "line": p.line or None,
                "file_line": report.file_line(p.line) if p.line else key_line,
                "text": p.text or None,
                "message": p.message,
                "reason": INVALID_MAP,
            }
        )
    if err.more:
        report.errors.append(
            {
                "line": None,
                "file_line": key_line,
                "text": None,
                "message": f"and {err.more} more problem{'' if err.more == 1 else 's'} "
                f"(only the first {len(err.problems)} are listed)",
                "reason": INVALID_MAP,
            }
        )


def _read(source: str) -> str:
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(source, "rb") as fh:
            data = fh.read()
    return data.decode("utf-8-sig")


def _display(source: str) -> str:
    return "<stdin>" if source == "-" else source


def check_input(
    source: str,
    text: str,
    *,
    mode: str = "auto",
    replicas: int | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    dra: bool = False,
    sharing_allowed: bool = True,
) -> InputReport:
    """Check one input's text. ``mode``: ``auto``, ``map`` or ``manifest``; ``dra``: the cluster
    runs DRA mode (GPUs named by PCI bus ID are then no warning); ``sharing_allowed``: a map
    that shares GPUs is a warning (else an error)."""
    shown = _display(source)
    manifest = mode == "manifest" or (
        mode == "auto" and (source.lower().endswith(_YAML_SUFFIXES) or looks_like_manifest(text))
    )
    if not manifest and not text.strip():
        # Usually an upstream step of a pipe failed (`helm template ... | gpu-scheduler-map validate`).
        return InputReport(shown, "map", error="empty input: no map to check")
    if not manifest:
        report = MapReport(shown, None)
        _check_text(report, text)
        _check_names(report, dra)
        _check_sharing(report, sharing_allowed)
        _check_ordinals(report, replicas, 0)
        return InputReport(shown, "map", maps=[report])
    out = InputReport(shown, "manifest")
    try:
        found, notes = find_maps(text, scheduler_name)
    except ManifestError as err:
        out.error, out.error_line, out.error_column = err.message, err.line, err.column
        return out
    out.notes = notes
    for f in found:
        report = MapReport(shown, f)
        report.warnings = [_note(n) for n in f.notes]
        if f.text is None:
            report.errors.append(
                {
                    "line": None,
                    "file_line": f.key_line,
                    "text": None,
                    "message": f.value_error,
                    "reason": INVALID_MAP,
                }
            )
        else:
            _check_text(report, f.text)
            _check_names(report, dra)
            _check_sharing(report, sharing_allowed)
        _check_ordinals(report, replicas if replicas is not None else f.replicas, f.ordinal_start)
        out.maps.append(report)
    return out


def _where(source: str, line: int | None) -> str:
    return f"{source}:{line}" if line else source


def _print_problems(inp: InputReport, err: TextIO) -> None:
    if inp.error:
        loc = _where(inp.source, inp.error_line)
        if inp.error_column and inp.error_line:
            loc += f":{inp.error_column}"
        print(f"{loc}: {inp.error}", file=err)
        return
    for n in inp.notes:
        print(f"{_where(inp.source, n.file_line)}: warning: {n.message}", file=err)
    for m in inp.maps:
        prefix = f"{m.label}: " if m.label else ""
        for e in m.errors:
            line = f"line {e['line']}: " if m.label and e["line"] else ""
            text = f" (in {e['text']!r})" if e["text"] else ""
            print(f"{_where(m.source, e['file_line'])}: {prefix}{line}{e['message']}{text}", file=err)
        for w in m.warnings:
            print(f"{_where(m.source, w['file_line'])}: warning: {prefix}{w['message']}", file=err)
    if inp.kind == "manifest" and not inp.maps:
        print(f"{inp.source}: no {ANNOTATION} annotation found", file=err)


def _table(smap: SchedulingMap) -> list[str]:
    """ORDINAL, NODE, GPUS and, for a map that shares GPUs, SHARED WITH (the other ordinals)."""
    rows = [("ORDINAL", "NODE", "GPUS", "SHARED WITH" if smap.shared() else "")]
    for o in smap:
        mates = sorted(set().union(*smap.mates(o).values())) if smap.mates(o) else []
        rows.append((str(o), smap[o].node, smap[o].devices, ",".join(map(str, mates))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _print_tables(inputs: Sequence[InputReport], out: TextIO) -> None:
    first = True
    several = len(inputs) > 1
    for inp in inputs:
        for m in inp.maps:
            if m.smap is None:
                continue
            if not first:
                print(file=out)
            first = False
            if m.label or several:
                head = f"{m.source}: {m.label}" if m.label else m.source
                if m.replicas is not None:
                    head += f" (replicas {m.replicas})"
                print(head, file=out)
            for row in _table(m.smap):
                print(row, file=out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-scheduler-map",
        description=f"Check {ANNOTATION} annotations (raw maps or Kubernetes YAML).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    v = sub.add_parser(
        "validate",
        help="check maps; exit 0 valid, 1 invalid, 2 unreadable",
        description="Check a raw map, or every annotation in Kubernetes YAML (multi-document, Lists). "
        "Exit 0 when every map is valid, 1 when one is not, 2 when an input cannot be read or is not YAML. "
        "A GPU is named by index (0), UUID (GPU-8a3c0d4e-1234-5678-9abc-def012345678, any case) or "
        "PCI bus ID (0000:3b:00.0 or NVML's 00000000:3B:00.0; DRA mode only), all of a node's GPUs "
        "one way; the table shows the names normalized (UUIDs lower case, PCI bus IDs lower case "
        "with a 4-digit domain).",
    )
    v.add_argument("files", nargs="*", metavar="FILE", default=["-"], help="file to check; '-' is stdin")
    v.add_argument("--format", choices=["table", "json"], default="table", help="stdout format")
    v.add_argument(
        "--replicas",
        type=non_negative_int,
        help="warn about ordinals the map lacks for this many replicas "
        "(StatefulSets: spec.replicas is used when this is not given)",
    )
    v.add_argument(
        "--input",
        choices=["auto", "map", "manifest"],
        default="auto",
        help="what the input is; auto: YAML when the file ends in .yaml/.yml/.json or has apiVersion:/kind:",
    )
    v.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    v.add_argument(
        "--dra",
        action="store_true",
        help="the cluster runs DRA mode (chart value dra.enabled=true): GPUs named by PCI bus ID "
        "are then no warning",
    )
    v.add_argument(
        "--no-sharing",
        action="store_true",
        help="the release forbids GPU sharing (chart value sharing.allowed=false): a GPU that two "
        "entries name is then an error, not a warning",
    )
    v.add_argument(
        "--scheduler-name",
        default=DEFAULT_SCHEDULER_NAME,
        help="the schedulerName pods must use (default: %(default)s)",
    )
    v.add_argument(
        "--live",
        action="store_true",
        help="also read the live cluster's ResourceSlices: a named entry whose GPUs span PCIe roots "
        "(else NUMA nodes) is a warning (GPUsSpanTopology)",
    )
    v.add_argument(
        "--kubeconfig", help="with --live: kubeconfig file (default: KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    add_commands(sub)
    return parser


def validate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    inputs: list[InputReport] = []
    for source in args.files:
        try:
            text = _read(source)
        except OSError as exc:
            inputs.append(
                InputReport(_display(source), error=f"cannot read: {exc.strerror or exc.__class__.__name__}")
            )
            continue
        except UnicodeDecodeError as exc:
            inputs.append(
                InputReport(
                    _display(source), error=f"cannot read: not UTF-8 text (byte at offset {exc.start})"
                )
            )
            continue
        inputs.append(
            check_input(
                source,
                text,
                mode=args.input,
                replicas=args.replicas,
                scheduler_name=args.scheduler_name,
                dra=args.dra,
                sharing_allowed=not args.no_sharing,
            )
        )
    if args.live or args.kubeconfig:
        slices = live_slices(args.kubeconfig, err)
        if slices is None:
            return EXIT_UNREADABLE
        topology.warn([m for i in inputs for m in i.maps], slices)
    unreadable = any(i.error for i in inputs)
    invalid = any(not m.ok for i in inputs for m in i.maps)
    warned = any(i.notes or any(m.warnings for m in i.maps) for i in inputs)
    ok = not unreadable and not invalid and not (args.strict and warned)
    if args.format == "json":
        json.dump({"ok": ok, "inputs": [i.to_json() for i in inputs]}, out, indent=2)
        print(file=out)
    else:
        _print_tables(inputs, out)
    for inp in inputs:
        _print_problems(inp, err)
    if unreadable:
        return EXIT_UNREADABLE
    return EXIT_OK if ok else EXIT_INVALID


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run = {"plan": run_plan, "status": run_status, "suggest": run_suggest}.get(args.command, validate)
    try:
        return run(args, sys.stdout, sys.stderr)
    except BrokenPipeError:  # `... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
