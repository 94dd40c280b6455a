// `nekton align`: preference optimisation (src/align) through the Trainer.
#include <fmt/format.h>

#include <optional>
#include <thread>
#include "align/align_config.h"
#include "align/attribute_objective.h"
#include "align/preference_objective.h"
#include "align/reward_objective.h"
#include "align/rewards/rewards_config.h"

#include "apps/cmd_align_sampling.h"
#include "apps/commands.h"
#include "apps/mpirun_launch.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "dist/mpi/launch_env.h"
#include "dist/mpi/runtime.h"
#include "train/trainer.h"

namespace nk {

namespace {

int align_run(TrainConfig cfg, AlignConfig ac, dist::MpiRuntime* mpi);

}  // namespace

ConfigSchema align_schema() {
  return schema_of([](ConfigBinder& b) {
    TrainConfig().bind(b);
    AlignConfig().bind(b);
    AlignSamplingConfig().bind(b);  // rs, steerlm
    RewardsConfig().bind(b);        // grpo, rloo
  });
}

int cmd_align(const CommandArgs& a) {
  ConfigSchema schema = align_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton align [--nproc N] [--config FILE.yaml] [--print-config] [key=value ...]\n\n"
        "Preference optimisation from preference JSONL (align.data_path), usually from a\n"
        "fine-tuned model (train.init_from: a Nekton or Hugging Face model folder):\n"
        "  align.method=dpo    DPO (align.loss_type sigmoid, robust, hinge, ipo; cDPO with\n"
        "                      align.label_smoothing, RPO with align.rpo_alpha)\n"
        "  align.method=ipo    DPO with loss_type=ipo;  align.method=hinge: loss_type=hinge\n"
        "  align.method=kto    KTO on unpaired {{prompt, completion, label}} records\n"
        "  align.method=orpo   ORPO (no reference model)\n"
        "  align.method=simpo  SimPO (no reference model)\n"
        "  align.method=rm     a reward model: a score head (model.num_labels=1) in place of\n"
        "                      the LM head, Bradley-Terry on the pairs (with a \"margin\"\n"
        "                      per pair if the records have one); exported as HF's\n"
        "                      *ForSequenceClassification, scored by nekton eval reward;\n"
        "                      with align.reward_model_type=regression: SteerLM's attribute\n"
        "                      model, one output per align.steerlm_attributes name regressed\n"
        "                      on {{prompt, response, NAME: value}} records\n"
        "  align.method=rs     rejection sampling: align.num_rollouts_per_prompt samples per\n"
        "                      prompt of align.data_path from train.init_from, scored by\n"
        "                      align.reward_model, the best written as SFT JSONL (then\n"
        "                      fine-tuned on with align.rs_sft=true)\n"
        "  align.method=steerlm SteerLM: {{prompt, response, attribute values}} records (or\n"
        "                      values from align.attribute_model) to attribute-conditioned\n"
        "                      SFT data, then fine-tuned on; generate.steerlm_attributes asks\n"
        "                      for values\n"
        "The reference (DPO, KTO): the base with its adapters off under peft.method, else\n"
        "log-probabilities precomputed once into OUT_DIR (align.reference). train.micro_batch\n"
        "and train.global_batch count rows, two per pair (KTO: per example), so both are even.\n"
        "The log line and metrics.jsonl add TRL's rewards/chosen, rewards/rejected,\n"
        "rewards/margins, rewards/accuracies, logps/chosen, logps/rejected (KTO: kl).\n"
        "Several processes: --nproc N (one host) or mpirun -np N nekton align ..., data\n"
        "parallel (parallel.shard=optimizer: ZeRO-1, full: FSDP) and parallel.tp (not with\n"
        "peft.method: adapters run data parallel); every rank reads whole pairs.\n\n{}",
        schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, a.overrides);
  set_align_model_keys(c);
  TrainConfig cfg = train_config_from(c, false);
  AlignConfig ac;
  {
    ConfigReader r(c);
    ac.bind(r);
  }
  ac.response_key = c.get_string("align.response_key");
  ac.attributes = split_commas(c.get_string("align.steerlm_attributes"));
  if (a.print_config) return print_config(c, cfg);
  if (ac.method == "rs") return align_rejection_sampling(a, schema, c, cfg, ac);
  if (ac.method == "steerlm") return align_steerlm(a, schema, c, cfg, ac);
  ac.check(cfg.peft.adapters());
  const dist::MeshSpec& m = cfg.parallel.mesh;
  if (m.cp * m.ep * m.pp > 1 || cfg.parallel.sequence_parallel)
    fail(
        "parallel.sp, parallel.cp, parallel.ep, parallel.pp: nekton align runs under data and "
        "tensor parallelism only for now (sp {}, cp {}, ep {}, pp {}); set them to 1 (sp false)",
        cfg.parallel.sequence_parallel, m.cp, m.ep, m.pp);
  if (m.tp * std::max(m.dp, 1) > 1 && a.nproc == 0 && !dist::launched_by_mpi())
    fail(
        "parallel.tp = {}, parallel.dp = {}: more than one process asked for; run nekton align "
        "--nproc N or under mpirun",
        m.tp, m.dp);
  const DataConfig& dc = cfg.data;
  if (!dc.path.empty() || !dc.prefix.empty() || !dc.blend.empty() || dc.sft())
    fail(
        "data.{}: nekton align reads preference JSONL from align.data_path, not data.path, "
        "data.prefix, data.blend or data.sft_path",
        dc.sft()             ? "sft_path"
        : !dc.path.empty()   ? "path"
        : !dc.prefix.empty() ? "prefix"
                             : "blend");
  if (cfg.peft.method == "p_tuning")
    fail("peft.method: p_tuning does not align yet (its virtual tokens have no 'off' switch)");
  const bool regression = !ac.attributes.empty();
  if (!regression && (cfg.micro_batch % 2 || cfg.global_batch % 2))
    fail(
        "train.micro_batch: {} and train.global_batch: {} count rows, two per pair (KTO: per "
        "example), so both must be even",
        cfg.micro_batch, cfg.global_batch);
  if (a.nproc > 0 && !dist::launched_by_mpi()) {
    train_mesh(cfg, a.nproc, 0);  // a layout that cannot work fails before mpirun starts
    std::vector<std::string> args = {"align"};
    if (!a.config_path.empty()) args.insert(args.end(), {"--config", a.config_path});
    args.insert(args.end(), a.overrides.begin(), a.overrides.end());
    exec_mpirun(a.nproc, args);
  }
  // Under mpirun/srun: every rank reads the data and runs a data-parallel
  // Trainer; any rank's error ends the job, naming the rank.
  std::optional<dist::MpiRuntime> mpi;
  if (dist::launched_by_mpi()) mpi.emplace();
  try {
    return align_run(cfg, ac, mpi ? &*mpi : nullptr);
  } catch (const std::exception& e) {
    if (!mpi) throw;
    mpi->abort(e.what());
  }
  return 0;
}

namespace {
int align_run(TrainConfig cfg, AlignConfig ac, dist::MpiRuntime* mpi) {
  std::optional<dist::Mesh> mesh;
  std::optional<dist::ProcessGroups> groups;
  if (mpi) {
    if (mpi->rank() != 0) set_log_level(LogLevel::Warn);  // rank 0 logs the run
    mesh.emplace(train_mesh(cfg, mpi->world_size(), mpi->rank()));
    if (cfg.threads == 0 && dist::local_world_size() > 1)  // share this host's cores
      cfg.threads =
          std::max(1, int(std::thread::hardware_concurrency()) / dist::local_world_size());
    groups.emplace(mpi->make_groups(*mesh, cfg.parallel.timeout_s));
  }
  if (cfg.data.tokenizer.empty()) cfg.data.tokenizer = "bytes";
  ac.data.max_length = cfg.seq_len;
  ac.data.kto_group = cfg.micro_batch / 2;
  if (ac.data.max_prompt_length >= cfg.seq_len)
    fail("align.max_prompt_length: {} leaves no room for a completion in train.seq_len = {}",
         ac.data.max_prompt_length, cfg.seq_len);

  // Everything is read and checked before the Trainer writes anything.
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(cfg.data.tokenizer);
  } catch (const Error& e) {
    throw e.with_context("data.tokenizer");
  }
  // Standard (string) records need no template.
  const std::shared_ptr<const ChatTemplate> tmpl =
      chat_template_if_any(cfg.data.chat_template, cfg.init_from, "data.chat_template");
  // The tokenizer's bos and eos, and the special tokens the model's
  // tokenizer_config.json names (for a Jinja template).
  const ChatSpecials specials = chat_specials(*tok, cfg.init_from);
  auto read = [&](const std::string& path, const char* key) {
    try {
      return std::make_shared<const PreferenceData>(
          read_preference_jsonl(path, *tok, *tmpl, specials, ac.data));
    } catch (const Error& e) {
      throw e.with_context(key);
    }
  };
  const int32_t pad = std::max(0, tok->eod_id());
  if (!ac.attributes.empty()) {  // SteerLM's attribute model: one record per row
    auto read_attributes = [&](const std::string& path, const char* key) {
      try {
        return std::make_shared<const AttributeData>(
            read_attribute_jsonl(path, PreferenceRenderer{*tok, *tmpl, specials}, ac.attributes,
                                 cfg.seq_len, ac.data.prompt_key, ac.response_key));
      } catch (const Error& e) {
        throw e.with_context(key);
      }
    };
    auto train = read_attributes(ac.data_path, "align.data_path");
    std::shared_ptr<const AttributeData> valid;
    if (!ac.valid_path.empty()) valid = read_attributes(ac.valid_path, "align.valid_path");
    for (const AttributeData* d : {train.get(), valid.get()})
      if (d && d->truncated > 0)
        NK_WARN("{} (longer than train.seq_len = {}: their beginning cut)", d->summary(),
                cfg.seq_len);
    cfg.extra_data_signature = ac.signature();
    Trainer trainer(cfg, mpi ? TrainParallel{&*mesh, &*groups} : TrainParallel{},
                    std::make_shared<AttributeObjective>(cfg, train, valid, pad, ac.shuffle));
    trainer.run();
    return 0;
  }
  auto train = read(ac.data_path, "align.data_path");
  std::shared_ptr<const PreferenceData> valid;
  if (!ac.valid_path.empty()) valid = read(ac.valid_path, "align.valid_path");
  for (const PreferenceData* d : {train.get(), valid.get()})
    if (d && d->truncated > 0)
      NK_WARN("{} (longer than train.seq_len = {}; align.max_prompt_length = {})", d->summary(),
              cfg.seq_len, ac.data.max_prompt_length);
  cfg.extra_data_signature = ac.signature();
  std::shared_ptr<TrainObjective> objective;
  if (ac.reward_model)
    objective = std::make_shared<RewardObjective>(cfg, ac, train, valid, pad);
  else
    objective = std::make_shared<PreferenceObjective>(cfg, ac, train, valid, pad);
  Trainer trainer(cfg, mpi ? TrainParallel{&*mesh, &*groups} : TrainParallel{}, objective);
  trainer.run();
  return 0;
}
}  // namespace

}  // namespace nk
