# syntax=docker/dockerfile:1
# Iceberg's own REST catalog server for `make e2e-kind`: the jars of hack/rest-catalog/pom.xml on a JRE,
# the same server and jar list the test stack runs (icefall.devstack.rest_catalog). Iceberg's published
# image of it (apache/iceberg-rest-fixture) has no tag for the Iceberg version Icefall uses.
# Build from the repository root:
#   docker build -f hack/kind/rest-catalog.Dockerfile -t icefall-rest-catalog:e2e .

FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /build
COPY hack/rest-catalog/pom.xml pom.xml
RUN mvn -B -q -f pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/build/jars

FROM eclipse-temurin:17-jre
COPY --from=jars /build/jars/ /opt/rest-catalog/jars/
# A named numeric user (Hadoop's UserGroupInformation, which the server's Configuration touches, needs a
# passwd entry); the only path it writes is the catalog's emptyDir.
RUN groupadd --system --gid 10001 iceberg \
 && useradd --system --uid 10001 --gid iceberg --home-dir /tmp --no-create-home iceberg
USER 10001:10001
# The server reads its catalog properties from CATALOG_* variables (hack/kind/lake.yaml).
ENTRYPOINT ["java", "-Xmx384m", "-XX:+UseSerialGC", "-Djava.awt.headless=true", \
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", \
            "-cp", "/opt/rest-catalog/jars/*", "org.apache.iceberg.rest.RESTCatalogServer"]
