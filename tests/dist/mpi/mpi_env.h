// Shared by the multi-process tests (test_dist_mpi, run under mpirun): the one
// MpiRuntime of the process and the communicators of a layout, made once per
// layout. Every rank runs the same tests in the same order, so making groups
// (a collective) happens at the same point on all of them.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "dist/mpi/runtime.h"

namespace nk::test {

dist::MpiRuntime& mpi();
// The mesh and groups of `spec` on this world, cached by layout.
struct Layout {
  dist::Mesh mesh;
  dist::ProcessGroups groups;
};
Layout& layout(const dist::MeshSpec& spec);
// Timeout of the test communicators: generous, so a loaded machine never trips it.
constexpr double kTestTimeout = 60;

}  // namespace nk::test
