// Quantised weights (ops/quant.h): type names and sizes, QuantWeight's
// storage, and each op's checks before the device's kernel. Like the NF4 ops
// these are listed by hand rather than through NK_KERNEL: only the CPU has
// them, so another device gets the "no kernel" error naming the op.
#include "ops/quant.h"

#include "ops/dispatch.h"
#include "ops/shapes.h"

namespace nk::ops {
namespace {

struct TypeInfo {
  QuantType type;
  const char* name;
  int64_t block;       // values per block
  size_t block_bytes;  // bytes per block
};
// The block sizes of ggml's block_q8_0, block_q4_0, block_q4_K, block_q6_K.
constexpr TypeInfo kTypes[] = {
    {QuantType::Q8_0, "q8_0", 32, 34},   {QuantType::Q4_0, "q4_0", 32, 18},
    {QuantType::Q4_K, "q4_k", 256, 144}, {QuantType::Q6_K, "q6_k", 256, 210},
    {QuantType::W8A16, "w8a16", 1, 1},   {QuantType::W8A8, "w8a8", 1, 1},
    {QuantType::F16, "f16", 1, 2},       {QuantType::BF16, "bf16", 1, 2}};

const TypeInfo& info(QuantType t) {
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return i;
  NK_CHECK(false, "QuantType {} is not a known type", int(t));
  return kTypes[0];
}

bool has_scale(QuantType t) {
  return t == QuantType::W8A16 || t == QuantType::W8A8;
}

// q is a defined [out, in] weight whose data (and scale) have the sizes of
// its type and shape; returns their device. `name` is the op's name for q.
Device check_quant(const char* op, const QuantWeight& q, const char* name) {
  NK_CHECK(q.defined(), "{}: {} is an undefined quantised weight", op, name);
  NK_CHECK(q.shape.size() == 2 && q.shape[0] > 0 && q.shape[1] > 0 &&
               q.shape[1] % quant_block(q.type) == 0,
           "{}: {} ({}) has shape {}, expected [out, in] with in a multiple of {}", op, name,
           quant_type_name(q.type), shape_str(q.shape), quant_block(q.type));
  const int64_t bytes = q.rows() * int64_t(q.row_bytes());
  NK_CHECK(q.data.dtype() == DType::U8 && q.data.ndim() == 1 && q.data.numel() == bytes,
           "{}: {}.data is {}, expected u8[{}] for {} {}", op, name, q.data.desc(), bytes,
           quant_type_name(q.type), shape_str(q.shape));
  if (has_scale(q.type))
    NK_CHECK(q.scale.defined() && q.scale.dtype() == DType::F32 && q.scale.ndim() == 1 &&
                 q.scale.numel() == q.rows(),
             "{}: {}.scale is {}, expected f32[{}] for {} {}", op, name,
             q.scale.defined() ? q.scale.desc() : "undefined", q.rows(), quant_type_name(q.type),
             shape_str(q.shape));
  return device_of(op, {{&q.data, name}, {&q.scale, name, kOptional}});
}

}  // namespace

const char* quant_type_name(QuantType t) {
  return info(t).name;
}

QuantType parse_quant_type(const std::string& s) {
  std::string names;
  for (const TypeInfo& i : kTypes) {
    if (s == i.name) return i.type;
    names += names.empty() ? i.name : std::string(", ") + i.name;
  }
  fail("unknown quantisation type '{}' (expected one of {})", s, names);
}

int64_t quant_block(QuantType t) {
  return info(t).block;
}

size_t quant_row_bytes(QuantType t, int64_t in) {
  const TypeInfo& i = info(t);
  if (in < 0 || in % i.block != 0)
    fail("{}: a row of {} values is not a whole number of {}-value blocks", i.name, in, i.block);
  return size_t(in / i.block) * i.block_bytes;
}

QuantWeight QuantWeight::empty(QuantType type, const Shape& shape, Device device) {
  const int64_t block = quant_block(type);
  if (shape.size() != 2 || shape[0] <= 0 || shape[1] <= 0 || shape[1] % block != 0)
    fail("QuantWeight::empty: a {} weight must be [out, in] with in a multiple of {}, not {}",
         quant_type_name(type), block, shape_str(shape));
  QuantWeight q;
  q.type = type;
  q.shape = shape;
  q.data = Tensor::empty({shape[0] * int64_t(quant_row_bytes(type, shape[1]))}, DType::U8, device);
  if (has_scale(type)) q.scale = Tensor::empty({shape[0]}, DType::F32, device);
  return q;
}

size_t QuantWeight::nbytes() const {
  return (data.defined() ? data.nbytes() : 0) + (scale.defined() ? scale.nbytes() : 0);
}

void quant_quantize(QuantWeight& q, const Tensor& w) {
  const char* op = "quant_quantize";
  const Device dev = check_quant(op, q, "q");
  NK_CHECK(w.defined() && w.shape() == q.shape, "{}: w is {} but q was made for shape {}", op,
           w.defined() ? w.desc() : "undefined", shape_str(q.shape));
  check_dtype(w, DType::F32, "quant_quantize w");
  device_of(op, {{&q.data, "q"}, {&w, "w"}});
  pick_kernel(op, dev, cpu_kernels().quant_quantize)(q, w);
}

void quant_dequantize(Tensor out, const QuantWeight& q, int64_t row0) {
  const char* op = "quant_dequantize";
  const Device dev = check_quant(op, q, "q");
  device_of(op, {{&q.data, "q"}, {&out, "out"}});
  NK_CHECK(is_compute_dtype(out.dtype()), "{}: out is {}, expected f32 or bf16", op, out.desc());
  const int64_t n = rows_checked(op, out, q.cols(), "out");
  NK_CHECK(row0 >= 0 && row0 + n <= q.rows(),
           "{}: out {} from row0 {} is outside the weight's {} rows", op, out.desc(), row0,
           q.rows());
  if (n == 0) return;
  pick_kernel(op, dev, cpu_kernels().quant_dequantize)(out, q, row0);
}

bool quant_pack(QuantWeight& q) {
  const char* op = "quant_pack";
  const Device dev = check_quant(op, q, "q");
  if (q.layout == QuantLayout::Packed16) return true;
  return pick_kernel(op, dev, cpu_kernels().quant_pack)(q);
}
QuantWeight quant_unpacked(const QuantWeight& q) {
  const char* op = "quant_unpacked";
  const Device dev = check_quant(op, q, "q");
  if (q.layout == QuantLayout::Rows) return q;
  QuantWeight out = QuantWeight::empty(q.type, q.shape, dev);
  pick_kernel(op, dev, cpu_kernels().quant_unpack)(out, q);
  return out;
}
void quant_linear_forward(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  const char* op = "quant_linear_forward";
  const Device dev = check_quant(op, w, "w");
  device_of(op, {{&w.data, "w"}, {&y, "y"}, {&x, "x"}, {&b, "b", kOptional}});
  NK_CHECK(is_compute_dtype(x.dtype()), "{}: x is {}, expected f32 or bf16", op, x.desc());
  const int64_t n = rows_checked(op, x, w.cols(), "x");
  NK_CHECK(rows_checked(op, y, w.rows(), "y") == n, "{}: y {} does not match x {}", op, y.desc(),
           x.desc());
  check_dtype(y, x.dtype(), "quant_linear_forward y");
  if (b.defined()) {
    check_shape(b, {w.rows()}, "quant_linear_forward b");
    NK_CHECK(b.dtype() == x.dtype() || b.dtype() == DType::F32,
             "{}: b is {}, expected f32 or x's dtype ({})", op, b.desc(), dtype_name(x.dtype()));
  }
  if (n == 0) return;
  pick_kernel(op, dev, cpu_kernels().quant_linear_forward)(y, x, w, b);
}

void quant_embedding_forward(Tensor out, const Tensor& tokens, const QuantWeight& wte,
                             int64_t vocab_start) {
  const char* op = "quant_embedding_forward";
  const Device dev = check_quant(op, wte, "wte");
  device_of(op, {{&wte.data, "wte"}, {&out, "out"}, {&tokens, "tokens"}});
  check_dtype(tokens, DType::I32, "quant_embedding_forward tokens");
  Shape want = tokens.shape();
  want.push_back(wte.cols());
  check_shape(out, want, "quant_embedding_forward out");
  NK_CHECK(is_compute_dtype(out.dtype()), "{}: out is {}, expected f32 or bf16", op, out.desc());
  if (out.numel() == 0) return;
  pick_kernel(op, dev, cpu_kernels().quant_embedding_forward)(out, tokens, wte, vocab_start);
}

}  // namespace nk::ops
