// The timeout guarantee, end to end: a job under mpirun where one rank hangs or
// dies must end, non-zero, within parallel.timeout_s + 10 s (`timeout` kills it
// otherwise: exit 124), and its output must name the group, the operation and
// the missing rank.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "test_util.h"

namespace nk::test {
namespace {

constexpr double kTimeout = 2;

RunResult run_fault(int np, const std::string& mode, int victim, const std::string& group, int tp,
                    const std::string& op = "") {
  std::string cmd = fmt::format(
      "timeout -k 5 {} env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none {} -np {} --oversubscribe {} {} {} {} {} {} "
      "{} </dev/null",
      int(kTimeout + 10), NK_MPIEXEC, np, NK_DIST_FAULT, mode, victim, group, tp, kTimeout, op);
  return run_command(cmd);
}

TEST(DistTimeout, HealthyJobSucceeds) {
  auto r = run_fault(3, "none", 0, "world", 1);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 2: done")) << r.out;
}

TEST(DistTimeout, HungPeerIsNamedByTheOthers) {
  auto r = run_fault(3, "hang", 2, "world", 1);
  ASSERT_NE(r.code, 124) << "the job did not end within the timeout + 10 s:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "group 'world' all_reduce #2 timed out after 2.0 s: missing rank 2 "
                       "(world 2): no answer"))
      << r.out;
}

// tp = 2 on 4 ranks: world rank 3 hangs. Its tp partner, world rank 2, names it
// as rank 1 of group 'tp'. Ranks 0 and 1, done, wait for everyone at exit
// (under the set-up's longer timeout), so rank 2 speaks first; the test also
// accepts their message in case a loaded machine delays rank 2.
TEST(DistTimeout, HungPeerInSubGroupIsNamedByGroupAndWorldRank) {
  auto r = run_fault(4, "hang", 3, "tp", 2);
  ASSERT_NE(r.code, 124) << "the job did not end within the timeout + 10 s:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  bool partner = contains(r.out,
                          "rank 0 (world 2), group 'tp' all_reduce #2 timed out after 2.0 s: "
                          "missing rank 1 (world 3): no answer");
  bool at_exit = contains(r.out, "at exit: ") && contains(r.out, "group 'world' barrier #") &&
                 contains(r.out, "rank 3 (world 3): no answer");
  EXPECT_TRUE(partner || at_exit) << r.out;
}

// A ring of send/recv on 3 ranks where world rank 2 hangs: rank 0 waits to
// receive from it and names it (so does rank 1, whose send it never takes).
TEST(DistTimeout, HungPeerOfAReceiveIsNamed) {
  auto r = run_fault(3, "hang", 2, "world", 1, "ring");
  ASSERT_NE(r.code, 124) << "the job did not end within the timeout + 10 s:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  bool receiver = contains(r.out, "rank 0 (world 0), group 'world' recv #") ||
                  contains(r.out, "rank 1 (world 1), group 'world' send #");
  EXPECT_TRUE(receiver) << r.out;
  EXPECT_TRUE(contains(r.out, "timed out after 2.0 s: missing rank 2 (world 2): no answer"))
      << r.out;
}

// A killed rank: mpirun may end the job itself on seeing the signal, or the
// survivors time out; either way it ends non-zero in time, and if the
// survivors speak, they name the dead rank.
TEST(DistTimeout, KilledPeerEndsTheJob) {
  auto r = run_fault(3, "kill", 1, "world", 1);
  ASSERT_NE(r.code, 124) << "the job did not end within the timeout + 10 s:\n" << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  bool named = contains(r.out, "all_reduce #2 timed out after 2.0 s: missing rank 1 (world 1)");
  bool launcher = contains(r.out, "signal 9");
  EXPECT_TRUE(named || launcher) << r.out;
}

}  // namespace
}  // namespace nk::test
