"""Late settles: clients that ask again, much later and through another gateway, how
their commits ended (``--late-settle-s``, list-append through gateways).

A commit whose reply was lost (its gateway killed or paused) ends in an unknown
outcome. Such a client waits ``late_settle_s`` (long enough for garbage-collection
passes to stamp the transaction's versions and delete its transactions-table entry,
rule S9), then asks another gateway: ``outcome(txn_id, settle=True)``. The answer
decides the operation's completion: ABORTED makes it a ``fail`` (which the history
checks then hold it to: nobody may have read its appends), anything else keeps it
``info``: COMMITTED (the outcome call carries no commit timestamp), or "no longer
known" (``OutcomeForgottenError``, which is never an abort). A sample of commits that
ended for certain is settled late the same way, between later operations: one that was
acknowledged must never be answered ABORTED (a writer; a read-only one wrote nothing an
ABORTED entry could hide), one that definitely failed never COMMITTED.

Every late settle is a JSON line in ``p<process>.settles.jsonl`` next to the client's
events; :func:`check_late_settles` reads them all.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from percolake.tools.chaos._ops import Completion
from percolake.tools.chaos._workload import CheckResult
from txn import TransactionStatus
from txn.errors import CommitUnknownError, OutcomeForgottenError

if TYPE_CHECKING:
    from txn.remote import RemoteTransactionManager

#: Share of the commits that ended for certain (ok or fail) settled late as well.
SAMPLE: Final = 0.2
#: Gateways tried, one after another, before a late settle is recorded as unavailable.
ATTEMPTS: Final = 3
PAUSE_S: Final = 0.2
SUFFIX: Final = ".settles.jsonl"


def settles_path(events: Path) -> Path:
    return events.with_name(events.stem + SUFFIX)


class LateSettler:
    """The client side: settles unknown commits late, and a sample of the others."""

    def __init__(
        self,
        managers: Callable[[], list[RemoteTransactionManager]],
        delay_s: float,
        rng: random.Random,
        events: Path,
    ) -> None:
        self._managers = managers
        self._delay_s = delay_s
        self._rng = rng
        self._out = settles_path(events).open("a", buffering=1, encoding="utf-8")
        #: (due, start_ts, what the commit said, whether it wrote)
        self._due: deque[tuple[float, int, str, bool]] = deque()

    def _ask(self, start_ts: int) -> str:
        """``committed`` | ``aborted`` | ``forgotten`` | ``unknown`` | ``unavailable``,
        asked of another gateway than the one the client uses now (then the others)."""
        managers = self._managers()  # the one in use first
        others = managers[1:] + managers[:1]
        last = "unavailable"
        for attempt in range(ATTEMPTS):
            manager = others[attempt % len(others)]
            try:
                status = manager.outcome(str(start_ts), settle=True)
            except OutcomeForgottenError:
                return "forgotten"
            except CommitUnknownError:
                return "unknown"
            except Exception as exc:
                last = f"unavailable ({type(exc).__name__})"
                time.sleep(PAUSE_S)
                continue
            if status is TransactionStatus.COMMITTED:
                return "committed"
            if status is TransactionStatus.ABORTED:
                return "aborted"
            return f"not final ({status})"
        return last

    def _write(self, start_ts: int, was: str, wrote: bool, answer: str, waited_s: float) -> None:
        line = {
            "start_ts": start_ts,
            "was": was,
            "wrote": wrote,
            "answer": answer,
            "waited_s": round(waited_s, 3),
        }
        self._out.write(json.dumps(line, separators=(",", ":")) + "\n")

    def after(self, completion: Completion, *, wrote: bool) -> Completion:
        """What an operation's completion becomes: an unknown commit is settled late
        (this waits); a sample of the others is queued for :meth:`run_due`."""
        start_ts = completion.start_ts
        if start_ts is None:  # it never began
            return completion
        if completion.type != "info":
            if self._rng.random() < SAMPLE:
                due = time.monotonic() + self._delay_s
                self._due.append((due, start_ts, completion.type, wrote))
            return completion
        began = time.monotonic()
        time.sleep(self._delay_s)
        self.run_due()
        answer = self._ask(start_ts)
        self._write(start_ts, "info", wrote, answer, time.monotonic() - began)
        note = f"{completion.error}; settled late: {answer}"
        if answer == "aborted":
            return dataclasses.replace(completion, type="fail", error=note)
        return dataclasses.replace(completion, error=note)

    def run_due(self) -> None:
        """Settle the queued commits whose delay is up."""
        while self._due and self._due[0][0] <= time.monotonic():
            due, start_ts, was, wrote = self._due.popleft()
            answer = self._ask(start_ts)
            self._write(start_ts, was, wrote, answer, time.monotonic() - due + self._delay_s)

    def close(self) -> None:
        self._out.close()


#: What a finished pass of ``GarbageCollector`` logs (``txn._gc``), and its counts.
_PASS_LINE: Final = re.compile(
    r"garbage collection: safe point \d+.*?deleted (\d+) transactions-table entries"
)


def gc_passes(work: Path) -> dict[str, int]:
    """Passes the run's gateways and replicas finished, from their logs, and the
    transactions-table entries those passes deleted."""
    passes = entries = 0
    for path in sorted([*work.glob("gateway-*.log"), *work.glob("replica-*.log")]):
        for found in _PASS_LINE.finditer(path.read_text(errors="replace")):
            passes += 1
            entries += int(found[1])
    return {"passes": passes, "entries_deleted": entries}


def check_late_settles(clients_dir: Path) -> CheckResult:
    """No acknowledged writer answered ABORTED, no failed commit COMMITTED, late."""
    result = CheckResult("late settles")
    answers: Counter[str] = Counter()
    for path in sorted(clients_dir.glob(f"*{SUFFIX}")):
        for raw in path.read_text().splitlines():
            try:
                line: dict[str, Any] = json.loads(raw)
            except json.JSONDecodeError:
                continue  # the last line of a killed client
            was, answer = line["was"], str(line["answer"])
            answers[f"{was} {answer.split(' ', 1)[0]}"] += 1
            wrong = (
                was == "ok" and line["wrote"] and answer == "aborted",
                was == "fail" and answer == "committed",
                answer.startswith("not final"),
            )
            if any(wrong):
                result.anomalies.append(
                    {
                        "check": result.name,
                        "type": "late-settle-contradicts-commit",
                        "explanation": f"transaction {line['start_ts']} ended {was} "
                        f"(wrote: {line['wrote']}), then a late settle through another "
                        f"gateway {line['waited_s']} s later answered {answer}",
                        "start_ts": line["start_ts"],
                    }
                )
    result.stats.update(late_settles=sum(answers.values()), answers=dict(sorted(answers.items())))
    return result
