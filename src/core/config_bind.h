// Declaring a configuration key and binding it to the field it fills is one
// line, the same for every kind of settings in Nekton (the training recipe,
// its model.* and data.* groups, the commands' keys, curate's stage options,
// the --options of the commands that take positional arguments):
//   b.bind("train.steps", steps, "optimizer steps");
// declares the key in the binder's ConfigSchema (its type is the field's, its
// default the field's current value, its doc the one line --help shows) and,
// when the binder reads from somewhere, sets the field to the value given.
// A struct lists its keys once, in a `bind(ConfigBinder&)` function; run on a
// declaring binder that list is the schema (--help, Config::load), run on a
// reading one it fills the struct.
#pragma once
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/config.h"

namespace nk {

// A key's value as a source gives it, parsed to the key's type, and where it
// was given ("x.yaml:3"; "" when unknown) for messages about it.
struct GivenValue {
  ConfigValue value;
  std::string where;
};

template <class V>
concept ConfigScalar = std::same_as<V, int64_t> || std::same_as<V, double> ||
    std::same_as<V, bool> || std::same_as<V, std::string>;

class ConfigBinder {
 public:
  ConfigBinder() = default;  // declares only: fields are left as they are
  virtual ~ConfigBinder() = default;

  // Every bind returns whether the key was given (a reading binder's Config
  // gives every key); a key not given leaves its field as it is.
  template <std::integral T>
  requires(!std::same_as<T, bool>) bool bind(const std::string& key, T& field,
                                             const std::string& doc) {
    int64_t v = std::cmp_greater(field, INT64_MAX) ? INT64_MAX : int64_t(field);
    constexpr T hi = std::numeric_limits<T>::max();
    bool given = bind_int(key, v, doc, int64_t(std::numeric_limits<T>::min()),
                          std::cmp_greater(hi, INT64_MAX) ? INT64_MAX : int64_t(hi));
    if (given) field = T(v);
    return given;
  }
  bool bind(const std::string& key, double& field, const std::string& doc);
  bool bind(const std::string& key, bool& field, const std::string& doc);
  bool bind(const std::string& key, std::string& field, const std::string& doc);

  // A key whose default `unset` leaves the field as it is, so that it
  // overrides a value set before (model.n_layer=0 keeps the preset's layers).
  // Returns whether it changed the field.
  template <ConfigScalar V>
  bool bind_unless(const std::string& key, V& field, const std::type_identity_t<V>& unset,
                   const std::string& doc) {
    std::optional<GivenValue> g = declare(key, type_of<V>(), unset, doc);
    if (!g || std::get<V>(g->value) == unset) return false;
    field = std::get<V>(g->value);
    return true;
  }
  // A key of type V (default `def`) whose value goes through `set`: a field of
  // another type (an enum by name), or a key that does more than fill a field
  // (model.preset). `set` checks the value and throws nk::Error naming the key.
  template <ConfigScalar V, class Set>
  bool bind_with(const std::string& key, const V& def, const std::string& doc, Set&& set) {
    std::optional<GivenValue> g = declare(key, type_of<V>(), def, doc);
    if (g) set(std::get<V>(g->value));
    return g.has_value();
  }

  // An older name of a bound key that keeps setting it (ConfigSchema::add_alias).
  void alias(const std::string& old_name, const std::string& key) {
    schema_.add_alias(old_name, key);
  }

  // Whether binds fill fields (false: they only declare keys).
  virtual bool reading() const { return false; }
  // The keys bound so far, in order, with types, defaults and docs.
  const ConfigSchema& schema() const { return schema_; }

  // One key of a shared group that a command takes, with the doc it has
  // there ("" = the group's).
  struct Pick {
    std::string key, doc;
  };
  // Binds, through `bind`, only the picked keys of a shared group (preprocess
  // takes three of the data.* keys); the group's other binds do nothing.
  template <class Bind>
  void bind_only(const std::vector<Pick>& keys, Bind&& bind) {
    select(keys);
    bind(*this);
    end_select();
  }

 protected:
  // Declares `key` (NK_CHECK: not twice) and returns its given value, or
  // nullopt when none is given or the key is not selected (bind_only).
  std::optional<GivenValue> declare(const std::string& key, ConfigType type, ConfigValue def,
                                    const std::string& doc);
  // Declares `key` without reading it (a key whose value is not a scalar);
  // false when it is not selected.
  bool add_key(const std::string& key, ConfigType type, ConfigValue def, const std::string& doc);
  // The value given for a just-declared key, parsed to its type. A source
  // parses text itself, so that its messages name its own places.
  virtual std::optional<GivenValue> given(const ConfigSchema::Field& /*key*/) {
    return std::nullopt;
  }
  // How messages name a key: "key 'min_words'" ("option --epoch" on a command line).
  virtual std::string name_of(const std::string& key) const { return "key '" + key + "'"; }

  template <class V>
  static constexpr ConfigType type_of() {
    if constexpr (std::same_as<V, int64_t>) return ConfigType::Int;
    if constexpr (std::same_as<V, double>) return ConfigType::Float;
    if constexpr (std::same_as<V, bool>) return ConfigType::Bool;
    return ConfigType::String;
  }

 private:
  bool bind_int(const std::string& key, int64_t& field, const std::string& doc, int64_t lo,
                int64_t hi);
  void select(const std::vector<Pick>& keys);
  void end_select();  // NK_CHECKs that every selected key was bound

  ConfigSchema schema_;
  std::vector<Pick> only_;
  bool selecting_ = false;
};

// Fills bound fields from a resolved Config (defaults < YAML < overrides),
// whose schema declares every key bound, with the same type.
class ConfigReader : public ConfigBinder {
 public:
  explicit ConfigReader(const Config& cfg) : cfg_(cfg) {}
  explicit ConfigReader(Config&&) = delete;  // it keeps a reference
  bool reading() const override { return true; }

 protected:
  std::optional<GivenValue> given(const ConfigSchema::Field& key) override;

 private:
  const Config& cfg_;
};

// The schema a bind function declares: `schema_of([](ConfigBinder& b) {
// TrainConfig().bind(b); })`.
template <class Bind>
ConfigSchema schema_of(Bind&& bind) {
  ConfigBinder b;
  bind(b);
  return b.schema();
}

}  // namespace nk
