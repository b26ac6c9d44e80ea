#include "remat/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include "base/torch_compat.h"
#include "ops/philox_keep.h"
#include "remat/base/error.h"
#include "remat/ops/dropout.h"

namespace remat::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kScoresPerBlock = int64_t{1} << 19;  // 2 MiB of fp32 scores

struct Shape {
  int64_t batch, heads, queries, keys, head_size;
  int64_t batch_heads() const { return batch * heads; }
};

Shape shape_of(const at::Tensor& q, const at::Tensor& k) {
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
}

// The dropout scales of the probabilities' rows i0 .. i0+rows-1 against keys 0 .. keys_used-1:
// (batch·heads, rows, keys_used) of `like`'s dtype on its device; row (bh, i) is the stream's run from
// (bh·T_q + i)·T_k. Drawn by a loop on the CPU, by tensor operations on any other device; the scale
// is rounded to fp32 first on both.
at::Tensor block_dropout_scale(uint64_t seed, double p, const Shape& s, int64_t i0, int64_t rows, int64_t keys_used,
                               const at::Tensor& like) {
  const uint64_t threshold = detail::keep_threshold(p);
  const float kept = static_cast<float>(1.0 / (1.0 - p));
  if (detail::keeps_by_tensor_ops(like)) {
    const at::TensorOptions index = like.options().dtype(at::kLong);
    const at::Tensor starts = at::arange(s.batch_heads(), index)
                                  .mul_(s.queries * s.keys)
                                  .unsqueeze(1)
                                  .add(at::arange(i0, i0 + rows, index).mul_(s.keys))
                                  .view({-1});
    const at::Tensor keep = detail::keep_decisions(seed, starts, keys_used, threshold);
    return at::where(keep, at::scalar_tensor(static_cast<double>(kept), like.options()), at::zeros({}, like.options()))
        .view({s.batch_heads(), rows, keys_used});
  }
  at::Tensor scale = at::empty({s.batch_heads(), rows, keys_used}, at::TensorOptions().dtype(at::kFloat));
  float* data = scale.data_ptr<float>();
  at::parallel_for(0, s.batch_heads() * rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(keys_used, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row) {
                       const int64_t bh = row / rows, i = i0 + row % rows;
                       const auto first = static_cast<uint64_t>((bh * s.queries + i) * s.keys);
                       float* out = data + row * keys_used;
                       detail::for_each_keep(seed, first, keys_used, threshold,
                                             [&](int64_t j, bool keep) { out[j] = keep ? kept : 0.0f; });
                     }
                   });
  return scale.to(like.scalar_type());
}

// Scores of query rows i0.. against keys 0..keys_used-1 with the causal mask applied: only the
// block's diagonal square [i0, i0+rows) of key columns can hold keys after the query.
at::Tensor block_scores(const at::Tensor& scaled_q, const at::Tensor& k, int64_t i0, int64_t rows, int64_t keys_used,
                        bool causal) {
  at::Tensor scores = at::bmm(scaled_q.narrow(1, i0, rows), k.narrow(1, 0, keys_used).transpose(1, 2));
  if (causal) {
    at::Tensor above = at::ones({rows, rows}, scores.options().dtype(at::kBool)).triu(1);
    scores.narrow(2, i0, rows).masked_fill_(above, -std::numeric_limits<double>::infinity());
  }
  return scores;
}

struct Blocks {
  int64_t rows;
  bool causal;
  int64_t queries, keys;
  template <typename F>
  void for_each(F&& f) const {  // f(i0, rows, keys_used)
    for (int64_t i0 = 0; i0 < queries; i0 += rows) {
      const int64_t r = std::min(rows, queries - i0);
      f(i0, r, causal ? i0 + r : keys);
    }
  }
};

struct MemoryEfficientAttention : torch::autograd::Function<MemoryEfficientAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool causal, double p, double scale, int64_t block_rows) {
    const Shape s = shape_of(q, k);
    const int64_t BH = s.batch_heads();
    const uint64_t seed = p > 0 ? draw_dropout_seed() : 0;
    // Batched (batch·heads) copies for the products; transients, not kept.
    const at::Tensor scaled_q = q.mul(scale).reshape({BH, s.queries, s.head_size});
    const at::Tensor kf = k.reshape({BH, s.keys, s.head_size});
    const at::Tensor vf = v.reshape({BH, s.keys, s.head_size});
    at::Tensor out = at::empty({s.batch, s.queries, s.heads, s.head_size}, q.options());
    at::Tensor lse = at::empty({BH, s.queries}, q.options());
    Blocks{block_rows, causal, s.queries, s.keys}.for_each([&](int64_t i0, int64_t rows, int64_t keys_used) {
      at::Tensor probs = block_scores(scaled_q, kf, i0, rows, keys_used, causal);
      at::Tensor row_lse = at::logsumexp(probs, {2});  // (BH, rows)
      lse.narrow(1, i0, rows).copy_(row_lse);
      probs.sub_(row_lse.unsqueeze(2)).exp_();
      if (p > 0) probs.mul_(block_dropout_scale(seed, p, s, i0, rows, keys_used, probs));
      const at::Tensor o = at::bmm(probs, vf.narrow(1, 0, keys_used));  // (BH, rows, D)
      out.narrow(1, i0, rows).copy_(o.view({s.batch, s.heads, rows, s.head_size}).transpose(1, 2));
    });
    at::Tensor result = out.transpose(1, 2);  // (B, H, T_q, D), a view of the contiguous (B, T_q, H, D)
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["p"] = p;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block_rows"] = block_rows;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    return {result};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    REMAT_CHECK(!at::GradMode::is_enabled(),
                "remat::ops::attention: no double backward (create_graph); its backward recomputes the "
                "probabilities outside autograd. Use plain attention where second derivatives are needed.");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const bool causal = ctx->saved_data["causal"].toBool();
    const double p = ctx->saved_data["p"].toDouble();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const Shape s = shape_of(q, k);
    const int64_t BH = s.batch_heads();

    const at::Tensor grad_out = grads[0].reshape({BH, s.queries, s.head_size});
    // delta_i = Σ_j P_ij·dP_ij = dO_i · O_i: the softmax backward's row term, without P.
    const at::Tensor delta = grads[0].mul(out).sum(3).reshape({BH, s.queries});  // (BH, T_q); no copy of `out`
    const at::Tensor scaled_q = q.mul(scale).reshape({BH, s.queries, s.head_size});
    const at::Tensor kf = k.reshape({BH, s.keys, s.head_size});
    const at::Tensor vf = v.reshape({BH, s.keys, s.head_size});
    at::Tensor dq = at::empty({BH, s.queries, s.head_size}, q.options());
    at::Tensor dk = at::zeros({BH, s.keys, s.head_size}, k.options());
    at::Tensor dv = at::zeros({BH, s.keys, s.head_size}, v.options());
    Blocks{block_rows, causal, s.queries, s.keys}.for_each([&](int64_t i0, int64_t rows, int64_t keys_used) {
      at::Tensor probs = block_scores(scaled_q, kf, i0, rows, keys_used, causal);
      probs.sub_(lse.narrow(1, i0, rows).unsqueeze(2)).exp_();  // P, recomputed
      const at::Tensor grad_out_block = grad_out.narrow(1, i0, rows);
      at::Tensor grad_probs = at::bmm(grad_out_block, vf.narrow(1, 0, keys_used).transpose(1, 2));  // d(P·mask)
      at::Tensor dropped = probs;
      if (p > 0) {
        const at::Tensor mask = block_dropout_scale(seed, p, s, i0, rows, keys_used, probs);
        dropped = probs.mul(mask);
        grad_probs.mul_(mask);  // dP
      }
      dv.narrow(1, 0, keys_used).baddbmm_(dropped.transpose(1, 2), grad_out_block);
      grad_probs.sub_(delta.narrow(1, i0, rows).unsqueeze(2)).mul_(probs);  // dS = P ⊙ (dP − delta)
      dq.narrow(1, i0, rows).copy_(at::bmm(grad_probs, kf.narrow(1, 0, keys_used)));
      dk.narrow(1, 0, keys_used).baddbmm_(grad_probs.transpose(1, 2), scaled_q.narrow(1, i0, rows));
    });
    dq.mul_(scale);
    const auto as_input = [&](const at::Tensor& g, int64_t length) {
      return g.view({s.batch, s.heads, length, s.head_size});
    };
    return {as_input(dq, s.queries),
            as_input(dk, s.keys),
            as_input(dv, s.keys),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

int64_t attention_block_rows(int64_t batch_heads, int64_t query_length, int64_t key_length,
                             const AttentionOptions& options) {
  if (options.block_rows() > 0) return std::min(options.block_rows(), std::max<int64_t>(query_length, 1));
  const int64_t rows = kScoresPerBlock / std::max<int64_t>(1, batch_heads * key_length);
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(query_length, 1));
}

namespace {

double effective_dropout(const AttentionOptions& options) { return options.training() ? options.dropout() : 0.0; }

double effective_scale(const at::Tensor& q, const AttentionOptions& options) {
  return options.scale() != 0.0 ? options.scale() : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

}  // namespace

AttentionKernel attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionOptions& options) {
  if (options.kernel() == AttentionKernel::automatic) {
    const int64_t backend = remat::detail::fused_attention_backend(q, k, v, effective_dropout(options),
                                                                   options.causal(), effective_scale(q, options));
    return backend > 0 ? AttentionKernel::sdpa : AttentionKernel::blocked;
  }
  REMAT_CHECK(options.kernel() != AttentionKernel::sdpa || remat::detail::kHasFusedAttention,
              "remat::ops::attention: the sdpa kernel needs LibTorch 2.1 or "
              "later (scaled_dot_product_attention); this is ",
              TORCH_VERSION, ". Use AttentionKernel::automatic.");
  return options.kernel();
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionOptions& options) {
  REMAT_CHECK(q.defined() && k.defined() && v.defined(), "remat::ops::attention: q, k and v must all be defined.");
  REMAT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "remat::ops::attention: q, k and v must be 4-dimensional (batch, heads, length, head size); got ",
              q.sizes(), ", ", k.sizes(), " and ", v.sizes(), ".");
  REMAT_CHECK(k.sizes() == v.sizes(), "remat::ops::attention: k and v must have the same shape, got ", k.sizes(),
              " and ", v.sizes(), ".");
  REMAT_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), "remat::ops::attention: q ",
              q.sizes(), " and k ", k.sizes(), " must agree on batch, heads and head size (dimensions 0, 1 and 3).");
  REMAT_CHECK(
      at::isFloatingType(q.scalar_type()) && q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
      "remat::ops::attention: q, k and v must share one floating-point dtype.");
  REMAT_CHECK(q.device() == k.device() && q.device() == v.device(),
              "remat::ops::attention: q, k and v must be on one device.");
  REMAT_CHECK(!options.causal() || q.size(2) == k.size(2),
              "remat::ops::attention: causal attention needs as many queries as keys, got ", q.size(2), " and ",
              k.size(2), ".");
  REMAT_CHECK(options.block_rows() >= 0, "remat::ops::attention: block_rows must be positive (or 0: automatic), got ",
              options.block_rows(), ".");
  detail::keep_threshold(options.dropout());  // checks the probability
  const double p = effective_dropout(options);
  const double scale = effective_scale(q, options);
  // Where LibTorch has a fused kernel it keeps what this operation keeps (or less: measured in
  // bench/attention_bench.cpp, on CPU at B 8, H 8, T 256, D 32: 12.2 against 16.4 MiB at the
  // same time), and on CUDA its fused kernels take dropout too.
  if (attention_kernel(q, k, v, options) == AttentionKernel::sdpa) {
    return remat::detail::fused_attention(q, k, v, p, options.causal(), scale);
  }
  const int64_t rows = attention_block_rows(q.size(0) * q.size(1), q.size(2), k.size(2), options);
  return MemoryEfficientAttention::apply(q, k, v, options.causal(), p, scale, rows)[0];
}

}  // namespace remat::ops
