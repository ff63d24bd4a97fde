#include "harness/eval/grid.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "harness/common/disk_full_error.h"
#include "harness/common/error.h"
#include "harness/common/progress_eta.h"
#include "harness/common/strings.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/run_config.h"
#include "harness/eval/shared_prefill.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "harness/store/config_hash.h"

namespace kvb {

namespace {

using json = nlohmann::json;

const std::vector<std::string>& run_config_roots() {
  static const std::vector<std::string> roots = {"model",  "device", "dtype",   "threads",
                                                 "seed",   "method", "protocol"};
  return roots;
}

std::vector<std::string> split_path(const std::string& key, const std::string& where) {
  const std::vector<std::string> parts = split_key_path(key, where);
  const auto& roots = run_config_roots();
  KVB_CHECK(std::find(roots.begin(), roots.end(), parts[0]) != roots.end(), where, ": '", key,
            "' is not a run config key", did_you_mean(parts[0], roots), "; a key is a dotted path "
            "starting with one of ", join(roots, ", "));
  return parts;
}

// "method": "x" and "protocol": "x" are shorthands for {"name": "x"}.
void normalize_named(json& cfg) {
  for (const char* k : {"method", "protocol"})
    if (cfg.contains(k) && cfg[k].is_string()) cfg[k] = json{{"name", cfg[k]}};
}

void set_path(json& root, const std::vector<std::string>& parts, const json& value) {
  json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object()) *node = json::object();
    json& child = (*node)[parts[i]];
    if (i == 0 && child.is_string() && (parts[i] == "method" || parts[i] == "protocol"))
      child = json{{"name", child}};
    node = &child;
  }
  if (!node->is_object()) *node = json::object();
  (*node)[parts.back()] = value;
}

const json* get_path(const json& root, const std::vector<std::string>& parts) {
  const json* node = &root;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i == 1 && node->is_string() && parts[i] == "name" && (parts[0] == "method" || parts[0] == "protocol"))
      return node;  // shorthand "method": "x" read as method.name
    if (!node->is_object() || !node->contains(parts[i])) return nullptr;
    node = &(*node)[parts[i]];
  }
  return node;
}

bool value_matches(const json& node, const json& want) {
  if (want.is_array()) {
    for (const auto& w : want)
      if (value_matches(node, w)) return true;
    return false;
  }
  if (want.is_object()) {
    if (node.is_string() && want.size() == 1 && want.contains("name")) return value_matches(node, want["name"]);
    if (!node.is_object()) return false;
    for (auto it = want.begin(); it != want.end(); ++it)
      if (!node.contains(it.key()) || !value_matches(node[it.key()], it.value())) return false;
    return true;
  }
  if (want.is_string() && node.is_object() && node.contains("name")) return node["name"] == want;
  if (want.is_number() && node.is_number()) return node.get<double>() == want.get<double>();
  return node == want;
}

struct ExcludeEntry {
  json entry;
  std::vector<std::pair<std::vector<std::string>, json>> conditions;
  size_t hits = 0;
};

bool entry_matches(const ExcludeEntry& e, const json& cfg) {
  for (const auto& [path, want] : e.conditions) {
    const json* node = get_path(cfg, path);
    if (!node || !value_matches(*node, want)) return false;
  }
  return true;
}

std::string scalar_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// How many methods `v` expands to: the product of its parameter lists' lengths, saturating at
// `limit` + 1 so that no product overflows. Checks nothing else; expand_method_value does.
size_t method_value_count(const json& v, size_t limit) {
  if (!v.is_object() || !v.contains("params") || !v["params"].is_object()) return 1;
  size_t n = 1;
  for (const auto& p : v["params"]) {
    if (!p.is_array() || p.empty()) continue;
    n = p.size() > (limit + 1) / n ? limit + 1 : n * p.size();
  }
  return n;
}

// {"name": n, "params": {k: [a, b], j: c}} -> one object per combination of the list values.
std::vector<json> expand_method_value(const json& v, const std::string& where) {
  if (v.is_string()) return {json{{"name", v}}};
  KVB_CHECK(v.is_object(), where, ": a method is a name or {\"name\": ..., \"params\": {...}}, got ",
            v.dump());
  for (auto it = v.begin(); it != v.end(); ++it)
    KVB_CHECK(it.key() == "name" || it.key() == "params", where, ": unknown key '", it.key(), "'",
              did_you_mean(it.key(), {"name", "params"}), "; allowed: name, params");
  KVB_CHECK(v.contains("name") && v["name"].is_string(), where, ": missing \"name\" (a string)");
  json params = v.value("params", json::object());
  KVB_CHECK(params.is_object(), where, ".params: expected an object");
  std::vector<json> out = {json{{"name", v["name"]}, {"params", json::object()}}};
  for (auto it = params.begin(); it != params.end(); ++it) {  // sorted keys: the first varies slowest
    std::vector<json> values;
    if (it.value().is_array()) {
      KVB_CHECK(!it.value().empty(), where, ".params.", it.key(), ": an empty list expands to nothing");
      for (const auto& x : it.value()) {
        KVB_CHECK(!x.is_array() && !x.is_object(), where, ".params.", it.key(),
                  ": list items must be plain values, got ", x.dump());
        values.push_back(x);
      }
    } else {
      values.push_back(it.value());
    }
    std::vector<json> next;
    for (const auto& m : out)
      for (const auto& x : values) {
        json c = m;
        c["params"][it.key()] = x;
        next.push_back(std::move(c));
      }
    out = std::move(next);
  }
  for (auto& m : out)
    if (m["params"].empty()) m.erase("params");
  return out;
}

std::string value_label(const std::string& key, const json& v) {
  if (key == "method" && v.is_object()) return method_label(v);
  if (key == "protocol" && v.is_object()) {
    std::vector<std::string> parts;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it.key() != "name") parts.push_back(it.key() + "=" + scalar_text(it.value()));
    // Any JSON may stand where a name belongs until the cell is resolved (which refuses it naming
    // the key): a label shows what was written.
    return (v.contains("name") ? scalar_text(v["name"]) : std::string("?")) +
           (parts.empty() ? "" : "(" + join(parts, ", ") + ")");
  }
  if (v.is_object() || v.is_array()) return v.dump();
  return scalar_text(v);
}

struct GridInterrupted : std::runtime_error {
  GridInterrupted() : std::runtime_error("interrupted (stop requested); the next grid run resumes this run") {}
};

// How a cell's line names its outcome.
const char* status_word(const std::string& status) {
  if (status == "failed") return "FAILED";
  if (status == "interrupted") return "interrupted";
  if (status == "skipped") return "done before";
  if (status == "held") return "held elsewhere";
  return "done";
}

// Progress output: a redrawn bar with ETA on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(const GridRunOptions& o, size_t cells, int64_t work) : o_(o), cells_(cells), work_(work) {
    t0_ = std::chrono::steady_clock::now();
  }
  void begin_cell(size_t pos, const GridCell& c) {
    pos_ = pos;
    label_ = "#" + std::to_string(c.index) + " " + c.label;
    samples_in_cell_ = 0;
    expected_in_cell_ = c.expected_samples;
    detail_.clear();
    draw();
  }
  void sample_done() {
    ++done_units_;
    ++samples_in_cell_;
    detail_.clear();
    draw();
  }
  // A run's own progress within a sample (a long prefill's line): on the bar, or a line of its own.
  void detail(const std::string& s) {
    if (!o_.progress) return;
    if (!o_.progress_bar) {
      *o_.progress << "kvbench: " << s << "\n" << std::flush;
      return;
    }
    detail_ = s;
    draw();
  }
  void line(const std::string& s) {
    if (!o_.progress) return;
    clear();
    *o_.progress << s << "\n";
    draw();
  }
  void end_cell(const CellResult& r) {
    if (!o_.progress) return;
    std::ostringstream os;
    os << "grid: [" << pos_ + 1 << "/" << cells_ << "] " << status_word(r.status) << " ";
    os << std::fixed << std::setprecision(1) << r.wall_s << "s  #" << r.index << " " << r.label;
    // Counted in the cell's expected samples, the unit `work_` is in: a cell may compute more
    // samples than it expects (stream windows, perf repeats), which would exhaust work_ early.
    if (r.status != "skipped" && r.status != "held") accounted_ += expected_in_cell_;
    if (r.status == "ran" && expected_in_cell_ > 0) {
      finished_wall_s_ += r.wall_s;
      finished_samples_ += expected_in_cell_;
    }
    os << "  (elapsed " << format_duration(elapsed_s()) << ", ETA " << eta() << ")";
    if (r.status == "failed") os << "\n      error: " << r.error;
    if (r.status == "held")
      os << "\n      held by " << r.error << "; the grid waits for it at the end";
    if (o_.progress_bar) {
      // On a terminal only failures, interruptions and held cells get a permanent line; the bar
      // shows the rest.
      if (r.status == "failed" || r.status == "interrupted" || r.status == "held")
        line(os.str());
      else
        draw();
    } else {
      *o_.progress << os.str() << "\n" << std::flush;
    }
  }
  void finish() { clear(); }

 private:
  int width() const {
    struct winsize w {};
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 40) return w.ws_col;
    return 100;
  }
  void clear() {
    if (o_.progress && o_.progress_bar && drawn_) {
      *o_.progress << "\r\033[K" << std::flush;
      drawn_ = false;
    }
  }
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  // The lines' ETA: the finished cells' wall time per expected sample times the samples the cells
  // not yet reached expect ("?" before a cell has finished). Per sample, not per cell, because cells
  // differ in size; cells already done before the grid started count in neither.
  std::string eta() const {
    const int64_t left = std::max<int64_t>(0, work_ - accounted_);
    return format_duration(eta_seconds(finished_wall_s_, static_cast<double>(finished_samples_),
                                       static_cast<double>(finished_samples_ + left)));
  }
  void draw() {
    if (!o_.progress || !o_.progress_bar) return;
    const double elapsed = elapsed_s();
    const double frac = work_ > 0 ? std::min(1.0, static_cast<double>(done_units_) / work_) : 1.0;
    const std::string eta =
        "ETA " + format_duration(work_ > 0 ? eta_seconds(elapsed, static_cast<double>(done_units_),
                                                         static_cast<double>(work_))
                                           : std::nan(""));
    const int bar_w = 24;
    const int fill = static_cast<int>(std::lround(frac * bar_w));
    std::ostringstream os;
    os << "[" << std::string(fill, '#') << std::string(bar_w - fill, '.') << "] " << std::setw(3)
       << static_cast<int>(std::lround(frac * 100)) << "%  cell " << pos_ + 1 << "/" << cells_ << "  "
       << eta << "  " << format_duration(elapsed) << " elapsed  " << label_ << " (sample "
       << samples_in_cell_ << "/" << expected_in_cell_ << ")";
    if (!detail_.empty()) os << "  " << detail_;
    std::string s = os.str();
    const size_t w = static_cast<size_t>(width() - 1);
    if (s.size() > w) s = s.substr(0, w - 3) + "...";
    *o_.progress << "\r\033[K" << s << std::flush;
    drawn_ = true;
  }

  const GridRunOptions& o_;
  size_t cells_ = 0;
  int64_t work_ = 0, done_units_ = 0;
  size_t pos_ = 0;
  std::string label_, detail_;
  int64_t samples_in_cell_ = 0, expected_in_cell_ = 0;
  double finished_wall_s_ = 0;
  int64_t finished_samples_ = 0;  // expected samples of the cells that ran
  int64_t accounted_ = 0;         // expected samples of every cell reached (ran, failed, interrupted)
  bool drawn_ = false;
  std::chrono::steady_clock::time_point t0_;
};

RunSpec spec_for(const GridCell& c, const std::string& grid) {
  RunSpec spec;
  spec.config_hash = c.config_hash;
  spec.config_json = canonical_json(c.resolved);
  spec.method = c.resolved["method"]["name"];
  spec.model = c.resolved["model"];
  spec.protocol = c.resolved["protocol"]["name"];
  spec.dataset = run_dataset_label(c.resolved);
  spec.grid = grid;
  spec.simulated = MethodRegistry::instance().info(spec.method).caps.simulated;
  return spec;
}

}  // namespace

std::string method_label(const json& method, const json& show) {
  if (method.is_string()) return method.get<std::string>();
  if (!method.is_object()) return method.dump();  // refused when the config is resolved
  std::string name = method.contains("name") ? scalar_text(method["name"]) : std::string("?");
  std::vector<std::string> parts;
  if (method.contains("params") && method["params"].is_object())
    for (auto it = method["params"].begin(); it != method["params"].end(); ++it) {
      if (!show.is_null() && !(show.is_array() && std::find(show.begin(), show.end(), it.key()) != show.end()))
        continue;
      parts.push_back(it.key() + "=" + scalar_text(it.value()));
    }
  return parts.empty() ? name : name + "(" + join(parts, ", ") + ")";
}

GridPlan expand_grid(const json& grid, const GridOptions& options) {
  KVB_CHECK(grid.is_object(), "grid: expected a JSON object with \"base\" and \"axes\"");
  const std::vector<std::string> top = {"name", "description", "base", "axes", "exclude"};
  for (auto it = grid.begin(); it != grid.end(); ++it)
    KVB_CHECK(std::find(top.begin(), top.end(), it.key()) != top.end(), "grid: unknown key '",
              it.key(), "'", did_you_mean(it.key(), top), "; allowed: ", join(top, ", "));
  GridPlan plan;
  plan.name = options.default_name;
  if (grid.contains("name")) {
    KVB_CHECK(grid["name"].is_string() && !grid["name"].get<std::string>().empty(),
              "grid.name: expected a non-empty string");
    plan.name = grid["name"];
  }
  if (grid.contains("description")) {
    KVB_CHECK(grid["description"].is_string(), "grid.description: expected a string");
    plan.description = grid["description"];
  }
  KVB_CHECK(grid.contains("base") && grid["base"].is_object(),
            "grid.base: missing or not an object (the run config every cell starts from)");
  json base = grid["base"];
  normalize_named(base);

  // Axes: key -> list of values (method values expanded).
  std::map<std::string, std::vector<json>> axes;
  std::map<std::string, std::vector<std::string>> axis_paths;
  if (grid.contains("axes")) {
    KVB_CHECK(grid["axes"].is_object(), "grid.axes: expected an object {\"dotted.key\": [values...]}");
    for (auto it = grid["axes"].begin(); it != grid["axes"].end(); ++it) {
      const std::string where = "grid.axes." + it.key();
      auto parts = split_path(it.key(), "grid.axes");
      KVB_CHECK(it.key() != "label", where, ": label is not a run setting");
      KVB_CHECK(it.value().is_array() && !it.value().empty(), where,
                ": expected a non-empty list of values");
      std::vector<json> values;
      for (size_t i = 0; i < it.value().size(); ++i) {
        const json& v = it.value()[i];
        if (it.key() == "method") {
          values.push_back(v);  // expanded below, once the cell count is known to be in bounds
        } else {
          KVB_CHECK(!v.is_array(), where, "[", i, "]: a value cannot be a list (lists are axes)");
          values.push_back(v);
        }
      }
      axes[it.key()] = std::move(values);
      axis_paths[it.key()] = std::move(parts);
    }
  }
  // List-valued params in the base method form an implicit method axis.
  bool base_method_axis = false;
  if (!axes.count("method") && base.contains("method") && base["method"].is_object() &&
      base["method"].contains("params") && base["method"]["params"].is_object()) {
    bool lists = false;
    for (const auto& p : base["method"]["params"]) lists = lists || p.is_array();
    if (lists) {
      axes["method"] = {base["method"]};
      axis_paths["method"] = {"method"};
      base_method_axis = true;
    }
  }
  // Cartesian product size, method lists counted unexpanded (saturating: no overflow).
  const size_t limit = options.max_cells;
  {
    size_t total = 1;
    for (const auto& [k, v] : axes) {
      size_t n = 0;
      if (k == "method") {
        for (const auto& m : v) n = std::min(limit + 1, n + method_value_count(m, limit));
      } else {
        n = v.size();
      }
      total = n > (limit + 1) / total ? limit + 1 : total * n;
    }
    KVB_CHECK(total <= limit,
              "grid: the axes (method parameter lists included) expand to more than ", limit,
              " cells; split the grid or shorten its lists");
  }
  if (axes.count("method")) {
    std::vector<json> expanded;
    const std::vector<json> raw = std::move(axes["method"]);
    for (size_t i = 0; i < raw.size(); ++i) {
      auto ex = expand_method_value(raw[i], base_method_axis ? std::string("grid.base.method")
                                                             : "grid.axes.method[" + std::to_string(i) + "]");
      expanded.insert(expanded.end(), ex.begin(), ex.end());
    }
    axes["method"] = std::move(expanded);
  }
  for (const auto& [k, v] : axes) plan.axis_keys.push_back(k);

  std::vector<ExcludeEntry> excludes;
  if (grid.contains("exclude")) {
    KVB_CHECK(grid["exclude"].is_array(), "grid.exclude: expected a list of {\"key\": value} objects");
    for (size_t i = 0; i < grid["exclude"].size(); ++i) {
      const json& e = grid["exclude"][i];
      const std::string where = "grid.exclude[" + std::to_string(i) + "]";
      KVB_CHECK(e.is_object() && !e.empty(), where, ": expected a non-empty object {\"key\": value}");
      ExcludeEntry x;
      x.entry = e;
      for (auto it = e.begin(); it != e.end(); ++it)
        x.conditions.emplace_back(split_path(it.key(), where), it.value());
      excludes.push_back(std::move(x));
    }
  }

  // Cartesian product size (guarded).
  size_t total = 1;
  for (const auto& [k, v] : axes) {
    total *= v.size();
    KVB_CHECK(total <= limit, "grid: the axes expand to more than ", limit, " cells");
  }
  plan.expanded = total;

  struct Bad {
    size_t expanded_index;
    std::string label, error;
  };
  std::vector<Bad> bad;
  std::set<std::string> seen;
  std::vector<std::string> keys = plan.axis_keys;
  for (size_t t = 0; t < total; ++t) {
    // Mixed radix, the last key fastest.
    std::vector<size_t> digit(keys.size());
    size_t rem = t;
    for (size_t k = keys.size(); k-- > 0;) {
      digit[k] = rem % axes[keys[k]].size();
      rem /= axes[keys[k]].size();
    }
    json raw = base;
    json assignment = json::object();
    std::vector<std::string> label_parts;
    for (size_t k = 0; k < keys.size(); ++k) {  // sorted: an ancestor key is applied before its children
      const json& v = axes[keys[k]][digit[k]];
      if (keys[k] == "method" || keys[k] == "protocol") raw[keys[k]] = v.is_string() ? json{{"name", v}} : v;
      else set_path(raw, axis_paths[keys[k]], v);
      assignment[keys[k]] = v;
      label_parts.push_back(keys[k] + "=" + value_label(keys[k], v));
    }
    const std::string label = label_parts.empty() ? "(base)" : join(label_parts, " ");
    apply_overrides(raw, options.sets);
    // Exclude entries match the cell as written and as resolved (defaults filled in); every entry
    // that matches counts a hit, so that an entry matching nothing can be reported.
    auto excluded = [&](const json& cfg) {
      bool hit = false;
      for (auto& x : excludes)
        if (entry_matches(x, cfg)) {
          x.hits++;
          hit = true;
        }
      if (hit) plan.excluded++;
      return hit;
    };
    if (excluded(raw)) continue;
    json resolved;
    try {
      resolved = resolve_run_config(raw);
    } catch (const Error& e) {
      bad.push_back({t, label, e.what()});
      continue;
    }
    if (excluded(resolved)) continue;
    GridCell c;
    c.label = label;
    c.assignment = assignment;
    c.resolved = resolved;
    c.config_hash = run_config_hash(resolved);
    if (!seen.insert(c.config_hash).second) {
      plan.duplicates++;
      continue;
    }
    const json& proto = resolved["protocol"];
    try {
      c.expected_samples = ProtocolRegistry::instance().get(proto["name"]).expected_samples(proto);
    } catch (const Error& e) {
      KVB_FAIL("grid cell '", label, "': ", e.what());
    }
    c.index = plan.cells.size();
    plan.cells.push_back(std::move(c));
  }
  if (!bad.empty()) {
    const Bad& b = bad.front();
    KVB_FAIL("grid", plan.name.empty() ? "" : " '" + plan.name + "'", ": cell ", b.expanded_index + 1,
             " of ", total, " (", b.label, ") is invalid: ", b.error,
             bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more invalid cells)" : "",
             b.error.find("method") != std::string::npos &&
                     b.error.find("unknown parameter") != std::string::npos
                 ? "; give per-method parameter lists in the method axis, e.g. {\"name\": \"m\", "
                   "\"params\": {\"p\": [1, 2]}}, or exclude the combination"
                 : "");
  }
  KVB_CHECK(!plan.cells.empty(), "grid", plan.name.empty() ? "" : " '" + plan.name + "'",
            ": no cells left after exclude (", plan.expanded, " expanded, ", plan.excluded, " excluded)");
  for (size_t i = 0; i < excludes.size(); ++i)
    if (excludes[i].hits == 0)
      plan.warnings.push_back("grid.exclude[" + std::to_string(i) + "] " + excludes[i].entry.dump() +
                              " matches no cell");

  // Every cell through the checks a run makes before its row (run_config.h), each input once.
  RunConfigChecker checker(
      ConfigCheckOptions{options.models_dir, options.data_dir, options.check_inputs});
  for (const auto& c : plan.cells) {
    try {
      checker.check(c.resolved);
    } catch (const Error& e) {
      KVB_FAIL("grid", plan.name.empty() ? "" : " '" + plan.name + "'", ": cell #", c.index, " (",
               c.label, "): ", e.what());
    }
  }
  return plan;
}

GridPlan load_grid(const std::string& path, GridOptions options) {
  if (options.default_name.empty()) {
    std::string stem = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    if (ends_with(stem, ".json")) stem = stem.substr(0, stem.size() - 5);
    options.default_name = stem;
  }
  json g = load_config_file(path);
  try {
    return expand_grid(g, options);
  } catch (const Error& e) {
    KVB_FAIL(path, ": ", e.what());
  }
}

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  auto num = [&](const std::string& s, int64_t* out) {
    if (s.empty() || s.size() > 9) return false;
    for (char ch : s)
      if (ch < '0' || ch > '9') return false;
    *out = std::stoll(s);
    return true;
  };
  Shard sh;
  KVB_CHECK(slash != std::string::npos && num(text.substr(0, slash), &sh.index) &&
                num(text.substr(slash + 1), &sh.count) && sh.count >= 1 && sh.index < sh.count,
            "--shard '", text, "': expected i/n with 0 <= i < n, e.g. 0/4");
  return sh;
}

std::vector<GridCell> shard_cells(const std::vector<GridCell>& cells, const Shard& shard) {
  std::vector<GridCell> out;
  for (const auto& c : cells)
    if (static_cast<int64_t>(c.index % static_cast<size_t>(shard.count)) == shard.index) out.push_back(c);
  return out;
}

CellState cell_state(ResultsDb& db, const GridCell& cell) {
  CellState s;
  auto run = db.find_run_by_hash(cell.config_hash);
  if (!run) {
    s.status = "new";
    return s;
  }
  s.status = to_string(run->status);
  s.samples = db.sample_count(run->id);
  s.error = run->error;
  return s;
}

namespace {

// A qa cell whose context prefills other cells can share (query-agnostic: the context is prefilled
// alone).
bool shares_context_prefill(const GridCell& c) {
  const nlohmann::json& p = c.resolved.at("protocol");
  return p.at("name") == "qa" && p.value("mode", std::string()) == "query_agnostic";
}

// How many samples of every sharing qa cell a pass of the grid computes, so that the recordings of
// a pass's contexts fit the process's shared-prefill budget (shared_prefill.h): the grid computes
// samples [0, W) of each such cell, then [W, 2W), ..., and the cells of a window replay its
// prefills. 0: one pass (sharing is off, fewer than two such cells, or every sample fits).
int64_t shared_prefill_window(const std::vector<GridCell>& cells, const std::string& models_dir) {
  const SharedPrefills& shared = SharedPrefills::instance();
  int64_t per_sample = 0, samples = 0, sharing = 0;
  std::map<std::string, std::optional<ModelConfig>> configs;  // by model: read once
  for (const GridCell& c : cells) {
    if (!shares_context_prefill(c)) continue;
    ++sharing;
    samples = std::max(samples, c.expected_samples);
    const std::string model = c.resolved.at("model");
    if (!configs.count(model)) {
      try {
        configs[model] = read_model_config(model, models_dir);
      } catch (const std::exception&) {
        configs[model] = std::nullopt;  // the cell's run says what is wrong with its model
      }
    }
    if (!configs[model]) continue;
    const ModelConfig& config = *configs[model];
    const int64_t length = c.resolved.at("protocol").value("length", int64_t{0});
    const int64_t tokens = length > 0 ? length : std::min<int64_t>(config.max_seq_len, 4096);
    const int64_t elem = c.resolved.value("dtype", std::string("fp32")) == "fp32" ? 4 : 2;
    per_sample = std::max(per_sample, recording_bytes_estimate(config, elem, tokens));
  }
  if (!shared.enabled() || sharing < 2 || per_sample <= 0) return 0;
  const int64_t window = std::max<int64_t>(1, shared.budget_bytes() / per_sample);
  return window >= samples ? 0 : window;
}

// One run_grid call: the cells' sample windows (shared_prefill_window), the cells in order, then
// the cells other processes held.
class GridExecution {
 public:
  GridExecution(const std::string& grid_name, const std::vector<GridCell>& cells, ResultsDb& db,
                const GridRunOptions& options)
      : name_(grid_name), cells_(cells), db_(db), o_(options),
        progress_(options, cells.size(), remaining_work(cells, db)) {}

  GridSummary run() {
    run_windows();
    if (!summary_.interrupted && !disk_full_) {
      SharedPrefills::instance().clear();
      wait_for_held(run_in_order());
    } else {
      summary_.not_reached = cells_.size();
      summary_.disk_full = disk_full_;
    }
    progress_.finish();
    summary_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return summary_;
  }

 private:
  static int64_t remaining_work(const std::vector<GridCell>& cells, ResultsDb& db) {
    int64_t work = 0;
    for (const auto& c : cells) {
      CellState s = cell_state(db, c);
      if (s.status != "done") work += std::max<int64_t>(0, c.expected_samples - s.samples);
    }
    return work;
  }

  bool stop_requested() const { return o_.stop && o_.stop->load() != 0; }

  // The sharing qa cells' sample windows but the last, cell after cell within each window; a cell
  // that fails or is held here meets the same fate in the last pass, which reports it. Each window
  // starts with an empty set of recordings.
  void run_windows() {
    const int64_t window = shared_prefill_window(cells_, o_.env.models_dir);
    int64_t most = 0;
    for (const GridCell& c : cells_)
      if (shares_context_prefill(c)) most = std::max(most, c.expected_samples);
    for (int64_t limit = window; window > 0 && limit < most; limit += window) {
      SharedPrefills::instance().clear();
      windows_run_ = true;
      for (size_t pos = 0; pos < cells_.size(); ++pos) {
        if (!shares_context_prefill(cells_[pos])) continue;
        if (stop_requested() || run_cell(pos, cells_[pos], limit).status == "interrupted")
          summary_.interrupted = true;
        if (summary_.interrupted || disk_full_) return;
      }
    }
  }

  // Every cell once, in order; returns the positions of those other live processes held.
  std::vector<size_t> run_in_order() {
    std::vector<size_t> held;  // positions (in cells_ and summary_.cells)
    for (size_t pos = 0; pos < cells_.size(); ++pos) {
      if (stop_requested()) {
        summary_.interrupted = true;
        summary_.not_reached = cells_.size() - pos;
        break;
      }
      summary_.cells.push_back(run_cell(pos, cells_[pos]));
      const CellResult& r = summary_.cells.back();
      count(r);
      if (r.status == "held") held.push_back(pos);
      if (r.status == "interrupted" || disk_full_) {
        summary_.interrupted = r.status == "interrupted";
        summary_.not_reached = cells_.size() - pos - 1;
        break;
      }
    }
    if (disk_full_) {
      progress_.line("grid: stopped: no room left to write (" + std::to_string(summary_.not_reached) +
                     " cells not reached); free space and re-run the same command, which resumes");
      summary_.disk_full = true;
      held.clear();  // nothing can be taken over without room to write
    }
    return held;
  }

  // Cells another live process held when reached: wait for them, so that a grid exits 0 only with
  // every cell done. A cell is checked in the DB (cheaply, nothing loaded) until its holder
  // finishes it, or is gone or failed it, and then run here (taken over or resumed from its
  // samples).
  void wait_for_held(std::vector<size_t> held) {
    if (!held.empty() && !summary_.interrupted)
      progress_.line("grid: " + std::to_string(held.size()) + " cell" + (held.size() == 1 ? "" : "s") +
                     " held by other processes; waiting for them");
    while (!held.empty() && !summary_.interrupted) {
      std::vector<size_t> still;
      for (size_t k = 0; k < held.size(); ++k) {
        if (stop_requested()) {
          summary_.interrupted = true;
          still.insert(still.end(), held.begin() + static_cast<std::ptrdiff_t>(k), held.end());
          break;
        }
        if (!poll_held(held[k])) still.push_back(held[k]);
        if (disk_full_) {
          summary_.disk_full = true;
          still.clear();
          break;
        }
      }
      held = std::move(still);
      if (summary_.interrupted || summary_.disk_full || held.empty()) break;
      // Sleep in slices, so that a stop request is seen at once.
      const auto wake = std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.held_poll_ms);
      while (std::chrono::steady_clock::now() < wake && !stop_requested())
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, o_.held_poll_ms)));
    }
    summary_.held = held.size();
  }

  // One look at a held cell: false while another live process still holds it.
  bool poll_held(size_t pos) {
    const GridCell& c = cells_[pos];
    CellResult& r = summary_.cells[pos];
    if (auto run = db_.find_run_by_hash(c.config_hash); run && run->status != RunStatus::kFailed) {
      if (run->status == RunStatus::kDone) {
        r.status = "skipped";
        r.error.clear();
        r.run_id = run->id;
        count(r);
        progress_.line("grid: #" + std::to_string(c.index) + " " + c.label + ": done by " +
                       (run->worker.empty() ? std::string("another process") : run->worker));
        return true;
      }
      if (auto l = db_.lease(run->id); l && l->live && !l->ours) return false;
    }
    r = run_cell(pos, c);
    count(r);
    if (r.status == "interrupted") summary_.interrupted = true;
    return r.status != "held";
  }

  void count(const CellResult& r) {
    if (r.status == "ran") summary_.ran++;
    else if (r.status == "skipped") summary_.skipped++;
    else if (r.status == "failed") summary_.failed++;
  }

  // The run's log lines: samples advance the progress, a prefill's progress is a detail, the rest
  // shows when verbose (resuming and taking over always, but a window's resume is no news).
  std::function<void(const std::string&)> cell_log(bool windowed) {
    return [this, windowed](const std::string& s) {
      if (s.rfind("sample ", 0) == 0 || s.rfind("batch ", 0) == 0) progress_.sample_done();
      if (s.rfind("prefill ", 0) == 0)
        progress_.detail(s);
      else if (o_.verbose || (s.rfind("resuming", 0) == 0 && !windowed) || s.rfind("taking over", 0) == 0)
        progress_.line("kvbench: " + s);
      if (stop_requested()) throw GridInterrupted();
    };
  }

  // One attempt at a cell: "ran", "skipped" (done before), "failed", "interrupted", "held"
  // (another live process computes it), or "window" (stopped at sample_limit >= 0, as asked).
  CellResult run_cell(size_t pos, const GridCell& c, int64_t sample_limit = -1) {
    progress_.begin_cell(pos, c);
    CellResult r;
    r.index = c.index;
    r.label = c.label;
    r.config_hash = c.config_hash;
    RunEnv env = o_.env;
    env.grid = name_;
    env.sample_limit = sample_limit;
    env.log = cell_log(sample_limit >= 0 || windows_run_);
    const auto c0 = std::chrono::steady_clock::now();
    try {
      RunOutcome o = execute_run(c.resolved, db_, env);
      r.run_id = o.run_id;
      r.samples_computed = o.samples_computed;
      r.status = o.skipped ? "skipped" : o.unfinished ? "window" : "ran";
    } catch (const GridInterrupted& e) {
      r.status = "interrupted";
      r.error = e.what();
    } catch (const RunHeldElsewhere& e) {
      r.status = "held";
      r.error = e.holder();
    } catch (const DiskFullError& e) {
      // Every later cell would fail the same way (and each write a failure row, while there is
      // room for one): stop here; what is committed stays, and a re-run resumes.
      r.status = "failed";
      r.error = e.what();
      disk_full_ = true;
    } catch (const std::exception& e) {
      r.status = "failed";
      r.error = e.what();
      record_early_failure(c, r);
    }
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    if (r.status != "window") progress_.end_cell(r);
    return r;
  }

  // execute_run records failures once the run has begun; record earlier ones (e.g. a model that
  // does not load) too, so the database shows every cell's fate; never on a run another live
  // process holds (begin_run reports it and changes nothing).
  void record_early_failure(const GridCell& c, CellResult& r) {
    try {
      auto existing = db_.find_run_by_hash(c.config_hash);
      if (!existing || existing->status == RunStatus::kRunning) {
        RunInfo info = db_.begin_run(spec_for(c, name_));
        if (!info.already_done && info.held_by.empty()) db_.fail_run(info.id, r.error);
        r.run_id = info.id;
      } else {
        r.run_id = existing->id;
      }
    } catch (const std::exception& e2) {
      r.error += std::string(" (and recording the failure failed: ") + e2.what() + ")";
    }
  }

  const std::string& name_;
  const std::vector<GridCell>& cells_;
  ResultsDb& db_;
  const GridRunOptions& o_;
  Progress progress_;
  GridSummary summary_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  bool disk_full_ = false;    // a cell failed for want of room: the grid stops
  bool windows_run_ = false;  // sample windows ran before the cells' last pass
};

}  // namespace

GridSummary run_grid(const std::string& grid_name, const std::vector<GridCell>& cells, ResultsDb& db,
                     const GridRunOptions& options) {
  return GridExecution(grid_name, cells, db, options).run();
}

}  // namespace kvb
