#include "schedules/program.h"

namespace pipeforge::schedules {

std::vector<int> makeStageToRank(int num_ranks, int num_stages, StageLayout layout) {
  std::vector<int> mapping(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    switch (layout) {
      case StageLayout::kLoop:
        mapping[s] = s % num_ranks;
        break;
      case StageLayout::kV: {
        int pos = s % (2 * num_ranks);
        mapping[s] = pos < num_ranks ? pos : 2 * num_ranks - 1 - pos;
        break;
      }
    }
  }
  return mapping;
}

}  // namespace pipeforge::schedules
