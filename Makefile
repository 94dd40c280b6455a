# The two commands of the README: `make quickstart` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup setup-test build quickstart-build quickstart test bench format format-check clean san-configure san-build sanitize-test fuzz

# What building and running need (scripts/setup.sh); setup-test adds what only
# the tests, sanitizers, fuzzers and format check use.
setup:
	@bash scripts/setup.sh

setup-test:
	@bash scripts/setup.sh --test

# ccache, where it is installed (setup-test installs it), keyed on paths
# relative to this tree: another clone of the same commit (CI's fresh one)
# reuses every object that names no absolute path (the tests', the kernels';
# a unity source names its files' absolute paths). Without ccache the
# compiler runs as it is.
CCACHE = env;CCACHE_BASEDIR=$(CURDIR);CCACHE_NOHASHDIR=1;ccache
LAUNCHER = $$(command -v ccache >/dev/null && echo "-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)" \
  "-DCMAKE_CUDA_COMPILER_LAUNCHER=$(CCACHE)")

# Everything: the nekton binary, the tests and the benchmarks. The libraries
# are a unity build, as `make quickstart` builds them (each subsystem's files
# compiled together, the kernels of nk_ops file by file so that they compute
# the same bits: CMakeLists.txt), 2.4x less compile time than file by file
# (docs/ARCHITECTURE.md, Contributing); the tests compile file by file.
build: setup-test
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DNK_TESTS=ON -DCMAKE_UNITY_BUILD=ON $(LAUNCHER) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The nekton binary alone, without GoogleTest: the same objects as `make
# build`, so either reuses the other's in one BUILD folder.
quickstart-build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DNK_TESTS=OFF -DCMAKE_UNITY_BUILD=ON $(LAUNCHER) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target nekton

quickstart: quickstart-build
	./$(BUILD)/bin/nekton quickstart

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	bash bench/run_train_bench.sh

# The hardening build (clang, CPU only): ASan + UBSan on everything, libFuzzer
# harnesses from tests/fuzz. `make sanitize-test` runs the whole suite in it,
# stopping a test at its first report; `make fuzz` runs each harness for
# FUZZ_SECONDS (see docs/ARCHITECTURE.md, Sanitizers and fuzzing).
SAN_BUILD ?= build-san
FUZZ_SECONDS ?= 20
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/lsan.supp:print_suppressions=0

san-configure: setup-test
	@CXX=clang++ cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Release -DNK_SANITIZE=ON \
	  -DNK_FUZZ=ON -DNK_WITH_NCCL=OFF -DNK_WITH_CUDA=OFF -DNK_BENCH=OFF -DCMAKE_UNITY_BUILD=ON \
	  $(LAUNCHER) >/dev/null

san-build: san-configure
	@cmake --build $(SAN_BUILD) -j $(JOBS)

sanitize-test: san-build
	cd $(SAN_BUILD) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)

# Builds the harnesses alone (not the tests).
fuzz: san-configure
	@cmake --build $(SAN_BUILD) -j $(JOBS) --target fuzzers
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh $(SAN_BUILD)

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh')

# What CI runs first: fails, naming each file and line, where `make format`
# would change anything (setup-test installs clang-format on a fresh machine).
format-check: setup-test
	clang-format --dry-run --Werror $$(git ls-files '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
