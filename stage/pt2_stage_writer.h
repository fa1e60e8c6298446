// Writing one stage of a split `.pt2` model as a torch.export archive that
// `torch.export.load(path).module()` runs (Note [PT2 stage files] in
// pt2_stage_plan.cpp).
#pragma once

#include <string>

namespace pipeforge::frontend {
class Pt2Archive;
}

namespace pipeforge::stage {

struct Pt2StagePlan;

// Writes `stage`, cut out of `archive`'s program, to `path` (".../stage_<i>.pt2"):
// the archive layout torch.export.save writes, holding only the stage's
// weights and constants, copied byte for byte. Returns the file's XXH3-128
// digest (Note [File digests]), computed as it was written (Note [Stage files at
// the disk's speed] in common/torch_zip.h). Throws StageBuildError, or
// Error(kIo) when the file cannot be written.
std::string writePt2Stage(const frontend::Pt2Archive& archive, const Pt2StagePlan& stage, const std::string& path);

}  // namespace pipeforge::stage
