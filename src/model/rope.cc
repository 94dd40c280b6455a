#include "model/rope.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "ops/ops.h"

namespace nk {

using nlohmann::json;

namespace {

constexpr RopeScalingType kTypes[] = {RopeScalingType::None, RopeScalingType::Linear,
                                      RopeScalingType::Llama3, RopeScalingType::Yarn,
                                      RopeScalingType::LongRope};

// YaRN's magnitude correction for a context stretched `scale` times.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The (fractional) pair index that turns `rotations` times over `context`
// positions: theta^(-2i/D) context = 2 pi rotations, solved for i.
double yarn_pair(double rotations, int64_t D, double theta, double context) {
  return double(D) * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}

}  // namespace

const char* rope_scaling_type_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::None:
      return "none";
    case RopeScalingType::Linear:
      return "linear";
    case RopeScalingType::Llama3:
      return "llama3";
    case RopeScalingType::Yarn:
      return "yarn";
    case RopeScalingType::LongRope:
      return "longrope";
  }
  return "none";
}

RopeScalingType parse_rope_scaling_type(const std::string& s, const std::string& what) {
  for (RopeScalingType t : kTypes)
    if (s == rope_scaling_type_name(t)) return t;
  fail("{}: unknown RoPE scaling type '{}' (expected none, linear, llama3, yarn or longrope)", what,
       s);
}

void RopeScaling::validate(const std::string& p) const {
  const RopeScaling d;  // defaults: what a type leaves alone
  const char* name = rope_scaling_type_name(type);
  auto finite_positive = [&](const char* key, double v) {
    if (!(v > 0) || !std::isfinite(v)) fail("{}{}: must be a positive number, got {}", p, key, v);
  };
  auto unused = [&](const char* key, bool is_default, const char* users) {
    if (!is_default)
      fail("{}{}: only {} scaling uses it, but {}type is {}", p, key, users, p, name);
  };
  const bool llama3 = type == RopeScalingType::Llama3, yarn = type == RopeScalingType::Yarn,
             longrope = type == RopeScalingType::LongRope;
  if (enabled()) finite_positive("factor", factor);
  if (!enabled()) unused("factor", factor == d.factor, "linear, llama3, yarn or longrope");
  if (longrope) {
    if (original_max_seq_len <= 0)
      fail("{}original_max_seq_len: longrope scaling needs the original context length, got {}", p,
           original_max_seq_len);
    check_limit("", p + "original_max_seq_len", original_max_seq_len, limits::kSeqLen, "positions");
    if (short_factor.empty() || short_factor.size() != long_factor.size())
      fail(
          "{}short_factor, {}long_factor: longrope needs two lists of one factor per pair, got {} "
          "and {} entries",
          p, p, short_factor.size(), long_factor.size());
    for (const auto* list : {&short_factor, &long_factor})
      for (double v : *list)
        if (!(v > 0) || !std::isfinite(v))
          fail("{}{}: every factor must be a positive number, got {}", p,
               list == &short_factor ? "short_factor" : "long_factor", v);
    if (!(attention_factor >= 0) || !std::isfinite(attention_factor))
      fail("{}attention_factor: must be a positive number (or 0: unset), got {}", p,
           attention_factor);
  } else {
    unused("short_factor", short_factor.empty(), "longrope");
    unused("long_factor", long_factor.empty(), "longrope");
  }
  if (llama3) {
    finite_positive("low_freq_factor", low_freq_factor);
    finite_positive("high_freq_factor", high_freq_factor);
    if (!(high_freq_factor > low_freq_factor))
      fail("{}high_freq_factor: must exceed {}low_freq_factor = {}, got {}", p, p, low_freq_factor,
           high_freq_factor);
    if (original_max_seq_len <= 0)
      fail("{}original_max_seq_len: llama3 scaling needs the original context length, got {}", p,
           original_max_seq_len);
    check_limit("", p + "original_max_seq_len", original_max_seq_len, limits::kSeqLen, "positions");
  } else {
    unused("low_freq_factor", low_freq_factor == d.low_freq_factor, "llama3");
    unused("high_freq_factor", high_freq_factor == d.high_freq_factor, "llama3");
  }
  if (yarn) {
    finite_positive("beta_fast", beta_fast);
    finite_positive("beta_slow", beta_slow);
    if (original_max_seq_len < 0)
      fail("{}original_max_seq_len: must be positive (or 0: max_seq_len), got {}", p,
           original_max_seq_len);
    check_limit("", p + "original_max_seq_len", original_max_seq_len, limits::kSeqLen, "positions");
    for (auto [key, v] : {std::pair{"attention_factor", attention_factor},
                          std::pair{"mscale", mscale}, std::pair{"mscale_all_dim", mscale_all_dim}})
      if (!(v >= 0) || !std::isfinite(v))
        fail("{}{}: must be a positive number (or 0: unset), got {}", p, key, v);
  } else {
    if (!llama3 && !longrope)
      unused("original_max_seq_len", original_max_seq_len == d.original_max_seq_len,
             "llama3, yarn or longrope");
    unused("beta_fast", beta_fast == d.beta_fast, "yarn");
    unused("beta_slow", beta_slow == d.beta_slow, "yarn");
    if (!longrope)
      unused("attention_factor", attention_factor == d.attention_factor, "yarn or longrope");
    unused("mscale", mscale == d.mscale, "yarn");
    unused("mscale_all_dim", mscale_all_dim == d.mscale_all_dim, "yarn");
    unused("truncate", truncate == d.truncate, "yarn");
  }
}

std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& s,
                                  int64_t max_seq_len) {
  NK_CHECK(D > 0 && D % 2 == 0 && theta > 0, "rope_inv_freq: head_dim {} (must be even), theta {}",
           D, theta);
  const int64_t half = D / 2;
  std::vector<double> f(static_cast<size_t>(half));
  // The expression ops::rope_table uses, so that unscaled angles match it bit for bit.
  for (int64_t i = 0; i < half; ++i) f[size_t(i)] = std::pow(theta, -2.0 * double(i) / double(D));
  const double k = s.factor;
  switch (s.type) {
    case RopeScalingType::None:
      break;
    case RopeScalingType::Linear:
      for (double& x : f) x /= k;
      break;
    case RopeScalingType::Llama3: {
      const double L = double(s.original_max_seq_len), lo = s.low_freq_factor,
                   hi = s.high_freq_factor;
      for (double& x : f) {
        const double wavelen = 2 * std::numbers::pi / x;
        if (wavelen > L / lo) {
          x /= k;  // low frequencies: interpolated
        } else if (!(wavelen < L / hi)) {
          const double smooth = (L / wavelen - lo) / (hi - lo);
          x = (1 - smooth) * x / k + smooth * x;
        }  // high frequencies: kept
      }
      break;
    }
    case RopeScalingType::Yarn: {
      const double context =
          double(s.original_max_seq_len > 0 ? s.original_max_seq_len : max_seq_len);
      double lo = yarn_pair(s.beta_fast, D, theta, context);
      double hi = yarn_pair(s.beta_slow, D, theta, context);
      if (s.truncate) {
        lo = std::floor(lo);
        hi = std::ceil(hi);
      }
      lo = std::max(lo, 0.0);
      hi = std::min(hi, double(D - 1));
      if (lo == hi) hi += 0.001;  // transformers' guard against a zero-width ramp
      for (int64_t i = 0; i < half; ++i) {
        // Pairs below lo keep their frequency (extrapolation), pairs above hi
        // are divided by the factor (interpolation), linear in between.
        const double ramp = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
        const double keep = 1 - ramp;
        double& x = f[size_t(i)];
        x = x / k * (1 - keep) + x * keep;
      }
      break;
    }
    case RopeScalingType::LongRope: {
      const std::vector<double>& e =
          max_seq_len > s.original_max_seq_len ? s.long_factor : s.short_factor;
      if (int64_t(e.size()) != half)
        fail("rope_scaling: longrope's {} has {} factors; a head of {} has {} pairs",
             max_seq_len > s.original_max_seq_len ? "long_factor" : "short_factor", e.size(), D,
             half);
      for (int64_t i = 0; i < half; ++i) f[size_t(i)] /= e[size_t(i)];
      break;
    }
  }
  return f;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.type == RopeScalingType::LongRope) {
    if (s.attention_factor > 0) return s.attention_factor;
    if (s.factor <= 1) return 1.0;
    return std::sqrt(1 + std::log(s.factor) / std::log(double(s.original_max_seq_len)));
  }
  if (s.type != RopeScalingType::Yarn) return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale > 0 && s.mscale_all_dim > 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

Tensor rope_table(int64_t max_t, int64_t head_dim, double theta, const RopeScaling& s,
                  int64_t max_seq_len) {
  NK_CHECK(max_t >= 0, "rope_table: max_t {}", max_t);
  const std::vector<double> f = rope_inv_freq(head_dim, theta, s, max_seq_len);
  const double m = rope_attention_factor(s);
  const int64_t half = head_dim / 2;
  std::vector<float> host(size_t(max_t * head_dim));
  parallel_for(max_t, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t pos = t0; pos < t1; ++pos) {
      float* row = host.data() + pos * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // Angles in double: positions reach 1e5+, where fp32 angles lose digits.
        // m is 1 unless yarn scales: x * 1.0 is exact.
        const double a = double(pos) * f[size_t(i)];
        row[i] = float(std::cos(a) * m);
        row[half + i] = float(std::sin(a) * m);
      }
    }
  });
  Tensor t = Tensor::empty({max_t, head_dim}, DType::F32);
  ops::copy_from_host(t, host.data());
  return t;
}

// ---- Nekton's spelling ----

namespace {

// The scaling's fields in either spelling, in the order they are written:
// only the enabled type's, optional ones only when set. J: json or
// ordered_json; the two spellings differ in the names of the type and of the
// original context.
template <typename J>
void write_scaling(const RopeScaling& s, J& j, const char* type_key, const char* context_key) {
  j[type_key] = rope_scaling_type_name(s.type);
  if (!s.enabled()) return;
  j["factor"] = s.factor;
  if (s.type == RopeScalingType::Llama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
    j[context_key] = s.original_max_seq_len;
  }
  if (s.type == RopeScalingType::Yarn) {
    if (s.original_max_seq_len > 0) j[context_key] = s.original_max_seq_len;
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
    if (s.mscale > 0) j["mscale"] = s.mscale;
    if (s.mscale_all_dim > 0) j["mscale_all_dim"] = s.mscale_all_dim;
    if (!s.truncate) j["truncate"] = false;
  }
  if (s.type == RopeScalingType::LongRope) {
    j[context_key] = s.original_max_seq_len;
    if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
    j["short_factor"] = s.short_factor;
    j["long_factor"] = s.long_factor;
  }
}

}  // namespace

json rope_scaling_to_json(const RopeScaling& s) {
  json j;
  write_scaling(s, j, "type", "original_max_seq_len");
  return j;
}

namespace {

// longrope's short_factor / long_factor: a list of numbers.
std::vector<double> factor_list(const json& v, const std::string& where, const std::string& key) {
  if (!v.is_array())
    fail("{}: field 'rope_scaling.{}' must be a list of numbers, got {}", where, key, v.dump());
  std::vector<double> out;
  for (const json& x : v) {
    if (!x.is_number())
      fail("{}: field 'rope_scaling.{}' must be a list of numbers, got entry {}", where, key,
           x.dump());
    out.push_back(x.get<double>());
  }
  return out;
}

}  // namespace

RopeScaling rope_scaling_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: field 'rope_scaling' must be an object, got {}", where, j.dump());
  RopeScaling s;
  auto number = [&](const std::string& key, const json& v, auto& field) {
    if constexpr (std::is_integral_v<std::decay_t<decltype(field)>>) {
      field = json_int(v, where, "rope_scaling." + key);
    } else {
      if (!v.is_number())
        fail("{}: field 'rope_scaling.{}' has the wrong type ({})", where, key, v.dump());
      field = v.get<double>();
    }
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "type") {
      if (!v.is_string())
        fail("{}: field 'rope_scaling.type' has the wrong type ({})", where, v.dump());
      s.type = parse_rope_scaling_type(v.get<std::string>(), where + ": rope_scaling.type");
    } else if (key == "factor") {
      number(key, v, s.factor);
    } else if (key == "low_freq_factor") {
      number(key, v, s.low_freq_factor);
    } else if (key == "high_freq_factor") {
      number(key, v, s.high_freq_factor);
    } else if (key == "original_max_seq_len") {
      number(key, v, s.original_max_seq_len);
    } else if (key == "beta_fast") {
      number(key, v, s.beta_fast);
    } else if (key == "beta_slow") {
      number(key, v, s.beta_slow);
    } else if (key == "attention_factor") {
      number(key, v, s.attention_factor);
    } else if (key == "mscale") {
      number(key, v, s.mscale);
    } else if (key == "mscale_all_dim") {
      number(key, v, s.mscale_all_dim);
    } else if (key == "truncate") {
      if (!v.is_boolean())
        fail("{}: field 'rope_scaling.truncate' has the wrong type ({})", where, v.dump());
      s.truncate = v.get<bool>();
    } else if (key == "short_factor" || key == "long_factor") {
      s.*(key == "short_factor" ? &RopeScaling::short_factor : &RopeScaling::long_factor) =
          factor_list(v, where, key);
    } else {
      fail("{}: unknown field 'rope_scaling.{}'", where, key);
    }
  }
  if (!j.contains("type")) fail("{}: missing field 'rope_scaling.type'", where);
  if (s.enabled() && !j.contains("factor")) fail("{}: missing field 'rope_scaling.factor'", where);
  return s;
}

// ---- Hugging Face's spelling ----

namespace {

// A number of the rope_scaling dict, or `def` when absent or null.
double hf_number(const json& d, const char* key, double def, const std::string& where) {
  if (!d.contains(key) || d.at(key).is_null()) return def;
  const json& v = d.at(key);
  if (!v.is_number())
    fail("{}: field 'rope_scaling.{}' must be a number, got {}", where, key, v.dump());
  return v.get<double>();
}

double hf_required(const json& d, const char* key, const char* type, const std::string& where) {
  if (!d.contains(key) || d.at(key).is_null())
    fail("{}: 'rope_scaling' of type {} needs field '{}'", where, type, key);
  return hf_number(d, key, 0, where);
}

int64_t hf_context(const json& d, bool required, const char* type, const std::string& where) {
  const char* key = "original_max_position_embeddings";
  if (!d.contains(key) || d.at(key).is_null()) {
    if (required) fail("{}: 'rope_scaling' of type {} needs field '{}'", where, type, key);
    return 0;
  }
  return json_int(d.at(key), where, std::string("rope_scaling.") + key, 1, limits::kSeqLen);
}

}  // namespace

void rope_from_hf_config(const json& config, const std::string& where, double& theta,
                         RopeScaling& s) {
  auto given = [&](const char* key) { return config.contains(key) && !config.at(key).is_null(); };
  // transformers 5 keeps theta and the scaling in one `rope_parameters` dict.
  const char* dict_key = given("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json none = json::object();
  const json& d = given(dict_key) ? config.at(dict_key) : none;
  if (!d.is_object())
    fail("{}: field '{}' must be an object or null, got {}", where, dict_key, d.dump());
  const char* theta_key = "rope_theta";
  const json* t = given(theta_key)        ? &config.at(theta_key)
                  : d.contains(theta_key) ? &d.at(theta_key)
                                          : nullptr;
  theta = 10000.0;  // transformers' default
  if (t) {
    if (!t->is_number() || !(t->get<double>() > 0) || !std::isfinite(t->get<double>()))
      fail("{}: field 'rope_theta' must be a positive number, got {}", where, t->dump());
    theta = t->get<double>();
  }
  s = RopeScaling{};
  // "rope_type", or "type" in configs written before transformers 4.43.
  const json* type = d.contains("rope_type") ? &d.at("rope_type")
                     : d.contains("type")    ? &d.at("type")
                                             : nullptr;
  if (!type || type->is_null()) {
    if (d.contains("factor") || d.contains("original_max_position_embeddings"))
      fail("{}: field '{}' has no 'rope_type'", where, dict_key);
    return;
  }
  if (!type->is_string())
    fail("{}: field '{}.rope_type' must be a string, got {}", where, dict_key, type->dump());
  const std::string name = type->get<std::string>();
  if (name == "default") return;  // plain rotary positions
  if (name == "linear") {
    s.type = RopeScalingType::Linear;
  } else if (name == "llama3") {
    s.type = RopeScalingType::Llama3;
  } else if (name == "yarn") {
    s.type = RopeScalingType::Yarn;
  } else if (name == "longrope" || name == "su") {
    s.type = RopeScalingType::LongRope;
  } else {
    fail(
        "{}: unsupported '{}' = {}: RoPE scaling type '{}' is not supported (supported: "
        "linear, llama3, yarn, longrope)",
        where, dict_key, d.dump(), name);
  }
  const char* tn = name.c_str();
  if (s.type == RopeScalingType::LongRope) {
    for (const char* key : {"short_factor", "long_factor"}) {
      if (!d.contains(key)) fail("{}: 'rope_scaling' of type {} needs field '{}'", where, tn, key);
      s.*(key[0] == 's' ? &RopeScaling::short_factor : &RopeScaling::long_factor) =
          factor_list(d.at(key), where, key);
    }
    // As transformers: a top-level original_max_position_embeddings (Phi-3's)
    // is the original context, and max_position_embeddings over it the
    // factor; without one, the dict's original context and factor, else
    // max_position_embeddings and a factor of 1 (no attention scaling).
    const char* ok = "original_max_position_embeddings";
    const int64_t max_pos = config.contains("max_position_embeddings") &&
                                    config.at("max_position_embeddings").is_number()
                                ? config.at("max_position_embeddings").get<int64_t>()
                                : 0;
    if (given(ok)) {
      s.original_max_seq_len = json_int(config.at(ok), where, ok, 1, limits::kSeqLen);
      s.factor = max_pos > 0 ? double(max_pos) / double(s.original_max_seq_len) : 1.0;
    } else {
      s.original_max_seq_len = hf_context(d, false, tn, where);
      if (s.original_max_seq_len == 0) s.original_max_seq_len = max_pos;
      s.factor = hf_number(d, "factor", 1.0, where);
    }
    s.attention_factor = hf_number(d, "attention_factor", 0, where);
    return;
  }
  s.factor = hf_required(d, "factor", tn, where);
  if (s.type == RopeScalingType::Llama3) {
    s.low_freq_factor = hf_required(d, "low_freq_factor", tn, where);
    s.high_freq_factor = hf_required(d, "high_freq_factor", tn, where);
    s.original_max_seq_len = hf_context(d, true, tn, where);
  }
  if (s.type == RopeScalingType::Yarn) {
    s.original_max_seq_len = hf_context(d, false, tn, where);
    // transformers reads these with `or`: a 0 is the default too.
    s.beta_fast = hf_number(d, "beta_fast", 0, where);
    s.beta_slow = hf_number(d, "beta_slow", 0, where);
    if (s.beta_fast == 0) s.beta_fast = 32;
    if (s.beta_slow == 0) s.beta_slow = 1;
    s.attention_factor = hf_number(d, "attention_factor", 0, where);
    s.mscale = hf_number(d, "mscale", 0, where);
    s.mscale_all_dim = hf_number(d, "mscale_all_dim", 0, where);
    if (d.contains("truncate") && !d.at("truncate").is_null()) {
      if (!d.at("truncate").is_boolean())
        fail("{}: field 'rope_scaling.truncate' must be true or false, got {}", where,
             d.at("truncate").dump());
      s.truncate = d.at("truncate").get<bool>();
    }
  }
}

nlohmann::ordered_json rope_scaling_to_hf(const RopeScaling& s) {
  if (!s.enabled()) return nullptr;
  nlohmann::ordered_json j;
  write_scaling(s, j, "rope_type", "original_max_position_embeddings");
  return j;
}

}  // namespace nk
