# torchcap: every entry point a user or CI needs.
#
#   make demo    trace the built-in ResNet-18 and show what was captured
#   make test    install what is missing, build, run every test through ctest
#   make fuzz    fuzz the file loader for FUZZ_SECONDS (default 300) with libFuzzer
#   make zoo     trace, export and check every scriptable torchvision family
#   make sweep   every sample input of PyTorch's operator database through torchcap
#
# Each target installs missing Debian packages first (`make deps`), so a fresh
# Debian 12 machine needs nothing else.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

# Debian packages torchcap builds, tests, benchmarks and fuzzes with.
DEB_PACKAGES := \
	cmake g++ make \
	libtorch-dev libopenblas0-openmp python3-torch python3-torchvision python3-pytest python3-dev pybind11-dev python3-onnx \
	libgtest-dev libgmock-dev libbenchmark-dev \
	nlohmann-json3-dev libcli11-dev libdnnl-dev libdw-dev libunwind-dev zlib1g-dev \
	graphviz ccache ninja-build clang libclang-rt-14-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps configure build test demo bench fuzz clean

all: build

# Installs only what is missing; runs `apt-get update` only when it must.
deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# torchvision's scriptable families, small inputs and random weights, through
# the command (trace and --export, checked against eager in C++) and
# torchcap.load (checked again in Python); one line per model and a summary.
# `make test` runs the smallest of them (tests/python/zoo.py --smallest).
.PHONY: zoo
zoo: build
	/usr/bin/python3 tests/python/zoo.py --cli $(BUILD_DIR)/torchcap

# Every float32 CPU sample input of PyTorch's operator database (op_db)
# through torchcap.trace, dispatch_trace and save+load, compared with eager
# on the samples and on fresh inputs; a summary, the failures by cause and
# every result that is not ok. Without --all the script checks two samples per
# operator (the first and the last; about 20 s of CPU).
# SWEEP_ARGS adds options, e.g. SWEEP_ARGS="--ops nonzero,cat --json sweep.json".
SWEEP_JOBS ?= $(JOBS)
.PHONY: sweep
sweep: build
	PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3 tests/python/op_sweep.py --all \
	  --jobs $(SWEEP_JOBS) $(SWEEP_ARGS)

# Headers, library and CMake package: find_package(torchcap) then works with
# CMAKE_PREFIX_PATH=$(PREFIX) (see examples/consumer).
.PHONY: install
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# AddressSanitizer and UndefinedBehaviorSanitizer over torchcap and every test,
# in a build directory of their own (cmake/sanitize.cmake has the options,
# tests/lsan.supp the policy on leak suppressions).
SANITIZE_DIR ?= build-sanitize
.PHONY: sanitize
sanitize: deps
	cmake -S . -B $(SANITIZE_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DTORCHCAP_SANITIZE=address,undefined
	cmake --build $(SANITIZE_DIR) -j $(JOBS)
	cd $(SANITIZE_DIR) && ctest --output-on-failure -j $(JOBS)

# Trace the built-in ResNet-18, save it, show it, run it, draw it. Builds
# only what the demo runs (the library and the command, not the tests,
# benchmarks or the Python extension), so a first `make demo` is quick.
DEMO_DIR = $(BUILD_DIR)/demo
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target torchcap_cli
	@mkdir -p $(DEMO_DIR)
	@echo "== torchcap trace --example resnet18 -o $(DEMO_DIR)/resnet18.tcg"
	@$(BUILD_DIR)/torchcap trace --example resnet18 -o $(DEMO_DIR)/resnet18.tcg
	@echo; echo "== torchcap show $(DEMO_DIR)/resnet18.tcg"
	@$(BUILD_DIR)/torchcap show $(DEMO_DIR)/resnet18.tcg
	@echo; echo "== torchcap show --code (first lines)"
	@$(BUILD_DIR)/torchcap show $(DEMO_DIR)/resnet18.tcg --code | head -12
	@echo; echo "== torchcap run $(DEMO_DIR)/resnet18.tcg"
	@$(BUILD_DIR)/torchcap run $(DEMO_DIR)/resnet18.tcg
	@echo; echo "== torchcap show --svg $(DEMO_DIR)/resnet18.svg"
	@$(BUILD_DIR)/torchcap show $(DEMO_DIR)/resnet18.tcg --svg $(DEMO_DIR)/resnet18.svg

bench: build
	PYTHONPATH=$(BUILD_DIR)/python $(BUILD_DIR)/serialize_bench
	$(BUILD_DIR)/torchcap_bench
	$(BUILD_DIR)/meta_bench models
	$(BUILD_DIR)/meta_bench decoder
	$(BUILD_DIR)/memory_bench
	$(BUILD_DIR)/dynamic_bench
	PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3 bench/python_trace_bench.py
	PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3 bench/python_load_bench.py
	PYTHONPATH=$(BUILD_DIR)/python /usr/bin/python3 bench/optimize_bench.py

# libFuzzer over the loader: clang, AddressSanitizer, its own build directory.
# Seeds are generated valid files; most mutants change the graph and keep the
# checksums valid (fuzz/harness.h); each that loads is run too. Crashes land
# in $(FUZZ_DIR)/artifacts/. Then the corpus goes to the Python loader too,
# whose verdicts must agree. `make test` runs the same harness and mutator for
# a fixed number of mutants (ctest load_fuzz_smoke). A mutant's allocation of
# more than 256 MB fails (an error the interpreter reports) rather than
# counting as a crash.
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 300
fuzz: deps
	cmake -S . -B $(FUZZ_DIR) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DTORCHCAP_BUILD_TESTS=OFF -DTORCHCAP_BUILD_FUZZERS=ON
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target load_fuzzer make_fuzz_seeds load_files
	mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/artifacts
	$(FUZZ_DIR)/fuzz/make_fuzz_seeds $(FUZZ_DIR)/corpus
	ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=256 \
	  $(FUZZ_DIR)/fuzz/load_fuzzer -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	  -rss_limit_mb=2048 -malloc_limit_mb=512 -dict=fuzz/load.dict -print_final_stats=1 \
	  -artifact_prefix=$(FUZZ_DIR)/artifacts/ $(FUZZ_DIR)/corpus
	/usr/bin/python3 fuzz/compare_loaders.py $(FUZZ_DIR)/fuzz/load_files $(FUZZ_DIR)/corpus

clean:
	rm -rf $(BUILD_DIR)
