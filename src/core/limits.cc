#include "core/limits.h"

#include "core/error.h"

namespace nk {

void check_limit(const std::string& where, const std::string& key, int64_t value, int64_t limit,
                 const char* what) {
  if (value < 0 || value > limit)
    fail("{}{}{} = {} is beyond the limit of {} {}", where, where.empty() ? "" : ": ", key, value,
         limit, what);
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: {} x {} overflows a 64-bit size", what, a, b);
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: {} + {} overflows a 64-bit size", what, a, b);
  return r;
}

}  // namespace nk
