// PII redaction: e-mail addresses, phone numbers, US social security numbers,
// credit-card numbers, IP addresses and URLs with credentials, found by
// hand-written linear-time scanners and replaced with typed placeholders
// ("<EMAIL>", ...). The `pii` stage never removes a document.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nk::curate {

// In priority order: where two matches overlap, the one that starts first
// wins, and at the same start the earlier type in this list.
enum class PiiType : uint8_t { UrlWithCredentials, Email, CreditCard, Ssn, Phone, IpAddress };
constexpr size_t kPiiTypes = 6;
constexpr uint32_t kAllPii = (1u << kPiiTypes) - 1;

std::string_view pii_name(PiiType t);         // "email", as in `types:` and "redacted_email"
std::string_view pii_placeholder(PiiType t);  // "<EMAIL>"
// The type named `name` ("email", "phone", "ssn", "credit_card", "ip_address",
// "url_with_credentials"); false if there is none.
bool pii_type_of(std::string_view name, PiiType& out);

struct PiiMatch {
  size_t begin = 0, end = 0;  // byte offsets into the text
  PiiType type{};
};

// Every match of the types in `mask` (bit i = PiiType i), sorted and
// non-overlapping. O(text length).
std::vector<PiiMatch> find_pii(std::string_view text, uint32_t mask = kAllPii);

// `text` with each match replaced by its placeholder; adds the number of
// replacements of each type to `counts` (indexed by PiiType) when given.
std::string redact_pii(std::string_view text, uint32_t mask = kAllPii,
                       std::array<int64_t, kPiiTypes>* counts = nullptr);

}  // namespace nk::curate
