// FakeWorld's two ways of pairing point-to-point ops: by tag (Gloo) and by
// order per pair of ranks (NCCL, Note [NCCL order]). Both "ranks" post from
// one thread: posting never blocks, so the order of posts is exact.
#include "runtime/fake_comm.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <stdexcept>
#include <string>

namespace pipeforge::runtime {
namespace {

using namespace std::chrono_literals;

// The message of the std::logic_error `op.wait()` throws; "" when it does not.
std::string orderErrorOf(PendingOp& op) {
  try {
    op.wait();
    return "";
  } catch (const std::logic_error& e) {
    return e.what();
  }
}

TEST(FakeCommTest, BothRanksSendingFirstDeadlocksUnderNcclOrderButNotByTag) {
  const at::Tensor a = torch::tensor({1.0f, 2.0f}), b = torch::tensor({3.0f, 4.0f});
  for (Matching matching : {Matching::kByTag, Matching::kNcclOrder}) {
    FakeWorld world(2, 20s, matching);
    auto r0 = world.communicator(0), r1 = world.communicator(1);
    at::Tensor got_a = torch::zeros({2}), got_b = torch::zeros({2});
    auto send0 = r0->isend(a, 1, /*tag=*/1);
    auto send1 = r1->isend(b, 0, /*tag=*/2);
    auto recv0 = r0->irecv(got_b, 1, 2);
    auto recv1 = r1->irecv(got_a, 0, 1);
    if (matching == Matching::kByTag) {
      recv0->wait();
      recv1->wait();
      EXPECT_TRUE(torch::equal(got_a, a));
      EXPECT_TRUE(torch::equal(got_b, b));
      continue;
    }
    EXPECT_FALSE(send0->done());
    const std::string want =
        "NCCL order: deadlock between rank 0 and rank 1 at op #0 of their pair: rank 0 posted send tag 1 [2] Float "
        "to rank 1, rank 1 posted send tag 2 [2] Float to rank 0; NCCL pairs ops by their order, so these two sends "
        "wait for each other forever";
    // Every op of the pair fails at once, the ones stuck behind the heads too.
    EXPECT_EQ(orderErrorOf(*recv0), want);
    EXPECT_EQ(orderErrorOf(*recv1), want);
    EXPECT_EQ(orderErrorOf(*send0), want);
    r0->abort("test over");  // ops never finished may be destroyed only then
  }
}

TEST(FakeCommTest, OpsPairByOrderWhateverTheirTags) {
  FakeWorld world(2, 20s, Matching::kNcclOrder);
  auto r0 = world.communicator(0), r1 = world.communicator(1);
  at::Tensor first = torch::zeros({2}), second = torch::zeros({2});
  auto s1 = r0->isend(torch::ones({2}), 1, 5);
  auto s2 = r0->isend(torch::ones({2}), 1, 6);
  auto g1 = r1->irecv(first, 0, 6);  // waits for tag 6 first: on NCCL it would get tag 5's data
  auto g2 = r1->irecv(second, 0, 5);
  EXPECT_EQ(orderErrorOf(*g1),
            "NCCL order: mismatch between rank 0 and rank 1 at op #0 of their pair: rank 0 posted send tag 5 [2] "
            "Float to rank 1, rank 1 posted recv tag 6 [2] Float from rank 0; NCCL pairs ops by their order, so the "
            "receive would get the wrong data (tags differ)");
  EXPECT_TRUE(torch::equal(first, torch::zeros({2})));  // nothing was delivered
  r0->abort("test over");
}

TEST(FakeCommTest, AShapeOrDtypeThatDiffersIsAMismatch) {
  FakeWorld world(2, 20s, Matching::kNcclOrder);
  auto r0 = world.communicator(0), r1 = world.communicator(1);
  at::Tensor wrong = torch::zeros({3}, torch::kDouble);
  auto s = r0->isend(torch::ones({2}), 1, 7);
  auto g = r1->irecv(wrong, 0, 7);
  EXPECT_EQ(orderErrorOf(*s),
            "NCCL order: mismatch between rank 0 and rank 1 at op #0 of their pair: rank 0 posted send tag 7 [2] "
            "Float to rank 1, rank 1 posted recv tag 7 [3] Double from rank 0; NCCL pairs ops by their order, so the "
            "receive would get the wrong data (shapes, dtypes differ)");
  r0->abort("test over");
}

TEST(FakeCommTest, ASendFinishesOnlyOnceItsReceiveIsReachedInOrder) {
  FakeWorld world(3, 20s, Matching::kNcclOrder);
  auto r0 = world.communicator(0), r1 = world.communicator(1), r2 = world.communicator(2);
  const at::Tensor x = torch::tensor({1.0f, 2.0f}), y = torch::tensor({5.0f});
  at::Tensor got_x = torch::zeros({2}), got_y = torch::zeros({1}), got_z = torch::zeros({1});
  auto to2 = r0->isend(y, 2, 9);  // another pair: orders nothing on {0, 1}
  auto recv_first = r0->irecv(got_z, 1, 4);
  auto send_x = r0->isend(x, 1, 3);  // behind the receive in the pair {0, 1}
  EXPECT_FALSE(send_x->done());
  auto x_at_1 = r1->irecv(got_x, 0, 3);  // rank 1's op #0 is a receive; rank 0's is one too
  EXPECT_FALSE(send_x->done());
  EXPECT_EQ(orderErrorOf(*x_at_1),
            "NCCL order: deadlock between rank 0 and rank 1 at op #0 of their pair: rank 0 posted recv tag 4 [1] "
            "Float from rank 1, rank 1 posted recv tag 3 [2] Float from rank 0; NCCL pairs ops by their order, so "
            "these two receives wait for each other forever");
  // The pair {0, 2} is not affected.
  auto y_at_2 = r2->irecv(got_y, 0, 9);
  EXPECT_TRUE(to2->done());
  y_at_2->wait();
  EXPECT_TRUE(torch::equal(got_y, y));
  r0->abort("test over");
}

TEST(FakeCommTest, OpsPostedInTheSameOrderOnBothSidesDeliverEveryMessage) {
  FakeWorld world(2, 20s, Matching::kNcclOrder);
  auto r0 = world.communicator(0), r1 = world.communicator(1);
  const at::Tensor a = torch::tensor({1.0f}), b = torch::tensor({2.0f, 3.0f});
  at::Tensor got_a = torch::zeros({1}), got_b = torch::zeros({2});
  auto send_a = r0->isend(a, 1, 1);
  EXPECT_FALSE(send_a->done());  // no receive posted yet
  auto recv_b = r0->irecv(got_b, 1, 2);
  auto recv_a = r1->irecv(got_a, 0, 1);
  EXPECT_TRUE(send_a->done());
  EXPECT_FALSE(recv_a->done());  // a receive reports done only after wait()
  auto send_b = r1->isend(b, 0, 2);
  recv_a->wait();
  recv_b->wait();
  send_b->wait();
  EXPECT_TRUE(torch::equal(got_a, a));
  EXPECT_TRUE(torch::equal(got_b, b));
}

TEST(FakeCommTest, ATimeoutNamesTheOpsAtTheHeadsOfThePair) {
  FakeWorld world(2, 50ms, Matching::kNcclOrder);
  auto r0 = world.communicator(0), r1 = world.communicator(1);
  at::Tensor buf = torch::zeros({2});
  auto sent = r1->isend(torch::ones({2}), 0, 8);  // rank 0 never posts its receive
  auto behind = r1->irecv(buf, 0, 12);
  try {
    behind->wait();
    FAIL() << "expected a timeout";
  } catch (const CommError& e) {
    EXPECT_EQ(e.kind(), CommError::Kind::kTimeout);
    EXPECT_EQ(std::string(e.what()),
              "rank 1 waiting for op #1 with rank 0 (recv tag 12 [2] Float from rank 0): timed out after 50 ms; NCCL "
              "order: rank 1's next op with rank 0 is op #0, send tag 8 [2] Float to rank 0, rank 0 has no unpaired "
              "op with rank 1");
  }
  r0->abort("test over");
}

}  // namespace
}  // namespace pipeforge::runtime
