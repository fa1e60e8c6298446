#include "data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "data/sampling.h"

namespace pipeforge::train {
namespace {

// A read-only mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& key) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ConfigError(fmt::format("{}: cannot open '{}': {}", key, path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw ConfigError(fmt::format("{}: cannot stat '{}': {}", key, path, std::strerror(errno)));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw ConfigError(fmt::format("{}: cannot map '{}': {}", key, path, std::strerror(errno)));
      }
      data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

int tokenWidth(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8: return 1;
    case TokenDtype::kUint16: return 2;
    case TokenDtype::kUint32: return 4;
  }
  return 1;
}

const char* dtypeName(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8: return "uint8 (bytes)";
    case TokenDtype::kUint16: return "uint16";
    case TokenDtype::kUint32: return "uint32";
  }
  return "?";
}

// A run of tokens inside a mapped file.
struct TokenSpan {
  const MappedFile* file = nullptr;
  std::int64_t begin = 0;  // in tokens
  std::int64_t length = 0;
};

// One document of a span (data.packing: none), in tokens from the span's start.
struct Document {
  std::int64_t begin = 0;
  std::int64_t length = 0;  // its separator included
};

}  // namespace

// Note [Variable sequence lengths]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// data.packing: none makes every row one document: the tokens after a
// data.document_separator up to and including the next one (the stream's
// last document may lack it), cut at block_size + 1 tokens. A document of
// n tokens gives x = doc[0 : n-1] and y = doc[1 : n]; the rest of the row up
// to block_size is padding, the separator in x and -1 (ignored by the loss)
// in y. Documents come in a shuffled order, each once per epoch, drawn as
// tensor rows are (Note [Stateless sampling]); documents of one token have no
// target and are skipped.
// The global batch is padded to block_size; the runner then cuts each
// microbatch to its own longest row (RunnerOptions::trim_padding), so a
// microbatch of short documents computes at its length. For a causal model
// that is exact: no position reads a later one, so the padding changes no
// counted output, and per-token normalization (loss_normalization:
// per_token) counts only the real targets. The shapes sent between stages
// then differ per microbatch; each (edge, microbatch) is described as it
// changes (Note [Shape inference]).

class TokenDataset::Impl {
 public:
  Impl(const DataConfig& config, std::uint64_t seed) : config_(config), seed_(seed), width_(tokenWidth(config.dtype)) {
    train_file_ = std::make_unique<MappedFile>(config.path, "data.path");
    const std::int64_t total = tokensIn(*train_file_, config.path, "data.path");
    if (!config.val_path.empty()) {
      val_file_ = std::make_unique<MappedFile>(config.val_path, "data.val_path");
      train_ = TokenSpan{train_file_.get(), 0, total};
      held_out_ = TokenSpan{val_file_.get(), 0, tokensIn(*val_file_, config.val_path, "data.val_path")};
      checkLength(train_, "data.path", config.path);
      checkLength(held_out_, "data.val_path", config.val_path);
      return;
    }
    const auto held = static_cast<std::int64_t>(static_cast<double>(total) * config.val_fraction);
    train_ = TokenSpan{train_file_.get(), 0, total - held};
    held_out_ = TokenSpan{train_file_.get(), total - held, held};
    checkLength(train_, "data.path", config.path);
    if (held > 0) checkLength(held_out_, "data.val_fraction", config.path);
  }

  bool documents() const { return config_.packing == Packing::kNone; }

  // The documents of a span (Note [Variable sequence lengths]).
  std::vector<Document> findDocuments(const TokenSpan& span) const {
    std::vector<Document> docs;
    std::int64_t begin = 0;
    for (std::int64_t i = 0; i < span.length; ++i) {
      if (token(span, i) != config_.document_separator && i + 1 < span.length) continue;
      const std::int64_t length = i + 1 - begin;
      if (length >= 2) docs.push_back(Document{begin, length});
      begin = i + 1;
    }
    return docs;
  }

  Batch documentBatch(const TokenSpan& span, const std::vector<Document>& docs, std::uint64_t stream,
                      std::int64_t index, std::int64_t batch_size) {
    const std::int64_t t = config_.block_size;
    const auto n = static_cast<std::int64_t>(docs.size());
    at::Tensor x = at::full({batch_size, t}, config_.document_separator, at::kLong);
    at::Tensor y = at::full({batch_size, t}, -1, at::kLong);
    std::int64_t* px = x.data_ptr<std::int64_t>();
    std::int64_t* py = y.data_ptr<std::int64_t>();
    for (std::int64_t row = 0; row < batch_size; ++row) {
      const std::int64_t k = index * batch_size + row;  // position in the endless sequence of documents
      const Document& doc = docs[order_.get(seed_, stream + 2, k / n, n)[k % n]];
      const std::int64_t used = std::min(doc.length, t + 1) - 1;  // targets in this row
      for (std::int64_t j = 0; j < used; ++j) {
        px[row * t + j] = token(span, doc.begin + j);
        py[row * t + j] = token(span, doc.begin + j + 1);
      }
    }
    return Batch{{x}, {y}};
  }

  Batch batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
    const TokenSpan& span = split == DataSplit::kTrain ? train_ : held_out_;
    if (span.length == 0) {
      throw ConfigError("evaluation needs held-out data: set data.val_path or data.val_fraction > 0, or "
                        "training.eval_every: 0");
    }
    if (documents()) {
      return split == DataSplit::kTrain ? documentBatch(span, train_docs_, 0, index, batch_size)
                                        : documentBatch(span, held_out_docs_, 1, index, batch_size);
    }
    const std::int64_t t = config_.block_size;
    const auto windows = static_cast<std::uint64_t>(span.length - t);  // starts i with i + t < length
    at::Tensor x = at::empty({batch_size, t}, at::kLong);
    at::Tensor y = at::empty({batch_size, t}, at::kLong);
    std::int64_t* px = x.data_ptr<std::int64_t>();
    std::int64_t* py = y.data_ptr<std::int64_t>();
    const std::uint64_t stream = split == DataSplit::kTrain ? 0 : 1;
    for (std::int64_t row = 0; row < batch_size; ++row) {
      const auto start = static_cast<std::int64_t>(
          drawBelow(drawBits(seed_, stream, static_cast<std::uint64_t>(index), static_cast<std::uint64_t>(row)), windows));
      for (std::int64_t k = 0; k < t; ++k) {
        px[row * t + k] = token(span, start + k);
        py[row * t + k] = token(span, start + k + 1);
      }
    }
    return Batch{{x}, {y}};
  }

  std::string describe() const {
    std::string docs;
    if (documents()) {
      std::int64_t longest = 0;
      for (const auto* list : {&train_docs_, &held_out_docs_}) {
        for (const Document& d : *list) longest = std::max(longest, d.length);
      }
      docs = fmt::format(", one document per row (packing none: {} train, {} held out, the longest {} tokens), "
                         "each microbatch padded to its longest row",
                         train_docs_.size(), held_out_docs_.size(), longest);
    }
    return fmt::format("{}: {} {} tokens ({} train, {} held out{}), block {}{}",
                       std::filesystem::path(config_.path).filename().string(),
                       train_.length + (val_file_ ? 0 : held_out_.length), dtypeName(config_.dtype), train_.length,
                       held_out_.length, val_file_ ? " from " + config_.val_path : heldOutFrom(config_),
                       config_.block_size, docs);
  }

  DataConfig config_;
  std::uint64_t seed_;
  int width_;
  std::unique_ptr<MappedFile> train_file_;
  std::unique_ptr<MappedFile> val_file_;
  TokenSpan train_;
  TokenSpan held_out_;
  std::vector<Document> train_docs_, held_out_docs_;  // packing none
  EpochOrder order_;

  // One pass over each mapped file (the held-out tail of data.path is in it).
  Dataset::LargestToken largestToken() const {
    Dataset::LargestToken best{-1, "", 0};
    auto scan = [&](const MappedFile& file, const std::string& path) {
      const auto n = static_cast<std::int64_t>(file.size() / width_);
      const TokenSpan all{&file, 0, n};
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t t = token(all, i);
        if (t > best.id) best = Dataset::LargestToken{t, path, i};
      }
    };
    scan(*train_file_, config_.path);
    if (val_file_) scan(*val_file_, config_.val_path);
    return best;
  }

 private:
  std::int64_t tokensIn(const MappedFile& file, const std::string& path, const std::string& key) const {
    if (file.size() % width_ != 0) {
      throw ConfigError(fmt::format("{}: '{}' has {} bytes, not a whole number of {}-byte tokens; check data.dtype",
                                    key, path, file.size(), width_));
    }
    return static_cast<std::int64_t>(file.size() / width_);
  }

  void checkLength(const TokenSpan& span, const std::string& key, const std::string& path) {
    if (documents()) {
      std::vector<Document>& docs = &span == &train_ ? train_docs_ : held_out_docs_;
      docs = findDocuments(span);
      if (docs.empty()) {
        throw ConfigError(fmt::format("{}: '{}' holds no document of two or more tokens here (data.document_separator "
                                      "{} ends each); check the separator, or use data.packing: windows",
                                      key, path, config_.document_separator));
      }
      return;
    }
    if (span.length < config_.block_size + 1) {
      throw ConfigError(fmt::format("{}: '{}' gives {} tokens here but data.block_size {} needs at least {}; use a "
                                    "larger file or a smaller block",
                                    key, path, span.length, config_.block_size, config_.block_size + 1));
    }
  }

  std::int64_t token(const TokenSpan& span, std::int64_t i) const {
    const unsigned char* p = span.file->data() + (span.begin + i) * width_;
    switch (width_) {
      case 1: return p[0];
      case 2: {
        std::uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      default: {
        std::uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
    }
  }
};

TokenDataset::TokenDataset(const DataConfig& config, std::uint64_t seed)
    : impl_(std::make_unique<Impl>(config, seed)) {}
TokenDataset::~TokenDataset() = default;

Batch TokenDataset::batch(DataSplit split, std::int64_t index, std::int64_t batch_size) {
  return impl_->batch(split, index, batch_size);
}
std::string TokenDataset::describe() const { return impl_->describe(); }
std::optional<Dataset::LargestToken> TokenDataset::largestToken() const {
  return impl_->largestToken();
}
std::int64_t TokenDataset::trainTokens() const { return impl_->train_.length; }
std::int64_t TokenDataset::heldOutTokens() const { return impl_->held_out_.length; }

}  // namespace pipeforge::train
