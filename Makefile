# The two commands of the README: `make quickstart` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup build quickstart test bench format format-check clean

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

# What CI runs first: fails, naming each file and line, where `make format`
# would change anything (setup installs clang-format on a fresh machine).
format-check: setup
	clang-format --dry-run --Werror $$(git ls-files '*.h' '*.cc' '*.cpp')

clean:
	rm -rf $(BUILD)
