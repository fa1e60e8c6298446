// What a top-level node of a forward graph reads, and which nodes are free.
#pragma once

#include <string>
#include <vector>

namespace torch::jit {
struct Node;
struct Value;
}  // namespace torch::jit

namespace pipeforge::frontend {

// Constants and prim::GetAttr reads cost nothing and may repeat in every
// stage that needs them, so they are not DAG vertices and never cross stages.
bool isFreeNode(const torch::jit::Node* node);

// The values defined in `node`'s own block that `node` reads: its inputs and
// what its sub-blocks (if / loop bodies) read from outside themselves.
std::vector<torch::jit::Value*> externalInputs(torch::jit::Node* node);

// "file.py:LINE" of the model source that `node` came from, or "" when the
// graph carries no source (a traced model, a parsed IR string).
std::string sourceLocation(const torch::jit::Node* node);

}  // namespace pipeforge::frontend
