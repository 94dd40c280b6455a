#include <fmt/format.h>

#include "apps/commands.h"
#include "infer/sampler.h"
#include "train/trainer.h"

namespace nk {

// The quickstart recipe: a 4-layer GPT over bytes of the GCIDE dictionary
// (Debian's dict-gcide, installed by the set-up), about two minutes on two
// cores. The same settings are configs/quickstart.yaml for `nekton train`.
static const std::vector<std::string> kQuickstart = {
    "model.preset=gpt-tiny",
    "data.path=/usr/share/dictd/gcide.dict.dz",
    "data.max_bytes=20000000",
    "data.invalid_utf8=replace",
    "data.val_fraction=0.02",
    "train.micro_batch=16",
    "train.seq_len=128",
    "train.global_batch=16",
    "train.steps=1500",
    "train.lr=2e-3",
    "train.min_lr=2e-4",
    "train.warmup_steps=30",
    "train.val_every=250",
    "train.log_every=50",
    "train.out_dir=runs/quickstart",
};

int cmd_quickstart(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print("usage: nekton quickstart [key=value ...]\n\nDefaults:\n");
    for (auto& s : kQuickstart) fmt::print("  {}\n", s);
    fmt::print("\nEvery key:\n{}", schema.help());
    return 0;
  }
  std::vector<std::string> overrides = kQuickstart;
  overrides.insert(overrides.end(), a.overrides.begin(), a.overrides.end());
  TrainConfig cfg = train_config_from(Config::load(schema, a.config_path, overrides));
  Trainer trainer(cfg);
  trainer.run();
  const auto& h = trainer.history();
  fmt::print("\nloss {:.3f} -> {:.3f} over {} steps; model saved in {}/model\n", h.front().loss,
             h.back().loss, h.size(), cfg.out_dir);
  fmt::print("try: nekton generate generate.model={}/model generate.prompt=\"Water\"\n\n",
             cfg.out_dir);
  fmt::print("sample:\n");
  SamplingConfig sc;
  sc.temperature = 0.8;
  sc.top_k = 40;
  sc.seed = cfg.seed;
  auto tok = load_tokenizer(cfg.data_tokenizer.empty() ? "bytes" : cfg.data_tokenizer);
  print_sample(trainer.model(), *tok, "Water \\", 300, sc);
  return 0;
}

}  // namespace nk
