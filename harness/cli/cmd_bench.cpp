// kvbench bench: engine throughput on one model — prefill tok/s, decode tok/s at several batch sizes and
// thread counts over a full-context generation, and the host's share of each decode step. Warm-up plus
// repeats; medians and spread. (The `perf` protocol of the results store builds on the same loop.)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/engine/thread_policy.h"
#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/engine/engine.h"

namespace kvb::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      KVB_CHECK(used == item.size() && v > 0, flag, ": '", item, "' is not a positive integer");
      out.push_back(v);
    } catch (const std::logic_error&) {
      KVB_FAIL(flag, ": '", item, "' is not a positive integer");
    }
  }
  KVB_CHECK(!out.empty(), flag, ": empty list");
  return out;
}

// What one bench invocation can do in reasonable time and memory: every repeat generates the whole
// context for every sequence of the batch, and the batch's prompts and KV cache grow with
// batch x context tokens.
constexpr int64_t kMaxBenchBatch = 1024;
constexpr int64_t kMaxBenchRepeats = 1000;

}  // namespace

void register_bench(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string batches = "1,16";
    std::string threads = "1,2";
    int64_t context = 512;
    int64_t repeats = 3;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("bench", "engine throughput: prefill and decode tok/s by batch size and threads");
  add_model_options(sub, &args->model);
  sub->add_option("--batch", args->batches, "comma-separated batch sizes")->capture_default_str();
  sub->add_option("--threads-list", args->threads, "comma-separated CPU thread counts")->capture_default_str();
  sub->add_option("--context", args->context, "tokens per sequence at the end of generation (BOS + new)")->capture_default_str();
  sub->add_option("--repeats", args->repeats, "timed repeats after one warm-up")->capture_default_str();
  sub->add_flag("--json", args->json, "print JSON instead of a table");
  sub->callback([args] {
    auto batches = parse_list(args->batches, "--batch");
    auto threads = parse_list(args->threads, "--threads-list");
    for (int64_t th : threads) check_thread_count(th, "--threads-list", /*allow_default=*/false);
    for (int64_t b : batches)
      KVB_CHECK(b <= kMaxBenchBatch, "--batch: ", b, " is out of range; expected 1..",
                kMaxBenchBatch);
    KVB_CHECK(args->context >= 2 && args->context <= kMaxContextTokens,
              "--context: ", args->context, " is out of range; expected 2..", kMaxContextTokens,
              " (and at most the model's context)");
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    KVB_CHECK(max_batch * args->context <= kMaxContextTokens, "--batch ", max_batch,
              " x --context ", args->context, ": ", max_batch * args->context,
              " tokens in flight; expected at most ", kMaxContextTokens);
    KVB_CHECK(args->repeats >= 1 && args->repeats <= kMaxBenchRepeats, "--repeats: ", args->repeats,
              " is out of range; expected 1..", kMaxBenchRepeats);
    auto model = load_model_from_args(args->model);
    KVB_CHECK(model->config.max_seq_len <= 0 || args->context <= model->config.max_seq_len,
              "--context: ", args->context, " is longer than the context of model ",
              model->config.name, " (", model->config.max_seq_len, " tokens)");
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t th : threads) {
      apply_thread_policy(static_cast<int>(th));
      for (int64_t B : batches) {
        // Decode: from BOS, generate context-1 tokens per sequence, never stopping early.
        GenerateOptions g;
        g.max_new_tokens = args->context - 1;
        g.stop_ids = {-1};
        std::vector<std::vector<int64_t>> prompts(B, std::vector<int64_t>{model->config.bos_id});
        // Prefill: one full-context prompt per sequence.
        std::vector<std::vector<int64_t>> long_prompts(B);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < args->context; ++i)
            long_prompts[b].push_back(i == 0 ? model->config.bos_id : 3 + (i * 31 + b * 7) % (model->config.vocab_size - 3));
        std::vector<double> decode_tps, prefill_tps, step_ms;
        for (int64_t r = 0; r <= args->repeats; ++r) {
          Engine e(model, make_default_kv(*model));
          auto res = e.generate(prompts, g);
          auto t0 = std::chrono::steady_clock::now();
          std::vector<int64_t> seqs;
          for (int64_t b = 0; b < B; ++b) seqs.push_back(e.new_sequence());
          e.prefill(seqs, long_prompts);
          const double pf_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r == 0) continue;  // warm-up
          decode_tps.push_back(res.decode_tokens / res.decode_s);
          step_ms.push_back(1e3 * res.decode_s / res.decode_steps);
          prefill_tps.push_back(B * args->context / pf_s);
        }
        auto mm = std::minmax_element(decode_tps.begin(), decode_tps.end());
        rows.push_back({{"threads", th},
                        {"batch", B},
                        {"context", args->context},
                        {"decode_tok_s", median(decode_tps)},
                        {"decode_tok_s_min", *mm.first},
                        {"decode_tok_s_max", *mm.second},
                        {"decode_step_ms", median(step_ms)},
                        {"prefill_tok_s", median(prefill_tps)},
                        {"repeats", args->repeats}});
        std::cerr << "kvbench: threads " << th << " batch " << B << ": decode "
                  << median(decode_tps) << " tok/s\n";
      }
    }
    if (args->json) {
      std::cout << nlohmann::json({{"model", model->config.name},
                                   {"dtype", dtype_name(model->dtype)},
                                   {"device", model->device.str()},
                                   {"rows", rows}})
                       .dump(2)
                << "\n";
      return;
    }
    std::cout << "| threads | batch | decode tok/s (median [min, max]) | ms / decode step | prefill tok/s |\n"
              << "|---:|---:|---:|---:|---:|\n";
    for (const auto& r : rows) {
      std::cout << std::fixed << std::setprecision(0) << "| " << r["threads"].get<int64_t>() << " | "
                << r["batch"].get<int64_t>() << " | " << r["decode_tok_s"].get<double>() << " ["
                << r["decode_tok_s_min"].get<double>() << ", " << r["decode_tok_s_max"].get<double>()
                << "] | " << std::setprecision(3) << r["decode_step_ms"].get<double>() << " | "
                << std::setprecision(0) << r["prefill_tok_s"].get<double>() << " |\n";
    }
  });
}

}  // namespace kvb::cli
