"""The ``status`` and ``gc`` commands' edges (issue 31): flags checked before any
call, why an address gave no status, and no progress bar in output nobody watches."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import grpc
import pytest

from percolake.cli import main
from percolake.serve.status import (
    TLS_FAILED,
    UNAUTHENTICATED,
    UNREACHABLE,
    ProcessStatus,
    classify,
    render,
)
from wire.auth import TlsConfig
from wire.error_codes import ServiceUnavailableError, UnauthenticatedError

pytestmark = pytest.mark.unit


def _unavailable(text: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(text, code=grpc.StatusCode.UNAVAILABLE, reason="unavailable")


def test_classify_names_why_an_address_gave_no_status() -> None:
    refused = UnauthenticatedError(
        "missing or wrong bearer token", code=grpc.StatusCode.UNAUTHENTICATED, reason="x"
    )
    assert classify(refused, None)[0] == UNAUTHENTICATED
    closed = _unavailable("failed to connect to all addresses; last error: ...: Socket closed")
    assert classify(closed, None) == (TLS_FAILED, "the server may require TLS: --tls-ca")
    state, hint = classify(closed, TlsConfig(ca_file="ca.pem"))
    assert state == TLS_FAILED and "--tls-cert" in hint
    handshake = _unavailable("Tls handshake failed (TSI_PROTOCOL_FAILURE): CERTIFICATE_VERIFY")
    assert classify(handshake, TlsConfig(ca_file="ca.pem"))[0] == TLS_FAILED
    refused_port = _unavailable("Failed to connect to remote host: Connection refused")
    assert classify(refused_port, None) == (UNREACHABLE, "")


def test_render_shows_the_state_instead_of_unreachable_for_every_failure() -> None:
    """Fails before issue 31: an authentication failure was printed as 'unreachable'."""
    out = io.StringIO()
    render(
        [ProcessStatus("127.0.0.1:1", error="UnauthenticatedError: no", state="unauthenticated")],
        out,
    )
    lines = out.getvalue().splitlines()
    assert "unauthenticated" in lines[1] and "unreachable" not in out.getvalue()
    assert lines[2] == "127.0.0.1:1: unauthenticated: UnauthenticatedError: no"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "k.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "cannot read missing.key"),
        (["--token-file", "missing-token"], "cannot read missing-token"),
    ],
)
def test_status_flags_are_checked_before_any_call(
    flags: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["status", "--gateway", "127.0.0.1:1", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_gc_draws_no_progress_bar_into_output_that_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before issue 31: tqdm drew its bar (carriage returns and all) into stderr
    whatever it was, a log file or a pipe included."""
    store = f"sqlite:///{tmp_path}/gc.db"
    assert main(["gc", "--store", store, "--grace-ms", "0"]) == 0
    captured = capsys.readouterr()
    assert "nothing to collect yet" in captured.out
    assert "\r" not in captured.err and "table" not in captured.err, captured.err

    # At a terminal the bar is drawn, so the check above means something.
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["gc", "--store", store, "--grace-ms", "0"]) == 0
    assert "gc:" in capsys.readouterr().err
