"""The change feed's ``maxFilesPerTrigger`` option (issue 26): parsed for a streaming
feed, checked as the plain streaming read checks it, refused by a batch feed read."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from spark_integration.spark.datasource.change_read import _At, change_reader
from spark_integration.spark.datasource.options import change_feed_options, stream_read_options

pytestmark = pytest.mark.unit

FEED = {"path": "t", "readChangeFeed": "true", "startingVersion": "2"}


def test_max_files_per_trigger_is_a_change_feed_option() -> None:
    opts = change_feed_options({**FEED, "maxFilesPerTrigger": "3"})
    assert opts is not None and opts.max_files == 3
    plain = change_feed_options(FEED)
    assert plain is not None and plain.max_files is None
    with pytest.raises(ValueError, match="maxFilesPerTrigger must be at least 1, got 0"):
        change_feed_options({**FEED, "maxFilesPerTrigger": "0"})
    with pytest.raises(ValueError, match="maxFilesPerTrigger must be at least 1, got 0"):
        stream_read_options({"path": "t", "maxFilesPerTrigger": "0"})


def test_a_batch_feed_read_refuses_it_before_planning() -> None:
    opts = change_feed_options({**FEED, "maxFilesPerTrigger": "3", "gateway": "127.0.0.1:1"})
    assert opts is not None
    with pytest.raises(ValueError, match="maxFilesPerTrigger is for streaming reads"):
        change_reader(opts, None, batch=True)  # refused before the gateway is asked


def test_an_offset_without_an_index_is_the_start_of_its_version() -> None:
    assert _At.of({"version": 4}) == _At(4, 0)  # written before offsets had an index
    assert _At.of(_At(4, 2).offset()) == _At(4, 2)
