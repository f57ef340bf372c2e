"""`icefall verify`: the table (its dead-letter table; routed: every destination, the tables a dynamic
route created too) audited against its topic by content (`icefall.audit`; keyed tables and keyed routes by
key), with Spark decoding the topic's records as ingestion does."""

from __future__ import annotations

import argparse
from typing import Any

from icefall.commands.common import catalog_for, load_table, state_dir, unreachable_is_one_line


def verify_table(st: Any, catalog_config: Any, *, ingesting: bool = False, spark: Any = None) -> Any:
    """Audit the table (and its dead-letter table; routed: every destination) against the topic, by content.

    `spark`: a session with the table's catalog configured; by default a local one is started (after the
    table is found, so a missing table is said without waiting for Spark).
    """
    from icefall.audit import SparkContent, audit_from_catalog
    from icefall.kafka.security import librdkafka_config, spark_kafka_options

    catalog = catalog_config.pyiceberg()
    identifier = ".".join(st.table_identifier)
    catalog.load_table(identifier)  # NoSuchTableError before Spark starts
    if spark is None:
        from icefall.plan.spark_conf import tool_conf
        from icefall.spark.session import build_spark_session

        print("[verify] starting local Spark to decode the topic's records ...", flush=True)
        spark = build_spark_session([catalog_config], extra_conf=tool_conf(st.metadata.name, "verify"))
    if st.spec.key:  # by key; routed: every destination, each up to its own offsets
        from icefall.audit import audit_keyed
        from icefall.audit.keyed_routes import audit_keyed_routes

        audit = audit_keyed_routes if st.spec.routed else audit_keyed
        return audit(
            spark,
            st,
            catalog,
            catalog_config.name,
            security_options=spark_kafka_options(st.spec.source.security),
        )
    if st.spec.routed:  # every destination (the dynamic route's tables too), each up to its own offsets
        from icefall.audit.routed import verify_routed

        return verify_routed(spark, st, catalog, catalog_config.name, ingesting=ingesting)
    content = SparkContent(
        spark, st.spec, catalog_config.name, security_options=spark_kafka_options(st.spec.source.security)
    )
    dead_letter = st.dead_letter_identifier
    return audit_from_catalog(
        catalog,
        identifier,
        st.spec.source.bootstrap_servers,
        dead_letter=".".join(dead_letter) if dead_letter else None,
        kafka_config=librdkafka_config(st.spec.source.security),
        content=content,
        filter_configured=bool(st.spec.transforms.filter),
        ingesting=ingesting,
    )


def verify(args: argparse.Namespace) -> int:
    """`icefall verify`: the audit's report, exit 0 when nothing is wrong."""
    st = load_table(args)
    if st.spec.table.format.value == "delta":  # at its location, without a catalog
        from icefall.commands.delta import verify_delta_table

        report = verify_delta_table(st, state_dir(args), ingesting=args.ingesting)
    else:
        config = catalog_for(st, state_dir(args))
        with unreachable_is_one_line(st, config):
            report = verify_table(st, config, ingesting=args.ingesting)
    if args.output == "json":
        import json

        from icefall.audit.report import report_json

        print(json.dumps(report_json(report), indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
