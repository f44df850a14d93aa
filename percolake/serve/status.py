"""``percolake status``: who leads a replica set, in which epoch, what each holds and
which lock calls wait longest.

Every ``percolake serve`` process answers ``ControlService.GetStatus``
(:class:`ControlServicer`); the command asks each address it is given and prints one
line per process, or JSON. An address that did not answer is told apart by why
(:func:`classify`): its token was refused, TLS failed, or it could not be reached.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TextIO

import grpc

from lockserver import LockTable, LockWait, render_descriptor
from percolake import __version__
from percolake.serve.replica import ControlPlane
from wire.auth import TlsConfig
from wire.channels import Connection, call, parse_addresses
from wire.error_codes import UnauthenticatedError, abort_with
from wire.errors import PercolakeError
from wire.v1 import control_pb2 as pb
from wire.v1 import control_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ControlService"].full_name
#: How many of a lock server's longest waits its status reports.
STATUS_LOCK_WAITS = 5


class ControlServicer(pb_grpc.ControlServiceServicer):
    """What this process says of itself: role, store, election, load.

    Its locks and lock waits are those of the table it serves: a replica set's
    leader's (``control``; a follower reports none), or a lone ``lock_table``."""

    def __init__(
        self,
        *,
        role: str,
        store: str,
        address: Callable[[], str],
        control: ControlPlane | None,
        open_transactions: Callable[[], int] = lambda: 0,
        lock_table: LockTable | None = None,
    ) -> None:
        self._role, self._store, self._address = role, store, address
        self._control = control
        self._open_transactions = open_transactions
        self._lock_table = lock_table

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        try:
            leases = []
            locks = 0
            waits: list[LockWait] = []
            if self._control is not None:
                view = self._control.view()
                leases.append(
                    pb.LeaseStatus(
                        role=view.role,
                        replica_id=view.replica,
                        leading=view.leading,
                        epoch=view.epoch or 0,
                        leader_id=view.leader or "",
                        leader_address=view.leader_address or "",
                        row_age_s=-1.0 if view.row_age_s is None else view.row_age_s,
                        lease_left_s=-1.0 if view.lease_left_s is None else view.lease_left_s,
                        lease_ms=view.lease_ms,
                    )
                )
                locks = self._control.locks_held()
                waits = self._control.lock_waits(STATUS_LOCK_WAITS)
            elif self._lock_table is not None and not self._lock_table.closed:
                locks = len(self._lock_table)
                waits = self._lock_table.waits(STATUS_LOCK_WAITS)
            return pb.GetStatusResponse(
                address=self._address(),
                role=self._role,
                store=self._store,
                leases=leases,
                open_transactions=self._open_transactions(),
                locks_held=locks,
                version=__version__,
                lock_waits=[
                    pb.LockWait(
                        owner=w.owner,
                        descriptor=w.descriptor,
                        waited_s=w.waited_s,
                        waits_for=w.waits_for or "",
                    )
                    for w in waits
                ],
            )
        except Exception as exc:
            abort_with(context, exc)


# --- the command ----------------------------------------------------------------------


#: Why an address gave no status (:attr:`ProcessStatus.state`); ``ok`` when it did.
OK = "ok"
UNAUTHENTICATED = "unauthenticated"  # it answered and refused the bearer token
TLS_FAILED = "tls-failed"  # the TLS handshake failed, or the server closed it at set-up
UNREACHABLE = "unreachable"  # no connection, or no answer within --timeout-s


@dataclass
class ProcessStatus:
    """One address's answer, or why there was none."""

    address: str
    error: str | None = None
    state: str = OK
    role: str = ""
    store: str = ""
    open_transactions: int = 0
    locks_held: int = 0
    leases: list[dict[str, object]] = field(default_factory=list)
    #: The longest lock waits, longest first: owner, descriptor (as text), waited_s,
    #: waits_for (``None``: not known).
    lock_waits: list[dict[str, object]] = field(default_factory=list)


def ask(address: str, token: str | None, tls: TlsConfig | None, timeout_s: float) -> ProcessStatus:
    conn = Connection(address, token=token, tls=tls)
    try:
        got = call(
            pb_grpc.ControlServiceStub(conn.channel).GetStatus,
            pb.GetStatusRequest(),
            conn,
            timeout_s,
        )
    except PercolakeError as exc:
        state, hint = classify(exc, tls)
        error = f"{type(exc).__name__}: {exc}" + (f" ({hint})" if hint else "")
        return ProcessStatus(address, error=error, state=state)
    finally:
        conn.close()
    return ProcessStatus(
        address=address,
        role=got.role,
        store=got.store,
        open_transactions=got.open_transactions,
        locks_held=got.locks_held,
        leases=[
            {
                "role": lease.role,
                "leading": lease.leading,
                "epoch": lease.epoch,
                "leader": lease.leader_address,
                "row_age_s": None if lease.row_age_s < 0 else round(lease.row_age_s, 3),
                "lease_left_s": None if lease.lease_left_s < 0 else round(lease.lease_left_s, 3),
                "lease_ms": lease.lease_ms,
            }
            for lease in got.leases
        ],
        lock_waits=[
            {
                "owner": wait.owner,
                "descriptor": render_descriptor(wait.descriptor),
                "waited_s": round(wait.waited_s, 3),
                "waits_for": wait.waits_for or None,
            }
            for wait in got.lock_waits
        ],
    )


def classify(exc: PercolakeError, tls: TlsConfig | None) -> tuple[str, str]:
    """Why a call failed, as a state of :data:`ProcessStatus.state`, and a hint naming
    the flag that may be missing.

    A refused token is an answer (UNAUTHENTICATED). A TLS failure reaches us only as the
    text of an UNAVAILABLE status: gRPC names a failed handshake, and a server that
    requires TLS or a client certificate, met without one, just closes the socket at
    set-up ("Socket closed"), which a reachable server does for no other reason.
    """
    if isinstance(exc, UnauthenticatedError):
        return UNAUTHENTICATED, "give the server's token: --token-file or $PERCOLAKE_TOKEN"
    text = str(exc)
    if "handshake" in text.lower():
        return TLS_FAILED, "check --tls-ca (the CA that signed the server's certificate)"
    if "Socket closed" in text:
        if tls is None:
            return TLS_FAILED, "the server may require TLS: --tls-ca"
        if tls.cert_file is None:
            return TLS_FAILED, "the server may require a client certificate: --tls-cert, --tls-key"
        return (
            TLS_FAILED,
            "the server refused the connection: is this client certificate signed by its CA?",
        )
    return UNREACHABLE, ""


def consistent(statuses: Sequence[ProcessStatus]) -> bool:
    """Every address answered and, per election role, exactly one leads."""
    if any(s.error for s in statuses):
        return False
    by_role: dict[str, int] = {}
    for status in statuses:
        for lease in status.leases:
            role = str(lease["role"])
            by_role[role] = by_role.get(role, 0) + (1 if lease["leading"] else 0)
    return all(count == 1 for count in by_role.values())


def render(statuses: Sequence[ProcessStatus], out: TextIO) -> None:
    header = ("ADDRESS", "ROLE", "ELECTS", "LEADS", "EPOCH", "LEADER", "ROW AGE", "LEASE LEFT")
    rows: list[tuple[str, ...]] = []
    for s in statuses:
        if s.error:
            rows.append((s.address, "-", "-", "-", "-", s.state, "-", "-"))
            continue
        for lease in s.leases or [{}]:
            rows.append(
                (
                    s.address,
                    s.role,
                    str(lease.get("role", "-")),
                    ("yes" if lease.get("leading") else "no") if lease else "-",
                    str(lease.get("epoch", "-")),
                    str(lease.get("leader") or "-"),
                    _seconds(lease.get("row_age_s")),
                    _seconds(lease.get("lease_left_s")),
                )
            )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
    for s in statuses:
        if s.error:
            out.write(f"{s.address}: {s.state}: {s.error}\n")
        else:
            out.write(
                f"{s.address}: store {s.store or '-'}, {s.open_transactions} open "
                f"transactions, {s.locks_held} lock batches held\n"
            )
            if s.lock_waits:
                out.write(f"{s.address}: longest lock waits:\n")
            for wait in s.lock_waits:
                out.write(
                    f"  {_seconds(wait['waited_s'])}  {wait['owner']} waits for "
                    f"{wait['waits_for'] or '-'} on '{wait['descriptor']}'\n"
                )


def _seconds(value: object) -> str:
    return "-" if value is None or value == "" else f"{float(str(value)):.2f} s"


def run_status(
    addresses: str,
    *,
    token: str | None,
    tls: TlsConfig | None,
    as_json: bool,
    timeout_s: float = 5.0,
    out: TextIO = sys.stdout,
) -> int:
    """Ask every address; exit 0 when all answered and each election has one leader."""
    statuses = [ask(a, token, tls, timeout_s) for a in parse_addresses(addresses)]
    if as_json:
        json.dump([asdict(s) for s in statuses], out, indent=2)
        out.write("\n")
    else:
        render(statuses, out)
    return 0 if consistent(statuses) else 1
