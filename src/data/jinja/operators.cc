#include "data/jinja/operators.h"

#include <cmath>

#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

bool numeric_like(const Value& v) {
  return v.is_number() || v.kind == Value::Kind::Bool;
}

// a OP b on int64, or nullopt when it overflows (JavaScript would go on in
// doubles; a float result says so).
bool int_op(std::string_view op, int64_t a, int64_t b, int64_t& out) {
  if (op == "+") return !__builtin_add_overflow(a, b, &out);
  if (op == "-") return !__builtin_sub_overflow(a, b, &out);
  return !__builtin_mul_overflow(a, b, &out);
}

Value number_result(double v, bool is_float) {
  if (!is_float && std::isfinite(v) && std::floor(v) == v && std::abs(v) < 9.2e18)
    return Value::integer(int64_t(v));
  return Value::number(v);
}

}  // namespace

Value binary_op(std::string_view op, const Value& l, const Value& r) {
  if (op == "==") return Value::boolean(loose_equal(l, r));
  if (op == "!=") return Value::boolean(!loose_equal(l, r));
  if (l.is_undefined() || r.is_undefined()) {
    if (r.is_undefined() && (op == "in" || op == "not in")) return Value::boolean(op == "not in");
    render_fail("Cannot perform operation {} on undefined values", op);
  }
  if (l.is_none() || r.is_none()) render_fail("Cannot perform operation on null values");
  if (op == "~") return Value::string(raw_string(l) + raw_string(r));
  if (op == "**" && numeric_like(l) && numeric_like(r)) {
    const double a = l.as_double(), b = r.as_double();
    if (a == 0 && b < 0) render_fail("0.0 cannot be raised to a negative power");
    const double v = std::pow(a, b);
    if (!std::isfinite(v)) render_fail("Exponentiation result is not a finite real number");
    return number_result(v, l.kind == Value::Kind::Float || r.kind == Value::Kind::Float || b < 0);
  }
  if (l.is_number() && r.is_number()) {
    const bool is_float = l.kind == Value::Kind::Float || r.kind == Value::Kind::Float;
    const double a = l.as_double(), b = r.as_double();
    if (op == "+" || op == "-" || op == "*") {
      int64_t out = 0;
      if (!is_float && int_op(op, l.i, r.i, out)) return Value::integer(out);
      const double v = op == "+" ? a + b : op == "-" ? a - b : a * b;
      return is_float ? Value::number(v) : number_result(v, false);
    }
    if (op == "/") return Value::number(a / b);
    if (op == "//") return number_result(std::floor(a / b), is_float || b == 0);
    if (op == "%") {
      if (!is_float && r.i != 0 && !(l.i == INT64_MIN && r.i == -1))
        return Value::integer(l.i % r.i);
      return Value::number(std::fmod(a, b));
    }
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == "<=") return Value::boolean(a <= b);
    if (op == ">=") return Value::boolean(a >= b);
  } else if (l.is_list() && r.is_list()) {
    if (op == "+") {
      Array out = l.list();
      out.insert(out.end(), r.list().begin(), r.list().end());
      return Value::array(std::move(out));
    }
  } else if (r.is_list()) {
    if (op == "in" || op == "not in") {
      bool member = false;
      for (const Value& x : r.list())
        if (strict_equal(x, l)) {
          member = true;
          break;
        }
      return Value::boolean(member == (op == "in"));
    }
  }
  if ((l.is_string() || r.is_string()) && op == "+")
    return Value::string(raw_string(l) + raw_string(r));
  if (l.is_string() && r.is_string() && (op == "in" || op == "not in"))
    return Value::boolean((r.str().find(l.str()) != std::string::npos) == (op == "in"));
  if (l.is_string() && r.is_mapping() && (op == "in" || op == "not in"))
    return Value::boolean((r.map().find(l.str()) != nullptr) == (op == "in"));
  render_fail("Unknown operator \"{}\" between {} and {}", op, type_name(l), type_name(r));
}

Value unary_op(std::string_view op, const Value& v) {
  if (op == "not") return Value::boolean(!truthy(v));
  if (numeric_like(v)) {
    const double sign = op == "-" ? -1 : 1;
    if (v.kind == Value::Kind::Float) return Value::number(sign * v.f);
    if (v.kind == Value::Kind::Int && v.i != INT64_MIN)
      return Value::integer(op == "-" ? -v.i : v.i);
    return number_result(sign * v.as_double(), false);
  }
  render_fail("Unknown operator \"{}\" for {}", op, type_name(v));
}

}  // namespace nk::jinja
