#include "runtime/stream.h"

#include <gtest/gtest.h>

#include <future>

#include "common/float_env.h"

namespace multislice::runtime {
namespace {

// A stream's tasks run with subnormals flushed, as device threads do, so a
// reduction on a stream costs the same whatever its operands.
TEST(StreamTest, TasksRunWithSubnormalsFlushedToZero) {
  Stream stream("test-stream");
  std::promise<float> product;
  std::promise<bool> flag;
  stream.Enqueue([&] {
    volatile float tiny = 1e-39f;  // subnormal: below 2^-126
    volatile float one = 1.0f;
    flag.set_value(ThisThreadFlushesSubnormals());
    product.set_value(tiny * one);
  });
  EXPECT_TRUE(flag.get_future().get());
  EXPECT_EQ(product.get_future().get(), 0.0f);
  // The calling thread keeps its own mode: a subnormal survives here.
  volatile float tiny = 1e-39f;
  volatile float one = 1.0f;
  EXPECT_GT(tiny * one, 0.0f);
}

}  // namespace
}  // namespace multislice::runtime
