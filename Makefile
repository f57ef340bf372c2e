# The two commands of the README: `make demo` and `make test`. Everything they need is installed by the
# project's own files into ignored or cache folders: .venv/ here, binaries and jars under
# $XDG_CACHE_HOME/icefall (default ~/.cache/icefall), keyed by version.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
BIN := $(VENV)/bin
TOOLS := eval "$$(hack/tool-env.sh)"
# `make demo` provisions only what it uses: Kafka's and Spark's jars (hack/tool-env.sh --demo).
DEMO_TOOLS := eval "$$(hack/tool-env.sh --demo)"

.PHONY: help prereqs prereqs-demo setup venv venv-demo tools tools-demo demo test test-all test-report test-unit test-integration test-e2e bench-ingest chaos lint fmt clean
help:
	@echo "make demo   set up only what it uses (Python packages, Kafka's and Spark's jars), then run the main job"
	@echo "            on the embedded default; needs Python 3.11/3.12, Java 17+, Maven 3.6.3+ (hack/check-prereqs.sh)"
	@echo "make test   set everything up and run lint, then all test tiers (unit, integration, e2e; not the tests marked long)"
	@echo "make test-all  the same with the long tests too (about 18 min more)"
	@echo "make setup  only install everything make test uses: Python packages, Go-built binaries, Maven jars, npm"
	@echo "            tools; needs the demo's prerequisites plus Go, npm and openssl (hack/check-prereqs.sh all)"
	@echo "make lint   ruff + mypy;  make fmt: ruff format"
	@echo "make image  build the image (spark_images/Dockerfile) with podman, no registry needed (hack/build-image.sh)"
	@echo "make docs  regenerate docs/reference/ (StreamingTable fields, the CLI, the Helm values) from the code"
	@echo "make chart  package the Helm chart, CRD inside, into dist/ (helm push it to an OCI registry)"
	@echo "make e2e-kind  (needs Docker) the cluster example on a kind cluster, with the image and the chart"
	@echo "make bench  Icefall side by side with its peers (bench/results/compare.md); BENCH_ARGS=--quick: short"
	@echo "make bench-growth  drain throughput over event sizes x partitions (bench/results/growth.md)"
	@echo "make bench-upsert  keyed upserts: Icefall beside Spark's foreachBatch MERGE (bench/results/upsert.md)"
	@echo "make bench-sustained  5M-record drains: JSON, JSON Schema, Avro, Protobuf, keyed, with CPU-s per GiB (bench/results/sustained.md, sustained-upsert.md)"
	@echo "make bench-write-path  CPU of Icefall's write path vs the plain Spark write (bench/results/write_path.md)"
	@echo "make bench-fresh  union reads (icefall read) vs a plain scan: latency, staleness (bench/results/union_read.md)"
	@echo "make bench-pipelining  a backlog drained with spec.batch.pipelined on and off (bench/results/pipelining.md)"
	@echo "make bench-operator  the operator at 10/100/300 StreamingTables: API requests, CPU, RSS, reaction (bench/results/operator.md)"
	@echo "make bench-executors  one backlog drained with 1 then 2 Spark executor pods (bench/results/executors.md)"
	@echo "make bench-routing  one topic into 20 tables: routes vs 20 filtered StreamingTables vs one table (bench/results/routing.md)"
	@echo "make bench-scale  per-core drain, 3/48/192 partitions, one driver's commits/s, CAS, Kafka fetch (bench/results/scale.md)"
	@echo "make chaos  200 random kills, 100 infrastructure kills and 4 outages on the whole system, audited"
	@echo "            (bench/results/chaos.md); shorter: make chaos CHAOS_KILLS=20; other seed: CHAOS_SEED=7"

# What the machine must already have, one line per missing piece (before any virtualenv exists).
prereqs:
	@hack/check-prereqs.sh all
prereqs-demo:
	@hack/check-prereqs.sh demo

setup: prereqs venv tools

# The development set (`.[dev]`: tests, lint) is a superset of the demo's (the package and its
# dependencies): installing it marks both done.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "[setup] Python packages into $(VENV) (pinned by constraints.txt)"
	@test -x $(BIN)/python || python3 -m venv $(VENV)
	@start=$$SECONDS; $(BIN)/pip install -q -c constraints.txt -e '.[dev]'; \
	  echo "[setup] Python packages ready in $$((SECONDS - start))s"
	@touch $@ $(VENV)/.demo-installed

venv-demo: $(VENV)/.demo-installed
$(VENV)/.demo-installed: pyproject.toml constraints.txt
	@echo "[setup] Python packages into $(VENV) (pinned by constraints.txt; the demo's only)"
	@test -x $(BIN)/python || python3 -m venv $(VENV)
	@start=$$SECONDS; $(BIN)/pip install -q -c constraints.txt -e .; \
	  echo "[setup] Python packages ready in $$((SECONDS - start))s"
	@touch $@

tools:
	@$(TOOLS) >/dev/null
tools-demo:
	@$(DEMO_TOOLS) >/dev/null

# The one image (operator, drivers, executors, compaction), tagged localhost/icefall:<hash of its inputs>.
.PHONY: image
image:
	hack/build-image.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The StreamingTable CRD, generated from the pydantic models (tests/unit/test_crd.py fails when it drifts).
.PHONY: crds
crds: venv
	$(BIN)/python -m icefall.api.crd > crds/streamingtables.icefall.dev.yaml.tmp
	mv crds/streamingtables.icefall.dev.yaml.tmp crds/streamingtables.icefall.dev.yaml

# The Helm chart ships a copy of crds/ (Helm reads only files inside the chart); tests/integration/
# test_chart.py fails when the copy differs.
.PHONY: chart-crds
chart-crds:
	cp crds/streamingtables.icefall.dev.yaml charts/icefall/crds/streamingtables.icefall.dev.yaml

# The generated references under docs/reference/: the StreamingTable's fields (from the models' CRD schema),
# the `icefall` CLI and its exit codes (from the argparse parser), the chart's values (from
# charts/icefall/values.schema.json and values.yaml). tests/unit/test_reference_docs.py fails when one drifts.
.PHONY: docs
docs: venv
	$(BIN)/python -m icefall.devstack.reference

# The chart as one file to install or push: `helm lint --strict`, then `helm package` into $(CHART_DIST)
# (dist/icefall-<version>.tgz, the CRD inside under crds/). Refuses a chart whose CRD copy differs from
# crds/ (run `make crds chart-crds`): it never changes the tree. Push it with
# `helm push dist/icefall-<version>.tgz oci://<registry>/<path>`; tests/integration/test_chart_package.py
# runs this target and installs from its output.
CHART_DIST ?= dist
.PHONY: chart
chart:
	@cmp -s crds/streamingtables.icefall.dev.yaml charts/icefall/crds/streamingtables.icefall.dev.yaml || \
	  { echo "charts/icefall/crds/ differs from crds/: run make crds chart-crds" >&2; exit 1; }
	@$(TOOLS) && helm lint --strict charts/icefall >/dev/null && \
	  helm package charts/icefall --destination $(CHART_DIST)

# The Grafana dashboard the chart ships, generated with Grafana's foundation SDK (tests/unit/test_dashboards.py
# fails when it drifts).
.PHONY: dashboards
dashboards: venv
	$(BIN)/python -m icefall.devstack.dashboards > charts/icefall/dashboards/icefall.json.tmp
	mv charts/icefall/dashboards/icefall.json.tmp charts/icefall/dashboards/icefall.json

# The e2e tier runs every pod as a container of the image: build it (or find it, by hash) first.
# `make test` leaves out the tests marked `long` to stay within CI's time: five e2e modules (executors as
# pods, compaction pods, the keyed examples, a producer's new Avro field, the chart's upgrade with a table
# running), the longest kill chains (keyed and cdc tables, the small chaos run, the shared catalogs'
# crash-restarts, half of the new-table and pipelined points) and the broker restart; each of their pieces
# is also proved by a shorter test (the upgrade's steps: tests/integration/test_crd_upgrade.py and
# test_chart_package.py).
# `make test-all` runs every test, `make test-e2e` every e2e module.
# Both run on both cores: a pytest-xdist worker per core, each with a stack of its own; the e2e tier (one
# node per machine) runs in one worker. Each writes build/test-report.md: every test's wall and CPU time
# (its process tree) and the components it started, by module and by test; its summary and the slowest
# modules close the output: what to look at first when CI's time grows. PYTEST_ARGS adds options.
PYTEST_PARALLEL := -n 2 --dist loadgroup --test-report=build/test-report.md
test: setup lint image
	$(TOOLS) && $(BIN)/pytest -m "not long" $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-all: setup lint image
	$(TOOLS) && $(BIN)/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The report of the last `make test` / `make test-all` (build/test-report.md), slowest modules first.
.PHONY: test-report
test-report:
	@cat build/test-report.md

test-unit: venv
	$(BIN)/pytest -m unit

test-integration: setup
	$(TOOLS) && $(BIN)/pytest -m integration

test-e2e: setup image
	$(TOOLS) && $(BIN)/pytest -m e2e

# Needs Docker, so neither `make test` nor CI here runs it (never run on these machines): a kind cluster
# (kept between runs), the image, Kafka, MinIO and Iceberg's REST catalog in it, then e2e/test_user_path.py,
# the local e2e's module, with ICEFALL_E2E_KUBECONFIG set to that cluster (hack/kind/e2e-kind.sh): it
# `helm install`s the chart and applies examples/cluster.yaml as it is. `make e2e-kind-clean` deletes it.
.PHONY: e2e-kind e2e-kind-clean
e2e-kind: setup
	$(TOOLS) && hack/kind/e2e-kind.sh
e2e-kind-clean:
	hack/kind/e2e-kind.sh --delete

# Benchmarks (not tests): results in bench/results/. Pass options with BENCH_ARGS="--records N --seconds S".
bench-ingest: venv
	$(BIN)/python bench/ingest.py $(BENCH_ARGS)

# Icefall side by side with Spark Structured Streaming, the Iceberg Kafka Connect sink and a floor
# (bench/compare.py; results in bench/results/compare.md and .png). A short run: BENCH_ARGS=--quick.
.PHONY: bench
bench: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/compare.py $(BENCH_ARGS)
# Delta Lake (#42): Icefall -> Delta beside Spark Structured Streaming -> Delta, the same backlog in one run,
# each table audited by content (bench/delta.py; results in bench/results/delta.md).
.PHONY: bench-delta
bench-delta: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/delta.py $(BENCH_ARGS)
# Pipelining on and off, a preloaded backlog drained by `icefall run` (bench/results/pipelining.md).
.PHONY: bench-pipelining
bench-pipelining: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/pipelining.py $(BENCH_ARGS)
# The growth table: the same drain measurement for Icefall and Spark over ~230 B / ~1 KB / ~4 KB events x 3 /
# 48 partitions (bench/compare.py --growth; results in bench/results/growth.md). Smaller: BENCH_ARGS=
# "--records 40000 --warmup-records 10000", fewer cells: "--growth-sizes small,4k --growth-partitions 3".
.PHONY: bench-growth
bench-growth: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/compare.py --growth $(BENCH_ARGS)
# Upserts (#14): Icefall's keyed table (with and without compaction) beside Spark Structured Streaming's
# foreachBatch MERGE over 1,000,000 keys, a change backlog and an hour of live changes per system
# (bench/upsert.py; results in bench/results/upsert.md). A smoke run: BENCH_ARGS=--quick; a shorter live
# stream: BENCH_ARGS="--seconds 600".
.PHONY: bench-upsert
bench-upsert: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/upsert.py $(BENCH_ARGS)
# Sustained drains (issue #45): 5,000,000 small events per system for JSON, JSON Schema, Avro and Protobuf
# (bench/compare.py --sustained; bench/results/sustained.md), then keyed: 5M keys and 5M changes, Icefall beside
# Spark's MERGE (bench/upsert.py --sustained; bench/results/sustained-upsert.md). On 2 cores: ~1 h for
# compare.py, ~35 min for upsert.py (2026-11-30): run it on a quiet machine. Options: SUSTAINED_ARGS to compare.py (e.g. "--records 1000000"), SUSTAINED_UPSERT_ARGS to upsert.py.
.PHONY: bench-sustained
bench-sustained: setup $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/compare.py --sustained $(SUSTAINED_ARGS)
	$(TOOLS) && $(BIN)/python bench/upsert.py --sustained $(SUSTAINED_UPSERT_ARGS)
$(VENV)/.bench-installed: pyproject.toml constraints.txt
	@$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'
	@touch $@

# Where a batch's CPU goes: Icefall's write path (and its variants) beside the plain Spark write, in one Spark
# session, round after round (bench/write_path.py; results in bench/results/write_path.md).
.PHONY: bench-write-path
bench-write-path: setup
	$(TOOLS) && $(BIN)/python bench/write_path.py $(BENCH_ARGS)

# Where an `icefall run` drain spends its CPU: JFR on the Spark JVM, py-spy (a dev tool, installed here into
# the venv, not a dependency) on the driver (bench/profile_drain.py; bench/results/profile.md); a keyed
# table's updates: BENCH_ARGS="--keyed --large-records 0 --warmup-records 200000 --out
# bench/results/profile-keyed.md". The decode alone,
# Icefall's decoder beside candidates (bench/decode_variants.py; bench/results/decode_variants.md).
.PHONY: bench-profile bench-decode
bench-profile: setup
	$(BIN)/pip install -q py-spy
	$(TOOLS) && $(BIN)/python bench/profile_drain.py $(BENCH_ARGS)
bench-decode: setup
	$(TOOLS) && $(BIN)/python bench/decode_variants.py $(BENCH_ARGS)

# Fresh reads (#16): latency and staleness of a union read (`icefall read`) beside a plain scan of the table
# while ingestion commits (bench/union_read.py; results in bench/results/union_read.md).
.PHONY: bench-fresh
bench-fresh: setup
	$(TOOLS) && $(BIN)/python bench/union_read.py $(BENCH_ARGS)

# Routing (#43): one topic of 20 event types into 20 tables by one StreamingTable with routes, beside 20
# filtered StreamingTables and one plain table of the topic: records per CPU-second and freshness p99,
# audited by content (bench/routing.py; results in bench/results/routing.md). 44 minutes at load 20-43 on 2
# cores; shorter: BENCH_ARGS="--types 5 --records 10000".
.PHONY: bench-routing
bench-routing: setup
	$(TOOLS) && $(BIN)/python bench/routing.py $(BENCH_ARGS)

# The operator (`icefall operator`, a real kopf process) with 10, 100 and 300 StreamingTables on a real
# kube-apiserver + etcd (no kubelet: driver Pods stay Pending): API requests per table per minute from the API
# server's own metrics, the operator's CPU and RSS, a new table's children and a spec change's new driver Pod
# (bench/operator_scale.py; results in bench/results/operator.md). About 25 minutes on 2 cores; shorter:
# BENCH_ARGS="--tables 10,100 --window 120".
.PHONY: bench-operator
bench-operator: setup
	$(TOOLS) && nice -n 10 $(BIN)/python bench/operator_scale.py $(BENCH_ARGS)

# The figures behind bench/results/scale.md's 1 GiB/s model (bench/scale.py; results in
# bench/results/scale-measured.md): Icefall's drain per core over ~230 B / ~1 KB events x 3/48/192 partitions
# (compare.py --growth's measurement), one driver's commits/s and the catalog's compare-and-swap on SQLite
# and PostgreSQL, one Kafka consumer's fetch. Defaults not timed yet (50,000 records took 40 min at load 15-28); shorter:
# BENCH_ARGS="--records 40000 --warmup-records 10000 --partitions 3,48 --commits 100".
.PHONY: bench-scale
bench-scale: setup $(VENV)/.bench-installed
	$(TOOLS) && nice -n 10 $(BIN)/python bench/scale.py $(BENCH_ARGS)

# Spark executors as pods (bench/executors.py; results in bench/results/executors.md): the e2e's cluster (the
# image built first), the operator with its default Spark master, one backlog drained with 1 then 2 executor
# pods: executors' CPU per record, tasks per executor, the driver's CPU per commit, audited by content.
.PHONY: bench-executors
bench-executors: setup image $(VENV)/.bench-installed
	$(TOOLS) && $(BIN)/python bench/executors.py $(BENCH_ARGS)

# Files per partition, read time and commit latency with and without compaction. Default: one hour of
# 5-second commits per arm (two hours in all); compress with BENCH_ARGS="--commits 150 --interval 1".
.PHONY: bench-compaction
bench-compaction: setup
	$(TOOLS) && $(BIN)/python bench/compaction.py $(BENCH_ARGS)

# The chaos run (e2e/chaos_run.py; not a test: `make test` never collects it): CHAOS_KILLS observed kills of
# the driver, compaction pods and operator of an append and a keyed (upsert) Iceberg table and an append
# Delta table on MinIO (e2e/chaos_delta.py), CHAOS_INFRA_FAULTS
# faults of the services (the three-node Kafka cluster: a partition leader's or the controller's SIGKILL,
# an unclean or a rolling restart; PostgreSQL, MinIO, the REST catalog, kube-apiserver, etcd; default: half
# the kills, a third of all faults), plus a broker restart, catalog and object-store outages and a paused
# writer, then an audit of the three tables by content. CHAOS_KILLS=20 took 39 min on a 2-core machine at a load average
# of 12 to 19 (setup and the four outages are ~20 min of it; a driver kill costs a Spark start). Results in
# bench/results/chaos.md. Extra pytest options: CHAOS_ARGS.
CHAOS_KILLS ?= 200
CHAOS_INFRA_FAULTS ?= $(shell echo $$(( ($(CHAOS_KILLS) + 1) / 2 )))
CHAOS_SEED ?= 1
chaos: setup
	$(TOOLS) && ICEFALL_CHAOS_KILLS=$(CHAOS_KILLS) ICEFALL_CHAOS_SEED=$(CHAOS_SEED) \
	  ICEFALL_CHAOS_INFRA_FAULTS=$(CHAOS_INFRA_FAULTS) \
	  $(BIN)/pytest e2e/chaos_run.py -s $(CHAOS_ARGS)

# DEMO=examples/avro-orders.yaml: Avro through a local schema registry (fetched on first use), with a
# producer that adds a field. Sets up only what the demo uses, not the test stack (`make setup`).
DEMO ?= examples/orders.yaml
demo: prereqs-demo venv-demo tools-demo
	$(DEMO_TOOLS) && $(BIN)/python -m icefall.devstack.demo -f $(DEMO)

clean:
	rm -rf $(VENV) .icefall .mypy_cache .ruff_cache
