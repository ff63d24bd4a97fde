// The peer side of scripts/llamacpp-agreement.sh: runs llama.cpp (built from the llama-cpp-python
// sdist, linked against its libllama; nothing of it is in this repository) teacher-forced over given
// token ids and prints, for every position, the NLL of the next id and the top-k logits, as JSON on
// stdout. kvbench's side of the comparison is `kvbench score --ids ... --top-k K`.
//
//   llamacpp_logits MODEL.gguf THREADS TOP_K KV_TYPE(f32|f16) ID ID ID ...
//
// The whole sequence is one batch (n_batch = n_ubatch = n_ctx = number of ids), every row's logits
// kept, flash attention off, so what differs from kvbench is llama.cpp's arithmetic, not its
// scheduling. KV_TYPE is the cache's storage type: f32 matches kvbench's fp32 cache; f16 is
// llama.cpp's default.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <llama.h>

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s MODEL.gguf THREADS TOP_K f32|f16 ID ID [ID...]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  const int threads = std::atoi(argv[2]);
  const int top_k = std::atoi(argv[3]);
  const std::string kv_type = argv[4];
  std::vector<llama_token> ids;
  for (int i = 5; i < argc; ++i) ids.push_back(static_cast<llama_token>(std::atol(argv[i])));
  const int n = static_cast<int>(ids.size());

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(path, mp);
  if (!model) {
    std::fprintf(stderr, "llamacpp_logits: cannot load %s\n", path);
    return 1;
  }
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n);
  cp.n_batch = static_cast<uint32_t>(n);
  cp.n_ubatch = static_cast<uint32_t>(n);
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = kv_type == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llamacpp_logits: cannot create a context of %d tokens\n", n);
    return 1;
  }

  llama_batch batch = llama_batch_init(n, 0, 1);
  batch.n_tokens = n;
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llamacpp_logits: llama_decode failed\n");
    return 1;
  }

  // Row i predicts ids[i + 1]; the last row predicts nothing.
  std::printf("{\"vocab\":%d,\"n\":%d,\"rows\":[", vocab, n - 1);
  std::vector<int> order(static_cast<size_t>(vocab));
  for (int i = 0; i + 1 < n; ++i) {
    const float* logits = llama_get_logits_ith(ctx, i);
    double max_logit = logits[0];
    for (int v = 1; v < vocab; ++v) max_logit = std::max(max_logit, static_cast<double>(logits[v]));
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - max_logit);
    const double nll = -(static_cast<double>(logits[ids[i + 1]]) - max_logit - std::log(sum));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::printf("%s{\"nll\":%.9g,\"top\":[", i ? "," : "", nll);
    for (int k = 0; k < top_k; ++k)
      std::printf("%s[%d,%.9g]", k ? "," : "", order[k], static_cast<double>(logits[order[k]]));
    std::printf("]}");
  }
  std::printf("]}\n");

  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
