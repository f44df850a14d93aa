"""``format("percolake")``: lakehouse tables as a Spark data source (Python Data Source API).

::

    df.write.format("percolake").mode("append").option("gateway", gw).save("events")
    spark.read.format("percolake").option("gateway", gw).option("versionAsOf", 3).load("events")
    sdf.writeStream.format("percolake").option("gateway", gw) \\
        .option("checkpointLocation", ckpt).start("events")

Where each step runs: Spark calls the data source's planning methods (``schema``,
``reader``, ``writer``, ``streamWriter``) and the writers' ``commit``/``abort`` in
Python worker processes on the driver's machine, and ``write``/``read`` in tasks on
executors. Every object that crosses between them is pickled, so plans here are
plain values; each driver-side step opens its own connection to the gateway.

- **Writes.** Planning checks the options and the DataFrame's schema against the
  table (creating it first with ``createIfMissing``), reads the base version an
  overwrite replaces and whether an idempotent write (``txnAppId``/``txnVersion``)
  already committed, and names a job folder. Tasks write Parquet with pyarrow into
  it; ``commit`` makes the files one version with one call to the gateway's
  lakehouse service. ``abort`` removes the folder only when no commit was ever
  sent for the job (a commit whose outcome is unknown may have named its files:
  those stay, for ``vacuum`` to remove if no version names them). Partition values are
  written as Spark writes them (NULL and ``''`` both the default partition). An
  overwrite replaces the whole table, unless option ``replaceWhere`` (conditions on
  partition columns) or dynamic partition overwrite (the write option
  ``partitionOverwriteMode``, else the session's ``spark.sql.sources.
  partitionOverwriteMode``, which only the tasks can read) say to replace part of it:
  then the commit is a ``REPLACE WHERE`` with a read set (``spark.replace``).
- **Reads.** The version is pinned when the DataFrame is defined (``load``): the
  latest, ``versionAsOf``, or the latest committed at or before ``timestampAsOf``.
  Planning lists that version's files once and spreads them over tasks.
- **Streaming writes.** Micro-batch ``b`` of a query commits with the idempotency
  mark ``(app, b)``, ``app`` being ``txnAppId`` or the query id Spark keeps in the
  checkpoint: a batch replayed after a restart adds nothing. Complete mode is an
  overwrite per batch.
- **Streaming reads.** Committed versions in order, as Delta does: without
  ``startingVersion`` the latest version's snapshot first, then each later version's
  added files; ``startingVersion=n`` the files added by versions ``n, n+1, ...``;
  ``startingVersion=latest`` only versions committed after the query starts. An
  offset is ``{version, index, snapshot}``, the next file to read, so
  ``maxFilesPerTrigger`` can end a micro-batch inside a version. A version that
  removed files (an overwrite) fails the query unless ``skipChangeCommits``; a
  version vacuum removed files of fails it naming the version.

- **Change data feed.** ``readChangeFeed`` with ``startingVersion`` (and for a batch
  read ``endingVersion``) reads the rows each version inserted, deleted or updated, as
  ``Lakehouse.changes`` gives them (``change_read``).

- **Tables on S3.** A table's location may be ``s3://bucket/prefix`` (option
  ``warehouse`` with ``createIfMissing`` takes ``s3://`` or ``s3a://``). Every file the
  source touches goes through ``spark.filesystem`` (pyarrow): tasks upload each Parquet
  file as one object where it stays (nothing is renamed), ``_committing`` is one PUT,
  a failed job's folder is deleted by prefix. Credentials, region and endpoint come
  only from the standard AWS settings of each process's environment, never from
  options: the driver's planning and commit workers and every executor's Python
  workers build their S3 clients from the ``AWS_*`` variables they inherit. On a
  cluster give the executors the same settings (``spark.executorEnv.AWS_REGION``,
  ``spark.executorEnv.AWS_ENDPOINT_URL``, ... or, better than keys in the Spark
  configuration, an instance or pod role the AWS SDK finds by itself). A write checks
  at planning that the table's bucket exists and the driver's credentials are
  accepted, so neither fails a job half-way. The streaming checkpoint is Spark's: it
  may be local or ``s3a://`` (Spark writes it through hadoop-aws; the source reads
  only the query id from it, through pyarrow). Exactly-once does not rest on the
  checkpoint being atomic: a replayed micro-batch is recognised by its ``(app, b)``
  mark in the log, wherever the checkpoint lives.
- **Filters.** With ``spark.sql.python.filterPushdown.enabled`` the reader takes the
  query's filters (``pushFilters``): filters on partition columns drop files by their
  partition values and are not applied again; filters on data columns skip files whose
  column statistics prove no row matches and stay for Spark (``pruning``). PySpark
  fails every read of a reader with ``pushFilters`` when that setting is off, and a
  source cannot read the session's settings, so that reader is handed only to the
  worker Spark runs when it is on (``planning_with_pushdown``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from spark_integration.engine.model import APPEND, OVERWRITE, FileEntry, TableMeta
from spark_integration.engine.read_set import Condition
from spark_integration.spark import filesystem
from spark_integration.spark.changes import feed_schema
from spark_integration.spark.datasource.batch_read import (
    PercolakePushdownReader,
    PercolakeReader,
    files_to_read,
    planning_with_pushdown,
    resolve_version,
)
from spark_integration.spark.datasource.batch_write import (
    PercolakeBatchWriter,
    WritePlan,
    replace_mode,
    replace_where_conditions,
)
from spark_integration.spark.datasource.change_read import (
    PercolakeChangeStreamReader,
    change_reader,
)
from spark_integration.spark.datasource.gateway import open_gateway, table_schema
from spark_integration.spark.datasource.options import (
    STREAM_READ_OPTIONS,
    change_feed_options,
    query_id_of_checkpoint,
    read_options,
    stream_read_options,
    stream_write_options,
    write_options,
)
from spark_integration.spark.datasource.stream_read import PercolakeStreamReader
from spark_integration.spark.datasource.stream_write import PercolakeStreamWriter, StreamPlan
from spark_integration.spark.datasource.write_plan import (
    evolved_target,
    prepare_table,
    write_target,
)
from spark_integration.spark.hook import new_job
from spark_integration.spark.schema import check_dataframe_schema
from spark_integration.spark.session import reach_every_session, workers_run_this_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

log = logging.getLogger(__name__)


class PercolakeDataSource(DataSource):
    """The ``percolake`` format (options: docs/lakehouse.md); the path is the table name."""

    #: The version a read is pinned to, set when the DataFrame is defined (``schema``).
    pinned_version: int | None = None

    @classmethod
    def name(cls) -> str:
        return "percolake"

    def schema(self) -> StructType:
        feed = change_feed_options(self.options)
        if feed is not None:
            end, reader = change_reader(feed, feed.ending_version)
            self.pinned_version = end  # the last version the feed reads
            return feed_schema(StructType.fromJson(json.loads(reader.schema_json)))
        if any(k.lower() in STREAM_READ_OPTIONS for k in self.options):
            # A streaming read (Spark asks for the schema before it knows which reader):
            # its options are checked here, a batch reader refuses them by name.
            stream_opts = stream_read_options(self.options)
            with open_gateway(stream_opts.gateway) as catalog:
                return table_schema(catalog.meta(stream_opts.table))
        opts = read_options(self.options)
        with open_gateway(opts.gateway) as catalog:
            version = resolve_version(catalog, opts)
            meta = catalog.meta(opts.table)  # as fresh as the head resolve_version read
        self.pinned_version = version
        return table_schema(meta, version)

    def reader(self, schema: StructType) -> DataSourceReader:
        feed = change_feed_options(self.options)
        if feed is not None:
            pinned = feed.ending_version if self.pinned_version is None else self.pinned_version
            _, changes = change_reader(feed, pinned, batch=True)
            table = StructType.fromJson(json.loads(changes.schema_json))
            check_dataframe_schema(feed.table, feed_schema(table), schema)
            return changes
        opts = read_options(self.options)
        with open_gateway(opts.gateway) as catalog:
            version = self.pinned_version
            if version is None:  # the user gave a schema: schema() never ran
                version = resolve_version(catalog, opts)
            meta, at, entries = catalog.files(opts.table, version, FileEntry)
        check_dataframe_schema(opts.table, table_schema(meta, at), schema)
        files = files_to_read(meta.location, entries)
        log.info("read of %s version %d: %d files", opts.table, version, len(files))
        # Spark refuses a reader with pushFilters unless the session enabled Python
        # filter pushdown, and then asks for the reader in a worker of its own.
        kind = PercolakePushdownReader if planning_with_pushdown() else PercolakeReader
        return kind(opts.table, schema.json(), meta.partition_by, files)

    def streamReader(
        self, schema: StructType
    ) -> PercolakeStreamReader | PercolakeChangeStreamReader:
        feed = change_feed_options(self.options)
        if feed is not None:
            return PercolakeChangeStreamReader(feed, schema)
        return PercolakeStreamReader(stream_read_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> PercolakeBatchWriter:
        opts = write_options(self.options)
        replace = replace_mode(opts, overwrite)  # refused before anything is created
        with open_gateway(opts.gateway) as catalog:
            meta = prepare_table(catalog, opts, schema)
            prepared = catalog.prepare(opts.table, opts.app_id, opts.batch_id)
        _check_store(opts.table, meta)
        target, new_schema = write_target(opts, meta), None
        if opts.merge_schema or opts.overwrite_schema:
            target, new_schema = evolved_target(opts, meta, schema, overwrite)
        conditions: tuple[Condition, ...] = ()
        if opts.replace_where is not None:
            conditions = replace_where_conditions(opts.replace_where, meta)
        job = new_job(meta.location)
        plan = WritePlan(
            target=target,
            operation=OVERWRITE if overwrite else APPEND,
            job_id=job.job_id,
            job_started_ms=job.started_ms,
            staging=str(job.staging),
            base_version=prepared.head.version if overwrite else None,
            app_id=opts.app_id,
            batch_id=opts.batch_id,
            replayed_version=prepared.replayed_version,
            # The write option, when given, wins over the session's setting (as in Spark).
            check_session_overwrite_mode=overwrite
            and opts.partition_overwrite_mode is None
            and replace is None
            and not opts.overwrite_schema,
            replace=replace,
            conditions=conditions,
            schema_version=prepared.head.schema_version,
            new_schema_json=new_schema,
        )
        return PercolakeBatchWriter(plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PercolakeStreamWriter:
        opts = stream_write_options(self.options)
        app_id = opts.app_id
        if app_id is None:
            assert opts.checkpoint is not None, "checked with the options"
            app_id = f"query-{query_id_of_checkpoint(opts.checkpoint)}"
        with open_gateway(opts.gateway) as catalog:
            meta = prepare_table(catalog, opts, schema)
        _check_store(opts.table, meta)
        return PercolakeStreamWriter(
            StreamPlan(write_target(opts, meta), OVERWRITE if overwrite else APPEND, app_id)
        )


def _check_store(table: str, meta: TableMeta) -> None:
    """Fail at planning, before any task writes, when the table's store cannot serve it.

    On S3: the bucket must exist and the driver's AWS settings must be accepted (one
    or two requests; ``filesystem.check_reachable``). A new table's warehouse was
    checked already, when ``createIfMissing`` made it (``Lakehouse``).
    """
    filesystem.check_reachable(meta.location, f"percolake: table {table!r} at")


def register(spark: SparkSession | ConnectSession) -> None:
    """Register ``format("percolake")`` with ``spark``, a classic or a Spark Connect session.

    An installed percolake is found by name without it (Spark's lookup of
    ``pyspark_*`` modules finds ``pyspark_percolake``, also in a Connect server) when
    the JVM started with ``$PYSPARK_PYTHON`` naming this environment's Python
    (``local_session`` sets it). For a classic session ``register`` also covers what
    that lookup cannot (see ``spark.session``): it makes the workers run this interpreter
    when the user chose none, and makes the source reach the sessions
    ``spark.newSession()`` makes and writes from other threads.
    """
    from pyspark.sql import SparkSession as ClassicSession

    if isinstance(spark, ClassicSession):
        # Before registering: the registration takes its workers' Python from the context.
        workers_run_this_python(spark)
        reach_every_session(PercolakeDataSource)
    spark.dataSource.register(PercolakeDataSource)


__all__ = ["PercolakeDataSource", "register"]
