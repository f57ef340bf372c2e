"""pyiceberg's pyarrow FileIO with a bound on how long a Google Cloud Storage call retries.

pyiceberg opens `gs://` paths with pyarrow's `GcsFileSystem` and passes no retry limit, so a call to an
unreachable store retries for the Google client's default of 15 minutes before it fails: ingestion would
hang there instead of saying, within seconds, that the object store is down and retrying on its own
schedule (icefall.ingest.outages). `GcsFileIO` is `PyArrowFileIO` whose GCS file systems give up after
`RETRY_SECONDS`; every other scheme, and every GCS setting pyiceberg maps (`gcs.service.host`,
`gcs.oauth2.token`, ...), is pyiceberg's own. `icefall.catalog.config` selects it (`py-io-impl`) for tables
in GCS unless the spec names another FileIO.

It overrides one private method of pyiceberg's (`_initialize_gcs_fs`) and rebuilds the file system from
the options pyarrow reports for it; tests/unit/test_catalog_config_gcs.py fails when either moves.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO

RETRY_SECONDS = 20  # transient GCS errors (connection refused, 503) are retried this long, then raised


class GcsFileIO(PyArrowFileIO):
    """`PyArrowFileIO` whose GCS file systems retry transient errors for at most `RETRY_SECONDS`."""

    def _initialize_gcs_fs(self) -> Any:
        from pyarrow.fs import GcsFileSystem

        filesystem = super()._initialize_gcs_fs()
        # The constructor's keyword arguments, as pyarrow keeps them (what it pickles).
        options = dict(filesystem.__reduce__()[1][0])
        options["retry_time_limit"] = timedelta(seconds=RETRY_SECONDS)
        return GcsFileSystem(**options)
