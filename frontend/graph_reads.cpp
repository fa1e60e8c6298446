#include "frontend/graph_reads.h"

#include <torch/csrc/jit/ir/ir.h>

namespace pipeforge::frontend {
namespace {

void collect(torch::jit::Node* n, const torch::jit::Block* home, std::vector<torch::jit::Value*>& out) {
  for (torch::jit::Value* v : n->inputs()) {
    if (v->node()->owningBlock() == home) out.push_back(v);
  }
  for (torch::jit::Block* b : n->blocks()) {
    for (torch::jit::Node* inner : b->nodes()) collect(inner, home, out);
    for (torch::jit::Value* v : b->outputs()) {
      if (v->node()->owningBlock() == home) out.push_back(v);
    }
  }
}

}  // namespace

bool isFreeNode(const torch::jit::Node* node) {
  return node->kind() == c10::prim::Constant || node->kind() == c10::prim::GetAttr;
}

std::vector<torch::jit::Value*> externalInputs(torch::jit::Node* node) {
  std::vector<torch::jit::Value*> out;
  collect(node, node->owningBlock(), out);
  return out;
}

}  // namespace pipeforge::frontend
