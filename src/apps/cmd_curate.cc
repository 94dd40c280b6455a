// nekton curate --config pipeline.yaml [key=value ...]
// nekton curate train-classifier --input FILE.jsonl --output MODEL.bin ...

#include <cstdio>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "apps/commands.h"
#include "apps/curate_events.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "curate/pipeline/runner.h"
#include "curate/stages.h"
#include "dist/mesh.h"
#include "dist/mpi/launch_env.h"
#include "dist/mpi/runtime.h"

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
      "  tensorboard: true       # report.json's counters as a TensorBoard event file in\n"
      "                          # output.dir (step 0 the totals, step s stage s)\n"
      "  timeout_s: 1800         # under mpirun: a rank's wait for the others at a collective\n"
      "  stages:                 # in order; each `- type: NAME` plus its keys\n"
      "    - type: clean\n"
      "    - {{type: word_count, min_words: 50}}\n\n"
      "Settings can be overridden as key=value: input.paths=a.jsonl,b.jsonl output.dir=x "
      "workers=2.\nA rerun with the same output.dir resumes: finished shards are skipped.\n\n"
      "Stage types:\n");
  for (const curate::StageFactory& f : curate::stage_registry().all())
    fmt::print("  {:<22} {}{}\n", f.type, f.make_global ? "(global) " : "", f.help);
  fmt::print("\nSee docs/curation.md for every stage's keys and defaults.\n");
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

  // Curate's lines name their stage; rank 0 alone shows them (below).
  Progress bar("curate", parse_progress_mode(cfg.progress, "progress"));
  curate::RunOptions opt;
  opt.progress_every_s = bar.every_s();
  if (bar.mode() != ProgressMode::None)
    opt.progress = [&](const std::string& line, bool final) { bar.show(line, final); };
  // TensorBoard: the counters of report.json (apps/curate_events.h).
  std::string events;
  if (cfg.tensorboard)
    opt.before_report = [&](const curate::CurateReport& done) {
      events = write_curate_events(cfg.output_dir, done);
    };
  curate::CurateReport r;
  // Under mpirun/srun: the ranks share the shards and exchange the global
  // stages' records; rank 0 writes the output and prints. An error on any
  // rank ends the job, naming the rank, rather than leaving the others
  // waiting until the timeout.
  std::optional<dist::MpiRuntime> mpi;
  std::optional<dist::ProcessGroups> groups;
  std::optional<curate::Ranks> ranks;
  if (dist::launched_by_mpi()) {
    mpi.emplace();
    if (mpi->rank() != 0) {
      set_log_level(LogLevel::Warn);
      opt.progress = nullptr;
    }
    if (cfg.workers == 0 && dist::local_world_size() > 1)  // share this host's cores
      cfg.workers =
          std::max(1, int(std::thread::hardware_concurrency()) / dist::local_world_size());
  }
  try {
    if (mpi) {
      groups.emplace(mpi->make_groups(dist::Mesh(mpi->world_size(), mpi->rank(), dist::MeshSpec{}),
                                      cfg.timeout_s));
      ranks.emplace(&groups->get("dp"));
      opt.ranks = &*ranks;
    }
    r = curate::run_pipeline(cfg, opt);
  } catch (const std::exception& e) {
    bar.end_line();
    if (mpi) mpi->abort(e.what());
    throw;
  }
  if (mpi && mpi->rank() != 0) return 0;
  if (r.shards == 0) {
    fmt::print("{} is already complete (see {}/report.json)\n", cfg.output_dir, cfg.output_dir);
    return 0;
  }
  fmt::print("{}", r.table());
  fmt::print(
      "wrote {}/data ({} documents) and {}/removed ({}); report in {}/report.json ({:.1f} s{}){}\n",
      cfg.output_dir, r.output_docs, cfg.output_dir, r.removed_docs, cfg.output_dir, r.wall_seconds,
      r.resumed_shards > 0 ? fmt::format(", resumed: {} shard steps were done", r.resumed_shards)
                           : "",
      events.empty() ? "" : "; TensorBoard events in " + events);
  return 0;
}

}  // namespace nk
