// kvbench show: one run of a results database as a person reads it: its config, provenance and
// run-level metrics, and its first samples' stored inputs, outputs and scores. Output stays bounded
// whatever the run holds: --samples caps the samples shown, and long strings and long arrays in a
// sample are cut with a marker that says how much was left out.

#include <sys/stat.h>

#include <iomanip>
#include <iostream>
#include <sstream>

#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/text_escape.h"
#include "harness/report/compare.h"
#include "harness/store/results_db.h"

namespace kvb::cli {

namespace {

// Cuts every string longer than `max_chars` bytes (at a UTF-8 character boundary) and every array
// longer than `max_items`, each with a marker naming what was left out.
nlohmann::json bounded(const nlohmann::json& v, size_t max_chars, size_t max_items) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() <= max_chars) return v;
    size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not mid-character
    return s.substr(0, cut) + " [... " + std::to_string(s.size() - cut) + " more bytes of " +
           std::to_string(s.size()) + "]";
  }
  if (v.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < v.size() && i < max_items; ++i) out.push_back(bounded(v[i], max_chars, max_items));
    if (v.size() > max_items)
      out.push_back("[... " + std::to_string(v.size() - max_items) + " more items of " + std::to_string(v.size()) + "]");
    return out;
  }
  if (v.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = bounded(it.value(), max_chars, max_items);
    return out;
  }
  return v;
}

nlohmann::json metric_json(const Metric& m) {
  nlohmann::json j = {{"name", m.name}, {"value", m.value}, {"unit", m.unit}, {"direction", to_string(m.direction)}};
  if (m.n) j["n"] = *m.n;
  if (m.ci_low) j["ci_low"] = *m.ci_low;
  if (m.ci_high) j["ci_high"] = *m.ci_high;
  return j;
}

std::string indented(const std::string& text, const std::string& pad) {
  std::istringstream in(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(in, line)) out << pad << line << "\n";
  return out.str();
}

}  // namespace

void register_show(CLI::App& app) {
  struct Args {
    std::string ref;
    std::string db = "results/kvbench.sqlite";
    int64_t samples = 3;
    int64_t max_chars = 300;
    int64_t max_items = 32;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "show", "print one run: its config, provenance, metrics and first samples' inputs, outputs and scores");
  sub->add_option("run", args->ref, "a run id or a config hash prefix (at least 4 hex digits)")->required();
  sub->add_option("--db", args->db, "results database")->capture_default_str();
  sub->add_option("--samples,-n", args->samples, "samples to show (0: none, -1: all)")->capture_default_str();
  sub->add_option("--max-chars", args->max_chars,
                  "cut a sample's strings (prompts, outputs) longer than this many bytes, with a marker")
      ->capture_default_str();
  sub->add_option("--max-items", args->max_items, "cut a sample's arrays longer than this, with a marker")
      ->capture_default_str();
  sub->add_flag("--json", args->json, "JSON output");
  sub->callback([args] {
    KVB_CHECK(args->samples >= -1, "--samples: expected -1 (all), 0 or more, got ", args->samples);
    KVB_CHECK(args->max_chars >= 1, "--max-chars: expected at least 1, got ", args->max_chars);
    KVB_CHECK(args->max_items >= 1, "--max-items: expected at least 1, got ", args->max_items);
    struct stat st {};
    KVB_CHECK(::stat(args->db.c_str(), &st) == 0, args->db, ": no such results database");  // never create one
    ResultsDb db(args->db, ResultsDb::read_only_options());
    db.check_integrity();  // a damaged page fails here instead of showing garbled or missing rows
    const RunRow run = find_run_ref(db, args->ref);
    const nlohmann::json config = parse_json(run.config_json, "run " + std::to_string(run.id) + " config");
    const nlohmann::json provenance = parse_json(run.provenance_json, "run " + std::to_string(run.id) + " provenance");
    nlohmann::json metrics = nlohmann::json::array();
    size_t per_layer = 0;
    for (const auto& m : db.metrics(run.id)) {
      if (m.layer || m.head) ++per_layer;
      else metrics.push_back(metric_json(m));
    }
    const std::vector<SampleRow> rows = db.samples(run.id);
    const size_t shown = args->samples < 0 ? rows.size() : std::min(rows.size(), static_cast<size_t>(args->samples));
    nlohmann::json samples = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) {
      const nlohmann::json out = parse_json(rows[i].output_json, "run " + std::to_string(run.id) + " sample " +
                                                                     std::to_string(rows[i].index));
      samples.push_back({{"index", rows[i].index},
                         {"key", rows[i].key},
                         {"output", bounded(out, static_cast<size_t>(args->max_chars), static_cast<size_t>(args->max_items))}});
    }
    nlohmann::json j = {{"run_id", run.id},
                        {"config_hash", run.config_hash},
                        {"status", to_string(run.status)},
                        {"error", run.error},
                        {"method", run.method},
                        {"model", run.model},
                        {"protocol", run.protocol},
                        {"dataset", run.dataset},
                        {"grid", run.grid},
                        {"simulated", run.simulated},
                        {"attempts", run.attempts},
                        {"created_at", run.created_at},
                        {"finished_at", run.finished_at},
                        {"wall_s", run.wall_s ? nlohmann::json(*run.wall_s) : nlohmann::json(nullptr)},
                        {"config", config},
                        {"provenance", provenance},
                        {"metrics", metrics},
                        {"per_layer_metric_rows", per_layer},
                        {"samples_total", rows.size()},
                        {"samples_shown", shown},
                        {"samples", samples}};
    if (args->json) {
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::ostringstream os;
    os << "run " << run.id << "  " << run.config_hash << "  " << to_string(run.status);
    if (run.wall_s) os << "  " << std::fixed << std::setprecision(1) << *run.wall_s << "s";
    os << "\n  method " << run.method << ", model " << run.model << ", protocol " << run.protocol << ", dataset "
       << run.dataset << (run.grid.empty() ? "" : ", grid " + run.grid) << (run.simulated ? " (simulated)" : "") << "\n";
    if (!run.error.empty()) os << "  error: " << run.error << "\n";
    os << "config:\n" << indented(config.dump(2), "  ");
    os << "provenance:\n" << indented(provenance.dump(2), "  ");
    os << "metrics:" << (metrics.empty() ? " (none)" : "") << "\n";
    for (const auto& m : metrics) {
      os << "  " << std::left << std::setw(32) << m["name"].get<std::string>() << std::right << " "
         << m["value"].dump();
      if (!m["unit"].get<std::string>().empty()) os << " " << m["unit"].get<std::string>();
      if (m.contains("ci_low")) os << "  [" << m["ci_low"].dump() << ", " << m["ci_high"].dump() << "]";
      os << "\n";
    }
    if (per_layer > 0) os << "  (and " << per_layer << " per-layer or per-head rows, not shown)\n";
    os << "samples: " << shown << " of " << rows.size() << " shown\n";
    for (const auto& s : samples) {
      os << "  #" << s["index"].get<int64_t>() << (s["key"].get<std::string>().empty() ? "" : "  key " + s["key"].get<std::string>()) << "\n";
      const nlohmann::json& out = s["output"];
      if (!out.is_object()) {
        os << "    " << out.dump() << "\n";
        continue;
      }
      for (auto it = out.begin(); it != out.end(); ++it)
        os << "    " << it.key() << ": " << (it->is_string() ? it->get<std::string>() : it->dump()) << "\n";
    }
    std::cout << terminal_text(os.str());  // names, errors and outputs come from the DB
  });
}

}  // namespace kvb::cli
