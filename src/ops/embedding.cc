// Token + position embedding: checks, then the device's kernel. Token ids and
// position ids are data, checked by the kernel that reads them.
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// tokens i32[B,T] and the optional positions i32[B,T].
void check_ids(const char* op, const Tensor& tokens, const Tensor& positions) {
  check_dtype(tokens, DType::I32, "tokens");
  NK_CHECK(tokens.ndim() == 2, "{}: tokens {} is not [B, T]", op, tokens.desc());
  if (positions.defined()) {
    check_dtype(positions, DType::I32, "positions");
    check_shape(positions, tokens.shape(), "positions");
  }
}

// A table (or its gradient) [rows, C] with at least min_rows rows.
void check_table(const char* op, const Tensor& t, const char* name, int64_t C, int64_t min_rows) {
  NK_CHECK(t.ndim() == 2 && t.dim(1) == C && t.dim(0) >= min_rows,
           "{}: {} {} does not cover {} rows of C={}", op, name, t.desc(), min_rows, C);
}

}  // namespace

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions, int64_t vocab_start) {
  const char* op = "embedding_forward";
  const Device dev = device_of(op, {{&out, "out"},
                                    {&tokens, "tokens"},
                                    {&wte, "wte"},
                                    {&wpe, "wpe", kOptional},
                                    {&positions, "positions", kOptional}});
  check_ids(op, tokens, positions);
  NK_CHECK(wte.ndim() == 2, "{}: wte {} is not [V, C]", op, wte.desc());
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.dim(1);
  check_shape(out, {B, T, C}, "out");
  check_dtype(out, wte.dtype(), "out");
  if (wpe.defined()) {  // explicit positions are checked against its rows by the kernel
    check_table(op, wpe, "wpe", C, positions.defined() ? 0 : T);
    check_dtype(wpe, wte.dtype(), "wpe");
  }
  NK_KERNEL(embedding_forward, dev)(out, tokens, wte, wpe, positions, vocab_start);
}

void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        const Tensor& positions, int64_t vocab_start) {
  const char* op = "embedding_backward";
  const Device dev = device_of(op, {{&dwte, "dwte", kOptional},
                                    {&dwpe, "dwpe", kOptional},
                                    {&dout, "dout"},
                                    {&tokens, "tokens"},
                                    {&positions, "positions", kOptional}});
  check_ids(op, tokens, positions);
  NK_CHECK(dout.ndim() == 3 && dout.dim(0) == tokens.dim(0) && dout.dim(1) == tokens.dim(1),
           "{}: dout {} does not match tokens {}", op, dout.desc(), tokens.desc());
  const int64_t T = tokens.dim(1), C = dout.dim(2);
  if (dwte.defined()) {
    NK_CHECK(dwte.ndim() == 2, "{}: dwte {} is not [V, C]", op, dwte.desc());
    check_shape(dout, {tokens.dim(0), T, dwte.dim(1)}, "dout");
    check_dtype(dwte, DType::F32, "dwte");
  }
  if (dwpe.defined()) {
    check_table(op, dwpe, "dwpe", C, positions.defined() ? 0 : T);
    check_dtype(dwpe, DType::F32, "dwpe");
  }
  if (!dwte.defined() && !dwpe.defined()) return;
  NK_KERNEL(embedding_backward, dev)(dwte, dwpe, dout, tokens, positions, vocab_start);
}

}  // namespace nk::ops
