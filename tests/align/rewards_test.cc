// Online RL's rule-based rewards (src/align/rewards): every answer extractor
// and comparison on GSM8K- and MATH-like strings, the format and DAPO length
// rewards, the align.reward_* keys' checks, and a RewardSet's weighted sum
// and parts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "align/rewards/answer_match.h"
#include "align/rewards/reward_set.h"
#include "align/rewards/reward_tally.h"
#include "apps/commands.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;

// GSM8K's first training example, as the dataset writes its answer.
const char* kGsm8kAnswer =
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72";

AccuracyRewardOptions extract(const std::string& how) {
  AccuracyRewardOptions o;
  o.extract = how;
  return o;
}

double score(const AccuracyRewardOptions& o, const std::string& completion,
             const std::string& reference) {
  return AnswerMatcher(o).score(completion, reference);
}

TEST(AnswerMatch, ParsesNumbersAsAnswersWriteThem) {
  EXPECT_EQ(parse_answer_number("72"), 72.0);
  EXPECT_EQ(parse_answer_number(" 1,234.5 "), 1234.5);
  EXPECT_EQ(parse_answer_number("$1,200"), 1200.0);
  EXPECT_EQ(parse_answer_number("-3"), -3.0);
  EXPECT_EQ(parse_answer_number("+4"), 4.0);
  EXPECT_EQ(parse_answer_number("72."), 72.0);
  EXPECT_EQ(parse_answer_number("50%"), 50.0);
  EXPECT_EQ(parse_answer_number(".5"), 0.5);
  EXPECT_EQ(parse_answer_number("3/4"), 0.75);
  for (const char* bad : {"", "abc", "1.2.3", "72 dollars", "1/0", "-", "inf", "nan", "0x10"})
    EXPECT_FALSE(parse_answer_number(bad).has_value()) << bad;
}

TEST(AnswerMatch, Gsm8kTakesTheFirstAnswerLineOfBothSides) {
  const AccuracyRewardOptions o = extract("gsm8k");
  const AnswerMatcher m(o);
  EXPECT_EQ(m.reference(kGsm8kAnswer), "72");
  EXPECT_EQ(m.extract("48 + 24 = 72\n#### 72\n#### 5"), "72");
  EXPECT_EQ(m.extract("#### $1,200."), "1,200");
  EXPECT_EQ(m.extract("####-3"), "-3");
  EXPECT_FALSE(m.extract("the total is 72").has_value());
  EXPECT_EQ(score(o, "She sold 24 in May, so 48 + 24 = 72.\n#### 72", kGsm8kAnswer), 1.0);
  EXPECT_EQ(score(o, "#### 72.0", kGsm8kAnswer), 1.0);
  EXPECT_EQ(score(o, "#### 71", kGsm8kAnswer), 0.0);
  EXPECT_EQ(score(o, "The answer is 72.", kGsm8kAnswer), 0.0);  // no answer line
  EXPECT_EQ(score(o, "#### $1,200", "He earns 1200 dollars.\n#### 1200"), 1.0);
  // A reference with no answer line is taken whole.
  EXPECT_EQ(score(o, "#### 18", "18"), 1.0);
}

TEST(AnswerMatch, BoxedTakesTheLastBalancedBox) {
  EXPECT_EQ(last_boxed("so \\boxed{x^{2}} and then \\boxed{\\frac{3}{4}} done"), "\\frac{3}{4}");
  EXPECT_EQ(last_boxed("\\fbox{ 7 }"), "7");
  EXPECT_FALSE(last_boxed("\\boxed{unclosed {").has_value());
  EXPECT_FALSE(last_boxed("no box").has_value());
  AccuracyRewardOptions o = extract("boxed");
  // MATH's solutions box their answer too; numbers compare as numbers.
  EXPECT_EQ(score(o, "Adding, we get $\\boxed{72}$.", "So the sum is $\\boxed{72.0}$."), 1.0);
  EXPECT_EQ(score(o, "so \\boxed{\\$1,200}", "1200"), 1.0);
  EXPECT_EQ(score(o, "no box: 72", "72"), 0.0);
  o.compare = "exact";
  EXPECT_EQ(score(o, "thus $x = \\boxed{\\frac{1}{2}}$", "\\boxed{\\frac{1}{2}}"), 1.0);
  EXPECT_EQ(score(o, "thus $x = \\boxed{\\frac{1}{3}}$", "\\boxed{\\frac{1}{2}}"), 0.0);
}

TEST(AnswerMatch, MarkerTakesTheRestOfTheLineAfterTheLastMarker) {
  AccuracyRewardOptions o = extract("marker");
  const AnswerMatcher m(o);
  EXPECT_EQ(m.extract("The answer is 5?\nWait. So the answer is: $72.\nDone"), "$72");
  EXPECT_EQ(m.extract("THE ANSWER IS 9"), "9");
  EXPECT_FALSE(m.extract("The answer is\n").has_value());
  EXPECT_FALSE(m.extract("no marker 72").has_value());
  // Numbers: the first number of the extracted text; the reference GSM8K's.
  EXPECT_EQ(score(o, "48 + 24 = 72. The answer is 72 clips.", "#### 72"), 1.0);
  EXPECT_EQ(score(o, "The answer is 70, not 72.", "72"), 0.0);
  o.marker = "Final answer:";
  o.compare = "exact";
  o.ignore_case = true;
  EXPECT_EQ(score(o, "Reasoning...\nFinal answer: Paris.", "paris"), 1.0);
  o.ignore_case = false;
  EXPECT_EQ(score(o, "Reasoning...\nFinal answer: Paris.", "paris"), 0.0);
}

TEST(AnswerMatch, LastNumberTakesTheLastNumberOfBothSides) {
  const AccuracyRewardOptions o = extract("last_number");
  const AnswerMatcher m(o);
  EXPECT_EQ(m.reference(kGsm8kAnswer), "72");
  EXPECT_EQ(m.extract("In May 24, altogether 1,072 clips."), "1,072");
  EXPECT_EQ(m.extract("it falls to -3.5 degrees"), "-3.5");
  EXPECT_EQ(m.extract("48/2 = 24 in May; 3/4 of them."), "3/4");
  EXPECT_FALSE(m.extract("no digits").has_value());
  EXPECT_EQ(score(o, "She sold 24 in May and 72 altogether.", kGsm8kAnswer), 1.0);
  EXPECT_EQ(score(o, "72 altogether, 24 in May.", kGsm8kAnswer), 0.0);
}

TEST(AnswerMatch, RegexTakesTheFirstMatchsFirstGroup) {
  AccuracyRewardOptions o = extract("regex");
  o.pattern = "<answer>(.*?)</answer>";
  o.compare = "exact";
  o.ignore_case = true;
  EXPECT_EQ(score(o, "<think>hmm</think><answer> PARIS </answer><answer>Rome</answer>", "Paris"),
            1.0);
  EXPECT_EQ(score(o, "<answer>Rome</answer>", "Paris"), 0.0);
  o.pattern = "[0-9]+ clips";  // no group: the whole match
  o.compare = "number";
  EXPECT_EQ(score(o, "24 in May, 72 clips in all", "72"), 1.0);  // "72 clips": its number
  EXPECT_EQ(score(o, "24 clips in May, 72 clips in all", "72"), 0.0);
}

TEST(AnswerMatch, NumbersCompareWithinTheTolerance) {
  AccuracyRewardOptions o = extract("last_number");
  EXPECT_EQ(score(o, "about 0.333333", "1/3"), 1.0);
  o.tolerance = 0;
  EXPECT_EQ(score(o, "about 0.333333", "1/3"), 0.0);
  EXPECT_EQ(score(o, "exactly 0.25", "1/4"), 1.0);
  // A reference that holds no number is bad data, not a wrong answer.
  o.reference = "as_is";
  try {
    score(o, "72", "seventy-two");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'seventy-two' holds no number")) << e.what();
  }
}

TEST(AnswerMatch, BadOptionsNameTheirKeys) {
  auto fails = [](AccuracyRewardOptions o, const std::string& key) {
    try {
      o.check();
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), key)) << e.what();
    }
  };
  AccuracyRewardOptions o = extract("sympy");
  fails(o, "align.reward_accuracy.extract: 'sympy'");
  o = extract("regex");
  fails(o, "align.reward_accuracy.pattern: empty");
  o.pattern = "(unclosed";
  fails(o, "align.reward_accuracy.pattern: the regular expression '(unclosed' does not compile");
  o = extract("marker");
  o.marker = " ";
  fails(o, "align.reward_accuracy.marker");
  o = extract("gsm8k");
  o.compare = "fuzzy";
  fails(o, "align.reward_accuracy.compare: 'fuzzy'");
  o = extract("gsm8k");
  o.reference = "raw";
  fails(o, "align.reward_accuracy.reference: 'raw'");
  o = extract("gsm8k");
  o.tolerance = -1;
  fails(o, "align.reward_accuracy.tolerance");
  o = extract("gsm8k");
  o.answer_key = "";
  fails(o, "align.reward_accuracy.answer_key");
}

TEST(LengthReward, FollowsDaposOverlongShaping) {
  // L_max 100, L_cache 20: 0 up to 80, linear to -1 at 100, -1 beyond.
  EXPECT_EQ(overlong_penalty(0, 100, 20), 0.0);
  EXPECT_EQ(overlong_penalty(80, 100, 20), 0.0);
  EXPECT_DOUBLE_EQ(overlong_penalty(85, 100, 20), -0.25);
  EXPECT_DOUBLE_EQ(overlong_penalty(100, 100, 20), -1.0);
  EXPECT_EQ(overlong_penalty(101, 100, 20), -1.0);
  EXPECT_EQ(overlong_penalty(100, 100, 0), 0.0);  // no soft band
  EXPECT_EQ(overlong_penalty(101, 100, 0), -1.0);
}

// A batch of rollouts over `records` (prompt "p"), completions and token counts.
struct Batch {
  std::vector<json> records;
  json prompt = "p";
  std::vector<RewardInput> in;
  Batch(std::vector<json> recs, const std::vector<std::string>& completions,
        const std::vector<int64_t>& tokens)
      : records(std::move(recs)) {
    for (size_t i = 0; i < completions.size(); ++i)
      in.push_back({&records[i], &prompt, completions[i], tokens[i], false,
                    "data.jsonl:" + std::to_string(i + 1)});
  }
};

RewardsConfig read_config(const std::vector<std::string>& overrides) {
  const ConfigSchema schema = align_schema();  // the keys are nekton align's
  const Config c = Config::load(schema, "", overrides);
  RewardsConfig r;
  ConfigReader reader(c);
  r.bind(reader);
  return r;
}

TEST(RewardSet, SumsWeightedPartsInOrder) {
  RewardsConfig cfg =
      read_config({"align.reward_funcs=accuracy, format ,length", "align.reward_weights=1,0.5,2",
                   "align.reward_length.max_tokens=100", "align.reward_length.cache_tokens=20"});
  RewardSet set(cfg, RewardModelSource{});
  EXPECT_EQ(set.names(), (std::vector<std::string>{"accuracy", "format", "length"}));
  Batch b({{{"answer", kGsm8kAnswer}}, {{"answer", "#### 5"}}, {{"answer", 7}}},
          {"<think>48+24</think> <answer>\n#### 72</answer>", "#### 5", "<think></think><answer>7"},
          {10, 90, 100});
  const RewardScores s = set.score(b.in);
  ASSERT_EQ(s.parts.size(), 3u);
  EXPECT_EQ(s.parts[0].name, "accuracy");
  EXPECT_TRUE(s.parts[0].verifiable);
  EXPECT_FALSE(s.parts[1].verifiable);
  EXPECT_EQ(s.parts[1].weight, 0.5);
  // The third record's answer is the number 7; its completion states no "#### 7".
  EXPECT_EQ(s.parts[0].values, (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(s.parts[1].values, (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(s.parts[2].values, (std::vector<double>{0, -0.5, -1}));
  EXPECT_EQ(s.total, (std::vector<double>{1.5, 1 - 1.0, -2}));
}

TEST(RewardSet, LengthTakesTheRunsMaxAndAPerTokenCost) {
  RewardsConfig cfg =
      read_config({"align.reward_funcs=length", "align.reward_length.per_token=0.01"});
  RewardSet set(cfg, RewardModelSource{}, 50);  // L_max 50, L_cache 10
  Batch b({json::object(), json::object()}, {"a", "b"}, {40, 45});
  const RewardScores s = set.score(b.in);
  EXPECT_DOUBLE_EQ(s.total[0], -0.4);
  EXPECT_DOUBLE_EQ(s.total[1], -0.5 - 0.45);
  RewardsConfig none = read_config({"align.reward_funcs=length"});
  try {
    RewardSet(none, RewardModelSource{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "align.reward_length.max_tokens")) << e.what();
  }
}

TEST(RewardSet, ErrorsNameTheFunctionTheRecordAndTheKey) {
  RewardsConfig cfg = read_config({"align.reward_funcs=accuracy"});
  RewardSet set(cfg, RewardModelSource{});
  Batch b({{{"answer", "#### 1"}}, {{"solution", "#### 2"}}}, {"#### 1", "#### 2"}, {1, 1});
  try {
    set.score(b.in);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "reward 'accuracy': rollout 1 (data.jsonl:2): no \"answer\" "
                         "field (align.reward_accuracy.answer_key)"))
        << e.what();
  }
  cfg = read_config({"align.reward_funcs=accuracy", "align.reward_accuracy.answer_key=solution",
                     "align.reward_accuracy.reference=as_is"});
  RewardSet by_solution(cfg, RewardModelSource{});
  Batch c({{{"solution", "two"}}}, {"#### 2"}, {1});
  try {
    by_solution.score(c.in);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "reward 'accuracy': rollout 0 (data.jsonl:1): \"solution\""))
        << e.what();
  }
  Batch d({{{"solution", json::array()}}}, {"#### 2"}, {1});
  EXPECT_THROW(by_solution.score(d.in), Error);
}

TEST(RewardSet, FormatNeedsTheWholeCompletion) {
  RewardsConfig cfg = read_config({"align.reward_funcs=format"});
  RewardSet set(cfg, RewardModelSource{});
  Batch b({json::object(), json::object(), json::object(), json::object()},
          {"<think>\nstep 1\nstep 2\n</think>\n<answer>\n72\n</answer>\n", "<answer>72</answer>",
           "<think>a</think><answer>72</answer> and more", "x <think>a</think><answer>72</answer>"},
          {1, 1, 1, 1});
  EXPECT_EQ(set.score(b.in).total, (std::vector<double>{1, 0, 0, 0}));
  cfg = read_config({"align.reward_funcs=format", "align.reward_format.pattern=^#### \\d+$"});
  RewardSet custom(cfg, RewardModelSource{});
  Batch c({json::object(), json::object()}, {"#### 72", "x\n#### 72"}, {1, 1});
  EXPECT_EQ(custom.score(c.in).total, (std::vector<double>{1, 0}));
}

TEST(RewardsConfig, BadValuesNameTheirKeys) {
  auto fails = [](const std::vector<std::string>& overrides, const std::string& part) {
    try {
      RewardsConfig cfg = read_config(overrides);
      cfg.check();
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  fails({}, "align.reward_funcs: no reward function given");
  fails({"align.reward_funcs=accuracy,f1"}, "align.reward_funcs: 'f1' is not a reward function");
  fails({"align.reward_funcs=format,format"}, "align.reward_funcs: 'format' is listed twice");
  fails({"align.reward_funcs=accuracy,format", "align.reward_weights=1"},
        "align.reward_weights: 1 weights (1) for 2 reward functions");
  fails({"align.reward_funcs=accuracy,format", "align.reward_weights=1,x"},
        "align.reward_weights: 'x' (for format) is not a finite number");
  fails({"align.reward_funcs=accuracy", "align.reward_weights=inf"}, "align.reward_weights: 'inf'");
  fails({"align.reward_funcs=command"}, "align.reward_command: align.reward_funcs lists command");
  fails({"align.reward_funcs=http"}, "align.reward_url: align.reward_funcs lists http");
  fails({"align.reward_funcs=http", "align.reward_url=https://x.org/score"},
        "align.reward_url: 'https://x.org/score': https is not supported");
  fails({"align.reward_funcs=http", "align.reward_url=localhost:80"},
        "align.reward_url: 'localhost:80' is not an http://");
  fails({"align.reward_funcs=http", "align.reward_url=http://localhost:99999/"},
        "align.reward_url: 'http://localhost:99999/': the port '99999'");
  fails({"align.reward_funcs=command", "align.reward_command=true", "align.reward_timeout_s=0"},
        "align.reward_timeout_s: must be a finite number > 0");
  fails({"align.reward_funcs=format", "align.reward_format.pattern=<think>(.*"},
        "align.reward_format.pattern: the regular expression '<think>(.*' does not compile");
  fails({"align.reward_funcs=accuracy", "align.reward_accuracy.extract=regex"},
        "align.reward_accuracy.pattern: empty");
  fails({"align.reward_funcs=length", "align.reward_length.max_tokens=10",
         "align.reward_length.cache_tokens=20"},
        "align.reward_length.cache_tokens: 20 is more than align.reward_length.max_tokens 10");
  fails({"align.reward_funcs=length", "align.reward_length.per_token=-1"},
        "align.reward_length.per_token");
  // A function's settings are checked only when it is listed.
  RewardsConfig ok = read_config({"align.reward_funcs=format", "align.reward_url=ftp://x"});
  ok.check();
  EXPECT_EQ(ok.names, std::vector<std::string>{"format"});
  EXPECT_EQ(ok.weight_values, std::vector<double>{1});
}

TEST(RewardsConfig, KeysAreNektonAligns) {
  // An unknown key near a reward key is refused with the nearest valid key.
  try {
    Config::load(align_schema(), "", {"align.reward_func=accuracy"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "align.reward_funcs")) << e.what();
  }
  const RewardsConfig r = read_config({"align.reward_accuracy.extract=boxed",
                                       "align.reward_timeout_s=2.5", "align.reward_model=/rm"});
  EXPECT_EQ(r.accuracy.extract, "boxed");
  EXPECT_EQ(r.timeout_s, 2.5);
  // A recipe nests them.
  test::TempDir dir("nk_rewards_yaml");
  test::write_file(dir / "r.yaml",
                   "align:\n  reward_funcs: accuracy,format\n  reward_weights: 1,0.1\n"
                   "  reward_accuracy:\n    extract: marker\n    marker: 'Answer:'\n");
  const Config c = Config::load(align_schema(), dir / "r.yaml", {});
  RewardsConfig y;
  ConfigReader reader(c);
  y.bind(reader);
  y.check();
  EXPECT_EQ(y.accuracy.extract, "marker");
  EXPECT_EQ(y.accuracy.marker, "Answer:");
  EXPECT_EQ(y.weight_values, (std::vector<double>{1, 0.1}));
}

TEST(RewardTally, GivesTrlsFiguresFromSumsThatRanksAdd) {
  RewardScores a, b;
  a.total = {1.5, -0.5};
  a.parts = {{"accuracy", 1, true, {1, 0}}, {"format", 0.5, false, {1, -1}}};
  b.total = {2, 0};
  b.parts = {{"accuracy", 1, true, {1, 1}}, {"format", 0.5, false, {2, -2}}};
  RewardTally one, rank0, rank1;
  one.add(a);
  one.add(b);
  rank0.add(a);
  rank1.add(b);
  for (size_t i = 0; i < rank0.sums().size(); ++i) rank0.sums()[i] += rank1.sums()[i];
  EXPECT_EQ(rank0.sums(), one.sums());
  std::map<std::string, double> f;
  for (auto& [k, v] : rank0.figures()) f[k] = v;
  ASSERT_EQ(f.size(), 7u);
  EXPECT_DOUBLE_EQ(f["reward"], 0.75);
  // Population std of {1.5, -0.5, 2, 0}: mean 0.75, squares' mean 1.625.
  EXPECT_DOUBLE_EQ(f["reward_std"], std::sqrt(1.625 - 0.5625));
  EXPECT_DOUBLE_EQ(f["rewards/accuracy/mean"], 0.75);
  EXPECT_DOUBLE_EQ(f["rewards/accuracy/std"], std::sqrt(0.75 - 0.5625));
  EXPECT_DOUBLE_EQ(f["rewards/format/mean"], 0);
  EXPECT_DOUBLE_EQ(f["rewards/format/std"], std::sqrt(2.5));
  EXPECT_DOUBLE_EQ(f["accuracy"], 0.75);
  EXPECT_TRUE(RewardTally().figures().empty());
}

}  // namespace
}  // namespace nk
