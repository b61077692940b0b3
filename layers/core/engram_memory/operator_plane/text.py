"""The operator's results as text for people: labelled lines, aligned tables, ISO-8601 UTC times.

One place for how the command line shows things (``operator_plane.commands`` and the embedded
host's ``approvals``); ``--json`` prints the result documents instead, unchanged. Every cell is
printable characters only (no terminal escapes from stored text) and bounded in length.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TextIO

__all__ = [
    "Columns",
    "Progress",
    "cell",
    "iso",
    "progress",
    "show",
    "table",
    "table_of",
    "watching",
]

MAX_CELL: Final = 64
# (header, key) of each column a table shows
Columns = Sequence[tuple[str, str]]
# Epoch-millisecond fields of the result documents (kept so under --json for scripts; each has
# an ISO twin ``<name>_at`` there): shown as ISO-8601 UTC, never as a number.
_EPOCH_MS_FIELDS: Final = frozenset({"valid_from", "valid_to"})


def iso(at_ms: int) -> str:
    """``2026-07-28T09:15:02.000Z``: an instant as every document shows it (ISO-8601 UTC, the
    contract's own form), so text and ``--json`` agree to the character."""
    from engram_memory.contract.types import format_instant  # pydantic: not for ``--help``

    return format_instant(at_ms)


def cell(value: object, *, limit: int = MAX_CELL) -> str:
    """A table cell: printable characters only (no terminal escapes), bounded in length."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = "".join(ch if ch.isprintable() else "?" for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _value(key: str, value: object) -> str:
    if key in _EPOCH_MS_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return iso(value)
    return cell(value, limit=4 * MAX_CELL)


def table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> list[str]:
    """``rows`` as aligned columns under their headers."""
    grid = [[header for header, _ in columns]]
    grid += [[_value(key, row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return [
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in grid
    ]


def table_of(columns: Columns, empty: str) -> Callable[[Sequence[Mapping[str, Any]]], None]:
    """A command's listing shown as a table of ``columns`` (``empty``: what an empty one says)."""

    def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            print(empty)
            return
        for line in table(rows, columns):
            print(line)

    return print_table


def _label(key: str) -> str:
    return key.replace("_", " ")


def _lines(value: Any, indent: str) -> list[str]:
    """A result document as labelled lines: nested objects indented, lists of objects as
    tables of their plain fields, epoch milliseconds shown as ISO-8601 UTC."""
    out: list[str] = []
    twins = {key.removesuffix("_at") for key in value if key.endswith("_at")}
    for key, item in value.items():
        if key in _EPOCH_MS_FIELDS and key in twins:
            continue  # its ISO twin says it
        if isinstance(item, Mapping):
            out += [f"{indent}{_label(key)}:" + ("" if item else " none")]
            out += _lines(item, indent + "  ")
        elif isinstance(item, list) and item and all(isinstance(x, Mapping) for x in item):
            keys = [k for k in item[0] if not isinstance(item[0][k], Mapping | list)]
            out.append(f"{indent}{_label(key)}:")
            out += [indent + "  " + line for line in table(item, [(_label(k), k) for k in keys])]
        elif isinstance(item, list):
            shown = ", ".join(cell(x) for x in item) or "none"
            out.append(f"{indent}{_label(key)}: {shown}")
        else:
            out.append(f"{indent}{_label(key)}: {_value(key, item)}")
    return out


def show(result: Any) -> None:
    """The default human form of a result: a document as labelled lines, a list of lines as
    they are, anything else as one cell."""
    if isinstance(result, Mapping):
        lines = _lines(result, "")
    elif isinstance(result, list) and all(isinstance(x, str) for x in result):
        lines = list(result)
    elif isinstance(result, list):
        lines = [line for x in result for line in (*_lines(x, ""), "")] if result else ["none"]
    else:
        lines = [cell(result)]
    for line in lines:
        print(line)


class Progress:
    """``import [########............]  40%  120/300 items`` rewritten in place on a terminal's
    stderr (a plain counter when the total is unknown): what a long operation has done so far.
    Silent when stderr is not a terminal (a pipe, a log, a test) or the command prints
    ``--json``; no dependency (the package's runtime dependencies ship to the Lambda layer)."""

    WIDTH: Final = 24

    def __init__(self, what: str, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self._what = what
        self._stream = stream or sys.stderr
        self._on = enabled and self._stream.isatty()
        self._shown = False

    def __call__(self, done: int, total: int | None, unit: str) -> None:
        if not self._on:
            return
        if total:
            filled = min(self.WIDTH, self.WIDTH * done // total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            line = f"{self._what} [{bar}] {100 * done // total:3d}%  {done}/{total} {unit}"
        else:
            line = f"{self._what}: {done} {unit}"
        self._stream.write(f"\r{line}\x1b[K")
        self._stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()


# The reporter of the operation running now: a long operation (backup, restore, export, key
# rotation) calls ``progress`` at each step; the command line installs a ``Progress`` around it.
_current: list[Callable[[int, int | None, str], None]] = []


def progress(done: int, total: int | None, unit: str) -> None:
    """Report a step of the running operation (nothing when no one is watching)."""
    if _current:
        _current[-1](done, total, unit)


def watching(reporter: Callable[[int, int | None, str], None]) -> Callable[[], None]:
    """Install ``reporter`` for the operation about to run; returns the call that removes it."""
    _current.append(reporter)

    def stop() -> None:
        _current.remove(reporter)

    return stop
