// The seed's example workload: MaxText's `shardings.py` (spec section 3.3),
// on any ICI x DCN mesh.
//
// L layers, each with two weights EMB2FF and FF2EMB of logical shape
// (F, E), F = 4E, initialised 1e-4 * normal; input X (BATCH, E) uniform
// [0, 1); layer: M1 = sigmoid(x @ EMB2FF^T), M2 = sigmoid(M1 @ FF2EMB);
// loss = sum(output); one step = forward, gradient, SGD p - 1e-4 g.
//
// Sharding, as the original declares it: every weight P("tensor", "fsdp")
// (F over tensor, E over fsdp); activations P(("data", "fsdp"), "tensor")
// (batch over data x fsdp, E or F over tensor). The communication follows
// from those shardings through the runtime's collectives on mesh axes:
//   - weights are all-gathered over fsdp before use (the next layer's
//     gather is started while this layer computes);
//   - activations are all-gathered over tensor before a matmul that
//     contracts over E, and partial sums are reduce-scattered over tensor
//     after one that contracts over F;
//   - each weight gradient is reduce-scattered over fsdp and all-reduced over
//     data as soon as it exists, while the backward pass goes on.
// Axes that span slices use the two-level collectives automatically.
//
// Storage layouts are chosen so that every gather and scatter moves
// contiguous blocks and every matmul reads its operands in place (transposes
// are strides, never copies): a device stores its weight shard transposed,
// [E/fsdp, F/tensor], so the fsdp gather yields W^T restricted to its F rows
// as a dense [E, F/tensor] matrix; activations between layers are stored
// transposed, [E/tensor, b], so the tensor gather yields x^T as [E, b].
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "runtime/runtime.h"

namespace multislice::model {

struct ShardingsConfig {
  int64_t embedding_dimension = 1024;  // E
  int64_t batch_size = 2048;           // per device
  int num_layers = 4;
  DType dtype = DType::kBF16;  // weights, activations and gradients
  uint64_t seed = 0;
  float learning_rate = 1e-4f;
  // Diagnostic: skip every collective whose group spans slices, to measure
  // how much of the DCN traffic is hidden behind compute. Results are wrong.
  bool skip_dcn = false;
};

// The random streams of compute::FillBlock that define the tensors for a
// seed: X, and weight `which` (0: EMB2FF, 1: FF2EMB) of layer `layer`, each
// indexed by its logical row-major position. Any shard is generated alone.
inline constexpr uint64_t kShardingsInputStream = 1u << 20;
inline constexpr uint64_t ShardingsWeightStream(int layer, int which) {
  return 2 * static_cast<uint64_t>(layer) + which;
}

// Sizes of the model and of one device's shards.
struct ShardingsShapes {
  int64_t emb = 0, ff = 0;  // E, F
  int64_t batch = 0;        // BATCH = num_devices * batch_size
  int data = 1, fsdp = 1, tensor = 1;
  int64_t rows = 0;             // batch rows per device: BATCH / (data * fsdp)
  int64_t emb_t = 0;            // E / tensor
  int64_t emb_f = 0;            // E / fsdp
  int64_t ff_t = 0;             // F / tensor
  int64_t parameters = 0;       // 2 * F * E * L
  double parameter_bytes = 0;   // as shardings.py: 2 bytes per parameter
  double activation_bytes = 0;  // as shardings.py
  int64_t parameter_bytes_per_device = 0;  // this implementation's shards
  // TFLOP per device per step: 6 * parameters * BATCH / 1e12 / num_devices.
  double tflop_per_device = 0;
};

// Checks that the sizes divide as the sharding needs and that the stage axis
// has size 1 (no pipeline stages); kInvalidArgument names the flag, the value
// and the divisor otherwise.
Result<ShardingsShapes> ComputeShardingsShapes(
    const ShardingsConfig& config, const mesh::ParallelismConfig& resolved,
    int num_devices);

// What one device measured in one step.
struct StepStats {
  double seconds = 0;
  double loss = 0;  // the global loss (same on every device)
  // Sent inside the slice (ICI: on the host and between the slice's
  // hosts), the part of it between hosts, and across slices.
  uint64_t ici_bytes = 0, ici_between_hosts_bytes = 0, dcn_bytes = 0;
};

// The training state of one device: its weight shards and buffers. Created
// and used on the device's own thread.
class ShardingsDevice {
 public:
  ShardingsDevice(runtime::Runtime& rt, int local_index,
                  const ShardingsConfig& config, const ShardingsShapes& shapes);
  ~ShardingsDevice();

  // Generates this device's shards of the weights and of X.
  Status Init();
  // One training step (forward, gradients, SGD), timed from a barrier of
  // every device to the end of the update on this device.
  Status Step(StepStats* stats);

  // This device's shard of layer `layer`'s weight `which` (0: EMB2FF,
  // 1: FF2EMB) as f32, in the logical [F, E] orientation: a row-major
  // [F/tensor, E/fsdp] block starting at row_offset(), col_offset().
  std::vector<float> WeightShard(int layer, int which) const;
  int64_t row_offset() const;
  int64_t col_offset() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace multislice::model
