# Engram: `make run` brings up Postgres (with pgvector) and RabbitMQ, then runs the three services
# with local defaults; `make test` runs the whole suite against them. `make help` lists the rest.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Build output lives outside the clone so CI and repeated clones build incrementally.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/engram/target
export ENGRAM_LOCAL_DIR ?= /var/tmp/engram-local
PROFILE ?= debug
CARGO_PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)
export ENGRAM_BIN_DIR := $(CARGO_TARGET_DIR)/$(PROFILE)
TOOLS_BIN := $(ENGRAM_LOCAL_DIR)/tools/bin
LOCAL := deploy/local

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}'

.PHONY: up
up: ## Bring up Postgres 18 + pgvector (port 55432) and RabbitMQ (5672), reusing what runs
	@bash $(LOCAL)/up.sh >/dev/null

.PHONY: models
models: ## Install the local embedding model (all-MiniLM-L6-v2) into $(ENGRAM_LOCAL_DIR)/models
	@bash $(LOCAL)/models.sh >/dev/null

.PHONY: tools
tools: ## Install grpcurl and buf into $(ENGRAM_LOCAL_DIR)/tools/bin
	@bash $(LOCAL)/tools.sh >/dev/null

.PHONY: build
build: ## Build the three services ($(PROFILE) profile; PROFILE=release for optimized)
	cargo build $(CARGO_PROFILE_FLAG) --bin ingest --bin retrieval --bin review

.PHONY: run
run: up tools models build ## Bring up everything and run Engram in the background on 50051-50053
	@bash $(LOCAL)/services.sh start
	@bash $(LOCAL)/examples.sh

.PHONY: status
status: ## Show what runs
	@bash $(LOCAL)/services.sh status
	@bash $(LOCAL)/postgres.sh status || true
	@bash $(LOCAL)/rabbitmq.sh status || true

.PHONY: stop
stop: ## Stop the three services (keeps Postgres and RabbitMQ)
	@bash $(LOCAL)/services.sh stop

.PHONY: down
down: stop ## Stop everything `make run` started
	@bash $(LOCAL)/down.sh

.PHONY: migrate
migrate: up build ## Apply database migrations
	@source $(ENGRAM_LOCAL_DIR)/env && $(ENGRAM_BIN_DIR)/ingest migrate

.PHONY: test
test: up models tools ## Run the whole test suite against the real Postgres and RabbitMQ (grpcurl runs the README examples)
	@bash $(LOCAL)/drop-test-databases.sh
	@if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --workspace --profile ci; \
	else \
		echo "engram: cargo-nextest not found (cargo install cargo-nextest); using cargo test"; \
		cargo test --workspace; \
	fi

.PHONY: lint
lint: tools ## rustfmt check, clippy with -D warnings, buf lint
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	PATH="$(TOOLS_BIN):$$PATH" buf lint

.PHONY: k8s-validate
k8s-validate: ## Validate the Kubernetes manifests offline
	@bash deploy/k8s-validate.sh

.PHONY: bench-ingest
bench-ingest: up ## Ingest benchmark: Remember throughput/latency, near-duplicate lookup cost (release build; Postgres on huge pages when root)
	cargo build --release --bin ingest --bin bench-ingest
	@bash deploy/bench/ingest.sh

.PHONY: bench-retrieval
bench-retrieval: up models ## Retrieval benchmark: 1M memories / 10k spaces; RetrieveMemory vs hand-written SQL vs floor (release build)
	cargo build --release --bin ingest --bin retrieval --bin bench-retrieval
	@bash deploy/bench/retrieval.sh

.PHONY: eval
eval: up models ## Retrieval quality: recall@k / nDCG@k per ranking profile and parameter sweeps, and on the multi-session dialogs (release build)
	cargo build --release --bin ingest --bin retrieval --bin eval --bin eval-dialogs --bin eval-facts
	@bash deploy/eval/run.sh

.PHONY: eval-reads
eval-reads: up models ## What an assistant reads from the dialogs alone, printed (a few minutes; for trying a retrieval change before make eval)
	cargo build --release --bin ingest --bin retrieval --bin eval-dialogs
	@bash deploy/eval/run.sh --reads-only

.PHONY: eval-facts
eval-facts: ## Facts from conversations: the local consolidation on the labelled fact and conflict sets (seconds, no database; writes docs/eval/facts.md)
	cargo build --release --bin eval-facts
	$(CARGO_TARGET_DIR)/release/eval-facts --facts tests/eval/facts/labelled.json \
		--conflicts tests/eval/conflicts/labelled.json --dialogs tests/eval/dialogs \
		--dialog-facts tests/eval/dialog_facts/labelled.json --report docs/eval/facts.md

.PHONY: eval-topic
eval-topic: models ## Segmentation: calibrate the topic rules for their turn vectors on tests/eval/dialogs and write docs/eval/topic.md (release build)
	cargo build --release --bin eval-topic
	$(CARGO_TARGET_DIR)/release/eval-topic

.PHONY: eval-review
eval-review: up models ## Review: calibrate the local grader on tests/eval/review and write docs/eval/review.md (release build)
	cargo build --release --bin eval-review
	$(CARGO_TARGET_DIR)/release/eval-review

.PHONY: report
report: up ## Retrieval metrics summary (hit rates, fallback and truncation shares, p95 latency) from the database
	@bash deploy/local/report.sh

.PHONY: bench-retention
bench-retention: up models ## Retention benchmark: one run deleting 10 % of the 1M-memory database while RetrieveMemory serves 50 QPS (release build)
	cargo build --release --bin ingest --bin retrieval --bin bench-retrieval
	@bash deploy/bench/retention.sh

.PHONY: bench-embed
bench-embed: up models ## Embedding benchmark: raw model throughput, backfill throughput, write-to-embedding latency (release build)
	cargo build --release --bin ingest --bin bench-embed
	@bash deploy/bench/embed.sh

.PHONY: bench-review
bench-review: up models ## Review benchmark: a segment of 50 memories graded and applied (p95), the consumer's segments/s through the bus (release build)
	cargo build --release --bin ingest --bin review --bin bench-review
	@bash deploy/bench/review.sh

.PHONY: bench-conversations
bench-conversations: up models ## Conversations benchmark: AppendMessages at 200 turns/s, segmentation keeping up, closing turn to searchable episode (release build)
	cargo build --release --bin ingest --bin retrieval --bin bench-conversations
	@bash deploy/bench/conversations.sh
