#include "harness/report/leaderboard.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/strings.h"
#include "harness/common/text_escape.h"
#include "harness/eval/grid.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/run_config.h"
#include "harness/kv/baseline_method.h"
#include "harness/kv/method_registry.h"
#include "harness/metrics/metric_table.h"
#include "harness/report/sample_stats.h"
#include "harness/store/config_hash.h"

namespace kvb {

namespace {

using json = nlohmann::json;


// True when a is at least as good as b under `dir` (and strictly better when strict).
bool at_least(double a, double b, Direction dir, bool strict) {
  if (dir == Direction::kHigher) return strict ? a > b : a >= b;
  return strict ? a < b : a <= b;
}

std::string default_metric(const std::string& protocol, const std::vector<std::map<std::string, double>>& runs) {
  auto present = [&](const std::string& n) {
    for (const auto& m : runs)
      if (m.count(n) && std::isfinite(m.at(n))) return true;
    return false;
  };
  const std::string& own = ProtocolRegistry::instance().report(protocol).default_metric;
  if (!own.empty() && present(own)) return own;
  if (present("accuracy")) return "accuracy";
  for (const auto& m : all_metrics())  // task metrics first ("accuracy when present")
    if (m.unit == "fraction" && present(std::string(m.name))) return std::string(m.name);
  for (const auto& m : all_metrics())
    if (present(std::string(m.name))) return std::string(m.name);
  return runs.empty() || runs[0].empty() ? "" : runs[0].begin()->first;
}

std::string settings_value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

// Escaped, with a line-break opportunity after each "(" and "," so a long method label wraps at its
// parameters in a narrow table instead of widening the page.
std::string html_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    o += html_escape(std::string(1, c));
    if (c == '(' || c == ',') o += "<wbr>";
  }
  return o;
}

std::string md_escape(const std::string& s) { return markdown_cell(s); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string signed_value(double v) { return (v > 0 ? "+" : "") + format_value(v); }

std::string arrow(Direction d) { return d == Direction::kHigher ? " ↑" : d == Direction::kLower ? " ↓" : ""; }

std::string direction_text(Direction d) {
  return d == Direction::kHigher ? "higher is better" : d == Direction::kLower ? "lower is better" : "";
}

std::string bytes_text(double v) { return std::isfinite(v) ? fmt("%.0f", v) : "–"; }
std::string ratio_text(double v) { return std::isfinite(v) ? fmt("%.2f", v) + "×" : "–"; }
// The ratio over all tiers, and the device's own when a method keeps copies on the host (tiering).
std::string ratio_text(const LeaderRow& r) {
  std::string s = ratio_text(r.compression_ratio);
  const double host = metric_or_nan(r.metrics, "host_bytes") + metric_or_nan(r.metrics, "remote_bytes");
  const double dev = metric_or_nan(
      r.metrics, r.bytes_16bit ? "device_compression_ratio_16bit" : "device_compression_ratio");
  if (std::isfinite(host) && host > 0 && std::isfinite(dev)) s += " (device " + ratio_text(dev) + ")";
  return s;
}
std::string tok_s_text(const std::optional<double>& v) { return v ? fmt("%.0f", *v) : "–"; }
std::string percent_text(double v) { return std::isfinite(v) ? fmt("%.1f", 100 * v) + "%" : "–"; }

std::string pareto_text(const LeaderRow& r) {
  std::string s;
  if (r.pareto_memory) s += "★";
  if (r.pareto_throughput) s += s.empty() ? "⚡" : " ⚡";
  return s;
}

std::string table_title(const LeaderTable& t) {
  std::string s = t.model + " · " + t.dataset + " · " + t.protocol;
  if (!t.settings_text.empty()) s += " (" + t.settings_text + ")";
  return s;
}

std::string metric_caption(const LeaderTable& t) {
  std::string unit = t.unit.empty() ? "" : t.unit + ", ";
  return t.metric + " (" + unit + direction_text(t.direction) + ")";
}

std::string delta_note(const LeaderTable& t, const LeaderboardOptions& o) {
  if (t.baseline_hash.empty() && t.embedded_baseline)
    return "No full-cache run in this group: Δ accuracy pairs each answer with the full cache's answer "
           "stored in the same sample; 95% paired bootstrap CI (" +
           std::to_string(o.n_resamples) + " resamples, seed " + std::to_string(o.seed) + ").";
  const std::string& exact_note = ProtocolRegistry::instance().report(t.protocol).exact_delta_note;
  if (!t.baseline_hash.empty() && !exact_note.empty()) return exact_note;
  if (!t.baseline_hash.empty() && t.baseline_samples < 2)
    return "Δ = method − full cache on a single sample (perf: one cell per batch size), so no confidence "
           "interval; timings are medians over the protocol's repeats.";
  if (t.baseline_hash.empty())
    return "No full-cache run in this group: no differences or confidence intervals (add method `full` "
           "to the grid).";
  return "Δ = method − full cache, paired by sample over " + std::to_string(t.baseline_samples) +
         (t.baseline_samples == 1 ? " sample" : " samples") + "; 95% paired bootstrap CI (" + std::to_string(o.n_resamples) + " resamples, seed " +
         std::to_string(o.seed) + ").";
}

std::string baseline_note(const LeaderTable& t, const LeaderboardOptions& o) {
  const bool ties = std::any_of(t.rows.begin(), t.rows.end(), [](const LeaderRow& r) { return r.tied_above; });
  return delta_note(t, o) + (ties ? " =N: tied with the first row ranked N (their paired 95% "
                                    "interval, over their common samples, holds 0), so it shares "
                                    "that rank."
                                  : "");
}

// ---------------------------------------------------------------- SVG charts

struct Pt {
  double x, y;
  std::string label, method;
  bool frontier, baseline, simulated;
};

std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
  const double range = hi - lo;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string tick_text(double v) {
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e5 || a < 1e-3) return fmt("%.0e", v);
  return fmt("%g", v);
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double p0 = 0, p1 = 1;  // pixel range
  double map(double v) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
                         : (v - lo) / (hi - lo);
    return p0 + t * (p1 - p0);
  }
  std::vector<double> ticks() const {
    if (!log) return nice_ticks(lo, hi);
    std::vector<double> t;
    for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e)
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, e);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
      }
    return t;
  }
};

Axis make_axis(std::vector<double> v, double p0, double p1, bool allow_log) {
  Axis a;
  a.p0 = p0;
  a.p1 = p1;
  double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  if (allow_log && lo > 0 && hi / lo >= 8) {
    a.log = true;
    a.lo = lo / 1.25;
    a.hi = hi * 1.25;
    return a;
  }
  if (hi == lo) {
    const double d = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= d;
    hi += d;
  } else {
    const double pad = (hi - lo) * 0.08;
    // Keep a non-negative quantity's axis from dipping far below zero.
    lo = (lo >= 0 && lo - pad < 0) ? -pad * 0.25 : lo - pad;
    hi += pad;
  }
  a.lo = lo;
  a.hi = hi;
  return a;
}

std::string svg_scatter(const std::vector<Pt>& pts, const std::string& kind, const std::string& title,
                        const std::string& xlabel, const std::string& ylabel, bool frontier_line) {
  const double W = 1180, H = 470, L = 80, R = 30, T = 34, B = 54;
  std::vector<double> xs, ys;
  for (const auto& p : pts) {
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  Axis ax = make_axis(xs, L, W - R, true), ay = make_axis(ys, H - B, T, false);
  std::ostringstream s;
  s << "<svg class=\"chart chart-" << kind << "\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W
    << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" role=\"img\" aria-label=\""
    << html_escape(title) << "\">\n";
  s << "<text class=\"ctitle\" x=\"" << L << "\" y=\"20\">" << html_escape(title) << "</text>\n";
  s << "<rect class=\"plot\" x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - R - L << "\" height=\""
    << H - B - T << "\"/>\n";
  for (double t : ax.ticks()) {
    const double x = ax.map(t);
    s << "<line class=\"grid\" x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << H - B << "\"/>"
      << "<text class=\"tick\" x=\"" << x << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">" << tick_text(t)
      << "</text>\n";
  }
  for (double t : ay.ticks()) {
    const double y = ay.map(t);
    s << "<line class=\"grid\" x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << W - R << "\" y2=\"" << y << "\"/>"
      << "<text class=\"tick\" x=\"" << L - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << tick_text(t)
      << "</text>\n";
  }
  s << "<text class=\"axis\" x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">"
    << html_escape(xlabel + (ax.log ? " (log scale)" : "")) << "</text>\n";
  s << "<text class=\"axis\" transform=\"translate(16," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << html_escape(ylabel) << "</text>\n";
  if (frontier_line) {
    std::vector<Pt> f;
    for (const auto& p : pts)
      if (p.frontier) f.push_back(p);
    std::sort(f.begin(), f.end(), [](const Pt& a, const Pt& b) { return a.x < b.x || (a.x == b.x && a.y < b.y); });
    if (f.size() >= 2) {
      s << "<polyline class=\"frontier\" points=\"";
      for (const auto& p : f) s << ax.map(p.x) << "," << ay.map(p.y) << " ";
      s << "\"/>\n";
    }
  }
  // Points (coloured by method; frontier points ringed; simulated ones hollow), then labels placed
  // greedily at the first candidate spot that overlaps neither another label nor a point.
  struct Box {
    double x0, y0, x1, y1;
  };
  auto overlaps = [](const Box& a, const Box& b) { return a.x0 < b.x1 && a.x1 > b.x0 && a.y0 < b.y1 && a.y1 > b.y0; };
  std::vector<Box> placed;
  std::vector<std::pair<double, double>> px(pts.size());
  for (size_t i = 0; i < pts.size(); ++i) {
    px[i] = {ax.map(pts[i].x), ay.map(pts[i].y)};
    placed.push_back({px[i].first - 6, px[i].second - 6, px[i].first + 6, px[i].second + 6});
  }
  static const char* kPalette[] = {"#4a78c2", "#2a9d8f", "#8e5ccf", "#c2474a", "#6b8e23", "#d17a22",
                                   "#3c9fd6", "#b5489a", "#7d6b5a", "#4f5d75", "#c9a227", "#1b998b"};
  std::map<std::string, size_t> colour;
  for (const auto& p : pts) colour.emplace(p.method, 0);
  size_t ci = 0;
  for (auto& [m, c] : colour) c = ci++ % (sizeof kPalette / sizeof kPalette[0]);
  std::ostringstream labels;
  std::vector<size_t> order(pts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return px[a].first < px[b].first || (px[a].first == px[b].first && px[a].second < px[b].second);
  });
  for (size_t i : order) {
    const Pt& p = pts[i];
    const double x = px[i].first, y = px[i].second;
    const std::string fill = p.baseline ? "#1d2330" : kPalette[colour[p.method]];
    s << "<circle class=\"point" << (p.baseline ? " base" : "") << (p.frontier ? " front" : "")
      << (p.simulated ? " sim" : "") << "\" cx=\"" << x << "\" cy=\"" << y << "\" r=\"5.5\" style=\""
      << (p.simulated ? "fill:#fff;stroke:" + fill : "fill:" + fill) << "\" data-label=\"" << html_escape(p.label)
      << "\"><title>" << html_escape(p.label) << ": " << html_escape(xlabel) << " " << format_value(p.x) << ", "
      << html_escape(ylabel) << " " << format_value(p.y) << (p.frontier ? " (Pareto frontier)" : "")
      << "</title></circle>\n";
  }
  for (size_t i : order) {
    const Pt& p = pts[i];
    const double x = px[i].first, y = px[i].second;
    const double w = 6.3 * static_cast<double>(p.label.size()) + 2, h = 12;
    std::vector<std::pair<double, double>> cand = {{x + 9, y + 4},      {x - 9 - w, y + 4}, {x + 6, y - 9},
                                                   {x + 6, y + 18},     {x - 6 - w, y - 9}, {x - 6 - w, y + 18}};
    for (int k = 1; k <= 14; ++k)
      for (double sgn : {-1.0, 1.0}) {
        cand.push_back({x + 9, y + 4 + sgn * k * (h + 1)});
        cand.push_back({x - 9 - w, y + 4 + sgn * k * (h + 1)});
      }
    std::pair<double, double> best = cand[0];
    for (const auto& c : cand) {
      const Box b{c.first, c.second - h + 2, c.first + w, c.second + 2};
      if (b.x0 < L + 2 || b.x1 > W - 2 || b.y0 < T + 1 || b.y1 > H - B - 1) continue;
      bool clash = false;
      for (const auto& o : placed)
        if (overlaps(b, o)) {
          clash = true;
          break;
        }
      if (!clash) {
        best = c;
        break;
      }
    }
    placed.push_back({best.first, best.second - h + 2, best.first + w, best.second + 2});
    labels << "<text class=\"plabel\" x=\"" << best.first << "\" y=\"" << best.second << "\">" << html_escape(p.label)
           << "</text>\n";
    const double ax0 = best.first < x ? best.first + w : best.first, ay0 = best.second - 4;
    if (std::hypot(ax0 - x, ay0 - y) > 16)
      labels << "<line class=\"leader\" x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << ax0 << "\" y2=\"" << ay0
             << "\"/>\n";
  }
  s << labels.str() << "</svg>\n";
  return s.str();
}

std::string delta_html(const DeltaCi& d) {
  if (d.status != "ok" || d.n < 2) return html_escape(format_delta(d));
  return "<span class=\"est\">" + html_escape(signed_value(d.estimate)) + "</span><br><span class=\"int\">[" +
         html_escape(signed_value(d.lo)) + ", " + html_escape(signed_value(d.hi)) + "]</span>";
}

}  // namespace

std::string format_value(double v) {
  if (!std::isfinite(v)) return "–";
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt("%.2e", v);
  if (a >= 1000) return fmt("%.0f", v);
  if (a >= 100) return fmt("%.1f", v);
  if (a >= 10) return fmt("%.2f", v);
  if (a >= 1) return fmt("%.3f", v);
  return fmt("%.4f", v);
}

std::string format_delta(const DeltaCi& d) {
  if (d.status == "ok" && d.n == 0) return signed_value(d.estimate);  // exact (serve)
  if (d.status == "ok" && d.n < 2) return signed_value(d.estimate) + " (no CI)";
  if (d.status == "ok")
    return signed_value(d.estimate) + " [" + signed_value(d.lo) + ", " + signed_value(d.hi) + "]";
  if (d.status == "baseline") return "baseline";
  if (d.status == "no_baseline") return "no full-cache run";
  if (d.status == "no_common_samples") return "no common samples";
  if (d.status == "not_per_sample") return "no per-sample form";
  return "";
}

namespace {

// A run's stored config, refused naming the DB and run when it lacks the shape kvbench writes (a
// foreign or hand-edited DB) instead of failing inside the JSON library as if kvbench had a bug.
json stored_run_config(const std::string& db_path, const RunRow& r) {
  const std::string what = "results DB " + db_path + ": run " + std::to_string(r.id) + " config";
  json cfg = parse_json(r.config_json, what);
  KVB_CHECK(cfg.is_object(), what, ": expected a JSON object, got ", cfg.dump().substr(0, 80));
  KVB_CHECK(cfg.value("model", json("")).is_string(), what, ": 'model' must be a string");
  const json& method = cfg["method"];
  KVB_CHECK(method.is_object() && method.value("name", json()).is_string() &&
                method.value("params", json::object()).is_object(),
            what, ": 'method' must be an object with a string 'name' and an object 'params'");
  if (!method.contains("params")) cfg["method"]["params"] = json::object();
  const json& protocol = cfg["protocol"];
  KVB_CHECK(protocol.is_object() && protocol.value("context", json(0)).is_number_integer(), what,
            ": 'protocol' must be an object (with an integer 'context' where it has one)");
  return cfg;
}

}  // namespace

// Ties: a ranked row whose paired interval against the first row holding the rank above it (the
// ranking metric over their common samples) holds 0 shares that rank. Comparing with the rank's
// first row, not the row just above, keeps ties from chaining: a row clearly below the rank's
// holder gets a rank of its own even when each neighbour is close to the next. Deterministic
// protocols (exact differences) and metrics without a per-sample form are ranked by value alone.
void mark_ties(LeaderTable& t, const LeaderboardOptions& o,
               const std::function<const RunSamples&(int64_t run_id)>& samples) {
  if (!ProtocolRegistry::instance().report(t.protocol).exact_delta_note.empty()) return;
  const SampleMetricDef* def = find_sample_metric(t.protocol, t.metric);
  if (!def) return;
  const LeaderRow* holder = nullptr;  // the first row of the current rank
  for (LeaderRow& row : t.rows) {
    if (row.rank == 0) continue;
    bool tied = false;
    if (holder) {
      const RunSamples& a = samples(row.run_id);
      const RunSamples& b = samples(holder->run_id);
      const PairedSums ps = paired_sums(a, b, *def, common_samples(a, b));
      tied = ps.a_num.empty();
      if (!tied) {
        const BootstrapCi ci =
            paired_ratio_bootstrap(ps, def->exp_transform, o.n_resamples, o.seed, o.confidence);
        tied = ci.lo <= 0.0 && ci.hi >= 0.0;
      }
    }
    if (tied) {
      row.tied_above = true;
      row.rank = holder->rank;
    } else {
      holder = &row;
    }
  }
}

// Orders the rows (done ones by the ranking metric, then bytes per token, then label; failed ones
// last), ranks them, and marks the ties.
void rank_rows(LeaderTable& t, const LeaderboardOptions& o,
               const std::function<const RunSamples&(int64_t run_id)>& samples) {
  // Rank done rows; failed rows last.
  std::stable_sort(t.rows.begin(), t.rows.end(), [&](const LeaderRow& a, const LeaderRow& b) {
    const bool ad = a.status == "done", bd = b.status == "done";
    if (ad != bd) return ad;
    if (!ad) return a.label < b.label;
    const bool af = std::isfinite(a.value), bf = std::isfinite(b.value);
    if (af != bf) return af;
    if (af && a.value != b.value) return at_least(a.value, b.value, t.direction, true);
    const double ab = std::isfinite(a.bytes_per_token) ? a.bytes_per_token : INFINITY;
    const double bb = std::isfinite(b.bytes_per_token) ? b.bytes_per_token : INFINITY;
    if (ab != bb) return ab < bb;
    return a.label < b.label;
  });
  // Oracle rows are bounds: listed among the others by score, never given a rank.
  int rank = 0;
  for (auto& row : t.rows)
    if (row.status == "done" && !row.oracle) row.rank = ++rank;
  mark_ties(t, o, samples);
}

Leaderboard build_leaderboard(ResultsDb& db, const LeaderboardOptions& options) {
  const std::string reference_method = baseline_method();  // deltas are against it
  KVB_CHECK(options.n_resamples >= 1, "leaderboard: n_resamples must be at least 1");
  Leaderboard lb;
  lb.options = options;
  lb.db_path = db.path();
  RunFilter f = options.filter;
  f.status.reset();
  const std::vector<RunRow> runs = db.list_runs(f);
  lb.runs_considered = runs.size();

  std::map<std::string, std::pair<std::string, Direction>> stored_info;  // unit and direction as stored
  auto run_metrics = [&](int64_t id) {
    std::map<std::string, double> m;
    for (const auto& x : db.metrics(id))
      if (!x.layer && !x.head) {
        m[x.name] = x.value;
        stored_info[x.name] = {x.unit, x.direction};
      }
    return m;
  };

  // Throughput from perf runs: (model, device, dtype, method) -> decode_tok_s of the run with the
  // longest context (then the lowest id).
  struct PerfHit {
    int64_t context = -1, id = 0;
    double tok_s = NAN;
    std::string hash;
  };
  std::map<std::string, PerfHit> perf;
  auto perf_key = [](const json& cfg) {
    return canonical_json(json{{"model", cfg["model"]}, {"device", cfg["device"]}, {"dtype", cfg["dtype"]},
                               {"method", cfg["method"]}});
  };
  for (const std::string& throughput_protocol : ProtocolRegistry::instance().names()) {
    if (!ProtocolRegistry::instance().report(throughput_protocol).measures_throughput) continue;
    RunFilter pf;
    pf.model = options.filter.model;
    pf.protocol = throughput_protocol;
    pf.status = RunStatus::kDone;
    for (const auto& r : db.list_runs(pf)) {
      const json cfg = stored_run_config(db.path(), r);
      const int64_t ctx = cfg["protocol"].value("context", int64_t{0});
      const double v = metric_or_nan(run_metrics(r.id), "decode_tok_s");
      if (!std::isfinite(v)) continue;
      PerfHit& h = perf[perf_key(cfg)];
      if (ctx > h.context || (ctx == h.context && r.id < h.id)) h = {ctx, r.id, v, r.config_hash};
    }
  }

  // Groups: resolved config minus what does not change results or names the method.
  struct Group {
    json settings;
    std::vector<RunRow> runs;
  };
  std::map<std::string, Group> groups;
  for (const auto& r : runs) {
    if (!ProtocolRegistry::instance().report(r.protocol).ranks_methods) continue;
    json cfg = stored_run_config(db.path(), r);
    json key = cfg;
    key.erase("method");
    key.erase("label");
    key.erase("threads");
    Group& g = groups[canonical_json(key)];
    g.settings = key;
    g.runs.push_back(r);
  }

  std::map<int64_t, const RunRow*> run_by_id;
  for (const auto& r : runs) run_by_id[r.id] = &r;
  std::map<int64_t, RunSamples> sample_cache;
  auto samples_of = [&](const RunRow& r) -> const RunSamples& {
    auto it = sample_cache.find(r.id);
    if (it == sample_cache.end()) it = sample_cache.emplace(r.id, extract_samples(r.protocol, db.samples(r.id))).first;
    return it->second;
  };

  for (auto& [gkey, g] : groups) {
    LeaderTable t;
    const RunRow& first = g.runs.front();
    const ProtocolReport& report = ProtocolRegistry::instance().report(first.protocol);
    t.model = g.settings.value("model", first.model);
    t.dataset = first.dataset;
    t.protocol = first.protocol;
    t.settings = g.settings;
    std::vector<std::map<std::string, double>> done_metrics;
    std::vector<const RunRow*> shown;
    for (const auto& r : g.runs) {
      if (r.status == RunStatus::kRunning) {
        t.incomplete_runs++;
        continue;
      }
      shown.push_back(&r);
    }
    if (shown.empty()) continue;
    std::map<int64_t, std::map<std::string, double>> metrics_by_run;
    for (const RunRow* r : shown) {
      metrics_by_run[r->id] = run_metrics(r->id);
      if (r->status == RunStatus::kDone) done_metrics.push_back(metrics_by_run[r->id]);
    }
    t.metric = options.metric;
    if (!t.metric.empty()) {
      bool present = false;
      for (const auto& m : done_metrics) present = present || m.count(t.metric);
      if (!present) t.metric.clear();
    }
    if (t.metric.empty()) t.metric = default_metric(t.protocol, done_metrics);
    if (is_known_metric(t.metric)) {
      const MetricInfo& mi = metric_info(t.metric);
      t.unit = std::string(mi.unit);
      t.direction = mi.direction == "higher" ? Direction::kHigher : Direction::kLower;
    } else if (stored_info.count(t.metric)) {
      t.unit = stored_info[t.metric].first;
      t.direction = stored_info[t.metric].second == Direction::kHigher ? Direction::kHigher : Direction::kLower;
    }
    for (const std::string& m : report.secondary_metrics) {
      if (m == t.metric || t.secondary.size() >= report.max_secondary) continue;
      if (report.secondary_needs_all_runs) {
        bool all_recorded = true, any_done = false;
        for (const RunRow* r : shown) {
          if (r->status != RunStatus::kDone) continue;
          any_done = true;
          all_recorded = all_recorded && std::isfinite(metric_or_nan(run_metrics(r->id), m));
        }
        if (!any_done || !all_recorded) continue;
      }
      t.secondary.push_back(m);
    }

    const RunRow* base = nullptr;
    for (const RunRow* r : shown)
      if (r->status == RunStatus::kDone && r->method == reference_method) base = r;
    if (base) {
      t.baseline_hash = base->config_hash;
      t.baseline_samples = samples_of(*base).keys.size();
    }

    // Which params to show per method: those that vary in this table or differ from the defaults.
    std::map<std::string, std::set<std::string>> show;
    std::map<std::string, std::map<std::string, std::set<std::string>>> values;  // method -> param -> values
    for (const RunRow* r : shown) {
      const json cfg = stored_run_config(db.path(), *r);
      for (auto it = cfg["method"]["params"].begin(); it != cfg["method"]["params"].end(); ++it)
        values[r->method][it.key()].insert(it.value().dump());
    }
    for (const auto& [m, params] : values) {
      std::map<std::string, json> defaults;
      if (MethodRegistry::instance().has(m))
        for (const auto& p : MethodRegistry::instance().info(m).params) defaults[p.name] = p.default_value;
      for (const auto& [p, vals] : params) {
        const bool varies = vals.size() > 1;
        const bool non_default = !defaults.count(p) || vals.size() != 1 ||
                                 !(parse_json(*vals.begin(), "parameter " + p) == defaults[p]);
        if (varies || non_default) show[m].insert(p);
      }
    }

    // Memory at 16 bits (what papers compare against) when every finished run recorded it: an
    // fp32 CPU run's ratio against an fp32 baseline flatters fixed-width codes two-fold.
    {
      bool all16 = true, any_done = false;
      for (const RunRow* r : shown) {
        if (r->status != RunStatus::kDone) continue;
        any_done = true;
        all16 = all16 && std::isfinite(metric_or_nan(metrics_by_run[r->id], "compression_ratio_16bit"));
      }
      t.bytes_16bit = any_done && all16;
    }
    for (const RunRow* r : shown) {
      LeaderRow row;
      const json cfg = stored_run_config(db.path(), *r);
      row.method = r->method;
      row.params = cfg["method"]["params"];
      row.oracle = MethodRegistry::instance().has(r->method) &&
                   MethodRegistry::instance().info(r->method).caps.oracle;
      json show_list = json::array();
      for (const auto& p : show[r->method]) show_list.push_back(p);
      row.label = method_label(cfg["method"], show_list);
      row.config_hash = r->config_hash;
      row.config = cfg;
      row.run_id = r->id;
      row.status = to_string(r->status);
      row.error = r->error;
      row.metrics = metrics_by_run[r->id];
      row.value = metric_or_nan(row.metrics, t.metric);
      row.bytes_16bit = t.bytes_16bit;
      row.bytes_per_token = metric_or_nan(row.metrics, t.bytes_16bit ? "bytes_per_token_16bit" : "bytes_per_token");
      row.compression_ratio =
          metric_or_nan(row.metrics, t.bytes_16bit ? "compression_ratio_16bit" : "compression_ratio");
      row.simulated = r->simulated || metric_or_nan(row.metrics, "simulated") == 1.0;
      if (report.measures_throughput) {
        const double v = metric_or_nan(row.metrics, "decode_tok_s");
        if (std::isfinite(v)) row.decode_tok_s = v;
      } else {
        auto it = perf.find(perf_key(cfg));
        if (it != perf.end()) {
          row.decode_tok_s = it->second.tok_s;
          row.perf_config_hash = it->second.hash;
        }
      }
      std::vector<std::string> shown_metrics = {t.metric};
      shown_metrics.insert(shown_metrics.end(), t.secondary.begin(), t.secondary.end());
      for (const auto& m : shown_metrics) {
        DeltaCi d;
        const SampleMetricDef* def = find_sample_metric(t.protocol, m);
        // Samples that carry the full cache's own value (qa's answers): without a full run, pair with those.
        const auto in_sample = report.paired_in_sample.find(m);
        const bool embedded = !base && in_sample != report.paired_in_sample.end() &&
                              r->status == RunStatus::kDone && samples_of(*r).sums.count(in_sample->second);
        if (r->status != RunStatus::kDone) d.status = "n/a";
        else if (base && r->id == base->id) d.status = "baseline";
        else if (!base && !embedded) d.status = "no_baseline";
        else if (!report.exact_delta_note.empty()) {
          // One deterministic simulation per run (exact accounting over the same trace): the
          // difference is exact, there is nothing to resample.
          const double a = metric_or_nan(row.metrics, m);
          const double b = metric_or_nan(metrics_by_run[base->id], m);
          d.status = std::isfinite(a) && std::isfinite(b) ? "ok" : "n/a";
          d.estimate = a - b;
          d.n = 0;  // exact: printed without a CI
        } else if (!def) d.status = "not_per_sample";
        else {
          const RunSamples& a = samples_of(*r);
          RunSamples pseudo;
          if (embedded) {
            pseudo.keys = a.keys;
            pseudo.sums[m] = a.sums.at(in_sample->second);
            t.embedded_baseline = true;
          }
          const RunSamples& b = embedded ? pseudo : samples_of(*base);
          PairedSums ps = paired_sums(a, b, *def, common_samples(a, b));
          if (ps.a_num.empty()) {
            d.status = "no_common_samples";
          } else {
            BootstrapCi ci = paired_ratio_bootstrap(ps, def->exp_transform, options.n_resamples, options.seed,
                                                    options.confidence);
            d.status = "ok";
            d.estimate = ci.estimate;
            d.lo = ci.lo;
            d.hi = ci.hi;
            d.n = ci.n;
          }
        }
        row.deltas[m] = d;
      }
      t.rows.push_back(std::move(row));
    }

    rank_rows(t, options, [&](int64_t id) -> const RunSamples& { return samples_of(*run_by_id.at(id)); });
    set_headroom(t);

    // Pareto frontiers of the deployable rows (an oracle neither sits on one nor dominates).
    auto frontier = [&](auto x_of, Direction xdir, auto set) {
      for (auto& r : t.rows) {
        if (r.status != "done" || r.oracle || !std::isfinite(r.value)) continue;
        const double rx = x_of(r);
        if (!std::isfinite(rx)) continue;
        bool dominated = false;
        for (const auto& s : t.rows) {
          if (&s == &r || s.status != "done" || s.oracle || !std::isfinite(s.value)) continue;
          const double sx = x_of(s);
          if (!std::isfinite(sx)) continue;
          if (at_least(sx, rx, xdir, false) && at_least(s.value, r.value, t.direction, false) &&
              (at_least(sx, rx, xdir, true) || at_least(s.value, r.value, t.direction, true))) {
            dominated = true;
            break;
          }
        }
        set(r, !dominated);
      }
    };
    frontier([](const LeaderRow& r) { return r.bytes_per_token; }, Direction::kLower,
             [](LeaderRow& r, bool v) { r.pareto_memory = v; });
    if (!report.measures_throughput) {
      for (const auto& r : t.rows) t.has_throughput = t.has_throughput || r.decode_tok_s.has_value();
      if (t.has_throughput)
        frontier([](const LeaderRow& r) { return r.decode_tok_s ? *r.decode_tok_s : NAN; }, Direction::kHigher,
                 [](LeaderRow& r, bool v) { r.pareto_throughput = v; });
    }
    t.curves = build_curves(t);
    lb.tables.push_back(std::move(t));
  }

  // Settings worth showing in titles: non-default protocol params, the key sizes, and whatever varies
  // between tables of the same model, dataset and protocol.
  std::map<std::string, std::map<std::string, std::set<std::string>>> vary;
  auto flat = [](const json& s) {
    std::map<std::string, json> m;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() == "protocol") {
        for (auto p = it.value().begin(); p != it.value().end(); ++p)
          if (p.key() != "name" && p.key() != "dataset") m[p.key()] = p.value();
      } else if (it.key() != "model") {
        m[it.key()] = it.value();
      }
    }
    return m;
  };
  for (const auto& t : lb.tables)
    for (const auto& [k, v] : flat(t.settings)) vary[t.model + "\n" + t.dataset + "\n" + t.protocol][k].insert(v.dump());
  for (auto& t : lb.tables) {
    std::map<std::string, json> defaults = {{"device", "cpu"}, {"dtype", "fp32"}, {"seed", 0}};
    std::vector<std::string> order;  // the protocol's parameter order, then the rest
    std::set<std::string> always;
    if (ProtocolRegistry::instance().has(t.protocol)) {
      const ProtocolInfo& info = ProtocolRegistry::instance().info(t.protocol);
      for (const auto& p : info.params) {
        defaults[p.name] = p.default_value;
        order.push_back(p.name);
      }
      always.insert(info.report.always_shown_settings.begin(), info.report.always_shown_settings.end());
    }
    std::vector<std::string> parts;
    const auto& var = vary[t.model + "\n" + t.dataset + "\n" + t.protocol];
    const auto settings = flat(t.settings);
    for (const auto& [k, v] : settings)
      if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
    for (const auto& k : order) {
      auto it = settings.find(k);
      if (it == settings.end()) continue;
      const json& v = it->second;
      const bool non_default = !defaults.count(k) || !(defaults[k] == v);
      const bool varies = var.count(k) && var.at(k).size() > 1;
      if (always.count(k) || non_default || varies) parts.push_back(k + "=" + settings_value_text(v));
    }
    t.settings_text = join(parts, ", ");
  }
  if (!options.metric.empty()) {
    bool used = false;
    for (const auto& t : lb.tables) used = used || t.metric == options.metric;
    std::vector<std::string> names;
    for (const auto& [n, info] : stored_info) names.push_back(n);
    KVB_CHECK(used || lb.tables.empty(), "--metric ", options.metric, ": no run in ", db.path(), " has this metric",
              did_you_mean(options.metric, names));
  }
  std::stable_sort(lb.tables.begin(), lb.tables.end(), [](const LeaderTable& a, const LeaderTable& b) {
    // Accuracy tables first, then speed, then serving.
    auto rank = [](const std::string& p) { return ProtocolRegistry::instance().report(p).table_order; };
    if (rank(a.protocol) != rank(b.protocol)) return rank(a.protocol) < rank(b.protocol);
    if (a.model != b.model) return a.model < b.model;
    if (a.dataset != b.dataset) return a.dataset < b.dataset;
    if (a.protocol != b.protocol) return a.protocol < b.protocol;
    return a.settings_text < b.settings_text;
  });
  return lb;
}

// ---------------------------------------------------------------- Markdown

namespace {

struct Columns {
  bool top1 = false, throughput = false;
  bool headroom = false;  // the table has an oracle row
};

// The rank cell: oracle rows are bounds, never ranked.
std::string headroom_text(double h) { return std::isfinite(h) ? fmt("%.2f", h) : "n/a"; }

std::string headroom_caption() {
  return std::string("oracle rows are bounds (hindsight or exact scoring), never ranked. headroom = "
                     "(score - floor) / (best oracle score - floor) at the same budget, floor = the ") +
         kHeadroomFloorMethod + " row at that budget (quantizers: the " +
         kHeadroomQuantFloorMethod +
         " row at the same equivalent bits); n/a without both or when they are equal.";
}

std::string rank_text(const LeaderRow& r) {
  return r.oracle ? "oracle" : (r.tied_above ? "=" : "") + std::to_string(r.rank);
}

// A table gets a curves section when some method other than the full cache has a point on it.
// A curve section needs a sweep: some method with two or more budgets. Where every method has one
// point, the ranked table already shows each point and there is no range to summarise.
bool has_curves(const LeaderTable& t) {
  for (const auto& c : t.curves.curves)
    if (!c.baseline && c.points.size() >= 2) return true;
  return false;
}

std::string budget_text(double b) { return std::isfinite(b) ? format_value(b) : "–"; }

std::string summary_caption(const LeaderTable& t) {
  const LeaderCurves& lc = t.curves;
  return "Measured compression = 1 − bytes/token ÷ the full cache's bytes/token. Within 1 pt: the largest "
         "measured compression whose " + t.metric + " is within " + format_value(lc.tolerance) +
         (lc.fraction_metric ? " (one point)" : " (1% of the full cache's)") +
         " of the full cache's " + format_value(lc.full_value) + ". AUC: mean " + t.metric +
         " over measured compression 0–" + percent_text(lc.auc_range) +
         " (the range every swept curve reaches), the curve linear between points from the full cache at 0.";
}

const MethodCurve* curve_of(const LeaderTable& t, const std::string& config_hash, const CurvePoint** point) {
  for (const auto& c : t.curves.curves)
    for (const auto& p : c.points)
      if (p.config_hash == config_hash) {
        *point = &p;
        return &c;
      }
  return nullptr;
}

Columns columns_of(const LeaderTable& t) {
  Columns c;
  const ProtocolReport& report = ProtocolRegistry::instance().report(t.protocol);
  c.top1 = report.shows_top1 && t.metric != "top1_agreement";
  for (const auto& r : t.rows) c.throughput = c.throughput || r.decode_tok_s.has_value();
  if (report.measures_throughput) c.throughput = t.metric != "decode_tok_s";
  for (const auto& r : t.rows) c.headroom = c.headroom || r.oracle;
  return c;
}

}  // namespace

std::string leaderboard_markdown(const Leaderboard& lb) {
  std::ostringstream s;
  s << "## kvbench leaderboard\n\n";
  if (lb.tables.empty()) {
    s << "No finished runs in " << md_escape(lb.db_path) << " match the filters.\n";
    return s.str();
  }
  for (const auto& t : lb.tables) {
    const Columns c = columns_of(t);
    s << "### " << md_escape(table_title(t)) << "\n\n";
    s << "Ranked by **" << metric_caption(t) << "** at measured bytes per token. " << baseline_note(t, lb.options)
      << "\n\n";
    s << "| # | method | bytes/token" << (t.bytes_16bit ? " (16-bit)" : "") << " | compression"
      << (t.bytes_16bit ? " (16-bit)" : "") << " | " << md_escape(t.metric) << arrow(t.direction)
      << " | Δ vs full [95% CI] |";
    for (const auto& m : t.secondary) {
      const Direction d = is_known_metric(m) && metric_info(m).direction == "higher" ? Direction::kHigher : Direction::kLower;
      s << " " << md_escape(m) << arrow(d) << " | Δ " << md_escape(m) << " [95% CI] |";
    }
    if (c.top1) s << " top-1 ↑ |";
    if (c.throughput) s << " decode tok/s ↑ |";
    if (c.headroom) s << " headroom ↑ |";
    s << " simulated | Pareto |\n";
    s << "|--:|---|--:|--:|--:|---|";
    for (size_t i = 0; i < t.secondary.size(); ++i) s << "--:|---|";
    if (c.top1) s << "--:|";
    if (c.throughput) s << "--:|";
    if (c.headroom) s << "--:|";
    s << ":-:|:-:|\n";
    for (const auto& r : t.rows) {
      if (r.status != "done") {
        std::string err = r.error.size() > 100 ? r.error.substr(0, 97) + "..." : r.error;
        s << "| – | " << md_escape(r.label) << " | **failed**: " << md_escape(err) << " |";
        const size_t rest = 3 + 2 * t.secondary.size() + (c.top1 ? 1 : 0) + (c.throughput ? 1 : 0) +
                            (c.headroom ? 1 : 0) + 2;
        for (size_t i = 0; i < rest; ++i) s << " |";
        s << "\n";
        continue;
      }
      s << "| " << rank_text(r) << " | " << md_escape(r.label) << " | " << bytes_text(r.bytes_per_token) << " | "
        << ratio_text(r) << " | " << format_value(r.value) << " | "
        << format_delta(r.deltas.at(t.metric)) << " |";
      for (const auto& m : t.secondary)
        s << " " << format_value(metric_or_nan(r.metrics, m)) << " | " << format_delta(r.deltas.at(m)) << " |";
      if (c.top1) s << " " << percent_text(metric_or_nan(r.metrics, "top1_agreement")) << " |";
      if (c.throughput) s << " " << tok_s_text(r.decode_tok_s) << " |";
      if (c.headroom) s << " " << headroom_text(r.headroom) << " |";
      s << " " << (r.simulated ? "yes" : "no") << " | " << pareto_text(r) << " |\n";
    }
    s << "\n";
    if (t.incomplete_runs) s << "_" << t.incomplete_runs << " unfinished run(s) not shown._\n\n";
    if (c.headroom) s << "_" << headroom_caption() << "_\n\n";
    if (!has_curves(t)) continue;
    s << "#### " << md_escape(t.metric) << " vs measured compression\n\n" << summary_caption(t) << "\n\n";
    s << "| method | points | within 1 pt: max compression | AUC " << md_escape(t.metric)
      << arrow(t.direction) << " |\n";
    s << "|---|--:|--:|--:|\n";
    for (const auto& c : t.curves.curves)
      s << "| " << md_escape(c.name) << " | " << c.points.size() << " | "
        << percent_text(c.max_compression_within_1pt) << " | " << format_value(c.auc) << " |\n";
    s << "\n| method | budget | measured compression | " << md_escape(t.metric)
      << arrow(t.direction) << " |\n";
    s << "|---|--:|--:|--:|\n";
    for (const auto& c : t.curves.curves)
      for (const auto& p : c.points)
        s << "| " << md_escape(c.name) << " | " << budget_text(p.budget) << " | " << percent_text(p.compression)
          << " | " << format_value(p.value) << " |\n";
    s << "\n";
  }
  s << "★ on the Pareto frontier of the ranking metric vs measured bytes per token; ⚡ on the frontier vs "
       "decode throughput (from `perf` runs of the same method). bytes/token: physical bytes of the KV "
       "state (payload, metadata, indices) per cached position; compression: uncompressed baseline bytes / "
       "physical bytes. simulated: the method only masks or dequantizes, so its memory saving is not real.\n";
  bool any16 = false;
  for (const auto& t : lb.tables) any16 = any16 || t.bytes_16bit;
  if (any16)
    s << "Tables marked (16-bit) count bytes as a 16-bit deployment holds them: rows a store keeps in "
         "the run's fp32 at 16 bits, codes, scales and fp16 rows as they are, against a 16-bit "
         "baseline (the ratio papers report; against the fp32 baseline fixed-width codes look twice as "
         "small).\n";
  return s.str();
}

// ---------------------------------------------------------------- CSV / JSON

std::string leaderboard_csv(const Leaderboard& lb) {
  std::ostringstream s;
  s << "model,dataset,protocol,settings,rank,method,label,config_hash,run_id,status,metric,unit,direction,value,"
       "delta,delta_lo,delta_hi,delta_n,delta_status,ppl,delta_ppl,delta_ppl_lo,delta_ppl_hi,top1_agreement,"
       "bytes_per_token,compression_ratio,decode_tok_s,simulated,pareto_memory,pareto_throughput,oracle,headroom,"
       "curve,budget,"
       "measured_compression,curve_max_compression_within_1pt,curve_auc,curve_auc_range,error\n";
  auto num = [](double v) { return std::isfinite(v) ? fmt("%.10g", v) : std::string(); };
  for (const auto& t : lb.tables)
    for (const auto& r : t.rows) {
      const DeltaCi& d = r.deltas.count(t.metric) ? r.deltas.at(t.metric) : DeltaCi{};
      DeltaCi dp;
      if (r.deltas.count("ppl") && t.metric != "ppl") dp = r.deltas.at("ppl");
      const bool ok = d.status == "ok", okp = dp.status == "ok";
      const CurvePoint* cp = nullptr;
      const MethodCurve* cv = curve_of(t, r.config_hash, &cp);
      s << csv_field(t.model) << "," << csv_field(t.dataset) << "," << t.protocol << "," << csv_field(t.settings_text)
        << "," << (r.rank ? std::to_string(r.rank) : "") << "," << r.method << "," << csv_field(r.label) << ","
        << r.config_hash << "," << r.run_id << "," << r.status << "," << t.metric << "," << csv_field(t.unit) << ","
        << to_string(t.direction) << "," << num(r.value) << "," << (ok ? num(d.estimate) : "") << ","
        << (ok ? num(d.lo) : "") << "," << (ok ? num(d.hi) : "") << "," << (ok ? std::to_string(d.n) : "") << ","
        << d.status << "," << num(metric_or_nan(r.metrics, "ppl")) << "," << (okp ? num(dp.estimate) : "") << ","
        << (okp ? num(dp.lo) : "") << "," << (okp ? num(dp.hi) : "") << ","
        << num(metric_or_nan(r.metrics, "top1_agreement")) << "," << num(r.bytes_per_token) << ","
        << num(r.compression_ratio) << "," << (r.decode_tok_s ? num(*r.decode_tok_s) : "") << ","
        << (r.simulated ? 1 : 0) << "," << (r.pareto_memory ? 1 : 0) << "," << (r.pareto_throughput ? 1 : 0) << ","
        << (r.oracle ? 1 : 0) << "," << num(r.headroom) << "," << (cv ? csv_field(cv->name) : "") << "," << (cp ? num(cp->budget) : "") << "," << (cp ? num(cp->compression) : "")
        << "," << (cv ? num(cv->max_compression_within_1pt) : "") << "," << (cv ? num(cv->auc) : "") << ","
        << (cv ? num(t.curves.auc_range) : "") << "," << csv_field(r.error) << "\n";
    }
  return s.str();
}

namespace {

json curves_json(const LeaderCurves& lc) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json curves = json::array();
  for (const auto& c : lc.curves) {
    json points = json::array();
    for (const auto& p : c.points)
      points.push_back({{"budget", num(p.budget)},
                        {"measured_compression", num(p.compression)},
                        {"value", num(p.value)},
                        {"label", p.label},
                        {"config_hash", p.config_hash},
                        {"run_id", p.run_id}});
    curves.push_back({{"method", c.method},
                      {"name", c.name},
                      {"params", c.params},
                      {"baseline", c.baseline},
                      {"simulated", c.simulated},
                      {"max_compression_within_1pt", num(c.max_compression_within_1pt)},
                      {"auc", num(c.auc)},
                      {"points", points}});
  }
  return {{"reference_bytes_per_token", num(lc.reference_bytes)},
          {"full_value", num(lc.full_value)},
          {"tolerance", num(lc.tolerance)},
          {"auc_range", num(lc.auc_range)},
          {"curves", curves}};
}

}  // namespace

json leaderboard_json(const Leaderboard& lb) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json tables = json::array();
  for (const auto& t : lb.tables) {
    json rows = json::array();
    for (const auto& r : t.rows) {
      json deltas = json::object();
      for (const auto& [m, d] : r.deltas) {
        json jd = {{"status", d.status}};
        if (d.status == "ok") {
          jd["estimate"] = d.estimate;
          jd["lo"] = d.lo;
          jd["hi"] = d.hi;
          jd["n"] = d.n;
        }
        deltas[m] = jd;
      }
      json metrics = json::object();
      for (const auto& [k, v] : r.metrics) metrics[k] = num(v);
      rows.push_back({{"rank", r.rank ? json(r.rank) : json(nullptr)},
                      {"tied_above", r.tied_above},
                      {"method", r.method},
                      {"params", r.params},
                      {"label", r.label},
                      {"config_hash", r.config_hash},
                      {"run_id", r.run_id},
                      {"status", r.status},
                      {"error", r.error},
                      {"value", num(r.value)},
                      {"deltas", deltas},
                      {"bytes_per_token", num(r.bytes_per_token)},
                      {"compression_ratio", num(r.compression_ratio)},
                      {"decode_tok_s", r.decode_tok_s ? json(*r.decode_tok_s) : json(nullptr)},
                      {"perf_config_hash", r.perf_config_hash},
                      {"simulated", r.simulated},
                      {"pareto_memory", r.pareto_memory},
                      {"pareto_throughput", r.pareto_throughput},
                      {"oracle", r.oracle},
                      {"headroom", num(r.headroom)},
                      {"metrics", metrics}});
    }
    tables.push_back({{"model", t.model},
                      {"dataset", t.dataset},
                      {"protocol", t.protocol},
                      {"settings", t.settings},
                      {"settings_text", t.settings_text},
                      {"metric", t.metric},
                      {"unit", t.unit},
                      {"direction", to_string(t.direction)},
                      {"secondary", t.secondary},
                      {"baseline_config_hash", t.baseline_hash.empty() ? json(nullptr) : json(t.baseline_hash)},
                      {"baseline_samples", t.baseline_samples},
                      {"incomplete_runs", t.incomplete_runs},
                      {"rows", rows},
                      {"curves", curves_json(t.curves)}});
  }
  return {{"db", lb.db_path},
          {"bootstrap", {{"seed", lb.options.seed}, {"n_resamples", lb.options.n_resamples}, {"confidence", lb.options.confidence}}},
          {"runs_considered", lb.runs_considered},
          {"tables", tables}};
}

// ---------------------------------------------------------------- HTML

namespace {

const char* const kCurvePalette[] = {"#4a78c2", "#2a9d8f", "#8e5ccf", "#c2474a", "#6b8e23", "#d17a22",
                                     "#3c9fd6", "#b5489a", "#7d6b5a", "#4f5d75", "#c9a227", "#1b998b"};
const char* const kCurveDash[] = {"", "6 3", "2 3"};

// Score vs measured compression, one polyline per curve and the full cache as a horizontal line. Curves
// are named in a legend beside the plot, one row each, so no label can overlap another or a point.
std::string svg_curves(const LeaderTable& t) {
  const LeaderCurves& lc = t.curves;
  std::vector<const MethodCurve*> shown;
  for (const auto& c : lc.curves)
    if (!c.baseline) shown.push_back(&c);
  const double row_h = 17, legend_w = 330, L = 64, T = 34, B = 54, R = 14;
  const double plot_h = 380;
  const double legend_rows = static_cast<double>(shown.size() + (std::isfinite(lc.full_value) ? 1 : 0));
  const double H = std::max(T + plot_h + B, T + legend_rows * row_h + 20);
  const double W = 1180, plot_r = W - legend_w - R;
  std::vector<double> ys;
  double xmax = 1, xmin = 0;
  for (const MethodCurve* c : shown)
    for (const auto& p : c->points) {
      ys.push_back(p.value);
      xmin = std::min(xmin, p.compression);
    }
  if (std::isfinite(lc.full_value)) ys.push_back(lc.full_value);
  Axis ax;
  ax.lo = xmin;
  ax.hi = xmax;
  ax.p0 = L;
  ax.p1 = plot_r;
  Axis ay = make_axis(ys, T + plot_h, T, false);
  const std::string ylabel = t.metric + (t.unit.empty() ? "" : " (" + t.unit + ")") + arrow(t.direction);
  std::ostringstream s;
  const std::string title = t.metric + " vs measured compression";
  s << "<svg class=\"chart chart-curves\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W << " " << H
    << "\" width=\"" << W << "\" height=\"" << H << "\" role=\"img\" aria-label=\"" << html_escape(title) << "\">\n";
  s << "<text class=\"ctitle\" x=\"" << L << "\" y=\"20\">" << html_escape(title) << "</text>\n";
  s << "<rect class=\"plot\" x=\"" << L << "\" y=\"" << T << "\" width=\"" << plot_r - L << "\" height=\"" << plot_h
    << "\"/>\n";
  for (double v : nice_ticks(ax.lo, ax.hi)) {
    const double x = ax.map(v);
    s << "<line class=\"grid\" x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << T + plot_h
      << "\"/><text class=\"tick\" x=\"" << x << "\" y=\"" << T + plot_h + 16 << "\" text-anchor=\"middle\">"
      << fmt("%.0f", 100 * v) << "%</text>\n";
  }
  for (double v : ay.ticks()) {
    const double y = ay.map(v);
    s << "<line class=\"grid\" x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << plot_r << "\" y2=\"" << y
      << "\"/><text class=\"tick\" x=\"" << L - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << tick_text(v)
      << "</text>\n";
  }
  s << "<text class=\"axis\" x=\"" << (L + plot_r) / 2 << "\" y=\"" << T + plot_h + 40
    << "\" text-anchor=\"middle\">measured compression (1 − bytes/token ÷ full cache) →</text>\n";
  s << "<text class=\"axis\" transform=\"translate(16," << T + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << html_escape(ylabel) << "</text>\n";
  const double lx = plot_r + 18;
  double ly = T + 8;
  if (std::isfinite(lc.full_value)) {
    const double y = ay.map(lc.full_value);
    s << "<line class=\"fullline\" x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << plot_r << "\" y2=\"" << y
      << "\"><title>full cache: " << format_value(lc.full_value) << "</title></line>\n";
    s << "<line class=\"fullline\" x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 26 << "\" y2=\"" << ly
      << "\"/><text class=\"legend\" x=\"" << lx + 32 << "\" y=\"" << ly + 4 << "\">full cache ("
      << format_value(lc.full_value) << ")</text>\n";
    ly += row_h;
  }
  for (size_t i = 0; i < shown.size(); ++i) {
    const MethodCurve& c = *shown[i];
    const std::string colour = kCurvePalette[i % 12];
    const std::string dash = kCurveDash[(i / 12) % 3];
    const std::string style = "stroke:" + colour + (dash.empty() ? "" : ";stroke-dasharray:" + dash);
    s << "<g class=\"curve\" data-name=\"" << html_escape(c.name) << "\">";
    if (c.points.size() >= 2) {
      s << "<polyline class=\"cline\" style=\"" << style << "\" points=\"";
      for (const auto& p : c.points) s << ax.map(p.compression) << "," << ay.map(p.value) << " ";
      s << "\"/>";
    }
    for (const auto& p : c.points)
      s << "<circle class=\"cpoint" << (c.simulated ? " sim" : "") << "\" cx=\"" << ax.map(p.compression)
        << "\" cy=\"" << ay.map(p.value) << "\" r=\"4.5\" style=\""
        << (c.simulated ? "fill:#fff;stroke:" + colour : "fill:" + colour) << "\"><title>" << html_escape(p.label)
        << ": compression " << percent_text(p.compression) << ", " << html_escape(t.metric) << " "
        << format_value(p.value) << "</title></circle>";
    std::string name = c.name;
    if (name.size() > 44) name = name.substr(0, 41) + "...";
    s << "<line style=\"" << style << ";stroke-width:2.5\" x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 26
      << "\" y2=\"" << ly << "\"/><circle cx=\"" << lx + 13 << "\" cy=\"" << ly << "\" r=\"3.5\" style=\"fill:"
      << colour << "\"/><text class=\"legend\" x=\"" << lx + 32 << "\" y=\"" << ly + 4 << "\">" << html_escape(name)
      << "<title>" << html_escape(c.name) << "</title></text></g>\n";
    ly += row_h;
  }
  s << "</svg>\n";
  return s.str();
}

std::string curves_summary_html(const LeaderTable& t) {
  std::ostringstream s;
  s << "<table class=\"lb curves\"><thead><tr><th class=\"l\">method</th><th>points</th><th>within 1 pt: max "
       "compression</th><th>AUC " << html_escape(t.metric + arrow(t.direction)) << "</th><th class=\"l\">"
    << html_escape(t.metric) << " by budget (measured compression)</th></tr></thead><tbody>\n";
  for (const auto& c : t.curves.curves) {
    s << "<tr class=\"crow\"><td class=\"l\">" << html_label(c.name) << "</td><td>" << c.points.size() << "</td><td>"
      << percent_text(c.max_compression_within_1pt) << "</td><td>" << format_value(c.auc) << "</td><td class=\"l\">";
    std::vector<std::string> parts;
    for (const auto& p : c.points)
      parts.push_back((std::isfinite(p.budget) ? format_value(p.budget) + ": " : "") + format_value(p.value) + " (" +
                      percent_text(p.compression) + ")");
    s << html_escape(join(parts, " · ")) << "</td></tr>\n";
  }
  s << "</tbody></table>\n";
  return s.str();
}

// Per model, the one-number summaries task by task (AUC and the largest compression within 1 point).
std::string model_overview_html(const Leaderboard& lb, const std::string& model) {
  std::vector<const LeaderTable*> ts;
  for (const auto& t : lb.tables)
    if (t.model == model && has_curves(t)) ts.push_back(&t);
  if (ts.empty()) return "";
  std::vector<std::string> names;
  for (const LeaderTable* t : ts)
    for (const auto& c : t->curves.curves)
      if (std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
  std::ostringstream s;
  s << "<section class=\"model\"><h2>" << html_escape(model) << ": summary by task</h2>\n<p class=\"note\">Each cell: AUC "
    << "(mean score over the measured-compression range every curve of that task reaches) / the largest measured "
       "compression within 1 point of the full cache. Definitions below.</p>\n";
  s << "<table class=\"lb overview\"><thead><tr><th class=\"l\">method</th>";
  for (const LeaderTable* t : ts)
    s << "<th>" << html_escape(t->dataset + " · " + t->protocol + " (" + t->metric + ")") << "</th>";
  s << "</tr></thead><tbody>\n";
  for (const auto& n : names) {
    s << "<tr><td class=\"l\">" << html_label(n) << "</td>";
    for (const LeaderTable* t : ts) {
      const MethodCurve* hit = nullptr;
      for (const auto& c : t->curves.curves)
        if (c.name == n) hit = &c;
      s << "<td>" << (hit ? format_value(hit->auc) + " / " + percent_text(hit->max_compression_within_1pt) : "–")
        << "</td>";
    }
    s << "</tr>\n";
  }
  s << "</tbody></table></section>\n";
  return s.str();
}

// Per method: the paper, the parameters of each curve, and the command that reproduces each point.
std::string method_panel_html(const Leaderboard& lb) {
  std::map<std::string, std::vector<std::pair<const LeaderTable*, const MethodCurve*>>> by_method;
  for (const auto& t : lb.tables)
    for (const auto& c : t.curves.curves) by_method[c.method].push_back({&t, &c});
  if (by_method.empty()) return "";
  std::ostringstream s;
  s << "<section class=\"methods\"><h2>Methods</h2>\n";
  for (const auto& [m, uses] : by_method) {
    std::string summary, paper;
    if (MethodRegistry::instance().has(m)) {
      summary = MethodRegistry::instance().info(m).summary;
      paper = MethodRegistry::instance().info(m).paper;
    }
    s << "<details class=\"method\"><summary><b>" << html_escape(m) << "</b> — " << html_escape(summary)
      << "</summary>\n<p class=\"note\">Paper: " << html_escape(paper.empty() ? "none (engineering baseline)" : paper)
      << "</p>\n";
    for (const auto& [t, c] : uses) {
      s << "<p class=\"note\">" << html_escape(table_title(*t)) << " — " << html_escape(c->name)
        << ", fixed parameters <code>" << html_escape(c->params.dump()) << "</code></p>\n";
      for (const auto& p : c->points)
        s << "<p class=\"note\">" << html_escape(p.label) << " (run " << p.run_id << ", config "
          << p.config_hash.substr(0, 12) << "):</p><pre class=\"cmd\">" << html_escape(reproduce_command(p.config))
          << "</pre>\n";
    }
    s << "</details>\n";
  }
  s << "</section>\n";
  return s.str();
}

}  // namespace

std::string leaderboard_html(const Leaderboard& lb) {
  const std::string reference_method = baseline_method();
  std::ostringstream s;
  s << R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvbench leaderboard</title>
<style>
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1240px;padding:0 16px;color:#1d2330;background:#fff}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:34px 0 6px;border-bottom:1px solid #e3e6ec;padding-bottom:4px}
p.meta,p.note{color:#596275;font-size:13px;margin:4px 0 10px}
table.lb{border-collapse:collapse;font-size:13px;margin:8px 0 14px;width:100%}
table.lb th{background:#f3f5f9;text-align:right;padding:6px 8px;border-bottom:2px solid #d5dae3;vertical-align:bottom}
table.lb td{text-align:right;padding:5px 8px;border-bottom:1px solid #eceff4;font-variant-numeric:tabular-nums}
table.lb td.l{overflow-wrap:break-word}
pre.cmd{background:#f6f8fa;border:1px solid #e3e6ec;padding:6px 8px;font-size:11px;white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-all}
details.method{margin:6px 0;font-size:13px}code{overflow-wrap:anywhere}
svg.chart{max-width:100%;height:auto}
svg .cline{fill:none;stroke-width:2}svg .cpoint{stroke:#fff;stroke-width:1.2}svg .cpoint.sim{stroke-width:2}
svg .fullline{stroke:#1d2330;stroke-width:1.5;stroke-dasharray:8 4}svg .legend{font-size:12px;fill:#1d2330}
@media (max-width:1000px){body{padding:0 6px;margin:12px auto}table.lb{font-size:11px}table.lb th,table.lb td{padding:3px 4px}
svg .tick{font-size:13px}svg .axis{font-size:14px}}
table.lb th.l,table.lb td.l{text-align:left}table.lb td.c,table.lb th.c{text-align:center}
table.lb tr.front td{background:#fff8ec}table.lb tr.failed td{color:#a3303a;background:#fdf1f2}
table.lb tr.base td.l{font-weight:600}
.sim{color:#b3541e;font-weight:600}.ci{color:#596275;line-height:1.25}.ci .est{color:#1d2330}.ci .int{font-size:11px}
.charts{display:flex;flex-direction:column;gap:18px}
svg.chart{background:#fff;border:1px solid #e3e6ec;border-radius:6px}
svg .plot{fill:#fbfcfe;stroke:#d5dae3}svg .grid{stroke:#eceff4}svg .tick{font-size:11px;fill:#596275}
svg .axis{font-size:12px;fill:#1d2330}svg .ctitle{font-size:13px;font-weight:600;fill:#1d2330}
svg .point{stroke:#fff;stroke-width:1.5}svg .point.front{stroke:#e8871e;stroke-width:3}
svg .point.sim{stroke-width:2.5}
svg .frontier{fill:none;stroke:#e8871e;stroke-width:2;stroke-dasharray:6 4}
svg .plabel{font-size:11px;fill:#1d2330}svg .leader{stroke:#a9b1c1;stroke-width:.8}
footer{color:#596275;font-size:12px;margin:30px 0}
</style></head><body>
<h1>kvbench leaderboard</h1>
)";
  s << "<p class=\"meta\">" << lb.tables.size() << " table(s) from <code>" << html_escape(lb.db_path) << "</code> ("
    << lb.runs_considered << " runs). Differences to the full cache with 95% paired bootstrap confidence intervals ("
    << lb.options.n_resamples << " resamples, seed " << lb.options.seed << ").</p>\n";
  if (lb.tables.empty()) s << "<p>No finished runs match the filters.</p>\n";
  {
    std::vector<std::string> models;
    for (const auto& t : lb.tables)
      if (std::find(models.begin(), models.end(), t.model) == models.end()) models.push_back(t.model);
    for (const auto& m : models) s << model_overview_html(lb, m);
  }
  int table_no = 0;
  for (const auto& t : lb.tables) {
    ++table_no;
    const Columns c = columns_of(t);
    s << "<section class=\"board\" id=\"t" << table_no << "\">\n<h2>" << html_escape(table_title(t)) << "</h2>\n";
    s << "<p class=\"note\">Ranked by <b>" << html_escape(metric_caption(t)) << "</b> at measured bytes per token. "
      << html_escape(baseline_note(t, lb.options)) << "</p>\n";
    s << "<table class=\"lb\"><thead><tr><th>#</th><th class=\"l\">method</th><th>bytes/token" << (t.bytes_16bit ? " (16-bit)" : "") << "</th><th>compression"
      << (t.bytes_16bit ? " (16-bit)" : "") << "</th><th>"
      << html_escape(t.metric + arrow(t.direction)) << "</th><th class=\"l\">Δ vs full [95% CI]</th>";
    for (const auto& m : t.secondary) s << "<th>" << html_escape(m) << "</th><th class=\"l\">Δ " << html_escape(m) << " [95% CI]</th>";
    if (c.top1) s << "<th>top-1 ↑</th>";
    if (c.throughput) s << "<th>decode tok/s ↑</th>";
    if (c.headroom) s << "<th>headroom ↑</th>";
    s << "<th class=\"c\">simulated</th><th class=\"c\">Pareto</th></tr></thead>\n<tbody>\n";
    for (const auto& r : t.rows) {
      const bool base = r.method == reference_method && r.status == "done";
      if (r.status != "done") {
        s << "<tr class=\"row failed\" data-hash=\"" << r.config_hash << "\"><td>–</td><td class=\"l\">"
          << html_label(r.label) << "</td><td class=\"l\" colspan=\""
          << 4 + 2 * t.secondary.size() + (c.top1 ? 1 : 0) + (c.throughput ? 1 : 0) +
                 (c.headroom ? 1 : 0) + 2
          << "\">failed: "
          << html_escape(r.error) << "</td></tr>\n";
        continue;
      }
      s << "<tr class=\"row" << (r.pareto_memory ? " front" : "") << (base ? " base" : "")
        << (r.oracle ? " oracle" : "") << "\" data-hash=\"" << r.config_hash << "\"><td>"
        << rank_text(r) << "</td><td class=\"l\">" << html_label(r.label) << "</td><td>"
        << bytes_text(r.bytes_per_token) << "</td><td>" << ratio_text(r) << "</td><td>"
        << format_value(r.value) << "</td><td class=\"l ci\">" << delta_html(r.deltas.at(t.metric)) << "</td>";
      for (const auto& m : t.secondary)
        s << "<td>" << format_value(metric_or_nan(r.metrics, m)) << "</td><td class=\"l ci\">"
          << delta_html(r.deltas.at(m)) << "</td>";
      if (c.top1) s << "<td>" << percent_text(metric_or_nan(r.metrics, "top1_agreement")) << "</td>";
      if (c.throughput) s << "<td>" << tok_s_text(r.decode_tok_s) << "</td>";
      if (c.headroom) s << "<td>" << headroom_text(r.headroom) << "</td>";
      s << "<td class=\"c\">" << (r.simulated ? "<span class=\"sim\">yes</span>" : "no") << "</td><td class=\"c\">"
        << pareto_text(r) << "</td></tr>\n";
    }
    s << "</tbody></table>\n";
    if (t.incomplete_runs) s << "<p class=\"note\">" << t.incomplete_runs << " unfinished run(s) not shown.</p>\n";
    if (c.headroom) s << "<p class=\"note\">" << html_escape(headroom_caption()) << "</p>\n";
    std::vector<Pt> mem, thr;
    for (const auto& r : t.rows) {
      if (r.status != "done" || !std::isfinite(r.value)) continue;
      const bool base = r.method == reference_method;
      if (std::isfinite(r.bytes_per_token)) mem.push_back({r.bytes_per_token, r.value, r.label, r.method, r.pareto_memory, base, r.simulated});
      if (t.has_throughput && r.decode_tok_s)
        thr.push_back({*r.decode_tok_s, r.value, r.label, r.method, r.pareto_throughput, base, r.simulated});
    }
    const std::string ylabel = t.metric + (t.unit.empty() ? "" : " (" + t.unit + ")") + arrow(t.direction);
    s << "<div class=\"charts\">\n";
    if (has_curves(t))
      s << svg_curves(t) << "<p class=\"note\">" << html_escape(summary_caption(t)) << "</p>\n"
        << curves_summary_html(t);
    if (!mem.empty())
      s << svg_scatter(mem, "memory", t.metric + " vs measured bytes per token (frontier dashed)",
                       "bytes per token ↓", ylabel, true);
    if (!thr.empty())
      s << svg_scatter(thr, "throughput", t.metric + " vs decode throughput (frontier dashed)", "decode tok/s ↑",
                       ylabel, true);
    s << "</div>\n</section>\n";
  }
  s << method_panel_html(lb);
  s << "<section class=\"defs\"><h2>Definitions</h2><p class=\"note\"><b>Measured compression</b> of a run = 1 − "
       "its measured bytes per token ÷ the bytes per token of the full-cache run in the same table (without one: "
       "÷ the run's own uncompressed baseline), so 0 is the full cache and 75% keeps a quarter of its bytes. "
       "<b>Within 1 pt: max compression</b> = the largest measured compression among a method's runs whose score "
       "is at most 1 point (0.01 of a fraction metric; otherwise 1% of the full cache's score) worse than the full "
       "cache's. <b>AUC</b> = the mean score over measured compression 0..X: the area under the method's curve "
       "(linear between its runs, starting from the full cache's score at 0) divided by X, where X is the smallest "
       "largest compression among the table's swept methods (two or more runs), so every method is integrated "
       "over the same range; a method whose runs stop short of X has none.</p></section>\n";
  s << "<footer>★ Pareto frontier of the ranking metric vs measured bytes per token; ⚡ frontier vs decode "
       "throughput (from <code>perf</code> runs of the same method, model, device and dtype). Hollow points: "
       "simulated methods (memory saving not real). Generated by <code>kvbench leaderboard</code>; this file is "
       "self-contained.</footer>\n</body></html>\n";
  return s.str();
}

}  // namespace kvb
