# torchcap: every entry point a user or CI needs.
#
#   make demo    trace the built-in ResNet-18 and show what was captured
#   make test    install what is missing, build, run every test through ctest
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
	libtorch-dev python3-torch python3-torchvision python3-pytest \
	libgtest-dev libgmock-dev libbenchmark-dev \
	nlohmann-json3-dev libcli11-dev libdw-dev libunwind-dev \
	graphviz ccache ninja-build clang libclang-rt-14-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps configure build test demo bench clean

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

demo: build
	$(BUILD_DIR)/torchcap_demo

bench: build
	$(BUILD_DIR)/torchcap_bench

clean:
	rm -rf $(BUILD_DIR)
