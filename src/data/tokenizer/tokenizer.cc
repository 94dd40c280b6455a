#include "data/tokenizer/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/byte_tokenizer.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"

#ifndef NK_DEFAULT_ASSETS_DIR
#define NK_DEFAULT_ASSETS_DIR "assets"
#endif

namespace nk {

void split_on_specials(std::string_view text,
                       std::span<const std::pair<std::string, int32_t>> specials,
                       const std::function<void(std::string_view)>& on_text,
                       const std::function<void(int32_t)>& on_special) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& s : specials) {
      if (s.first.empty()) continue;
      const size_t at = text.find(s.first, pos);
      if (at < best ||
          (at == best && at != std::string_view::npos && s.first.size() > hit->first.size()))
        best = at, hit = &s;
    }
    if (!hit) break;
    if (best > pos) on_text(text.substr(pos, best - pos));
    on_special(hit->second);
    pos = best + hit->first.size();
  }
  if (pos < text.size()) on_text(text.substr(pos));
}

std::string assets_dir() {
  const char* env = std::getenv("NEKTON_ASSETS");
  return env && *env ? std::string(env) : std::string(NK_DEFAULT_ASSETS_DIR);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>();
  // A path to a folder's tokenizer.json: the folder, read as when it is named
  // (with the tokenizer_config.json, or the tokenizer.model, beside it).
  const std::filesystem::path file(spec);
  if (file.filename() == "tokenizer.json" && std::filesystem::is_regular_file(file))
    return load_tokenizer(file.has_parent_path() ? file.parent_path().string() : ".");
  if (auto bpe = open_bpe_tokenizer(spec)) return bpe;
  if (spec.ends_with(".model")) return SentencePieceTokenizer::open(spec);
  // A Hugging Face tokenizer folder of a SentencePiece model (Llama 1/2, Mistral).
  std::filesystem::path spm = std::filesystem::path(spec) / "tokenizer.model";
  if (std::filesystem::is_directory(spec) && std::filesystem::exists(spm))
    return SentencePieceTokenizer::open(spm.string());
  fail("tokenizer '{}': unknown name and not a tokenizer file or folder", spec);
}

namespace {

// A model's own files, which a tokenizer folder that is a whole Hugging Face
// model folder also holds: the weights (gigabytes), their index and the
// model's config.json. None is read to load a tokenizer.
bool model_file(const std::filesystem::path& p) {
  static const char* kWeights[] = {".safetensors", ".bin", ".pt",   ".pth",     ".gguf",
                                   ".ckpt",        ".h5",  ".onnx", ".msgpack", ".npz"};
  const std::string name = p.filename().string(), ext = p.extension().string();
  for (const char* w : kWeights)
    if (ext == w) return true;
  return name == "config.json" || name.ends_with(".index.json");
}

}  // namespace

void store_tokenizer(const std::string& spec, const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::string recorded = spec;
  std::error_code ec;
  if (fs::exists(spec)) {
    fs::path dst = fs::path(model_dir) / "tokenizer";
    fs::remove_all(dst, ec);
    fs::create_directories(dst);
    if (fs::is_directory(spec)) {
      for (auto& e : fs::directory_iterator(spec))
        if (e.is_regular_file() && !model_file(e.path()))
          fs::copy_file(e.path(), dst / e.path().filename());
      recorded = "./tokenizer";
    } else {
      fs::copy_file(spec, dst / fs::path(spec).filename());
      recorded = "./tokenizer/" + fs::path(spec).filename().string();
      // A tokenizer JSON is read with files beside it: the config (eos and
      // bos), the vocabulary of a Nekton one, the model it describes.
      if (spec.ends_with(".json"))
        for (const char* name : {"tokenizer_config.json", "tokenizer.model", "vocab.tiktoken",
                                 "encoder.json", "vocab.bpe"}) {
          const fs::path beside = fs::path(spec).parent_path() / name;
          if (fs::is_regular_file(beside) && !fs::exists(dst / name))
            fs::copy_file(beside, dst / name);
        }
    }
  }
  write_file_atomic((fs::path(model_dir) / "tokenizer.txt").string(), recorded + "\n");
}

std::string stored_tokenizer(const std::string& model_dir) {
  std::ifstream f(std::filesystem::path(model_dir) / "tokenizer.txt");
  if (!f) return "";
  std::string spec;
  std::getline(f, spec);
  if (spec.rfind("./", 0) == 0) spec = (std::filesystem::path(model_dir) / spec.substr(2)).string();
  return spec;
}

}  // namespace nk
