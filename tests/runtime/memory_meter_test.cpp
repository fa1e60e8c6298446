// compat::MemoryMeter: the bytes the CPU allocator hands out and takes back
// on this thread while a meter is active, exactly as the tensors' sizes say
// (the activation memory of Note [Activation memory] is built on it).
#include "compat/memory_meter.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

namespace pipeforge::compat {
namespace {

TEST(MemoryMeter, CountsTheBlocksAllocatedAndFreedOnThisThread) {
  at::Tensor older = at::ones({1000});  // made before the meter: its free is not counted
  MemoryMeter meter;
  EXPECT_EQ(meter.live(), 0);
  at::Tensor a = at::empty({256}, at::kFloat);
  EXPECT_EQ(meter.live(), 1024);
  older.reset();
  EXPECT_EQ(meter.live(), 1024);
  at::Tensor b = at::empty({10, 10}, at::kDouble);
  EXPECT_EQ(meter.live(), 1024 + 800);
  a.reset();
  EXPECT_EQ(meter.live(), 800);
  EXPECT_EQ(meter.peak(), 1824);
  meter.resetPeak();
  EXPECT_EQ(meter.peak(), 800);
  at::Tensor view = b.view({100});  // a view allocates no storage
  EXPECT_EQ(meter.live(), 800);
  {
    MemoryMeter inner;  // counts on its own, then gives the thread back
    at::Tensor c = at::empty({4}, at::kFloat);
    EXPECT_EQ(inner.live(), 16);
  }
  EXPECT_EQ(meter.live(), 800);
  at::Tensor sum = b + b;  // an op's output
  EXPECT_EQ(meter.live(), 1600);
  EXPECT_EQ(meter.peak(), 1600);
  b.reset();
  view.reset();
  sum.reset();
  EXPECT_EQ(meter.live(), 0);
}

}  // namespace
}  // namespace pipeforge::compat
