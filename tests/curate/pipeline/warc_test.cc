// WARC and WET input: files written here in WARC/1.0 and 1.1, plain, gzip per
// record and gzip whole-file, holding pages in windows-1251, Shift_JIS,
// ISO-8859-2 and GB18030 whose charset is declared in the HTTP header, in a
// <meta> tag, or nowhere; the text read back must equal the UTF-8 source.
// Damaged files (a corrupt header, a corrupt or truncated gzip member, bytes
// that are not gzip, a Content-Length beyond the end) give counted skips that
// name the file and offset, and the records around the damage are kept.
#include "curate/pipeline/warc.h"

#include <gtest/gtest.h>
#include <unicode/ucnv.h>
#include <zlib.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "curate/extract/html_extract.h"
#include "curate/pipeline/charset.h"
#include "curate/pipeline/config.h"
#include "curate/pipeline/input.h"
#include "curate/pipeline/runner.h"
#include "test_util.h"

namespace nk::curate {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::TempDir;

// A few hundred characters of prose in each language: enough for uchardet.
const char* kRussian =
    "Летним утром старый рыбак вышел из дома ещё до рассвета. Над рекой стоял густой туман, и "
    "берег напротив едва угадывался в серой дымке. Он спустился к лодке, проверил вёсла и сети, "
    "а потом долго сидел на скамье, слушая, как просыпаются птицы в прибрежных кустах. Вода "
    "была тёплой и тихой. Когда солнце поднялось над лесом, туман начал рассеиваться, и на "
    "середине реки показались первые круги от играющей рыбы. Рыбак оттолкнулся от берега и "
    "медленно поплыл вниз по течению, мимо заброшенной мельницы и деревянного моста, который "
    "построили ещё при его деде. В деревне говорили, что в этом году рыбы будет много, потому "
    "что весной вода поднялась высоко и долго не уходила с лугов.";
const char* kJapanese =
    "朝早く、私は駅まで歩いて行きました。空はまだ暗く、通りにはほとんど人がいませんでした。"
    "小さなパン屋の前を通ると、焼きたてのパンの香りがして、思わず足を止めてしまいました。"
    "店の主人は毎朝四時に起きて、生地をこねるそうです。駅に着くと、始発の電車がちょうどホーム"
    "に入ってくるところでした。車内は静かで、窓の外には田んぼと山が広がっていました。しばらく"
    "すると東の空が明るくなり、遠くの山の上に太陽が顔を出しました。私はその景色を見ながら、"
    "子供のころに祖父と一緒に見た日の出のことを思い出しました。祖父はいつも、早起きは三文の徳"
    "だと言っていました。今になって、その言葉の意味が少し分かるような気がします。";
const char* kPolish =
    "Wczoraj wieczorem poszliśmy z babcią na długi spacer nad jezioro. Pogoda była piękna, "
    "choć od strony lasu wiał chłodny wiatr. Babcia opowiadała nam o czasach, kiedy jako młoda "
    "dziewczyna pracowała w małej piekarni w centrum miasteczka. Codziennie wstawała przed "
    "świtem, żeby przygotować ciasto na chleb i bułki. Mówiła, że najważniejsza jest "
    "cierpliwość, bo dobre ciasto musi rosnąć powoli, a źródłem smaku jest dobra mąka. Gdy "
    "doszliśmy do brzegu, słońce zachodziło już za drzewami, a na wodzie pojawiły się złote i "
    "różowe odblaski. Dzieci rzucały kamyki do wody i liczyły, ile razy się odbiją. Wracaliśmy "
    "do domu w ciszy, każdy zamyślony nad swoimi sprawami, a w oddali szczekały psy z "
    "sąsiedniej wsi.";
const char* kChinese =
    "清晨的时候，我沿着河边慢慢地散步。河水很清，可以看见水底的石头和游来游去的小鱼。岸边的"
    "柳树刚刚长出嫩绿的叶子，微风吹过，柳枝轻轻地摆动，好像在向行人打招呼。远处的山上还笼罩"
    "着一层薄薄的雾气，太阳从山后慢慢升起来，把天空染成了淡淡的红色。路上有几位老人在打太极"
    "拳，他们的动作又慢又稳，看起来非常悠闲。一个小男孩牵着一只小狗跑过来，小狗一边跑一边叫，"
    "逗得大家都笑了。我在一张长椅上坐下来，拿出一本书，可是风景太美了，我几乎没有看几页。回家"
    "的路上，我买了一些新鲜的蔬菜和水果，心里觉得十分满足。";

struct Lang {
  const char* code;
  const char* text;
  const char* charset;   // what the page is written in (ICU's name)
  const char* resolved;  // what the reader reports (WHATWG's decoder for the label)
};
const Lang kLangs[] = {{"ru", kRussian, "windows-1251", "windows-1251"},
                       {"ja", kJapanese, "Shift_JIS", "windows-31j"},
                       {"pl", kPolish, "ISO-8859-2", "iso-8859-2"},
                       {"zh", kChinese, "GB18030", "gb18030"}};

// `utf8` in `charset`, through ICU; a character the charset lacks fails the test.
std::string encode(const std::string& utf8, const char* charset) {
  UErrorCode e = U_ZERO_ERROR;
  UConverter* from = ucnv_open("UTF-8", &e);
  UConverter* to = ucnv_open(charset, &e);
  EXPECT_TRUE(U_SUCCESS(e)) << charset;
  ucnv_setFromUCallBack(to, UCNV_FROM_U_CALLBACK_STOP, nullptr, nullptr, nullptr, &e);
  std::string out(utf8.size() * 4 + 16, '\0');
  char* t = out.data();
  const char* s = utf8.data();
  ucnv_convertEx(to, from, &t, out.data() + out.size(), &s, utf8.data() + utf8.size(), nullptr,
                 nullptr, nullptr, nullptr, true, true, &e);
  EXPECT_TRUE(U_SUCCESS(e)) << charset << ": " << u_errorName(e);
  out.resize(size_t(t - out.data()));
  ucnv_close(to);
  ucnv_close(from);
  return out;
}

// One gzip member (zlib's deflate with windowBits 15 + 16).
std::string gzip(const std::string& bytes, int level = 6) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(bytes.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = uInt(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

struct Rec {
  std::string type, uri, date, id, content_type, block;
  std::string extra = {};  // more header lines, each ending in \r\n
};

std::string warc_record(const std::string& version, const Rec& r) {
  // WARC/1.0 writers often put the target URI in angle brackets; 1.1 does not.
  const std::string uri = version == "1.0" ? "<" + r.uri + ">" : r.uri;
  std::string h = "WARC/" + version + "\r\nWARC-Type: " + r.type + "\r\n";
  if (!r.id.empty()) h += "WARC-Record-ID: <urn:uuid:" + r.id + ">\r\n";
  h += "WARC-Date: " + r.date + "\r\n";
  if (!r.uri.empty()) h += "WARC-Target-URI: " + uri + "\r\n";
  if (!r.content_type.empty()) h += "Content-Type: " + r.content_type + "\r\n";
  h += r.extra;
  h += fmt::format("Content-Length: {}\r\n\r\n", r.block.size());
  return h + r.block + "\r\n\r\n";
}

std::string http(const std::string& status, const std::string& content_type,
                 const std::string& body, const std::string& extra = "") {
  std::string h = "HTTP/1.1 " + status + "\r\nServer: test\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  return h + extra + fmt::format("Content-Length: {}\r\n\r\n", body.size()) + body;
}

enum class Pack { Plain, GzipPerRecord, GzipWhole };
const char* pack_name(Pack p) {
  return p == Pack::Plain ? "plain" : p == Pack::GzipPerRecord ? "gzip per record" : "gzip whole";
}

// The file's bytes, and where each record starts in it (the member's offset
// for gzip per record; the decompressed offset otherwise).
std::string pack(const std::vector<std::string>& records, Pack p,
                 std::vector<int64_t>* starts = nullptr) {
  std::string all;
  for (const std::string& r : records) {
    if (starts) starts->push_back(int64_t(all.size()));
    all += p == Pack::GzipPerRecord ? gzip(r) : r;
  }
  return p == Pack::GzipWhole ? gzip(all) : all;
}

enum class Declare { Header, Meta, MetaHttpEquiv, None };

std::string page(const Lang& l, Declare d) {
  std::string meta;
  if (d == Declare::Meta) meta = fmt::format("<meta charset=\"{}\">", l.charset);
  if (d == Declare::MetaHttpEquiv)
    meta = fmt::format("<META HTTP-EQUIV=\"Content-Type\" CONTENT=\"text/html; charset={}\">",
                       l.charset);
  return "<!DOCTYPE html>\n<html><head>" + meta + "<title>" + l.code +
         "</title></head>\n<body><p>" + l.text + "</p></body></html>\n";
}

struct Read {
  std::vector<InputRecord> recs;
  Counters counts;
  std::vector<Shard> shards;
};

Read read_all(const std::string& path, const std::string& format = "auto", size_t batch = 4096) {
  InputOptions opt;
  opt.paths = {path};
  opt.format = format;
  Read r;
  r.shards = plan_shards(opt);
  for (const Shard& s : r.shards) {
    ShardReader reader(s, opt);
    std::vector<InputRecord> batch_recs;
    while (reader.next(batch_recs, batch))
      for (InputRecord& x : batch_recs) r.recs.push_back(std::move(x));
    for (const auto& [k, v] : reader.counts()) r.counts[k] += v;
  }
  return r;
}

std::vector<const InputRecord*> good(const Read& r) {
  std::vector<const InputRecord*> out;
  for (const InputRecord& x : r.recs)
    if (x.ok) out.push_back(&x);
  return out;
}
std::vector<const InputRecord*> bad(const Read& r) {
  std::vector<const InputRecord*> out;
  for (const InputRecord& x : r.recs)
    if (!x.ok) out.push_back(&x);
  return out;
}

std::string uuid(int i) {
  return fmt::format("00000000-0000-4000-8000-{:012d}", i);
}

struct Expected {
  std::string id, url, page, charset, from, text;
};

// A crawl: warcinfo, then per page a request, its response and a metadata
// record; pages in every language x declaration, plus responses to skip.
std::vector<std::string> crawl(const std::string& version, std::vector<Expected>& want) {
  const std::string date =
      version == "1.0" ? "2024-03-01T12:00:00Z" : "2024-03-01T12:00:00.123456Z";
  std::vector<std::string> recs;
  recs.push_back(warc_record(version, {"warcinfo", "", date, uuid(0), "application/warc-fields",
                                       "software: nekton-test\r\nformat: WARC\r\n"}));
  int n = 1;
  for (const Lang& l : kLangs) {
    for (Declare d : {Declare::Header, Declare::Meta, Declare::MetaHttpEquiv, Declare::None}) {
      const std::string url = fmt::format("http://{}.example.com/page{}", l.code, n);
      const std::string src = page(l, d);
      const std::string ct = d == Declare::Header ? fmt::format("text/html; charset={}", l.charset)
                                                  : std::string("text/html");
      recs.push_back(warc_record(
          version, {"request", url, date, uuid(n * 10), "application/http; msgtype=request",
                    "GET /page HTTP/1.1\r\nHost: example.com\r\n\r\n"}));
      recs.push_back(warc_record(
          version, {"response", url, date, uuid(n * 10 + 1), "application/http; msgtype=response",
                    http("200 OK", ct, encode(src, l.charset)),
                    "WARC-Identified-Payload-Type: text/html\r\n"}));
      recs.push_back(warc_record(version, {"metadata", url, date, uuid(n * 10 + 2),
                                           "application/warc-fields", "fetchTimeMs: 12\r\n"}));
      const char* from = d == Declare::Header ? "header" : d == Declare::None ? "detected" : "meta";
      want.push_back({"urn:uuid:" + uuid(n * 10 + 1), url, src, l.resolved, from, l.text});
      ++n;
    }
  }
  // Skipped responses: an image, a 404 page, a redirect, a DNS lookup; a revisit.
  recs.push_back(warc_record(version, {"response", "http://x.example.com/a.png", date, uuid(900),
                                       "application/http; msgtype=response",
                                       http("200 OK", "image/png", "\x89PNG\r\n\x1a\n....")}));
  recs.push_back(warc_record(version, {"response", "http://x.example.com/gone", date, uuid(901),
                                       "application/http; msgtype=response",
                                       http("404 Not Found", "text/html", "<p>gone</p>")}));
  recs.push_back(warc_record(version, {"response", "http://x.example.com/moved", date, uuid(902),
                                       "application/http; msgtype=response",
                                       http("301 Moved Permanently", "text/html",
                                            "<a href=/x>moved</a>", "Location: /x\r\n")}));
  recs.push_back(warc_record(version, {"response", "dns:x.example.com", date, uuid(903), "text/dns",
                                       "20240301120000\nx.example.com. 60 IN A 1.2.3.4\n"}));
  recs.push_back(warc_record(version, {"revisit", "http://x.example.com/", date, uuid(904),
                                       "application/http; msgtype=response",
                                       "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"}));
  return recs;
}

TEST(Warc, BothVersionsEveryPackingEveryCharset) {
  TempDir dir("nk_warc");
  for (std::string version : {"1.0", "1.1"}) {
    for (Pack p : {Pack::Plain, Pack::GzipPerRecord, Pack::GzipWhole}) {
      SCOPED_TRACE(fmt::format("WARC/{} {}", version, pack_name(p)));
      std::vector<Expected> want;
      const std::string name =
          fmt::format("crawl-{}-{}.warc{}", version, int(p), p == Pack::Plain ? "" : ".gz");
      test::write_file(dir / name, pack(crawl(version, want), p));
      Read r = read_all(dir / name);
      ASSERT_EQ(r.shards.size(), 1u);
      EXPECT_EQ(r.shards[0].format, SourceFormat::Warc);
      EXPECT_TRUE(bad(r).empty()) << bad(r)[0]->where << ": " << bad(r)[0]->error;
      auto docs = good(r);
      ASSERT_EQ(docs.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const Document& d = docs[i]->doc;
        SCOPED_TRACE(want[i].url + " " + want[i].from);
        EXPECT_EQ(d.id, want[i].id);
        EXPECT_EQ(d.meta["url"], want[i].url);
        EXPECT_EQ(d.meta["date"],
                  version == "1.0" ? "2024-03-01T12:00:00Z" : "2024-03-01T12:00:00.123456Z");
        EXPECT_EQ(d.meta["format"], "html");
        EXPECT_EQ(d.meta["charset"], want[i].charset);
        EXPECT_EQ(d.meta["charset_from"], want[i].from);
        EXPECT_TRUE(contains(d.meta["source"], name + "@")) << d.meta["source"];
        EXPECT_FALSE(docs[i]->repaired);
        // The page, transcoded, is the UTF-8 source byte for byte; its text
        // is the source text.
        EXPECT_EQ(d.text, want[i].page);
        EXPECT_EQ(html_to_text(d.text), want[i].text);
      }
      EXPECT_EQ(r.counts["warc_skipped_warcinfo"], 1);
      EXPECT_EQ(r.counts["warc_skipped_request"], 16);
      EXPECT_EQ(r.counts["warc_skipped_metadata"], 16);
      EXPECT_EQ(r.counts["warc_skipped_revisit"], 1);
      EXPECT_EQ(r.counts["warc_skipped_non_html"], 2);  // the image and the DNS record
      EXPECT_EQ(r.counts["warc_skipped_status"], 2);    // 404 and 301
      EXPECT_EQ(r.counts["warc_records"], 1 + 16 * 3 + 5);
      EXPECT_EQ(r.counts["charset_header"], 4);
      EXPECT_EQ(r.counts["charset_meta"], 8);
      EXPECT_EQ(r.counts["charset_detected"], 4);
      EXPECT_EQ(r.counts.count("warc_corrupt_records"), 0u);
    }
  }
}

TEST(Warc, SourcesOfTheCharsetInOrder) {
  // The header wins over the <meta>; a declared charset the bytes are not
  // valid in is passed over; UTF-8 mislabelled as Latin-1 is UTF-8.
  const std::string ru = page(kLangs[0], Declare::None);
  const std::string cp1251 = encode(ru, "windows-1251");
  DecodedText d = decode_to_utf8(cp1251, "windows-1251", true);
  EXPECT_EQ(d.text, ru);
  EXPECT_EQ(d.from, CharsetFrom::Header);

  const std::string ja = page(kLangs[1], Declare::None);
  const std::string sjis = encode(ja, "Shift_JIS");
  d = decode_to_utf8(sjis, "utf-8", true);  // wrong header: not valid UTF-8
  EXPECT_EQ(d.text, ja);
  EXPECT_EQ(d.charset, "windows-31j");
  EXPECT_EQ(d.from, CharsetFrom::Detected);
  EXPECT_TRUE(d.declared_unusable);
  EXPECT_FALSE(d.lossy);

  d = decode_to_utf8(ja, "iso-8859-1", true);  // UTF-8 bytes, Latin-1 label
  EXPECT_EQ(d.text, ja);
  EXPECT_EQ(d.charset, "utf-8");
  EXPECT_TRUE(d.declared_unusable);

  d = decode_to_utf8(cp1251, "x-no-such-charset", true);  // unknown label: detection
  EXPECT_EQ(d.text, ru);
  EXPECT_EQ(d.charset, "windows-1251");
  EXPECT_EQ(d.from, CharsetFrom::Detected);
  EXPECT_TRUE(d.declared_unusable);

  // A byte-order mark decides, and is dropped.
  d = decode_to_utf8("\xEF\xBB\xBF" + ja, "windows-1251", true);
  EXPECT_EQ(d.text, ja);
  EXPECT_EQ(d.from, CharsetFrom::Bom);

  // A multi-byte character cut off at the end (a truncated page) is dropped.
  const std::string zh = encode(kChinese, "GB18030");
  d = decode_to_utf8(zh.substr(0, zh.size() - 1), "gb2312", false);
  EXPECT_FALSE(d.lossy);
  EXPECT_EQ(d.charset, "gb18030");
  std::string cut = kChinese;
  cut.resize(cut.size() - 3);  // the last "。"
  EXPECT_EQ(d.text, cut);

  // Bytes no candidate decodes: the declared charset, with U+FFFD, flagged.
  d = decode_to_utf8(sjis + "\x81\xFF middle " + sjis, "shift_jis", true);
  EXPECT_TRUE(d.lossy);
  EXPECT_EQ(d.charset, "windows-31j");
  EXPECT_EQ(d.from, CharsetFrom::Header);
  EXPECT_EQ(d.text, ja + "\xEF\xBF\xBD\xEF\xBF\xBD middle " + ja);

  // Pure ASCII with nothing declared.
  d = decode_to_utf8("<p>plain</p>", "", true);
  EXPECT_EQ(d.text, "<p>plain</p>");
  EXPECT_EQ(d.charset, "ascii");
}

TEST(Warc, MetaAndHeaderParsing) {
  EXPECT_EQ(charset_param("text/html; charset=UTF-8"), "utf-8");
  EXPECT_EQ(charset_param("text/html;charset=\"Shift_JIS\"; q=1"), "shift_jis");
  EXPECT_EQ(charset_param("text/html; boundary=x; CHARSET = koi8-r "), "koi8-r");
  EXPECT_EQ(charset_param("text/html"), "");
  EXPECT_EQ(meta_charset("<html><head><meta charset=utf-8></head>"), "utf-8");
  EXPECT_EQ(meta_charset("<meta name='x' charset = 'EUC-JP' />"), "euc-jp");
  EXPECT_EQ(meta_charset("<META http-equiv=Content-Type content=\"text/html; "
                         "charset=windows-1250\">"),
            "windows-1250");
  EXPECT_EQ(meta_charset("<meta content='text/html;charset = \"gbk\"' http-equiv='content-type'>"),
            "gbk");
  EXPECT_EQ(meta_charset("<!-- <meta charset=koi8-r> --><meta charset=big5>"), "big5");
  EXPECT_EQ(meta_charset("<metadata charset=koi8-r><meta name=description content=x>"), "");
  EXPECT_EQ(meta_charset(std::string(5000, ' ') + "<meta charset=koi8-r>"), "");  // too late
  EXPECT_EQ(resolve_charset("Latin1"), "windows-1252");
  EXPECT_EQ(resolve_charset("GB2312"), "gb18030");
  EXPECT_EQ(resolve_charset("x-sjis"), "windows-31j");
  EXPECT_EQ(resolve_charset("utf-7"), "");  // forbidden
  EXPECT_EQ(resolve_charset("no-such"), "");
  EXPECT_EQ(resolve_charset(""), "");

  HttpResponse h;
  const std::string lf = "HTTP/1.0 200 OK\nContent-type: text/html\nbogus line\n\n<p>";
  ASSERT_TRUE(parse_http_head(lf, h));
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.content_type, "text/html");
  EXPECT_EQ(h.body_offset, lf.find("<p>"));
  EXPECT_FALSE(parse_http_head("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n", h));
  EXPECT_FALSE(parse_http_head("GET / HTTP/1.1\r\n\r\n", h));
}

TEST(Warc, ChunkedAndCompressedBodies) {
  TempDir dir("nk_warc_chunked");
  const Lang& l = kLangs[2];
  const std::string src = page(l, Declare::Header);
  const std::string enc = encode(src, l.charset);
  // Chunked, then gzip-coded.
  std::string chunked;
  for (size_t i = 0; i < enc.size(); i += 100) {
    std::string part = enc.substr(i, 100);
    chunked += fmt::format("{:x};ext=1\r\n", part.size()) + part + "\r\n";
  }
  chunked += "0\r\n\r\n";
  const std::string ct = std::string("text/html; charset=") + l.charset;
  std::vector<std::string> recs = {
      warc_record("1.1", {"response", "http://a/1", "2024-01-01T00:00:00Z", uuid(1),
                          "application/http; msgtype=response",
                          http("200 OK", ct, chunked, "Transfer-Encoding: chunked\r\n")}),
      warc_record("1.1", {"response", "http://a/2", "2024-01-01T00:00:00Z", uuid(2),
                          "application/http; msgtype=response",
                          http("200 OK", ct, gzip(enc), "Content-Encoding: gzip\r\n")}),
      warc_record("1.1", {"response", "http://a/3", "2024-01-01T00:00:00Z", uuid(3),
                          "application/http; msgtype=response",
                          http("200 OK", ct, enc, "Content-Encoding: br\r\n")}),
  };
  test::write_file(dir / "c.warc.gz", pack(recs, Pack::GzipPerRecord));
  Read r = read_all(dir / "c.warc.gz");
  auto docs = good(r);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0]->doc.text, src);
  EXPECT_EQ(docs[1]->doc.text, src);
  EXPECT_EQ(r.counts["warc_skipped_content_encoding"], 1);
}

// Where the record that starts at byte `off` of `file` is reported.
std::string at(const std::string& file, int64_t off) {
  return fmt::format("{}@{}", file, off);
}

std::vector<std::string> three(const std::string& version = "1.1") {
  std::vector<std::string> out;
  for (int i = 0; i < 3; ++i) {
    const Lang& l = kLangs[size_t(i)];
    out.push_back(
        warc_record(version, {"response", fmt::format("http://{}.example.com/", l.code),
                              "2024-01-01T00:00:00Z", uuid(i), "application/http; msgtype=response",
                              http("200 OK", std::string("text/html; charset=") + l.charset,
                                   encode(page(l, Declare::Header), l.charset))}));
  }
  return out;
}

std::vector<std::string> urls(const Read& r) {
  std::vector<std::string> out;
  for (const InputRecord* x : good(r)) out.push_back(x->doc.meta["url"]);
  return out;
}

const std::vector<std::string> kAC = {"http://ru.example.com/", "http://pl.example.com/"};
const std::vector<std::string> kAB = {"http://ru.example.com/", "http://ja.example.com/"};

TEST(Warc, CorruptHeaderIsSkippedAndNamed) {
  TempDir dir("nk_warc_bad_header");
  struct Case {
    const char* name;
    std::string (*damage)(std::string);
    const char* says;
  };
  const Case cases[] = {
      {"no Content-Length",
       [](std::string r) {
         size_t p = r.find("Content-Length:");
         return r.replace(p, 15, "Content-Lengxh:");
       },
       "no Content-Length"},
      {"bad Content-Length",
       [](std::string r) {
         size_t p = r.find("Content-Length: ") + 16;
         return r.substr(0, p) + "x" + r.substr(p);
       },
       "invalid Content-Length"},
      {"not WARC", [](std::string r) { return r.replace(0, 4, "WURC"); }, "not a WARC record"},
      {"garbage line",
       [](std::string r) {
         size_t p = r.find("\r\n") + 2;
         return r.substr(0, p) + "junk\r\n" + r.substr(p);
       },
       "malformed WARC header line"},
  };
  for (const Case& c : cases) {
    for (Pack p : {Pack::Plain, Pack::GzipPerRecord, Pack::GzipWhole}) {
      SCOPED_TRACE(fmt::format("{}, {}", c.name, pack_name(p)));
      std::vector<std::string> recs = three();
      recs[1] = c.damage(recs[1]);
      std::vector<int64_t> starts;
      const std::string file =
          dir / fmt::format("h{}.warc{}", int(p), p == Pack::Plain ? "" : ".gz");
      test::write_file(file, pack(recs, p, &starts));
      Read r = read_all(file);
      EXPECT_EQ(urls(r), kAC);
      ASSERT_EQ(bad(r).size(), 1u);
      const InputRecord& b = *bad(r)[0];
      // Per record: the member's offset; whole-file: member 0 plus the record's offset in it.
      EXPECT_EQ(b.where, p == Pack::GzipWhole ? fmt::format("{}@0+{}", file, starts[1])
                                              : at(file, starts[1]));
      EXPECT_EQ(b.doc.id, b.where);
      EXPECT_TRUE(contains(b.error, c.says)) << b.error;
      EXPECT_EQ(r.counts["warc_corrupt_records"], 1);
    }
  }
}

TEST(Warc, TruncatedFilesKeepWhatCameBefore) {
  TempDir dir("nk_warc_truncated");
  for (Pack p : {Pack::Plain, Pack::GzipPerRecord, Pack::GzipWhole}) {
    for (double keep : {0.5, 0.99}) {
      SCOPED_TRACE(fmt::format("{}, cut at {}", pack_name(p), keep));
      std::vector<int64_t> starts;
      std::string bytes = pack(three(), p, &starts);
      const std::string file =
          dir / fmt::format("t{}.warc{}", int(p), p == Pack::Plain ? "" : ".gz");
      // Cut inside the last record (for a whole-file gzip, inside the stream).
      int64_t from = p == Pack::GzipWhole ? int64_t(bytes.size()) / 2 : starts[2];
      int64_t cut = from + int64_t(double(int64_t(bytes.size()) - from) * keep);
      if (cut >= int64_t(bytes.size())) cut = int64_t(bytes.size()) - 1;
      test::write_file(file, bytes.substr(0, size_t(cut)));
      Read r = read_all(file);
      ASSERT_EQ(bad(r).size(), 1u);
      const InputRecord& b = *bad(r)[0];
      if (p == Pack::GzipWhole) {
        // The stream ends somewhere: the records before the cut are kept.
        EXPECT_TRUE(contains(b.where, file + "@0")) << b.where;
        EXPECT_TRUE(contains(b.error, "truncated gzip member at offset 0")) << b.error;
        EXPECT_LE(good(r).size(), 2u);
        EXPECT_GE(good(r).size(), 1u);
      } else {
        EXPECT_EQ(urls(r), kAB);
        EXPECT_EQ(b.where, at(file, starts[2]));
        EXPECT_TRUE(contains(b.error, p == Pack::Plain ? "Content-Length"
                                                       : "truncated gzip member at offset " +
                                                             std::to_string(starts[2])))
            << b.error;
      }
      for (const InputRecord* g : good(r)) EXPECT_FALSE(g->repaired);
    }
  }
  // A Content-Length that runs past the end of a plain file.
  std::vector<std::string> recs = three();
  size_t p = recs[2].find("Content-Length: ") + 16;
  recs[2] = recs[2].substr(0, p) + "9" + recs[2].substr(p);
  std::vector<int64_t> starts;
  test::write_file(dir / "long.warc", pack(recs, Pack::Plain, &starts));
  Read r = read_all(dir / "long.warc");
  EXPECT_EQ(urls(r), kAB);
  ASSERT_EQ(bad(r).size(), 1u);
  EXPECT_EQ(bad(r)[0]->where, at(dir / "long.warc", starts[2]));
  EXPECT_TRUE(contains(bad(r)[0]->error, "Content-Length")) << bad(r)[0]->error;
}

TEST(Warc, DamagedGzipMembersAreSkippedAndNamed) {
  TempDir dir("nk_warc_gzip");
  std::vector<int64_t> starts;
  const std::string good_bytes = pack(three(), Pack::GzipPerRecord, &starts);
  const int64_t len1 = starts[2] - starts[1];
  struct Case {
    const char* name;
    std::string bytes;
    const char* says;
  };
  std::vector<Case> cases;
  {
    std::string b = good_bytes;
    b[size_t(starts[1] + 3)] = char(0xE0);  // reserved header flags
    cases.push_back({"header flags", b, "corrupt gzip data in the member at offset"});
  }
  {
    std::string b = good_bytes;
    b[size_t(starts[2] - 8)] ^= 0x55;  // the member's CRC
    cases.push_back({"crc", b, "incorrect data check"});
  }
  {
    std::string b = good_bytes;
    b[size_t(starts[2] - 3)] ^= 0x01;  // the member's length
    cases.push_back({"length", b, "incorrect length check"});
  }
  {
    std::string b = good_bytes;
    b.replace(size_t(starts[1]), 3, "XYZ");  // not gzip at all
    cases.push_back({"not gzip", b, "are not gzip data"});
  }
  {
    std::string b = good_bytes;  // member 1 cut in half, member 2 right after
    b.erase(size_t(starts[1] + len1 / 2), size_t(len1 - len1 / 2));
    cases.push_back({"half a member", b, "corrupt gzip data in the member at offset"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = dir / "g.warc.gz";
    test::write_file(file, c.bytes);
    Read r = read_all(file);
    EXPECT_EQ(urls(r), kAC);
    ASSERT_EQ(bad(r).size(), 1u);
    EXPECT_EQ(bad(r)[0]->where, at(file, starts[1]));
    EXPECT_TRUE(contains(bad(r)[0]->error, c.says)) << bad(r)[0]->error;
  }
  // Random damage inside member 1's deflate data: never fatal; the records
  // around it are kept; the damaged one is kept only if it reads back intact.
  std::mt19937 rng(7);
  const std::string src = page(kLangs[1], Declare::Header);
  for (int trial = 0; trial < 200; ++trial) {
    std::string b = good_bytes;
    std::uniform_int_distribution<int64_t> pos(starts[1] + 10, starts[2] - 9);
    for (int k = 0; k < 1 + trial % 4; ++k) b[size_t(pos(rng))] ^= char(1 << (rng() % 8));
    const std::string file = dir / "r.warc.gz";
    test::write_file(file, b);
    Read r = read_all(file);
    auto u = urls(r);
    ASSERT_GE(u.size(), 2u) << trial;
    EXPECT_EQ(u.front(), kAC[0]) << trial;
    EXPECT_EQ(u.back(), kAC[1]) << trial;
    if (u.size() == 3) {
      EXPECT_EQ(good(r)[1]->doc.text, src) << trial;
    } else {
      ASSERT_FALSE(bad(r).empty()) << trial;
      EXPECT_EQ(bad(r)[0]->where, at(file, starts[1])) << trial;
    }
  }
}

TEST(Warc, GarbageBetweenRecordsInAPlainFile) {
  TempDir dir("nk_warc_garbage");
  std::vector<std::string> recs = three();
  recs.insert(recs.begin() + 1, "this is not a record\r\n\r\n");
  std::vector<int64_t> starts;
  test::write_file(dir / "x.warc", pack(recs, Pack::Plain, &starts));
  Read r = read_all(dir / "x.warc");
  EXPECT_EQ(r.recs.size(), 4u);
  EXPECT_EQ(good(r).size(), 3u);
  ASSERT_EQ(bad(r).size(), 1u);
  EXPECT_EQ(bad(r)[0]->where, at(dir / "x.warc", starts[1]));
}

TEST(Warc, WetFilesArePlainText) {
  TempDir dir("nk_wet");
  std::vector<std::string> recs = {
      warc_record("1.0", {"warcinfo", "", "2024-01-01T00:00:00Z", uuid(0),
                          "application/warc-fields", "isPartOf: CC-MAIN-test\r\n"})};
  int i = 1;
  for (const Lang& l : kLangs)
    recs.push_back(
        warc_record("1.0", {"conversion", fmt::format("http://{}.example.com/", l.code),
                            "2024-01-01T00:00:00Z", uuid(i++), "text/plain", std::string(l.text),
                            "WARC-Refers-To: <urn:uuid:x>\r\nWARC-Block-Digest: sha1:X\r\n"}));
  // A conversion record that says its charset.
  recs.push_back(
      warc_record("1.0", {"conversion", "http://ru.example.com/2", "2024-01-01T00:00:00Z", uuid(9),
                          "text/plain; charset=windows-1251", encode(kRussian, "windows-1251")}));
  const std::string file = dir / "CC-MAIN-test.warc.wet.gz";
  test::write_file(file, pack(recs, Pack::GzipPerRecord));
  Read r = read_all(file);
  ASSERT_EQ(r.shards.size(), 1u);
  EXPECT_EQ(r.shards[0].format, SourceFormat::Wet);
  auto docs = good(r);
  ASSERT_EQ(docs.size(), 5u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(docs[k]->doc.text, kLangs[k].text);
    EXPECT_EQ(docs[k]->doc.meta["format"], "text");
    EXPECT_EQ(docs[k]->doc.meta["charset"], "utf-8");
    EXPECT_EQ(docs[k]->doc.meta["url"], fmt::format("http://{}.example.com/", kLangs[k].code));
  }
  EXPECT_EQ(docs[4]->doc.text, kRussian);
  EXPECT_EQ(docs[4]->doc.meta["charset_from"], "header");
  EXPECT_EQ(r.counts["warc_skipped_warcinfo"], 1);
  // format: wet forced on a file of another name reads the same.
  fs::copy_file(file, dir / "renamed.bin");
  EXPECT_EQ(good(read_all(dir / "renamed.bin", "wet")).size(), 5u);
}

TEST(Warc, FormatByNameAndFolders) {
  TempDir dir("nk_warc_names");
  std::vector<Expected> want;
  const std::string w = pack(crawl("1.1", want), Pack::GzipPerRecord);
  fs::create_directories(dir / "in");
  test::write_file(dir / "in/a.warc.gz", w);
  test::write_file(dir / "in/b.WARC", pack(three(), Pack::Plain));
  test::write_file(dir / "in/c.wat.gz", w);  // WAT: metadata, not read
  test::write_file(dir / "in/d.txt", "text");
  InputOptions opt;
  opt.paths = {dir / "in"};
  std::vector<Shard> s = plan_shards(opt);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].format, SourceFormat::Warc);
  EXPECT_EQ(s[1].format, SourceFormat::Warc);
  EXPECT_EQ(s[2].format, SourceFormat::Text);
  opt.format = "warcs";
  EXPECT_TRUE(contains(test::error_of([&] { plan_shards(opt); }), "warc or wet"));
}

TEST(Warc, PipelineEndToEnd) {
  TempDir dir("nk_warc_pipeline");
  std::vector<Expected> want;
  test::write_file(dir / "crawl.warc.gz", pack(crawl("1.1", want), Pack::GzipPerRecord));
  // A damaged copy beside it: its good records still count.
  std::vector<int64_t> starts;
  std::string damaged = pack(three(), Pack::GzipPerRecord, &starts);
  test::write_file(dir / "damaged.warc.gz", damaged.substr(0, size_t(starts[2] + 20)));
  test::write_file(dir / "p.yaml", fmt::format(R"(input:
  paths: [{0}/crawl.warc.gz, {0}/damaged.warc.gz]
output:
  dir: {0}/out
batch_mb: 1
stages:
  - type: html_to_text
)",
                                               dir.path().string()));
  PipelineConfig cfg = load_pipeline_config(dir / "p.yaml", {});
  CurateReport rep = run_pipeline(cfg, RunOptions{});
  EXPECT_EQ(rep.shards, 2);
  EXPECT_EQ(rep.output_docs, int64_t(want.size()) + 2);
  EXPECT_EQ(rep.bad_records, 1);
  EXPECT_EQ(rep.input_counts["warc_skipped_request"], 16);
  EXPECT_EQ(rep.input_counts["warc_corrupt_records"], 1);
  EXPECT_EQ(rep.input_counts["charset_detected"], 4);

  std::string data = test::read_file(dir / "out/data/shard_00000.jsonl");
  std::vector<nlohmann::json> recs;
  for (size_t pos = 0; pos < data.size();) {
    size_t nl = data.find('\n', pos);
    recs.push_back(nlohmann::json::parse(data.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  ASSERT_EQ(recs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(recs[i]["id"], want[i].id);
    EXPECT_EQ(recs[i]["text"], want[i].text);
    EXPECT_EQ(recs[i]["url"], want[i].url);
    EXPECT_EQ(recs[i]["date"], "2024-03-01T12:00:00.123456Z");
    EXPECT_EQ(recs[i]["charset"], want[i].charset);
  }
  std::string removed = test::read_file(dir / "out/removed/shard_00001.jsonl");
  EXPECT_TRUE(contains(removed, fmt::format("damaged.warc.gz@{}", starts[2]))) << removed;
  EXPECT_TRUE(contains(removed, "truncated gzip member")) << removed;
  nlohmann::json j = nlohmann::json::parse(test::read_file(dir / "out/report.json"));
  EXPECT_EQ(j["input_counts"]["warc_skipped_non_html"], 2);
}

}  // namespace
}  // namespace nk::curate
