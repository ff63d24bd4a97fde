#pragma once
// Helpers shared by the grid, leaderboard and compare tests: spawning kvbench in the background,
// writing files, and a canonical dump of a results database to compare two of them row by row.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb::gridtest {

inline std::string source_dir() {
  if (const char* s = std::getenv("KVB_SOURCE_DIR"); s && *s) return s;
  std::string f = test::fixtures_dir();  // <source>/tests/fixtures
  return f.substr(0, f.rfind("/tests/fixtures"));
}

inline void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts `argv[0] argv[1..]` (argv[0] a path) with stdout/stderr to files and extra environment
// variables; returns the pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path,
                   const std::string& err_path, const std::map<std::string, std::string>& env = {}) {
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// waitpid; returns the exit code, or 128 + signal when killed.
inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Every row of a results DB that does not depend on timing, keyed by config hash: the run (status,
// config, method, ...), its samples (index, key, output minus `baseline_from_cache`, which records
// whether this process found the full-cache baseline on disk) and its run-level metrics (minus the
// process's peak RSS).
struct DbDump {
  std::map<std::string, std::string> runs;                              // hash -> description
  std::map<std::string, std::vector<std::string>> samples;              // hash -> rows
  std::map<std::string, std::map<std::string, double>> metrics;         // hash -> name -> value
};

inline DbDump dump_db(const std::string& path) {
  ResultsDb db(path);
  DbDump d;
  for (const auto& r : db.list_runs()) {
    d.runs[r.config_hash] = std::string(to_string(r.status)) + "|" + r.config_json + "|" + r.method + "|" +
                            r.model + "|" + r.dataset + "|" + r.protocol + "|" + r.grid + "|" +
                            (r.simulated ? "sim" : "real") + "|" + r.error;
    for (const auto& s : db.samples(r.id)) {
      nlohmann::json j = nlohmann::json::parse(s.output_json);
      j.erase("baseline_from_cache");
      d.samples[r.config_hash].push_back(std::to_string(s.index) + "|" + s.key + "|" + j.dump());
    }
    for (const auto& m : db.metrics(r.id))
      if (m.name != "peak_memory_bytes")
        d.metrics[r.config_hash][m.name + (m.layer ? "@" + std::to_string(*m.layer) : "")] = m.value;
  }
  return d;
}

}  // namespace kvb::gridtest
