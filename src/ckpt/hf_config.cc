// config.json of Hugging Face models <-> ModelConfig, through the model's
// Architecture (model/arch.h), which owns its keys.
#include <fmt/ranges.h>

#include "ckpt/hf_files.h"
#include "ckpt/hf_io.h"
#include "core/json.h"
#include "core/limits.h"

namespace nk {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::optional<DType> parse_torch_dtype(const HfConfigReader& h) {
  std::string s = h.string("torch_dtype", "");
  if (s == "float32") return DType::F32;
  if (s == "bfloat16") return DType::BF16;
  if (s == "float16") return DType::F16;
  return std::nullopt;  // informative only
}

struct HfClass {
  std::string cls, model_type;
  const Architecture* arch;
  bool classifier = false;  // *ForSequenceClassification
};

std::vector<HfClass> hf_classes() {
  std::vector<HfClass> all;
  for (const Architecture* a : architectures()) {
    for (const auto& [cls, type] : a->hf_classes()) all.push_back({cls, type, a});
    if (std::string cls = a->hf_classifier_class(); !cls.empty())
      all.push_back({cls, a->hf_classes().front().second, a, true});
  }
  return all;
}

// A classifier's outputs: id2label's names in id order (num_labels of
// them), else `num_labels`, else HF's PretrainedConfig default of 2.
void read_labels(const HfConfigReader& h, ModelConfig& c) {
  if (h.has("id2label")) {
    const json& m = h.at("id2label");
    if (!m.is_object() || m.empty())
      h.fail_at("field 'id2label' must be an object of id -> name, got " + m.dump());
    std::vector<std::string> names(m.size());
    for (const auto& [id, name] : m.items()) {
      size_t at = 0;
      int64_t i = -1;
      try {
        i = std::stoll(id, &at);
      } catch (const std::exception&) {
      }
      if (at != id.size() || i < 0 || i >= int64_t(names.size()) || !name.is_string() ||
          !names[size_t(i)].empty())
        h.fail_at(fmt::format(
            "field 'id2label' must map the ids 0..{} to names once each, got \"{}\": {}",
            names.size() - 1, id, name.dump()));
      names[size_t(i)] = name.get<std::string>();
    }
    c.num_labels = int64_t(names.size());
    c.labels = std::move(names);
  } else {
    c.num_labels = h.has("num_labels") ? h.positive("num_labels", limits::kLabels, "labels") : 2;
  }
  if (h.has("num_labels") && h.integer("num_labels") != c.num_labels)
    h.fail_at(fmt::format("field 'num_labels' = {} but 'id2label' names {} labels",
                          h.integer("num_labels"), c.num_labels));
}

}  // namespace

ojson hf::config_object(const ModelConfig& c, DType dtype) {
  const Architecture& a = c.architecture();
  ojson j;
  j["architectures"] = {c.classifier() ? a.hf_classifier_class() : a.hf_classes().front().first};
  j["model_type"] = a.hf_classes().front().second;
  a.hf_write_config(c, j);
  if (c.classifier()) {
    ojson id2label = ojson::object(), label2id = ojson::object();
    for (int64_t i = 0; i < c.num_labels; ++i) {
      const std::string name = c.labels.empty() ? fmt::format("LABEL_{}", i) : c.labels[size_t(i)];
      id2label[std::to_string(i)] = name;
      label2id[name] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
  }
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["initializer_range"] = c.init_std;
  j["torch_dtype"] = hf::torch_dtype_name(dtype);
  j["use_cache"] = true;
  return j;
}

HfModelInfo hf_model_info_from_json(const std::string& text, const std::string& where) {
  json j = parse_json_object(text, where);
  HfConfigReader h(j, where);
  HfModelInfo info;
  const std::vector<HfClass> classes = hf_classes();
  std::vector<std::string> class_names, type_names;
  for (const HfClass& k : classes) {
    class_names.push_back(k.cls);
    type_names.push_back(k.model_type);
  }
  std::string model_type = h.string("model_type", "");
  if (h.has("architectures")) {
    const json& a = h.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      fail("{}: field 'architectures' must be a list of class names, got {}", where, a.dump());
    info.architecture = a[0].get<std::string>();
  } else if (!model_type.empty()) {
    for (const HfClass& k : classes)
      if (k.model_type == model_type) info.architecture = k.cls;
    if (info.architecture.empty())
      fail("{}: unsupported 'model_type' = \"{}\" (supported: {})", where, model_type,
           fmt::join(type_names, ", "));
  } else {
    fail("{}: missing field 'architectures'", where);
  }
  auto known = std::find_if(classes.begin(), classes.end(),
                            [&](const HfClass& k) { return k.cls == info.architecture; });
  if (known == classes.end())
    fail("{}: unsupported 'architectures' = [\"{}\"] (supported: {})", where, info.architecture,
         fmt::join(class_names, ", "));
  if (!model_type.empty() && model_type != known->model_type)
    fail("{}: 'model_type' = \"{}\" does not match 'architectures' = [\"{}\"] (expected \"{}\")",
         where, model_type, info.architecture, known->model_type);
  info.config.arch = known->arch->name();
  known->arch->hf_read_config(h, info.config);
  if (known->classifier) read_labels(h, info.config);
  info.torch_dtype = parse_torch_dtype(h);
  try {
    info.config.validate("");
  } catch (const Error& e) {
    throw e.with_context(where);
  }
  return info;
}

std::string hf_config_json(const ModelConfig& c, DType dtype) {
  return hf::config_object(c, dtype).dump(2) + "\n";
}

std::vector<std::string> nekton_param_names(const ModelConfig& c) {
  std::vector<std::string> names;
  for (const ExternalTensor& e : hf_model_tensors(c, ""))
    if (names.empty() || names.back() != e.param) names.push_back(e.param);
  return names;
}

}  // namespace nk
