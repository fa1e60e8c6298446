// Writing a `.pt2` with new values for its weights: the trained model as an
// archive that torch.export.load runs (`pipeforge export`, issue 10).
#pragma once

#include <map>
#include <string>

#include "frontend/pt2_archive.h"

namespace at {
class Tensor;
}

namespace pipeforge::frontend {

// Copies `archive` (as read from its file) to `out_path` record for record, except
// the payloads of the parameters and buffers named in `values`, which hold
// those values instead (same dtype and shape, checked; every name of a tied
// tensor must get the same value). The program, its signature and every other
// entry stay as they are, so the result loads wherever the original did.
// Names in `values` that the archive lacks are an error; weights not named
// keep their original values. The archive's tensors take the new values.
// Throws Pt2Error.
void writePt2WithWeights(Pt2Archive& archive, const std::string& out_path,
                         const std::map<std::string, at::Tensor>& values);

}  // namespace pipeforge::frontend
