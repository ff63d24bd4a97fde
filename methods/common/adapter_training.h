#pragma once
// The loop of the adapter trainers (DMS's decision adapters, KV Packet's soft header and trailer):
// Adam over a few tensors of a frozen model, each step's metrics averaged over a logging interval
// and reported with the elapsed time and an ETA.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "harness/train/adapter_adam.h"

namespace kvb {

struct AdapterTraining {
  int64_t steps = 0;
  int64_t log_every = 1;
  std::function<void(const std::string&)> log;  // progress lines; null: none
};

// One optimizer step (`adam.step` included): that step's metrics, the same count every step.
using AdapterStep = std::function<std::vector<double>(int64_t step, AdapterAdam& adam)>;
// The metrics averaged over the interval just ended (every log_every steps, and the last step):
// the trainer records them and writes their summary into `line`, which the loop prefixes with
// "step i/steps: " and ends with the elapsed time and ETA.
using AdapterInterval = std::function<void(const std::vector<double>& means, std::ostream& line)>;

// params: the adapter's tensors; they require grad while the loop runs and no longer after it.
void train_adapter_tensors(const std::vector<at::Tensor*>& params, const AdapterTraining& t,
                           const AdapterStep& step, const AdapterInterval& interval);

// The metadata a trained adapter is saved with: the model it was trained against and the steps that
// trained it ("model", "trained_steps"), with the method's own settings and results (`method`).
std::map<std::string, std::string> trained_adapter_metadata(
    const std::string& model, int64_t steps, std::map<std::string, std::string> method);

}  // namespace kvb
