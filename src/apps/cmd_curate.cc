// nekton curate --config pipeline.yaml [key=value ...]
// nekton curate train-classifier --input FILE.jsonl --output MODEL.bin ...
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "apps/commands.h"
#include "core/error.h"
#include "curate/pipeline/runner.h"
#include "curate/stages.h"

namespace nk {

namespace {

void print_curate_help() {
  fmt::print(
      "usage: nekton curate --config PIPELINE.yaml [key=value ...]\n"
      "       nekton curate train-classifier --input LABELLED.jsonl --output MODEL.bin "
      "[options]\n\n"
      "A pipeline file:\n"
      "  input:\n"
      "    paths: [web.jsonl.zst, pages/]  # JSONL (plain or zstd) and WARC/WET (plain or gzip)\n"
      "                                    # files; folders of .html, .tex, .txt files (one\n"
      "                                    # document each)\n"
      "    format: auto          # auto (by extension), jsonl, text, html, latex, warc, wet\n"
      "    text_key: text        # JSONL fields\n"
      "    id_key: id            # (missing ids become FILE:LINE)\n"
      "    files_per_shard: 1000 # document files per output shard\n"
      "    shard_mb: 256         # plain JSONL files above this split into shards of ~this size\n"
      "    invalid_utf8: replace # replace (U+FFFD, counted) or skip (counted as bad)\n"
      "  output:\n"
      "    dir: curated          # data/ and removed/ shards, report.json\n"
      "  workers: 0              # threads (0: all cores)\n"
      "  batch_mb: 16            # documents processed together (bounds memory)\n"
      "  progress: auto          # auto, bar, log, none\n"
      "  stages:                 # in order; each `- type: NAME` plus its keys\n"
      "    - type: clean\n"
      "    - {{type: word_count, min_words: 50}}\n\n"
      "Settings can be overridden as key=value: input.paths=a.jsonl,b.jsonl output.dir=x "
      "workers=2.\nA rerun with the same output.dir resumes: finished shards are skipped.\n\n"
      "Stage types:\n");
  for (const curate::StageFactory& f : curate::stage_registry().all())
    fmt::print("  {:<22} {}{}\n", f.type, f.make_global ? "(global) " : "", f.help);
  fmt::print("\nSee README.md (Curation) for every stage's keys and defaults.\n");
}

}  // namespace

int cmd_curate(const CommandArgs& a) {
  if (!a.args.empty() && a.args[0] == "train-classifier")
    return cmd_curate_train_classifier(std::vector<std::string>(a.args.begin() + 1, a.args.end()));
  CommandArgs c = parse_command_args(a.args);
  if (c.help) {
    print_curate_help();
    return 0;
  }
  if (c.config_path.empty())
    fail("curate: --config PIPELINE.yaml is required (see nekton curate --help)");
  curate::PipelineConfig cfg = curate::load_pipeline_config(c.config_path, c.overrides);

  std::string mode = cfg.progress;
  if (mode == "auto") mode = ::isatty(STDERR_FILENO) ? "bar" : "log";
  curate::RunOptions opt;
  opt.progress_every_s = mode == "bar" ? 0.25 : 10.0;
  bool bar_open = false;
  if (mode != "none")
    opt.progress = [&](const std::string& line, bool final) {
      if (mode == "bar") {
        fmt::print(stderr, "\r{}\x1b[K{}", line, final ? "\n" : "");
        bar_open = !final;
      } else {
        fmt::print(stderr, "[info] curate {}\n", line);
      }
      std::fflush(stderr);
    };
  curate::CurateReport r;
  try {
    r = curate::run_pipeline(cfg, opt);
  } catch (...) {
    if (bar_open) fmt::print(stderr, "\n");
    throw;
  }
  if (r.shards == 0) {
    fmt::print("{} is already complete (see {}/report.json)\n", cfg.output_dir, cfg.output_dir);
    return 0;
  }
  fmt::print("{}", r.table());
  fmt::print(
      "wrote {}/data ({} documents) and {}/removed ({}); report in {}/report.json ({:.1f} s{})\n",
      cfg.output_dir, r.output_docs, cfg.output_dir, r.removed_docs, cfg.output_dir, r.wall_seconds,
      r.resumed_shards > 0 ? fmt::format(", resumed: {} shard steps were done", r.resumed_shards)
                           : "");
  return 0;
}

}  // namespace nk
