"""Table maintenance: read a table's metadata (`view`), run planned work items (`worker`), and loop over
plan → claim → run (`runner`) in compaction pods (`icefall compact`) or between batches of `icefall run`."""
