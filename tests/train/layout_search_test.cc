// `nekton estimate --search` (train/layout_search.h): every layout it
// returns is one `nekton train` accepts (its overrides go back through the
// trainer's config and mesh checks) and fits the budget; a smaller budget
// never picks a winner that needs more memory; the rejected layouts say why,
// naming the key; the command's ranking is deterministic for fixed rates.
#include "train/layout_search.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include <unistd.h>

#include "test_util.h"
#include "train/corpus.h"
#include "train/train_parallel.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::corpus_path;
using test::run_nekton;

// Four heads and four layers: tp 3 does not divide the heads, pp 3 not the
// layers; 12 sequences a step.
const std::vector<std::string> kRecipe = {"model.preset=gpt-tiny", "model.n_layer=4",
                                          "data.tokenizer=bytes",  "train.seq_len=64",
                                          "train.global_batch=12", "train.micro_batch=2"};

TrainConfig load(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = kRecipe;
  o.push_back("data.path=" + corpus_path());
  o.insert(o.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", o));
}

std::vector<LayoutCandidate> accepted(const std::vector<LayoutCandidate>& all) {
  std::vector<LayoutCandidate> a;
  for (const auto& k : all)
    if (k.accepted) a.push_back(k);
  return a;
}

TEST(LayoutSearch, ReturnsOnlyLayoutsTrainAcceptsWithinTheBudget) {
  const TrainConfig cfg = load();
  ASSERT_EQ(cfg.model.n_head, 4);
  const int64_t world = 6;
  LayoutSearchOptions opt;
  opt.world = world;
  const auto unlimited = accepted(search_layouts(cfg, opt));
  ASSERT_GT(unlimited.size(), 4u);
  // A budget between the smallest and the largest layout.
  std::vector<int64_t> mem;
  for (const auto& k : unlimited) mem.push_back(k.memory_bytes);
  std::sort(mem.begin(), mem.end());
  opt.budget_bytes = double(mem[mem.size() / 2]);
  const auto all = search_layouts(cfg, opt);
  const auto ok = accepted(all);
  ASSERT_FALSE(ok.empty());
  EXPECT_LT(ok.size(), unlimited.size());
  for (const auto& k : ok) {
    EXPECT_LE(double(k.memory_bytes), opt.budget_bytes);
    // The overrides on top of the recipe: the trainer's config checks and
    // its mesh checks accept them, and they give the same estimate.
    const TrainConfig c = load(k.overrides);
    EXPECT_NO_THROW(train_mesh(c, int(world), 0)) << fmt::format("{}", fmt::join(k.overrides, " "));
    EXPECT_EQ(estimate_training(c, world, nullptr).peak().total(), k.memory_bytes);
    EXPECT_EQ(c.parallel.mesh.tp * c.parallel.mesh.pp * k.dp, world);
  }
  // Ranked by memory without rates.
  for (size_t i = 1; i < ok.size(); ++i) EXPECT_LE(ok[i - 1].memory_bytes, ok[i].memory_bytes);
  // Every rejection names its key; the refusals of the trainer come with
  // the trainer's own words.
  std::set<std::string> kinds;
  for (const auto& k : all) {
    if (k.accepted) continue;
    ASSERT_FALSE(k.reason.empty());
    EXPECT_TRUE(contains(k.reason, "parallel.") || contains(k.reason, "train.") ||
                contains(k.reason, "--budget"))
        << k.reason;
    if (contains(k.reason, "--budget")) kinds.insert("budget");
    if (k.tp == 3 && contains(k.reason, "parallel.tp")) kinds.insert("heads");
    if (k.pp == 3 && contains(k.reason, "model.n_layer")) kinds.insert("layers");
    // FSDP shards a tensor- or pipeline-parallel model's pieces: not refused for it.
    if ((k.tp > 1 || k.pp > 1) && k.dp > 1 && k.shard == "full") {
      EXPECT_FALSE(contains(k.reason, "(FSDP)")) << k.reason;
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"budget", "heads", "layers"}));
  for (const bool pipelined : {false, true})
    EXPECT_TRUE(std::any_of(all.begin(), all.end(),
                            [&](const LayoutCandidate& k) {
                              return (pipelined ? k.pp > 1 : k.tp > 1 && k.pp == 1) && k.dp > 1 &&
                                     k.shard == "full" && k.accepted;
                            }))
        << "no FSDP layout accepted with " << (pipelined ? "pp" : "tp");
}

// A Mixture-of-Experts model: expert parallelism is searched over the
// divisors of dp, with tensor parallelism too (EP x TP, each expert split
// over the tp ranks); every accepted layout trains by the trainer's checks.
TEST(LayoutSearch, MixtureOfExpertsSearchesExpertParallelism) {
  const std::vector<std::string> moe = {"model.preset=mixtral-tiny", "model.n_layer=2"};
  const TrainConfig cfg = load(moe);
  ASSERT_TRUE(cfg.model.is_moe());
  LayoutSearchOptions opt;
  opt.world = 4;
  const auto all = search_layouts(cfg, opt);
  std::set<int64_t> eps;
  bool ep_by_tp = false;
  for (const auto& k : all) {
    if (!k.accepted) continue;
    eps.insert(k.ep);
    ep_by_tp = ep_by_tp || (k.tp == 2 && k.ep == 2);
    std::vector<std::string> o = moe;
    o.insert(o.end(), k.overrides.begin(), k.overrides.end());
    EXPECT_NO_THROW(train_mesh(load(o), 4, 0)) << fmt::format("{}", fmt::join(o, " "));
  }
  EXPECT_TRUE(eps.count(1) && eps.count(2) && eps.count(4)) << eps.size();
  EXPECT_TRUE(ep_by_tp) << "EP2 x TP2 on 4 ranks";
}

// The winner under a smaller budget never needs more memory than the
// winner under a larger one, ranked by memory or by (measured) time.
TEST(LayoutSearch, SmallerBudgetNeverGivesALargerMemoryWinner) {
  const TrainConfig cfg = load({"train.global_batch=4"});
  MachineRates rates;
  for (bool timed : {false, true}) {
    LayoutSearchOptions opt;
    opt.world = 2;
    opt.rates = timed ? &rates : nullptr;
    std::vector<int64_t> mem;
    for (const auto& k : accepted(search_layouts(cfg, opt))) mem.push_back(k.memory_bytes);
    std::sort(mem.rbegin(), mem.rend());
    int64_t last = std::numeric_limits<int64_t>::max();
    for (int64_t budget : mem) {
      opt.budget_bytes = double(budget);
      const auto ok = accepted(search_layouts(cfg, opt));
      ASSERT_FALSE(ok.empty()) << budget;
      EXPECT_LE(ok.front().memory_bytes, budget);
      EXPECT_LE(ok.front().memory_bytes, last) << "budget " << budget << " timed " << timed;
      last = ok.front().memory_bytes;
      if (timed) {
        for (size_t i = 1; i < ok.size(); ++i) EXPECT_LE(ok[i - 1].step_s(), ok[i].step_s());
      }
    }
  }
}

// The communication term: none on one process; data parallelism adds the
// gradients' all-reduce, 2 (dp-1)/dp of their bytes.
TEST(LayoutSearch, CommunicationTermOfDataParallelism) {
  const TrainConfig cfg = load({"train.global_batch=4", "train.micro_batch=4"});
  LayoutSearchOptions opt;
  opt.world = 1;
  const auto one = accepted(search_layouts(cfg, opt));
  ASSERT_FALSE(one.empty());
  for (const auto& k : one) EXPECT_EQ(k.comm_bytes, 0.0);
  opt.world = 2;
  int checked = 0;
  for (const auto& k : accepted(search_layouts(cfg, opt)))
    if (k.tp == 1 && k.pp == 1 && k.shard == "none") {
      ++checked;
      const double grads =
          4.0 * double(estimate_training(load(k.overrides), 2, nullptr).peak().params);
      EXPECT_DOUBLE_EQ(k.comm_bytes, 2.0 * 1 / 2 * grads);
    }
  EXPECT_GT(checked, 0);
}

// Context parallelism's attention types (nekton autoconfig's
// search_cp_comm): (cp, type, a2a+p2p sizes) of the candidates.
using CpComm = std::tuple<int64_t, std::string, std::vector<int64_t>>;

LayoutSearchOptions cp_comm_search(int64_t world) {
  LayoutSearchOptions opt;
  opt.world = world;
  opt.search_cp = opt.search_cp_comm = true;
  return opt;
}

std::string joined(const std::vector<std::string>& o) {
  return fmt::format("{}", fmt::join(o, " "));
}

// At cp 2 and 4 every type the trainer accepts, a2a+p2p only at cp 4 as
// 2 x 2 (1 x 4 and 4 x 1 are p2p and a2a again); at cp 1 the layouts of a
// search without the types, none twice. Each printed override line loads
// back through the config loader into the same layout, which the trainer
// accepts with the same memory.
TEST(LayoutSearchCpComm, EveryValidTypeAtCp2AndCp4) {
  const TrainConfig cfg = load({"train.global_batch=4"});
  ASSERT_EQ(cfg.model.n_head, 4);
  ASSERT_EQ(cfg.model.n_kv_head, 4);
  const auto all = search_layouts(cfg, cp_comm_search(4));
  std::set<CpComm> found, enumerated;
  std::multiset<std::string> cp1;
  for (const auto& k : all) {
    enumerated.insert({k.cp, k.cp_comm, k.hierarchical_cp_sizes});
    if (!k.accepted) continue;
    if (k.cp == 1) {
      cp1.insert(joined(k.overrides));
      EXPECT_FALSE(contains(joined(k.overrides), "cp_comm_type")) << joined(k.overrides);
      continue;
    }
    found.insert({k.cp, k.cp_comm, k.hierarchical_cp_sizes});
    // The line as printed, split on spaces, through Config::load and the
    // trainer's checks.
    const std::string text = joined(k.overrides);
    EXPECT_TRUE(contains(text, "parallel.cp_comm_type=" + k.cp_comm)) << text;
    std::vector<std::string> words = {"train.global_batch=4"};  // the recipe's, as above
    for (size_t at = 0; at < text.size();) {
      const size_t sp = std::min(text.find(' ', at), text.size());
      words.push_back(text.substr(at, sp - at));
      at = sp + 1;
    }
    const TrainConfig c = load(words);
    EXPECT_EQ(c.parallel.mesh.cp, k.cp) << text;
    EXPECT_EQ(c.parallel.cp_comm_type, k.cp_comm) << text;
    EXPECT_EQ(c.parallel.hierarchical_cp_sizes, k.hierarchical_cp_sizes) << text;
    EXPECT_EQ(c.parallel.mesh.hcp_a2a,
              k.hierarchical_cp_sizes.empty() ? 0 : k.hierarchical_cp_sizes[0]);
    EXPECT_NO_THROW(train_mesh(c, 4, 0)) << text;
    EXPECT_EQ(estimate_training(c, 4, nullptr).peak().total(), k.memory_bytes) << text;
    // The table's name says the type (and a2a+p2p's split).
    EXPECT_TRUE(contains(k.name(), fmt::format("cp{} {}", k.cp, k.cp_comm))) << k.name();
  }
  const std::vector<int64_t> none;
  EXPECT_EQ(found, (std::set<CpComm>{{2, "p2p", none},
                                     {2, "a2a", none},
                                     {2, "all_gather", none},
                                     {4, "p2p", none},
                                     {4, "a2a", none},
                                     {4, "all_gather", none},
                                     {4, "a2a+p2p", {2, 2}}}));
  for (const auto& [cp, type, sizes] : enumerated) {
    if (type == "a2a+p2p") {
      EXPECT_EQ(cp, 4) << fmt::format("{}", fmt::join(sizes, "x"));
    }
  }
  // cp 1: what the search gives without the types, each layout once.
  LayoutSearchOptions plain = cp_comm_search(4);
  plain.search_cp_comm = false;
  std::multiset<std::string> cp1_plain;
  for (const auto& k : search_layouts(cfg, plain))
    if (k.accepted && k.cp == 1) cp1_plain.insert(joined(k.overrides));
  EXPECT_FALSE(cp1.empty());
  EXPECT_EQ(cp1, cp1_plain);
  EXPECT_EQ(std::set<std::string>(cp1.begin(), cp1.end()).size(), cp1.size());
  LayoutCandidate h;
  h.cp = 4, h.cp_comm = "a2a+p2p", h.hierarchical_cp_sizes = {2, 2};
  EXPECT_EQ(h.name(), "tp1 cp4 a2a+p2p 2x2 pp1 vp1 dp1 mb1 none");
  h.cp = 1;
  EXPECT_EQ(h.name(), "tp1 cp1 pp1 vp1 dp1 mb1 none");
}

// The all-to-all gives each rank whole heads: a2a needs the query and
// key/value heads divisible by tp x cp, a2a+p2p by tp x its a2a size. The
// search rejects those that are not with the trainer's own message.
TEST(LayoutSearchCpComm, RejectsAllToAllWhoseHeadsDoNotSplit) {
  // Two query heads: a2a at tp x cp = 2 only; a2a+p2p 2 x 2 (tp 1) splits them.
  const std::vector<std::string> two = {"model.n_head=2", "train.global_batch=4"};
  const TrainConfig cfg = load(two);
  ASSERT_EQ(cfg.model.n_head, 2);
  bool refused = false, a2a_ok = false, hcp_ok = false;
  for (const auto& k : search_layouts(cfg, cp_comm_search(4))) {
    const bool a2a = k.cp > 1 && k.cp_comm == "a2a";
    if (k.accepted) {
      EXPECT_FALSE(a2a && k.tp * k.cp != 2) << k.name();
      a2a_ok |= a2a, hcp_ok |= k.cp_comm == "a2a+p2p";
      continue;
    }
    if (!a2a || k.cp != 4 || !contains(k.reason, "parallel.cp_comm_type = a2a:")) continue;
    refused = true;
    EXPECT_TRUE(contains(k.reason, "model.n_head = 2")) << k.reason;
    // The trainer refuses the layout in the same words.
    std::vector<std::string> o = two;
    o.insert(o.end(), {"parallel.cp=4", "parallel.cp_comm_type=a2a"});
    try {
      train_mesh(load(o), 4, 0);
      ADD_FAILURE() << "the trainer accepts a2a at cp 4 with 2 heads";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), k.reason);
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_TRUE(a2a_ok) << "a2a at tp 1 x cp 2";
  EXPECT_TRUE(hcp_ok) << "a2a+p2p 2 x 2 at tp 1";
  // One key/value head (GQA): no all-to-all splits it, at any cp; the ring
  // and the all-gather still run.
  std::set<CpComm> ok;
  bool hcp_refused = false;
  for (const auto& k : search_layouts(
           load({"model.preset=qwen2-tiny", "model.n_kv_head=1", "train.global_batch=4"}),
           cp_comm_search(4))) {
    if (k.accepted && k.cp > 1) ok.insert({k.cp, k.cp_comm, k.hierarchical_cp_sizes});
    hcp_refused |= !k.accepted && k.cp_comm == "a2a+p2p" &&
                   contains(k.reason, "parallel.cp_comm_type = a2a+p2p") &&
                   contains(k.reason, "model.n_kv_head = 1");
  }
  const std::vector<int64_t> none;
  EXPECT_EQ(
      ok,
      (std::set<CpComm>{
          {2, "p2p", none}, {2, "all_gather", none}, {4, "p2p", none}, {4, "all_gather", none}}));
  EXPECT_TRUE(hcp_refused);
}

// A type the user fixed (search_cp_comm off: nekton autoconfig when the
// recipe or a setting gives parallel.cp_comm_type) stays: every layout has
// it and no override line names it; a fixed a2a+p2p 2,2 leaves cp 4 only.
TEST(LayoutSearchCpComm, KeepsAFixedType) {
  LayoutSearchOptions opt = cp_comm_search(4);
  opt.search_cp_comm = false;
  bool cp2 = false;
  for (const auto& k :
       search_layouts(load({"parallel.cp_comm_type=a2a", "train.global_batch=4"}), opt)) {
    EXPECT_EQ(k.cp_comm, "a2a");
    EXPECT_FALSE(contains(joined(k.overrides), "cp_comm_type")) << joined(k.overrides);
    cp2 |= k.accepted && k.cp == 2;
  }
  EXPECT_TRUE(cp2);
  const std::vector<std::string> hcp = {"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p",
                                        "parallel.hierarchical_context_parallel_sizes=2,2",
                                        "train.global_batch=4"};
  int64_t accepted = 0;
  bool refused = false;  // cp 1 and 2: the sizes' product is not cp (the config's check)
  for (const auto& k : search_layouts(load(hcp), opt)) {
    EXPECT_EQ(k.cp_comm, "a2a+p2p");
    EXPECT_EQ(k.hierarchical_cp_sizes, (std::vector<int64_t>{2, 2}));
    if (!k.accepted) {
      refused |= k.cp != 4 && contains(k.reason, "hierarchical_context_parallel_sizes = 2,2");
      continue;
    }
    ++accepted;
    EXPECT_EQ(k.cp, 4);
    std::vector<std::string> o = hcp;
    o.insert(o.end(), k.overrides.begin(), k.overrides.end());
    EXPECT_NO_THROW(train_mesh(load(o), 4, 0)) << joined(o);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_TRUE(refused);
}

std::string recipe_args() {
  std::string s = "data.path=" + corpus_path();
  for (const auto& o : kRecipe) s += " " + o;
  return s;
}

TEST(LayoutSearchCli, NoTimeRanksByMemoryAndPrintsTheBestOverrides) {
  auto r = run_nekton("estimate --search --nproc 2 --no-time " + recipe_args(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "ranked by memory per rank")) << r.out;
  EXPECT_TRUE(contains(r.out, "memory/rank")) << r.out;
  EXPECT_TRUE(contains(r.out, "best: nekton train --nproc 2 ... parallel.tp=")) << r.out;
  r = run_nekton("estimate --search --nproc 2 --no-time --json " + recipe_args(), false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ranked_by"], "memory");
  int64_t last = 0, rejected = 0;
  bool in_accepted = true;
  for (const auto& k : j["candidates"]) {
    if (k["accepted"].get<bool>()) {
      ASSERT_TRUE(in_accepted) << "accepted after rejected";
      EXPECT_GE(k["memory_bytes"].get<int64_t>(), last);
      last = k["memory_bytes"].get<int64_t>();
    } else {
      in_accepted = false;
      ++rejected;
      EXPECT_FALSE(k["reason"].get<std::string>().empty());
    }
  }
  EXPECT_GT(rejected, 0);
  // The winner trains: two steps on two processes with its overrides.
  std::string best;
  for (const auto& o : j["candidates"][0]["overrides"]) best += " " + o.get<std::string>();
  const fs::path out = fs::temp_directory_path() / fmt::format("nk-autocfg-run-{}", ::getpid());
  r = run_nekton(
      "train --nproc 2 " + recipe_args() + best +
      " train.steps=2 train.val_every=0 train.peak_tflops=1 train.out_dir=" + out.string());
  EXPECT_EQ(r.code, 0) << best << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "step     2/2")) << r.out;
  fs::remove_all(out);
  // The world size is required; a bad link bandwidth is named.
  r = run_nekton("estimate --search --no-time " + recipe_args());
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--nproc")) << r.out;
  r = run_nekton("estimate --search --nproc 2 --link-gbps 0 " + recipe_args());
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--link-gbps")) << r.out;
}

// With a fixed rates file the ranking is the same on every run and ordered
// by predicted step time; nothing is measured.
TEST(LayoutSearchCli, FixedRatesGiveADeterministicRanking) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("nk-autocfg-{}", ::getpid());
  fs::create_directories(dir);
  const std::string env = "NEKTON_CACHE=" + dir.string() + " ";
  const std::string args = "--search --nproc 2 --json train.global_batch=4 " + recipe_args();
  auto r =
      test::run_command(env + test::nekton_bin() + " estimate " + args + " 2>/dev/null", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json first = nlohmann::json::parse(r.out);
  EXPECT_GT(first["rates_measured"].get<int64_t>(), 0);
  { std::ofstream(dir / "rates.json") << first["rates"].dump(); }
  const std::string fixed = " --rates " + (dir / "rates.json").string();
  std::vector<nlohmann::json> runs;
  for (int i = 0; i < 2; ++i) {
    r = run_nekton("estimate " + args + fixed, false);
    ASSERT_EQ(r.code, 0) << r.out;
    runs.push_back(nlohmann::json::parse(r.out));
    EXPECT_EQ(runs.back()["rates_measured"], 0);
    EXPECT_EQ(runs.back()["ranked_by"], "step_time");
  }
  EXPECT_EQ(runs[0]["candidates"], runs[1]["candidates"]);
  double last = 0;
  for (const auto& k : runs[0]["candidates"]) {
    if (!k["accepted"].get<bool>()) break;
    const double t = k["step_seconds"]["total"].get<double>();
    EXPECT_GE(t, last);
    EXPECT_GT(k["tokens_per_s"].get<double>(), 0);
    last = t;
  }
  // The table prints the same winner's overrides.
  r = run_nekton("estimate --search --nproc 2 train.global_batch=4 " + recipe_args() + fixed,
                 false);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string best;
  for (const auto& o : runs[0]["candidates"][0]["overrides"]) best += " " + o.get<std::string>();
  EXPECT_TRUE(contains(r.out, "best: nekton train --nproc 2 ..." + best)) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace nk
