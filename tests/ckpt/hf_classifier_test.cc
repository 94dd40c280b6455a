// Hugging Face's sequence classifiers (*ForSequenceClassification: a reward
// or attribute model) map to a Nekton model with a score head: the class
// names per architecture, id2label's names and count (HF's default of two
// labels without one), the tensor names (score.weight in place of
// lm_head.weight), export writes the class and id2label back, and a
// malformed id2label or num_labels is an error naming the key.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "model/arch.h"
#include "test_util.h"

namespace nk {
namespace {

using nlohmann::json;

json qwen2_classifier() {
  return json::parse(R"({
  "architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2",
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": true, "hidden_act": "silu",
  "id2label": {"0": "helpfulness", "2": "verbosity", "1": "correctness"},
  "label2id": {"helpfulness": 0, "correctness": 1, "verbosity": 2}
})");
}

std::string error_of(const json& j) {
  try {
    hf_model_info_from_json(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(HfClassifier, Qwen2ClassifierReadsLabelsAndRoundTrips) {
  const HfModelInfo i = hf_model_info_from_json(qwen2_classifier().dump(), "config.json");
  const ModelConfig& c = i.config;
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.labels, (std::vector<std::string>{"helpfulness", "correctness", "verbosity"}));
  // The tensors: the body's, then score.weight; no LM head even though tied.
  const std::vector<ExternalTensor> t = hf_model_tensors(c, "");
  EXPECT_EQ(t.back().name, "score.weight");
  EXPECT_EQ(t.back().param, "score.weight");
  for (const ExternalTensor& e : t) EXPECT_NE(e.name, "lm_head.weight");
  const json back = json::parse(hf_config_json(c, DType::BF16));
  EXPECT_EQ(back["architectures"][0], "Qwen2ForSequenceClassification");
  EXPECT_EQ(back["id2label"]["2"], "verbosity");
  EXPECT_EQ(back["label2id"]["correctness"], 1);
  EXPECT_EQ(model_config_to_json(hf_model_info_from_json(back.dump(), "exported").config),
            model_config_to_json(c));
  // Nekton's own config.json keeps the head.
  EXPECT_EQ(model_config_to_json(model_config_from_json(model_config_to_json(c), "nk")),
            model_config_to_json(c));
}

TEST(HfClassifier, EachArchitectureHasItsClassifierClass) {
  for (const auto& [arch, cls] : std::vector<std::pair<std::string, std::string>>{
           {"llama", "LlamaForSequenceClassification"},
           {"mistral", "MistralForSequenceClassification"},
           {"qwen2", "Qwen2ForSequenceClassification"},
           {"gpt2", "GPT2ForSequenceClassification"},
           {"mixtral", "MixtralForSequenceClassification"},
           {"qwen2_moe", "Qwen2MoeForSequenceClassification"},
           {"qwen3_moe", "Qwen3MoeForSequenceClassification"},
           {"deepseek_v3", "DeepseekV3ForSequenceClassification"},
           {"glm4_moe", "Glm4MoeForSequenceClassification"},
           {"dots1", ""}})
    EXPECT_EQ(find_architecture(arch).hf_classifier_class(), cls);
  // GPT-2's classifier: no id2label is HF's two labels; score.weight stays
  // outside the "transformer." prefix.
  json g = json::parse(R"({"architectures": ["GPT2ForSequenceClassification"],
    "model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 32,
    "vocab_size": 97})");
  const ModelConfig c = hf_model_info_from_json(g.dump(), "config.json").config;
  EXPECT_EQ(c.num_labels, 2);
  EXPECT_TRUE(c.labels.empty());
  const std::vector<ExternalTensor> t = hf_model_tensors(c, "transformer.");
  EXPECT_EQ(t.front().name.rfind("transformer.", 0), 0u);
  EXPECT_EQ(t.back().name, "score.weight");
}

TEST(HfClassifier, MalformedLabelsAreNamed) {
  json j = qwen2_classifier();
  j["id2label"] = {{"0", "a"}, {"0x", "b"}};
  EXPECT_TRUE(test::contains(error_of(j), "field 'id2label' must map the ids 0..1")) << error_of(j);
  j["id2label"] = json::object();
  EXPECT_TRUE(test::contains(error_of(j), "field 'id2label' must be an object")) << error_of(j);
  j = qwen2_classifier();
  j["num_labels"] = 2;
  EXPECT_TRUE(test::contains(error_of(j), "field 'num_labels' = 2 but 'id2label' names 3 labels"))
      << error_of(j);
  j = qwen2_classifier();
  j.erase("id2label");
  j["num_labels"] = 0;
  EXPECT_TRUE(test::contains(error_of(j), "field 'num_labels' must be positive")) << error_of(j);
}

}  // namespace
}  // namespace nk
