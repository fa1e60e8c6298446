#include "stage/write_timeline.h"

#include <utility>

namespace pipeforge::stage {

void WriteTimeline::add(ObjectId object, Writer writer) { writers_[object].push_back(std::move(writer)); }

WriteTimeline::WritesBetween WriteTimeline::between(const std::vector<ObjectId>& objects, int position,
                                                    int before) const {
  WritesBetween found;
  for (ObjectId o : objects) {
    auto it = writers_.find(o);
    if (it == writers_.end()) continue;
    for (const Writer& w : it->second) {
      if (w.position <= position || w.stage >= before) continue;
      found.stages.insert(w.stage);
      if (!found.last || w.position > found.last->position) found.last = &w;
    }
  }
  return found;
}

bool WriteTimeline::isWritten(ObjectId object) const {
  auto it = writers_.find(object);
  return it != writers_.end() && !it->second.empty();
}

}  // namespace pipeforge::stage
