// Hugging Face's tokenizer.json normalizers, applied to the text between
// added tokens before pre-tokenization (Qwen2/2.5/3: NFC; Llama 2 and Mistral
// as converted: Prepend "▁" then Replace " " -> "▁"; BERT: BertNormalizer).
// Steps, each as the Rust `tokenizers` crate (the one transformers runs) does it:
//   NFC, NFD, NFKC, NFKD   ICU's Normalizer2
//   Lowercase              each code point on its own through ICU's full
//                          lowercase mapping (İ -> i + U+0307); no context, so
//                          a final Σ becomes σ, not ς (Rust's char::to_lowercase;
//                          JavaScript's toLowerCase gives ς)
//   Replace                pattern {String} or {Regex} (PCRE2, as PreTokenizer),
//                          every non-overlapping match, left to right, by the
//                          literal content
//   Prepend                its text before a non-empty text (an empty one stays empty)
//   Strip                  Unicode White_Space off the left and/or right end
//   StripAccents           drops every mark (General_Category M)
//   BertNormalizer         clean_text (drops NUL, U+FFFD and Cc/Cf/Co/Cs other
//                          than \t \n \r; White_Space becomes ' '),
//                          handle_chinese_chars (' ' around CJK ideographs),
//                          strip_accents (NFD then drop Mn; null: as lowercase),
//                          lowercase
//   Sequence               its normalizers in order
// Anything else (Precompiled, ...) is an nk::Error naming the file, the JSON
// path of the step and its type.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace nk {

class TextNormalizer {
 public:
  // The normalizer `j` (tokenizer.json's "normalizer" at `where`, read from
  // `file`); null when `j` is null or an empty Sequence. nk::Error
  // "FILE: WHERE.normalizers[2].type 'X' is not supported ..." or naming the
  // bad option (a regex that does not compile or can match nothing, say).
  static std::unique_ptr<TextNormalizer> from_json(const nlohmann::json& j, const std::string& file,
                                                   const std::string& where = "normalizer");
  ~TextNormalizer();

  // `text` normalized (valid UTF-8; invalid input is first repaired with one
  // U+FFFD per maximal ill-formed subpart, as the tokenizers do). Thread-safe.
  std::string normalize(std::string_view text) const;

  struct Step;

 private:
  TextNormalizer();
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace nk
