// Progress of long work on stderr (curate, preprocess, import, export,
// quantize): on a terminal one line that updates in place; elsewhere (a pipe,
// a file, a CI log) a plain "[info]" line at most every `log_every_s`, so a
// log holds a handful of lines rather than one per update.
//
//   Progress p("export gguf", ProgressMode::Auto);
//   p.start(total_bytes, "B");
//   for (...) p.advance(bytes);   // any thread
//   p.finish();
// draws  "export gguf [######..........]  37.5%  120.0/320.0 MB  85.2 MB/s  ETA 0:02".
// Commands that format their own line (curate, preprocess) call show().
#pragma once
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

namespace nk {

enum class ProgressMode {
  Auto,  // Bar when stderr is a terminal, else Log
  Bar,
  Log,
  None
};
// "auto", "bar", "log" or "none"; nk::Error naming `key` otherwise.
ProgressMode parse_progress_mode(const std::string& value, const std::string& key);

class Progress {
 public:
  // `out` (tests): where lines go instead of stderr; Auto then asks whether
  // it is a terminal.
  explicit Progress(std::string label, ProgressMode mode = ProgressMode::Auto,
                    double log_every_s = 10.0, FILE* out = nullptr);
  ~Progress();  // an open bar line is ended, so an error prints on a line of its own
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  ProgressMode mode() const { return mode_; }  // Bar, Log or None (Auto resolved)
  // Least time between two lines: 0.25 s for the bar, log_every_s for Log.
  double every_s() const { return every_s_; }

  // Counted work: `total` units named `unit` ("B": shown as MB and MB/s).
  void start(double total, std::string unit);
  void advance(double n);      // thread-safe; draws when every_s() has passed
  void set_done(double done);  // as advance, to an absolute count
  // The work is done: the last bar line, at 100 %, with its newline; no line
  // in Log mode (the command prints its own summary).
  void finish();

  // Free-form: `text` after the label, now if `final` or every_s() has passed.
  // Bar: the updating line (ended by a final one); Log: a plain line (final
  // ones included).
  void show(const std::string& text, bool final = false);
  // Ends an open bar line now, so an error message that follows starts a line.
  void end_line();

 private:
  void draw(const std::string& text, bool final);  // mu_ held
  void maybe_draw();                               // mu_ held
  std::string counted_text() const;
  std::string label_;
  ProgressMode mode_;
  double every_s_;
  FILE* out_;
  std::mutex mu_;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_ = Clock::now(), last_{};
  double total_ = 0, done_ = 0;
  std::string unit_;
  bool open_ = false;  // a bar line is on screen without its newline
};

// "[#####.....]": `width` cells, `fraction` of them filled.
std::string progress_bar(double fraction, int width);
// "M:SS", or "H:MM:SS" from an hour on.
std::string format_eta(double seconds);

}  // namespace nk
