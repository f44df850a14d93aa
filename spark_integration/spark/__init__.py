"""The Spark side of the lakehouse: what runs in a Spark driver and its executors.

``Lakehouse`` (``lakehouse``) writes and reads tables through the engine's catalog,
embedded or through a gateway (``service.client``); ``datasource`` is the
``percolake`` format for DataFrame readers and writers; ``hook`` writes a job's
Parquet files and collects them for the commit; ``cells`` writes DataFrame rows as
percolake cells; ``vacuum_sweep`` deletes the files vacuum's plan no longer needs.

Nothing is imported here: ``spark_integration`` loads this side on first use, so a
process that only serves the lakehouse (the gateway) never loads PySpark.
"""
