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

std::string sourceLocation(const torch::jit::Node* node) {
  auto range = node->sourceRange();
  auto src = range.source();
  if (!src || !src->filename()) return "";
  auto line = src->starting_line_no() + src->lineno_for_offset(range.start());
  return *src->filename() + ":" + std::to_string(line);
}

}  // namespace pipeforge::frontend
