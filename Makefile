# The two commands of the README: `make quickstart` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup build quickstart test bench format clean

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

quickstart: build
	./$(BUILD)/bin/nekton quickstart

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	bash bench/run_train_bench.sh

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cpp')

clean:
	rm -rf $(BUILD)
