#include "frontend/pt2_graph_values.h"

#include <fmt/format.h>

#include "frontend/errors.h"
#include "frontend/module_paths.h"
#include "frontend/pt2_archive.h"

namespace pipeforge::frontend {

namespace {

class SignatureReader {
 public:
  SignatureReader(const std::string& source, const std::function<void(const std::string&)>& require_tensor)
      : source_(source), require_tensor_(require_tensor) {}

  void readInput(const Pt2InputSpec& in) {
    switch (in.kind) {
      case Pt2InputKind::kUserInput:
        if (in.value.empty()) fail("a user input is not a tensor or symbolic value; export with tensor inputs");
        values_.user_inputs.push_back(in.value);
        break;
      case Pt2InputKind::kParameter:
      case Pt2InputKind::kBuffer:
      case Pt2InputKind::kTensorConstant:
        require_tensor_(in.target);
        values_.placeholder_fqn[in.value] = in.target;
        values_.fqn_placeholder[in.target] = in.value;
        break;
      case Pt2InputKind::kConstantInput:
        break;  // baked into the graph by export; not a runtime input
      case Pt2InputKind::kCustomObject:
        fail("input '" + in.value + "' is a TorchBind script object (" + in.target +
             "); pipeforge splits models whose state is tensors only");
      case Pt2InputKind::kToken:
        fail("the program threads effect tokens (ops with side effects); export without effectful custom ops");
    }
  }

  void readOutput(const Pt2OutputSpec& out) {
    switch (out.kind) {
      case Pt2OutputKind::kUserOutput:
        if (out.value.empty()) {
          fail(fmt::format("forward's output {} is {}, not a tensor; pipeforge splits models whose outputs are "
                           "tensors: return only tensors from forward (compute sizes outside the model)",
                           values_.user_outputs.size(), out.literal));
        }
        values_.user_outputs.push_back(out.value);
        break;
      case Pt2OutputKind::kBufferMutation:
      case Pt2OutputKind::kParameterMutation:
        values_.mutations[out.value] = out.target;
        break;
      case Pt2OutputKind::kLossOutput:
      case Pt2OutputKind::kGradientToParameter:
      case Pt2OutputKind::kGradientToUserInput:
        fail("the file holds a joint forward-backward graph (loss/gradient outputs); export the forward only "
             "with torch.export.export(model, args)");
      case Pt2OutputKind::kUserInputMutation:
        fail("forward mutates its input '" + out.target + "' in place; pipeforge stages cannot write back to "
             "inputs, so return the new value instead");
      case Pt2OutputKind::kToken:
        fail("the program threads effect tokens (ops with side effects); export without effectful custom ops");
    }
  }

  Pt2GraphValues take() { return std::move(values_); }

 private:
  [[noreturn]] void fail(const std::string& message) const { throw Pt2Error("'" + source_ + "': " + message); }

  const std::string& source_;
  const std::function<void(const std::string&)>& require_tensor_;
  Pt2GraphValues values_;
};

}  // namespace

Pt2GraphValues readPt2GraphValues(const Pt2Signature& signature, const std::string& source,
                                  const std::function<void(const std::string& fqn)>& require_tensor) {
  SignatureReader reader(source, require_tensor);
  for (const auto& in : signature.inputs) reader.readInput(in);
  for (const auto& out : signature.outputs) reader.readOutput(out);
  return reader.take();
}

std::optional<std::string> reachableAlias(const Pt2GraphValues& values, const std::string& fqn,
                                          const std::string& path) {
  if (isWithin(fqn, path)) return fqn;
  auto it = values.aliases.find(fqn);
  if (it == values.aliases.end()) return std::nullopt;
  for (const auto& alias : it->second) {
    if (isWithin(alias, path)) return alias;
  }
  return std::nullopt;
}

}  // namespace pipeforge::frontend
