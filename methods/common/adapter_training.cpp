#include "methods/common/adapter_training.h"

#include <sstream>

#include "harness/common/internal_error.h"
#include "harness/common/progress_eta.h"

namespace kvb {

void train_adapter_tensors(const std::vector<at::Tensor*>& params, const AdapterTraining& t,
                           const AdapterStep& step, const AdapterInterval& interval) {
  for (auto* p : params) p->requires_grad_(true);
  AdapterAdam adam(params);
  std::vector<double> sums;
  int64_t n = 0;
  const Stopwatch clock;
  for (int64_t s = 0; s < t.steps; ++s) {
    const std::vector<double> metrics = step(s, adam);
    sums.resize(metrics.size(), 0.0);
    for (size_t i = 0; i < metrics.size(); ++i) sums[i] += metrics[i];
    ++n;
    if ((s + 1) % t.log_every != 0 && s + 1 != t.steps) continue;
    std::vector<double> means(sums.size());
    for (size_t i = 0; i < sums.size(); ++i) means[i] = sums[i] / static_cast<double>(n);
    std::ostringstream line;
    line << "step " << s + 1 << "/" << t.steps << ": ";
    interval(means, line);
    line << ", "
         << elapsed_and_eta(clock.seconds(), static_cast<double>(s + 1),
                            static_cast<double>(t.steps));
    if (t.log) t.log(line.str());
    sums.assign(sums.size(), 0.0);
    n = 0;
  }
  for (auto* p : params) p->requires_grad_(false);
}

std::map<std::string, std::string> trained_adapter_metadata(
    const std::string& model, int64_t steps, std::map<std::string, std::string> method) {
  KVB_ASSERT(!method.count("model") && !method.count("trained_steps"), "adapter_training",
             "a trainer's metadata restates the model or its steps");
  method["model"] = model;
  method["trained_steps"] = std::to_string(steps);
  return method;
}

}  // namespace kvb
