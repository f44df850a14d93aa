"""Lakehouse tables on percolake: every commit of a Spark job is one transaction.

See CONTRACT.md ("Lakehouse tables") for the API and DESIGN.md ("Spark") for what
it guarantees; ``_model`` documents how the metadata is laid out in cells.
"""

from spark_integration._cells import write_cells
from spark_integration._errors import (
    ConcurrentModificationError,
    LakehouseError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from spark_integration._lakehouse import Lakehouse
from spark_integration._model import Commit, DataFile

__all__ = [
    "Commit",
    "ConcurrentModificationError",
    "DataFile",
    "Lakehouse",
    "LakehouseError",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
    "write_cells",
]
