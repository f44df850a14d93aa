"""Short chaos runs: real processes, real faults, checked histories (``percolake chaos``).

Each test runs ``python -m percolake.tools.chaos run`` as a separate process, exactly as an
operator would, and reads the report it writes. The runs are short (seconds), so
these tests show that the harness works and that the system survives its faults;
``make chaos`` runs the long ones. The broken-build tests show that the harness can
fail: against gateways that commit without locks and check for conflicts before
writing, with two oracles serving one store at once, or with a leader that serves
without checking its lease, the same kind of run must report anomalies.

The replicated control plane (``--replicas 3``: three ``percolake serve`` on one store,
one leading) runs with its own faults: the leader killed, paused past its lease, cut off
by a partition, every replica restarted in turn; and the timestamps workload (AtlasDB
TimeLock's Jepsen test) checks the oracle's answers themselves: unique, and in
real-time order across every replica.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from percolake.tools.chaos import MAX_STRETCH, RunConfig
from percolake.tools.chaos._lakehouse import LakehouseAppends
from percolake.tools.chaos._network import namespace_support
from percolake.tools.chaos._ops import FINAL_PROCESS
from percolake.tools.chaos._workload import CheckResult
from percolake.tools.checker import check_file, check_timestamp_file
from storage_adapters import open_store
from txn.tables import read_state

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
#: Garbage collection in every gateway at retention 0: a pass about every 0.7 s, so an
#: entry is collected within a second or two of its commit.
BUSY_GC = ("--gc-interval-s", "0.5", "--gc-retention-s", "0", "--gc-grace-ms", "200")
#: Setup (servers, Cassandra) plus checking, on top of a run's own duration.
OVERHEAD_S = 150
#: Operations per second the clients of a run start, all together (``--rate``, Jepsen's
#: stagger). Unbounded, the clients are closed loops that took all the CPU they could
#: get: on two cores that slowed the tests running beside a chaos run in the other
#: worker (issue 29's suite time). Closed loops are kept where a check needs
#: contention or volume: the bank runs (at 50/s, ci27: the broken bank build went
#: uncaught, 204 ok and no anomaly; the clean run made 142 ok against 150; the
#: pessimistic run had no deadlock victim), the broken-build runs, the timestamps runs
#: and the two-oracle run (calls landing in a stale leader's short window).
RATE = 50


def chaos_run(
    out: Path,
    *args: str,
    duration_s: int,
    expect_exit: int = 0,
    rate: int | None = RATE,
    plot: bool = False,
) -> dict[str, Any]:
    """Run ``percolake chaos run`` in a subprocess; return its report.

    Without its plot unless ``plot``: drawing it costs a run 1.4-1.7 CPU-s (matplotlib),
    and the tests read the report; one test checks the plot."""
    command = [
        sys.executable,
        "-m",
        "percolake.tools.chaos",
        "run",
        "--duration-s",
        str(duration_s),
        "--out",
        str(out),
        *(["--rate", str(rate)] if rate is not None else []),
        *([] if plot else ["--no-plot"]),
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLAKE_UNSAFE_")}
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=duration_s * (1 + MAX_STRETCH) + OVERHEAD_S,
        check=False,
    )
    log = (result.stdout + result.stderr)[-6000:]
    assert (out / "report.json").exists(), f"no report (exit {result.returncode}):\n{log}"
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert result.returncode == expect_exit, (
        f"exit {result.returncode}, expected {expect_exit}: "
        f"{json.dumps(report['anomalies'][:3], indent=1)}\n{log}"
    )
    return report


def assert_clean(report: dict[str, Any], *, min_ok: int, min_faults: int) -> None:
    assert report["harness_error"] is None, report["harness_error"]
    assert report["anomalies"] == [], json.dumps(report["anomalies"][:3], indent=1)
    assert report["valid"] is True
    assert report["ops_ok"] >= min_ok, f"too little progress to mean anything: {report['ops_ok']}"
    assert len(report["faults"]) >= min_faults, report["faults"]
    assert all("error" not in f and "heal_error" not in f for f in report["faults"]), report[
        "faults"
    ]
    for key in ("workload", "seed", "duration_s", "ops_ok", "ops_fail", "ops_info", "faults"):
        assert key in report
    assert all(check["valid"] for check in report["checks"].values()), report["checks"]


#: Garbage collection in every gateway of the runs below: a pass every 2 s, keeping what
#: transactions younger than 1 s read (issue 17: the chaos suite runs with GC).
GC = ("--gc-interval-s", "2", "--gc-retention-s", "1")


def assert_collected(out: Path) -> None:
    """The run's gateways swept: the store's safe point rose and a pass finished."""
    store = open_store(f"sqlite:///{out / 'work' / 'data.db'}")
    try:
        state, _ = read_state(store)
    finally:
        store.close()
    assert state.safe_point > 0 and state.collected_below > 0, state
    assert state.last_pass.get("tables", 0) >= 1, state.last_pass


def test_kill_and_pause_on_the_embedded_store_leave_a_clean_history(tmp_path: Path) -> None:
    out = tmp_path / "run"
    report = chaos_run(
        out,
        "--workload",
        "list-append",
        "--nemesis",
        "kill,pause",
        # 14 s (was 20 with seed 7, issue 29's suite time): seed 229 plans seven faults
        # by 11.4 s, both kinds early: kill gateway-1 at 1.0 s, pause locks at 2.3 s,
        # kill tso 4.7 s, kill client-0 5.8 s, pause locks 7.9 s, kill tso 9.4 s, pause
        # client-1 11.4 s.
        "--seed",
        "229",
        "--fault-gap-s",
        "1",
        *GC,
        duration_s=14,
        plot=True,
    )
    # 120 ok operations (500 in the 20 s run): 426 in 14 s at load 12 on 2 cores, but
    # 155 in ci17 at load 12-13; a degenerate run (every transaction failing) makes a
    # handful.
    assert_clean(report, min_ok=120, min_faults=4)
    assert_collected(out)
    assert {f["kind"] for f in report["faults"]} == {"kill", "pause"}
    assert set(report["checks"]) == {
        "list-append serializable",
        "list-append final state",
        "oracle timestamps",
    }
    # The history on disk is Elle's format and passes the checker on its own.
    assert check_file(out / "history.jsonl", "serializable").valid
    assert (out / "plot.png").stat().st_size > 10_000
    assert report["replay"].startswith("percolake chaos run --workload list-append")


def test_late_settles_after_collection_at_retention_0_leave_a_clean_history(
    tmp_path: Path,
) -> None:
    """Issue 30 items 1 and 4: garbage collection at retention 0 with a 200 ms grace in
    every gateway (a pass about every 0.7 s, so a transaction's entry is collected
    within a second or two of its commit), gateways killed mid-commit, and clients that
    settle late: a commit whose outcome is unknown is asked again 3 s later through
    another gateway, and so is a fifth of the others. An ABORTED answer for a writer
    that was acknowledged is an anomaly of the "late settles" check; one for an unknown
    commit makes it a failure, which the history checks then hold it to.

    Fails on the code before 94be154 (settling wrote ABORTED once the entry was
    collected): the same run of that build reported 25 "late-settle-contradicts-commit"
    anomalies (acknowledged writers answered ABORTED by a late settle).
    """
    out = tmp_path / "late"
    report = chaos_run(
        out,
        "--workload",
        "list-append",
        "--nemesis",
        "kill",
        "--seed",
        "57",
        "--fault-gap-s",
        "1",
        *BUSY_GC,
        "--late-settle-s",
        "3",
        # 12 s (was 25 with seed 11, then 18; issue 29's suite time): seed 57 plans six
        # kills by 9.7 s, four of them gateways (at 3.1, 4.8, 5.9 and 7.8 s), so their
        # late settles (3 s on) fall inside the run (`percolake chaos plan ...`).
        duration_s=12,
        # Closed loops: the late settles are a fifth of the commits that ended in the
        # first 9 s, and at 50 operations a second ci28 made 9 of them (floor 10).
        rate=None,
    )
    # 100 (was 200 for an 18 s run): 176 in ci17 at load 12-13 with other sessions
    # running; a degenerate run (every transaction failing) makes a handful.
    assert_clean(report, min_ok=100, min_faults=4)
    assert_collected(out)
    # ``--no-plot`` (chaos_run's default): no plot, and the report says so.
    assert report["plot"] is None and not (out / "plot.png").exists()
    assert report["fault_counts"].get("kill gateway", 0) >= 2, report["fault_counts"]
    # Passes ran and collected entries while clients settled late.
    assert report["gc"]["passes"] >= 5, report["gc"]
    assert report["gc"]["entries_deleted"] > 0, report["gc"]
    late = report["checks"]["late settles"]
    assert late["late_settles"] >= 10, late
    answers = late["answers"]
    assert sum(n for kind, n in answers.items() if kind.startswith("ok ")) > 0, answers
    # Some acknowledged commits were settled after their entry was collected: answered
    # from their stamps or "no longer known", never ABORTED (the check above).
    assert "--late-settle-s 3" in report["replay"] and "--gc-grace-ms 200" in report["replay"]


def test_bank_transfers_add_up_under_kills_and_pauses(tmp_path: Path) -> None:
    report = chaos_run(
        tmp_path / "bank",
        "--workload",
        "bank",
        "--isolation",
        "snapshot",
        "--nemesis",
        "kill,pause",
        # 10 s (was 15 with seed 3, issue 29's suite time): seed 131 plans five faults by
        # 7.8 s (kill tso 1.0 s, pause locks 2.1 s, kill locks 4.3 s, kill client-0 5.8 s,
        # pause client-3 7.8 s); seed 3 planned four by 10.7 s.
        "--seed",
        "131",
        "--fault-gap-s",
        "1",
        *GC,
        duration_s=10,
        rate=None,
    )
    # 196 and 118 with three xdist workers (ci21, ci22), 300+ with two; a degenerate run
    # makes a handful.
    assert_clean(report, min_ok=150, min_faults=3)
    assert_collected(tmp_path / "bank")
    assert report["checks"]["bank reads"]["checked_reads"] > 50
    assert (tmp_path / "bank" / "bank.jsonl").exists()


def test_partitions_and_a_slow_network_leave_a_clean_history(tmp_path: Path) -> None:
    problem = namespace_support()
    if problem is not None:
        pytest.skip(f"network faults need a network namespace: {problem}")
    report = chaos_run(
        tmp_path / "net",
        "--workload",
        "list-append",
        "--nemesis",
        "partition,slow",
        # 14 s (was 20 with seed 4, issue 29's suite time): seed 218 plans four faults
        # by 11.6 s: partition tso at 1.0 s, partition locks 4.0 s, slow network 7.0 s,
        # partition locks 11.6 s.
        "--seed",
        "218",
        "--fault-gap-s",
        "0.5",
        duration_s=14,
    )
    # 100 (was 200): ci43 made 188 at load 15-30 with a clean history; the floor only
    # tells a degenerate run (every transaction failing makes a handful) from a real one.
    assert_clean(report, min_ok=100, min_faults=3)
    assert report["cluster"]["network_namespace"] is True
    assert {f["kind"] for f in report["faults"]} <= {"partition", "slow"}


def test_lakehouse_versions_stay_whole_under_client_kills(tmp_path: Path) -> None:
    """Also with retention (issue 17): a 2 s log retention, and clients that expire the
    table now and then, so versions expire under the kills, pauses and GC passes; the
    checks start at the oldest retained version and must find that it rose above 0."""
    pytest.importorskip("pyspark")
    report = chaos_run(
        tmp_path / "lh",
        "--workload",
        "lakehouse",
        "--nemesis",
        "kill,pause",
        "--seed",
        "5",
        # Six clients: enough of them reach one gateway's lakehouse service together
        # for its group commit to form groups under the faults.
        "--clients",
        "6",
        "--fault-gap-s",
        "1",
        "--lakehouse-log-retention-s",
        "2",
        *GC,
        # 15 s (was 20, issue 29's suite time): seed 5 plans six faults by 10.3 s (kill
        # tso 1.0 s, kill locks 1.9 s, kill gateway-1 4.2 s, kill tso 5.8 s, pause tso
        # 7.5 s, kill client-5 10.3 s); expiry needs versions replaced 2 s before an
        # expire op, which the checks below show.
        duration_s=15,
    )
    # The floor only says the clients ran (the checks below carry the test): 97 ok
    # operations at full-suite load in a CI run of 2026-11-27, when it was 100.
    assert_clean(report, min_ok=60, min_faults=3)
    checks = report["checks"]
    # Versions 0..latest were committed; those below oldest_retained expired since.
    assert checks["lakehouse versions"]["latest_version"] > 20
    assert checks["lakehouse reads"]["checked_reads"] > 10
    # Versions expired during the run, and clients' expire ops ran (they delete rows
    # only past a checkpoint, every 100 versions; log records stay with the marks).
    assert checks["lakehouse expiry"]["oldest_retained"] > 0, checks["lakehouse expiry"]
    assert checks["lakehouse expiry"]["expire_ops"] > 0, checks["lakehouse expiry"]
    assert "--lakehouse-log-retention-s 2" in report["replay"]
    # Row deletes and compactions (issue 26) ran beside the appends and were checked:
    # two runs at load 13-21 had 6-8 deletes and 8-9 compactions, 0-2 of each
    # committed (most failed while the lock server was down).
    rewrites = checks["lakehouse rewrites"]
    for op in ("delete", "compact"):
        assert sum(rewrites[f"{op}_{kind}"] for kind in ("ok", "fail", "info")) > 0, rewrites


def test_s3_faults_need_an_s3_warehouse_and_a_missing_object_is_an_anomaly(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="needs --workload lakehouse --warehouse s3"):
        RunConfig(workload="lakehouse", out_dir=tmp_path, nemeses=("kill", "s3-kill"))
    with pytest.raises(ValueError, match="applies to --workload lakehouse only"):
        RunConfig(workload="bank", out_dir=tmp_path, warehouse="s3")
    with pytest.raises(ValueError, match="unknown warehouse 'gcs'"):
        RunConfig(workload="lakehouse", out_dir=tmp_path, warehouse="gcs")  # type: ignore[arg-type]
    missing = "_lh_job=3-7/part-1-of-4.parquet"
    check = LakehouseAppends._check_objects({"named": 4, "stored": 3, "missing": [missing]})
    assert not check.valid
    assert [a["type"] for a in check.anomalies] == ["missing-object"]
    assert missing in check.anomalies[0]["explanation"]
    assert LakehouseAppends._check_objects({"named": 4, "stored": 5, "missing": []}).valid


def test_a_group_commit_after_a_stamped_version_is_consecutive(tmp_path: Path) -> None:
    """Found by the S3 chaos run: versions 36 and 37 of one group commit, both stamped
    with its commit_ts after a stamped version 35, were flagged as a transaction split
    by another (the check compared with version 35's transaction, not 36's)."""
    commits = [
        {
            "version": version,
            "commit_ts": commit_ts,
            "txn_start_ts": txn,
            "app_id": f"app-{version}",
            "batch_id": version,
            "added": [f"t/_lh_job={version}/part-0-of-1.parquet"],
            "removed": 0,
        }
        for version, txn, commit_ts in [
            (0, 4, 5),
            (1, 10, 11),
            (2, 20, 21),
            (3, 20, 21),
            (4, 30, 31),
        ]
    ]
    workload = LakehouseAppends(RunConfig(workload="lakehouse", out_dir=tmp_path))
    result = CheckResult("lakehouse versions")
    workload._check_versions(result, commits, [p for c in commits for p in c["added"]])
    assert result.valid, result.anomalies
    assert result.stats["grouped_versions"] == 2
    split = [*commits[:3], {**commits[4], "version": 3}, {**commits[3], "version": 4}]
    result = CheckResult("lakehouse versions")
    workload._check_versions(result, split, [p for c in split for p in c["added"]])
    assert "group-not-consecutive" in {a["type"] for a in result.anomalies}


@pytest.mark.s3  # the run starts its own MinIO: -m "not s3" leaves it out
def test_lakehouse_on_s3_stays_whole_and_names_only_stored_objects_under_s3_faults(
    tmp_path: Path,
) -> None:
    """Issue 25: the table in a bucket of the run's own MinIO, which is paused (SIGSTOP)
    and killed -9 while clients put their files' objects and commit them. Writes cut by
    a kill fail before anything is committed; the checks find every version whole and
    every file the final versions name in the bucket. Six runs of this seed reached
    48-213 ok operations (48-69 on a machine at load 14 on 2 cores, where MinIO is
    down for most of the run), 17-27 failed writes and 4 faults (2 of each kind)."""
    pytest.importorskip("pyspark")
    report = chaos_run(
        tmp_path / "lh-s3",
        "--workload",
        "lakehouse",
        "--warehouse",
        "s3",
        "--nemesis",
        "s3-pause,s3-kill",
        "--seed",
        "1",
        "--fault-gap-s",
        "1",
        duration_s=15,
    )
    assert_clean(report, min_ok=20, min_faults=2)
    assert {f["kind"] for f in report["faults"]} == {"s3-pause", "s3-kill"}, report["faults"]
    assert report["cluster"]["warehouse"] == "s3://chaos/warehouse"
    # The faults reached the writes: some failed while the server was down.
    assert report["ops_fail"] >= 1, report["errors"]
    objects = report["checks"]["lakehouse objects"]
    assert objects["missing"] == 0 and objects["named"] >= 40, objects
    assert "--warehouse s3" in report["replay"]


@pytest.fixture
def cassandra_store(request: pytest.FixtureRequest) -> list[str]:
    """Arguments that put a run on one Cassandra node.

    The session's node (``tests.cassandra_plugin``) when the plugin is registered;
    otherwise the run starts a node of its own through the launcher.
    """
    if os.environ.get("PERCOLAKE_SKIP_CASSANDRA"):
        pytest.skip("PERCOLAKE_SKIP_CASSANDRA is set")
    try:
        cluster = request.getfixturevalue("cassandra_cluster")
    except pytest.FixtureLookupError:
        return ["--cassandra-nodes", "1"]
    keyspace = f"chaos_{os.getpid()}"
    return ["--store", cluster.store_url(keyspace, replication_factor=1), "--netns", "off"]


@pytest.mark.cassandra
def test_kill_and_pause_on_one_cassandra_node_leave_a_clean_history(
    tmp_path: Path, cassandra_store: list[str]
) -> None:
    report = chaos_run(
        tmp_path / "cassandra",
        "--workload",
        "list-append",
        "--nemesis",
        "kill,pause",
        # 16 s (was 25 with seed 9, issue 29's suite time): seed 131 plans five faults by
        # 9.3 s (kill tso 1.0 s, pause locks 2.4 s, kill locks 5.0 s, kill client-0
        # 6.8 s, pause client-3 9.3 s); seed 9 planned its third at 10.2 s.
        "--seed",
        "131",
        "--fault-gap-s",
        "1.5",
        # Garbage collection in the gateways, so that its Cassandra paths (entries
        # deleted at their write times, outcomes read from one replica; issue 27) run
        # under the faults too.
        *BUSY_GC,
        *cassandra_store,
        duration_s=16,
    )
    # 50 ok operations (100 in the 25 s run): 72 in 16 s and 90 in 14 s with the
    # machine at load 13 on 2 cores, where the 25 s run would have made about 110.
    assert_clean(report, min_ok=50, min_faults=3)
    assert report["cluster"]["store"].startswith("cassandra://")
    assert report["gc"]["passes"] >= 2, report["gc"]
    assert report["gc"]["entries_deleted"] > 0, report["gc"]


BROKEN_BUILD_FINDS = {
    # Two writers that both check before either writes both commit: lost updates.
    "list-append": {"lost-update", "G0", "G1c", "G-single", "lost-acknowledged-write"},
    "bank": {"wrong-total", "lost-or-phantom-transfer", "negative-balance"},
    "lakehouse": {
        "lost-acknowledged-commit",
        "wrong-version",
        "version-order",
        "read-not-version",
        "duplicate-batch",
    },
}


@pytest.mark.parametrize("workload", sorted(BROKEN_BUILD_FINDS))
def test_a_broken_commit_protocol_is_caught(tmp_path: Path, workload: str) -> None:
    """The proof that the harness can fail: no locks, conflict check before write."""
    if workload == "lakehouse":
        pytest.importorskip("pyspark")
    out = tmp_path / "broken"
    report = chaos_run(
        out,
        "--workload",
        workload,
        "--isolation",
        "snapshot",
        "--nemesis",
        "none",
        "--seed",
        "1",
        "--clients",
        "4",
        "--unsafe-broken-protocol",
        # 5 s (was 8, issue 29's suite time): the 8 s runs found 152 (list-append), 555
        # (bank) and 99 (lakehouse) anomalies with the machine at load 13 on 2 cores.
        duration_s=5,
        expect_exit=1,
        rate=None,
    )
    assert report["broken_protocol"] is True
    assert report["valid"] is False
    found = {a["type"] for a in report["anomalies"]}
    assert found & BROKEN_BUILD_FINDS[workload], found
    if workload == "list-append":
        assert not check_file(out / "history.jsonl", "snapshot-isolation").valid


#: The oracle-overlap runs: the same workload, faults and seed, with and without the claim.
ORACLE_OVERLAP = (
    *("--workload", "list-append", "--isolation", "snapshot"),
    *("--nemesis", "oracle-overlap", "--seed", "11", "--fault-gap-s", "1"),
)


def test_a_second_oracle_during_a_restart_fails_fast_and_the_history_stays_clean(
    tmp_path: Path,
) -> None:
    """Rule S7 under careless restarts: each new oracle starts while the old one serves.

    (The name is what docs/design/protocol.md cites; the newcomer no longer fails, it follows.)

    Before leader leases the newcomer had to exit on the store's file lock; now a second
    ``percolake serve`` on the store is a replica. It starts, finds the old oracle's
    lease renewed and follows: the client process moved to it is served through it by
    the old oracle, which leads throughout (the store's leader row names it before,
    during and after every overlap, in the same epoch). The test below shows that the
    checks catch two oracles that each serve alone.
    """
    # 15 s (was 20, issue 29's suite time): seed 11 plans 4 overlaps by 10.3 s.
    report = chaos_run(tmp_path / "overlap", *ORACLE_OVERLAP, duration_s=15)
    assert_clean(report, min_ok=200, min_faults=3)
    overlaps = report["faults"]
    assert {f["kind"] for f in overlaps} == {"oracle-overlap"}
    epochs = set()
    for fault in overlaps:
        assert fault["newcomer"] == "follower", fault
        before, after = fault["leader_before"], fault["healed"]["leader_after"]
        assert before["name"] == after["name"] == "tso", fault
        assert before["epoch"] == after["epoch"] and after["live"], fault
        assert fault["healed"]["newcomer_led"] is False, fault
        epochs.add(after["epoch"])
    assert len(epochs) == 1, epochs
    # The moved client was served through a newcomer (forwarded to the leader).
    assert any(f["healed"]["moved_client_progressed"] for f in overlaps), overlaps
    assert report["checks"]["oracle timestamps"]["transactions_with_timestamps"] > 200


def test_two_oracles_serving_one_store_are_caught(tmp_path: Path) -> None:
    """The same overlaps with the file lock switched off (test-only build): both serve.

    A client process that reconnects during the overlap takes timestamps a window above
    the old oracle's, so transactions of the old oracle commit below snapshots that
    began before them: stale start timestamps and read skew.
    """
    report = chaos_run(
        tmp_path / "overlap-broken",
        *ORACLE_OVERLAP,
        "--unsafe-no-oracle-claim",
        # 10 s (was 20, issue 29's suite time): seed 11 plans overlaps at 1.0, 3.8 and
        # 7.0 s; the first alone already gives stale start timestamps and
        # timestamp-order anomalies (each overlap also waits until the moved client
        # has completed an operation, which made the 20 s run last 49 s under load).
        duration_s=10,
        expect_exit=1,
        rate=None,
    )
    assert report["no_oracle_claim"] is True
    assert all(f["newcomer"] == "serving" for f in report["faults"]), report["faults"]
    found = {a["type"] for a in report["anomalies"]}
    assert "stale-start-timestamp" in found, found
    assert found & {"G-single", "G-nonadjacent", "G1c", "timestamp-order", "lost-update"}, found


#: Replicas of the control plane in the runs below: three, a short leader lease so that
#: a run of seconds sees several terms.
REPLICAS = ("--replicas", "3", "--leader-lease-ms", "1000")


def assert_leader_changed(report: dict[str, Any], *, at_least: int) -> None:
    leaders = report["leaders"]
    assert leaders is not None, report["cluster"]
    assert leaders["last_epoch"] > leaders["first_epoch"], leaders
    assert leaders["leader_changes"] >= at_least, leaders
    assert report["cluster"]["replicas"] == 3


def _write_locked_pause(fault: dict[str, Any]) -> bool:
    """A leader pause that caught the leader inside a SQLite write transaction: nobody
    could take over while it held the file (docs/design/limits.md), and once awake it
    may renew and lead on, which is safe (nobody else led meanwhile; the history and
    leader-metrics checks still hold the run to that). ci43 saw a takeover 0.3 s after
    such a resume, a session-17 CI run none in 14 s."""
    return fault["kind"] == "leader-pause" and bool(fault["healed"].get("store_write_locked"))


def test_a_replicated_control_plane_survives_leader_kills_pauses_and_rolling_restarts(
    tmp_path: Path,
) -> None:
    """Three replicas on SQLite, list-append through gateways given every replica's
    address, the replicas' own gateways and in-process committers: the leader killed
    and restarted on its port, paused past its lease, every replica restarted in turn.
    Each takes leadership elsewhere (new epochs: a fresh oracle term above the old
    bound, a fresh lock table); the history stays serializable."""
    report = chaos_run(
        tmp_path / "replicas",
        "--workload",
        "list-append",
        "--nemesis",
        "leader-kill,leader-pause,rolling-restart",
        # Seed 7 plans the three kinds first (at 1.0, 2.6 and 6.4 s; in 25 s one more
        # pause at 19.4 s). Faults run late when a heal waits for a new leader, and those
        # still waiting at the end are dropped: under full-suite load seed 8, whose
        # rolling restart came fifth at 16.4 s, lost it (CI 2026-11-26). 20 s (was 25,
        # issue 29's suite time) leaves the rolling restart 13.6 s to begin, and after it
        # (about 8 s) quiet time for the conclusive leader-metrics samples below: 29-30
        # at 17 s with the machine at load 12-13, 34-40 at 25 s.
        "--seed",
        "7",
        "--fault-gap-s",
        "1",
        *REPLICAS,
        duration_s=20,
    )
    assert_clean(report, min_ok=150, min_faults=3)
    assert {f["kind"] for f in report["faults"]} == {
        "leader-kill",
        "leader-pause",
        "rolling-restart",
    }
    # One change per fault, less a pause the leader slept through holding the file.
    locked = sum(_write_locked_pause(f) for f in report["faults"])
    assert_leader_changed(report, at_least=3 - locked)
    assert set(report["checks"]) == {
        "list-append serializable",
        "list-append final state",
        "oracle timestamps",
        "leader metrics",
    }
    # Every replica's percolake_is_leader was scraped through the run (issue 31): never
    # two leaders in a sample, exactly one outside the fault windows. The floor only
    # keeps the check from passing on no evidence: a sample is conclusive only when all
    # three replicas answered, and the faults fill most of the run (ci41: 20 of 62 at
    # load 5-9, when the floor was "more than 20"; 5 of 63 in the landing CI of
    # 2026-11-27, when it was 10: all three scrapes must fall within a tenth of a lease).
    # A metric that lies after a lapsed lease is caught deterministically by
    # tests/integration/test_leader_metrics.py.
    metrics = report["leader_metrics"]
    assert metrics["replicas"] == ["replica-0", "replica-1", "replica-2"], metrics
    assert report["checks"]["leader metrics"]["conclusive"] >= 3, metrics
    assert any(change["leaders"] == 1 for change in metrics["leader_count"]), metrics
    modes = report["cluster"]["client_modes"]
    assert {"remote", "replicas", "direct"} <= set(modes), modes
    for fault in report["faults"]:
        if fault["kind"] == "rolling-restart":
            assert [s["replica"] for s in fault["steps"]] == [
                "replica-0",
                "replica-1",
                "replica-2",
            ], fault
            assert all(s["exit_code"] == 0 for s in fault["steps"]), fault
        else:
            # The fault hit the replica that led, and another one leads after it,
            # unless it was paused holding SQLite's write lock (see _write_locked_pause).
            assert fault["leader_before"]["name"] == fault["replica"], fault
            if not _write_locked_pause(fault):
                assert fault["healed"]["leader_after"]["epoch"] > fault["leader_before"]["epoch"]


def test_pessimistic_bank_transfers_add_up_under_lock_service_leader_kills_and_pauses(
    tmp_path: Path,
) -> None:
    """Issue 28: bank transfers that read both balances with ``get_for_update`` (source
    first, so opposite transfers deadlock) on three replicas, which serve the lock
    service too: gateways and in-process committers take their locks from the replica
    that leads. Killing or pausing it moves the lock table to another replica (every
    lock lost, waiters told). Locks are liveness only (S5): deadlock victims and lost
    locks cost aborts, and the balances still add up."""
    out = tmp_path / "pessimistic-bank"
    report = chaos_run(
        out,
        "--workload",
        "bank",
        "--pessimistic",
        "--nemesis",
        "leader-kill,leader-pause",
        # Seed 7 plans a kill at 1.0 s and a pause at 2.6 s, then kills at 6.4 and
        # 9.1 s and a pause at 11.6 s (percolake chaos plan).
        "--seed",
        "7",
        "--fault-gap-s",
        "1",
        *REPLICAS,
        duration_s=15,
        rate=None,
    )
    # 235 ok operations in a CI run with the machine saturated (ci13, three workers);
    # 1,685 in 20 s on an idle one.
    assert_clean(report, min_ok=150, min_faults=3)
    assert report["pessimistic"] is True and "--pessimistic" in report["replay"]
    assert {f["kind"] for f in report["faults"]} == {"leader-kill", "leader-pause"}
    for fault in report["faults"]:
        # The fault hit the replica that led (and held the lock table), and another
        # one leads after it, unless it was paused holding SQLite's write lock.
        assert fault["leader_before"]["name"] == fault["replica"], fault
        if not _write_locked_pause(fault):
            assert fault["healed"]["leader_after"]["epoch"] > fault["leader_before"]["epoch"]
    locked = sum(_write_locked_pause(f) for f in report["faults"])
    assert_leader_changed(report, at_least=2 - locked)
    assert {"remote", "replicas", "direct"} <= set(report["cluster"]["client_modes"])
    assert set(report["checks"]) == {
        "bank reads",
        "bank final balances",
        "oracle timestamps",
        "leader metrics",
    }
    reads = report["checks"]["bank reads"]
    assert reads["pessimistic"] is True, reads
    # Two locked reads per acknowledged transfer: at least 75 transfers went through.
    assert reads["locked_reads"] >= 150, reads
    # 6 clients on 8 accounts lock in opposite orders often (36 victims in 20 s here).
    assert reads["deadlock_victims"] >= 1, reads
    # Balances conserved: the harness's final read sums to the initial total, and
    # exactly what the acknowledged transfers (and some unknown ones) make of it.
    assert report["checks"]["bank final balances"]["exact"] is True, report["checks"]
    history = [json.loads(line) for line in (out / "bank.jsonl").read_text().splitlines()]
    final = [op for op in history if op["process"] == FINAL_PROCESS and op["type"] == "ok"]
    assert len(final) == 1 and sum(final[0]["value"]) == reads["total"] == 800, final


#: The timestamps runs (AtlasDB TimeLock's Jepsen test): three replicas on SQLite, even
#: client slots pinned to one replica each, odd ones given all; the leader killed and
#: paused (2.5-4 leases). A replica woken from a pause reaches the store only 0.5 s later,
#: as across a network (on SQLite it would learn within microseconds that it lost the
#: lead, and a leader that does not check its lease would go unnoticed).
TIMESTAMPS = (
    *("--workload", "timestamps", "--nemesis", "leader-kill,leader-pause", "--seed", "274"),
    *("--fault-gap-s", "1", "--clients", "8", "--store-reconnect-ms", "500"),
    *REPLICAS,
)


@pytest.mark.parametrize("build", ["correct", "leader-ignores-lease"])
def test_timestamps_stay_unique_and_in_real_time_order_across_leader_faults(
    tmp_path: Path, build: str
) -> None:
    """The correct build: every timestamp unique and in real-time order across kills
    and pauses of the leader. The same run with leaders that serve without checking
    their lease (test-only build): a paused leader wakes up and, until it reads the
    leader row, serves its pinned clients from its old window, below timestamps the
    new leader handed out before: real-time order violations, each naming both calls."""
    out = tmp_path / build
    broken = build == "leader-ignores-lease"
    report = chaos_run(
        out,
        *TIMESTAMPS,
        *(["--unsafe-leader-ignores-lease"] if broken else []),
        # 13 s (was 20 with seed 1, issue 29's suite time): seed 274 plans a pause at
        # 1.0 s, a kill at 4.5 s, a pause at 6.2 s and a kill at 9.6 s; seed 1 planned
        # its third fault at 7.6 s and its fourth at 12.5 s. The broken build keeps 20 s:
        # a pause lasts until another replica leads, so under load (ci17, load 12) the
        # first pause ran to 6.5 s, the late kill then hit the woken leader 48 ms after
        # its wake-up, before it served a stale call, and the second pause ended past a
        # 13 s run's end: nothing stale was served and the broken build went uncaught.
        duration_s=20 if broken else 13,
        expect_exit=1 if broken else 0,
        rate=None,
    )
    assert report["leader_ignores_lease"] is broken
    check = report["checks"]["timestamps"]
    assert_leader_changed(report, at_least=2)
    pinned = {address for address in report["cluster"]["replica_addresses"]}
    assert pinned <= set(check["calls_by_node"]), check["calls_by_node"]
    history = out / "timestamps.jsonl"
    cli = subprocess.run(
        [sys.executable, "-m", "percolake", "check", str(history)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if not broken:
        assert_clean(report, min_ok=1000, min_faults=3)
        assert {f["kind"] for f in report["faults"]} == {"leader-kill", "leader-pause"}
        assert check["distinct_timestamps"] == check["calls_ok"], check
        assert check_timestamp_file(history).valid
        assert cli.returncode == 0, cli.stdout + cli.stderr
        return
    found = {a["type"] for a in report["anomalies"]}
    # The woken leader also exports percolake_is_leader 1 beside the new leader until it
    # reads the row, when a scrape falls in that half second (issue 31's metrics check).
    assert {"real-time-order"} <= found <= {"real-time-order", "two-leaders-in-metrics"}, found
    # The stale calls that went to a replica pinned by address went to one that woke
    # from a pause. (Clients given every replica's address, "any", reach it too.)
    paused = {
        f["leader_before"]["address"] for f in report["faults"] if f["kind"] == "leader-pause"
    }
    stale_pinned = [
        a
        for a in report["anomalies"]
        if a["type"] == "real-time-order" and a["later"]["node"] in pinned
    ]
    assert stale_pinned, report["anomalies"]
    assert all(a["later"]["node"] in paused for a in stale_pinned), (stale_pinned, paused)
    violation = stale_pinned[0]
    assert violation["earlier"]["complete_s"] < violation["later"]["invoke_s"]
    assert violation["earlier"]["ts"] > violation["later"]["ts"]
    assert check["violation_counts"]["real-time-order"] >= 10, check
    assert not check_timestamp_file(history).valid
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "real-time-order" in cli.stdout


def test_a_partitioned_leader_is_deposed_and_the_history_stays_clean(tmp_path: Path) -> None:
    """The leader's port cut off from clients and the other replicas (it still reaches
    the SQLite file and renews): the followers cannot forward to it, depose it after
    three leases and one of them takes over once the lease ran out."""
    problem = namespace_support()
    if problem is not None:
        pytest.skip(f"network faults need a network namespace: {problem}")
    report = chaos_run(
        tmp_path / "leader-partition",
        "--workload",
        "list-append",
        "--nemesis",
        "leader-partition",
        # A partition lasts 11-14 s (8-11 leases and 3 s): seed 5 plans the first at
        # 1.0 s for 11.2 s and the second at 12.8 s, as early as any seed (1..400). 18 s
        # (was 25, issue 29's suite time) cuts the second to 2.5 s and leaves it 5 s to
        # begin.
        "--seed",
        "5",
        "--fault-gap-s",
        "1",
        *REPLICAS,
        duration_s=18,
    )
    assert_clean(report, min_ok=80, min_faults=2)
    assert report["cluster"]["network_namespace"] is True
    assert_leader_changed(report, at_least=1)
    assert report["leaders"]["deposed"] >= 1, report["leaders"]
    first = report["faults"][0]
    assert first["rules"] == 2 and first["leader_before"]["name"] == first["replica"], first
    assert first["healed"]["leader_after"]["name"] != first["replica"], first


def test_the_fault_schedule_is_a_function_of_the_seed(tmp_path: Path) -> None:
    def schedule(seed: str) -> Any:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "percolake.tools.chaos",
                "plan",
                "--workload",
                "bank",
                "--nemesis",
                "kill,pause,partition,slow",
                "--duration-s",
                "600",
                "--cassandra-nodes",
                "3",
                "--seed",
                seed,
                "--out",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return json.loads(result.stdout)["faults"]

    first = schedule("42")
    assert len(first) > 50
    assert schedule("42") == first
    assert schedule("43") != first
    targets = {f["target"].split("~")[0].rsplit("-", 1)[0] for f in first}
    assert {"tso", "locks", "gateway", "client", "cassandra"} <= targets


def test_bad_input_exits_2(tmp_path: Path) -> None:
    for args in (
        ["--workload", "nope"],
        ["--workload", "bank", "--nemesis", "meteor"],
        ["--workload", "bank", "--store", "memory://"],
        ["--workload", "bank", "--store", "cassandra://h/ks", "--nemesis", "partition"],
        ["--workload", "bank", "--store", "cassandra://h/ks", "--nemesis", "oracle-overlap"],
        ["--workload", "bank", "--nemesis", "leader-kill"],
        ["--workload", "bank", "--replicas", "1", "--nemesis", "rolling-restart"],
        ["--workload", "bank", "--replicas", "3", "--nemesis", "oracle-overlap"],
        ["--workload", "timestamps", "--replicas", "3", "--leader-lease-ms", "50"],
        ["--workload", "bank", "--rate", "0"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "percolake.tools.chaos", "run", "--out", str(tmp_path), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 2, (args, result.stderr)


@pytest.mark.parametrize(
    ("seed", "first_fault"),
    # 11 s (was 15 with seeds 1 and 3, issue 29's suite time): seed 104 plans a pause at
    # 1.0 s and kills at 4.4, 5.9 and 8.1 s; seed 351 a kill at 1.0 s, a pause at 2.2 s,
    # a kill at 6.0 s and a pause at 7.3 s.
    [("104", "leader-pause"), ("351", "leader-kill")],
    ids=["pause", "kill"],
)
def test_an_embedded_oracle_beside_replicas_keeps_timestamps_unique_and_in_order(
    tmp_path: Path, seed: str, first_fault: str
) -> None:
    """Issue 30 (items 12, 13): an embedded oracle (as ``TransactionManager.embedded``
    builds it: the store's claim for life and a lease of its own) starts first and
    leads; three replicas follow. The leader faults hit whoever leads: first the
    embedded oracle, paused (a replica waits out its lease, takes over; the embedded one
    wakes up to a term that ended and must refuse, then may lead again later) or killed
    (its claim goes with it, which proves it gone: a replica takes over at once, and the
    embedded one, restarted, refuses while a replica leads), then the replicas. Pinned
    clients ask the embedded oracle directly. Every timestamp of every node stays unique
    and in real-time order."""
    out = tmp_path / f"embedded-{first_fault}"
    at = TIMESTAMPS.index("--seed") + 1
    args = (*TIMESTAMPS[:at], seed, *TIMESTAMPS[at + 1 :])
    report = chaos_run(out, *args, "--embedded", duration_s=11, rate=None)
    assert report["seed"] == int(seed)
    assert_clean(report, min_ok=1000, min_faults=3)
    check = report["checks"]["timestamps"]
    assert check["distinct_timestamps"] == check["calls_ok"], check
    assert check_timestamp_file(out / "timestamps.jsonl").valid
    names = report["cluster"]["replica_addresses"]
    embedded = [address for address, name in names.items() if name == "embedded" and address]
    assert len(embedded) == 1 and check["calls_by_node"].get(embedded[0], 0) > 0, check
    first = report["faults"][0]
    assert (first["kind"], first["replica"]) == (first_fault, "embedded"), first
    if first_fault == "leader-kill":
        # (After a pause a replica has usually taken over too, but not always on SQLite:
        # paused inside a write, the embedded oracle keeps the file's write lock, see
        # docs/design/limits.md.)
        assert first["healed"]["leader_after"]["name"].startswith("replica-"), first
        assert first["healed"].get("restart_refused") == "embedded", first
    assert_leader_changed(report, at_least=2)
