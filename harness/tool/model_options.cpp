#include "harness/tool/model_options.h"

#include <ATen/Parallel.h>

#include <iostream>

#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/engine/thread_policy.h"

namespace kvb::tool {

void add_model_options(CLI::App* app, ModelArgs* a) {
  app->add_option("--model,-m", a->model,
                  "model: a path (HF directory, llama2.c .bin, .gguf, or a directory holding one "
                  ".bin or .gguf), a name in the models path, or synthetic:<preset>")
      ->capture_default_str();
  app->add_option("--models-dir", a->models_dir,
                  "extra directory to look models up in (before $KVBENCH_MODELS, ./models, "
                  "../shared/models)");
  app->add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  app->add_option("--dtype", a->dtype, "fp32 | bf16 | fp16")->capture_default_str();
  app->add_option("--threads", a->threads, "CPU threads (0: LibTorch's default)");
  app->add_option("--synthetic-seed", a->synthetic_seed, "weights seed for synthetic:<preset>");
}

std::shared_ptr<Model> load_model_from_args(const ModelArgs& a) {
  check_thread_count(a.threads, "--threads");
  apply_thread_policy(a.threads);
  LoadOptions o;
  o.device = a.device;
  o.dtype = a.dtype;
  o.models_dir = a.models_dir;
  o.synthetic_seed = a.synthetic_seed;
  auto m = load_model(a.model, o);
  std::cerr << "kvbench: loaded " << m->config.name << " (" << m->config.format << ", "
            << m->config.parameter_count() << " params) from " << m->source << " on "
            << m->device.str() << " as " << dtype_name(m->dtype) << "\n";
  return m;
}

void check_db_path(const std::string& path, const std::string& flag) {
  KVB_CHECK(!path.empty() && path != ":memory:", flag, ": '", path,
            "' is a database SQLite discards at exit, so the results would be lost; give a file path");
}

std::unique_ptr<Tokenizer> load_tokenizer(const Model& m) {
  KVB_CHECK(!m.tokenizer_path.empty(), m.source,
            ": no tokenizer.model or tokenizer.json found beside the model (text needs a tokenizer)");
  auto t = std::make_unique<Tokenizer>(m.tokenizer_path);
  KVB_CHECK(t->vocab_size() == m.config.vocab_size, t->path(), ": tokenizer has ", t->vocab_size(),
            " pieces but the model's vocabulary is ", m.config.vocab_size);
  return t;
}

}  // namespace kvb::tool
