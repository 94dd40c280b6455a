// Every kernel has a test case on every backend, as ggml's test-backend-ops
// proves by enumerating its ops: the kernel lists (ops/kernel_names.h, the
// same lines that declare the kernels) are walked against the NK_COVERS lines
// of the op tests (kernel_cases.h) and against the tests gtest registered in
// this binary, so a kernel added to the list without a case, a case that
// does not run on some backend, and a misspelt name all fail here by name.
#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/kernel_cases.h"
#include "ops/kernel_names.h"
#include "ops/op_harness.h"

namespace nk {
namespace {

using test::KernelCase;
using Names = std::span<const std::string_view>;

// What the check reads, so that it can be run on made-up data too.
struct Inputs {
  Names shared;    // ops/kernel_list.h: on every backend
  Names cpu_only;  // ops/cpu/cpu_only_kernel_list.h: on the CPU
  std::vector<KernelCase> cases;
  std::set<std::string> tests;        // gtest full names, "Suite.Test"
  std::vector<std::string> backends;  // device names, "cpu", "cuda"
};

// Does the case run on `backend`? A TEST_P of NK_INSTANTIATE_BACKENDS is
// "Backends/Suite.Test/<device>"; a plain TEST "Suite.Test" runs on the CPU.
bool runs_on(const Inputs& in, const KernelCase& c, const std::string& backend) {
  if (in.tests.count("Backends/" + c.suite + "." + c.test + "/" + backend)) return true;
  return backend == "cpu" && in.tests.count(c.suite + "." + c.test);
}

bool on_every_backend(const Inputs& in, const KernelCase& c) {
  for (const std::string& b : in.backends)
    if (!in.tests.count("Backends/" + c.suite + "." + c.test + "/" + b)) return false;
  return true;
}

bool listed(Names names, std::string_view k) {
  for (std::string_view n : names)
    if (n == k) return true;
  return false;
}

// One message per problem, each naming the kernel or the NK_COVERS line.
std::vector<std::string> coverage_problems(const Inputs& in) {
  std::vector<std::string> out;
  std::set<std::string_view> seen;
  for (Names list : {in.shared, in.cpu_only})
    for (std::string_view k : list)
      if (!seen.insert(k).second)
        out.push_back("kernel '" + std::string(k) + "' is listed twice in the kernel lists");
  for (const KernelCase& c : in.cases) {
    const std::string line =
        "NK_COVERS(" + c.suite + ", " + c.test + ", " + c.kernel + ") at " + c.where + ": ";
    if (!listed(in.shared, c.kernel) && !listed(in.cpu_only, c.kernel))
      out.push_back(line + "'" + c.kernel +
                    "' is in neither ops/kernel_list.h nor ops/cpu/cpu_only_kernel_list.h");
    bool runs = false;
    for (const std::string& b : in.backends) runs = runs || runs_on(in, c, b);
    if (!runs) out.push_back(line + "no test " + c.suite + "." + c.test + " in this binary");
  }
  for (std::string_view k : in.shared) {
    std::string partial;
    bool covered = false;
    for (const KernelCase& c : in.cases) {
      if (c.kernel != k) continue;
      if (on_every_backend(in, c)) {
        covered = true;
        break;
      }
      partial += " " + c.suite + "." + c.test;
    }
    if (covered) continue;
    std::string msg = "kernel '" + std::string(k) +
                      "' (ops/kernel_list.h) has no test case on every backend: it needs a "
                      "TEST_P over test::backends() (NK_INSTANTIATE_BACKENDS) with an NK_COVERS "
                      "line naming it";
    if (!partial.empty()) msg += "; cases that do not run on every backend:" + partial;
    out.push_back(msg);
  }
  for (std::string_view k : in.cpu_only) {
    bool covered = false;
    for (const KernelCase& c : in.cases)
      covered = covered || (c.kernel == k && runs_on(in, c, "cpu"));
    if (!covered)
      out.push_back("kernel '" + std::string(k) +
                    "' (ops/cpu/cpu_only_kernel_list.h) has no test case on the CPU: it needs a "
                    "test with an NK_COVERS line naming it");
  }
  return out;
}

// Every test this binary registered, filtered out or not.
std::set<std::string> registered_tests() {
  std::set<std::string> out;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < u.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& s = *u.GetTestSuite(i);
    for (int j = 0; j < s.total_test_count(); ++j)
      out.insert(std::string(s.name()) + "." + s.GetTestInfo(j)->name());
  }
  return out;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (Device d : test::backends()) out.push_back(device_name(d));
  return out;
}

TEST(BackendOps, EveryKernelHasACaseOnEveryBackend) {
  const Inputs in{ops::kKernelNames, ops::kCpuOnlyKernelNames, test::kernel_cases(),
                  registered_tests(), backend_names()};
  ASSERT_FALSE(in.cases.empty()) << "no NK_COVERS line is linked into this binary";
  for (const std::string& p : coverage_problems(in)) ADD_FAILURE() << p;
}

// The check itself, on a made-up binary: each kind of gap is reported, by name.
TEST(BackendOps, CoverageCheckNamesEachGap) {
  const std::string_view shared[] = {"fill", "scale", "dummy_kernel", "add"};
  const std::string_view cpu_only[] = {"rope_table", "nf4_quantize"};
  Inputs in{shared, cpu_only, {}, {}, {"cpu", "cuda"}};
  in.tests = {"Backends/Elementwise.Fill/cpu", "Backends/Elementwise.Fill/cuda",
              "Backends/CpuOnly.Scale/cpu", "Rope.Table", "Plain.Add"};
  in.cases = {{"fill", "Elementwise", "Fill", "a.cc:1"}, {"scale", "CpuOnly", "Scale", "a.cc:2"},
              {"add", "Plain", "Add", "a.cc:3"},         {"rope_table", "Rope", "Table", "a.cc:4"},
              {"fil", "Elementwise", "Fill", "a.cc:5"},  {"nf4_quantize", "Nf4", "Gone", "a.cc:6"}};
  const std::vector<std::string> got = coverage_problems(in);
  const auto reports = [&](const std::string& a, const std::string& b) {
    for (const std::string& p : got)
      if (p.find(a) != std::string::npos && p.find(b) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(reports("'dummy_kernel'", "no test case on every backend"));
  EXPECT_TRUE(reports("'scale'", "cases that do not run on every backend: CpuOnly.Scale"));
  EXPECT_TRUE(reports("'add'", "cases that do not run on every backend: Plain.Add"));
  EXPECT_TRUE(reports("a.cc:5", "'fil' is in neither"));
  EXPECT_TRUE(reports("a.cc:6", "no test Nf4.Gone"));
  EXPECT_TRUE(reports("'nf4_quantize'", "no test case on the CPU"));
  EXPECT_EQ(got.size(), 6u) << testing::PrintToString(got);  // fill and rope_table are covered

  const std::string_view twice[] = {"fill", "fill"};
  in.shared = twice;
  const std::vector<std::string> dup = coverage_problems(in);
  bool named = false;
  for (const std::string& p : dup)
    named = named || p == "kernel 'fill' is listed twice in the kernel lists";
  EXPECT_TRUE(named) << testing::PrintToString(dup);
}

}  // namespace
}  // namespace nk
