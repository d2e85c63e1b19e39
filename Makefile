# Everything a fresh machine needs is installed on first use: a virtualenv with bergstream and its Python
# dependencies at the versions of constraints.txt, and the JVM jars pinned in core/src/bergstream/jvm/pom.xml
# (resolved once with Maven).
#
# PYTHON picks the interpreter, 3.11 to 3.13: python3.11 (the default) lives in .venv, any other in
# .venv-<version>, so `make test PYTHON=python3.13` builds and uses .venv-3.13.
PYTHON ?= python3.11
ifeq ($(PYTHON),python3.11)
VENV ?= .venv
else
VENV ?= .venv-$(patsubst python%,%,$(notdir $(PYTHON)))
endif
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The source roots, one per top-level folder (setup.py's ROOTS; tests/test_layout.py checks they agree).
SOURCE_ROOTS := core/src:schemas/src:router/src:backfill/src:runtime/src:apps/src:deploy/src:local/src:cli/src
# The newer Pythons that `make test-pythons` checks, and the end-to-end tests it runs on each.
OTHER_PYTHONS := python3.12 python3.13
END_TO_END := tests/test_router.py::test_available_now_archives_each_offset_once_and_commits_the_group \
	tests/test_backfill_spark.py::test_two_sources_emit_each_row_of_the_window_once_epoch_by_epoch_aligned

# Prints the interpreter's own path: PYTHON's when it runs; otherwise, under pyenv, that of the newest installed
# version that has it (pyenv's python3.13 shim refuses to run while pyenv has another version selected).
find_python = $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null \
	|| PYENV_VERSION=$$(pyenv whence $(PYTHON) 2>/dev/null | sort -V | tail -n 1) \
	$(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null

# pyspark comes as a 450 MB source archive. pip builds it into a wheel once (pip's wheel cache keeps the build),
# and every virtualenv installs that wheel: uv would download and build the archive again for each one
# wherever the index serves it without cache headers.
WHEELS := $(or $(BERGSTREAM_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/bergstream)/wheels
PYSPARK_WHEEL := $(WHEELS)/pyspark-$(shell sed -n 's/^pyspark==\([^ ;]*\).*/\1/p' constraints.txt)-py2.py3-none-any.whl

.PHONY: setup demo demo-wheel test test-jvm docs test-image test-unit test-short test-pythons fresh-check lint lock lock-upgrade clean

# uv comes first, from the interpreter's pip: it installs the rest and compiles constraints.txt.
$(BIN)/uv:
	@python="$$($(find_python))"; sh deploy/install-system-packages.sh "$${python:-$(PYTHON)}"
	@python="$$($(find_python))" || { echo "$(PYTHON) not found: install it, or pick another with" \
		"make PYTHON=python3.12 (bergstream runs on Python 3.11 to 3.13)" >&2; exit 1; }; \
		echo "$$python -m venv $(VENV)"; "$$python" -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt uv

$(PYSPARK_WHEEL): | $(BIN)/uv
	mkdir -p $(WHEELS)
	tmp=$$(mktemp -d $(WHEELS)/.build.XXXXXX) \
		&& $(BIN)/pip wheel -q --no-deps -c constraints.txt pyspark -w $$tmp && mv $$tmp/pyspark-*.whl $@; \
		status=$$?; rm -rf $$tmp; exit $$status

$(INSTALLED): pyproject.toml constraints.txt $(BIN)/uv | $(PYSPARK_WHEEL)
	sh deploy/install-system-packages.sh "$(abspath $(BIN)/python)"
	$(BIN)/uv pip install -q --python $(BIN)/python --find-links $(WHEELS) -c constraints.txt -e '.[dev,postgres]'
	@# The editable install's finder maps the source roots for imports alone; tools that walk the bergstream
	@# namespace on sys.path (lint-imports, pyright, jedi) find every root through this file.
	$(BIN)/python -c 'import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], "bergstream-source-roots.pth").write_text("\n".join(sys.argv[1:]) + "\n")' \
		$(addprefix $(CURDIR)/,$(subst :, ,$(SOURCE_ROOTS)))
	@touch $@

# The jars alone: the Go-built parts of the local stack (versitygw, the schema registry) are built on first use
# by what runs them (`local up --object-store s3`, `--schema-registry`, the tests of them), or by `local install`.
setup: $(INSTALLED)
	$(BIN)/bergstream jars resolve

demo: setup
	$(BIN)/bergstream demo

# The demo as a user gets it: bergstream's wheel (its Java built by Maven, inside it) installed with its
# dependencies into a virtualenv of its own, and `bergstream demo` run in a working folder outside the
# checkout. Both live in DEMO_WHEEL_DIR, made anew; DEMO_COUNT sets the records per topic (tests/test_demo_wheel.py).
# DEMO_WHEEL_FILE installs a wheel built already (the tests build one for tests/test_layout.py too).
DEMO_WHEEL_DIR ?= $(or $(TMPDIR),/tmp)/bergstream-demo-wheel
DEMO_WHEEL := $(abspath $(DEMO_WHEEL_DIR))
demo-wheel: setup
	rm -rf $(DEMO_WHEEL) && mkdir -p $(DEMO_WHEEL)/work $(DEMO_WHEEL)/dist
	$(if $(DEMO_WHEEL_FILE),cp $(DEMO_WHEEL_FILE) $(DEMO_WHEEL)/dist/,$(BIN)/uv build -q --wheel --out-dir $(DEMO_WHEEL)/dist .)
	$(BIN)/uv venv -q --python $(BIN)/python $(DEMO_WHEEL)/venv
	$(BIN)/uv pip install -q --python $(DEMO_WHEEL)/venv/bin/python --find-links $(WHEELS) \
		-c constraints.txt $(DEMO_WHEEL)/dist/bergstream-*.whl
	cd $(DEMO_WHEEL)/work && env -u VIRTUAL_ENV -u PYTHONPATH -u BERGSTREAM_HOME \
		$(DEMO_WHEEL)/venv/bin/bergstream demo $(if $(DEMO_COUNT),--count $(DEMO_COUNT))

# A pytest process per core and one more (at most 6), each with its broker and Spark session, a test module each at
# a time: the tests wait on brokers, Kafka's timeouts and queries much of the time, and on 2 cores three
# processes take a tenth less time than two (1,421 s against 1,574 s), two a third less than one (docs/tests.md).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 < 6 ? n + 1 : 6 )))
test: setup test-jvm docs
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not image"

# bergstream's Java, a Maven module per part (schemas, router, backfill), compiled and tested with JUnit against
# the pinned Spark and Iceberg, then put in bergstream-spark.jar by the build a checkout and a wheel use
# (parts.xml); the count of tests and the time said at the end (from surefire's reports of the run: those of an
# earlier run removed first).
test-jvm:
	@started=$$(date +%s); rm -rf */jvm/target/*/surefire-reports; \
	mvn -q -B -f core/src/bergstream/jvm/parts.xml package || exit 1; \
	count=$$(cat */jvm/target/*/surefire-reports/TEST-*.xml 2>/dev/null \
		| sed -n 's/.*<testsuite [^>]*tests="\([0-9]*\)".*/\1/p' | awk '{n += $$1} END {print n + 0}'); \
	echo "make test-jvm: $$count JUnit tests passed in $$(( $$(date +%s) - started )) s"

# The documentation site, docs/ as mkdocs.yml lays it out, built into site/: --strict fails on a link to a page
# or a section that is not there (tests/test_docs.py checks the commands the pages show). Its output is shown
# only when it fails: --quiet would hide the warnings from --strict too.
docs: setup
	@out=$$($(BIN)/mkdocs build --strict 2>&1) || { printf '%s\n' "$$out" >&2; exit 1; }

# bergstream's image built from the Dockerfile and run: the demo inside it, and the compose stack's Spark
# master and worker (tests/test_image.py). Needs a Docker engine, or Debian's docker.io to start one.
test-image: setup
	sh deploy/install-system-packages.sh --image "$(abspath $(BIN)/python)"
	$(BIN)/pytest -m image

test-unit: setup
	$(BIN)/pytest -m "not integration"

# The unit tests and one end-to-end test each of the router and the backfill, on PYTHON.
test-short: setup
	$(BIN)/pytest -m "not integration"
	$(BIN)/pytest $(END_TO_END)

# The same tests on each of OTHER_PYTHONS. Their virtualenvs are set up one after the other, then the tests run
# side by side, each line prefixed with its Python: on 2 cores that takes a quarter less time than in turn.
test-pythons:
	@for python in $(OTHER_PYTHONS); do $(MAKE) --no-print-directory PYTHON=$$python setup || exit 1; done
	@status=$$(mktemp -d); \
	for python in $(OTHER_PYTHONS); do \
		bin=.venv-$${python#python}/bin; \
		{ $$bin/pytest -p no:cacheprovider -m "not integration" && $$bin/pytest -p no:cacheprovider $(END_TO_END); \
			echo $$? > $$status/$$python; } 2>&1 | sed -u "s/^/$$python: /" & \
	done; \
	wait; failed=""; \
	for python in $(OTHER_PYTHONS); do [ "$$(cat $$status/$$python)" = 0 ] || failed="$$failed $$python"; done; \
	rm -rf $$status; \
	if [ -n "$$failed" ]; then echo "make test-pythons: tests failed on$$failed" >&2; exit 1; fi; \
	echo "make test-pythons: the tests passed on $(OTHER_PYTHONS)"

# README's two commands and .ci/run in a clean clone of HEAD, with an empty HOME and a PATH of the system and the
# toolchains alone: what a machine that never ran bergstream would do, timed (.ci/fresh-machine says more).
# IMAGE_PACKAGES names the Debian packages of a new machine, to list those installed since by hand.
fresh-check:
	IMAGE_PACKAGES=$(IMAGE_PACKAGES) FRESH_DIR=$(FRESH_DIR) bash .ci/fresh-machine

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# constraints.txt pins every Python package, for every Python bergstream supports: one resolution whose
# markers split a package only where a version drops a Python. `make lock` keeps the pins that still satisfy
# pyproject.toml and adds what it gained; `make lock-upgrade` moves every pin to the newest version.
LOCK := $(BIN)/uv pip compile -q --universal --python-version 3.11 --all-extras \
	--custom-compile-command "make lock" pyproject.toml -o constraints.txt

lock: $(BIN)/uv
	$(LOCK)

lock-upgrade: $(BIN)/uv
	$(LOCK) --upgrade

clean:
	rm -rf .venv .venv-3.* .bergstream .mypy_cache .ruff_cache .pytest_cache site
