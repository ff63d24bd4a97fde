// KVTuner's offline part: sensitivity profiling, Pareto pruning, layer clustering, multi-objective
// search and the calibration artifact. See kvtuner_search.h for the algorithm and README.md for
// measurements.

#include "methods/kvtuner/kvtuner_search.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/progress_eta.h"
#include "harness/common/sha256.h"
#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/kv/twin_kv_cache.h"
#include "harness/kv/windowed_kv_cache.h"
#include "methods/common/codec_kv_cache.h"

namespace kvb::kvtuner {

// ---------------------------------------------------------------- pairs

std::string BitPair::name() const {
  if (k == v) return "KV" + std::to_string(k);
  return "K" + std::to_string(k) + "V" + std::to_string(v);
}

const std::vector<BitPair>& candidate_pairs() {
  static const std::vector<BitPair> p = {{8, 8}, {8, 4}, {8, 2}, {4, 8}, {4, 4},
                                         {4, 2}, {2, 8}, {2, 4}, {2, 2}};
  return p;
}

std::string pairs_string(const std::vector<BitPair>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? "," : "") + layers[i].name();
  return s;
}

double equivalent_bits(const std::vector<BitPair>& layers) {
  if (layers.empty()) return 0;
  double b = 0;
  for (const auto& p : layers) b += p.bits();
  return b / static_cast<double>(layers.size());
}

nlohmann::json layers_json(const std::vector<BitPair>& layers) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t l = 0; l < layers.size(); ++l)
    j[std::to_string(l)] = {{"nbits_key", layers[l].k}, {"nbits_value", layers[l].v}};
  return j;
}

// ---------------------------------------------------------------- Pareto + searches

namespace {

bool dominates(const Objectives& a, const Objectives& b) {
  return a[0] <= b[0] && a[1] <= b[1] && (a[0] < b[0] || a[1] < b[1]);
}

}  // namespace

std::vector<size_t> pareto_front(const std::vector<Objectives>& points) {
  std::vector<size_t> out;
  for (size_t i = 0; i < points.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < points.size() && !dominated; ++j)
      dominated = j != i && dominates(points[j], points[i]);
    if (!dominated) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    if (points[a][0] != points[b][0]) return points[a][0] < points[b][0];
    return points[a][1] < points[b][1];
  });
  return out;
}

int64_t space_size(const std::vector<int32_t>& choices, int64_t cap) {
  int64_t n = 1;
  for (int32_t c : choices) {
    KVB_CHECK(c >= 1, "search: a gene with ", c, " choices");
    if (n > cap / c) return -1;
    n *= c;
  }
  return n;
}

namespace {

void finish(SearchResult* r) {
  std::vector<Objectives> pts;
  for (const auto& e : r->evaluated) pts.push_back(e.f);
  r->front = pareto_front(pts);
}

}  // namespace

SearchResult exhaustive_search(const std::vector<int32_t>& choices, const ObjectiveFn& f,
                               const ViolationFn& violation) {
  SearchResult r;
  r.space = space_size(choices, int64_t{1} << 40);
  KVB_CHECK(r.space > 0, "exhaustive search: the space is too large");
  Genome g(choices.size(), 0);
  for (int64_t i = 0; i < r.space; ++i) {
    if (violation && violation(g) > 0) {
      ++r.infeasible_skipped;
    } else {
      r.evaluated.push_back({g, f(g)});
    }
    for (size_t d = 0; d < g.size(); ++d) {  // mixed-radix increment, gene 0 fastest
      if (++g[d] < choices[d]) break;
      g[d] = 0;
    }
  }
  finish(&r);
  return r;
}

namespace {

struct Individual {
  Genome g;
  Objectives f{};
  double violation = 0;
  int64_t rank = 0;
  double crowding = 0;
};

// Deb's constrained domination: feasible beats infeasible, lower violation beats higher, else
// Pareto domination.
bool c_dominates(const Individual& a, const Individual& b) {
  if (a.violation > 0 || b.violation > 0) {
    if (a.violation <= 0) return true;
    if (b.violation <= 0) return false;
    return a.violation < b.violation;
  }
  return dominates(a.f, b.f);
}

// Fast non-dominated sort: fills rank, returns the fronts (indices, ascending within a front).
std::vector<std::vector<size_t>> nondominated_sort(std::vector<Individual>& pop) {
  const size_t n = pop.size();
  std::vector<std::vector<size_t>> dominated(n);
  std::vector<int64_t> count(n, 0);
  std::vector<std::vector<size_t>> fronts(1);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      if (c_dominates(pop[i], pop[j]))
        dominated[i].push_back(j);
      else if (c_dominates(pop[j], pop[i]))
        ++count[i];
    }
    if (count[i] == 0) {
      pop[i].rank = 0;
      fronts[0].push_back(i);
    }
  }
  for (size_t k = 0; !fronts[k].empty(); ++k) {
    std::vector<size_t> next;
    for (size_t i : fronts[k])
      for (size_t j : dominated[i])
        if (--count[j] == 0) {
          pop[j].rank = static_cast<int64_t>(k) + 1;
          next.push_back(j);
        }
    std::sort(next.begin(), next.end());
    fronts.push_back(next);
  }
  fronts.pop_back();
  return fronts;
}

void crowding(std::vector<Individual>& pop, const std::vector<size_t>& front) {
  for (size_t i : front) pop[i].crowding = 0;
  if (front.size() <= 2) {
    for (size_t i : front) pop[i].crowding = std::numeric_limits<double>::infinity();
    return;
  }
  for (int m = 0; m < 2; ++m) {
    std::vector<size_t> idx = front;
    auto key = [&](size_t i) { return pop[i].violation > 0 ? pop[i].violation : pop[i].f[m]; };
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
    const double lo = key(idx.front()), hi = key(idx.back());
    pop[idx.front()].crowding = pop[idx.back()].crowding = std::numeric_limits<double>::infinity();
    if (!(hi > lo) || !std::isfinite(hi - lo)) continue;
    for (size_t t = 1; t + 1 < idx.size(); ++t)
      pop[idx[t]].crowding += (key(idx[t + 1]) - key(idx[t - 1])) / (hi - lo);
  }
}

bool better(const Individual& a, const Individual& b) {  // crowded comparison
  if (a.rank != b.rank) return a.rank < b.rank;
  return a.crowding > b.crowding;
}

}  // namespace

SearchResult nsga2_search(const std::vector<int32_t>& choices, const ObjectiveFn& f,
                          const ViolationFn& violation, const Nsga2Options& o) {
  KVB_CHECK(!choices.empty(), "nsga2: no genes");
  KVB_CHECK(o.population >= 4, "nsga2: population ", o.population, " must be >= 4");
  KVB_CHECK(o.max_evaluations >= 1, "nsga2: max_evaluations must be >= 1");
  SearchResult r;
  r.space = space_size(choices, int64_t{1} << 62);
  std::mt19937_64 rng(o.seed);
  auto uniform = [&](int64_t n) {  // [0, n), platform independent
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
  };
  auto u01 = [&] { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); };
  const size_t genes = choices.size();
  const double pm = o.mutation_prob >= 0 ? o.mutation_prob : 1.0 / static_cast<double>(genes);

  std::map<Genome, Individual> memo;  // every genome seen (feasible ones evaluated)
  int64_t evaluations = 0;
  auto assess = [&](const Genome& g) -> Individual {
    auto it = memo.find(g);
    if (it != memo.end()) return it->second;
    Individual ind;
    ind.g = g;
    ind.violation = violation ? std::max(0.0, violation(g)) : 0.0;
    if (ind.violation > 0) {
      ind.f = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    } else {
      ind.f = f(g);
      ++evaluations;
      r.evaluated.push_back({g, ind.f});
    }
    memo.emplace(g, ind);
    return ind;
  };
  auto budget_left = [&] { return evaluations < o.max_evaluations; };
  auto exhausted = [&] { return r.space > 0 && static_cast<int64_t>(memo.size()) >= r.space; };

  // Initial population: distinct random genomes (as many as the space allows).
  std::vector<Individual> pop;
  for (int64_t tries = 0; static_cast<int64_t>(pop.size()) < o.population && budget_left() &&
                          tries < 100 * o.population && !exhausted();
       ++tries) {
    Genome g(genes);
    for (size_t d = 0; d < genes; ++d) g[d] = static_cast<int32_t>(uniform(choices[d]));
    if (memo.count(g)) continue;
    pop.push_back(assess(g));
  }
  {
    auto fronts = nondominated_sort(pop);
    for (const auto& fr : fronts) crowding(pop, fr);
  }
  int64_t stale = 0;
  while (budget_left() && !exhausted() && r.generations < o.max_generations && stale < 50 &&
         pop.size() >= 2) {
    ++r.generations;
    const int64_t before = evaluations;
    auto tournament = [&]() -> const Individual& {
      const Individual& a = pop[uniform(static_cast<int64_t>(pop.size()))];
      const Individual& b = pop[uniform(static_cast<int64_t>(pop.size()))];
      return better(b, a) ? b : a;
    };
    std::vector<Individual> offspring;
    while (static_cast<int64_t>(offspring.size()) < o.population && budget_left()) {
      Genome c1 = tournament().g, c2 = tournament().g;
      if (u01() < o.crossover_prob)
        for (size_t d = 0; d < genes; ++d)
          if (u01() < 0.5) std::swap(c1[d], c2[d]);
      for (Genome* c : {&c1, &c2}) {
        for (size_t d = 0; d < genes; ++d)
          if (choices[d] > 1 && u01() < pm) {
            // A different choice, uniformly.
            const int32_t x = static_cast<int32_t>(uniform(choices[d] - 1));
            (*c)[d] = x >= (*c)[d] ? x + 1 : x;
          }
        if (static_cast<int64_t>(offspring.size()) < o.population && budget_left())
          offspring.push_back(assess(*c));
      }
    }
    stale = evaluations == before ? stale + 1 : 0;
    // Environmental selection from parents + offspring, without duplicate genomes.
    std::vector<Individual> all;
    std::map<Genome, bool> seen;
    for (const auto* v : {&pop, &offspring})
      for (const auto& ind : *v)
        if (seen.emplace(ind.g, true).second) all.push_back(ind);
    auto fronts = nondominated_sort(all);
    std::vector<Individual> next;
    for (const auto& fr : fronts) {
      crowding(all, fr);
      if (static_cast<int64_t>(next.size() + fr.size()) <= o.population) {
        for (size_t i : fr) next.push_back(all[i]);
      } else {
        std::vector<size_t> idx = fr;
        std::stable_sort(idx.begin(), idx.end(),
                         [&](size_t a, size_t b) { return all[a].crowding > all[b].crowding; });
        for (size_t i : idx) {
          if (static_cast<int64_t>(next.size()) >= o.population) break;
          next.push_back(all[i]);
        }
        break;
      }
    }
    pop = std::move(next);
    auto f2 = nondominated_sort(pop);
    for (const auto& fr : f2) crowding(pop, fr);
  }
  finish(&r);
  return r;
}

// ---------------------------------------------------------------- calibration data

CalibrationData calibration_windows(const Model& model, const std::string& corpus,
                                    const std::string& data_dir, int64_t window_tokens,
                                    int64_t n_windows, int64_t skip_windows) {
  KVB_CHECK(!model.tokenizer_path.empty(), model.source,
            ": the model has no tokenizer (calibration text needs one)");
  KVB_CHECK(window_tokens >= 3, "kvtuner-search: --window-tokens ", window_tokens, " must be >= 3");
  KVB_CHECK(n_windows >= 1, "kvtuner-search: --windows must be >= 1");
  KVB_CHECK(skip_windows >= 0, "kvtuner-search: --skip-windows must be >= 0");
  Tokenizer tok(model.tokenizer_path);
  auto c = load_corpus(corpus, resolve_data_dir(data_dir));
  WindowOptions wo;
  wo.window_tokens = window_tokens;
  wo.max_windows = skip_windows + n_windows;
  wo.bos = "each";
  TextWindows w = make_windows(tok, c->text, wo, c->name);
  KVB_CHECK(static_cast<int64_t>(w.windows.size()) == skip_windows + n_windows,
            "kvtuner-search: ", c->name, " holds ", w.windows.size(), " windows of ", window_tokens,
            " tokens; ", skip_windows, " skipped + ", n_windows, " asked");
  CalibrationData d;
  nlohmann::json hashes = nlohmann::json::array();
  Sha256 h;
  for (int64_t i = skip_windows; i < skip_windows + n_windows; ++i) {
    d.windows.push_back(w.windows[i].ids);
    hashes.push_back(w.windows[i].hash);
    h.update(w.windows[i].hash);
    h.update(",");
  }
  d.info = {{"corpus", c->name},
            {"corpus_sha256", c->sha256},
            {"window_tokens", window_tokens},
            {"windows", n_windows},
            {"skip_windows", skip_windows},
            {"first_token", w.windows[skip_windows].start_token},
            {"last_token_end", w.windows.back().start_token + w.content_tokens},
            {"windows_sha256", h.hex_digest()},
            {"window_hashes", hashes}};
  return d;
}

// ---------------------------------------------------------------- KL evaluator

namespace {

// The stream protocol's schedule: prefill P tokens, then one decode step per token; cb gets the
// logits of positions first .. first + n - 1.
void feed(Engine& e, const std::vector<int64_t>& tokens, int64_t prefill,
          const LogitsCallback& cb) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t P = std::min<int64_t>(std::max<int64_t>(1, prefill), n - 1);
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {std::vector<int64_t>(tokens.begin(), tokens.begin() + P)}, cb);
  for (int64_t i = P; i < n - 1; ++i) cb(e.decode({seq}, {tokens[i]}), i);
}

std::unique_ptr<KvCache> make_kvtuner_cache(const Model& m, const std::vector<BitPair>& layers,
                                            const std::string& mode) {
  CacheContext ctx{m.config, m.device, m.dtype};
  return MethodRegistry::instance().create("kvtuner", ctx,
                                           {{"pairs", pairs_string(layers)}, {"mode", mode}});
}

}  // namespace

KlEvaluator::KlEvaluator(std::shared_ptr<Model> model, std::vector<std::vector<int64_t>> windows,
                         std::string mode, int64_t prefill_tokens)
    : model_(std::move(model)),
      windows_(std::move(windows)),
      mode_(std::move(mode)),
      prefill_(prefill_tokens) {
  const int64_t V = model_->config.vocab_size;
  CacheContext ctx{model_->config, model_->device, model_->dtype};
  for (const auto& w : windows_) {
    KVB_CHECK(w.size() >= 2, "kvtuner-search: a window needs at least 2 tokens");
    Engine e(model_, MethodRegistry::instance().create("full", ctx, nlohmann::json::object()));
    std::vector<float> out((w.size() - 1) * static_cast<size_t>(V));
    feed(e, w, prefill_, [&](const at::Tensor& logits, int64_t first) {
      at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
      std::copy(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel(), out.begin() + first * V);
    });
    base_.push_back(std::move(out));
  }
}

KlEvaluator::Result KlEvaluator::evaluate(const std::vector<BitPair>& layers) const {
  const int64_t V = model_->config.vocab_size;
  Result r;
  double kl_sum = 0, nll_sum = 0;
  for (size_t w = 0; w < windows_.size(); ++w) {
    const auto& tokens = windows_[w];
    const float* base = base_[w].data();
    Engine e(model_, make_kvtuner_cache(*model_, layers, mode_));
    feed(e, tokens, prefill_, [&](const at::Tensor& logits, int64_t first) {
      at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
      const float* q = lp.data_ptr<float>();
      for (int64_t i = 0; i < lp.size(0); ++i) {
        const int64_t pos = first + i;
        const float* b = base + pos * V;
        const float* qi = q + i * V;
        double kl = 0;
        for (int64_t v = 0; v < V; ++v)
          kl += std::exp(static_cast<double>(b[v])) * (static_cast<double>(b[v]) - qi[v]);
        kl_sum += std::max(0.0, kl);  // rounding can dip below 0 (as the stream protocol)
        nll_sum += -qi[tokens[pos + 1]];
        ++r.tokens;
      }
    });
  }
  ++evaluations_;
  r.kl_mean = r.tokens ? kl_sum / static_cast<double>(r.tokens) : 0;
  r.nll = r.tokens ? nll_sum / static_cast<double>(r.tokens) : 0;
  return r;
}

// ---------------------------------------------------------------- local errors

namespace {

// The method's cache and an exact cache get the same q/k/v (as the probe protocol), but the engine
// continues with the EXACT output: every layer's inputs are the full-precision trajectory, so one
// run with a uniform pair measures each layer as if it alone were quantized.
//
// On a model with window layers both stores are WindowedKvCaches whose inner stores serve the
// global layers (renumbered alike); a window layer is the same on both sides and is not measured.
class ExactTrajectoryProbe : public TwinKvCache {
 public:
  // searched: [n_model_layers] the inner stores' layer of each model layer, -1 for a window layer.
  ExactTrajectoryProbe(std::unique_ptr<KvCache> method, std::unique_ptr<KvCache> exact,
                       std::vector<int64_t> searched, int64_t every, int64_t first_decode_pos)
      : TwinKvCache(std::move(method), std::move(exact), every, first_decode_pos,
                    /*follow_exact=*/true),
        searched_(std::move(searched)) {
    paged_ = dynamic_cast<const PagedKvCache*>(global_store(this->exact()));
    codec_ = dynamic_cast<const CodecKvCache*>(global_store(this->method()));
    KVB_CHECK(codec_ != nullptr, "kvtuner-search: the kvtuner cache is not a codec cache");
    KVB_ASSERT(paged_ != nullptr, "kvtuner_search", "the exact twin is not a paged cache");
    const int64_t n = *std::max_element(searched_.begin(), searched_.end()) + 1;
    sum_.assign(static_cast<size_t>(n), PairStats{});
    n_.assign(static_cast<size_t>(n), 0);
  }
  std::string name() const override { return "exact-trajectory(" + method().name() + ")"; }

  const std::vector<PairStats>& sums() const { return sum_; }
  const std::vector<int64_t>& counts() const { return n_; }

 protected:
  void on_layer(const LayerInput& in, const at::Tensor& om, const at::Tensor& ox) override {
    const int64_t l = searched_.at(static_cast<size_t>(in.layer));
    if (l >= 0) measure(in, static_cast<int>(l), om, ox);
  }

 private:
  // The store that serves the searched layers: a WindowedKvCache's inner one, else the store.
  static const KvCache* global_store(const KvCache& kv) {
    const auto* w = dynamic_cast<const WindowedKvCache*>(&kv);
    return w ? w->inner() : &kv;
  }

  // l: the searched layer (the inner stores' numbering) of model layer in.layer.
  void measure(const LayerInput& in, int l, const at::Tensor& om, const at::Tensor& ox) {
    PairStats& s = sum_[static_cast<size_t>(l)];
    at::Tensor a = om.to(at::kFloat).contiguous().cpu(), e = ox.to(at::kFloat).contiguous().cpu();
    {
      const float* pa = a.data_ptr<float>();
      const float* pe = e.data_ptr<float>();
      double d2 = 0, e2 = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        d2 += (static_cast<double>(pa[i]) - pe[i]) * (static_cast<double>(pa[i]) - pe[i]);
        e2 += static_cast<double>(pe[i]) * pe[i];
      }
      s.e_o += std::sqrt(d2) / std::max(std::sqrt(e2), 1e-30);
    }
    const int64_t seq = exact_batch().seq_ids[0];
    const CodecStream& ks = codec_->stream(seq, l, KvKind::kKey);
    const CodecStream& vs = codec_->stream(seq, l, KvKind::kValue);
    // The paged cache's length grows at end_step: gather() returns the rows before this step's
    // token, which the quantized cache already holds (at full precision, in its residual).
    auto exact_rows = [&](bool keys) {
      at::Tensor g = paged_->gather(l, seq, keys).to(at::kFloat).cpu();
      if (g.size(0) < ks.rows()) g = at::cat({g, (keys ? in.k : in.v)->to(at::kFloat).cpu()});
      return g.contiguous();  // [T, Hk, D]
    };
    at::Tensor kx = exact_rows(true), vx = exact_rows(false);
    const int64_t T = kx.size(0), Hk = kx.size(1), D = kx.size(2);
    KVB_CHECK(ks.rows() == T && vs.rows() == T && ks.width() == Hk * D,
              "kvtuner-search: the quantized and the exact cache disagree on the rows held (",
              ks.rows(), "/", vs.rows(), " vs ", T, ")");
    km_.resize(static_cast<size_t>(T * Hk * D));
    vm_.resize(km_.size());
    ks.decode(km_.data());
    vs.decode(vm_.data());
    const float* pk = kx.data_ptr<float>();
    const float* pv = vx.data_ptr<float>();
    double ek = 0, ev = 0;
    for (int64_t h = 0; h < Hk; ++h) {
      double dk = 0, nk = 0, dv = 0, nv = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = (t * Hk + h) * D + d;
          dk += (static_cast<double>(km_[i]) - pk[i]) * (static_cast<double>(km_[i]) - pk[i]);
          nk += static_cast<double>(pk[i]) * pk[i];
          dv += (static_cast<double>(vm_[i]) - pv[i]) * (static_cast<double>(vm_[i]) - pv[i]);
          nv += static_cast<double>(pv[i]) * pv[i];
        }
      ek += std::sqrt(dk) / std::max(std::sqrt(nk), 1e-30);
      ev += std::sqrt(dv) / std::max(std::sqrt(nv), 1e-30);
    }
    s.e_k += ek / static_cast<double>(Hk);
    s.e_v += ev / static_cast<double>(Hk);
    // Attention-probability total variation, per query head (decode: one query token).
    at::Tensor q = in.q->to(at::kFloat).contiguous().cpu();  // [1, H, D]
    const int64_t H = q.size(1), G = H / Hk;
    const float* pq = q.data_ptr<float>();
    std::vector<double> sx(static_cast<size_t>(T)), sm(static_cast<size_t>(T));
    double tv = 0;
    for (int64_t hq = 0; hq < H; ++hq) {
      const int64_t h = hq / G;
      double mx = -1e300, mm = -1e300;
      for (int64_t t = 0; t < T; ++t) {
        double ax = 0, am = 0;
        for (int64_t d = 0; d < D; ++d) {
          const int64_t i = (t * Hk + h) * D + d;
          ax += static_cast<double>(pq[hq * D + d]) * pk[i];
          am += static_cast<double>(pq[hq * D + d]) * km_[i];
        }
        sx[t] = ax * in.sm_scale;
        sm[t] = am * in.sm_scale;
        mx = std::max(mx, sx[t]);
        mm = std::max(mm, sm[t]);
      }
      double zx = 0, zm = 0;
      for (int64_t t = 0; t < T; ++t) {
        sx[t] = std::exp(sx[t] - mx);
        sm[t] = std::exp(sm[t] - mm);
        zx += sx[t];
        zm += sm[t];
      }
      double d = 0;
      for (int64_t t = 0; t < T; ++t) d += std::abs(sx[t] / zx - sm[t] / zm);
      tv += 0.5 * d;
    }
    s.tv += tv / static_cast<double>(H);
    n_[static_cast<size_t>(l)] += 1;
  }

  std::vector<int64_t> searched_;
  const CodecKvCache* codec_ = nullptr;
  const PagedKvCache* paged_ = nullptr;  // the exact twin (of the searched layers)
  std::vector<PairStats> sum_;
  std::vector<int64_t> n_;
  std::vector<float> km_, vm_;
};

}  // namespace

std::vector<int64_t> searched_layers(const ModelConfig& c) {
  const bool mixed = c.n_window_layers() > 0 && c.n_window_layers() < c.n_layers;
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (!mixed || !c.is_window_layer(l)) out.push_back(l);
  return out;
}

namespace {

// The model the search runs. A model whose every layer is a window is plain causal attention while
// no sequence passes the window (every query sees every earlier token), so calibration windows
// that fit in it are profiled on the model without its windows: the same computation, on exact
// paged twins. Past the window the exact twin would hold only the window's rows, which the
// profiler does not read; refused by name.
std::shared_ptr<Model> model_to_search(std::shared_ptr<Model> model,
                                       const std::vector<std::vector<int64_t>>& windows) {
  const ModelConfig& c = model->config;
  if (c.n_window_layers() == 0 || c.n_window_layers() < c.n_layers) return model;
  const int64_t w = *std::min_element(c.layer_windows.begin(), c.layer_windows.end());
  for (const auto& t : windows)
    KVB_CHECK(static_cast<int64_t>(t.size()) <= w, "kvtuner-search: ", c.name,
              " has a sliding window of ", w, " tokens on every layer and a calibration window of ",
              t.size(),
              " tokens; the profiler measures such a model within its window only, "
              "where it is plain causal attention (use --window-tokens ",
              w, " or fewer)");
  auto plain = std::make_shared<Model>(*model);
  plain->config.layer_windows.clear();
  return plain;
}

}  // namespace

std::vector<PairStats> local_errors(std::shared_ptr<Model> model_in,
                                    const std::vector<std::vector<int64_t>>& windows,
                                    const BitPair& pair, const std::string& mode,
                                    int64_t prefill_tokens, int64_t every, int64_t* probed) {
  const std::shared_ptr<Model> model = model_to_search(model_in, windows);
  const auto& c = model->config;
  // The kvtuner store and its exact twin serve the searched layers (the global ones of a model
  // with window layers, inside a WindowedKvCache each); on_layer maps model layers onto them.
  const std::vector<int64_t> layers = searched_layers(c);
  const size_t L = layers.size();
  std::vector<int64_t> searched(static_cast<size_t>(c.n_layers), -1);
  for (size_t i = 0; i < L; ++i) searched[static_cast<size_t>(layers[i])] = static_cast<int64_t>(i);
  const CacheContext ctx{c, model->device, model->dtype};
  std::vector<PairStats> sum(L);
  std::vector<int64_t> n(L, 0);
  for (const auto& w : windows) {
    const int64_t P =
        std::min<int64_t>(std::max<int64_t>(1, prefill_tokens), static_cast<int64_t>(w.size()) - 1);
    auto exact = make_window_aware(
        ctx,
        [&](const CacheContext& g) {
          return std::make_unique<PagedKvCache>(g.config, g.device, g.dtype,
                                                PagedKvCache::Options{});
        },
        /*needs_global=*/false, "the exact twin");
    auto probe = std::make_unique<ExactTrajectoryProbe>(
        make_kvtuner_cache(*model, std::vector<BitPair>(L, pair), mode), std::move(exact), searched,
        std::max<int64_t>(1, every), P);
    ExactTrajectoryProbe* p = probe.get();
    Engine e(model, std::move(probe));
    const int64_t seq = e.new_sequence();
    e.prefill({seq}, {std::vector<int64_t>(w.begin(), w.begin() + P)});
    for (size_t i = static_cast<size_t>(P); i + 1 < w.size(); ++i) e.decode({seq}, {w[i]});
    for (size_t l = 0; l < L; ++l) {
      sum[l].e_o += p->sums()[l].e_o;
      sum[l].e_k += p->sums()[l].e_k;
      sum[l].e_v += p->sums()[l].e_v;
      sum[l].tv += p->sums()[l].tv;
      n[l] += p->counts()[l];
    }
  }
  for (size_t l = 0; l < L; ++l) {
    KVB_CHECK(n[l] > 0, "kvtuner-search: no decode position was probed (windows too short?)");
    const double k = static_cast<double>(n[l]);
    sum[l].e_o /= k;
    sum[l].e_k /= k;
    sum[l].e_v /= k;
    sum[l].tv /= k;
  }
  if (probed) *probed = n[0];
  return sum;
}

// ---------------------------------------------------------------- profile, prune, cluster

double Profile::metric(int64_t layer, size_t pair, const std::string& sensitivity) const {
  const PairStats& s = at[static_cast<size_t>(layer)][pair];
  if (sensitivity == "eo") return s.e_o;
  if (sensitivity == "kl") return s.kl;
  KVB_FAIL("kvtuner-search: sensitivity '", sensitivity, "' is not eo or kl");
}

Profile profile_layers(std::shared_ptr<Model> model, const KlEvaluator& kl,
                       const std::vector<std::vector<int64_t>>& windows, const SearchOptions& o) {
  const int64_t L = static_cast<int64_t>(searched_layers(model->config).size());
  Profile p;
  p.pairs = candidate_pairs();
  // Progress in profiling passes: one per candidate pair (local errors), then one per layer (KL).
  const Stopwatch clock;
  const double passes = static_cast<double>(p.pairs.size() + static_cast<size_t>(L));
  auto pass_done = [&](double done) {
    return ", " + elapsed_and_eta(clock.seconds(), done, passes);
  };
  p.at.assign(static_cast<size_t>(L), std::vector<PairStats>(p.pairs.size()));
  for (size_t j = 0; j < p.pairs.size() && o.local_errors; ++j) {
    auto loc = local_errors(model, windows, p.pairs[j], o.mode, o.prefill_tokens, o.probe_every,
                            &p.probed_positions);
    for (int64_t l = 0; l < L; ++l) {
      PairStats& s = p.at[l][j];
      s.e_o = loc[l].e_o;
      s.e_k = loc[l].e_k;
      s.e_v = loc[l].e_v;
      s.tv = loc[l].tv;
    }
    if (o.log)
      o.log("profile: local errors at " + p.pairs[j].name() + " done" +
            pass_done(static_cast<double>(j + 1)));
  }
  const std::vector<BitPair> kv8(static_cast<size_t>(L), BitPair{8, 8});
  const auto base = kl.evaluate(kv8);
  p.kl_all_kv8 = base.kl_mean;
  for (int64_t l = 0; l < L; ++l) {
    for (size_t j = 0; j < p.pairs.size(); ++j) {
      KlEvaluator::Result r = base;
      if (p.pairs[j].k != 8 || p.pairs[j].v != 8) {
        std::vector<BitPair> cfg = kv8;
        cfg[l] = p.pairs[j];
        r = kl.evaluate(cfg);
      }
      p.at[l][j].kl = r.kl_mean;
      p.at[l][j].nll = r.nll;
    }
    if (o.log)
      o.log("profile: end-to-end KL of layer " + std::to_string(l) + " done" +
            pass_done(static_cast<double>(p.pairs.size() + static_cast<size_t>(l) + 1)));
  }
  return p;
}

std::vector<std::vector<int32_t>> prune_pairs(const Profile& profile,
                                              const std::string& sensitivity) {
  std::vector<std::vector<int32_t>> out;
  for (size_t l = 0; l < profile.at.size(); ++l) {
    std::vector<Objectives> pts;
    for (size_t j = 0; j < profile.pairs.size(); ++j)
      pts.push_back(
          {profile.pairs[j].bits(), profile.metric(static_cast<int64_t>(l), j, sensitivity)});
    std::vector<int32_t> keep;
    for (size_t i : pareto_front(pts)) keep.push_back(static_cast<int32_t>(i));
    out.push_back(keep);
  }
  return out;
}

std::vector<LayerGroup> cluster_layers(const Profile& profile,
                                       const std::vector<std::vector<int32_t>>& candidates,
                                       const std::string& sensitivity, double threshold,
                                       int64_t max_groups) {
  struct Cluster {
    std::vector<int64_t> layers;
    size_t split;
  };
  // (i) Splits by identical candidate sets, in order of first layer.
  std::vector<std::vector<int32_t>> splits;
  std::vector<Cluster> cl;
  for (size_t l = 0; l < candidates.size(); ++l) {
    size_t s = 0;
    while (s < splits.size() && splits[s] != candidates[l]) ++s;
    if (s == splits.size()) splits.push_back(candidates[l]);
    cl.push_back({{static_cast<int64_t>(l)}, s});
  }
  // (ii) Average-linkage agglomeration on log10 sensitivity vectors, within a split.
  auto vec = [&](int64_t l, size_t s) {
    std::vector<double> v;
    for (int32_t j : splits[s])
      v.push_back(
          std::log10(std::max(profile.metric(l, static_cast<size_t>(j), sensitivity), 1e-12)));
    return v;
  };
  auto dist = [&](const Cluster& a, const Cluster& b) {
    double sum = 0;
    for (int64_t x : a.layers)
      for (int64_t y : b.layers) {
        const auto vx = vec(x, a.split), vy = vec(y, b.split);
        double d = 0;
        for (size_t i = 0; i < vx.size(); ++i) d += (vx[i] - vy[i]) * (vx[i] - vy[i]);
        sum += std::sqrt(d / static_cast<double>(vx.size()));
      }
    return sum / static_cast<double>(a.layers.size() * b.layers.size());
  };
  while (true) {
    double best = std::numeric_limits<double>::infinity();
    size_t ba = 0, bb = 0;
    for (size_t a = 0; a < cl.size(); ++a)
      for (size_t b = a + 1; b < cl.size(); ++b) {
        if (cl[a].split != cl[b].split) continue;
        const double d = dist(cl[a], cl[b]);
        if (d < best) {
          best = d;
          ba = a;
          bb = b;
        }
      }
    if (!std::isfinite(best)) break;
    const bool too_many = max_groups > 0 && static_cast<int64_t>(cl.size()) > max_groups;
    if (!(best <= threshold || too_many)) break;
    cl[ba].layers.insert(cl[ba].layers.end(), cl[bb].layers.begin(), cl[bb].layers.end());
    std::sort(cl[ba].layers.begin(), cl[ba].layers.end());
    cl.erase(cl.begin() + static_cast<std::ptrdiff_t>(bb));
  }
  std::sort(cl.begin(), cl.end(),
            [](const Cluster& a, const Cluster& b) { return a.layers[0] < b.layers[0]; });
  std::vector<LayerGroup> out;
  for (const auto& c : cl) out.push_back({c.layers, splits[c.split]});
  return out;
}

// ---------------------------------------------------------------- the pipeline

std::string model_weights_sha256(const Model& model) {
  Sha256 h;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) {
      h.update("-");
      return;
    }
    at::Tensor c = t.contiguous().cpu();
    h.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  };
  const auto& w = model.weights;
  add(w.embedding);
  add(w.final_norm);
  add(w.lm_head);
  for (const auto& l : w.layers) {
    add(l.attn_norm);
    add(l.wqkv);
    add(l.bqkv);
    add(l.wo);
    add(l.ffn_norm);
    add(l.w13);
    add(l.w2);
  }
  return h.hex_digest();
}

namespace {

std::string budget_tag(double b) {
  std::ostringstream s;
  s << b;
  return s.str();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

nlohmann::json run_search(std::shared_ptr<Model> model_in, const CalibrationData& data,
                          const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  KVB_CHECK(o.mode == "kivi" || o.mode == "per_token", "kvtuner-search: --mode '", o.mode,
            "' is not kivi or per_token");
  KVB_CHECK(o.sensitivity == "eo" || o.sensitivity == "kl", "kvtuner-search: --sensitivity '",
            o.sensitivity, "' is not eo or kl");
  KVB_CHECK(o.search == "auto" || o.search == "exhaustive" || o.search == "nsga2",
            "kvtuner-search: --search '", o.search, "' is not auto, exhaustive or nsga2");
  KVB_CHECK(!o.budgets.empty(), "kvtuner-search: --budgets is empty");
  KVB_CHECK(o.local_errors || o.sensitivity == "kl",
            "kvtuner-search: the local errors are skipped but --sensitivity ", o.sensitivity,
            " needs them");
  for (double b : o.budgets)
    KVB_CHECK(b >= 2 && b <= 8, "kvtuner-search: budget ", b, " is outside [2, 8] bits");
  const double max_bits =
      o.max_bits > 0 ? o.max_bits : *std::max_element(o.budgets.begin(), o.budgets.end());
  KVB_CHECK(max_bits >= *std::max_element(o.budgets.begin(), o.budgets.end()),
            "kvtuner-search: --max-bits ", max_bits, " is below a budget");
  // The searched layers (the global ones of a model with window layers); L counts them, and every
  // per-layer vector below is over them.
  const std::shared_ptr<Model> model = model_to_search(model_in, data.windows);
  const std::vector<int64_t> searched = searched_layers(model_in->config);
  const int64_t L = static_cast<int64_t>(searched.size());
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };

  KlEvaluator kl(model, data.windows, o.mode, o.prefill_tokens);
  log("baseline log-probabilities of " + std::to_string(data.windows.size()) + " windows done");
  Profile prof = profile_layers(model, kl, data.windows, o);
  const double t_profile = seconds_since(t0);
  auto cands = prune_pairs(prof, o.sensitivity);
  auto groups = cluster_layers(prof, cands, o.sensitivity, o.cluster_threshold, o.max_groups);
  {
    std::string s = "groups:";
    for (const auto& g : groups) {
      s += " {";
      for (size_t i = 0; i < g.layers.size(); ++i)
        s += (i ? "," : "") + std::to_string(g.layers[i]);
      s += ": " + std::to_string(g.candidates.size()) + " pairs}";
    }
    log(s);
  }

  const auto& P = candidate_pairs();
  std::vector<int32_t> choices;
  for (const auto& g : groups) choices.push_back(static_cast<int32_t>(g.candidates.size()));
  auto decode = [&](const Genome& gen) {
    std::vector<BitPair> layers(static_cast<size_t>(L));
    for (size_t g = 0; g < groups.size(); ++g)
      for (int64_t l : groups[g].layers) layers[l] = P[groups[g].candidates[gen[g]]];
    return layers;
  };
  std::map<std::string, KlEvaluator::Result> results;  // by pairs string
  double planned_evaluations = 0;  // the search's, once it is chosen (for the progress lines' ETA)
  const Stopwatch search_clock;
  auto objective = [&](const Genome& gen) -> Objectives {
    const auto layers = decode(gen);
    const auto r = kl.evaluate(layers);
    results[pairs_string(layers)] = r;
    if (o.log && results.size() % 25 == 0)
      o.log("search: " + std::to_string(results.size()) + " configs evaluated, " +
            elapsed_and_eta(search_clock.seconds(), static_cast<double>(results.size()),
                            planned_evaluations));
    return {equivalent_bits(layers), r.kl_mean};
  };
  auto violation = [&](const Genome& gen) {
    const double b = equivalent_bits(decode(gen));
    return b > max_bits + 1e-9 ? b - max_bits : 0.0;
  };

  // Feasible-space size (enumerated on the cheap bits objective when the space is not huge).
  const int64_t space = space_size(choices, 1000000);
  int64_t feasible = -1;
  if (space > 0) {
    feasible = 0;
    Genome g(choices.size(), 0);
    for (int64_t i = 0; i < space; ++i) {
      feasible += violation(g) <= 0;
      for (size_t d = 0; d < g.size(); ++d) {
        if (++g[d] < choices[d]) break;
        g[d] = 0;
      }
    }
  }
  std::string method = o.search;
  if (method == "auto")
    method = feasible >= 0 && feasible <= o.max_exhaustive ? "exhaustive" : "nsga2";
  KVB_CHECK(method != "exhaustive" || space > 0,
            "kvtuner-search: --search exhaustive: the space of ",
            "the pruned group candidates exceeds 1e6 configs; use nsga2");
  log("search: " + method + " over " + std::to_string(groups.size()) + " groups, space " +
      std::to_string(space) + ", feasible (<= " + budget_tag(max_bits) + " bits) " +
      std::to_string(feasible));
  SearchResult sr;
  planned_evaluations = static_cast<double>(method == "exhaustive" ? space : o.trials);
  if (method == "exhaustive") {
    sr = exhaustive_search(choices, objective, violation);
  } else {
    Nsga2Options no;
    no.population = o.population;
    no.max_evaluations = o.trials;
    no.seed = o.seed;
    sr = nsga2_search(choices, objective, violation, no);
  }
  // A budget below everything the search evaluated (NSGA-II with few trials): add the cheapest
  // config (every group at its lowest-bits candidate, the candidates being sorted by bits), which
  // fits every budget >= its bits, and recompute the front. Exhaustive runs never need it.
  for (double b : o.budgets) {
    bool fits = false;
    for (const auto& e : sr.evaluated) fits = fits || e.f[0] <= b + 1e-9;
    const Genome cheapest(choices.size(), 0);
    if (!fits && std::none_of(sr.evaluated.begin(), sr.evaluated.end(),
                              [&](const Evaluated& e) { return e.genome == cheapest; })) {
      sr.evaluated.push_back({cheapest, objective(cheapest)});
      std::vector<Objectives> pts;
      for (const auto& e : sr.evaluated) pts.push_back(e.f);
      sr.front = pareto_front(pts);
      log("search: added the cheapest config for the budget of " + budget_tag(b) + " bits");
    }
  }
  const double t_search = seconds_since(t0) - t_profile;

  auto config_json = [&](const Evaluated& e) {
    const auto layers = decode(e.genome);
    const auto& r = results.at(pairs_string(layers));
    return nlohmann::json{{"pairs", pairs_string(layers)}, {"equivalent_bits", e.f[0]},
                          {"kl_mean", r.kl_mean},          {"nll", r.nll},
                          {"ppl", std::exp(r.nll)},        {"genome", e.genome}};
  };
  nlohmann::json pareto = nlohmann::json::array();
  for (size_t i : sr.front) pareto.push_back(config_json(sr.evaluated[i]));
  nlohmann::json selected = nlohmann::json::array();
  for (double b : o.budgets) {
    const Evaluated* best = nullptr;
    for (const auto& e : sr.evaluated)
      if (e.f[0] <= b + 1e-9 &&
          (!best || e.f[1] < best->f[1] || (e.f[1] == best->f[1] && e.f[0] < best->f[0])))
        best = &e;
    KVB_CHECK(best != nullptr, "kvtuner-search: no evaluated config fits the budget of ", b,
              " bits");
    nlohmann::json s = config_json(*best);
    s["budget"] = b;
    s["layers"] = layers_json(decode(best->genome));
    selected.push_back(s);
    log("budget " + budget_tag(b) + ": " + s["pairs"].get<std::string>() + " (" +
        budget_tag(best->f[0]) + " bits, calibration KL " + budget_tag(best->f[1]) + ")");
  }
  // Uniform references on the same calibration windows.
  nlohmann::json uniform = nlohmann::json::array();
  for (const auto& p : P) {
    const auto r = kl.evaluate(std::vector<BitPair>(static_cast<size_t>(L), p));
    uniform.push_back({{"pair", p.name()},
                       {"equivalent_bits", p.bits()},
                       {"kl_mean", r.kl_mean},
                       {"nll", r.nll},
                       {"ppl", std::exp(r.nll)}});
  }

  nlohmann::json table = nlohmann::json::array();
  for (int64_t l = 0; l < L; ++l) {
    nlohmann::json row = {{"layer", l}, {"model_layer", searched[static_cast<size_t>(l)]}};
    for (const char* k : {"e_o", "e_k", "e_v", "tv", "kl", "nll"}) row[k] = nlohmann::json::array();
    for (size_t j = 0; j < P.size(); ++j) {
      const PairStats& s = prof.at[l][j];
      row["e_o"].push_back(s.e_o);
      row["e_k"].push_back(s.e_k);
      row["e_v"].push_back(s.e_v);
      row["tv"].push_back(s.tv);
      row["kl"].push_back(s.kl);
      row["nll"].push_back(s.nll);
    }
    nlohmann::json kept = nlohmann::json::array();
    for (int32_t j : cands[l]) kept.push_back(P[j].name());
    row["pareto_pairs"] = kept;
    table.push_back(row);
  }
  nlohmann::json pair_names = nlohmann::json::array();
  for (const auto& p : P) pair_names.push_back(p.name());
  nlohmann::json gj = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json names = nlohmann::json::array();
    for (int32_t j : g.candidates) names.push_back(P[j].name());
    gj.push_back({{"layers", g.layers}, {"candidates", names}});
  }

  nlohmann::json a;
  a["format"] = "kvbench.kvtuner-search/1";
  a["layers"] = selected[0]["layers"];
  a["selected"] = selected;
  a["pareto"] = pareto;
  a["uniform"] = uniform;
  a["profile"] = {{"pairs", pair_names},
                  {"probed_positions_per_layer", prof.probed_positions},
                  {"kl_all_kv8", prof.kl_all_kv8},
                  {"layers", table},
                  {"local_errors",
                   "exact trajectory: every layer's inputs are the full-precision "
                   "run's; e_o, e_k, e_v relative L2, tv = total variation of the "
                   "attention distribution, means over probed decode positions"},
                  {"kl",
                   "mean KL(full || cache) over the calibration positions, this layer at the "
                   "pair, every other layer at KV8"}};
  a["groups"] = gj;
  a["search"] = {{"method", method},
                 {"space", space},
                 {"feasible", feasible},
                 {"evaluated", sr.evaluated.size()},
                 {"infeasible_skipped", sr.infeasible_skipped},
                 {"generations", sr.generations},
                 {"kl_evaluations_total", kl.evaluations()},
                 {"seconds_profile", t_profile},
                 {"seconds_search", t_search},
                 {"seconds_total", seconds_since(t0)}};
  a["settings"] = {{"mode", o.mode},
                   {"budgets", o.budgets},
                   {"max_bits", max_bits},
                   {"sensitivity", o.sensitivity},
                   {"cluster_threshold", o.cluster_threshold},
                   {"max_groups", o.max_groups},
                   {"search", o.search},
                   {"max_exhaustive", o.max_exhaustive},
                   {"trials", o.trials},
                   {"population", o.population},
                   {"seed", o.seed},
                   {"prefill_tokens", o.prefill_tokens},
                   {"probe_every", o.probe_every},
                   {"local_errors", o.local_errors},
                   {"equivalent_bits",
                    "mean over layers of (bK + bV) / 2, without scales, mins and "
                    "the fp16 residual (KVTuner's figure)"}};
  nlohmann::json window_layers = nlohmann::json::array();
  for (int64_t l = 0; l < model_in->config.n_layers; ++l)
    if (model_in->config.is_window_layer(l)) window_layers.push_back(l);
  a["searched_layers"] = searched;
  a["window_layers"] = window_layers;
  a["searched_layers_note"] =
      "the kvtuner method's layers, in model order: \"layers\" key i is searched_layers[i]; a "
      "window layer of a model that also has global layers keeps its window dense, unsearched";
  a["model"] = {
      {"name", model_in->config.name},         {"source", model_in->source},
      {"n_layers", model_in->config.n_layers}, {"device", model->device.str()},
      {"dtype", dtype_name(model->dtype)},     {"weights_sha256", model_weights_sha256(*model)}};
  a["data"] = data.info;
  return a;
}

std::vector<std::string> write_artifact(const nlohmann::json& artifact, const std::string& path) {
  nlohmann::json a = artifact;
  std::string stem = path;
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".json") stem.resize(stem.size() - 5);
  std::vector<std::string> files;
  for (auto& s : a["selected"]) {
    const std::string f = stem + ".b" + budget_tag(s["budget"].get<double>()) + ".json";
    s["file"] = f;
    std::ofstream out(f);
    out << s["layers"].dump(1) << "\n";
    KVB_CHECK(out.good(), f, ": cannot write");
    files.push_back(f);
  }
  std::ofstream out(path);
  out << a.dump(1) << "\n";
  KVB_CHECK(out.good(), path, ": cannot write");
  return files;
}

}  // namespace kvb::kvtuner
