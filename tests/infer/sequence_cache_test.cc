// SlotCache, the contiguous SequenceCache: slots handed out lowest first and
// reused once closed, no room when full or for a sequence longer than a slot,
// appended tokens carry their slot and positions, occupancy in slots, misuse of a handle is an
// internal error (a bug in the caller, not a user mistake).
#include "infer/sequence_cache.h"

#include <gtest/gtest.h>

#include "test_util.h"

#include "model/tiny_config.h"

namespace nk {
namespace {

// Misuse of a handle is a bug in the caller: InternalError, with this message.
template <class F>
std::string internal_error_of(F&& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SlotCache, HandsOutSlotsAndAddressesTokens) {
  const ModelConfig c = test::tiny_config(false, 50, 32);
  SlotCache sc(c, DType::F32, 3, 20, 8);
  EXPECT_EQ(sc.max_len(), 20);
  EXPECT_EQ(sc.max_tokens(), 8);
  const std::vector<int32_t> one = {5};
  auto open = [&](int64_t len) { return sc.open(len, one).handle; };
  EXPECT_EQ(open(21), SequenceCache::kNoRoom);  // longer than a slot
  EXPECT_EQ(open(20), 0);
  EXPECT_EQ(open(5), 1);
  EXPECT_EQ(sc.open(1, one).cached, 0);        // no prefix cache
  EXPECT_EQ(open(1), SequenceCache::kNoRoom);  // full
  EXPECT_EQ(sc.free_slots(), 0);
  EXPECT_EQ(sc.blocks_used(), 3);
  sc.close(1);
  EXPECT_EQ(sc.free_slots(), 1);
  EXPECT_EQ(sc.blocks_used(), 2);
  EXPECT_EQ(sc.blocks_total(), 3);
  EXPECT_EQ(open(3), 1);

  StepBuffer step;
  const std::vector<int32_t> a = {7, 8, 9}, b = {4};
  EXPECT_TRUE(sc.append(2, 0, a, step));
  EXPECT_TRUE(sc.append(0, 11, b, step));
  EXPECT_EQ(step.tokens, (std::vector<int32_t>{7, 8, 9, 4}));
  EXPECT_EQ(step.seqs, (std::vector<int32_t>{2, 2, 2, 0}));
  EXPECT_EQ(step.positions, (std::vector<int32_t>{0, 1, 2, 11}));
  step.clear();
  EXPECT_TRUE(step.tokens.empty() && step.seqs.empty() && step.positions.empty());

  EXPECT_TRUE(test::contains(internal_error_of([&] { sc.append(0, 19, a, step); }),
                             "positions [19, 22) outside"));
  sc.close(2);
  EXPECT_TRUE(
      test::contains(internal_error_of([&] { sc.append(2, 0, a, step); }), "slot 2 is not open"));
  EXPECT_TRUE(test::contains(internal_error_of([&] { sc.close(2); }), "slot 2 is not open"));
  EXPECT_TRUE(test::contains(internal_error_of([&] { sc.close(7); }), "slot 7 is not open"));
  EXPECT_THROW(SlotCache(c, DType::F32, 1, 33, 8), Error);  // over model.max_seq_len
}

}  // namespace
}  // namespace nk
