#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "apps/commands.h"
#include "apps/mpirun_launch.h"
#include "apps/run_ranks.h"
#include "apps/train_eval_tasks.h"
#include "core/json.h"
#include "core/log.h"
#include "data/jsonl_reader.h"
#include "dist/mpi/launch_env.h"
#include "dist/mpi/runtime.h"
#include "train/trainer.h"

namespace nk {

namespace {
// Under mpirun/srun: the mesh, the process groups and a data-parallel Trainer.
// Every rank's error reaches the user as "nekton rank R: ..." and ends the
// whole job (the other ranks would otherwise wait for it until the timeout).
int train_under_mpi(TrainConfig cfg, int* argc, char*** argv) {
  dist::MpiRuntime mpi(argc, argv);
  try {
    RunRanks ranks(cfg, mpi);
    Trainer trainer(cfg, ranks.parallel());
    attach_eval_tasks(trainer, cfg);
    trainer.run();
  } catch (const std::exception& e) {
    mpi.abort(e.what());
  }
  return 0;
}
}  // namespace

// --print-config: the settings as resolved (defaults < --config < key=value),
// then the model they build, each size derived from an overridden one marked
// with its rule.
int print_config(const Config& c, const TrainConfig& cfg) {
  const ModelConfig& m = cfg.model;
  fmt::print("# settings (defaults < --config < key=value)\n{}", c.to_yaml());
  const std::string from = cfg.init_from.empty()
                               ? "model.preset=" + c.get_string("model.preset")
                               : "train.init_from=" + cfg.init_from + "'s config.json";
  fmt::print(
      "# the model these settings build ({}); sizes derived from overridden ones are "
      "marked\nmodel_built:\n",
      from);
  auto line = [&](const std::string& key, const std::string& value) {
    std::string note;
    for (const DerivedField& d : m.derived)
      if (d.key == "model." + key) note = "  # derived: " + d.rule;
    fmt::print("  {}: {}{}\n", key, value, note);
  };
  line("arch", m.arch);
  for (auto [key, v] :
       std::initializer_list<std::pair<const char*, int64_t>>{{"vocab_size", m.vocab_size},
                                                              {"max_seq_len", m.max_seq_len},
                                                              {"n_layer", m.n_layer},
                                                              {"n_head", m.n_head},
                                                              {"n_kv_head", m.n_kv_head},
                                                              {"d_model", m.d_model},
                                                              {"head_dim", m.head_dim()},
                                                              {"d_ff", m.d_ff},
                                                              {"sliding_window", m.sliding_window}})
    line(key, std::to_string(v));
  line("tied_embeddings", m.tied_embeddings ? "true" : "false");
  return 0;
}

int cmd_train(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton train [--nproc N] [--config FILE.yaml] [--print-config] [key=value "
        "...]\n\n{}",
        schema.help());
    fmt::print(
        "\nData parallel: nekton train --nproc N ... (one host), or mpirun -np N nekton train\n"
        "... (or srun); every rank reads its share of train.global_batch, which must be a\n"
        "multiple of N x train.micro_batch.\n");
    return 0;
  }
  const Config c = Config::load(schema, a.config_path, a.overrides);
  TrainConfig cfg = train_config_from(c);
  if (a.print_config) return print_config(c, cfg);
  if (a.nproc > 0 && !dist::launched_by_mpi()) {
    // Checked here first, so a layout that cannot work fails before mpirun starts.
    train_mesh(cfg, a.nproc, 0);
    std::vector<std::string> args = {"train"};
    if (!a.config_path.empty()) args.insert(args.end(), {"--config", a.config_path});
    args.insert(args.end(), a.overrides.begin(), a.overrides.end());
    exec_mpirun(a.nproc, args);
  }
  if (dist::launched_by_mpi()) return train_under_mpi(cfg, nullptr, nullptr);
  Trainer trainer(cfg);
  attach_eval_tasks(trainer, cfg);
  // Stopped by SIGTERM/SIGINT after saving a checkpoint is a clean exit (0), so
  // schedulers do not count a preempted job as failed; a rerun resumes.
  trainer.run();
  return 0;
}

namespace {
// `nekton finetune --show-sample N`: record N of data.sft_path as the model
// will see it: the rendered text, then its tokens with the trained ones in
// [[ ]].
int show_sample(const TrainConfig& cfg, int64_t n) {
  const SftInputs in = sft_inputs(cfg);
  JsonlReader reader(cfg.data.sft_path);
  std::string_view line;
  int64_t line_no = 0, index = -1;
  while (reader.read_line(line, line_no))
    if (line.find_first_not_of(" \t\r") != std::string_view::npos && ++index == n) break;
  if (index != n) fail("--show-sample {}: {} holds {} samples", n, cfg.data.sft_path, index + 1);
  const std::string where = fmt::format("{}:{}", cfg.data.sft_path, line_no);
  const std::vector<ChatSegment> segs = render_record(line, where, *in.tmpl, in.specials, in.opt);
  const SftSample s = tokenize_chat(segs, *in.tok, in.opt.loss_on);
  const int64_t trained = std::count(s.trained.begin() + 1, s.trained.end(), 1);
  fmt::print("sample {} ({}), chat template {}: {} tokens, {} of them trained{}\n", n, where,
             in.tmpl->name(), s.tokens.size(), trained,
             int64_t(s.tokens.size()) > cfg.seq_len
                 ? fmt::format(" (over train.seq_len = {}: {})", cfg.seq_len, cfg.data.overlong)
                 : "");
  fmt::print("--- rendered ---\n{}\n--- tokens, trained in [[ ]] ---\n", chat_text(segs));
  std::string out;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const bool t = i > 0 && s.trained[i], prev = i > 1 && s.trained[i - 1];
    if (t && !prev) out += "[[";
    if (!t && prev) out += "]]";
    out += in.tok->token_bytes(s.tokens[i]);
  }
  if (s.tokens.size() > 1 && s.trained.back()) out += "]]";
  fmt::print("{}\n", out);
  return 0;
}
}  // namespace

int cmd_finetune(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton finetune [--nproc N] [--config FILE.yaml] [--show-sample N] "
        "[--print-config] "
        "[key=value ...]\n\n"
        "Supervised fine-tuning: train's keys, with data.sft_path (JSONL conversations or\n"
        "prompt/answer records) and usually train.init_from (the model to start from).\n\n{}",
        schema.help());
    return 0;
  }
  const Config c = Config::load(schema, a.config_path, a.overrides);
  TrainConfig cfg = train_config_from(c);
  if (a.print_config) return print_config(c, cfg);
  if (!cfg.data.sft())
    fail("data.sft_path: nekton finetune needs the conversations to train on (JSONL)");
  if (a.show_sample >= 0) return show_sample(cfg, a.show_sample);
  if (a.nproc > 0 && !dist::launched_by_mpi()) {
    train_mesh(cfg, a.nproc, 0);  // a layout that cannot work fails before mpirun starts
    std::vector<std::string> args = {"finetune"};
    if (!a.config_path.empty()) args.insert(args.end(), {"--config", a.config_path});
    args.insert(args.end(), a.overrides.begin(), a.overrides.end());
    exec_mpirun(a.nproc, args);
  }
  if (dist::launched_by_mpi()) return train_under_mpi(cfg, nullptr, nullptr);
  Trainer trainer(cfg);
  attach_eval_tasks(trainer, cfg);
  trainer.run();
  return 0;
}

}  // namespace nk
