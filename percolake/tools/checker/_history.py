"""Elle list-append histories: the data model and the JSON-lines reader.

A history is a sequence of operations. Each client operation is an ``invoke`` followed
by the same process's completion (``ok``, ``fail`` or ``info``); the pair is one
transaction. Parsing turns the pairs into :class:`Txn` objects and rejects anything the
checker could not reason about soundly (a malformed line, a completion without an
invocation, the same value appended twice to one key) with a :class:`HistoryError` that
names the line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias, TypeGuard

from wire.errors import PercolakeError

Key: TypeAlias = str | int
Status: TypeAlias = Literal["ok", "fail", "info"]

_OP_TYPES = frozenset({"invoke", "ok", "fail", "info"})
# Jepsen records fault injections as operations of the "nemesis" process; they are not
# transactions, so they are skipped rather than rejected.
_NEMESIS = "nemesis"


class HistoryError(PercolakeError, ValueError):
    """The history cannot be checked: malformed input. ``line`` is 1-based (0: no line)."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        self.source = source
        self.line = line
        self.problem = problem
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {problem}")


class Append(NamedTuple):
    """``["append", key, value]``: append ``value`` to the list stored at ``key``."""

    key: Key
    value: int

    def to_json(self) -> list[object]:
        return ["append", self.key, self.value]


class Read(NamedTuple):
    """``["r", key, values]``: the list read at ``key``; ``None`` when not observed."""

    key: Key
    values: list[int] | None

    def to_json(self) -> list[object]:
        return ["r", self.key, self.values]


MicroOp: TypeAlias = Append | Read


@dataclass(frozen=True, slots=True, eq=False)
class Txn:
    """One transaction: an invocation and its completion.

    ``ops`` holds the completion's micro-operations for ``ok`` transactions (reads filled
    in) and the invocation's for ``fail`` and ``info`` ones (reads unknown). An
    invocation never completed counts as ``info``; then ``complete_index`` is ``None``.
    Transactions compare and hash by identity: each is one event of one history.
    """

    id: int
    process: int
    status: Status
    ops: tuple[MicroOp, ...]
    invoke_index: int
    complete_index: int | None
    line: int
    start_ts: int | None = None
    commit_ts: int | None = None

    @property
    def name(self) -> str:
        return f"T{self.id}"

    def describe(self) -> str:
        index = self.complete_index if self.complete_index is not None else self.invoke_index
        return f"T{self.id} (process {self.process}, {self.status} at index {index})"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "process": self.process,
            "type": self.status,
            "index": self.invoke_index,
            "complete_index": self.complete_index,
            "line": self.line,
            "start_ts": self.start_ts,
            "commit_ts": self.commit_ts,
            "value": [op.to_json() for op in self.ops],
        }


@dataclass(frozen=True, slots=True)
class History:
    """Parsed transactions in invocation order (``txns[i].id == i``)."""

    txns: tuple[Txn, ...]
    source: str = "<history>"
    operations: int = 0
    skipped_nemesis_operations: int = 0


def load_history(path: str | os.PathLike[str]) -> History:
    """Read a JSON-lines history file.

    Raises :class:`HistoryError` for malformed content and ``OSError`` when the file
    cannot be read.
    """
    source = os.fspath(path)
    with open(source, encoding="utf-8") as lines:
        return parse_history(lines, source=source)


def parse_history(lines: Iterable[str], *, source: str = "<history>") -> History:
    """Parse JSON lines (blank lines are ignored) into a :class:`History`."""
    return _Parser(source).run(_decode(lines, source))


def history_from_ops(ops: Iterable[Mapping[str, object]], *, source: str = "<ops>") -> History:
    """Build a :class:`History` from already decoded operations (line i = operation i)."""
    return _Parser(source).run((number, op) for number, op in enumerate(ops, start=1))


def _decode(lines: Iterable[str], source: str) -> Iterator[tuple[int, object]]:
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield number, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise HistoryError(source, number, f"not valid JSON: {exc.msg}") from None


@dataclass(slots=True)
class _Open:
    invoke_index: int
    line: int
    ops: tuple[MicroOp, ...]
    txn_id: int


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.open_by_process: dict[int, _Open] = {}
        self.txns: dict[int, Txn] = {}
        self.next_id = 0
        self.operations = 0
        self.skipped = 0
        # key -> appended value -> line of the invocation that appended it
        self.appended: dict[Key, dict[int, int]] = {}

    def fail(self, line: int, problem: str) -> HistoryError:
        return HistoryError(self.source, line, problem)

    def run(self, ops: Iterable[tuple[int, object]]) -> History:
        for line, op in ops:
            self.operations += 1
            self.operation(line, op)
        for process, pending in self.open_by_process.items():
            # An invocation with no completion may or may not have taken effect.
            self.txns[pending.txn_id] = Txn(
                id=pending.txn_id,
                process=process,
                status="info",
                ops=pending.ops,
                invoke_index=pending.invoke_index,
                complete_index=None,
                line=pending.line,
            )
        txns = tuple(self.txns[i] for i in range(self.next_id))
        return History(txns, self.source, self.operations, self.skipped)

    def operation(self, line: int, op: object) -> None:
        if not isinstance(op, dict):
            raise self.fail(line, f"expected a JSON object, got {_json_type(op)}")
        process = op.get("process")
        if process == _NEMESIS:
            self.skipped += 1
            return
        op_type = self.str_field(line, op, "type")
        if op_type not in _OP_TYPES:
            raise self.fail(
                line, f"unknown op type {op_type!r} (expected invoke, ok, fail or info)"
            )
        process = self.int_field(line, op, "process")
        f = self.str_field(line, op, "f")
        if f != "txn":
            raise self.fail(line, f'unsupported "f" {f!r}: only "txn" operations are checked')
        index = op.get("index", self.operations - 1)
        if not _is_int(index):
            raise self.fail(line, f'"index" must be an integer, got {_json_type(index)}')
        if "value" not in op:
            raise self.fail(line, 'missing field "value"')
        if op_type == "invoke":
            self.invoke(line, op, process, index)
        else:
            self.complete(line, op, op_type, process, index)

    def str_field(self, line: int, op: Mapping[str, object], name: str) -> str:
        value = self.required(line, op, name)
        if not isinstance(value, str):
            raise self.fail(line, f"field {name!r} must be a string, got {_json_type(value)}")
        return value

    def int_field(self, line: int, op: Mapping[str, object], name: str) -> int:
        value = self.required(line, op, name)
        if not _is_int(value):
            raise self.fail(line, f"field {name!r} must be an integer, got {_json_type(value)}")
        return value

    def required(self, line: int, op: Mapping[str, object], name: str) -> object:
        if name not in op:
            raise self.fail(line, f"missing field {name!r}")
        return op[name]

    def invoke(self, line: int, op: Mapping[str, object], process: int, index: int) -> None:
        if process in self.open_by_process:
            earlier = self.open_by_process[process].line
            raise self.fail(
                line,
                f"process {process} invoked again before completing its invoke at line {earlier}",
            )
        ops = self.micro_ops(line, op["value"], reads_required=False)
        for mop in ops:
            if isinstance(mop, Append):
                seen = self.appended.setdefault(mop.key, {})
                if mop.value in seen:
                    raise self.fail(
                        line,
                        f"value {mop.value} appended to key {mop.key!r} again (first at line "
                        f"{seen[mop.value]}); appended values must be unique per key",
                    )
                seen[mop.value] = line
        self.open_by_process[process] = _Open(index, line, ops, self.next_id)
        self.next_id += 1

    def complete(
        self, line: int, op: Mapping[str, object], status: str, process: int, index: int
    ) -> None:
        pending = self.open_by_process.pop(process, None)
        if pending is None:
            raise self.fail(line, f"{status} completion for process {process} without an invoke")
        value = op["value"]
        ops = pending.ops
        if status == "ok":
            ops = self.micro_ops(line, value, reads_required=True)
            self.check_matches_invoke(line, pending, ops)
        elif value is not None:
            # The outcome of a fail or info is recorded against what was invoked; its
            # value only has to describe the same transaction.
            self.check_matches_invoke(line, pending, self.micro_ops(line, value, False))
        start_ts = self.timestamp(line, op, "start_ts")
        commit_ts = self.timestamp(line, op, "commit_ts")
        self.txns[pending.txn_id] = Txn(
            id=pending.txn_id,
            process=process,
            status="ok" if status == "ok" else "fail" if status == "fail" else "info",
            ops=ops,
            invoke_index=pending.invoke_index,
            complete_index=index,
            line=pending.line,
            start_ts=start_ts,
            commit_ts=commit_ts,
        )

    def timestamp(self, line: int, op: Mapping[str, object], name: str) -> int | None:
        value = op.get(name)
        if value is None or _is_int(value):
            return value
        raise self.fail(line, f"{name!r} must be an integer or null, got {_json_type(value)}")

    def check_matches_invoke(self, line: int, pending: _Open, ops: tuple[MicroOp, ...]) -> None:
        invoked = pending.ops
        same = len(invoked) == len(ops) and all(
            type(a) is type(b) and a.key == b.key and (isinstance(a, Read) or a == b)
            for a, b in zip(invoked, ops, strict=True)
        )
        if not same:
            raise self.fail(
                line,
                f"completion value {[m.to_json() for m in ops]} does not match the invoke at "
                f"line {pending.line}: {[m.to_json() for m in invoked]}",
            )

    def micro_ops(self, line: int, value: object, reads_required: bool) -> tuple[MicroOp, ...]:
        # Tuples are accepted for operations built in Python (history_from_ops).
        if not isinstance(value, list | tuple):
            raise self.fail(
                line, f'"value" must be a list of micro-operations, got {_json_type(value)}'
            )
        ops: list[MicroOp] = []
        for position, mop in enumerate(value):
            if not isinstance(mop, list | tuple) or len(mop) != 3:
                raise self.fail(
                    line,
                    f"micro-op {position} must be a list [f, key, value], got {_show(mop)}",
                )
            f, key, arg = mop
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise self.fail(
                    line,
                    f"micro-op {position}: key must be a string or an integer, got "
                    f"{_json_type(key)}",
                )
            if f == "append":
                if not _is_int(arg):
                    raise self.fail(
                        line,
                        f"micro-op {position}: appended value must be an integer, got "
                        f"{_json_type(arg)}",
                    )
                ops.append(Append(key, arg))
            elif f == "r":
                ops.append(Read(key, self.read_values(line, position, arg, reads_required)))
            else:
                raise self.fail(
                    line,
                    f'micro-op {position}: unknown function {f!r} (expected "append" or "r")',
                )
        return tuple(ops)

    def read_values(
        self, line: int, position: int, arg: object, reads_required: bool
    ) -> list[int] | None:
        if not reads_required:
            # Invocations carry null; info and fail completions may echo anything.
            return None
        if not isinstance(arg, list | tuple):
            raise self.fail(
                line,
                f"micro-op {position}: a read in an ok completion must be a list of integers, "
                f"got {_json_type(arg)}",
            )
        for element in arg:
            if not _is_int(element):
                raise self.fail(
                    line,
                    f"micro-op {position}: read element {_show(element)} is not an integer",
                )
        return arg if isinstance(arg, list) else list(arg)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    return json.dumps(value, default=repr)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
