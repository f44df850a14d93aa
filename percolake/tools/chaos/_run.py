"""One chaos run from start to report.

:func:`run` is what ``percolake chaos run`` calls. When the run owns its network, it
creates a namespace and runs :func:`run_inside` in it (``ip netns exec``), bounded by a
hard timeout after which every process the run recorded is killed by pid; otherwise
it calls :func:`run_inside` directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

from percolake.tools.chaos import _network as net
from percolake.tools.chaos._checks import check_timestamps
from percolake.tools.chaos._cluster import Cluster
from percolake.tools.chaos._config import MAX_STRETCH, RunConfig
from percolake.tools.chaos._history import EventTail, merge, nemesis_events, number, write_history
from percolake.tools.chaos._late import check_late_settles, gc_passes
from percolake.tools.chaos._nemesis import Nemesis, plan
from percolake.tools.chaos._plot import latencies, plot_run
from percolake.tools.chaos._procs import PidRegistry
from percolake.tools.chaos._workload import CheckResult, make_workload

log = logging.getLogger("percolake.tools.chaos")

EXIT_CLEAN: Final = 0
EXIT_ANOMALIES: Final = 1
EXIT_BAD_INPUT: Final = 2
#: The run could not be carried out (a server or Cassandra would not start).
EXIT_HARNESS_ERROR: Final = 3

#: Progress lines on the console this often.
PROGRESS_EVERY_S: Final = 5.0
#: Bound on the final read after healing (servers restart, Cassandra nodes rejoin).
FINAL_READ_TIMEOUT_S: Final = 120.0
#: Setup allowance on top of the run's duration before the harness is killed.
SETUP_ALLOWANCE_S: Final = 600.0
CASSANDRA_START_ALLOWANCE_S: Final = 300.0


class RunInterrupted(Exception):
    """SIGTERM or SIGINT: stop, clean up, report what there is."""


def use_namespace(config: RunConfig) -> tuple[bool, str | None]:
    """Whether the run gets its own namespace, or why it cannot have the one it needs."""
    if config.netns == "off":
        if config.network_faults:
            return False, "partition and slow faults need --netns auto|on"
        return False, None
    problem = namespace_problem(config)
    if problem is None:
        return True, None
    if config.netns == "on" or config.network_faults:
        return False, problem
    return False, None


def namespace_problem(config: RunConfig) -> str | None:
    if not config.owns_store:
        return (
            "the run cannot own its network with an external store (--store cassandra://...): "
            "use --cassandra-nodes N or SQLite for partition and slow faults"
        )
    return net.namespace_support()


def hard_timeout_s(config: RunConfig) -> float:
    # Cassandra nodes start once and may be restarted by faults and at the end.
    cassandra_s = 2 * CASSANDRA_START_ALLOWANCE_S * config.cassandra_nodes
    return config.duration_s * (1 + MAX_STRETCH) + SETUP_ALLOWANCE_S + cassandra_s


def run(config: RunConfig) -> int:
    """Carry out one run; the exit code says clean (0), anomalies (1) or harness error (3)."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    config.dump(config.out_dir / "run-config.json")
    isolated, problem = use_namespace(config)
    if problem is not None:
        log.error("cannot run in a network namespace: %s", problem)
        return EXIT_BAD_INPUT
    if not isolated:
        return run_inside(config, isolated=False)
    name = f"plchaos-{os.getpid()}"
    net.create_namespace(name)
    log.info("running in network namespace %s", name)
    command = [
        *net.exec_prefix(name),
        sys.executable,
        "-m",
        "percolake.tools.chaos._inner",
        str(config.out_dir / "run-config.json"),
    ]
    proc = subprocess.Popen(command, env={**os.environ, net.NAMESPACE_ENV: name})
    try:
        return proc.wait(hard_timeout_s(config))
    except subprocess.TimeoutExpired:
        log.error("the run exceeded its hard timeout; stopping it")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        return EXIT_HARNESS_ERROR
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        raise
    finally:
        _kill_leftovers(config)
        net.delete_namespace(name)


def _kill_leftovers(config: RunConfig) -> None:
    work = config.work
    for pid in PidRegistry.kill_leftovers(work):
        log.warning("killed leftover process %d of the run", pid)
    if config.cassandra_nodes and (work / "cassandra" / "cluster.json").exists():
        from percolake.tools.cassandra import CassandraCluster

        with contextlib.suppress(Exception):
            CassandraCluster.from_dir(work / "cassandra").stop()


def run_inside(config: RunConfig, *, isolated: bool) -> int:
    """The run itself, in whatever network namespace this process is in."""
    out, work = config.out_dir, config.work
    work.mkdir(parents=True, exist_ok=True)
    config.dump(out / "run-config.json")
    file_log = _log_to_file(out / "chaos.log")
    _quiet_noisy_loggers()
    try:
        return _run_inside(config, isolated=isolated)
    finally:
        logging.getLogger().removeHandler(file_log)
        file_log.close()


def _run_inside(config: RunConfig, *, isolated: bool) -> int:
    out, work = config.out_dir, config.work

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise RunInterrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    started_at = datetime.now(UTC)
    registry = PidRegistry(work)
    network = net.Network() if isolated else None
    cluster = Cluster(config, work, registry, isolated=isolated)
    workload = make_workload(config)
    nemesis = Nemesis(cluster, network)
    schedule = plan(config, owns_cassandra=config.cassandra_nodes > 0)
    (out / "schedule.json").write_text(json.dumps([asdict(f) for f in schedule], indent=1) + "\n")
    final_ops: list[dict[str, Any]] = []
    harness_error: str | None = None
    interrupted = False
    tails: list[EventTail] = []
    healed: list[str] = []
    stop = threading.Event()
    try:
        cluster.start_store()
        cluster.start_s3()  # before the services: they are given its AWS variables
        cluster.start_services()
        setup_manager = cluster.direct_manager()
        try:
            workload.setup(setup_manager, cluster.warehouse)
        finally:
            setup_manager.close()
        # The clock starts once every client is ready (a loaded machine takes seconds
        # to start a dozen Python processes): the schedule counts from there.
        cluster.start_clients(config.duration_s)
        log.info(
            "%s run for %.0f s, seed %d, %d fault(s) planned (%s); out %s",
            config.workload,
            config.duration_s,
            config.seed,
            len(schedule),
            ",".join(config.nemeses) or "none",
            out,
        )
        progress = threading.Thread(
            target=_progress, args=(cluster, nemesis, tails, stop), daemon=True
        )
        progress.start()
        nemesis.run(schedule, stop)
        while (left := cluster.until_ns - time.monotonic_ns()) > 0:
            time.sleep(min(left / 1e9, 1.0))
        if network is not None:
            network.heal_all()
        healed = cluster.heal_processes()
        cluster.wait_clients(config.client_timeout_s * 3 + 15)
        stop.set()
        progress.join(10)
        final_ops = _final_read(cluster, workload, tails)
    except RunInterrupted as exc:
        interrupted = True
        harness_error = f"interrupted by {exc}"
        log.error("run interrupted (%s): cleaning up", exc)
    except Exception as exc:
        harness_error = f"{type(exc).__name__}: {exc}"
        log.exception("the run failed")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            if network is not None:
                network.heal_all()
        cluster.stop()
        with contextlib.suppress(Exception):
            cluster.save_cassandra_problems(out / "cassandra-warnings.log")
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return _finish(
        config,
        cluster,
        workload,
        nemesis,
        tails,
        final_ops,
        started_at,
        isolated=isolated,
        healed=healed,
        harness_error=harness_error,
        interrupted=interrupted,
    )


def _quiet_noisy_loggers() -> None:
    # The driver logs its load-balancing choice at INFO once per connection.
    logging.getLogger("cassandra").setLevel(logging.WARNING)


def _log_to_file(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    if logging.getLogger().level > logging.INFO or logging.getLogger().level == 0:
        logging.getLogger().setLevel(logging.INFO)
    return handler


_tails_lock = threading.Lock()


def _sync_tails(cluster: Cluster, tails: list[EventTail]) -> None:
    """Follow the event file of every client process started so far."""
    with _tails_lock:
        known = {t.path for t in tails}
        for client in cluster.clients:
            for path in client.events:
                if path not in known:
                    tails.append(EventTail(path))
                    known.add(path)


def _progress(
    cluster: Cluster, nemesis: Nemesis, tails: list[EventTail], stop: threading.Event
) -> None:
    counts: Counter[str] = Counter()
    while not stop.wait(PROGRESS_EVERY_S):
        _sync_tails(cluster, tails)
        with _tails_lock:
            following = list(tails)
        for tail in following:
            for event in tail.poll():
                counts[event["type"]] += 1
        elapsed = (time.monotonic_ns() - cluster.t0_ns) / 1e9
        log.info(
            "t=%5.0fs ok=%d fail=%d info=%d faults=%d%s",
            elapsed,
            counts["ok"],
            counts["fail"],
            counts["info"],
            len(nemesis.faults),
            f" (now: {nemesis.current})" if nemesis.current else "",
        )


def _final_read(cluster: Cluster, workload: Any, tails: list[EventTail]) -> list[dict[str, Any]]:
    """Read the whole state once every fault is healed; retried while servers recover."""
    _sync_tails(cluster, tails)
    ops = merge(tails, cluster.crashed, cluster.until_ns - cluster.t0_ns)
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    while True:
        manager = cluster.direct_manager()
        try:
            final: list[dict[str, Any]] = workload.final_read(manager, ops, cluster.warehouse)
            break
        except Exception as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("final read failed (%s); retrying", exc)
            time.sleep(1.0)
        finally:
            manager.close()
    now = time.monotonic_ns() - cluster.t0_ns
    for i, op in enumerate(final):
        op["time"] = now + i
    return final


def _finish(
    config: RunConfig,
    cluster: Cluster,
    workload: Any,
    nemesis: Nemesis,
    tails: list[EventTail],
    final_ops: list[dict[str, Any]],
    started_at: datetime,
    *,
    isolated: bool,
    healed: list[str],
    harness_error: str | None,
    interrupted: bool,
) -> int:
    out = config.out_dir
    _sync_tails(cluster, tails)
    end_ns = max(cluster.until_ns - cluster.t0_ns, 0)
    client_ops = merge(tails, cluster.crashed, end_ns)
    ops = number(
        sorted(
            [*client_ops, *nemesis_events(nemesis.faults)],
            key=lambda e: (e["time"], 0 if e["type"] != "invoke" else 1),
        )
        + final_ops
    )
    history_path = write_history(out / workload.history_name, ops, gzipped=config.gzip_history)
    checked = [op for op in ops if op["process"] != "nemesis"]
    checks: list[CheckResult] = []
    if harness_error is None and final_ops:
        log.info("checking %d operations", len(checked))
        checks = workload.check(checked)
        timestamps = check_timestamps(checked)
        if timestamps.stats["transactions_with_timestamps"]:  # lakehouse ops carry none
            checks.append(timestamps)
        if config.late_settle_s is not None:
            checks.append(check_late_settles(config.work / "clients"))
        # An embedded oracle leads without exporting metrics: the count would be 0.
        if cluster.leader_metrics is not None and not config.embedded:
            checks.append(cluster.leader_metrics.check(nemesis.faults, end_ns / 1e9))
    anomalies = [a for c in checks for a in c.anomalies]
    completions = [op for op in client_ops if op["type"] != "invoke"]
    by_type = Counter(op["type"] for op in completions)
    points = latencies(client_ops)
    ok_latencies = sorted(lat for _, lat, kind in points if kind == "ok")
    elapsed_s = end_ns / 1e9
    errors = Counter(
        str(op.get("error", "")).split(":", 1)[0] for op in completions if op["type"] != "ok"
    )
    report: dict[str, Any] = {
        "workload": config.workload,
        "seed": config.seed,
        "duration_s": config.duration_s,
        # How much longer the clients ran than planned because faults ran late.
        "stretched_s": round(max(0.0, elapsed_s - config.duration_s), 3),
        "isolation": config.isolation,
        "pessimistic": config.pessimistic,
        "valid": harness_error is None and not anomalies,
        "ops_ok": by_type["ok"],
        "ops_fail": by_type["fail"],
        "ops_info": by_type["info"],
        "ops_total": len(completions),
        "ok_per_s": round(by_type["ok"] / elapsed_s, 1) if elapsed_s else 0.0,
        "latency_ok_ms": _percentiles(ok_latencies),
        "faults": nemesis.faults,
        "fault_counts": dict(
            Counter(f"{f['kind']} {f['target'].split('-')[0]}" for f in nemesis.faults)
        ),
        "anomalies": anomalies,
        "checks": {c.name: c.to_json() for c in checks},
        "errors": dict(errors.most_common(15)),
        "crashed_processes": len(cluster.crashed),
        "gc": gc_passes(config.work) if config.gc_interval_s is not None else None,
        "healed_at_end": healed,
        "harness_error": harness_error,
        "cluster": {
            "store": cluster.store_url,
            "cassandra_nodes": config.cassandra_nodes,
            "gateways": config.gateways,
            "clients": config.clients,
            "rate": config.rate,
            "client_modes": [c.mode for c in cluster.clients],
            "network_namespace": isolated,
            "lease_ms": config.lease_ms,
            "replicas": config.replicas,
            "leader_lease_ms": config.leader_lease_ms,
            "replica_addresses": cluster.replica_names(),
            "store_reconnect_ms": config.store_reconnect_ms,
            "warehouse": cluster.warehouse,
        },
        "leaders": (
            cluster.leader_watch.summary(
                cluster.replica_names(), [replica.tail(10**8) for replica in cluster.replicas]
            )
            if cluster.leader_watch is not None and config.replicas
            else None
        ),
        "leader_metrics": (
            cluster.leader_metrics.summary(nemesis.faults, end_ns / 1e9)
            if cluster.leader_metrics is not None
            else None
        ),
        "nemesis": list(config.nemeses),
        "broken_protocol": config.unsafe_broken_protocol,
        "no_oracle_claim": config.unsafe_no_oracle_claim,
        "leader_ignores_lease": config.unsafe_leader_ignores_lease,
        "started_at": started_at.isoformat(timespec="seconds"),
        "wall_s": round((datetime.now(UTC) - started_at).total_seconds(), 1),
        "history": history_path.name,
        "replay": replay_command(config),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    plot = None
    if config.plot:
        plot = plot_run(
            out / "plot.png",
            client_ops,
            nemesis.faults,
            f"{config.workload} ({config.isolation}), seed {config.seed}, "
            f"nemesis {','.join(config.nemeses) or 'none'}: {by_type['ok']} ok, "
            f"{len(anomalies)} anomalies",
            max(elapsed_s, 1.0),
        )
    report["plot"] = plot.name if plot is not None else None
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    _print_summary(report, checks, out)
    if interrupted or harness_error is not None:
        return EXIT_HARNESS_ERROR
    return EXIT_ANOMALIES if anomalies else EXIT_CLEAN


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)

    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "max": at(1.0)}


def _print_summary(report: dict[str, Any], checks: list[CheckResult], out: Path) -> None:
    verdict = "CLEAN" if report["valid"] else "ANOMALIES FOUND"
    if report["harness_error"]:
        verdict = f"HARNESS ERROR: {report['harness_error']}"
    lines = [
        f"chaos {report['workload']} seed {report['seed']}: {verdict}",
        f"  ops ok {report['ops_ok']}, fail {report['ops_fail']}, info {report['ops_info']} "
        f"({report['ok_per_s']} ok/s); faults {len(report['faults'])}: {report['fault_counts']}",
    ]
    leaders = report.get("leaders")
    if leaders:
        lines.append(
            f"  leaders: epochs {leaders['first_epoch']}..{leaders['last_epoch']}, "
            f"{leaders['leader_changes']} change(s), {leaders['deposed']} depose(s), "
            f"held by {','.join(leaders['leaders'])}"
        )
    for check in checks:
        lines.append(
            f"  {'ok ' if check.valid else 'BAD'} {check.name}: {len(check.anomalies)} anomalies"
        )
    for anomaly in report["anomalies"][:5]:
        lines.append(f"    - {anomaly.get('type')}: {str(anomaly.get('explanation', ''))[:200]}")
    lines.append(f"  report {out / 'report.json'}")
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    sys.stderr.write(text)


def replay_command(config: RunConfig) -> str:
    """The command line that replays this run (same seed, same shape, same schedule)."""
    parts = [
        "percolake chaos run",
        f"--workload {config.workload}",
        f"--nemesis {','.join(config.nemeses) or 'none'}",
        f"--duration-s {config.duration_s:g}",
        f"--seed {config.seed}",
        f"--isolation {config.isolation}",
        f"--gateways {config.gateways}",
        f"--clients {config.clients}",
        f"--fault-gap-s {config.fault_gap_s:g}",
        *([f"--rate {config.rate:g}"] if config.rate is not None else []),
        f"--lease-ms {config.lease_ms}",
        f"--client-timeout-s {config.client_timeout_s:g}",
        f"--active-keys {config.active_keys}",
    ]
    if config.pessimistic:
        parts.append("--pessimistic")
    if config.replicas:
        parts.append(f"--replicas {config.replicas}")
    if config.replicas or config.leader_lease_ms != 2000:
        parts.append(f"--leader-lease-ms {config.leader_lease_ms}")
    if config.workload == "timestamps":
        parts.append(f"--ts-call-timeout-s {config.ts_call_timeout_s:g}")
    if config.store_reconnect_ms:
        parts.append(f"--store-reconnect-ms {config.store_reconnect_ms}")
    if config.cassandra_nodes:
        parts.append(f"--cassandra-nodes {config.cassandra_nodes}")
    if config.store_url:
        parts.append(f"--store {shlex.quote(config.store_url)}")
    if config.gc_interval_s is not None:
        parts.append(
            f"--gc-interval-s {config.gc_interval_s:g} --gc-retention-s {config.gc_retention_s:g}"
        )
    if config.gc_grace_ms is not None:
        parts.append(f"--gc-grace-ms {config.gc_grace_ms}")
    if config.late_settle_s is not None:
        parts.append(f"--late-settle-s {config.late_settle_s:g}")
    if config.lakehouse_log_retention_s is not None:
        parts.append(f"--lakehouse-log-retention-s {config.lakehouse_log_retention_s:g}")
    if config.warehouse != "local":
        parts.append(f"--warehouse {config.warehouse}")
    if config.unsafe_broken_protocol:
        parts.append("--unsafe-broken-protocol")
    if config.unsafe_no_oracle_claim:
        parts.append("--unsafe-no-oracle-claim")
    if config.unsafe_leader_ignores_lease:
        parts.append("--unsafe-leader-ignores-lease")
    parts.append(f"--out {shlex.quote(str(config.out_dir))}")
    return " ".join(parts)


def main_inner(config_path: str) -> int:
    """Entry point inside the namespace (``python -m percolake.tools.chaos._inner``)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not net.in_run_namespace():
        log.error("refusing to run the network-fault harness outside its own namespace")
        return EXIT_HARNESS_ERROR
    config = RunConfig.load(Path(config_path))
    return run_inside(config, isolated=True)
