"""The subcommands of `icefall` that need no more than a manifest and the catalog (status, reset-offsets,
read), the run loop of `icefall run` and `icefall ingest` (`run`), and what every subcommand shares
(`common`). `icefall.cli` parses the command line and calls them.

Nothing is imported here.
"""
