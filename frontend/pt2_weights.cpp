#include "frontend/pt2_weights.h"

#include <ATen/ATen.h>

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/safetensors.h"
#include "frontend/errors.h"

namespace pipeforge::frontend {
namespace {

// Note [Weights by FQN]
// ~~~~~~~~~~~~~~~~~~~~~
// A transformers model's exported names are its state_dict names, which are
// the names save_pretrained writes (for the families without weight renames,
// scale-facts 1.5). So with --weights every parameter and persistent buffer
// (the archive's weights config) takes the tensor of the same name from the
// first source that has it; a non-persistent buffer or lifted constant (the
// constants config) takes one when a source has it, else keeps the
// archive's. A tensor of the same dtype is a view of the source's mapping (no
// copy: the split reads only the pages it uses, Note [Mapped weights]); a
// float tensor of another float dtype (a bf16 checkpoint, an fp32 export) is
// converted to the dtype the export declares, when it is read: the archive
// holds the source's view and marks the entry (Pt2TensorEntry::convert_to),
// so a split converts one tensor at a time as it writes it, and its peak RSS
// does not grow with the checkpoint (Pt2Archive::tensor converts, stored()
// does not).
//
// Ties: in a meta-device export every tensor points at one empty record, so
// the archive cannot say which weights are one (scale-facts 2). They come
// from the sources' metadata (kTiedWeightsKey, which pipeforge.export_on_meta
// writes): a tied name takes the very tensor of the name it is tied to, so
// the split sees one tensor under two names (pipe.json's `tied`), and a
// checkpoint that left the tied name out (save_pretrained drops lm_head.weight
// with tie_word_embeddings) is complete.
//
// Everything is checked before anything is written, and every problem of a
// kind is reported at once: missing names (the first 10 and the count), a
// shape or dtype that does not fit (both sides), names no tensor takes.

std::optional<at::ScalarType> scalarTypeOf(const std::string& dtype) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},       {"BOOL", at::kBool}};
  auto it = kTypes.find(dtype);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

// "float32[64, 16]", as pipe.json writes values.
std::string describe(const at::Tensor& t) {
  static const std::map<at::ScalarType, const char*> kNames = {
      {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"},
      {at::kLong, "int64"},    {at::kInt, "int32"},      {at::kShort, "int16"},  {at::kChar, "int8"},
      {at::kByte, "uint8"},    {at::kBool, "bool"}};
  auto it = kNames.find(t.scalar_type());
  return fmt::format("{}[{}]", it != kNames.end() ? it->second : c10::toString(t.scalar_type()),
                     fmt::join(t.sizes(), ", "));
}

std::string firstOf(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 10;
  std::vector<std::string> shown(names.begin(), names.begin() + static_cast<long>(std::min(kShown, names.size())));
  std::string out = fmt::format("'{}'", fmt::join(shown, "', '"));
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

// Note [Checkpoint renames]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// transformers renames some families' weights as it loads them, and
// save_pretrained writes them back under the original names
// (conversion_mapping.py; scale-facts 1.5). A model name a checkpoint lacks
// is assembled from the original layout when the checkpoint has that:
//   Mixtral: P.mlp.X <- P.block_sparse_moe.X (the router: mlp.gate.weight);
//     P.mlp.experts.gate_up_proj [E, 2I, H] <- for e < E, experts.e.w1.weight
//     [I, H] stacked, then experts.e.w3.weight stacked, joined on dim 1;
//     P.mlp.experts.down_proj [E, H, I] <- experts.e.w2.weight stacked.
// The export writes the model's own names, which from_pretrained loads too.
// The model tensor `fqn` of `declared`'s shape, assembled from its pieces
// (Note [Checkpoint renames]) by `get`; undefined when some piece is
// missing, and `misfit` says which piece does not fit.
at::Tensor fromOriginalLayout(const std::string& fqn, const at::Tensor& declared,
                              const std::function<const SafetensorsTensor*(const std::string&)>& find,
                              const std::function<at::Tensor(const std::string&)>& get, std::string& misfit) {
  const std::vector<OriginalPiece> pieces = originalLayout(fqn, declared.sizes().vec());
  if (pieces.empty()) return at::Tensor();
  for (const auto& piece : pieces) {
    if (find(piece.name) == nullptr) return at::Tensor();
  }
  // A stand-in of the declared shape (no bytes) gives each piece's shape.
  const at::Tensor shape_of = at::empty_strided(declared.sizes(), std::vector<std::int64_t>(declared.dim(), 0),
                                                at::TensorOptions().dtype(at::kByte));
  at::Tensor out;
  for (const auto& piece : pieces) {
    const at::Tensor value = get(piece.name);
    const at::Tensor slot = pieceOf(shape_of, piece);
    if (!value.defined() || value.sizes() != slot.sizes()) {
      const SafetensorsTensor* t = find(piece.name);
      misfit = fmt::format("'{}' is {} in the model, so its piece '{}' should be [{}], but it is {}[{}]", fqn,
                           describe(declared), piece.name, fmt::join(slot.sizes(), ", "), t->dtype,
                           fmt::join(t->shape, ", "));
      return at::Tensor();
    }
    if (!out.defined()) out = at::empty(declared.sizes(), at::TensorOptions().dtype(value.scalar_type()));
    pieceOf(out, piece).copy_(value);
  }
  return out;
}

}  // namespace

std::vector<OriginalPiece> originalLayout(const std::string& fqn, const std::vector<std::int64_t>& shape) {
  const std::string mlp = ".mlp.";
  const std::size_t at_mlp = fqn.rfind(mlp);
  if (at_mlp == std::string::npos) return {};
  const std::string prefix = fqn.substr(0, at_mlp) + ".block_sparse_moe.";
  const std::string rest = fqn.substr(at_mlp + mlp.size());
  std::vector<OriginalPiece> out;
  if (rest == "experts.gate_up_proj") {
    if (shape.size() != 3 || shape[1] % 2 != 0) return {};
    const std::int64_t half = shape[1] / 2;
    for (std::int64_t e = 0; e < shape[0]; ++e) out.push_back({fmt::format("{}experts.{}.w1.weight", prefix, e), e, 0, half});
    for (std::int64_t e = 0; e < shape[0]; ++e) {
      out.push_back({fmt::format("{}experts.{}.w3.weight", prefix, e), e, half, half});
    }
  } else if (rest == "experts.down_proj") {
    if (shape.size() != 3) return {};
    for (std::int64_t e = 0; e < shape[0]; ++e) out.push_back({fmt::format("{}experts.{}.w2.weight", prefix, e), e});
  } else {
    out.push_back({prefix + rest});
  }
  return out;
}

at::Tensor pieceOf(const at::Tensor& t, const OriginalPiece& piece) {
  at::Tensor part = piece.index >= 0 ? t[piece.index] : t;
  return piece.length >= 0 ? part.narrow(0, piece.offset, piece.length) : part;
}

void fillFromWeights(const std::string& archive_path, const Pt2OpenOptions& options,
                     std::vector<Pt2TensorEntry>& entries, std::map<std::string, at::Tensor>& tensors) {
  if (options.weights.empty() && !options.need_values) return;
  if (options.weights.empty()) {
    std::vector<std::string> meta;
    for (const auto& e : entries) {
      if (e.on_meta) meta.push_back(e.fqn);
    }
    if (!meta.empty()) {
      throw Pt2Error(fmt::format("'{}' was exported on the meta device: its {} parameters and buffers have no values "
                                 "(e.g. '{}'). Split it with --weights SRC (a .safetensors file or a save_pretrained "
                                 "folder; README \"Fine-tune a pretrained transformers model\"), or set model.weights "
                                 "in the training config",
                                 archive_path, meta.size(), meta.front()));
    }
    return;
  }

  std::vector<std::shared_ptr<SafetensorsSource>> sources;
  for (const std::string& path : options.weights) {
    try {
      sources.push_back(std::make_shared<SafetensorsSource>(SafetensorsSource::open(path)));
    } catch (const SafetensorsError& e) {
      throw Pt2Error(fmt::format("--weights '{}': {}", path, e.what()));
    }
  }
  const std::string named = fmt::format("'{}'", fmt::join(options.weights, "', '"));

  // Ties recorded by the sources (the first source's word wins).
  std::map<std::string, std::string> tied;
  for (const auto& source : sources) {
    for (const auto& [key, value] : source->metadata()) {
      if (key != kTiedWeightsKey) continue;
      try {
        const nlohmann::json ties = nlohmann::json::parse(value);
        for (const auto& [target, from] : ties.items()) {
          tied.emplace(target, from.get<std::string>());
        }
      } catch (const nlohmann::json::exception& e) {
        throw Pt2Error(fmt::format("--weights '{}': its metadata '{}' is not a JSON object of names ({})",
                                   source->path(), kTiedWeightsKey, e.what()));
      }
    }
  }

  std::set<std::pair<std::size_t, std::string>> used;  // (source, name)
  std::vector<std::string> missing, misfits;
  // The source tensor `name` of source k as a tensor over its mapping (the
  // source stays mapped while any such tensor lives); nullopt when k lacks it.
  auto view = [&](std::size_t k, const std::string& name) -> std::optional<at::Tensor> {
    const SafetensorsTensor* t = sources[k]->find(name);
    if (t == nullptr) return std::nullopt;
    const std::optional<at::ScalarType> type = scalarTypeOf(t->dtype);
    if (!type) return at::Tensor();  // undefined: a dtype no model tensor has
    auto keep = new std::shared_ptr<SafetensorsSource>(sources[k]);
    return at::from_blob(
        const_cast<std::uint8_t*>(t->data), t->shape, [keep](void*) { delete keep; },
        at::TensorOptions().dtype(*type));
  };
  auto fits = [&](const at::Tensor& value, const at::Tensor& declared) {
    return value.defined() && value.sizes() == declared.sizes() &&
           (value.scalar_type() == declared.scalar_type() ||
            (at::isFloatingType(value.scalar_type()) && at::isFloatingType(declared.scalar_type())));
  };
  // (value, source index) of `entry`: its own name, else assembled from
  // transformers' original layout (Note [Checkpoint renames]).
  auto take = [&](const Pt2TensorEntry& entry, const at::Tensor& declared)
      -> std::optional<std::pair<at::Tensor, std::size_t>> {
    for (std::size_t k = 0; k < sources.size(); ++k) {
      std::optional<at::Tensor> v = view(k, entry.fqn);
      if (!v) continue;
      used.insert({k, entry.fqn});
      if (!fits(*v, declared)) {
        const SafetensorsTensor* t = sources[k]->find(entry.fqn);
        misfits.push_back(fmt::format("'{}' is {} in the model but {}[{}] in '{}'", entry.fqn, describe(declared),
                                      t->dtype, fmt::join(t->shape, ", "), sources[k]->fileOf(entry.fqn)));
        return std::nullopt;
      }
      return std::make_pair(*v, k);  // converted when read (Pt2TensorEntry::convert_to)
    }
    for (std::size_t k = 0; k < sources.size(); ++k) {
      std::string misfit;
      at::Tensor value = fromOriginalLayout(
          entry.fqn, declared, [&](const std::string& name) { return sources[k]->find(name); },
          [&](const std::string& name) {
            std::optional<at::Tensor> v = view(k, name);
            return v ? *v : at::Tensor();
          },
          misfit);
      if (!misfit.empty()) {
        misfits.push_back(fmt::format("{} in '{}'", misfit, sources[k]->path()));
        return std::nullopt;
      }
      if (!value.defined()) continue;
      for (const auto& piece : originalLayout(entry.fqn, declared.sizes().vec())) used.insert({k, piece.name});
      if (!fits(value, declared)) {
        misfits.push_back(fmt::format("'{}' is {} in the model but {} assembled from its original layout in '{}'",
                                      entry.fqn, describe(declared), describe(value), sources[k]->path()));
        return std::nullopt;
      }
      return std::make_pair(value.to(declared.scalar_type()).contiguous(), k);
    }
    return std::nullopt;
  };

  for (auto& entry : entries) {
    if (tied.count(entry.fqn)) continue;  // below, from its tie
    at::Tensor& slot = tensors.at(entry.fqn);
    const std::size_t misfits_before = misfits.size();
    std::optional<std::pair<at::Tensor, std::size_t>> value = take(entry, slot);
    if (value) {
      if (entry.is_parameter && slot.requires_grad()) value->first.set_requires_grad(true);
      // A view of the source's mapping (its own name, not assembled from
      // others), in the source's dtype until read.
      const SafetensorsTensor* own = sources[value->second]->find(entry.fqn);
      entry.source_view = own != nullptr && value->first.data_ptr() == static_cast<const void*>(own->data);
      if (entry.source_view) {
        entry.source_file = sources[value->second]->fileOf(entry.fqn);
        entry.source_offset = own->file_offset;
      }
      entry.convert_to = value->first.scalar_type() != slot.scalar_type() ? static_cast<int>(slot.scalar_type()) : -1;
      slot = value->first;
      entry.on_meta = false;
      entry.weights_source = sources[value->second]->path();
    } else if (misfits.size() == misfits_before && (!entry.is_constant || entry.on_meta)) {
      missing.push_back(entry.fqn);
    }
  }
  for (auto& entry : entries) {
    auto tie = tied.find(entry.fqn);
    if (tie == tied.end()) continue;
    for (std::size_t k = 0; k < sources.size(); ++k) {
      if (sources[k]->find(entry.fqn) != nullptr) used.insert({k, entry.fqn});  // the tie wins
    }
    auto from = std::find_if(entries.begin(), entries.end(),
                             [&](const Pt2TensorEntry& e) { return e.fqn == tie->second; });
    if (from == entries.end() || from->on_meta || from->weights_source.empty()) {
      if (from == entries.end() || from->weights_source.empty()) missing.push_back(entry.fqn);
      continue;
    }
    const at::Tensor& value = tensors.at(from->fqn);
    at::Tensor& slot = tensors.at(entry.fqn);
    const at::ScalarType from_type =
        from->convert_to >= 0 ? static_cast<at::ScalarType>(from->convert_to) : value.scalar_type();
    if (value.sizes() != slot.sizes() || from_type != slot.scalar_type()) {
      misfits.push_back(fmt::format("'{}' is {} in the model but is tied to '{}', which is {}", entry.fqn,
                                    describe(slot), from->fqn,
                                    describe(at::empty(value.sizes(), at::TensorOptions().dtype(from_type).device(at::kMeta)))));
      continue;
    }
    slot = value;
    entry.on_meta = false;
    entry.weights_source = from->weights_source;
    entry.source_view = from->source_view;
    entry.source_file = from->source_file;
    entry.source_offset = from->source_offset;
    entry.convert_to = from->convert_to;
  }

  if (!misfits.empty()) {
    throw Pt2Error(fmt::format("'{}': {} tensor{} of --weights {} do{} not fit the model: {}. Give the checkpoint of "
                               "this model, or export the model from the checkpoint's config",
                               archive_path, misfits.size(), misfits.size() == 1 ? "" : "s", named,
                               misfits.size() == 1 ? "es" : "", fmt::join(misfits, "; ")));
  }
  if (!missing.empty()) {
    throw Pt2Error(fmt::format("'{}': {} tensor{} the model needs {} no value in --weights {}: {}. Give a source "
                               "that holds them (--weights may be repeated, model.weights may be a list; a later "
                               "source fills what earlier ones lack). A meta-device export's non-persistent "
                               "buffers (rotary inv_freq) come from the buffers file pipeforge.export_on_meta "
                               "writes; a tied weight a checkpoint leaves out, from the ties that file records",
                               archive_path, missing.size(), missing.size() == 1 ? "" : "s",
                               missing.size() == 1 ? "has" : "have", named, firstOf(missing)));
  }
  if (!options.accept_unused_weights) {
    std::vector<std::string> unused;
    for (std::size_t k = 0; k < sources.size(); ++k) {
      for (const std::string& name : sources[k]->names()) {
        bool taken = false;
        for (std::size_t j = 0; j <= k && !taken; ++j) taken = used.count({j, name}) > 0;
        // A name an earlier source already gave is not this one's to give.
        for (std::size_t j = 0; j < k && !taken; ++j) taken = sources[j]->find(name) != nullptr;
        if (!taken) unused.push_back(name);
      }
    }
    if (!unused.empty()) {
      throw Pt2Error(fmt::format("'{}': {} tensor{} in --weights {} {} no tensor of the model: {}. Check that the "
                                 "weights are this model's checkpoint, or pass --accept-unused-weights "
                                 "(model.accept_unused_weights: true in a training config) to ignore them",
                                 archive_path, unused.size(), unused.size() == 1 ? "" : "s", named,
                                 unused.size() == 1 ? "fits" : "fit", firstOf(unused)));
    }
  }
}

int metaDevicesToCpu(nlohmann::ordered_json& program) {
  int rewritten = 0;
  std::vector<nlohmann::ordered_json*> work{&program};
  while (!work.empty()) {
    nlohmann::ordered_json* j = work.back();
    work.pop_back();
    if (j->is_array()) {
      for (auto& e : *j) work.push_back(&e);
    } else if (j->is_object()) {
      // A Device: {"type": "meta", "index": null}.
      if (j->contains("type") && j->at("type").is_string() && j->at("type").get<std::string>() == "meta" &&
          j->size() <= 2 && (j->size() == 1 || j->contains("index"))) {
        (*j)["type"] = "cpu";
        ++rewritten;
        continue;
      }
      for (auto& [key, value] : j->items()) work.push_back(&value);
    }
  }
  return rewritten;
}

}  // namespace pipeforge::frontend
