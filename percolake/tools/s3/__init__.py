"""A real S3 server (MinIO, built from the Go module proxy) for tests and local use.

See :mod:`percolake.tools.s3.launcher`; ``percolake s3 start|stop|status|fetch`` on the
command line.
"""

from percolake.tools.s3.launcher import (
    DEFAULT_SERVER_DIR,
    DEFAULT_VERSION,
    MINIO_MODULE,
    REGION,
    ROOT_USER,
    S3Error,
    S3Server,
    S3Status,
    add_s3_commands,
    ensure_minio,
    export_lines,
    main,
    minio_binary,
    minio_home,
    minio_present,
    run_s3_command,
    validate_bucket_name,
)

__all__ = [
    "DEFAULT_SERVER_DIR",
    "DEFAULT_VERSION",
    "MINIO_MODULE",
    "REGION",
    "ROOT_USER",
    "S3Error",
    "S3Server",
    "S3Status",
    "add_s3_commands",
    "ensure_minio",
    "export_lines",
    "main",
    "minio_binary",
    "minio_home",
    "minio_present",
    "run_s3_command",
    "validate_bucket_name",
]
