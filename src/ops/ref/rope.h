// Reference rotary embedding, Hugging Face rotate-half convention.
#pragma once
#include <cmath>
#include <cstdint>

namespace nk::ref {

// table F[max_t, D]: [:, i] = cos(t f_i), [:, D/2 + i] = sin(t f_i), f_i = theta^(-2i/D),
// angles in double.
template <typename F>
void rope_table(F* table, int64_t max_t, int64_t D, double theta) {
  int64_t h = D / 2;
  for (int64_t t = 0; t < max_t; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      double a = double(t) * std::pow(theta, -2.0 * double(i) / double(D));
      table[t * D + i] = F(std::cos(a));
      table[t * D + h + i] = F(std::sin(a));
    }
  }
}

// x F[B,T,W]: in each row, heads 0..H-1 of width D at columns h*D; pairs (i, i+R/2)
// of each head's first R values rotate by angle(pos0 + t, i), read from table F[max_t, R];
// the head's values R..D-1 pass through (partial rotary; R = 0: R = D). inverse rotates by
// the negative angle.
template <typename F>
void rope_inplace(F* x, int64_t B, int64_t T, int64_t W, int64_t H, int64_t D, const F* table,
                  int64_t pos0, bool inverse, int64_t R = 0) {
  if (R == 0) R = D;
  int64_t half = R / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const F* cs = table + (pos0 + t) * R;
      for (int64_t hd = 0; hd < H; ++hd) {
        F* q = x + (b * T + t) * W + hd * D;
        for (int64_t i = 0; i < half; ++i) {
          F c = cs[i], s = inverse ? -cs[half + i] : cs[half + i];
          F x1 = q[i], x2 = q[half + i];
          q[i] = x1 * c - x2 * s;
          q[half + i] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace nk::ref
