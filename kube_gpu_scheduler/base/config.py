"""One way to read settings: a table of (field, environment variable, parser, help), read once.

The scheduler (``kube_gpu_scheduler/scheduler/runtime/settings.py``), the webhook (``kube_gpu_scheduler/webhook/settings.py``)
and the check program (``kube_gpu_scheduler/check/settings.py``) each declare their
settings as a tuple of :class:`Setting` rows and build a frozen dataclass from
:func:`read`. A bad value raises :class:`SettingsError` whose message starts
with the variable (or the flag) that holds it. The tables in
``docs/dev-interfaces.md`` are generated from the same rows by
:func:`markdown_table` (``tools/settings_doc.py`` assembles them; this module
imports none of its users; ``tests/unit/house/test_settings_doc.py`` keeps them equal).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# (source, raw text) -> value; ``source`` is the variable or flag, for the error message.
Parse = Callable[[str, str], Any]


class SettingsError(ValueError):
    """A setting has a value the program cannot run with; the message names the variable."""


@dataclass(frozen=True)
class Setting:
    field: str
    env: str
    parse: Parse
    help: str
    flag: str | None = None
    # What docs/dev-interfaces.md shows as the default; None: the dataclass field's default.
    doc_default: str | None = None
    # True: a variable that is set counts even when empty (the check's downward-API values).
    keep_empty: bool = False


# --- parsers -------------------------------------------------------------------------------------


def text(_source: str, raw: str) -> str:
    return raw


def boolean(source: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise SettingsError(f"{source}={raw!r} is not a boolean (true/false)")


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def number(
    kind: type[int] | type[float],
    low: float | None = None,
    high: float | None = None,
    *,
    what: str | None = None,
    unit: str = "",
) -> Parse:
    """A parser for an int or float in ``low..high``; ``what`` names the type in the error."""
    what = what or f"a valid {kind.__name__}"

    def parse(source: str, raw: str) -> int | float:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise SettingsError(f"{source}={raw!r} is not {what}") from None
        if high is None and low == 0 and value < 0:
            raise SettingsError(f"{source}={raw!r} is negative")
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"{_fmt(low) if low is not None else ''}..{_fmt(high) if high is not None else ''}"
            raise SettingsError(f"{source}={_fmt(value)} is outside {span}{unit}")
        return value

    return parse


def choice(values: Iterable[str], *, upper: bool = False) -> Parse:
    """A parser for one of ``values``, case-insensitive (stored lower case, or upper with ``upper``)."""
    allowed = tuple(values)

    def parse(source: str, raw: str) -> str:
        value = raw.strip().upper() if upper else raw.strip().lower()
        if value not in allowed:
            raise SettingsError(f"{source}={value!r}: choose one of {', '.join(allowed)}")
        return value

    return parse


log_level = choice(LOG_LEVELS, upper=True)

# spec.schedulerName, a RuntimeClass's name: a DNS subdomain (RFC 1123).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def dns_subdomain(what: str, *, empty: bool = False) -> Parse:
    """A parser for a DNS subdomain name (RFC 1123, at most 253 characters): the error says
    ``is not {what}``. ``empty``: the value is stripped, and empty passes too."""

    def parse(source: str, raw: str) -> str:
        value = raw.strip() if empty else raw
        if (value or not empty) and (len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value)):
            raise SettingsError(f"{source}={value[:80]!r} is not {what}")
        return value

    return parse


def split_namespaced(ref: str) -> tuple[str, str]:
    """``namespace/name`` as (namespace, name); a part that is missing is empty."""
    namespace, _, name = ref.partition("/")
    return namespace, name


def is_namespaced(ref: str) -> bool:
    """``ref`` is ``namespace/name`` with both parts."""
    return all(split_namespaced(ref))


# --- rows more than one program has ----------------------------------------------------------------

KUBECONFIG = "KUBECONFIG"


def kubeconfig_setting(help: str, flag: str | None = None, doc_default: str | None = None) -> Setting:
    """The kubeconfig file, from ``KUBECONFIG`` as kubectl reads it (unset: the program's default)."""
    return Setting("kubeconfig", KUBECONFIG, text, help, flag, doc_default)


def tenancy_grants_setting(
    env: str, help: str, flag: str | None = None, doc_default: str | None = None
) -> Setting:
    """``namespace/name`` of the ConfigMap of resolved GPUPinningPolicy grants (unset: tenancy off)."""
    return Setting("tenancy_grants", env, text, help, flag, doc_default)


# --- reading -------------------------------------------------------------------------------------


def read_env(table: Sequence[Setting], env: Mapping[str, str]) -> dict[str, Any]:
    """``{field: value}`` for every variable of ``table`` set (and not blank) in ``env``."""
    values: dict[str, Any] = {}
    for s in table:
        raw = env.get(s.env)
        if raw is None or (not s.keep_empty and not raw.strip()):
            continue
        values[s.field] = s.parse(s.env, raw if s.keep_empty else raw.strip())
    return values


def parser_for(table: Sequence[Setting], prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser with a ``--flag`` for every row that has one (help names the variable)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for s in table:
        if s.flag:
            parser.add_argument(s.flag, dest=s.field, default=None, help=f"{s.help} (env {s.env})")
    return parser


def read_flags(table: Sequence[Setting], args: argparse.Namespace) -> dict[str, Any]:
    """``{field: value}`` for every flag given on the command line."""
    given = vars(args)
    return {
        s.field: s.parse(s.flag, given[s.field]) for s in table if s.flag and given.get(s.field) is not None
    }


# --- documentation -------------------------------------------------------------------------------


def default_text(setting: Setting, cls: type) -> str:
    if setting.doc_default is not None:
        return setting.doc_default
    for f in fields(cls):
        if f.name == setting.field:
            value = f.default if f.default is not MISSING else None
            if value is None or value == "":
                return "unset"
            if isinstance(value, bool):
                return f"`{str(value).lower()}`"
            return f"`{_fmt(value)}`"
    raise KeyError(setting.field)


def markdown_table(table: Sequence[Setting], cls: type, flags: bool = False) -> str:
    """The table for docs/dev-interfaces.md: variable (and flag), default, meaning."""
    head = (
        "| env | flag | default | meaning |\n|---|---|---|---|"
        if flags
        else "| env | default | meaning |\n|---|---|---|"
    )
    rows = [head]
    for s in table:
        cells = [f"`{s.env}`"] + ([f"`{s.flag}`" if s.flag else ""] if flags else [])
        cells += [default_text(s, cls), s.help]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
