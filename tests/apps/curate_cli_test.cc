// `nekton curate` end to end: inputs of every kind, the removed-documents
// JSONL and report, bad input counted rather than fatal, config errors that
// name the file and line and leave nothing behind, and resume after kill -9
// giving the same bytes as an uninterrupted run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "core/output_lock.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::contains;
using test::TempDir;

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::string s = test::read_file(path);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    out.push_back(json::parse(s.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

// Every record of OUT/<sub>/shard_*.jsonl, in shard order.
std::vector<json> all_records(const std::string& out, const std::string& sub) {
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(out + "/" + sub)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<json> recs;
  for (auto& f : files)
    for (auto& r : read_jsonl(f)) recs.push_back(r);
  return recs;
}

std::string para(int i) {
  return fmt::format(
      "Document number {} talks about the river, the valley and the old mill. People came "
      "from far away to see the water wheel turn, and the miller told stories of floods. ",
      i);
}

// 80 words drawn by topic from a small vocabulary: two topics share few
// 10-character shingles, one topic's texts are exact or near duplicates.
std::string prose(int topic) {
  static const char* words[] = {"river",  "valley",  "mill",    "water",  "wheel",   "stone",
                                "bridge", "market",  "winter",  "summer", "harvest", "storm",
                                "forest", "village", "castle",  "road",   "garden",  "letter",
                                "church", "school",  "orchard", "meadow", "harbour", "lantern",
                                "candle", "thread",  "copper",  "silver", "barley",  "cattle",
                                "ferry",  "tower",   "cellar",  "chapel", "quarry",  "furnace"};
  std::mt19937 r(uint32_t(topic) * 2654435761u + 1);
  std::string s;
  for (int i = 0; i < 80; ++i) s += std::string(i ? " " : "") + words[r() % std::size(words)];
  return s + ".";
}

TEST(CurateCli, MixedInputsKeptRemovedAndReport) {
  TempDir dir("nk_curate");
  std::string jl;
  jl += json({{"id", "a"}, {"text", para(1)}, {"url", "http://x/1"}}).dump() + "\n";
  jl += json({{"id", "b"}, {"text", para(2) + " Mail me at jane.doe@example.com now."}}).dump() +
        "\n";
  jl += json({{"id", "c"}, {"text", para(1)}}).dump() + "\n";    // exact duplicate of a
  jl += "{\"id\": \"d\", \"text\": \"broken\"\n";                // malformed JSON
  jl += json({{"id", "e"}, {"text", "   \n  "}}).dump() + "\n";  // empty
  jl += json({{"text", "Too short."}}).dump() + "\n";            // no id, few words
  test::write_file(dir / "in.jsonl", jl);
  fs::create_directories(dir / "pages/sub");
  test::write_file(dir / "pages/p1.html",
                   "<html><head><title>t</title><script>var x=1;</script></head><body><nav><a "
                   "href='/'>Home</a></nav><p>" +
                       para(3) + "</p></body></html>");
  test::write_file(dir / "pages/sub/p2.tex",
                   "\\documentclass{article}\\begin{document}\\section{Mills}" + para(4) +
                       "% a comment\n\\end{document}");
  test::write_file(dir / "pages/p3.txt", para(5));
  test::write_file(dir / "pages/ignored.bin", "\x01\x02");
  test::write_file(dir / "p.yaml", fmt::format(R"(input:
  paths: [{0}/in.jsonl, {0}/pages]
output:
  dir: {0}/out
stages:
  - type: html_to_text
  - type: latex_to_text
  - type: clean
  - {{type: word_count, min_words: 10}}
  - type: pii
  - type: exact_dedup
)",
                                               dir.path().string()));
  auto r = test::run_nekton("curate --config " + dir / "p.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<json> kept = all_records(dir / "out", "data");
  std::vector<json> removed = all_records(dir / "out", "removed");
  std::vector<std::string> ids;
  for (auto& k : kept) ids.push_back(k["id"]);
  ASSERT_EQ(ids.size(), 5u) << r.out;
  EXPECT_EQ(ids[0], "a");
  EXPECT_EQ(ids[1], "b");
  EXPECT_TRUE(contains(ids[2], "p1.html")) << ids[2];
  EXPECT_EQ(kept[0]["url"], "http://x/1");  // other fields pass through
  EXPECT_TRUE(contains(kept[1]["text"], "<EMAIL>")) << kept[1];
  EXPECT_FALSE(contains(kept[2]["text"], "var x")) << kept[2];
  EXPECT_FALSE(contains(kept[2]["text"], "Home")) << kept[2];
  EXPECT_EQ(kept[2]["format"], "html");
  EXPECT_FALSE(contains(kept[3]["text"], "documentclass")) << kept[3];
  EXPECT_FALSE(contains(kept[3]["text"], "comment")) << kept[3];

  std::map<std::string, std::string> by;  // id -> removed_by
  for (auto& x : removed) by[x["id"]] = x["removed_by"];
  EXPECT_EQ(by["c"], "exact_dedup");
  EXPECT_EQ(by[dir / "in.jsonl:4"], "input");  // malformed: named by file:line
  EXPECT_EQ(by["e"], "input");
  EXPECT_EQ(by[dir / "in.jsonl:6"], "word_count");
  for (auto& x : removed) EXPECT_FALSE(x["reason"].get<std::string>().empty()) << x;

  json rep = json::parse(test::read_file(dir / "out/report.json"));
  EXPECT_EQ(rep["input_docs"], 9);
  EXPECT_EQ(rep["output_docs"], 5);
  EXPECT_EQ(rep["removed_docs"], 4);
  EXPECT_EQ(rep["bad_records"], 1);
  EXPECT_EQ(rep["empty_docs"], 1);
  for (auto& st : rep["stages"])
    EXPECT_EQ(st["docs_in"].get<int>() - st["removed"].get<int>(), st["kept"].get<int>());
  EXPECT_TRUE(contains(r.out, "exact_dedup")) << r.out;  // the table
  EXPECT_FALSE(fs::exists(dir / "out/.work"));

  // A rerun of a finished run does nothing and says so.
  auto again = test::run_nekton("curate --config " + dir / "p.yaml");
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "already complete")) << again.out;
}

TEST(CurateCli, BadInputIsCountedNeverFatal) {
  TempDir dir("nk_curate_bad");
  std::string jl;
  jl += "{\"id\": \"u\", \"text\": \"caf\xe9 au lait " + para(1) + "\"}\n";  // Latin-1 byte
  jl += "not json at all\n";
  jl += "[1, 2]\n";
  jl += "{\"id\": \"n\", \"text\": 42}\n";
  jl += "{\"id\": \"m\"}\n";
  jl += json({{"id", "ok"}, {"text", para(2)}}).dump() + "\n";
  test::write_file(dir / "in.jsonl", jl);
  // A 100 MB single document.
  std::string big = "{\"id\": \"big\", \"text\": \"";
  std::string p = para(7);
  while (big.size() < (size_t(100) << 20)) big += p;
  big += "\"}\n";
  test::write_file(dir / "big.jsonl", big);
  big.clear();
  // A truncated zstd stream: the records before the damage are kept.
  std::string z;
  for (int i = 0; i < 2000; ++i) z += json({{"id", i}, {"text", para(i)}}).dump() + "\n";
  test::write_file(dir / "z.jsonl", z);
  ASSERT_EQ(test::run_command("zstd -q -f " + dir / "z.jsonl" + " -o " + dir / "z.jsonl.zst").code,
            0);
  std::string zz = test::read_file(dir / "z.jsonl.zst");
  test::write_file(dir / "z.jsonl.zst", zz.substr(0, zz.size() / 2));
  fs::remove(dir / "z.jsonl");
  // A folder with a readable page and a link to nothing (an unreadable file).
  fs::create_directories(dir / "pages");
  test::write_file(dir / "pages/good.txt", para(3));
  fs::create_symlink(dir / "no/such/file.html", dir / "pages/lost.html");
  for (std::string mode : {"replace", "skip"}) {
    SCOPED_TRACE(mode);
    test::write_file(dir / "p.yaml", fmt::format(R"(input:
  paths: [{0}/in.jsonl, {0}/big.jsonl, {0}/z.jsonl.zst, {0}/pages]
  invalid_utf8: {1}
output:
  dir: {0}/out_{1}
stages:
  - type: clean
)",
                                                 dir.path().string(), mode));
    auto r = test::run_nekton("curate --config " + dir / "p.yaml");
    ASSERT_EQ(r.code, 0) << r.out;
    json rep = json::parse(test::read_file(dir / ("out_" + mode) + "/report.json"));
    EXPECT_EQ(rep["bad_records"], mode == "replace" ? 5 : 6) << rep.dump();
    EXPECT_EQ(rep["utf8_repaired"], mode == "replace" ? 1 : 0);
    ASSERT_EQ(rep["errors"].size(), 1u) << rep.dump();
    EXPECT_TRUE(contains(rep["errors"][0], "z.jsonl.zst")) << rep.dump();
    EXPECT_TRUE(contains(r.out, "z.jsonl.zst")) << r.out;
    std::vector<json> kept = all_records(dir / ("out_" + mode), "data");
    bool saw_big = false, saw_u = false;
    std::vector<std::string> z_ids;  // records of the damaged zstd file that were kept
    for (auto& k : kept) {
      saw_big |= k["id"] == "big";
      if (k["text"].get<std::string>().rfind("Document number", 0) == 0 &&
          std::isdigit(static_cast<unsigned char>(k["id"].get<std::string>()[0])))
        z_ids.push_back(k["id"]);
      if (k["id"] == "u") {
        saw_u = true;
        EXPECT_TRUE(contains(k["text"], "caf\xef\xbf\xbd au")) << k["text"];
      }
    }
    EXPECT_TRUE(saw_big);
    EXPECT_EQ(saw_u, mode == "replace");
    // Exactly the records before the damage: ids 0, 1, ..., m-1, m >= 1.
    ASSERT_FALSE(z_ids.empty());
    for (size_t i = 0; i < z_ids.size(); ++i) EXPECT_EQ(z_ids[i], std::to_string(i));
    EXPECT_EQ(rep["output_docs"].get<size_t>(), z_ids.size() + (mode == "replace" ? 4 : 3))
        << rep.dump();  // ok, big, good.txt (and u)
    bool saw_lost = false;
    for (auto& x : all_records(dir / ("out_" + mode), "removed"))
      if (contains(x["id"], "lost.html")) {
        saw_lost = true;
        EXPECT_EQ(x["removed_by"], "input");
        EXPECT_TRUE(contains(x["reason"], "cannot read")) << x;
      }
    EXPECT_TRUE(saw_lost);
  }
}

TEST(CurateCli, ConfigErrorsNameTheLineAndLeaveNothing) {
  TempDir dir("nk_curate_cfg");
  test::write_file(dir / "in.jsonl", json({{"text", para(1)}}).dump() + "\n");
  auto run = [&](const std::string& stages, const std::string& extra = "",
                 const std::string& input = "in.jsonl") {
    test::write_file(dir / "p.yaml", "input:\n  paths: [" + dir / input + "]\noutput:\n  dir: " +
                                         dir / "out" + "\n" + extra + "stages:\n" + stages);
    return test::run_nekton("curate --config " + dir / "p.yaml");
  };
  auto r = run("  - type: clean\n  - type: no_such_stage\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "p.yaml:7: stage 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "unknown stage type 'no_such_stage'")) << r.out;
  r = run("  - type: word_count\n    min_words: many\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "p.yaml:7: stage 1 (word_count): key 'min_words'")) << r.out;
  EXPECT_TRUE(contains(r.out, "min_words")) << r.out;
  r = run("  - type: clean\n    nfc_typo: true\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "nfc_typo")) << r.out;
  r = run("  - type: clean\n", "workerz: 2\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "p.yaml:5: unknown key 'workerz'")) << r.out;
  r = run("  - type: clean\n", "", "missing.jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "missing.jsonl' does not exist")) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out"));
  run("  - type: clean\n");
  fs::remove_all(dir / "out");
  r = test::run_nekton("curate --config " + dir / "p.yaml" + " input.paths=" + dir / "nope.jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "nope.jsonl")) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out"));
  // An output folder that is not a curate run is never written into.
  fs::create_directories(dir / "out");
  test::write_file(dir / "out/keep.txt", "x");
  r = run("  - type: clean\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "not an unfinished curate run")) << r.out;
  EXPECT_EQ(test::read_file(dir / "out/keep.txt"), "x");
  // A run left unfinished is resumed only by the same pipeline.
  fs::remove_all(dir / "out");
  fs::create_directories(dir / "out/.work");
  test::write_file(dir / "out/.work/pipeline.json", R"({"fingerprint": "0", "inputs": "0"})");
  r = run("  - type: clean\n");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "different pipeline")) << r.out;
}

// A large plain JSONL file is cut into shards at line ends; the records,
// their order and the FILE:LINE names of those without ids do not change.
TEST(CurateCli, LargeJsonlSplitsIntoShardsAtLineEnds) {
  TempDir dir("nk_curate_split");
  std::string jl;
  for (int i = 0; jl.size() < (size_t(3) << 20) + 1000; ++i) {
    if (i % 997 == 5)
      jl += "{\"broken\n";
    else if (i % 2 == 0)
      jl += json({{"text", para(i)}}).dump() + "\n";  // named by its line
    else
      jl += json({{"id", fmt::format("x{}", i)}, {"text", para(i)}}).dump() + "\n";
  }
  test::write_file(dir / "big.jsonl", jl);
  std::map<std::string, std::vector<json>> got;
  for (std::string mb : {"0", "1"}) {
    test::write_file(dir / "p.yaml", fmt::format(R"(input:
  paths: [{0}/big.jsonl]
  shard_mb: {1}
output:
  dir: {0}/out{1}
progress: none
stages:
  - type: clean
)",
                                                 dir.path().string(), mb));
    auto r = test::run_nekton("curate --config " + dir / "p.yaml");
    ASSERT_EQ(r.code, 0) << r.out;
    json rep = json::parse(test::read_file(dir / ("out" + mb) + "/report.json"));
    EXPECT_EQ(rep["shards"], mb == "0" ? 1 : 4) << rep.dump();
    got["kept" + mb] = all_records(dir / ("out" + mb), "data");
    got["removed" + mb] = all_records(dir / ("out" + mb), "removed");
  }
  EXPECT_EQ(got["kept0"], got["kept1"]);
  EXPECT_EQ(got["removed0"], got["removed1"]);
  ASSERT_FALSE(got["kept1"].empty());
  EXPECT_EQ(got["kept1"][0]["id"], dir / "big.jsonl:1");
  EXPECT_GT(got["removed1"].size(), 2u);
  EXPECT_EQ(got["removed1"][0]["id"], dir / "big.jsonl:6");
}

// --- resume ---------------------------------------------------------------

// Every file under OUT (relative name -> bytes), report.json without timings
// and without the TensorBoard event file (named by the time and host, and
// holding wall times; tests/apps/curate_tensorboard_test.cc checks it).
std::map<std::string, std::string> output_files(const std::string& out) {
  std::map<std::string, std::string> files;
  for (auto& e : fs::recursive_directory_iterator(out)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), out).string();
    if (rel.rfind("events.out.tfevents.", 0) == 0) continue;
    std::string bytes = test::read_file(e.path().string());
    if (rel == "report.json") {
      json j = json::parse(bytes);
      for (auto& st : j["stages"]) st.erase("seconds"), st.erase("mb_per_s_per_core");
      bytes = j.dump();
    }
    files[rel] = bytes;
  }
  return files;
}

TEST(CurateCli, KillNineThenRerunGivesTheSameOutput) {
  TempDir dir("nk_curate_resume");
  // 12 shards; near-duplicates across shards so the global stages matter.
  std::mt19937 rng(7);
  for (int s = 0; s < 12; ++s) {
    std::string jl;
    for (int i = 0; i < 1200; ++i) {
      int topic = int(rng() % 2000);
      jl += json({{"id", fmt::format("s{}-{}", s, i)},
                  {"text", para(topic) + para(topic + 1) + " Contact: 555-867-5309."}})
                .dump() +
            "\n";
    }
    fs::create_directories(dir / "in");
    test::write_file(dir / fmt::format("in/{:02d}.jsonl", s), jl);
  }
  auto cfg = [&](const std::string& out) {
    test::write_file(dir / (out + ".yaml"), fmt::format(R"(input:
  paths: [{0}/in]
output:
  dir: {0}/{1}
batch_mb: 1
progress: none
stages:
  - type: clean
  - type: pii
  - type: exact_dedup
  - {{type: word_count, min_words: 10}}
  - type: fuzzy_dedup
  - type: clean
)",
                                                        dir.path().string(), out));
    return std::vector<std::string>{"curate", "--config", dir / (out + ".yaml")};
  };
  (void)cfg("ref");
  auto t0 = std::chrono::steady_clock::now();
  auto ref = test::run_nekton("curate --config " + dir / "ref.yaml");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(ref.code, 0) << ref.out;
  auto want = output_files(dir / "ref");
  ASSERT_GT(want.size(), 20u);

  std::uniform_real_distribution<double> when(0.1 * secs, 0.8 * secs);
  int resumed_runs = 0;
  for (int trial = 0; trial < 3; ++trial) {
    SCOPED_TRACE(trial);
    std::string out = fmt::format("t{}", trial);
    auto args = cfg(out);
    for (int kill = 0; kill < 2; ++kill) {
      pid_t pid = test::spawn_nekton(args, dir / (out + ".log"));
      std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    std::string cmd = "curate --config " + args[2];
    auto r = test::run_nekton(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    if (contains(r.out, "resumed")) ++resumed_runs;
    auto got = output_files(dir / out);
    std::string diff;
    for (auto& [name, bytes] : want)
      if (!got.count(name) || got[name] != bytes) diff += " " + name;
    for (auto& [name, bytes] : got)
      if (!want.count(name)) diff += " +" + name;
    EXPECT_EQ(diff, "") << "output differs after resume\n" << r.out;
  }
  std::printf("reruns that resumed finished work: %d of 3\n", resumed_runs);
}

// Incremental dedup across crawls (exact_dedup and fuzzy_dedup with
// save_state / load_state): crawl B curated against crawl A's saved state
// keeps and removes exactly the B documents one run over A then B does, with
// the same reasons; a kill -9 of the B run and a rerun give the same output
// and the same saved state as an uninterrupted run.
TEST(CurateCli, IncrementalDedupAcrossCrawlsMatchesOneJointRun) {
  TempDir dir("nk_curate_incr");
  std::mt19937 rng(3);
  for (const char* crawl : {"a", "b"}) {
    for (int s = 0; s < 2; ++s) {
      std::string jl;
      for (int i = 0; i < 400; ++i) {
        int topic = int(rng() % 900);  // repeats within and across crawls
        std::string text = prose(topic);
        if (rng() % 3 == 0) text += " And one more remark.";  // a near-duplicate
        jl += json({{"id", fmt::format("{}{}-{}", crawl, s, i)}, {"text", text}}).dump() + "\n";
      }
      fs::create_directories(dir / fmt::format("in/{}", crawl));
      test::write_file(dir / fmt::format("in/{}/{:02d}.jsonl", crawl, s), jl);
    }
  }
  auto cfg = [&](const std::string& name, const std::string& paths, const std::string& exact_keys,
                 const std::string& fuzzy_keys) {
    test::write_file(dir / (name + ".yaml"),
                     fmt::format(R"(input:
  paths: [{0}]
output:
  dir: {1}
batch_mb: 1
progress: none
stages:
  - type: clean
  - {{type: exact_dedup{2}}}
  - {{type: fuzzy_dedup, char_ngrams: 10{3}}}
)",
                                 paths, dir / name, exact_keys, fuzzy_keys));
    return std::vector<std::string>{"curate", "--config", dir / (name + ".yaml")};
  };
  auto run_ok = [&](const std::vector<std::string>& args) {
    auto r = test::run_nekton(args[0] + " " + args[1] + " " + args[2]);
    EXPECT_EQ(r.code, 0) << r.out;
  };
  const std::string in_a = dir / "in/a", in_b = dir / "in/b";
  run_ok(cfg("joint", in_a + ", " + in_b, "", ""));
  run_ok(cfg("crawl_a", in_a, ", save_state: " + dir / "state/exact_a",
             ", save_state: " + dir / "state/fuzzy_a"));
  auto b_args =
      cfg("crawl_b", in_b,
          ", load_state: " + dir / "state/exact_a" + ", save_state: " + dir / "state/exact_b",
          ", load_state: " + dir / "state/fuzzy_a" + ", save_state: " + dir / "state/fuzzy_b");
  run_ok(b_args);
  for (const char* st : {"exact_a", "fuzzy_a", "exact_b", "fuzzy_b"})
    EXPECT_TRUE(fs::exists(dir / fmt::format("state/{}/state.json", st))) << st;

  // B's documents, kept and removed, as the joint run decided them.
  auto of_b = [](const std::vector<json>& recs) {
    std::vector<json> out;
    for (const json& r : recs)
      if (r["id"].get<std::string>()[0] == 'b') out.push_back(r);
    return out;
  };
  auto kept = all_records(dir / "crawl_b", "data");
  auto removed = all_records(dir / "crawl_b", "removed");
  EXPECT_EQ(kept, of_b(all_records(dir / "joint", "data")));
  EXPECT_EQ(removed, of_b(all_records(dir / "joint", "removed")));
  int against_a = 0, fuzzy = 0;
  for (const json& r : removed) {
    std::string reason = r["reason"].get<std::string>();
    against_a += contains(reason, "'a");
    fuzzy += r["removed_by"] == "fuzzy_dedup";
  }
  EXPECT_GT(against_a, 100) << "few B documents removed as duplicates of crawl A's";
  EXPECT_GT(fuzzy, 20) << "few near-duplicates removed";
  EXPECT_GT(kept.size(), 100u) << "few B documents kept";
  std::printf("crawl B: %zu kept, %zu removed (%d against crawl A, %d near-duplicates)\n",
              kept.size(), removed.size(), against_a, fuzzy);

  // Killed once at a random point, then rerun: same output, same state.
  auto want_out = output_files(dir / "crawl_b");
  auto want_state = output_files(dir / "state/fuzzy_b");
  fs::remove_all(dir / "state/exact_b");
  fs::remove_all(dir / "state/fuzzy_b");
  auto args =
      cfg("crawl_b2", in_b,
          ", load_state: " + dir / "state/exact_a" + ", save_state: " + dir / "state/exact_b",
          ", load_state: " + dir / "state/fuzzy_a" + ", save_state: " + dir / "state/fuzzy_b");
  pid_t pid = test::spawn_nekton(args, dir / "b2.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 400));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run_ok(args);
  EXPECT_EQ(output_files(dir / "crawl_b2"), want_out);
  EXPECT_EQ(output_files(dir / "state/fuzzy_b"), want_state);
}

// Input folders are walked through symbolic links. A loop (a link back into
// its own path, or a link that resolves to itself) is named in a warning and
// skipped, and the run goes on; a folder reached twice is read once. An input
// that is nothing but a loop is a clear error.
TEST(CurateCli, SymlinkLoopsAreSkippedWithAWarning) {
  TempDir dir("nk_curate_loop");
  fs::create_directories(dir / "in/sub");
  fs::create_directories(dir / "other");
  test::write_file(dir / "in/a.txt", para(1));
  test::write_file(dir / "other/b.txt", para(2));
  fs::create_symlink(".", dir / "in/again");            // back to in/
  fs::create_symlink("..", dir / "in/sub/up");          // back to in/ from below
  fs::create_symlink("self.txt", dir / "in/self.txt");  // resolves to itself
  fs::create_symlink("../other", dir / "in/linked");    // a real folder, read
  fs::create_symlink("../other", dir / "in/linked2");   // the same folder: read once
  auto cfg = [&](const std::string& paths, const std::string& out) {
    test::write_file(dir / "p.yaml", fmt::format(R"(input:
  paths: [{}]
output:
  dir: {}
progress: none
stages:
  - type: clean
)",
                                                 paths, dir / out));
    return test::run_nekton("curate --config " + dir / "p.yaml");
  };
  auto r = cfg(dir / "in", "out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "skipped '" + dir / "in/again" + "': a symbolic link loop")) << r.out;
  EXPECT_TRUE(contains(r.out, "skipped '" + dir / "in/sub/up" + "': a symbolic link loop"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "skipped '" + dir / "in/self.txt" + "': a symbolic link loop"))
      << r.out;
  json rep = json::parse(test::read_file(dir / "out/report.json"));
  EXPECT_EQ(rep["input_docs"], 2) << rep.dump();
  EXPECT_EQ(rep["bad_records"], 0) << rep.dump();
  std::vector<std::string> ids;
  for (auto& k : all_records(dir / "out", "data")) ids.push_back(k["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{dir / "in/a.txt", dir / "in/linked/b.txt"}));

  // Nothing but loops: an error naming the loop, exit 1, no output.
  fs::create_directories(dir / "only");
  fs::create_symlink(".", dir / "only/again");
  r = cfg(dir / "only", "out2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "'" + dir / "only/again" + "' is a symbolic link loop")) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out2"));
  r = cfg(dir / "in/self.txt", "out3");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "'" + dir / "in/self.txt" + "' is a symbolic link loop")) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out3"));
}

// File names are bytes: one that is not UTF-8 is read like any other, shows
// up in ids and reports with its bad bytes as \xHH, and a killed run over it
// still resumes to the same output.
TEST(CurateCli, FileNamesThatAreNotUtf8NeverStopTheRun) {
  TempDir dir("nk_curate_names");
  fs::create_directories(dir / "in");
  test::write_file(dir / "in/caf\xe9.txt", para(1));  // Latin-1
  test::write_file(dir / "in/ok.txt", para(2));
  std::string jl;
  for (int i = 0; i < 2000; ++i) jl += json({{"text", para(i + 3)}}).dump() + "\n";
  jl += "{\"text\": \"broken\"\n";
  test::write_file(dir / "in/d\xff\xfe.jsonl", jl);
  auto cfg = [&](const std::string& out) {
    test::write_file(dir / (out + ".yaml"), fmt::format(R"(input:
  paths: [{0}/in]
output:
  dir: {0}/{1}
progress: none
batch_mb: 1
stages:
  - type: clean
  - type: exact_dedup
  - {{type: word_count, min_words: 5}}
)",
                                                        dir.path().string(), out));
    return std::vector<std::string>{"curate", "--config", dir / (out + ".yaml")};
  };
  auto r = test::run_nekton("curate --config " + cfg("ref")[2]);
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = json::parse(test::read_file(dir / "ref/report.json"));
  EXPECT_EQ(rep["input_docs"], 2003) << rep.dump();
  EXPECT_EQ(rep["bad_records"], 1) << rep.dump();
  std::set<std::string> ids;
  for (auto& k : all_records(dir / "ref", "data")) ids.insert(k["id"]);
  EXPECT_TRUE(ids.count(dir / "in/caf\\xe9.txt")) << *ids.begin();
  EXPECT_TRUE(ids.count(dir / "in/ok.txt"));
  EXPECT_TRUE(ids.count(dir / "in/d\\xff\\xfe.jsonl:1"));
  std::vector<json> removed = all_records(dir / "ref", "removed");
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0]["id"], dir / "in/d\\xff\\xfe.jsonl:2001");

  // Killed and rerun: the plan of input names hashes the same, so the rerun
  // resumes (or starts over) to the same bytes.
  auto want = output_files(dir / "ref");
  for (int trial = 0; trial < 2; ++trial) {
    std::string out = "t" + std::to_string(trial);
    auto args = cfg(out);
    pid_t pid = test::spawn_nekton(args, dir / (out + ".log"));
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 250 * trial));
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    r = test::run_nekton("curate --config " + args[2]);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(output_files(dir / out) == want);
  }
}

// A curate run on an output folder another process holds fails at once,
// naming its pid, and writes nothing there.
TEST(CurateCli, BusyOutputFolderFailsNamingThePid) {
  TempDir dir("nk_curate_busy");
  test::write_file(dir / "in.jsonl", json({{"text", para(1)}}).dump() + "\n");
  test::write_file(dir / "p.yaml", "input:\n  paths: [" + dir / "in.jsonl" + "]\noutput:\n  dir: " +
                                       dir / "out" + "\nstages:\n  - type: clean\n");
  {
    OutputLock held(dir / "out", LockAt::Inside);
    auto r = test::run_nekton("curate --config " + dir / "p.yaml");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(contains(r.out, "error: '" + dir / "out" + "' is in use by nekton pid " +
                                    std::to_string(::getpid()) + " (lock file '" +
                                    dir / "out/.nekton.lock" + "')"))
        << r.out;
    EXPECT_EQ(test::leftover_files(dir / "out"), std::vector<std::string>{".nekton.lock"});
    EXPECT_EQ(std::distance(fs::directory_iterator(dir / "out"), fs::directory_iterator()), 1);
  }
  auto r = test::run_nekton("curate --config " + dir / "p.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::leftover_files(dir / "out"), std::vector<std::string>{});
}

// A run killed before its plan (.work/pipeline.json) landed left its lock file
// and a work folder holding at most a temporary: the rerun starts afresh and
// writes what an untouched folder gets. Anything else there is still refused.
TEST(CurateCli, RunKilledBeforeItsPlanLandedStartsAfresh) {
  TempDir dir("nk_curate_early_kill");
  std::string jl;
  for (int i = 0; i < 20; ++i) jl += json({{"text", para(i % 7)}}).dump() + "\n";
  test::write_file(dir / "in.jsonl", jl);
  auto run = [&](const std::string& out) {
    test::write_file(dir / "p.yaml", "input:\n  paths: [" + dir / "in.jsonl" +
                                         "]\noutput:\n  dir: " + dir / out +
                                         "\nprogress: none\nstages:\n  - type: exact_dedup\n");
    return test::run_nekton("curate --config " + dir / "p.yaml");
  };
  auto r = run("ref");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* left : {"", "pipeline.json.tmp.123"}) {
    SCOPED_TRACE(left);
    fs::remove_all(dir / "out");
    fs::create_directories(dir / "out/.work");
    test::write_file(dir / "out/.nekton.lock", "99999999\n");
    if (*left) test::write_file(dir / (std::string("out/.work/") + left), "{\"fingerp");
    r = run("out");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(output_files(dir / "out"), output_files(dir / "ref"));
  }
  fs::remove_all(dir / "out");
  fs::create_directories(dir / "out/.work");
  test::write_file(dir / "out/notes.txt", "mine");
  r = run("out");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "not an unfinished curate run")) << r.out;
  EXPECT_TRUE(fs::exists(dir / "out/notes.txt"));
}

}  // namespace
}  // namespace nk
