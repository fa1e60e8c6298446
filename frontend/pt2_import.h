// Turning a torch.export program (`.pt2`) into the TorchScript module the
// frontend splits: submodules under their original FQNs holding the original
// parameters and buffers, and one method per module call whose graph is the
// exported ATen nodes of that call (see Note [PT2 as nested TorchScript] in
// pt2_import.cpp).
#pragma once

#include <string>

namespace torch::jit {
struct Module;
}

namespace pipeforge::frontend {

class Pt2Archive;

// The int attribute the importer puts on every TorchScript node it emits for
// a top-level exported node: that node's position in the graph (Note [PT2 node tags]).
inline constexpr const char* kPt2NodeAttribute = "pf_pt2_node";

// The string attribute on the prim::If that holds a grad-mode or autocast
// region (Note [PT2 regions]): what the region is and where forward opens it,
// e.g. "a torch.no_grad() region of model.rotary_emb (modeling_llama.py:98)".
inline constexpr const char* kPt2RegionAttribute = "pf_pt2_region";

// The class name of a rebuilt module whose class the archive does not
// record. torch.export writes a module's class only in the nn_module_stack of
// the nodes its forward ran, so a module forward never calls (a ModuleList,
// GPT-2's attn_dropout under sdpa, every Dropout of a program exported in eval
// mode) has a name in module_call_graph and no class anywhere in the file.
inline constexpr const char* kPt2ClassNotRecorded = "ClassNotRecorded";

// Rebuilds `archive`'s program as a module. Throws Pt2Error (a ModelError)
// naming the node and the fix for what cannot be rebuilt: operators this
// LibTorch lacks, non-tensor outputs, unsupported higher-order ops.
torch::jit::Module importPt2(const Pt2Archive& archive);

// Pt2Archive::open + importPt2.
torch::jit::Module loadPt2Model(const std::string& path);

}  // namespace pipeforge::frontend
