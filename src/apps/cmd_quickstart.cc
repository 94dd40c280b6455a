#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/metrics_series.h"
#include "apps/plot_chart.h"
#include "ckpt/checkpoint.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "core/progress.h"
#include "curate/pipeline/runner.h"
#include "data/dataset/text_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_trainer.h"
#include "data/utf8.h"
#include "infer/sampler.h"
#include "train/trainer.h"

namespace nk {

namespace fs = std::filesystem;

// The quickstart recipe, the whole pipeline on Debian's GCIDE dictionary
// (dict-gcide, installed by the set-up), a few minutes on two cores:
//   1. the first 20 MB of the dictionary, one JSONL document per entry,
//      curated (`nekton curate`: clean-up, exact and fuzzy dedup);
//   2. a 4096-token byte-level BPE vocabulary trained on it;
//   3. `preprocess` into a Megatron indexed dataset;
//   4. a 4-layer GPT trained on that dataset, then a sample.
// Steps 1-3 are skipped when their outputs exist. configs/quickstart.yaml holds
// the step-4 settings for `nekton train` once the data is there.
static const char* kCorpus = "/usr/share/dictd/gcide.dict.dz";
static const int64_t kCorpusBytes = 20000000;
static const int64_t kVocab = 4096;

static const std::vector<std::string> kQuickstart = {
    "model.preset=gpt-tiny",
    "model.vocab_size=4096",
    "data.split=98,2,0",
    "train.micro_batch=16",
    "train.seq_len=128",
    "train.global_batch=16",
    "train.steps=400",
    "train.lr=3e-3",
    "train.min_lr=3e-4",
    "train.warmup_steps=30",
    "train.val_every=100",
    "train.log_every=50",
    "train.out_dir=runs/quickstart",
};

namespace {

struct QuickstartData {
  std::string tokenizer, prefix;
};

// Dictionary entries (blank-line separated) as JSONL, written atomically.
void write_entries_jsonl(const std::string& text, const std::string& path) {
  AtomicFileWriter out(path);
  size_t docs = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    std::string_view entry(text.data() + at, end - at);
    while (!entry.empty() && (entry.front() == '\n' || entry.front() == ' '))
      entry.remove_prefix(1);
    if (!entry.empty()) {
      std::string line = nlohmann::json{{"text", entry}}.dump() + "\n";
      out.write(line.data(), line.size());
      ++docs;
    }
    at = end + 2;
  }
  out.commit();
  NK_INFO("quickstart: {} dictionary entries -> {}", docs, path);
}

// `nekton curate` on the entries: Unicode clean-up, then exact and MinHash
// fuzzy dedup (the dictionary repeats some entries and near-copies of others).
// Returns the curated shard.
std::string curate_entries(const std::string& jsonl, const std::string& out) {
  const std::string yaml = out + ".yaml";
  write_file_atomic(yaml, fmt::format(R"(input:
  paths: [{}]
output:
  dir: {}
progress: none
stages:
  - type: clean
    repeated_lines: false   # dictionary entries repeat short lines on purpose
    boilerplate_lines: false
  - type: exact_dedup
  - type: fuzzy_dedup
    preset: nemo
)",
                                      jsonl, out));
  curate::CurateReport r = curate::run_pipeline(curate::load_pipeline_config(yaml, {}), {});
  if (r.shards > 0)
    NK_INFO("quickstart: curate: {} entries in, {} kept ({} exact and {} near duplicates) -> {}",
            r.input_docs, r.output_docs, r.stages.size() > 1 ? r.stages[1].removed : 0,
            r.stages.size() > 2 ? r.stages[2].removed : 0, out);
  return out + "/data/shard_00000.jsonl";
}

QuickstartData prepare_data(const std::string& out_dir) {
  QuickstartData d;
  fs::path data = fs::path(out_dir) / "data";
  fs::create_directories(data);
  std::string jsonl = (data / "gcide.jsonl").string();
  d.tokenizer = (fs::path(out_dir) / "tokenizer").string();
  d.prefix = (data / "gcide_text_document").string();
  bool have_tok = fs::exists(fs::path(d.tokenizer) / "tokenizer.json");
  bool have_data = fs::exists(d.prefix + ".idx") && fs::exists(d.prefix + ".bin");
  std::string curated = (data / "curated/data/shard_00000.jsonl").string();
  if (!have_tok || !have_data) {
    // One stray Windows-1252 byte in GCIDE: repaired as a UTF-8 decoder would.
    std::string text = replace_invalid_utf8(read_text_file(kCorpus, kCorpusBytes));
    if (!fs::exists(jsonl)) write_entries_jsonl(text, jsonl);
    curated = curate_entries(jsonl, (data / "curated").string());
    if (!have_tok) {
      BpeTrainOptions o;
      o.vocab_size = kVocab;
      o.pattern = openai_pattern("cl100k_base");
      o.name = "gcide-bpe-4k";
      auto t0 = std::chrono::steady_clock::now();
      Progress bar("quickstart: BPE", ProgressMode::Auto);
      BpeVocab v =
          train_bpe(count_pieces({text}, o.pattern, 0), o, [&](int64_t done, int64_t want) {
            if (done == 1) bar.start(double(want), "merges");
            bar.set_done(double(done));
          });
      bar.finish();
      save_bpe_tokenizer(v, d.tokenizer);
      NK_INFO("quickstart: trained a {}-token BPE vocabulary in {:.1f} s -> {}", kVocab,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              d.tokenizer);
    }
  }
  if (!have_data || !have_tok) {
    PreprocessOptions p;
    p.inputs = {curated};
    p.tokenizer = d.tokenizer;
    p.output_prefix = d.prefix;
    p.progress_every_s = 1e9;  // the summary is enough here
    PreprocessStats s = preprocess_jsonl(p, {});
    NK_INFO("quickstart: preprocess: {}", s.summary());
  }
  return d;
}

}  // namespace

int cmd_quickstart(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton quickstart [key=value ...]\n\n"
        "Curates the GCIDE dictionary's entries ({}: clean-up, exact and fuzzy\n"
        "dedup), trains a BPE tokenizer on it, preprocesses the entries into\n"
        "OUT_DIR/data/gcide_text_document.{{bin,idx}}, then trains with:\n",
        kCorpus);
    for (auto& s : kQuickstart) fmt::print("  {}\n", s);
    fmt::print("\nEvery key:\n{}", schema.help());
    return 0;
  }
  std::vector<std::string> overrides = kQuickstart;
  overrides.insert(overrides.end(), a.overrides.begin(), a.overrides.end());
  // The data lives under the run's folder, so resolve train.out_dir first.
  std::string out_dir = Config::load(schema, a.config_path, overrides).get_string("train.out_dir");
  QuickstartData d = prepare_data(out_dir);
  overrides.insert(overrides.begin(), {"data.prefix=" + d.prefix, "data.tokenizer=" + d.tokenizer});
  TrainConfig cfg = train_config_from(Config::load(schema, a.config_path, overrides));
  // An interrupted quickstart continues from its checkpoint; a finished one
  // (its newest checkpoint at or past train.steps) trains again from scratch.
  std::vector<std::string> previous = list_checkpoints(cfg.checkpoint_root());
  if (!previous.empty() && checkpoint_step(previous.front()) >= cfg.steps) {
    NK_INFO("quickstart: training again from scratch (removing the finished run's {})",
            cfg.checkpoint_root());
    fs::remove_all(cfg.checkpoint_root());
  }
  Trainer trainer(cfg);
  trainer.run();
  if (trainer.stopped()) return 0;  // checkpoint saved; a rerun resumes
  const auto& h = trainer.history();
  if (!h.empty())
    fmt::print("\nloss {:.3f} -> {:.3f} over {} steps; model saved in {}/model\n", h.front().loss,
               h.back().loss, h.size(), cfg.out_dir);
  // The curves to look at (nekton plot draws the same, for several runs).
  RunMetrics run = read_run_metrics(cfg.metrics_file);
  ChartOptions chart;
  chart.metrics = {"loss"};
  if (run.series.count("val_loss")) chart.metrics.push_back("val_loss");
  const std::string png = cfg.out_dir + "/loss.png";
  draw_chart({run}, chart, png);
  fmt::print("loss curves: {} (nekton plot {} [OTHER_RUN...] --out FILE.png)\n", png, cfg.out_dir);
  fmt::print("try: nekton generate generate.model={}/model generate.prompt=\"Water\"\n\n",
             cfg.out_dir);
  fmt::print("sample:\n");
  SamplingConfig sc;
  sc.temperature = 0.8;
  sc.top_k = 40;
  sc.seed = cfg.seed;
  auto tok = load_tokenizer(cfg.data.tokenizer);
  print_sample(trainer.model(), *tok, "Water \\", 200, sc);
  return 0;
}

}  // namespace nk
