#include "model/shardings.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "compute/elementwise.h"
#include "compute/matmul.h"
#include "compute/random.h"
#include "runtime/trace.h"

namespace multislice::model {
namespace {

using compute::GemmDesc;
using runtime::Axes;
using runtime::CollectiveHandle;
using runtime::Track;

const Axes kAllAxes = {"data", "fsdp", "tensor"};

// A buffer of `count` elements of one dtype (bytes, 64-byte aligned).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, int64_t count) { Reset(dtype, count); }
  void Reset(DType dtype, int64_t count) {
    dtype_ = dtype;
    count_ = count;
    const size_t bytes = static_cast<size_t>(count) * SizeOf(dtype);
    data_.reset(static_cast<std::byte*>(
        ::operator new[](std::max<size_t>(bytes, 64), std::align_val_t(64))));
    std::memset(data_.get(), 0, bytes);  // touch every page now
  }
  void* data() const { return data_.get(); }
  int64_t count() const { return count_; }
  DType dtype() const { return dtype_; }

 private:
  struct Free {
    void operator()(std::byte* p) const {
      ::operator delete[](p, std::align_val_t(64));
    }
  };
  DType dtype_ = DType::kF32;
  int64_t count_ = 0;
  std::unique_ptr<std::byte[], Free> data_;
};

}  // namespace

Result<ShardingsShapes> ComputeShardingsShapes(
    const ShardingsConfig& config, const mesh::ParallelismConfig& resolved,
    int num_devices) {
  ShardingsShapes s;
  s.data = resolved.size(mesh::kData);
  s.fsdp = resolved.size(mesh::kFsdp);
  s.tensor = resolved.size(mesh::kTensor);
  // The original's mesh has no stage or diloco axis: every device holds
  // every layer, and every replica meets every step.
  for (int level = 0; level < 2; ++level) {
    const mesh::AxisSizes& sizes = level == 0 ? resolved.ici : resolved.dcn;
    const std::string prefix = level == 0 ? "ici" : "dcn";
    if (sizes[mesh::kStage] != 1) {
      return InvalidArgument(prefix + "_pipeline_parallelism=" +
                             std::to_string(sizes[mesh::kStage]) +
                             ": multislice shardings has no pipeline stages; "
                             "expected 1");
    }
    if (sizes[mesh::kDiloco] != 1) {
      return InvalidArgument(prefix + "_diloco_parallelism=" +
                             std::to_string(sizes[mesh::kDiloco]) +
                             ": multislice shardings has no DiLoCo replicas "
                             "(multislice train has); expected 1");
    }
  }
  const int64_t e = config.embedding_dimension;
  if (e < 1) {
    return InvalidArgument(
        "--embedding_dimension: expected a positive size, "
        "got " +
        std::to_string(e));
  }
  if (config.batch_size < 1) {
    return InvalidArgument("--batch_size: expected a positive size, got " +
                           std::to_string(config.batch_size));
  }
  if (config.num_layers < 1) {
    return InvalidArgument("--num_layers: expected at least 1, got " +
                           std::to_string(config.num_layers));
  }
  if (e % s.fsdp != 0) {
    return InvalidArgument("--embedding_dimension " + std::to_string(e) +
                           " must be divisible by the fsdp parallelism " +
                           std::to_string(s.fsdp) +
                           " (weights are sharded P(\"tensor\", \"fsdp\"))");
  }
  if (e % s.tensor != 0) {
    return InvalidArgument(
        "--embedding_dimension " + std::to_string(e) +
        " must be divisible by the tensor parallelism " +
        std::to_string(s.tensor) +
        " (activations are sharded P((\"data\", \"fsdp\"), \"tensor\"))");
  }
  s.emb = e;
  s.ff = 4 * e;
  s.batch = static_cast<int64_t>(num_devices) * config.batch_size;
  s.rows = s.batch / (s.data * s.fsdp);
  s.emb_t = e / s.tensor;
  s.emb_f = e / s.fsdp;
  s.ff_t = s.ff / s.tensor;
  s.parameters = 2 * s.ff * s.emb * config.num_layers;
  s.parameter_bytes = 2.0 * static_cast<double>(s.parameters);
  s.activation_bytes = 2.0 * static_cast<double>(s.batch) *
                       static_cast<double>(s.ff + s.emb) * config.num_layers;
  s.parameter_bytes_per_device = 2 * s.emb_f * s.ff_t * config.num_layers *
                                 static_cast<int64_t>(SizeOf(config.dtype));
  s.tflop_per_device = 6.0 * static_cast<double>(s.parameters) *
                       static_cast<double>(s.batch) / 1e12 / num_devices;
  return s;
}

struct ShardingsDevice::State {
  runtime::Runtime& rt;
  runtime::DeviceCollectives& coll;
  const int device;
  const ShardingsConfig config;
  const ShardingsShapes sh;
  const DType dt;
  int data_index = 0, fsdp_index = 0, tensor_index = 0;

  struct Layer {
    Buffer w[2];          // shards, [E/f, F/t]
    Buffer w_full[2];     // gathered over fsdp, [E, F/t] (f > 1)
    Buffer grad_full[2];  // gradient before the fsdp scatter, [E, F/t]
    Buffer grad[2];       // gradient shard, [E/f, F/t] (f > 1)
    Buffer x_full;        // input gathered over tensor, [E, b] (t > 1)
    Buffer m1;            // [b, F/t]
    Buffer out;           // M2 transposed, [E/t, b]: the next layer's input
  };
  std::vector<Layer> layers;
  Buffer input;      // X transposed, [E/t, b]
  Buffer d_out;      // dL/dM2 transposed, [E/t, b]
  Buffer dz2;        // [E/t, b]
  Buffer dz2_full;   // [E, b] (t > 1)
  Buffer dm1;        // [b, F/t]
  Buffer partial;    // f32 [E, b] (t > 1): sums over F shards
  Buffer scattered;  // f32 [E/t, b] (t > 1)

  State(runtime::Runtime& r, int l, const ShardingsConfig& c,
        const ShardingsShapes& s)
      : rt(r),
        coll(r.collectives(l)),
        device(r.local_devices()[l]),
        config(c),
        sh(s),
        dt(c.dtype) {}

  runtime::Trace* trace() const { return rt.trace(); }

  bool Skipped(const Axes& axes) {
    if (!config.skip_dcn) return false;
    auto g = coll.Group(axes);
    return g.ok() && (*g)->dcn_size > 1;
  }

  // The weight of layer l as the matmuls read it: gathered, or the shard.
  const void* Weight(int l, int which) {
    return sh.fsdp > 1 ? layers[l].w_full[which].data()
                       : layers[l].w[which].data();
  }

  CollectiveHandle GatherWeights(int l, int which) {
    Layer& layer = layers[l];
    if (sh.fsdp == 1) return {};
    return coll.AllGather(
        {"fsdp"}, layer.w[which].data(), layer.w_full[which].data(),
        sh.emb * sh.ff_t, dt,
        "layer" + std::to_string(l) + "/w" + std::to_string(which));
  }

  // Reduce-scatter over fsdp, then all-reduce over data, of one gradient;
  // started as soon as the gradient exists.
  CollectiveHandle ReduceGradient(int l, int which) {
    Layer& layer = layers[l];
    const std::string label =
        "layer" + std::to_string(l) + "/grad" + std::to_string(which);
    CollectiveHandle scattered;
    void* shard = layer.grad_full[which].data();
    if (sh.fsdp > 1 && !Skipped({"fsdp"})) {
      shard = layer.grad[which].data();
      scattered =
          coll.ReduceScatter({"fsdp"}, layer.grad_full[which].data(), shard,
                             sh.emb * sh.ff_t, dt, comm::ReduceOp::kSum, label);
    }
    if (sh.data == 1 || Skipped({"data"})) return scattered;
    return coll.AllReduce({"data"}, shard, shard, sh.emb_f * sh.ff_t, dt,
                          comm::ReduceOp::kSum, label, scattered);
  }

  const void* GradientShard(int l, int which) {
    return sh.fsdp > 1 && !Skipped({"fsdp"})
               ? layers[l].grad[which].data()
               : layers[l].grad_full[which].data();
  }

  Status Gemm(const char* name, const GemmDesc& d, const void* a, const void* b,
              void* c) {
    runtime::ScopedSpan span(trace(), device, Track::kCompute, name);
    return compute::Gemm(d, a, b, c);
  }

  Status Init() {
    const mesh::DeviceMesh& mesh = rt.mesh();
    ASSIGN_OR_RETURN(std::vector<int> coords, mesh.coords_of(device));
    data_index = coords[mesh::kData];
    fsdp_index = coords[mesh::kFsdp];
    tensor_index = coords[mesh::kTensor];
    const int64_t b = sh.rows;
    layers.resize(config.num_layers);
    for (int l = 0; l < config.num_layers; ++l) {
      Layer& layer = layers[l];
      for (int which = 0; which < 2; ++which) {
        layer.w[which].Reset(dt, sh.emb_f * sh.ff_t);
        // Logical W[F, E]; this device holds rows tensor_index * F/t and
        // columns fsdp_index * E/f, stored transposed.
        compute::FillBlock(compute::Distribution::kNormal, config.seed,
                           ShardingsWeightStream(l, which), 1e-4f, sh.emb,
                           row_offset(), col_offset(), sh.ff_t, sh.emb_f,
                           /*transposed=*/true, dt, layer.w[which].data(),
                           sh.ff_t);
        layer.grad_full[which].Reset(dt, sh.emb * sh.ff_t);
        if (sh.fsdp > 1) {
          layer.w_full[which].Reset(dt, sh.emb * sh.ff_t);
          layer.grad[which].Reset(dt, sh.emb_f * sh.ff_t);
        }
      }
      if (sh.tensor > 1) layer.x_full.Reset(dt, sh.emb * b);
      layer.m1.Reset(dt, b * sh.ff_t);
      layer.out.Reset(dt, sh.emb_t * b);
    }
    input.Reset(dt, sh.emb_t * b);
    compute::FillBlock(
        compute::Distribution::kUniform, config.seed, kShardingsInputStream,
        1.0f, sh.emb,
        (static_cast<int64_t>(data_index) * sh.fsdp + fsdp_index) * b,
        static_cast<int64_t>(tensor_index) * sh.emb_t, b, sh.emb_t,
        /*transposed=*/true, dt, input.data(), b);
    d_out.Reset(dt, sh.emb_t * b);
    dz2.Reset(dt, sh.emb_t * b);
    dm1.Reset(dt, b * sh.ff_t);
    if (sh.tensor > 1) {
      dz2_full.Reset(dt, sh.emb * b);
      partial.Reset(DType::kF32, sh.emb * b);
      scattered.Reset(DType::kF32, sh.emb_t * b);
    }
    return OkStatus();
  }

  int64_t row_offset() const {
    return static_cast<int64_t>(tensor_index) * sh.ff_t;
  }
  int64_t col_offset() const {
    return static_cast<int64_t>(fsdp_index) * sh.emb_f;
  }

  // out (dtype dt, [E/t, b]) = sigmoid(sum over tensor shards of the f32
  // partial [E, b]), or the partial itself reduced when t == 1 is handled by
  // the caller with a fused sigmoid.
  Status ScatterPartialSums(const std::string& label, bool apply_sigmoid,
                            void* out) {
    RETURN_IF_ERROR(coll.ReduceScatter({"tensor"}, partial.data(),
                                       scattered.data(), sh.emb * sh.rows,
                                       DType::kF32, comm::ReduceOp::kSum, label)
                        .Wait());
    runtime::ScopedSpan span(trace(), device, Track::kCompute,
                             apply_sigmoid ? "sigmoid" : "convert");
    const size_t n = static_cast<size_t>(sh.emb_t * sh.rows);
    if (apply_sigmoid) {
      compute::Sigmoid(DType::kF32, scattered.data(), scattered.data(), n);
    }
    compute::Convert(DType::kF32, scattered.data(), dt, out, n);
    return OkStatus();
  }

  Status Forward(double* local_sum) {
    const int64_t b = sh.rows;
    std::vector<CollectiveHandle> gathers(2 * config.num_layers);
    gathers[0] = GatherWeights(0, 0);
    gathers[1] = GatherWeights(0, 1);
    const void* x = input.data();
    for (int l = 0; l < config.num_layers; ++l) {
      Layer& layer = layers[l];
      if (l + 1 < config.num_layers) {  // prefetch the next layer's weights
        gathers[2 * l + 2] = GatherWeights(l + 1, 0);
        gathers[2 * l + 3] = GatherWeights(l + 1, 1);
      }
      const void* x_full = x;  // [E, b]
      if (sh.tensor > 1) {
        RETURN_IF_ERROR(coll.AllGather({"tensor"}, x, layer.x_full.data(),
                                       sh.emb * b, dt,
                                       "layer" + std::to_string(l) + "/x")
                            .Wait());
        x_full = layer.x_full.data();
      }
      RETURN_IF_ERROR(gathers[2 * l].Wait());
      // M1 [b, F/t] = sigmoid(x @ W1^T): A = x_full^T (stored [E, b]).
      GemmDesc m1{.m = b,
                  .n = sh.ff_t,
                  .k = sh.emb,
                  .transpose_a = true,
                  .ab_type = dt,
                  .c_type = dt,
                  .sigmoid = true};
      RETURN_IF_ERROR(Gemm("M1", m1, x_full, Weight(l, 0), layer.m1.data()));
      RETURN_IF_ERROR(gathers[2 * l + 1].Wait());
      // M2^T [E, b] = W2g [E, F/t] @ M1^T, summed over tensor shards.
      GemmDesc m2{.m = sh.emb,
                  .n = b,
                  .k = sh.ff_t,
                  .transpose_b = true,
                  .ab_type = dt,
                  .c_type = dt,
                  .sigmoid = true};
      if (sh.tensor == 1) {
        RETURN_IF_ERROR(
            Gemm("M2", m2, Weight(l, 1), layer.m1.data(), layer.out.data()));
      } else {
        m2.c_type = DType::kF32;
        m2.sigmoid = false;
        RETURN_IF_ERROR(
            Gemm("M2", m2, Weight(l, 1), layer.m1.data(), partial.data()));
        RETURN_IF_ERROR(ScatterPartialSums("layer" + std::to_string(l) + "/M2",
                                           true, layer.out.data()));
      }
      x = layer.out.data();
    }
    runtime::ScopedSpan span(trace(), device, Track::kCompute, "loss");
    *local_sum = compute::Sum(dt, x, static_cast<size_t>(sh.emb_t * b));
    return OkStatus();
  }

  Status Backward(std::vector<CollectiveHandle>* reductions) {
    const int64_t b = sh.rows;
    compute::Fill(dt, d_out.data(), 1.0f, static_cast<size_t>(sh.emb_t * b));
    for (int l = config.num_layers - 1; l >= 0; --l) {
      Layer& layer = layers[l];
      const std::string name = "layer" + std::to_string(l);
      {
        runtime::ScopedSpan span(trace(), device, Track::kCompute, "dZ2");
        compute::SigmoidGrad(dt, d_out.data(), layer.out.data(), dt, dz2.data(),
                             static_cast<size_t>(sh.emb_t * b));
      }
      const void* dz2_all = dz2.data();  // [E, b]
      if (sh.tensor > 1) {
        RETURN_IF_ERROR(coll.AllGather({"tensor"}, dz2.data(), dz2_full.data(),
                                       sh.emb * b, dt, name + "/dZ2")
                            .Wait());
        dz2_all = dz2_full.data();
      }
      // dW2g [E, F/t] = dZ2^T [E, b] @ M1 [b, F/t].
      GemmDesc dw2{
          .m = sh.emb, .n = sh.ff_t, .k = b, .ab_type = dt, .c_type = dt};
      RETURN_IF_ERROR(Gemm("dW2", dw2, dz2_all, layer.m1.data(),
                           layer.grad_full[1].data()));
      reductions->push_back(ReduceGradient(l, 1));
      // dM1 [b, F/t] = dZ2 [b, E] @ W2g [E, F/t]: A stored [E, b].
      GemmDesc dm{.m = b,
                  .n = sh.ff_t,
                  .k = sh.emb,
                  .transpose_a = true,
                  .ab_type = dt,
                  .c_type = dt};
      RETURN_IF_ERROR(Gemm("dM1", dm, dz2_all, Weight(l, 1), dm1.data()));
      {
        runtime::ScopedSpan span(trace(), device, Track::kCompute, "dZ1");
        compute::SigmoidGrad(dt, dm1.data(), layer.m1.data(), dt, dm1.data(),
                             static_cast<size_t>(b * sh.ff_t));
      }
      // dW1g [E, F/t] = x^T [E, b] @ dZ1 [b, F/t].
      const void* x_full = sh.tensor > 1 ? layer.x_full.data()
                           : l == 0      ? input.data()
                                         : layers[l - 1].out.data();
      GemmDesc dw1{
          .m = sh.emb, .n = sh.ff_t, .k = b, .ab_type = dt, .c_type = dt};
      RETURN_IF_ERROR(
          Gemm("dW1", dw1, x_full, dm1.data(), layer.grad_full[0].data()));
      reductions->push_back(ReduceGradient(l, 0));
      if (l == 0) break;
      // dX^T [E, b] = W1g [E, F/t] @ dZ1^T, summed over tensor shards.
      GemmDesc dx{.m = sh.emb,
                  .n = b,
                  .k = sh.ff_t,
                  .transpose_b = true,
                  .ab_type = dt,
                  .c_type = dt};
      if (sh.tensor == 1) {
        RETURN_IF_ERROR(Gemm("dX", dx, Weight(l, 0), dm1.data(), d_out.data()));
      } else {
        dx.c_type = DType::kF32;
        RETURN_IF_ERROR(
            Gemm("dX", dx, Weight(l, 0), dm1.data(), partial.data()));
        RETURN_IF_ERROR(ScatterPartialSums(name + "/dX", false, d_out.data()));
      }
    }
    return OkStatus();
  }

  Status Update() {
    for (int l = 0; l < config.num_layers; ++l) {
      for (int which = 0; which < 2; ++which) {
        runtime::ScopedSpan span(trace(), device, Track::kCompute, "sgd");
        compute::SgdUpdate(dt, layers[l].w[which].data(),
                           GradientShard(l, which), config.learning_rate,
                           static_cast<size_t>(sh.emb_f * sh.ff_t));
      }
    }
    return OkStatus();
  }

  Status Step(StepStats* stats) {
    RETURN_IF_ERROR(coll.Barrier(kAllAxes, "step").Wait());
    const uint64_t ici0 = coll.counters().ici_bytes_sent;
    const uint64_t hosts0 = coll.counters().slice_net_bytes_sent;
    const uint64_t dcn0 = coll.counters().dcn_bytes_sent;
    const auto start = std::chrono::steady_clock::now();
    double local_sum = 0;
    RETURN_IF_ERROR(Forward(&local_sum));
    // The loss needs every device's part; its all-reduce runs while the
    // backward pass computes.
    float loss[1] = {static_cast<float>(local_sum)};
    CollectiveHandle loss_sum = coll.AllReduce(
        kAllAxes, loss, loss, 1, DType::kF32, comm::ReduceOp::kSum, "loss");
    std::vector<CollectiveHandle> reductions;
    RETURN_IF_ERROR(Backward(&reductions));
    for (CollectiveHandle& h : reductions) RETURN_IF_ERROR(h.Wait());
    RETURN_IF_ERROR(Update());
    RETURN_IF_ERROR(loss_sum.Wait());
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    stats->loss = loss[0];
    stats->ici_between_hosts_bytes =
        coll.counters().slice_net_bytes_sent - hosts0;
    stats->ici_bytes =
        coll.counters().ici_bytes_sent - ici0 + stats->ici_between_hosts_bytes;
    stats->dcn_bytes = coll.counters().dcn_bytes_sent - dcn0;
    return OkStatus();
  }
};

ShardingsDevice::ShardingsDevice(runtime::Runtime& rt, int local_index,
                                 const ShardingsConfig& config,
                                 const ShardingsShapes& shapes)
    : s_(std::make_unique<State>(rt, local_index, config, shapes)) {}

ShardingsDevice::~ShardingsDevice() = default;

Status ShardingsDevice::Init() { return s_->Init(); }
Status ShardingsDevice::Step(StepStats* stats) { return s_->Step(stats); }
int64_t ShardingsDevice::row_offset() const { return s_->row_offset(); }
int64_t ShardingsDevice::col_offset() const { return s_->col_offset(); }

std::vector<float> ShardingsDevice::WeightShard(int layer, int which) const {
  const ShardingsShapes& sh = s_->sh;
  const Buffer& w = s_->layers[layer].w[which];
  // Stored [E/f, F/t]; returned [F/t, E/f].
  std::vector<float> stored(static_cast<size_t>(w.count()));
  compute::Convert(s_->dt, w.data(), DType::kF32, stored.data(), stored.size());
  std::vector<float> out(stored.size());
  for (int64_t e = 0; e < sh.emb_f; ++e) {
    for (int64_t f = 0; f < sh.ff_t; ++f) {
      out[f * sh.emb_f + e] = stored[e * sh.ff_t + f];
    }
  }
  return out;
}

}  // namespace multislice::model
