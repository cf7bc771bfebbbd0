// Tensor parallelism of the decoder against the whole model, for GPT-2's,
// Llama's (grouped key/value heads) and Gemma's blocks: t ranks on t threads
// (an all-reduce over the threads in rank order) give the whole model's loss
// and, mapped back with InsertTensorShard, its gradient, for t = 2 and 4,
// f32 and bf16 matmuls; every rank holds the same replicated gradients. The
// shard mapping itself: the ranks' parts tile every split tensor exactly once,
// and Extract after Insert gives the part back.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

#include "compute/random.h"
#include "model/decoder.h"
#include "model/decoder_testing.h"
#include "model/tensor_shard.h"

namespace multislice::model {
namespace {

DecoderConfig Config() { return GptShape(13, 6, 16, 4, 2, 32); }

// Llama with grouped key/value heads (head_dim apart from C / heads) and an
// untied head; Gemma with GeGLU and a normalised tied head.
DecoderConfig Llama(int heads, int kv_heads) {
  return testing::LlamaShape(13, 6, 16, heads, kv_heads, 6, 2, 32);
}

DecoderConfig Gemma() { return testing::GemmaShape(13, 6, 16, 4, 2, 6, 2, 32); }

bool Replicated(const ParamTensor& p) { return p.split == TensorSplit::kWhole; }

// The sum of every rank's buffer, in rank order, written back to each.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int ranks)
      : ranks_(ranks), barrier_(ranks), buffers_(ranks) {}
  Status Run(int rank, float* buf, int64_t count) {
    buffers_[rank] = buf;
    barrier_.arrive_and_wait();
    if (rank == 0) {
      sum_.assign(buf, buf + count);
      for (int r = 1; r < ranks_; ++r) {
        for (int64_t i = 0; i < count; ++i) sum_[i] += buffers_[r][i];
      }
    }
    barrier_.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), buf);
    barrier_.arrive_and_wait();
    return OkStatus();
  }

 private:
  const int ranks_;
  std::barrier<> barrier_;
  std::vector<float*> buffers_;
  std::vector<float> sum_;
};

struct Run {
  float loss = 0;
  std::vector<float> grads;
};

Run Whole(const DecoderConfig& c, DType type, const std::vector<float>& params,
          const std::vector<int32_t>& tokens,
          const std::vector<int32_t>& targets, int B, int T) {
  Decoder model(c, type);
  Run r;
  r.loss = *model.Forward(params.data(), tokens.data(), targets.data(), B, T);
  r.grads.resize(params.size());
  EXPECT_TRUE(model.Backward(params.data(), r.grads.data()).ok());
  return r;
}

void ExpectTensorParallelMatchesWhole(int t, DType type, float tolerance,
                                      bool started = false,
                                      const DecoderConfig& c = Config()) {
  const int B = 2, T = c.max_seq_len;
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 11, params.data());
  std::vector<int32_t> tokens, targets;
  for (int i = 0; i < B * T; ++i) {
    tokens.push_back(
        static_cast<int32_t>(compute::UniformAt(3, 1, i) * c.vocab_size));
    targets.push_back(
        static_cast<int32_t>(compute::UniformAt(3, 2, i) * c.vocab_size));
  }
  const Run whole = Whole(c, type, params, tokens, targets, B, T);

  ThreadAllReduce reduce(t);
  std::vector<Run> ranks(t);
  std::vector<std::thread> threads;
  for (int r = 0; r < t; ++r) {
    threads.emplace_back([&, r] {
      TensorParallel tp;
      tp.size = t;
      tp.rank = r;
      tp.all_reduce = [&reduce, r](float* buf, int64_t n) {
        return reduce.Run(r, buf, n);
      };
      if (started) {
        // The sum happens when waited for: the backward must wait before
        // it reads the input gradient, and every rank in the same order.
        tp.start_all_reduce = [&reduce, r](float* buf, int64_t n) {
          return TensorParallel::Wait(
              [&reduce, r, buf, n] { return reduce.Run(r, buf, n); });
        };
      }
      Decoder model(c, type, tp);
      std::vector<float> local(NumParameters(c, t));
      ExtractTensorShard(c, t, r, params.data(), local.data());
      Result<float> loss =
          model.Forward(local.data(), tokens.data(), targets.data(), B, T);
      ranks[r].loss = loss.ok() ? *loss : NAN;
      ranks[r].grads.resize(local.size());
      EXPECT_TRUE(model.Backward(local.data(), ranks[r].grads.data()).ok());
    });
  }
  for (std::thread& th : threads) th.join();

  std::vector<float> assembled(params.size(), NAN);
  for (int r = 0; r < t; ++r) {
    EXPECT_NEAR(ranks[r].loss, whole.loss, tolerance) << "rank " << r;
    InsertTensorShard(c, t, r, ranks[r].grads.data(), assembled.data());
  }
  // Replicated tensors: every rank's gradient the same (rank 0's is in
  // `assembled` only if rank 0 was inserted last: compare each to rank 0).
  const std::vector<ParamTensor> local = ParameterLayout(c, t);
  for (const ParamTensor& p : local) {
    if (!Replicated(p)) continue;
    for (int r = 1; r < t; ++r) {
      for (int64_t i = 0; i < p.size; ++i) {
        ASSERT_EQ(ranks[r].grads[p.offset + i], ranks[0].grads[p.offset + i])
            << p.name << " rank " << r;
      }
    }
  }
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_FALSE(std::isnan(assembled[i])) << "entry " << i << " not covered";
    max_diff =
        std::max(max_diff,
                 static_cast<double>(std::fabs(assembled[i] - whole.grads[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(whole.grads[i])));
  }
  EXPECT_LT(max_diff, tolerance * max_abs)
      << "t=" << t << ": largest gradient difference " << max_diff << " of "
      << max_abs;
}

TEST(TensorParallelTest, TwoRanksGiveTheWholeModelsLossAndGradientF32) {
  ExpectTensorParallelMatchesWhole(2, DType::kF32, 1e-5f);
}

TEST(TensorParallelTest, FourRanksGiveTheWholeModelsLossAndGradientF32) {
  ExpectTensorParallelMatchesWhole(4, DType::kF32, 1e-5f);
}

TEST(TensorParallelTest, StartedAllReducesOverlapTheWeightGradients) {
  ExpectTensorParallelMatchesWhole(2, DType::kF32, 1e-5f, /*started=*/true);
}

TEST(TensorParallelTest, TwoRanksTrackTheWholeModelBf16) {
  // bf16 rounds each rank's operands as the whole model does; the sums
  // differ only in order.
  ExpectTensorParallelMatchesWhole(2, DType::kBF16, 2e-2f);
}

TEST(TensorParallelTest, LlamaGroupedHeadsTwoAndFourRanksF32) {
  ExpectTensorParallelMatchesWhole(2, DType::kF32, 1e-5f, false, Llama(4, 2));
  ExpectTensorParallelMatchesWhole(4, DType::kF32, 1e-5f, true, Llama(8, 4));
}

TEST(TensorParallelTest, GemmaTwoRanksF32AndLlamaBf16) {
  ExpectTensorParallelMatchesWhole(2, DType::kF32, 1e-5f, true, Gemma());
  ExpectTensorParallelMatchesWhole(2, DType::kBF16, 2e-2f, false, Llama(4, 2));
}

void ExpectRanksTileEverySplitTensor(const DecoderConfig& c, int t) {
  SCOPED_TRACE(std::string(BlockName(c.block)) + " t=" + std::to_string(t));
  const int64_t n = NumParameters(c), local_n = NumParameters(c, t);
  std::vector<float> whole(n);
  for (int64_t i = 0; i < n; ++i) whole[i] = static_cast<float>(i);
  std::vector<int> hits(n, 0);
  int64_t split_values = 0;
  for (const ParamTensor& p : ParameterLayout(c)) {
    if (!Replicated(p)) split_values += p.size;
  }
  int64_t local_split = 0;
  for (const ParamTensor& p : ParameterLayout(c, t)) {
    if (!Replicated(p)) local_split += p.size;
  }
  EXPECT_EQ(local_split * t, split_values);
  for (int r = 0; r < t; ++r) {
    std::vector<float> local(local_n);
    ExtractTensorShard(c, t, r, whole.data(), local.data());
    for (float v : local) ++hits[static_cast<int64_t>(v)];
    std::vector<float> back(n, -1.0f);
    InsertTensorShard(c, t, r, local.data(), back.data());
    std::vector<float> again(local_n);
    ExtractTensorShard(c, t, r, back.data(), again.data());
    EXPECT_EQ(again, local) << "rank " << r;
  }
  for (const ParamTensor& p : ParameterLayout(c)) {
    const int want = Replicated(p) ? t : 1;
    for (int64_t i = 0; i < p.size; ++i) {
      ASSERT_EQ(hits[p.offset + i], want) << p.name << " entry " << i;
    }
  }
}

TEST(TensorShardTest, RanksTileEverySplitTensorOnceAndRoundTrip) {
  const DecoderConfig c = Config();
  const int t = 4;
  ExpectRanksTileEverySplitTensor(c, t);
  ExpectRanksTileEverySplitTensor(Llama(8, 4), 4);
  ExpectRanksTileEverySplitTensor(Gemma(), 2);
  const int64_t n = NumParameters(c), local_n = NumParameters(c, t);
  std::vector<float> whole(n);
  for (int64_t i = 0; i < n; ++i) whole[i] = static_cast<float>(i);
  // qkv.w of layer 0, rank 1 of 4: row 0 holds q's columns 4..7, k's
  // 20..23 and v's 36..39 (C = 16, 4 columns per rank per block).
  const std::vector<ParamTensor> layout = ParameterLayout(c);
  const std::vector<ParamTensor> local_layout = ParameterLayout(c, t);
  const ParamTensor& qkv = layout[4];
  ASSERT_EQ(qkv.name, "h0.qkv.w");
  std::vector<float> local(local_n);
  ExtractTensorShard(c, t, 1, whole.data(), local.data());
  const ParamTensor& lqkv = local_layout[4];
  const std::vector<float> row0(local.begin() + lqkv.offset,
                                local.begin() + lqkv.offset + 12);
  std::vector<float> want;
  for (int col : {4, 5, 6, 7, 20, 21, 22, 23, 36, 37, 38, 39}) {
    want.push_back(static_cast<float>(qkv.offset + col));
  }
  EXPECT_EQ(row0, want);
}

// Grouped heads: a rank holds its query heads' and its key/value heads'
// columns. Llama(4, 2), rank 1 of 2, head_dim 6: q columns 12..23 of 24, k
// 30..35 of [24, 36), v 42..47 of [36, 48).
TEST(TensorShardTest, GroupedHeadsSplitTheirOwnColumnBlocks) {
  const DecoderConfig c = Llama(4, 2);
  const int t = 2;
  std::vector<float> whole(NumParameters(c));
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
  std::vector<float> local(NumParameters(c, t));
  ExtractTensorShard(c, t, 1, whole.data(), local.data());
  const std::vector<ParamTensor> layout = ParameterLayout(c);
  const std::vector<ParamTensor> local_layout = ParameterLayout(c, t);
  ASSERT_EQ(layout[2].name, "h0.qkv.w");
  ASSERT_EQ(layout[2].shape, (std::vector<int64_t>{16, 48}));
  ASSERT_EQ(local_layout[2].shape, (std::vector<int64_t>{16, 24}));
  std::vector<float> want;
  for (int col = 12; col < 24; ++col) want.push_back(layout[2].offset + col);
  for (int col = 30; col < 36; ++col) want.push_back(layout[2].offset + col);
  for (int col = 42; col < 48; ++col) want.push_back(layout[2].offset + col);
  const std::vector<float> row0(local.begin() + local_layout[2].offset,
                                local.begin() + local_layout[2].offset + 24);
  EXPECT_EQ(row0, want);
}

TEST(TensorShardTest, RanksThatDoNotDivideHeadsOrMlpAreOneSentence) {
  const DecoderConfig c = Config();
  EXPECT_TRUE(ValidateTensorParallelism(c, 4).ok());
  const Status s = ValidateTensorParallelism(c, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "tensor parallelism 3 must divide num_heads (4) and mlp_dim (32): "
            "each rank holds whole heads and an equal part of the MLP");
  EXPECT_EQ(ValidateTensorParallelism(Llama(4, 1), 2).message(),
            "tensor parallelism 2 must divide num_heads (4), num_kv_heads (1) "
            "and mlp_dim (32): each rank holds whole heads and an equal part "
            "of the MLP");
}

}  // namespace
}  // namespace multislice::model
