"""Where tables live: an absolute local path or an object-store URL, as plain strings.

A warehouse, and each table location below it, is either an absolute local path
(``/data/warehouse``) or ``s3://bucket/prefix``. ``s3a://`` (Hadoop's spelling) is
accepted as an alias and stored as ``s3://``: the catalog records one spelling, so
two writers spelling the same bucket differently still name the same table. Spark
is handed the ``s3a://`` spelling (``spark_integration.spark.filesystem``).

File paths inside a table are relative and always ``/``-separated, on every store:
that is how the catalog records them, so a table's log reads the same wherever its
files sit. This module only parses and joins strings; it reaches no store (the
engine knows no file system).
"""

from __future__ import annotations

import os
import posixpath
import re

#: The object-store schemes a location may use, and the scheme each is recorded as.
OBJECT_STORE_SCHEMES = {"s3": "s3", "s3a": "s3"}

#: S3's bucket naming rules (general purpose buckets): 3-63 characters, lower-case
#: letters, digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")

EXPECTED = "an absolute local path or s3://bucket/prefix"


def normalize_location(raw: str, what: str = "warehouse") -> str:
    """``raw`` as the catalog records it; ``ValueError`` naming the problem otherwise.

    Local paths must be absolute and are normalised (``/a/./b/`` -> ``/a/b``).
    ``s3://`` and ``s3a://`` URLs must name a valid bucket; the key prefix may be
    empty, must not hold empty, ``.`` or ``..`` segments, and loses a trailing ``/``.
    ``file://``, ``hdfs://`` and other schemes are refused by name.
    """
    if not isinstance(raw, str):
        raise TypeError(f"{what} must be a string, got {type(raw).__name__}")
    if not raw or raw != raw.strip() or "\x00" in raw:
        raise ValueError(f"{what} must be {EXPECTED}, got {raw!r}")
    scheme_match = _SCHEME.match(raw)
    if scheme_match is None:
        if not os.path.isabs(raw):
            raise ValueError(f"{what} must be {EXPECTED}, got {raw!r}")
        return os.path.normpath(raw)
    scheme = scheme_match.group(1).lower()
    if scheme not in OBJECT_STORE_SCHEMES:
        raise ValueError(
            f"{what} {raw!r}: the scheme {scheme}:// is not supported; expected {EXPECTED}"
        )
    rest = raw[scheme_match.end() :]
    bucket, _, prefix = rest.partition("/")
    check_bucket_name(bucket, raw, what)
    prefix = prefix.rstrip("/")
    if prefix:
        segments = prefix.split("/")
        if any(s in ("", ".", "..") for s in segments):
            raise ValueError(
                f"{what} {raw!r}: the key prefix must not hold empty, '.' or '..' segments"
            )
    recorded = OBJECT_STORE_SCHEMES[scheme]
    return f"{recorded}://{bucket}/{prefix}" if prefix else f"{recorded}://{bucket}"


def check_bucket_name(bucket: str, raw: str, what: str = "warehouse") -> None:
    """S3's rules for a bucket name, with the rule broken in the message."""
    if not bucket:
        raise ValueError(f"{what} {raw!r} names no bucket: expected s3://bucket/prefix")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP_ADDRESS.fullmatch(bucket):
        raise ValueError(
            f"{what} {raw!r}: {bucket!r} is not a valid bucket name (3-63 lower-case "
            "letters, digits, dots and hyphens, starting and ending with a letter or "
            "digit, not an IP address)"
        )


def is_object_store(location: str) -> bool:
    """Whether a recorded location is an object-store URL (not a local path)."""
    return _SCHEME.match(location) is not None


def join(location: str, *parts: str) -> str:
    """``location`` with relative ``/``-separated parts appended."""
    if is_object_store(location):
        return posixpath.join(location, *parts) if parts else location
    return os.path.join(location, *parts)


def relative_to(location: str, path: str) -> str | None:
    """``path`` relative to ``location`` (``/``-separated), or None if it lies outside.

    ``path`` may spell an object store with ``s3a://``; local paths are normalised
    first, so ``..`` cannot climb out unnoticed.
    """
    if is_object_store(location):
        try:
            path = normalize_location(path, "path")
        except ValueError:
            return None
        prefix = location + "/"
        return path[len(prefix) :] if path.startswith(prefix) else None
    if not os.path.isabs(path) or _SCHEME.match(path):
        return None
    rel = os.path.relpath(os.path.normpath(path), location)
    if rel in (os.curdir, os.pardir) or rel.startswith(os.pardir + os.sep):
        return None
    return rel


def check_relative_file(path: str) -> bool:
    """Whether ``path`` is a normalised relative file path inside a table."""
    return (
        bool(path)
        and "\x00" not in path
        and not path.startswith("/")
        and _SCHEME.match(path) is None
        and posixpath.normpath(path) == path
        and path.split("/", maxsplit=1)[0] != ".."
    )
