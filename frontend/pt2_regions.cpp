#include "frontend/pt2_regions.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <set>

#include "frontend/errors.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_operators.h"

namespace pipeforge::frontend {

using json = nlohmann::ordered_json;

// Note [Symbolic sizes are recomputed, not returned]
// A size that one module call computes and code after the call reads (a
// decomposed Llama computes batch * seq once, in layers.0's q_proj, and
// every later layer reuses it) would make that call's method return an
// int next to its tensors. Stages receive only tensors, and a method call
// cannot be recomputed in a later stage, so such a split would be refused
// at every cut. Sizes are pure functions of tensors' shapes, so none is
// returned from a call: code outside the call that reads one computes it
// again from what it has (the root's sym_size of the inputs, passed down as
// arguments), and a call receives what it needs for that instead of the size.
bool isPt2FloatingSize(const json& graph, const std::unordered_map<std::string, int>& def_pos,
                       const std::string& value) {
  auto d = def_pos.find(value);
  if (d == def_pos.end()) return false;
  const json& node = graph.at("nodes").at(d->second);
  const std::string target = node.at("target").get<std::string>();
  static const std::set<std::string> kSizeOps = {
      "torch.ops.aten.sym_size.int", "torch.ops.aten.sym_numel.default", "torch.ops.aten.sym_stride.int",
      "torch.ops.aten.sym_storage_offset.default"};
  if (!kSizeOps.count(target) && !pt2SymbolicOps().count(target)) return false;
  auto defs = pt2NodeDefs(node);
  if (defs.empty()) return false;
  for (const auto& def : defs) {
    bool symbolic = false;
    for (const char* table : {"sym_int_values", "sym_bool_values", "sym_float_values"}) {
      if (graph.contains(table) && graph.at(table).contains(def)) symbolic = true;
    }
    if (!symbolic) return false;
  }
  return true;
}

namespace {

// The calls a node runs in that can be reached by attribute chains from
// their caller, outermost first; a frame for a module that is not a
// descendant of its caller (a shared module called from elsewhere) is folded
// into the caller.
std::vector<const Pt2ModuleFrame*> reachableFrames(const std::vector<Pt2ModuleFrame>& stack) {
  std::vector<const Pt2ModuleFrame*> frames;
  for (const auto& f : stack) {
    const std::string& caller = frames.empty() ? std::string() : frames.back()->path;
    if (f.path.empty() || f.path == caller || !isWithin(f.path, caller)) continue;
    frames.push_back(&f);
  }
  return frames;
}

std::string callKey(const Pt2ModuleFrame& frame) { return frame.key + "|" + frame.path; }

class RegionGrouper {
 public:
  RegionGrouper(const json& graph, const std::vector<Pt2Node>& nodes, const Pt2GraphValues& values)
      : graph_(graph), nodes_(nodes), values_(values) {}

  Pt2Regions run() {
    groupByCall();
    findDefinitions();
    std::vector<std::vector<std::string>> uses = findUses();
    placeWriteBacks(uses);
    // User outputs are read at the end.
    for (const auto& out : values_.user_outputs) last_use_[out] = INT_MAX;
    for (size_t r = 1; r < result_.regions.size(); ++r) findBoundary(result_.regions[r], uses);
    return std::move(result_);
  }

 private:
  // Opens and closes calls along the graph as the nodes' stacks change.
  void groupByCall() {
    auto& regions = result_.regions;
    regions.push_back(Pt2Region{});
    std::vector<int> open{0};
    for (int pos = 0; pos < static_cast<int>(nodes_.size()); ++pos) {
      if (!nodes_[pos].module_stack.empty()) {
        std::vector<const Pt2ModuleFrame*> frames = reachableFrames(nodes_[pos].module_stack);
        size_t keep = 0;
        while (keep < frames.size() && keep + 1 < open.size() &&
               regions[open[keep + 1]].key == callKey(*frames[keep])) {
          ++keep;
        }
        open.resize(keep + 1);
        for (size_t i = keep; i < frames.size(); ++i) {
          Pt2Region r;
          r.path = frames[i]->path;
          r.key = callKey(*frames[i]);
          r.type = frames[i]->type;
          r.parent = open.back();
          regions.push_back(r);
          int index = static_cast<int>(regions.size()) - 1;
          regions[open.back()].items.push_back({true, index});
          open.push_back(index);
        }
      }
      regions[open.back()].items.push_back({false, pos});
      result_.region_of_pos.push_back(open.back());
      for (int r : open) {
        regions[r].first = std::min(regions[r].first, pos);
        regions[r].last = std::max(regions[r].last, pos);
      }
    }
  }

  void findDefinitions() {
    for (int pos = 0; pos < static_cast<int>(nodes_.size()); ++pos) {
      for (const auto& d : pt2NodeDefs(graph_.at("nodes").at(pos))) result_.def_pos[d] = pos;
    }
  }

  // What each node reads, and where each value is last read. Mutation
  // outputs are not read: they are written back where they are made.
  std::vector<std::vector<std::string>> findUses() {
    std::vector<std::vector<std::string>> uses(nodes_.size());
    for (int pos = 0; pos < static_cast<int>(nodes_.size()); ++pos) {
      uses[pos] = expandedUses(pos);
      for (const auto& u : uses[pos]) last_use_[u] = std::max(last_use_[u], pos);
    }
    return uses;
  }

  // A functional buffer update is written back (aten::copy_) after the node
  // that computes it and after the last read of the old value, whichever is
  // later; the node there reads both.
  void placeWriteBacks(std::vector<std::vector<std::string>>& uses) {
    for (const auto& [value, target] : values_.mutations) {
      std::string buffer = placeholderFor(target);
      auto made = result_.def_pos.find(value);
      if (made == result_.def_pos.end()) throw Pt2Error("mutation output '" + value + "' is not computed by any node");
      auto read = last_use_.find(buffer);
      int at = std::max(made->second, read == last_use_.end() ? -1 : read->second);
      result_.writes[at].push_back({value, buffer});
      for (const auto& u : {value, buffer}) {
        uses[at].push_back(u);
        last_use_[u] = std::max(last_use_[u], at);
      }
    }
  }

  // A call's inputs: what it reads that is made before it (parameters it
  // reaches by attribute chains excepted); its outputs: what it makes that
  // is read after it.
  void findBoundary(Pt2Region& region, const std::vector<std::vector<std::string>>& uses) const {
    std::set<std::string> seen;
    for (int pos = region.first; pos <= region.last; ++pos) {
      for (const auto& u : uses[pos]) {
        if (seen.count(u)) continue;
        auto d = result_.def_pos.find(u);
        bool outside = d == result_.def_pos.end() || d->second < region.first;
        if (!outside) continue;
        auto fqn = values_.placeholder_fqn.find(u);
        if (fqn != values_.placeholder_fqn.end() && reachableAlias(values_, fqn->second, region.path)) continue;
        seen.insert(u);
        region.inputs.push_back(u);
      }
    }
    for (int pos = region.first; pos <= region.last; ++pos) {
      for (const auto& d : pt2NodeDefs(graph_.at("nodes").at(pos))) {
        if (isFloating(d)) continue;  // Note [Symbolic sizes are recomputed, not returned]
        auto lu = last_use_.find(d);
        if (lu != last_use_.end() && lu->second > region.last) region.outputs.push_back(d);
      }
    }
  }

  bool isFloating(const std::string& value) const { return isPt2FloatingSize(graph_, result_.def_pos, value); }

  // Whether code at node position `pos` runs inside region `r`'s call.
  bool regionContains(int r, int pos) const {
    return r == 0 || (result_.regions[r].first <= pos && pos <= result_.regions[r].last);
  }

  // What node `pos` reads, with each floating size made outside the
  // innermost call that holds `pos` replaced by what computing it reads.
  std::vector<std::string> expandedUses(int pos) const {
    std::vector<std::string> out;
    std::set<std::string> seen;
    std::function<void(const std::string&)> add = [&](const std::string& u) {
      if (!seen.insert(u).second) return;
      if (isFloating(u)) {
        int d = result_.def_pos.at(u);
        if (!regionContains(result_.region_of_pos.at(d), pos)) {
          for (const auto& w : pt2NodeUses(graph_.at("nodes").at(d))) add(w);
          return;
        }
      }
      out.push_back(u);
    };
    for (const auto& u : pt2NodeUses(graph_.at("nodes").at(pos))) add(u);
    return out;
  }

  std::string placeholderFor(const std::string& fqn) const {
    auto it = values_.fqn_placeholder.find(fqn);
    if (it == values_.fqn_placeholder.end()) {
      throw Pt2Error("a mutation output names '" + fqn + "', which is not a graph input");
    }
    return it->second;
  }

  const json& graph_;
  const std::vector<Pt2Node>& nodes_;
  const Pt2GraphValues& values_;
  Pt2Regions result_;
  std::unordered_map<std::string, int> last_use_;  // value -> position of its last read
};

}  // namespace

Pt2Regions groupPt2Regions(const json& graph, const std::vector<Pt2Node>& nodes, const Pt2GraphValues& values) {
  return RegionGrouper(graph, nodes, values).run();
}

}  // namespace pipeforge::frontend
