#include "ckpt/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/rng.h"

namespace nk {
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nk_st_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with the given raw header text and `data_bytes` zero bytes after it.
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                        int64_t declared_len = -1) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = declared_len >= 0 ? uint64_t(declared_len) : header.size();
    for (int i = 0; i < 8; ++i) out.put(char(n >> (8 * i)));
    out << header << std::string(data_bytes, '\0');
    return p;
  }
  // The message of the nk::Error thrown by opening `p`, or "" if none.
  static std::string open_error(const std::string& p) {
    try {
      SafetensorsFile::open(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::vector<std::string> temp_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp.") != std::string::npos)
        out.push_back(e.path().string());
    return out;
  }
  fs::path dir_;
};

Tensor random_tensor(const Shape& shape, DType dt, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dt);
  Rng rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng.next_u64());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripEveryDtypeAndOddShapes) {
  std::vector<std::pair<std::string, Tensor>> ts;
  DType all[] = {DType::F32, DType::BF16, DType::F16, DType::F64,
                 DType::I32, DType::I64,  DType::U8};
  for (DType dt : all)
    ts.push_back({std::string("w.") + dtype_name(dt), random_tensor({3, 5}, dt, uint64_t(dt))});
  ts.push_back({"scalar", random_tensor({}, DType::F32, 7)});
  ts.push_back({"empty", random_tensor({0, 4}, DType::BF16, 8)});
  ts.push_back({"u8_odd", random_tensor({3}, DType::U8, 9)});  // leaves the next one unaligned
  ts.push_back({"after_odd", random_tensor({2, 2}, DType::F32, 10)});
  std::string p = path("all.safetensors");
  save_safetensors(p, ts);

  SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.entries().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(f.entries()[i].name, ts[i].first);  // data laid out in the given order
    ASSERT_TRUE(f.has(ts[i].first));
    EXPECT_TRUE(same_bytes(f.get(ts[i].first), ts[i].second)) << ts[i].first;
  }
  EXPECT_EQ(f.entry("scalar").shape, Shape{});
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_TRUE(f.metadata().empty());
  // The header is padded so the data starts 8-byte aligned.
  std::string raw = slurp(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | uint8_t(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  std::string p = path("m.safetensors");
  std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "ünïcode \"q\""}};
  save_safetensors(p, {{"a", random_tensor({2}, DType::F32, 1)}}, meta);
  EXPECT_EQ(SafetensorsFile::open(p).metadata(), meta);
}

// A tensor-parallel rank reads only its slices of a whole tensor: rows of
// each fused part, or columns of every row, laid out as its shard.
TEST_F(SafetensorsTest, ReadsSlicesOfRowsAndColumns) {
  std::string p = path("s.safetensors");
  Tensor whole = random_tensor({6, 4}, DType::F32, 3);
  save_safetensors(p, {{"w", whole}});
  SafetensorsFile f = SafetensorsFile::open(p);
  const float* w = whole.data<float>();
  Tensor rows = Tensor::empty({3, 4}, DType::F32);  // rows 1 and 4-5, as two parts' shares
  f.read_slices_into("w", {{0, 1, 1, 0}, {0, 4, 2, 1}}, rows);
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(rows.data<float>()[j], w[4 + j]);
    EXPECT_EQ(rows.data<float>()[4 + j], w[16 + j]);
    EXPECT_EQ(rows.data<float>()[8 + j], w[20 + j]);
  }
  Tensor cols = Tensor::empty({6, 2}, DType::F32);  // columns 2-3
  f.read_slices_into("w", {{1, 2, 2, 0}}, cols);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(cols.data<float>()[i * 2 + j], w[i * 4 + 2 + j]);
  // Ranges that do not fit are the caller's bug.
  EXPECT_THROW(f.read_slices_into("w", {{0, 5, 2, 0}}, rows), InternalError);  // past the end
  EXPECT_THROW(f.read_slices_into("w", {{1, 0, 2, 0}}, rows), InternalError);  // 3 rows, not 6
  EXPECT_THROW(f.read_slices_into("w", {{0, 0, 2, 0}}, cols), InternalError);  // rows of 2, not 4
}

TEST_F(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  std::string p = path("x.safetensors");
  save_safetensors(p, {{"a", random_tensor({2}, DType::F32, 1)}});
  SafetensorsFile f = SafetensorsFile::open(p);
  try {
    f.get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
}

TEST_F(SafetensorsTest, UnopenableFiles) {
  std::string missing = path("missing.safetensors");
  EXPECT_NE(open_error(missing).find(missing), std::string::npos);
  EXPECT_NE(open_error(missing).find("not found"), std::string::npos);
  std::string d = path("adir");
  fs::create_directories(d);
  EXPECT_NE(open_error(d).find(d), std::string::npos);
  std::string tiny = path("tiny.safetensors");
  std::ofstream(tiny) << "abc";
  EXPECT_NE(open_error(tiny).find(tiny), std::string::npos);
  EXPECT_NE(open_error(tiny).find("too short"), std::string::npos);
}

TEST_F(SafetensorsTest, CorruptHeaders) {
  struct Case {
    std::string header;
    size_t data;
    std::string expect;  // substring of the message besides the file name
    int64_t declared_len = -1;
  };
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  std::vector<Case> cases = {
      {"{}", 0, "exceeds", 1000},
      {"{}", 0, "implausible", int64_t(200) << 20},
      {"{not json", 0, "not valid JSON"},
      {"[1, 2]", 0, "not a JSON object"},
      {R"({"t": 5})", 0, "'t': entry is not a JSON object"},
      {R"({"t": {"shape":[2],"data_offsets":[0,8]}})", 8, "'t': missing 'dtype'"},
      {R"({"t": {"dtype":"F32","data_offsets":[0,8]}})", 8, "'t': missing 'shape'"},
      {R"({"t": {"dtype":"F32","shape":[2]}})", 8, "'t': missing 'data_offsets'"},
      {R"({"t": {"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, "'t': unsupported dtype"},
      {R"({"t": {"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8, "'t': 'dtype'"},
      {R"({"t": {"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "'t': shape"},
      {R"({"t": {"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "'t': shape"},
      {R"({"t": {"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8, "'t': 'shape'"},
      {R"({"t": {"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
       "'t': data_offsets [8, 0] are reversed"},
      {R"({"t": {"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "'t': 'data_offsets'"},
      {R"({"t": {"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, "'t': 'data_offsets'"},
      {R"({"t": {"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
       "'t': data_offsets end 8 is beyond"},
      {R"({"t": {"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "'t': data_offsets cover 8 bytes"},
      {R"({"t": {"dtype":"F32","shape":[4611686018427387904, 8],"data_offsets":[0,8]}})", 8,
       "'t': shape"},
      {R"({"a": {)" + ok + R"(}, "b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "'a' [0, 8) and 'b' [4, 12) overlap"},
      {R"({"a": {)" + ok + R"(}, "a": {)" + ok + "}}", 8, "tensor 'a' appears twice"},
      {R"({"__metadata__": [1], "a": {)" + ok + "}}", 8, "__metadata__"},
      {R"({"__metadata__": {"k": 1}, "a": {)" + ok + "}}", 8, "__metadata__ value for 'k'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string p =
        write_raw("bad" + std::to_string(i) + ".safetensors", c.header, c.data, c.declared_len);
    std::string msg = open_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << "case " << i << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "case " << i << ": " << msg;
  }
}

TEST_F(SafetensorsTest, AcceptsHandWrittenEdgeCases) {
  // Empty tensors may share an offset; extra fields and trailing padding are fine.
  std::string p = write_raw(
      "edge.safetensors",
      R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"e2":{"dtype":"I64","shape":[0,3],"data_offsets":[0,0]},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":1}}   )",
      2);
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.get("x").numel(), 2);
}

TEST_F(SafetensorsTest, FailedWriteLeavesNothing) {
  std::string p = path("no_such_dir/out.safetensors");
  Tensor t = random_tensor({4}, DType::F32, 1);
  EXPECT_THROW(save_safetensors(p, {{"t", t}}), Error);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(path("no_such_dir")));
  // Renaming over a directory fails after the temporary was written: it must be removed.
  std::string d = path("occupied");
  fs::create_directories(d + "/child");
  try {
    save_safetensors(d, {{"t", t}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(d), std::string::npos);
  }
  EXPECT_TRUE(fs::is_directory(d + "/child"));
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, SaveReplacesExistingFile) {
  std::string p = path("r.safetensors");
  save_safetensors(p, {{"old", random_tensor({100}, DType::F32, 1)}});
  Tensor t = random_tensor({3}, DType::I32, 2);
  save_safetensors(p, {{"new", t}});
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_FALSE(f.has("old"));
  EXPECT_TRUE(same_bytes(f.get("new"), t));
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, OpenFileKeepsReadingTheVersionItValidated) {
  std::string p = path("v.safetensors");
  Tensor a = random_tensor({64}, DType::F32, 1);
  save_safetensors(p, {{"a", a}});
  SafetensorsFile f = SafetensorsFile::open(p);
  save_safetensors(p, {{"b", random_tensor({8}, DType::F32, 2)}});
  EXPECT_TRUE(same_bytes(f.get("a"), a));
}

TEST_F(SafetensorsTest, WriteFileAtomic) {
  std::string p = path("config.json");
  write_file_atomic(p, "{\"a\": 1}");
  write_file_atomic(p, "{\"b\": 2}");
  EXPECT_EQ(slurp(p), "{\"b\": 2}");
  EXPECT_THROW(write_file_atomic(path("nope/x.json"), "x"), Error);
  EXPECT_TRUE(temp_files().empty());
}

// Interop both ways with an independent implementation of the format (Python
// json+struct+numpy; the `safetensors` package is not installed).
TEST_F(SafetensorsTest, InteropWithPythonWriterAndReader) {
  ASSERT_TRUE(fs::exists("/usr/bin/python3"))
      << "/usr/bin/python3 (python3-torch, installed by the set-up)";
  std::string py_file = path("py.safetensors"), ours = path("ours.safetensors");
  std::string script = path("interop.py");
  std::ofstream(script) << R"PY(
import json, struct, sys
import numpy as np
out, ours = sys.argv[1], sys.argv[2]
tensors = [
    ("emb", np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5, "F32"),
    ("ids", np.array([-1, 2, 3**30], dtype=np.int64), "I64"),
    ("half", np.array([1.0, -2.5, 65504.0], dtype=np.float16), "F16"),
    # bf16 = top 16 bits of the f32 pattern (values chosen to be exact).
    ("bf", (np.array([1.0, -3.0, 0.15625], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16), "BF16"),
    ("bytes", np.array([[1, 2], [3, 255]], dtype=np.uint8), "U8"),
]
header, blobs, off = {"__metadata__": {"format": "np"}}, [], 0
for name, arr, dt in tensors:
    b = arr.tobytes()
    header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
# Header keys in reverse data order: entries() must follow the data, not the JSON.
h = json.dumps(dict(reversed(list(header.items())))).encode()
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

# Read the file Nekton wrote and print what is in it.
with open(ours, "rb") as f:
    raw = f.read()
n = struct.unpack("<Q", raw[:8])[0]
assert n % 8 == 0, n
hdr = json.loads(raw[8:8 + n])
assert hdr["__metadata__"] == {"who": "nekton"}, hdr
buf = raw[8 + n:]
types = {"F32": np.float32, "I32": np.int32, "F64": np.float64}
for name in ["w", "k", "d"]:
    e = hdr[name]
    b, en = e["data_offsets"]
    a = np.frombuffer(buf[b:en], dtype=types[e["dtype"]]).reshape(e["shape"])
    print(name, e["dtype"], list(a.shape), " ".join(repr(float(x)) for x in a.ravel()))
)PY";
  Tensor w = Tensor::empty({2, 2}, DType::F32);
  for (int i = 0; i < 4; ++i) w.data<float>()[i] = 0.25f * float(i) - 1.0f;
  Tensor k = Tensor::empty({3}, DType::I32);
  for (int i = 0; i < 3; ++i) k.data<int32_t>()[i] = -7 * i;
  Tensor d = Tensor::empty({}, DType::F64);
  d.data<double>()[0] = 1e-300;
  save_safetensors(ours, {{"w", w}, {"k", k}, {"d", d}}, {{"who", "nekton"}});

  std::string out_txt = path("py_out.txt");
  std::string cmd =
      "/usr/bin/python3 " + script + " " + py_file + " " + ours + " > " + out_txt + " 2>&1";
  int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << slurp(out_txt);
  EXPECT_EQ(slurp(out_txt),
            "w F32 [2, 2] -1.0 -0.75 -0.5 -0.25\n"
            "k I32 [3] 0.0 -7.0 -14.0\n"
            "d F64 [] 1e-300\n");

  SafetensorsFile f = SafetensorsFile::open(py_file);
  EXPECT_EQ(f.metadata().at("format"), "np");
  std::vector<std::string> names;
  for (const auto& e : f.entries()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"emb", "ids", "half", "bf", "bytes"}));
  Tensor emb = f.get("emb");
  EXPECT_EQ(emb.shape(), (Shape{3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(emb.data<float>()[i], 0.5f * float(i));
  Tensor ids = f.get("ids");
  EXPECT_EQ(ids.data<int64_t>()[0], -1);
  EXPECT_EQ(ids.data<int64_t>()[2], 205891132094649LL);
  Tensor half = f.get("half");
  EXPECT_EQ(f16_to_f32(half.data<f16>()[1]), -2.5f);
  EXPECT_EQ(f16_to_f32(half.data<f16>()[2]), 65504.0f);
  Tensor bf = f.get("bf");
  EXPECT_EQ(bf16_to_f32(bf.data<bf16>()[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(bf.data<bf16>()[1]), -3.0f);
  EXPECT_EQ(bf16_to_f32(bf.data<bf16>()[2]), 0.15625f);
  Tensor bytes = f.get("bytes");
  EXPECT_EQ(bytes.shape(), (Shape{2, 2}));
  EXPECT_EQ(bytes.data<uint8_t>()[3], 255);
}

}  // namespace nk
