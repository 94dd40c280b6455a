// Shared by the multi-process tests of parallel/ (test_parallel_mpi, run under
// mpirun): the one MpiRuntime of the process. Every rank runs the same tests
// in the same order, so collectives line up.
#pragma once
#include <gtest/gtest.h>

#include "dist/mpi/runtime.h"

namespace nk::test {

dist::MpiRuntime& mpi();

}  // namespace nk::test
