// Native checkpoints: layout, manifest checksums and slices, pruning, the
// `latest` pointer, fallback past a corrupt newest checkpoint, and clear errors
// (naming the file or the tensor) for bad input, with nothing loaded half-way.
#include "ckpt/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "model/transformer.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

ModelConfig tiny_model(int64_t d_model = 32) {
  ModelConfig c = model_preset("gpt-tiny");
  c.n_layer = 1;
  c.d_model = d_model;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_ff = 2 * d_model;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  return c;
}

// A checkpoint of `model` at `step` with moments m = params * 0.5, v = params^2.
struct Fixture {
  Transformer model;
  Tensor m, v;
  explicit Fixture(const ModelConfig& cfg, uint64_t seed = 7)
      : model(cfg, DType::F32, seed),
        m(Tensor::zeros({model.layout().total()}, DType::F32)),
        v(Tensor::zeros({model.layout().total()}, DType::F32)) {
    const float* p = model.params().data<float>();
    for (int64_t i = 0; i < model.layout().total(); ++i) {
      m.data<float>()[i] = 0.5f * p[i];
      v.data<float>()[i] = p[i] * p[i];
    }
  }
  std::string save(const std::string& root, int64_t step, int64_t keep = 3) {
    CheckpointContents c;
    c.step = step;
    c.model = flat_tensors(model.layout(), model.params(), "");
    c.optimizer = flat_tensors(model.layout(), m, "exp_avg.");
    for (auto& t : flat_tensors(model.layout(), v, "exp_avg_sq.")) c.optimizer.push_back(t);
    for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."})
      describe_flat_tensors(c, model.layout(), prefix);
    c.optimizer_metadata["optimizer"] = "adamw";
    c.text_files["trainer_state.json"] = "{\"step\": " + std::to_string(step) + "}\n";
    c.text_files["config.yaml"] = "train:\n  steps: 10\n";
    return save_checkpoint(root, c, keep);
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void flip_byte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(offset));
  char c;
  f.get(c);
  f.seekp(std::streamoff(offset));
  f.put(char(c ^ 0x5a));
}

TEST(Checkpoint, LayoutManifestAndRoundTrip) {
  TempDir dir("nk_ckpt");
  Fixture fx(tiny_model());
  std::string root = dir / "checkpoints";
  std::string saved = fx.save(root, 200);
  EXPECT_EQ(fs::path(saved).filename(), "step_00000200");
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json",
                        "config.yaml", "manifest.json"})
    EXPECT_TRUE(fs::exists(fs::path(saved) / f)) << f;
  EXPECT_EQ(read_latest_pointer(root), "step_00000200");
  EXPECT_EQ(test::read_file(root + "/latest"), "step_00000200\n");

  // The manifest: a checksum per file, the slice per tensor (whole tensor, rank 0 of 1).
  auto m = nlohmann::json::parse(test::read_file(saved + "/manifest.json"));
  EXPECT_EQ(m["step"], 200);
  EXPECT_EQ(m["world_size"], 1);
  EXPECT_EQ(m["files"].size(), 4u);
  EXPECT_EQ(m["files"]["model.safetensors"]["xxh3_64"],
            file_checksum(saved + "/model.safetensors"));
  const ParamInfo& p0 = fx.model.layout().params()[0];
  auto slice = m["tensors"]["optimizer.safetensors"]["exp_avg." + p0.name];
  EXPECT_EQ(slice["global_shape"].get<Shape>(), p0.shape);
  EXPECT_EQ(slice["shape"].get<Shape>(), p0.shape);
  EXPECT_EQ(slice["offsets"].get<Shape>(), Shape(p0.shape.size(), 0));
  // Parameters also record how tensor parallelism splits them and their fused
  // parts, so a later load can reshard: the fused QKV is [q | k | v], split on
  // rows part by part; the output projection on columns; norms replicated.
  const ModelConfig c = tiny_model();
  auto qkv = m["tensors"]["model.safetensors"]["h.0.attn.qkv.weight"];
  EXPECT_EQ(qkv["split"], "rows");
  ASSERT_EQ(qkv["parts"].size(), 3u);
  EXPECT_EQ(qkv["parts"][1]["name"], "k");
  EXPECT_EQ(qkv["parts"][1]["rows"], c.n_kv_head * c.head_dim());
  EXPECT_EQ(qkv["ranges"].size(), 1u);  // rank 0 of 1 holds all of it
  EXPECT_EQ(m["tensors"]["optimizer.safetensors"]["exp_avg.h.0.attn.proj.weight"]["split"], "cols");
  EXPECT_EQ(m["tensors"]["model.safetensors"]["h.0.ln1.weight"]["split"], "replicated");

  CheckpointReader r = CheckpointReader::open(saved);
  EXPECT_EQ(r.step(), 200);
  EXPECT_EQ(r.text("config.yaml"), "train:\n  steps: 10\n");
  Fixture other(tiny_model(), 99);
  read_flat_tensors(r.model(), other.model.layout(), "", other.model.params());
  read_flat_tensors(r.optimizer(), other.model.layout(), "exp_avg.", other.m);
  read_flat_tensors(r.optimizer(), other.model.layout(), "exp_avg_sq.", other.v);
  EXPECT_TRUE(same_bytes(other.model.params(), fx.model.params()));
  EXPECT_TRUE(same_bytes(other.m, fx.m));
  EXPECT_TRUE(same_bytes(other.v, fx.v));
  EXPECT_EQ(find_latest_checkpoint(root), saved);
  EXPECT_EQ(find_latest_checkpoint(dir / "none"), "");
}

TEST(Checkpoint, KeepsTheNewestAndReplacesTheSameStep) {
  TempDir dir("nk_ckpt");
  Fixture fx(tiny_model());
  std::string root = dir / "checkpoints";
  for (int64_t s = 1; s <= 5; ++s) fx.save(root, s * 10, 3);
  std::vector<std::string> names;
  for (const auto& d : list_checkpoints(root)) names.push_back(fs::path(d).filename());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000050", "step_00000040", "step_00000030"}));
  EXPECT_EQ(read_latest_pointer(root), "step_00000050");
  // Saving a step that exists swaps the folder whole; nothing else is left over.
  fx.save(root, 50, 3);
  EXPECT_NO_THROW(CheckpointReader::open(root + "/step_00000050"));
  std::vector<std::string> all;
  for (const auto& e : fs::directory_iterator(root)) all.push_back(e.path().filename());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(
      all, (std::vector<std::string>{"latest", "step_00000030", "step_00000040", "step_00000050"}));
}

TEST(Checkpoint, LeftoversOfAKilledSaveAreIgnoredAndCleaned) {
  TempDir dir("nk_ckpt");
  Fixture fx(tiny_model());
  std::string root = dir / "checkpoints";
  std::string good = fx.save(root, 10);
  // A killed save: a temporary folder, and a step folder without its manifest
  // (cannot happen with rename, but a hand-copied folder might look like it).
  fs::copy(good, root + "/.tmp.step_00000020.12345");
  fs::copy(good, root + "/step_00000030");
  fs::remove(root + "/step_00000030/manifest.json");
  test::write_file(root + "/latest.tmp.12345", "step_000");  // killed before its rename
  testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(root), good);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "skipping checkpoint " + root + "/step_00000030")) << err;
  EXPECT_TRUE(contains(err, "manifest.json is missing (an unfinished save?)")) << err;
  EXPECT_TRUE(contains(err, "falling back to the older checkpoint")) << err;
  fx.save(root, 40);
  EXPECT_FALSE(fs::exists(root + "/.tmp.step_00000020.12345"));
  EXPECT_FALSE(fs::exists(root + "/latest.tmp.12345"));
}

TEST(Checkpoint, CorruptNewestFallsBackWithAWarning) {
  TempDir dir("nk_ckpt");
  Fixture fx(tiny_model());
  std::string root = dir / "checkpoints";
  fx.save(root, 1);
  std::string older = fx.save(root, 2);
  std::string newest = fx.save(root, 3);
  flip_byte(newest + "/optimizer.safetensors", 200);
  testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(root), older);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, "[warn] skipping checkpoint " + newest)) << err;
  EXPECT_TRUE(contains(err, newest + "/optimizer.safetensors fails its checksum")) << err;
  // All of them corrupt: an error, not a silent fresh start.
  flip_byte(older + "/model.safetensors", 100);
  flip_byte(root + "/step_00000001/config.yaml", 0);
  testing::internal::CaptureStderr();
  std::string msg = error_of([&] { find_latest_checkpoint(root); });
  testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(msg, "no usable checkpoint in '" + root + "' (3 found")) << msg;
}

TEST(Checkpoint, BadInputIsNamed) {
  TempDir dir("nk_ckpt");
  Fixture fx(tiny_model());
  std::string root = dir / "checkpoints";
  std::string ck = fx.save(root, 5);
  auto fresh = [&](const std::string& name) {
    fs::path d = dir.path() / name / "step_00000005";
    fs::create_directories(d.parent_path());
    fs::copy(ck, d);
    return d.string();
  };

  std::string d = fresh("missing");
  fs::remove(d + "/optimizer.safetensors");
  std::string msg = error_of([&] { CheckpointReader::open(d); });
  EXPECT_TRUE(contains(msg, "file " + d + "/optimizer.safetensors is missing")) << msg;

  d = fresh("truncated");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 100);
  msg = error_of([&] { CheckpointReader::open(d); });
  EXPECT_TRUE(contains(msg, d + "/model.safetensors is")) << msg;
  EXPECT_TRUE(contains(msg, "the manifest records")) << msg;
  EXPECT_TRUE(contains(msg, "(truncated?)")) << msg;

  d = fresh("flipped");
  flip_byte(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 3);
  msg = error_of([&] { CheckpointReader::open(d); });
  EXPECT_TRUE(contains(msg, d + "/model.safetensors fails its checksum")) << msg;

  d = fresh("manifest");
  test::write_file(d + "/manifest.json", "{\"format\": \"nekton-checkpoint\", \"vers");
  msg = error_of([&] { CheckpointReader::open(d); });
  EXPECT_TRUE(contains(msg, d + "/manifest.json is not valid JSON")) << msg;

  // A truncated tensor file whose manifest was rewritten to match still fails,
  // in the safetensors reader, naming the file.
  d = fresh("rewritten");
  std::string st = d + "/model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 64);
  auto m = nlohmann::json::parse(test::read_file(d + "/manifest.json"));
  m["files"]["model.safetensors"] = {{"bytes", fs::file_size(st)}, {"xxh3_64", file_checksum(st)}};
  test::write_file(d + "/manifest.json", m.dump());
  CheckpointReader r = CheckpointReader::open(d);
  msg = error_of([&] { r.model(); });
  EXPECT_TRUE(contains(msg, st)) << msg;
  EXPECT_TRUE(contains(msg, "beyond the data buffer")) << msg;
}

TEST(Checkpoint, AnotherModelShapeLoadsNothing) {
  TempDir dir("nk_ckpt");
  Fixture small(tiny_model(32));
  std::string ck = small.save(dir / "checkpoints", 1);
  CheckpointReader r = CheckpointReader::open(ck);

  Fixture big(tiny_model(64));
  Tensor before = Tensor::empty(big.model.params().shape(), DType::F32);
  std::memcpy(before.raw(), big.model.params().raw(), before.nbytes());
  std::string msg = error_of([&] { read_flat_tensors(r.model(), big.model.layout(), "", big.m); });
  EXPECT_TRUE(contains(msg, ck + "/model.safetensors: tensor 'wte' has shape [64, 32] in "
                                 "the checkpoint, but this model's is [64, 64]"))
      << msg;
  EXPECT_TRUE(same_bytes(before, big.model.params()));

  // A deeper model: the checkpoint lacks its second layer's tensors.
  ModelConfig deep_cfg = tiny_model(32);
  deep_cfg.n_layer = 2;
  Fixture deep(deep_cfg);
  msg = error_of([&] { read_flat_tensors(r.model(), deep.model.layout(), "", deep.m); });
  EXPECT_TRUE(contains(msg, "tensor 'h.1.")) << msg;
  EXPECT_TRUE(contains(msg, "is missing (the checkpoint is of another model?)")) << msg;
  // A shallower one: the checkpoint has tensors the model lacks.
  Fixture deep_ck(deep_cfg);
  std::string ck2 = deep_ck.save(dir / "deep", 1);
  Fixture shallow(tiny_model(32));
  msg = error_of([&] {
    read_flat_tensors(CheckpointReader::open(ck2).model(), shallow.model.layout(), "", shallow.m);
  });
  EXPECT_TRUE(contains(msg, "is not part of this model")) << msg;
}

}  // namespace
}  // namespace nk
