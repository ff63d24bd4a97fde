#pragma once
// How long the rest of a job will take, from how long its finished part took: the one estimate and
// the one duration format behind every progress line kvbench prints (grid cells, long prefills,
// `kvbench train`, the method tools' training and search loops), so that they all read alike.
// Torch-free.
//
//   ProgressMeter meter("prefill", total_tokens, "tokens", log);
//   for (...) meter.update(done_tokens);   // "prefill 8192/32768 tokens (25%), 31s elapsed, ETA
//   1m33s" meter.finish(total_tokens);
//
// A command that runs a long list of jobs (a grid's cells; the planned `kvbench reproduce`'s runs)
// counts them with a ProgressMeter of its own and passes its sink down, so the inner meters (a
// run's prefill) print beside it.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace kvb {

// "42s", "3m07s", "1h05m" (rounded to the second); "?" for a negative or non-finite value.
std::string format_duration(double seconds);

// Seconds left at the average rate so far: elapsed / done * (total - done). NaN before anything is
// done (no rate yet); 0 once done >= total.
double eta_seconds(double elapsed_s, double done, double total);

// Seconds since it was made, on a monotonic clock.
class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// "31s elapsed, ETA 1m33s": how every progress line counted in steps or units ends.
std::string elapsed_and_eta(double elapsed_s, double done, double total);

// A progress line for a long loop, throttled in time: nothing for a loop that ends within
// `first_after_s` (short prefills stay silent), then at most one line every `every_s`.
class ProgressMeter {
 public:
  using Sink = std::function<void(const std::string& line)>;
  using Clock = std::function<double()>;  // seconds on a monotonic clock

  ProgressMeter(std::string what, int64_t total, std::string unit, Sink sink,
                double first_after_s = 2.0, double every_s = 10.0, Clock clock = {});

  // `done` units of `total` are finished; prints a line when one is due. Returns whether it did.
  bool update(int64_t done);
  // The loop is over: prints a last line (with the total time) only when earlier lines were
  // printed.
  void finish(int64_t done);
  // The line for `done` units at the current time (printed or not).
  std::string line(int64_t done) const;
  bool printed() const { return printed_; }

 private:
  double now() const;

  std::string what_, unit_;
  int64_t total_ = 0;
  Sink sink_;
  double first_after_s_, every_s_;
  Clock clock_;
  double t0_ = 0, last_ = 0;
  bool printed_ = false;
};

}  // namespace kvb
