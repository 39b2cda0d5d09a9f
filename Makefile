# Session projector — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY      := .venv/bin/python
VENV_OK := .venv/.installed

.PHONY: help setup tools run test secured-servers-up secured-servers-down test-fast test-compiled test-differential chaos-crash chaos-garbage chaos-api lint typecheck check services-up services-down services-status bench clean proto bench-api bench-reconcile bench-audit bench-mix bench-replay-memory \
	redis-cluster-up redis-cluster-down redis-cluster-status kafka-cluster-up kafka-cluster-down kafka-cluster-status \
	chaos-infra-check chaos sdk crash-power

help: ## List the targets with what they do
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z_-]+:.*?## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV_OK): pyproject.toml
	@python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (python3 is " + sys.version.split()[0] + ")")'
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[dev]'
	@touch $@

setup: $(VENV_OK) ## Create .venv and install the project with its dev tools

services-up: setup ## Install (first time) and start Kafka, Redis and Cassandra on 127.0.0.1, create schema and topics
	bash scripts/services.sh up

tools: setup ## Install the extra tools the tests use (scripts/tools.d/: browser, promtool, proxies...)
	bash scripts/tools.sh

services-down: ## Stop the local Kafka, Redis and Cassandra
	bash scripts/services.sh down

services-status: ## Show which local servers are running
	bash scripts/services.sh status

redis-cluster-up: ## Start (idempotent; reuses/repairs) the local Redis Cluster: 3 masters + 3 replicas on 127.0.0.1:7101-7106
	bash scripts/redis_cluster.sh up

redis-cluster-down: ## Stop this checkout's Redis Cluster nodes and forget the cluster (the next up creates it anew)
	bash scripts/redis_cluster.sh down

redis-cluster-status: ## Health of the local Redis Cluster, one line per node
	bash scripts/redis_cluster.sh status

kafka-cluster-up: setup ## Start (idempotent) the chaos tests' 3-node Kafka KRaft cluster (RF 3, min ISR 2) on 127.0.0.1:9191-9193
	bash scripts/kafka_cluster.sh up

kafka-cluster-down: ## Stop this checkout's 3-node Kafka cluster (data kept in .local/kafka-cluster)
	bash scripts/kafka_cluster.sh down

kafka-cluster-status: ## Health of the 3-node Kafka cluster, one line per node
	bash scripts/kafka_cluster.sh status

SECURED_DIR ?= .local/secured
secured-servers-up: services-up ## A SASL_SSL Kafka and a Cassandra with passwords and client TLS on free ports (scripts/secured_servers.py); settings in SECURED_DIR (.local/secured)/secured.env
	$(PY) scripts/secured_servers.py up $(SECURED_DIR)

secured-servers-down: ## Stop the secured Kafka and Cassandra of SECURED_DIR and delete the folder (the next up makes new certificates and passwords)
	$(PY) scripts/secured_servers.py down $(SECURED_DIR)
	rm -rf $(SECURED_DIR)

chaos-infra-check: services-up tools ## The chaos tooling's own tests (-m chaos): starts the Kafka cluster itself, stops it after unless KAFKA_CLUSTER_KEEP=1
	$(PY) -m pytest -q -m chaos tests/chaos

run: services-up ## Set up, start the servers and run the main job (worker fed by the simulator)
	bash scripts/run.sh

# The worker tests that decide correctness, run a second time with the workers on the compiled build:
# the crash run as deployed (standby copies on), J-2..J-7 and the garbage run. The standby-off crash
# run and J-1's 100 s stretched stream run once, on the pure build: which flushes happen is decided
# by the compiled modules identically (tests/differential compares both builds' flushes and
# persists byte for byte), and the CI budget (45 min on 2 cores) has no room for them twice.
COMPILED_WORKER_TESTS := 'tests/integration/test_crash_safety.py::test_random_sigkills_with_a_backlog_under_cpu_contention_lose_nothing[standby-copies]' tests/integration/test_worker_acceptance.py tests/integration/test_garbage_worker.py

test: services-up tools sdk ## Set up, start the servers, install the test tools, build and test the TypeScript SDK, and run the whole test suite (chaos tests apart; the pure and compiled builds compared; the SDK's outside consumer included), then the unit and property suites and the deciding worker tests against the compiled build
	$(PY) -m pytest -q -m "not chaos"
	bash scripts/test_compiled.sh
	SESSION_PROJECTOR_TEST_BUILD=compiled $(PY) -m pytest -q -m "not chaos" -p no:cacheprovider $(COMPILED_WORKER_TESTS)

SDK_PACK := .local/sdk
sdk: ## The TypeScript SDK (sdk-ts/): strict tsc build, its unit tests (node --test), npm pack into .local/sdk/ (node, npm, tsc: scripts/tools.d/node.sh)
	bash scripts/tools.sh node
	cd sdk-ts && npm test --silent
	@mkdir -p $(SDK_PACK)
	cd sdk-ts && npm pack --silent --pack-destination ../$(SDK_PACK)

test-fast: setup ## Run the unit, property and contract tests only (no servers, no compiled build)
	$(PY) -m pytest -q -m "not integration and not chaos and not compiled"

test-compiled: setup ## The unit and property suites against the mypyc-compiled build (builds it when the code changed; issue 14)
	bash scripts/test_compiled.sh

DIFF_SCALE ?= 25
test-differential: setup ## The pure and compiled builds compared at full size (DIFF_SCALE x CI's examples, >= 1,000,000 lines; issue 30)
	DIFF_SCALE=$(DIFF_SCALE) $(PY) -m pytest -q -p no:cacheprovider tests/differential
	@cat .local/differential/last.json; echo

CHAOS_RUNS ?= 20
CHAOS_SCENARIOS ?=
chaos: services-up tools ## Issue 18's fault scenarios at full size (long), report in docs/reliability.md; CHAOS_SCENARIOS=a,b for a subset
	$(PY) -m tests.chaos.run_all --scenarios "$(CHAOS_SCENARIOS)"

chaos-crash: services-up ## Issue 11's crash run at full size, CHAOS_RUNS times in a row (default 20), one seed each
	@mkdir -p .local/chaos-crash; for i in $$(seq 1 $(CHAOS_RUNS)); do \
		echo "== crash run $$i/$(CHAOS_RUNS)"; \
		$(PY) -m pytest -q -s -m chaos tests/integration/test_crash_safety.py -k test_full_size_crash_run --chaos-seed $$i -p no:cacheprovider \
			--basetemp .local/chaos-crash/run-$$i || exit 1; \
	done

CRASH_POWER_RUNS ?= 10
crash-power: services-up ## The CI crash run's power: with each planted persist bug (tests/support/plant_site) it must fail in >= 9 of CRASH_POWER_RUNS runs
	CRASH_POWER_RUNS=$(CRASH_POWER_RUNS) $(PY) -m pytest -q -s -m chaos tests/integration/test_crash_safety.py -k test_the_crash_test_catches_a_planted_loss -p no:cacheprovider

chaos-garbage: services-up ## Issue 18's garbage run at full size: 100,000 fuzzed records through a real worker
	$(PY) -m pytest -q -s -m chaos tests/integration/test_garbage_worker.py -p no:cacheprovider

chaos-api: services-up ## Issue 18's API fuzz at full size: schemathesis, >= 5,000 requests, two users, real servers
	$(PY) -m pytest -q -s -m chaos tests/integration/test_api_fuzz.py -p no:cacheprovider

lint: setup ## ruff + import rules (the domain core stays pure)
	.venv/bin/ruff check app agents tables tests bench
	.venv/bin/lint-imports

typecheck: setup ## mypy --strict on the code, then on the tests and the benchmarks
	.venv/bin/mypy
	.venv/bin/mypy tests bench

check: lint typecheck test ## What CI runs, plus lint and types

bench: setup ## Benchmarks, reported as ratios against baselines run side by side
	bash bench/run.sh

clean: ## Remove build and test caches (not the servers' data)
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.egg-info

proto: ## Regenerate app/api/cursor_pb2.py(+.pyi) from proto/cursor.proto (protoc from grpcio-tools, own venv)
	bash proto/generate.sh

bench-reconcile: services-up ## One user's reconcile on login (real Redis + Cassandra): ms and µs/row by size, clean and drifted
	$(PY) -m bench.reconcile_bench --sizes 100,1000,5000 --reps 5 --unread-share 1.0
	$(PY) -m bench.reconcile_bench --sizes 5000 --reps 5 --unread-share 0.1

bench-api: services-up ## Query API benchmark: warm/cold page p50/p99 (server side) and warm requests/s, 5,000-conversation user
	$(PY) bench/api_bench.py

bench-audit: setup ## Unread audit at 10M rows (a real partition store): event-loop lag p50/p99 and cost per round, the sweep against the former full scan
	PYTHONPATH=. $(PY) bench/audit_bench.py --rows 10000000 --sweep-rounds 20 --json bench/out/audit/report.json

bench-mix: services-up ## The product's mix (issue 33): group traffic at 0.5x capacity, 5 s window, DMs and mentions through it; entry -> SSE event (~3 min)
	$(PY) bench/mix_bench.py

bench-replay-memory: setup ## Peak RSS of `replay --state-dir` on the first 0.5M, 1M and all 3.5M lines of a 200,000-user stream, next to the build before the shared memtable budget, outputs compared byte for byte (~20 min; RMBENCH_STREAM=FILE reuses a stream)
	PYTHONPATH=. $(PY) bench/replay_memory_bench.py $(if $(RMBENCH_STREAM),--stream $(RMBENCH_STREAM))
