#include "harness/serve/serving_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/metrics/statistics.h"

namespace kvb {

double ServeRequestResult::tpot_ms() const {
  return output > 1 ? (finish_ms - first_token_ms) / static_cast<double>(output - 1) : 0.0;
}

namespace {

struct Request {
  size_t index = 0;          // in the trace
  int64_t prompt = 0;        // tokens whose KV must exist before the next token (input, or input +
                             // generated after a preemption: vLLM's recompute)
  int64_t kv_tokens = 0;     // tokens whose KV is held
  int64_t generated = 0;     // output tokens emitted so far
  double reserved = 0;       // bytes reserved in the pool
  double ready_ms = 0;       // prefix-store load finished
  bool fresh = false;        // admitted in this iteration, not yet given any token
  bool transferred = false;  // prefilled on a prefill instance, its KV sent here (P/D)
  double prefill_start_ms = -1;   // its first prefill chunk's iteration began (P/D layer-wise)
  int64_t prefill_chunks = 0;     // chunks its prompt took
  PrefixCache* remote = nullptr;  // another instance's store the router said to fetch from
  double remote_bytes = 0;        // fetched from it at admission
  bool compressed = true;         // held at the method's footprint (false: uncompressed, until
                                  // the on_pressure policy compresses it)
  bool in_prefill() const { return kv_tokens < prompt; }
};

// The mean output length of the requests finished so far (admission by prediction reads it).
struct RunningMean {
  double sum = 0;
  int64_t n = 0;
  double value() const { return n > 0 ? sum / static_cast<double>(n) : 0.0; }
};

// Admission leaves this share of the pool for growth (vLLM's watermark is 1% of the blocks).
constexpr double kAdmitFraction = 0.99;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// One serving instance: its queue, running batch, KV pool and (local or shared) prefix store. The
// trace, the footprint curve, the settings and the per-request results are shared by all.
class Instance {
 public:
  Instance(const RequestTrace& trace, const FootprintCurve& kv, const FootprintCurve* dense,
           const ServeTarget& target, const ServeHardware& hw, const ServeConfig& config,
           ServeResult& result, PrefixCache* cache, RunningMean* mean_output)
      : trace_(trace),
        kv_(kv),
        dense_(config.kv_policy == KvPolicy::kOnPressure ? dense : nullptr),
        target_(target),
        hw_(hw),
        cfg_(config),
        result_(result),
        cache_(cache),
        mean_output_(mean_output) {}

  // The curve a request's KV follows now: the method's, or the uncompressed one under on_pressure
  // until the scheduler compresses it.
  const FootprintCurve& kv_of(const Request& r) const {
    return r.compressed || !dense_ ? kv_ : *dense_;
  }
  // The size prefix-store blocks have.
  const FootprintCurve& block_kv() const {
    return dense_ && cfg_.prefix_blocks == PrefixBlocks::kAsHeld ? *dense_ : kv_;
  }

  double now = 0;      // this instance's clock (ms)
  int64_t routed = 0;  // requests routed here
  double busy_ms = 0, memory_bound_ms = 0, pcie_bound_ms = 0;
  double w_running = 0, w_util = 0, w_waste = 0, w_waste_den = 0;

  enum class Role { kBoth, kPrefill, kDecode };
  Role role = Role::kBoth;
  std::vector<Request> handoffs;  // prefill role: prompts done, for the cluster to send on
  double link_free_ms = 0;        // prefill role: when its network link has sent what it was given

  // A request whose prompt a prefill instance computed; its KV lands at r.ready_ms.
  void accept(const Request& r) {
    waiting_.push_back(r);
    routed++;
  }

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t load() const { return static_cast<int64_t>(waiting_.size() + running_.size()); }
  const PrefixCache* cache() const { return cache_; }

  // remote: another instance's prefix store to fetch the prompt's prefix from (Mooncake's
  // conductor), or null.
  void route(size_t index, PrefixCache* remote = nullptr) {
    Request r;
    r.index = index;
    r.compressed = dense_ == nullptr;
    r.prompt = result_.per_request[index].input;
    r.remote = remote == cache_ ? nullptr : remote;
    waiting_.push_back(r);
    routed++;
  }

  // Prompt tokens still to prefill here, queued or running (the conductor's queueing estimate).
  int64_t queued_prefill_tokens() const {
    int64_t n = 0;
    for (const Request& r : waiting_) n += r.prompt;
    for (const Request& r : running_) n += std::max<int64_t>(0, r.prompt - r.kv_tokens);
    return n;
  }

  // One scheduler iteration at `now`, or a wait (for a prefix load or next_arrival_ms), or the
  // rejection of a head request that cannot fit even alone.
  void step(double next_arrival_ms) {
    admit(now);
    schedule(now);
    if (scheduled_.empty()) {
      double wake = next_arrival_ms;
      for (const Request& r : running_)
        if (r.ready_ms > now) wake = std::min(wake, r.ready_ms);
      if (std::isfinite(wake) && wake > now && !running_.empty()) {
        now = wake;
        return;
      }
      if (!waiting_.empty() && running_.empty()) {
        reject(waiting_.front().index);  // larger than the whole pool
        waiting_.pop_front();
        return;
      }
      KVB_ASSERT(running_.empty() && waiting_.empty(), "serving_sim", "the scheduler stalled with ",
                 running_.size(), " running and ", waiting_.size(), " waiting requests");
      return;
    }
    // Roofline time of the iteration.
    // Prefill chunks read their sequence's whole KV; a decode step reads what the method reads
    // (read-time selection reads less) and pulls what it pulls from the host (tiering), the PCIe
    // transfers overlapping the step as SpeCache's prefetch and TTKV's streaming do.
    // Compressions the scheduler applied this iteration read the uncompressed KV once and write
    // the compressed one.
    double flops = 0, bytes = target_.weight_bytes + compress_bytes_, h2d = 0;
    compress_bytes_ = 0;
    for (const auto& [ri, n] : scheduled_) {
      const Request& r = running_[ri];
      const FootprintCurve& kv = kv_of(r);
      const double past = static_cast<double>(r.kv_tokens);
      flops += static_cast<double>(n) * target_.flops_per_token +
               target_.attn_flops_per_pair * static_cast<double>(n) * (past + (n + 1) / 2.0);
      if (r.in_prefill()) {
        bytes += kv.device_bytes(r.kv_tokens + n);
      } else {
        const double read = kv.decode_read_bytes(r.kv_tokens + n);
        bytes += read;
        h2d += kv.h2d_bytes_per_token(r.kv_tokens + n);
        if (cfg_.allocator == KvAllocator::kPaged) {
          // The block table (4 bytes a block, read by every layer's kernel) and the kernel's
          // indirection cost.
          const double blocks =
              static_cast<double>((r.kv_tokens + n + cfg_.block_tokens - 1) / cfg_.block_tokens);
          bytes += 4.0 * blocks * static_cast<double>(std::max<int64_t>(1, target_.layers)) +
                   (hw_.paged_attention_slowdown - 1.0) * read;
        }
      }
    }
    const double compute_ms = flops / (hw_.tflops * 1e12) * 1e3;
    const double memory_ms = bytes / (hw_.hbm_gbps * 1e9) * 1e3;
    const double pcie_ms = h2d / (hw_.h2d_gbps * 1e9) * 1e3;
    const double dt = std::max({compute_ms, memory_ms, pcie_ms}) + hw_.iteration_overhead_ms;
    if (pcie_ms > std::max(compute_ms, memory_ms))
      pcie_bound_ms += dt;
    else if (memory_ms >= compute_ms)
      memory_bound_ms += dt;
    busy_ms += dt;
    // Time-weighted occupancy over the iteration, counting the tokens it adds (their room is
    // already reserved).
    std::vector<int64_t> tokens_after(running_.size());
    for (size_t i = 0; i < running_.size(); ++i) tokens_after[i] = running_[i].kv_tokens;
    for (const auto& [ri, n] : scheduled_) tokens_after[ri] += n;
    double live = 0, host = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      live += kv_of(running_[i]).device_bytes(tokens_after[i]);
      host += kv_of(running_[i]).host_bytes(tokens_after[i]);
    }
    result_.peak_host_bytes = std::max(result_.peak_host_bytes, host);
    w_running += dt * static_cast<double>(running_.size());
    w_util += dt * live / cfg_.kv_pool_bytes;
    if (reserved_ > 0) {
      w_waste += dt * (reserved_ - live) / reserved_;
      w_waste_den += dt;
    }
    result_.max_running =
        std::max<int64_t>(result_.max_running, static_cast<int64_t>(running_.size()));
    now += dt;
    result_.iterations++;
    apply(now);
  }

  // Leading prompt tokens this instance's prefix store (or `store`) holds, without touching it.
  int64_t peek_hit_tokens(size_t index) const { return peek_in(cache_, index); }
  int64_t peek_in(const PrefixCache* store, size_t index) const {
    if (!store) return 0;
    const auto& ids = trace_.requests[index].hash_ids;
    int64_t blocks = 0;
    while (blocks < static_cast<int64_t>(ids.size()) && store->contains(ids[blocks])) blocks++;
    return hit_tokens_of(index, blocks);
  }
  PrefixCache* store() const { return cache_; }

 private:
  double reservation(const Request& r, int64_t kv_tokens) const {
    return reservation_at(r, kv_tokens, kv_of(r));
  }
  double reservation_at(const Request& r, int64_t kv_tokens, const FootprintCurve& kv) const {
    const ServeRequestResult& rr = result_.per_request[r.index];
    switch (cfg_.allocator) {
      case KvAllocator::kPaged:
        return kv.device_bytes(round_up(kv_tokens, cfg_.block_tokens));
      case KvAllocator::kContiguousMax:
        return kv.device_bytes(target_.max_context);
      case KvAllocator::kPow2:
        return kv.device_bytes(next_pow2(rr.input + rr.output));
      case KvAllocator::kOracle:
        return kv.device_bytes(rr.input + rr.output);
      case KvAllocator::kVAttention: {
        // One virtual range per layer for K and one for V; each commits whole pages, so every
        // one of the 2 x layers buffers rounds its share up to the page (the fragmentation
        // vAttention trades for contiguity). Virtual reservations cost no memory.
        const double buffers = 2.0 * static_cast<double>(std::max<int64_t>(1, target_.layers));
        const double page = static_cast<double>(cfg_.page_bytes);
        const double per_buffer = kv.device_bytes(kv_tokens) / buffers;
        return buffers * std::ceil(per_buffer / page - 1e-9) * page;
      }
    }
    return 0;
  }

  // Predicted final footprint of a request (admission by prediction): prompt + the mean output
  // so far, at the size the policy will hold it at under pressure (compressed when it can be).
  double predicted_bytes(const Request& r) const {
    const ServeRequestResult& rr = result_.per_request[r.index];
    const int64_t final_tokens = std::min(
        target_.max_context, rr.input + static_cast<int64_t>(std::llround(mean_output_->value())));
    return reservation_at(r, std::max(final_tokens, r.kv_tokens), kv_);
  }

  // Compress-instead-of-preempt: the running request whose compression frees the most bytes is
  // compressed. False when no uncompressed request would free anything.
  bool compress_one() {
    if (!dense_) return false;
    size_t best = running_.size();
    double best_freed = 0;
    for (size_t j = 0; j < running_.size(); ++j) {
      const Request& q = running_[j];
      if (q.compressed || q.kv_tokens == 0) continue;
      const double freed = q.reserved - reservation_at(q, q.kv_tokens, kv_);
      if (freed > best_freed) {
        best_freed = freed;
        best = j;
      }
    }
    if (best == running_.size()) return false;
    Request& q = running_[best];
    compress_bytes_ += dense_->device_bytes(q.kv_tokens) + kv_.device_bytes(q.kv_tokens);
    q.compressed = true;
    const double now_reserved = reservation_at(q, q.kv_tokens, kv_);
    reserved_ -= q.reserved - now_reserved;
    q.reserved = now_reserved;
    ServeRequestResult& rr = result_.per_request[q.index];
    rr.compressed_output = std::max(rr.compressed_output, rr.output - q.generated);
    result_.compressions++;
    return true;
  }

  void reject(size_t index) {
    result_.per_request[index].rejected = true;
    result_.rejected++;
  }

  int64_t hit_tokens_of(size_t index, int64_t blocks) const {
    const int64_t input = result_.per_request[index].input;
    // At least one token is computed: the forward that yields the next token's logits.
    return std::max<int64_t>(0, std::min(blocks * trace_.block_size_tokens, input - 1));
  }

  void admit(double now) {
    // After a preemption the pool is known to be short: admit nothing new this iteration.
    if (preempted_last_iteration_) return;
    while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
      Request r = waiting_.front();
      ServeRequestResult& rr = result_.per_request[r.index];
      if (rr.input + rr.output > target_.max_context) {
        reject(r.index);
        waiting_.pop_front();
        continue;
      }
      // A transferred request arrives with its prompt's KV (in flight until ready_ms).
      const int64_t local = r.transferred ? 0 : peek_hit_tokens(r.index);
      const int64_t remote = r.remote && !r.transferred ? peek_in(r.remote, r.index) : 0;
      const int64_t hit = r.transferred ? r.kv_tokens : std::max(local, remote);
      // Admitted only with room for the whole prompt - counting the prompts still being
      // prefilled - and a watermark left for the running requests' growth (vLLM's rule):
      // admitting what decode growth would preempt at once only thrashes. The paged allocator
      // still reserves chunk by chunk, so its waste is fragmentation, not room held ahead.
      // A prefix hit from a store of compressed blocks hands the request compressed KV.
      if (dense_ && hit > 0 && cfg_.prefix_blocks == PrefixBlocks::kCompressed && !r.compressed) {
        r.compressed = true;
        rr.compressed_output = std::max(rr.compressed_output, rr.output - r.generated);
      }
      double committed = 0;
      if (cfg_.admission == Admission::kPredicted) {
        // Every running request and this one at its predicted final size, compressed where the
        // policy can compress (the scheduler will, before preempting anyone).
        for (const Request& q : running_)
          committed += dense_ && !q.compressed ? predicted_bytes(q)
                                               : std::max(q.reserved, predicted_bytes(q));
        committed += predicted_bytes(r);
      } else {
        double pending = 0;
        for (const Request& q : running_)
          if (q.in_prefill()) pending += std::max(0.0, reservation(q, q.prompt) - q.reserved);
        committed = reserved_ + pending + reservation(r, r.prompt);
      }
      if (committed > kAdmitFraction * cfg_.kv_pool_bytes && !running_.empty()) break;
      if (committed > cfg_.kv_pool_bytes) break;  // first come, first served: no overtaking
      const double need = reservation(r, hit);
      waiting_.pop_front();
      if (r.transferred) {
        r.fresh = true;
        r.reserved = need;
        reserved_ += need;
        r.ready_ms = std::max(r.ready_ms, now);
        running_.push_back(r);
        continue;
      }
      if (cache_) {
        const int64_t blocks = cache_->lookup(trace_.requests[r.index].hash_ids);
        KVB_ASSERT(hit_tokens_of(r.index, blocks) == local, "serving_sim",
                   "prefix lookup disagrees with peek");
      }
      if (remote > local) r.remote->lookup(trace_.requests[r.index].hash_ids);
      r.kv_tokens = hit;
      r.fresh = true;
      r.reserved = need;
      reserved_ += need;
      // The local part of the prefix comes from this instance's store, the rest (when the router
      // chose a remote store) over the network, one after the other.
      const double local_bytes = block_kv().device_bytes(local);
      r.remote_bytes = block_kv().device_bytes(hit) - local_bytes;
      r.ready_ms = now + local_bytes / (hw_.prefix_load_gbps * 1e9) * 1e3 +
                   r.remote_bytes / (hw_.remote_gbps * 1e9) * 1e3 +
                   (local_bytes > 0 ? hw_.prefix_load_latency_ms : 0.0);
      result_.prefix_load_bytes += local_bytes + r.remote_bytes;
      result_.remote_fetch_bytes += r.remote_bytes;
      if (rr.hit_tokens == 0 && rr.preemptions == 0) rr.hit_tokens = hit;
      running_.push_back(r);
    }
  }

  // Frees the most recently admitted request and sends it back to the head of the queue; it will
  // recompute its prompt and the tokens it generated (vLLM's recompute preemption).
  void preempt_last() {
    Request r = running_.back();
    running_.pop_back();
    for (auto it = scheduled_.begin(); it != scheduled_.end(); ++it)
      if (it->first == running_.size()) {
        budget_ += it->second;
        scheduled_.erase(it);
        break;
      }
    reserved_ -= r.reserved;
    result_.per_request[r.index].preemptions++;
    result_.preemptions++;
    r.prompt = result_.per_request[r.index].input + r.generated;
    r.transferred = false;  // its KV is gone: recomputed here
    // Recomputed KV is uncompressed again under on_pressure (its output so far stays counted).
    r.compressed = dense_ == nullptr;
    r.kv_tokens = 0;
    r.reserved = 0;
    r.prefill_start_ms = -1;
    r.prefill_chunks = 0;
    waiting_.push_front(r);
  }

  // Sends a request admitted in this iteration back to the head of the queue, as if never
  // admitted (its first chunk did not fit; a new request never preempts a running one).
  void unadmit_last() {
    Request r = running_.back();
    running_.pop_back();
    ServeRequestResult& rr = result_.per_request[r.index];
    reserved_ -= r.reserved;
    r.reserved = 0;
    r.fresh = false;
    if (r.transferred) {  // keeps the KV it was sent
      waiting_.push_front(r);
      return;
    }
    result_.prefix_load_bytes -= block_kv().device_bytes(r.kv_tokens);
    r.compressed = dense_ == nullptr;
    result_.remote_fetch_bytes -= r.remote_bytes;
    r.remote_bytes = 0;
    if (rr.preemptions == 0) rr.hit_tokens = 0;
    r.kv_tokens = 0;
    r.fresh = false;
    waiting_.push_front(r);
  }

  // Tries to give running_[i] n more tokens; preempts later requests for room. False when
  // running_[i] itself had to go.
  bool grow(size_t i, int64_t n) {
    for (;;) {
      Request& r = running_[i];
      const double growth = std::max(0.0, reservation(r, r.kv_tokens + n) - r.reserved);
      if (reserved_ + growth <= cfg_.kv_pool_bytes) {
        r.reserved += growth;
        reserved_ += growth;
        return true;
      }
      if (r.fresh) {
        // Admitted counting on compression (predicted admission under on_pressure): the room is
        // made by compressing running requests before the admission is given up.
        if (cfg_.kv_policy == KvPolicy::kOnPressure && cfg_.admission == Admission::kPredicted &&
            compress_one())
          continue;
        // Fresh requests sit at the end of running_ in arrival order: return them all from i on.
        while (running_.size() > i) unadmit_last();
        return false;
      }
      if (cfg_.kv_policy == KvPolicy::kOnPressure && compress_one()) continue;
      if (running_.size() == 1) {
        // Alone and still too large for the pool: it can never finish.
        reserved_ -= r.reserved;
        reject(r.index);
        running_.pop_back();
        return false;
      }
      const bool self = i + 1 == running_.size();
      preempt_last();
      if (self) return false;
    }
  }

  void schedule(double now) {
    scheduled_.clear();
    const int64_t preemptions_before = result_.preemptions;
    budget_ = cfg_.max_batched_tokens;
    // Decodes first (one token each), then prefill chunks with what is left of the token budget.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
        Request& r = running_[i];
        if (r.ready_ms > now || r.in_prefill() != (pass == 1)) continue;
        const int64_t n = pass == 0 ? 1 : std::min(r.prompt - r.kv_tokens, budget_);
        if (!grow(i, n)) {
          if (i < running_.size())
            --i;  // running_[i] is now another request: revisit the slot
          else
            break;
          continue;
        }
        scheduled_.emplace_back(i, n);
        budget_ -= n;
        if (pass == 1) {
          if (r.prefill_start_ms < 0) r.prefill_start_ms = now;
          r.prefill_chunks++;
        }
      }
    }
    for (Request& r : running_) r.fresh = false;
    preempted_last_iteration_ = result_.preemptions > preemptions_before;
  }

  void apply(double now) {
    std::vector<size_t> finished;
    for (const auto& [i, n] : scheduled_) {
      Request& r = running_[i];
      ServeRequestResult& rr = result_.per_request[r.index];
      const bool was_prefill = r.in_prefill();
      if (was_prefill) result_.prefill_tokens += static_cast<double>(n);
      r.kv_tokens += n;
      if (was_prefill && r.in_prefill()) continue;  // more chunks to go
      if (was_prefill && cache_) {
        const auto& ids = trace_.requests[r.index].hash_ids;
        cache_->insert(ids, static_cast<int64_t>(ids.size()));
      }
      r.generated++;
      if (rr.first_token_ms < 0) rr.first_token_ms = now;
      if (r.generated >= rr.output) {
        rr.finish_ms = now;
        result_.completed++;
        mean_output_->sum += static_cast<double>(rr.output);
        mean_output_->n++;
        finished.push_back(i);
      } else if (was_prefill && role == Role::kPrefill) {
        // P/D disaggregation: the prompt is done here; its KV moves to a decode instance.
        Request h = r;
        h.transferred = true;
        h.ready_ms = now;
        h.reserved = 0;
        h.fresh = false;
        h.remote = nullptr;
        handoffs.push_back(h);
        finished.push_back(i);
      }
    }
    std::sort(finished.rbegin(), finished.rend());
    for (size_t i : finished) {
      reserved_ -= running_[i].reserved;
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (running_.empty()) reserved_ = 0;  // no drift from floating-point sums
  }

  const RequestTrace& trace_;
  const FootprintCurve& kv_;
  const FootprintCurve* dense_;  // uncompressed curve under on_pressure; null otherwise
  const ServeTarget& target_;
  const ServeHardware& hw_;
  const ServeConfig& cfg_;
  ServeResult& result_;
  PrefixCache* cache_;         // not owned; null when there is no prefix store
  RunningMean* mean_output_;   // output lengths of the requests finished so far (cluster-wide)
  double compress_bytes_ = 0;  // compression traffic waiting for the next iteration
  std::deque<Request> waiting_;
  std::vector<Request> running_;                       // admission order
  std::vector<std::pair<size_t, int64_t>> scheduled_;  // (index in running_, new tokens)
  int64_t budget_ = 0;
  double reserved_ = 0;
  bool preempted_last_iteration_ = false;
};

// N instances behind a router. Events run in time order: an arrival is routed once every busy
// instance's clock has reached it, so the router sees each instance's state at the arrival.
class Cluster {
 public:
  Cluster(const RequestTrace& trace, const FootprintCurve& kv, const FootprintCurve* dense,
          const ServeTarget& target, const ServeHardware& hw, const ServeConfig& config)
      : trace_(trace),
        kv_(kv),
        dense_(config.kv_policy == KvPolicy::kOnPressure ? dense : nullptr),
        target_(target),
        hw_(hw),
        cfg_(config) {
    KVB_CHECK(cfg_.kv_policy != KvPolicy::kOnPressure || dense != nullptr,
              "serve: kv_policy on_pressure needs the uncompressed footprint");
    KVB_CHECK(cfg_.page_bytes >= 1, "serve: page_bytes ", cfg_.page_bytes, " (must be >= 1)");
    KVB_CHECK(hw_.paged_attention_slowdown >= 1.0, "serve: paged_attention_slowdown ",
              hw_.paged_attention_slowdown, " (must be >= 1)");
    KVB_CHECK(hw_.prefix_load_latency_ms >= 0 && hw_.pd_latency_ms >= 0,
              "serve: latencies must be >= 0");
    KVB_CHECK(cfg_.kv_pool_bytes > 0, "serve: kv pool bytes ", cfg_.kv_pool_bytes,
              " (must be > 0)");
    KVB_CHECK(cfg_.block_tokens >= 1, "serve: block_tokens ", cfg_.block_tokens, " (must be >= 1)");
    KVB_CHECK(cfg_.max_num_seqs >= 1, "serve: max_num_seqs ", cfg_.max_num_seqs);
    KVB_CHECK(cfg_.max_batched_tokens >= 1, "serve: max_batched_tokens ", cfg_.max_batched_tokens);
    KVB_CHECK(cfg_.time_scale > 0, "serve: time_scale ", cfg_.time_scale, " (must be > 0)");
    KVB_CHECK(cfg_.instances >= 1 && cfg_.instances <= 4096, "serve: instances ", cfg_.instances,
              " (must be in [1, 4096])");
    KVB_CHECK(cfg_.prefill_instances >= 0 &&
                  (cfg_.prefill_instances == 0 || cfg_.prefill_instances < cfg_.instances),
              "serve: prefill_instances ", cfg_.prefill_instances, " of ", cfg_.instances,
              " instances (0: none set apart; otherwise at least one instance must decode)");
    KVB_CHECK(hw_.hbm_gbps > 0 && hw_.tflops > 0 && hw_.prefix_load_gbps > 0 && hw_.h2d_gbps > 0 &&
                  hw_.remote_gbps > 0 && hw_.pd_gbps > 0,
              "serve: hardware bandwidths and FLOP rate must be > 0");
    KVB_CHECK(target_.max_context > 0, "serve: target max_context ", target_.max_context);
    result_.requests = static_cast<int64_t>(trace.requests.size());
    result_.per_request.resize(trace.requests.size());
    for (size_t i = 0; i < trace.requests.size(); ++i) {
      const TraceRequest& t = trace.requests[i];
      ServeRequestResult& r = result_.per_request[i];
      r.arrival_ms = static_cast<double>(t.timestamp_ms) * cfg_.time_scale;
      r.input = t.input_length;
      r.output = std::max<int64_t>(1, t.output_length);
    }
    result_.prefix_block_bytes =
        static_cast<double>(trace.block_size_tokens) * block_kv().device_bytes_per_token();
    const int64_t n = cfg_.instances;
    if (cfg_.prefix_cache_bytes != 0) {
      // prefix_cache_bytes is each instance's; a global store pools them (Mooncake's store).
      const int64_t stores = cfg_.prefix_scope == PrefixScope::kGlobal ? 1 : n;
      const double bytes = cfg_.prefix_scope == PrefixScope::kGlobal
                               ? cfg_.prefix_cache_bytes * static_cast<double>(n)
                               : cfg_.prefix_cache_bytes;
      int64_t blocks = -1;
      if (cfg_.prefix_cache_bytes > 0 && result_.prefix_block_bytes > 0)
        blocks = static_cast<int64_t>(std::floor(bytes / result_.prefix_block_bytes));
      result_.prefix_capacity_blocks = blocks;
      for (int64_t i = 0; i < stores; ++i)
        caches_.push_back(std::make_unique<PrefixCache>(blocks, cfg_.prefix_policy));
    }
    for (int64_t i = 0; i < n; ++i) {
      PrefixCache* c = caches_.empty() ? nullptr : caches_[caches_.size() == 1 ? 0 : i].get();
      instances_.push_back(std::make_unique<Instance>(trace_, kv_, dense_, target_, hw_, cfg_,
                                                      result_, c, &mean_output_));
      if (cfg_.prefill_instances > 0)
        instances_.back()->role =
            i < cfg_.prefill_instances ? Instance::Role::kPrefill : Instance::Role::kDecode;
    }
  }

  ServeResult run() {
    const double inf = std::numeric_limits<double>::infinity();
    const double first_arrival = trace_.requests.empty() ? 0 : result_.per_request[0].arrival_ms;
    for (auto& in : instances_) in->now = first_arrival;
    size_t next = 0;
    double last = first_arrival;
    for (;;) {
      const double ta = next < trace_.requests.size() ? result_.per_request[next].arrival_ms : inf;
      Instance* busy = nullptr;
      for (auto& in : instances_)
        if (in->has_work() && (!busy || in->now < busy->now)) busy = in.get();
      if (!busy && !std::isfinite(ta)) break;
      if (!busy || ta <= busy->now) {
        PrefixCache* remote = nullptr;
        Instance& to = *instances_[route(next, &remote)];
        if (!to.has_work()) to.now = std::max(to.now, ta);
        to.route(next, remote);
        next++;
        continue;
      }
      busy->step(ta);
      last = std::max(last, busy->now);
      // P/D: prompts a prefill instance finished go to the least-loaded decode instance, their
      // KV sent over the network (Mooncake's transfer engine), after the prefill or layer by
      // layer as it is produced (pd_layerwise). A prefill instance's link sends one prompt's KV
      // at a time, in the order the prompts finished (a transfer waits for the one before).
      for (auto& h : busy->handoffs) {
        Instance* to = nullptr;
        for (size_t i = static_cast<size_t>(cfg_.prefill_instances); i < instances_.size(); ++i)
          if (!to || instances_[i]->load() < to->load()) to = instances_[i].get();
        const double bytes = (h.compressed || !dense_ ? kv_ : *dense_).device_bytes(h.kv_tokens);
        const double send_ms = bytes / (hw_.pd_gbps * 1e9) * 1e3 + hw_.pd_latency_ms;
        if (cfg_.pd_layerwise && target_.layers > 0 && h.prefill_start_ms >= 0) {
          const double last_piece =
              send_ms /
              static_cast<double>(target_.layers * std::max<int64_t>(1, h.prefill_chunks));
          h.ready_ms = std::max(h.ready_ms + last_piece,
                                std::max(h.prefill_start_ms, busy->link_free_ms) + send_ms);
        } else {
          h.ready_ms = std::max(h.ready_ms, busy->link_free_ms) + send_ms;
        }
        busy->link_free_ms = h.ready_ms;
        result_.pd_transfer_bytes += bytes;
        if (!to->has_work()) to->now = std::max(to->now, busy->now);
        to->accept(h);
      }
      busy->handoffs.clear();
    }
    result_.duration_s = (last - first_arrival) / 1e3;
    double busy_ms = 0, memory_bound_ms = 0, w_running = 0, w_util = 0, w_waste = 0,
           w_waste_den = 0;
    double pcie_bound_ms = 0;
    int64_t most = 0;
    const size_t routed_to = cfg_.prefill_instances > 0
                                 ? static_cast<size_t>(cfg_.prefill_instances)
                                 : instances_.size();
    for (size_t k = 0; k < instances_.size(); ++k) {
      const auto& in = instances_[k];
      busy_ms += in->busy_ms;
      memory_bound_ms += in->memory_bound_ms;
      pcie_bound_ms += in->pcie_bound_ms;
      w_running += in->w_running;
      w_util += in->w_util;
      w_waste += in->w_waste;
      w_waste_den += in->w_waste_den;
      if (k < routed_to) most = std::max(most, in->routed);  // arrivals' instances
      result_.instance_requests.push_back(in->routed);
    }
    result_.load_imbalance = result_.requests
                                 ? static_cast<double>(most) * static_cast<double>(routed_to) /
                                       static_cast<double>(result_.requests)
                                 : 0;
    summarize(busy_ms, memory_bound_ms, w_running, w_util, w_waste, w_waste_den);
    if (busy_ms > 0) result_.pcie_bound_fraction = pcie_bound_ms / busy_ms;
    return std::move(result_);
  }

 private:
  // The instance request `index` goes to; *remote: a store to fetch its prefix from (conductor).
  size_t route(size_t index, PrefixCache** remote) {
    // Arrivals go to the prefill instances when P/D is on (they come first).
    const size_t n = cfg_.prefill_instances > 0 ? static_cast<size_t>(cfg_.prefill_instances)
                                                : instances_.size();
    if (n == 1) return 0;
    auto least_loaded = [&](const std::vector<size_t>& among) {
      size_t best = among.front();
      for (size_t i : among)
        if (instances_[i]->load() < instances_[best]->load()) best = i;
      return best;
    };
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    switch (cfg_.router) {
      case Router::kRoundRobin:
        return round_robin_++ % n;
      case Router::kConductor: {
        // Mooncake's conductor (Algorithm 1): per instance, its own prefix match, or the best
        // match anywhere when that is longer by more than the threshold (then the missing blocks
        // are fetched from the instance holding them); the instance minimising transfer + queued
        // prefill + this request's prefill wins. Prefill time per token from the roofline's FLOPs.
        const double ms_per_token = target_.flops_per_token / (hw_.tflops * 1e12) * 1e3;
        const int64_t input = result_.per_request[index].input;
        std::vector<int64_t> match(n);
        size_t best = 0;
        for (size_t i = 0; i < n; ++i) {
          match[i] = instances_[i]->peek_hit_tokens(index);
          if (match[i] > match[best]) best = i;
        }
        size_t pick = 0;
        double pick_cost = std::numeric_limits<double>::infinity();
        PrefixCache* pick_remote = nullptr;
        for (size_t i = 0; i < n; ++i) {
          int64_t prefix = match[i];
          double transfer_ms = 0;
          PrefixCache* from = nullptr;
          if (match[best] - match[i] > cfg_.conductor_threshold_tokens) {
            prefix = match[best];
            transfer_ms =
                (block_kv().device_bytes(match[best]) - block_kv().device_bytes(match[i])) /
                (hw_.remote_gbps * 1e9) * 1e3;
            from = instances_[best]->store();
          }
          const double queued = static_cast<double>(instances_[i]->queued_prefill_tokens());
          const double cost = transfer_ms + ms_per_token * queued +
                              ms_per_token * static_cast<double>(input - prefix);
          if (cost < pick_cost) {
            pick = i;
            pick_cost = cost;
            pick_remote = from;
          }
        }
        *remote = pick_remote;
        return pick;
      }
      case Router::kLeastLoaded:
        return least_loaded(all);
      case Router::kPrefix: {
        // AIBrix's prefix-cache router: when the request counts drift apart by more than the
        // threshold, balance; otherwise the longest prefix match, least loaded among equals.
        int64_t lo = instances_[0]->load(), hi = lo;
        for (const auto& in : instances_) {
          lo = std::min(lo, in->load());
          hi = std::max(hi, in->load());
        }
        if (hi - lo > cfg_.router_imbalance) return least_loaded(all);
        int64_t best = -1;
        std::vector<size_t> top;
        for (size_t i = 0; i < n; ++i) {
          const int64_t m = instances_[i]->peek_hit_tokens(index);
          if (m > best) {
            best = m;
            top.clear();
          }
          if (m == best) top.push_back(i);
        }
        return least_loaded(top);
      }
    }
    return 0;
  }

  void summarize(double busy_ms, double memory_bound_ms, double w_running, double w_util,
                 double w_waste, double w_waste_den) {
    std::vector<double> ttft, tpot;
    int64_t ok = 0, output_tokens = 0, input_tokens = 0, hit_tokens = 0;
    int64_t compressed_requests = 0, compressed_tokens = 0, finished = 0, finished_tokens = 0;
    for (auto& r : result_.per_request) {
      if (r.rejected) continue;
      if (r.finish_ms >= 0) {
        if (!dense_) r.compressed_output = r.output;  // always: every token from the method's KV
        finished++;
        finished_tokens += r.output;
        compressed_requests += r.compressed_output > 0;
        compressed_tokens += r.compressed_output;
      }
      ttft.push_back(r.ttft_ms());
      if (r.output > 1) tpot.push_back(r.tpot_ms());
      output_tokens += r.output;
      input_tokens += r.input;
      hit_tokens += r.hit_tokens;
      if (r.ttft_ms() <= cfg_.slo_ttft_ms && (r.output <= 1 || r.tpot_ms() <= cfg_.slo_tpot_ms))
        ok++;
    }
    auto pct = [](const std::vector<double>& v, double p) {
      return v.empty() ? 0.0 : percentile(v, p);
    };
    result_.ttft_ms_p50 = pct(ttft, 50);
    result_.ttft_ms_p90 = pct(ttft, 90);
    result_.ttft_ms_p99 = pct(ttft, 99);
    result_.tpot_ms_p50 = pct(tpot, 50);
    result_.tpot_ms_p90 = pct(tpot, 90);
    result_.tpot_ms_p99 = pct(tpot, 99);
    result_.slo_attainment = result_.requests ? static_cast<double>(ok) / result_.requests : 0;
    if (result_.duration_s > 0) {
      result_.output_tok_s = static_cast<double>(output_tokens) / result_.duration_s;
      result_.requests_per_s = static_cast<double>(result_.completed) / result_.duration_s;
    }
    if (busy_ms > 0) {
      result_.mean_running = w_running / busy_ms;
      result_.kv_utilization = w_util / busy_ms;
      result_.memory_bound_fraction = memory_bound_ms / busy_ms;
    }
    if (w_waste_den > 0) result_.allocator_waste = w_waste / w_waste_den;
    result_.prefix_hit_rate =
        input_tokens ? static_cast<double>(hit_tokens) / static_cast<double>(input_tokens) : 0;
    result_.compressed_request_fraction =
        finished ? static_cast<double>(compressed_requests) / static_cast<double>(finished) : 0;
    result_.compressed_token_fraction = finished_tokens ? static_cast<double>(compressed_tokens) /
                                                              static_cast<double>(finished_tokens)
                                                        : 0;
  }

  const FootprintCurve& block_kv() const {
    return dense_ && cfg_.prefix_blocks == PrefixBlocks::kAsHeld ? *dense_ : kv_;
  }

  const RequestTrace& trace_;
  const FootprintCurve& kv_;
  const FootprintCurve* dense_;
  const ServeTarget& target_;
  const ServeHardware& hw_;
  const ServeConfig& cfg_;
  ServeResult result_;
  RunningMean mean_output_;
  std::vector<std::unique_ptr<PrefixCache>> caches_;
  std::vector<std::unique_ptr<Instance>> instances_;
  size_t round_robin_ = 0;
};

}  // namespace

ServeResult simulate_serving(const RequestTrace& trace, const FootprintCurve& kv,
                             const ServeTarget& target, const ServeHardware& hw,
                             const ServeConfig& config, const FootprintCurve* uncompressed) {
  return Cluster(trace, kv, uncompressed, target, hw, config).run();
}

}  // namespace kvb
