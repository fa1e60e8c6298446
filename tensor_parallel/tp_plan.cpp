#include "tensor_parallel/tp_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <fnmatch.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "frontend/graph_reads.h"
#include "frontend/module_paths.h"
#include "frontend/opened_model.h"
#include "tensor_parallel/tp_ops.h"

namespace pipeforge::tensor_parallel {

const char* styleName(LinearSplit split) {
  switch (split) {
    case LinearSplit::kColumn:
      return "colwise";
    case LinearSplit::kRow:
      return "rowwise";
    case LinearSplit::kWhole:
      return "replicated";
    case LinearSplit::kVocab:
      return "embedding_rowwise";
  }
  return "?";
}

std::map<std::string, std::string> TpPlan::styles() const {
  std::map<std::string, std::string> out;
  for (const auto& l : linears) {
    if (l.split != LinearSplit::kWhole) out[l.module] = styleName(l.split);
  }
  return out;
}

std::string TpPlan::describe() const {
  std::ostringstream os;
  for (const auto& l : linears) {
    os << fmt::format("{:<10} {}", styleName(l.split), l.module);
    if (!l.why.empty()) os << "  (" << l.why << ")";
    os << "\n";
  }
  os << fmt::format("tensor parallel {}: {} split parameters, {} all-reduces forward (g), {} backward (f), {} "
                    "outputs gathered, {} sizes divided",
                    degree, parameters.size(), reduces, copies, gathers, resized);
  if (!sequence_shard_outputs.empty()) {
    os << fmt::format(", {} outputs left as sequence shards", sequence_shard_outputs.size());
  }
  if (!vocab_split_outputs.empty()) {
    os << fmt::format(", {} outputs left split by vocabulary for the loss", vocab_split_outputs.size());
  }
  return os.str();
}

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// Note [Planning from the graph]: one pass over the stage's ops, in order,
// gives each tensor a state: replicated (every rank holds it whole), split
// along one dimension in `degree` contiguous blocks, or broken (split, but
// an op could not keep it exact). A linear whose input is replicated starts
// a split (column) and founds a group; ops that act per head or per feature
// carry the split through, moving its dimension (a view from [b, s, h·d] to
// [b, s, h, d] splits h); a linear whose input is split along its features
// ends it (row) and closes the group. Where split values meet, their groups
// merge (q, k and v at attention; gate and up at SiLU·mul).
//
// A group that meets something it cannot pass (a norm over the split
// dimension, a head count the degree does not divide, the stage's output)
// is either an exact-split failure, when it also reached a row linear: the
// model's layer is the col/row pattern and we cannot keep it exact, so the
// plan is refused naming the op; or a linear that merely is not part of one
// (lm_head's logits leave the stage; MoE's router feeds a softmax over its
// outputs), whose columns then run whole. The pass is repeated until no
// group fails. (A group that reached its row but is cut by the stage
// boundary between the two gathers its split output whole instead.)
//
// Note [Sequence parallel]: Megatron's, on the same pass. A row linear's
// output is reduce-scattered along the sequence (the dim before the
// features of a [batch, sequence, features] value) instead of summed whole,
// so what follows it (residual adds, norms, dropout) is split along the
// sequence; the next linear gathers its input along the sequence (backward:
// reduce-scatter) and starts its column split, or, kept whole, runs on the
// rank's part with its weight's gradient summed (f). A whole value meeting a
// sequence shard (the residual before the first row) is narrowed to the
// rank's block after an f, whose sum rebuilds its gradient; a norm weight
// applied to a shard gets an f too, which is Megatron's all-reduce of the
// sequence-parallel gradients. Stage outputs split along the sequence are
// gathered whole, but those of Note [Sequence shards across cuts].
//
// Note [Sequence shards across cuts]: Megatron sends the sequence shard
// from stage to stage, 1/t of the hidden states. Here a stage output split
// along the sequence leaves as this rank's part when every edge carrying it
// ends in a module input of a later stage (TpOptions::sequence_shard_outputs;
// the runner knows the edges). The stage reading it gathers it where it
// enters (PipelineStage::setSequenceShardedInputs, tp_ops' gather: backward
// keeps the rank's part of the gradient, which is what travels back), so
// the all-gather moves from the sending side to the receiving one and the
// bytes on the wire halve at t = 2. Which outputs left as parts is only
// known to the stage that planned them: the runner shares it with one
// all-reduce over every rank after planning (shareSequenceShards).
enum class Kind { kRep, kShard, kBroken };

struct State {
  Kind kind = Kind::kRep;
  int dim = -1;
  int origin = -1;  // the group (union-find over column linears)
  bool seq = false;  // sequence parallel: split along the sequence, between a row and the next column
};

std::string baseName(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string sourceOf(const Node* n) { return baseName(frontend::sourceLocation(n)); }

// aten::size, and aten::sym_size (torch.export's; absent from 1.13).
bool isSizeRead(c10::Symbol kind) {
  static const c10::Symbol sym_size = c10::Symbol::fromQualString("aten::sym_size");
  return kind == c10::aten::size || kind == sym_size;
}

bool isTensor(const Value* v) { return v->type()->kind() == c10::TypeKind::TensorType; }

std::optional<int64_t> constantInt(const Value* v) {
  auto iv = torch::jit::toIValue(v);
  if (iv && iv->isInt()) return iv->toInt();
  return std::nullopt;
}

std::optional<std::vector<int64_t>> constantInts(const Value* v) {
  if (auto iv = torch::jit::toIValue(v)) {
    if (iv->isIntList()) return iv->toIntVector();
    if (iv->isInt()) return std::vector<int64_t>{iv->toInt()};
    return std::nullopt;
  }
  if (v->node()->kind() == c10::prim::ListConstruct) {
    std::vector<int64_t> out;
    for (const Value* e : v->node()->inputs()) {
      auto c = constantInt(e);
      if (!c) return std::nullopt;
      out.push_back(*c);
    }
    return out;
  }
  return std::nullopt;
}

int64_t product(const std::vector<int64_t>& s, std::size_t from, std::size_t to) {
  int64_t p = 1;
  for (std::size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

struct Problem {
  int origin;
  std::string message;
};

// The literal at `element` of a size list, divided by the degree.
struct Resize {
  Node* node;
  std::size_t list_input;
  std::size_t element;
  int64_t value;
};

// A replicated value entering a split op gets an f (tp_ops.h).
// With `narrow_dim` >= 0 the value is whole along the dim its consumer's
// split runs on: the consumer takes this rank's block of it (after the f,
// whose sum over the group puts the blocks' gradients back together).
struct Wrap {
  Node* consumer;
  std::size_t input;
  int narrow_dim = -1;
  int64_t narrow_size = 0;  // the whole size of that dim
};

class Planner {
 public:
  Planner(const frontend::OpenedModel& opened, std::unordered_map<const Value*, std::vector<int64_t>> shapes,
          int degree, const TpOptions& options)
      : opened_(opened), graph_(opened.graph()), shapes_(std::move(shapes)), degree_(degree),
        explicit_(!options.styles.empty()), sequence_parallel_(options.sequence_parallel),
        keep_whole_(options.keep_whole), split_tied_(options.split_tied),
        vocab_outputs_(options.vocab_parallel_outputs), seq_outputs_(options.sequence_shard_outputs) {
    const TpStyles& styles = options.styles;
    countParameterReads(graph_.block());
    if (!explicit_) return;
    // Note [Explicit plans]: each linear takes the style of the first glob
    // matching its module (as written, or under any prefix: transformers'
    // "layers.*.q_proj" names what is "model.layers.0.self_attn.q_proj");
    // a linear no glob names runs whole, as torchtitan leaves it.
    for (Node* n : graph_.block()->nodes()) {
      const bool embedding = n->kind() == c10::aten::embedding;
      if (!embedding && n->kind() != c10::aten::linear) continue;
      const auto named = styleOf(styles, opened_.ownerOf(n));
      if (embedding) {
        if (named) {
          styled_embeddings_[n] = {named->second == "vocab" || named->second == "embedding_rowwise",
                                   fmt::format("tensor_parallel_plan's '{}': {}", named->first, named->second)};
        }
        continue;
      }
      if (!named) {
        styled_[n] = {LinearSplit::kWhole, "tensor_parallel_plan names it with no glob"};
        continue;
      }
      const std::string& style = named->second;
      styled_[n] = {style == "colwise"   ? LinearSplit::kColumn
                    : style == "rowwise" ? LinearSplit::kRow
                                         : LinearSplit::kWhole,
                    fmt::format("tensor_parallel_plan's '{}': {}", named->first, style)};
    }
  }

  // The first (glob, style) of `styles` naming module `fqn`, as written or
  // under any prefix (Note [Explicit plans]).
  static std::optional<std::pair<std::string, std::string>> styleOf(const TpStyles& styles, const std::string& fqn) {
    for (const auto& entry : styles) {
      const std::string& glob = entry.first;
      if (fnmatch(glob.c_str(), fqn.c_str(), 0) == 0 || fnmatch(("*." + glob).c_str(), fqn.c_str(), 0) == 0) {
        return entry;
      }
    }
    return std::nullopt;
  }

  // Runs passes until no group fails; throws TpPlanError for a failing group
  // that reached a row linear.
  void run() {
    for (int pass = 0;; ++pass) {
      PIPEFORGE_CHECK(pass < 1000, "tensor-parallel planning did not settle");
      propagate();
      if (settleTied()) continue;
      if (problems_.empty()) return refuseNothingSplit();
      // An explicit plan is taken as written: what does not fit is refused.
      if (explicit_) throw TpPlanError(problems_.front().message);
      std::set<int> demoted;
      for (const Problem& p : problems_) {
        int root = find(p.origin);
        if (closed_.count(root)) throw TpPlanError(p.message);
        if (!demoted.insert(root).second) continue;
        for (std::size_t c = 0; c < columns_.size(); ++c) {
          if (find(static_cast<int>(c)) == root) whole_[columns_[c]] = whyWhole(p.message);
        }
      }
    }
  }

  // A stage with projections of which none splits would run whole on every
  // rank of the group: tensor parallel asked for and silently not done.
  void refuseNothingSplit() const {
    if (!columns_.empty()) return;
    std::vector<std::string> why;
    for (Node* n : linears_) {
      auto it = whole_.find(n);
      why.push_back(fmt::format("{} stays whole: {}", opened_.ownerOf(n),
                                it == whole_.end() ? "its weight is not a module's 2-d parameter" : it->second));
    }
    for (Node* n : graph_.block()->nodes()) {
      const std::string op = n->kind().toQualString();
      if (op != "aten::addmm" && op != "aten::mm" && op != "aten::matmul" && op != "aten::bmm") continue;
      for (Value* v : n->inputs()) {
        const std::string producer = v->node()->kind().toQualString();
        if (producer == "aten::t" || producer == "aten::numpy_T" || producer == "aten::transpose" ||
            producer == "aten::permute") {
          v = v->node()->input(0);
        }
        if (v->node()->kind() == c10::prim::GetAttr && isTensor(v) && rankOf(v) == 2) {
          why.push_back(fmt::format("{}: {} by a parameter is not a linear the planner splits (transformers' Conv1D "
                                    "in GPT-2, FalconLinear)",
                                    where(n), op));
          break;
        }
      }
    }
    if (why.empty()) return;  // no projection at all (an embedding stage): nothing to split
    if (why.size() > 3) why.resize(3);
    throw TpPlanError(fmt::format("tensor_parallel {} finds nothing to split in this stage, so every rank would run it "
                                  "whole: {}; set pipeline.tensor_parallel to 1 for this model",
                                  degree_, fmt::join(why, "; ")));
  }

  TpPlan plan() const {
    TpPlan plan;
    plan.degree = degree_;
    for (Node* n : linears_) {
      PlannedLinear l;
      l.module = opened_.ownerOf(n);
      l.source = sourceOf(n);
      if (std::find(columns_.begin(), columns_.end(), n) != columns_.end()) {
        l.split = LinearSplit::kColumn;
      } else if (std::find(rows_.begin(), rows_.end(), n) != rows_.end()) {
        l.split = LinearSplit::kRow;
      } else {
        auto it = whole_.find(n);
        l.why = it == whole_.end() ? "its input is not split and it starts no split" : it->second;
      }
      plan.linears.push_back(std::move(l));
    }
    for (Node* n : graph_.block()->nodes()) {
      if (n->kind() != c10::aten::embedding) continue;
      PlannedLinear l;
      l.module = opened_.ownerOf(n);
      l.source = sourceOf(n);
      const bool split = std::find(embeddings_.begin(), embeddings_.end(), n) != embeddings_.end();
      l.split = split ? LinearSplit::kVocab : LinearSplit::kWhole;
      if (!split) {
        auto it = embedding_whole_.find(n);
        l.why = it == embedding_whole_.end() ? "its indices or weight arrive split" : it->second;
      }
      plan.linears.insert(plan.linears.begin(), std::move(l));
    }
    for (const auto& [fqn, dim, size] : splitParameters()) plan.parameters.push_back({fqn, dim, size});
    plan.copies = static_cast<int>(wrappedValues().size());
    plan.reduces = static_cast<int>(rows_.size() + embeddings_.size());
    plan.gathers = static_cast<int>(gathers_.size());
    std::set<const Value*> gathered;
    for (const Wrap& w : seq_gathers_) gathered.insert(w.consumer->input(w.input));
    plan.sequence_gathers = static_cast<int>(gathered.size());
    plan.resized = static_cast<int>(resizes_.size());
    plan.vocab_split_outputs = vocab_split_;
    plan.sequence_shard_outputs = seq_shards_;
    return plan;
  }

  struct ParameterCut {
    std::string fqn;
    int dim;
    long long size;
  };
  // Column linears: weight dim 0 and bias; row linears: weight dim 1.
  std::vector<ParameterCut> splitParameters() const {
    std::vector<ParameterCut> out;
    for (Node* n : embeddings_) {
      out.push_back({*frontend::attributePath(n->input(0)), 0, shapeOf(n->input(0))[0]});
    }
    for (Node* n : linears_) {
      bool column = std::find(columns_.begin(), columns_.end(), n) != columns_.end();
      bool row = std::find(rows_.begin(), rows_.end(), n) != rows_.end();
      if (!column && !row) continue;
      const auto& w = shapeOf(n->input(1));
      out.push_back({*frontend::attributePath(n->input(1)), column ? 0 : 1, column ? w[0] : w[1]});
      if (column && n->inputs().size() > 2) {
        if (auto b = frontend::attributePath(n->input(2))) out.push_back({*b, 0, w[0]});
      }
    }
    return out;
  }

  // Rewrites the opened graph for rank `rank` over `group`.
  void rewrite(int rank, int group) {
    Graph& g = graph_;
    auto group_value = [&](Node* before) {
      torch::jit::WithInsertPoint guard(before);
      return g.insertConstant(static_cast<int64_t>(group));
    };
    // `op`(v, dim, rank, degree, group) at the insert point: the gathers and
    // scatters of tp_ops.h.
    auto alongDim = [&](const char* op, Value* v, int64_t dim) {
      Node* n = g.insertNode(g.create(c10::Symbol::fromQualString(op),
                                      {v, g.insertConstant(dim), g.insertConstant(static_cast<int64_t>(rank)),
                                       g.insertConstant(static_cast<int64_t>(degree_)),
                                       g.insertConstant(static_cast<int64_t>(group))}));
      n->output()->setType(v->type());
      return n->output();
    };
    // Sizes first: they edit list inputs of nodes the other steps keep.
    for (const Resize& r : resizes_) {
      Node* list = r.node->input(r.list_input)->node();
      torch::jit::WithInsertPoint guard(r.node);
      std::vector<Value*> elements(list->inputs().begin(), list->inputs().end());
      elements[r.element] = g.insertConstant(r.value / degree_);
      Node* fresh = g.insertNode(g.createList(c10::IntType::get(), elements));
      r.node->replaceInput(r.list_input, fresh->output());
    }
    // One f per replicated value, right after it is made.
    std::unordered_map<Value*, Value*> copied;
    for (const Wrap& w : wraps_) {
      Value* v = w.consumer->input(w.input);
      auto it = copied.find(v);
      if (it == copied.end()) {
        Node* anchor = v->node()->kind() == c10::prim::Param ? g.block()->nodes().front() : v->node()->next();
        Value* grp = group_value(anchor);
        torch::jit::WithInsertPoint guard(anchor);
        Node* f = g.insertNode(g.create(c10::Symbol::fromQualString(kCopyOp), {v, grp}));
        f->output()->setType(v->type());
        it = copied.emplace(v, f->output()).first;
      }
      Value* wrapped = it->second;
      if (w.narrow_dim >= 0) {
        // The block is sized at run time: a sequence length varies by batch.
        torch::jit::WithInsertPoint guard(w.consumer);
        Value* dim = g.insertConstant(static_cast<int64_t>(w.narrow_dim));
        Node* size = g.insertNode(g.create(c10::aten::size, {wrapped, dim}));
        size->output()->setType(c10::IntType::get());
        Node* block = g.insertNode(
            g.create(c10::aten::floordiv, {size->output(), g.insertConstant(static_cast<int64_t>(degree_))}));
        block->output()->setType(c10::IntType::get());
        Node* start =
            g.insertNode(g.create(c10::aten::mul, {block->output(), g.insertConstant(static_cast<int64_t>(rank))}));
        start->output()->setType(c10::IntType::get());
        Node* narrow = g.insertNode(g.create(c10::aten::narrow, {wrapped, dim, start->output(), block->output()}));
        narrow->output()->setType(wrapped->type());
        wrapped = narrow->output();
      }
      w.consumer->replaceInput(w.input, wrapped);
    }
    // Vocab-parallel lookups (Note [Vocab-parallel embedding]).
    for (Node* n : embeddings_) {
      const int64_t rows = shapeOf(n->input(0))[0] / degree_;
      torch::jit::WithInsertPoint guard(n);
      Value* padding = n->inputs().size() > 2 ? n->input(2) : g.insertConstant(static_cast<int64_t>(-1));
      Node* lookup = g.insertNode(g.create(c10::Symbol::fromQualString(kVocabEmbeddingOp),
                                           {n->input(0), n->input(1), g.insertConstant(rank * rows), padding,
                                            g.insertConstant(static_cast<int64_t>(group))}));
      lookup->output()->setType(n->output()->type());
      n->output()->replaceAllUsesWith(lookup->output());
      n->destroy();
    }
    // Sequence parallel: a column linear's input gathered along the sequence.
    std::unordered_map<Value*, Value*> sequence_gathered;  // q, k and v share one gather of their input
    for (const Wrap& w : seq_gathers_) {
      Value* v = w.consumer->input(w.input);
      auto done = sequence_gathered.find(v);
      if (done != sequence_gathered.end()) {
        w.consumer->replaceInput(w.input, done->second);
        continue;
      }
      torch::jit::WithInsertPoint guard(v->node()->kind() == c10::prim::Param ? g.block()->nodes().front()
                                                                             : v->node()->next());
      Value* gathered = alongDim(kSequenceGatherOp, v, w.narrow_dim);
      sequence_gathered.emplace(v, gathered);
      w.consumer->replaceInput(w.input, gathered);
    }
    // Split values the stage returns, gathered whole.
    for (const Wrap& w : gathers_) {
      Value* v = w.consumer->input(w.input);
      torch::jit::WithInsertPoint guard(w.consumer);
      w.consumer->replaceInput(w.input, alongDim(kGatherOp, v, w.narrow_dim));
    }
    // g after each row linear; its bias after the sum.
    for (Node* n : rows_) {
      Value* bias = n->inputs().size() > 2 ? n->input(2) : nullptr;
      bool has_bias = bias && bias->type()->kind() != c10::TypeKind::NoneType;
      Value* out = n->output();
      if (has_bias) {
        torch::jit::WithInsertPoint before(n);
        n->replaceInput(2, g.insertConstant(c10::IValue()));
      }
      torch::jit::WithInsertPoint guard(n->next());
      Value* grp = g.insertConstant(static_cast<int64_t>(group));
      Value* result = nullptr;
      if (sequence_parallel_) {
        result = alongDim(kSequenceScatterOp, out, static_cast<int64_t>(shapeOf(out).size()) - 2);
      } else {
        Node* reduce = g.insertNode(g.create(c10::Symbol::fromQualString(kReduceOp), {out, grp}));
        reduce->output()->setType(out->type());
        result = reduce->output();
      }
      Node* reduce = result->node();
      if (has_bias) {
        Value* one = g.insertConstant(static_cast<int64_t>(1));
        if (sequence_parallel_) {
          // Added to the rank's part of the sequence only: its gradient is summed (f).
          Node* f = g.insertNode(g.create(c10::Symbol::fromQualString(kCopyOp), {bias, grp}));
          f->output()->setType(bias->type());
          bias = f->output();
        }
        Node* add = g.insertNode(g.create(c10::aten::add, {result, bias, one}));
        add->output()->setType(out->type());
        result = add->output();
      }
      out->replaceAllUsesAfterNodeWith(reduce, result);
    }
  }

 private:
  // ---- state ---------------------------------------------------------------
  int find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  int join(int a, int b) {
    if (a < 0) return b < 0 ? b : find(b);
    if (b < 0) return find(a);
    a = find(a);
    b = find(b);
    if (a != b) {
      parent_[b] = a;
      if (closed_.count(b)) closed_.insert(a);
    }
    return a;
  }

  State state(const Value* v) const {
    auto it = state_.find(v);
    return it == state_.end() ? State{} : it->second;
  }

  const std::vector<int64_t>& shapeOf(const Value* v) const {
    static const std::vector<int64_t> none;
    auto it = shapes_.find(v);
    return it == shapes_.end() ? none : it->second;
  }

  int rankOf(const Value* v) const { return static_cast<int>(shapeOf(v).size()); }

  std::string where(const Node* n) const {
    std::string owner = opened_.ownerOf(n);
    std::string src = sourceOf(n);
    return fmt::format("{}{}", owner.empty() ? "the stage's own code" : owner, src.empty() ? "" : " (" + src + ")");
  }

  static std::string whyWhole(const std::string& message) {
    // The reason a column group failed, as a reason to keep its linears whole.
    auto colon = message.find(": ");
    return colon == std::string::npos ? message : message.substr(colon + 2);
  }

  void problem(const Node* n, int origin, const std::string& why, const std::string& fix) {
    problems_.push_back(
        {origin, fmt::format("tensor_parallel {} cannot split {} exactly: {} {}; {}", degree_, where(n),
                             n->kind().toQualString(), why, fix)});
  }

  void setAll(Node* n, State s) {
    for (Value* o : n->outputs()) state_[o] = s;
  }

  // Reads count per tensor, not per name: a tied pair (Qwen2's embedding and
  // head) are two attributes holding one tensor.
  void countParameterReads(torch::jit::Block* block) {
    for (Node* n : block->nodes()) {
      for (Value* v : n->inputs()) {
        if (v->node()->kind() == c10::prim::GetAttr && isTensor(v)) {
          if (auto fqn = frontend::attributePath(v)) ++reads_[tensorKey(*fqn)];
        }
      }
      for (torch::jit::Block* b : n->blocks()) countParameterReads(b);
    }
  }

  const void* tensorKey(const std::string& fqn) {
    auto it = keys_.find(fqn);
    if (it != keys_.end()) return it->second;
    auto [owner, name] = frontend::splitPath(fqn);
    const void* key = nullptr;
    try {
      c10::IValue value = frontend::submoduleAt(opened_.module(), owner).attr(name);
      if (value.isTensor()) key = value.toTensor().unsafeGetTensorImpl();
    } catch (const std::exception&) {
    }
    if (key == nullptr) key = &keys_.emplace(fqn, nullptr).first->first;  // a stable, unique stand-in
    keys_[fqn] = key;
    return key;
  }

  // Note [Tied vocabulary]: a tensor an embedding and lm_head share (Qwen2's,
  // Gemma's tied head) is one [vocab, hidden] matrix that both split the
  // same way: the embedding by vocabulary rows, lm_head by output features,
  // which are those rows. Each rank keeps rows [r·V/t, (r+1)·V/t) and both
  // uses read its slice; their gradients add on it as they add whole. It may
  // be split when it is read twice here, or once here and tied to a copy in
  // another stage (TpOptions::split_tied), and only by an embedding or a
  // column linear. A pass in which one use here splits it and another does
  // not keeps it whole from then on (settleTied); across stages the runner
  // checks that every copy was split alike.
  bool tiedSplittable(const std::string& fqn) {
    const void* key = tensorKey(fqn);
    if (tied_whole_.count(key)) return false;
    bool elsewhere = keep_whole_.count(fqn) > 0;
    for (const std::string& other : keep_whole_) elsewhere = elsewhere || tensorKey(other) == key;
    const int reads = reads_[key];
    return elsewhere ? split_tied_ && reads == 1 : reads == 2;
  }

  // A tied tensor some uses in this graph split and others do not: kept
  // whole, and the pass run again. True when one was found.
  bool settleTied() {
    std::map<const void*, int> split_uses;
    for (Node* n : embeddings_) ++split_uses[tensorKey(*frontend::attributePath(n->input(0)))];
    for (Node* n : columns_) {
      if (auto fqn = frontend::attributePath(n->input(1))) ++split_uses[tensorKey(*fqn)];
    }
    bool found = false;
    for (const auto& [key, uses] : split_uses) {
      if (reads_[key] > 1 && uses != reads_[key]) found = tied_whole_.insert(key).second || found;
    }
    return found;
  }

  // Read by more than its one use, or tied to a copy in another stage.
  bool sharedTensor(const std::string& fqn) {
    if (reads_[tensorKey(fqn)] > 1 || keep_whole_.count(fqn)) return true;
    for (const std::string& other : keep_whole_) {
      if (tensorKey(other) == tensorKey(fqn)) return true;
    }
    return false;
  }

  std::vector<Value*> wrappedValues() const {
    std::vector<Value*> out;
    for (const Wrap& w : wraps_) {
      Value* v = w.consumer->input(w.input);
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
    return out;
  }

  // ---- the pass ------------------------------------------------------------
  void propagate() {
    state_.clear();
    elements_.clear();
    parts_.clear();
    columns_.clear();
    rows_.clear();
    linears_.clear();
    wraps_.clear();
    gathers_.clear();
    vocab_split_.clear();
    seq_shards_.clear();
    seq_gathers_.clear();
    embeddings_.clear();
    embedding_whole_.clear();
    resizes_.clear();
    problems_.clear();
    closed_.clear();
    parent_.clear();
    for (Node* n : graph_.block()->nodes()) visit(n);
    visitReturn(graph_.block()->return_node());
  }

  // Shard and broken inputs of `n`, lists and tuples looked into.
  std::vector<std::pair<std::size_t, State>> splitInputs(const Node* n) const {
    std::vector<std::pair<std::size_t, State>> out;
    for (std::size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* v = n->input(i);
      State s = state(v);
      if (s.kind != Kind::kRep) out.emplace_back(i, s);
      auto el = elements_.find(v);
      if (el != elements_.end()) {
        for (const State& e : el->second) {
          if (e.kind != Kind::kRep) out.emplace_back(i, e);
        }
      }
      auto part = parts_.find(v);
      if (part != parts_.end()) out.emplace_back(i, part->second);
    }
    return out;
  }

  bool blocksUseSplit(const Node* n) const {
    for (const torch::jit::Block* b : n->blocks()) {
      for (const Node* m : b->nodes()) {
        for (const Value* v : m->inputs()) {
          if (state(v).kind != Kind::kRep) return true;
        }
        if (blocksUseSplit(m)) return true;
      }
    }
    return false;
  }

  // A split value the stage returns: a group that ends in a row linear (the
  // col/row pattern, cut by the stage boundary between its halves) gathers
  // it whole; one that never does (lm_head) makes its columns whole instead,
  // which costs no collective.
  void visitReturn(Node* ret) {
    auto leave = [&](Node* consumer, std::size_t input, const State& s, std::size_t output) {
      if (s.kind != Kind::kShard) return;
      // Logits split by vocabulary (lm_head's columns) that the loss reads
      // split: Note [Vocab-parallel cross-entropy] in tp_ops.cpp.
      if (!s.seq && vocab_outputs_.count(static_cast<int>(output)) &&
          s.dim == rankOf(consumer->input(input)) - 1) {
        vocab_split_.push_back(static_cast<int>(output));
        return;
      }
      // Note [Sequence shards across cuts]: what crosses to the next stage is
      // this rank's part of the sequence, 1/t of the whole; that stage
      // gathers it where it enters (PipelineStage::setSequenceShardedInputs),
      // the all-gather this stage would otherwise run here.
      if (s.seq && seq_outputs_.count(static_cast<int>(output))) {
        seq_shards_.emplace_back(static_cast<int>(output), s.dim);
        return;
      }
      if (s.seq || explicit_ || closed_.count(find(s.origin))) {  // an explicit colwise head gathers its output
        gathers_.push_back({consumer, input, s.dim, 0});
        return;
      }
      problems_.push_back({s.origin, fmt::format("tensor_parallel {} cannot split the stage exactly: its output {} "
                                                 "leaves the stage split along dimension {}; a stage's outputs are "
                                                 "whole",
                                                 degree_, output, s.dim)});
    };
    for (std::size_t i = 0; i < ret->inputs().size(); ++i) {
      Value* v = ret->input(i);
      if (v->node()->kind() == c10::prim::TupleConstruct) {
        Node* tuple = v->node();
        for (std::size_t j = 0; j < tuple->inputs().size(); ++j) leave(tuple, j, state(tuple->input(j)), j);
      } else {
        leave(ret, i, state(v), i);
      }
    }
  }

  void visit(Node* n) {
    const auto kind = n->kind();
    if (kind == c10::prim::Constant || kind == c10::prim::GetAttr) return;
    if (kind == c10::aten::linear) return visitLinear(n);
    if (kind == c10::aten::embedding && visitEmbedding(n)) return;

    const std::string op = kind.toQualString();
    auto split = splitInputs(n);
    if (!n->blocks().empty() && blocksUseSplit(n)) {
      split.emplace_back(0, State{Kind::kShard, -1, firstOrigin(n)});
    }
    if (split.empty()) return;  // replicated in, replicated out
    int origin = -1;
    bool broken = false;
    for (const auto& [i, s] : split) {
      origin = join(origin, s.origin);
      broken = broken || s.kind == Kind::kBroken;
    }
    if (broken) return setAll(n, State{Kind::kBroken, -1, origin});

    auto fail = [&](const std::string& why, const std::string& fix) {
      problem(n, origin, why, fix);
      setAll(n, State{Kind::kBroken, -1, origin});
      for (Value* o : n->outputs()) elements_.erase(o);
    };
    if (!n->blocks().empty()) return fail("uses a split value inside a control-flow region", kFixPlan);

    // Containers carry their elements' states.
    if (kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct) {
      std::vector<State> els;
      for (Value* v : n->inputs()) els.push_back(state(v));
      elements_[n->output()] = std::move(els);
      return;
    }
    if (kind == c10::prim::ListUnpack || kind == c10::Symbol::fromQualString("aten::__getitem__")) {
      auto same = parts_.find(n->input(0));
      if (same != parts_.end()) {
        for (Value* o : n->outputs()) state_[o] = same->second;
        return;
      }
    }
    if (kind == c10::prim::TupleUnpack || kind == c10::prim::ListUnpack) {
      auto el = elements_.find(n->input(0));
      if (el == elements_.end() || el->second.size() != n->outputs().size()) return fail("unpacks a split value", kFixPlan);
      for (std::size_t i = 0; i < n->outputs().size(); ++i) state_[n->output(i)] = el->second[i];
      return;
    }
    if (kind == c10::prim::TupleIndex) {
      auto el = elements_.find(n->input(0));
      auto i = constantInt(n->input(1));
      if (el == elements_.end() || !i || *i < 0 || *i >= static_cast<int64_t>(el->second.size())) {
        return fail("indexes a split tuple", kFixPlan);
      }
      state_[n->output()] = el->second[*i];
      return;
    }

    if (kind == c10::Symbol::fromQualString("aten::_assert_tensor_metadata")) {
      // torch.export's dtype check; a size given would be the whole one.
      if (n->inputs().size() > 1 && n->input(1)->type()->kind() != c10::TypeKind::NoneType) {
        return fail("checks the whole size of a split value", kFixPlan);
      }
      return;
    }
    if (op == "aten::split" || op == "aten::split_with_sizes" || op == "aten::chunk" || op == "aten::unsafe_split" ||
        op == "aten::unsafe_chunk" || op == "aten::tensor_split") {
      const State s = state(n->input(0));
      auto d = n->inputs().size() > 2 ? constantInt(n->input(2)) : std::nullopt;
      if (s.kind == Kind::kShard && (!d || normalize(*d, rankOf(n->input(0))) == s.dim)) {
        return fail("cuts the split dimension into parts (a fused projection)", kFixFused);
      }
      if (s.kind == Kind::kShard && n->outputs().size() == 1 && op != "aten::tensor_split") {
        // Parts along another dim (GPT-NeoX's per-head [q | k | v]): each one split as the whole was.
        parts_[n->output()] = State{Kind::kShard, s.dim, origin};
        return;
      }
      return fail("cuts a split value into parts", kFixPlan);
    }
    if (n->outputs().size() != 1 || (!isTensor(n->output()) && !isSizeRead(kind) &&
                                     kind != c10::aten::size)) {
      return fail("cannot take a split value", kFixPlan);
    }
    if (isSizeRead(kind)) {
      const State s = state(n->input(0));
      auto d = n->inputs().size() > 1 ? constantInt(n->input(1)) : std::nullopt;
      if (!d || normalize(*d, rankOf(n->input(0))) == s.dim) {
        return fail(fmt::format("reads the size of the split dimension {}", s.dim), kFixPlan);
      }
      return;  // the other sizes are the same on every rank
    }
    Value* out = n->output();
    const int out_rank = rankOf(out);
    bool seq = false;
    for (const auto& [i, st] : split) seq = seq || st.seq;
    auto shard = [&](int dim) { state_[out] = State{Kind::kShard, dim, origin, seq}; };

    if (isElementwise(op)) {
      // Broadcast: dims align from the right.
      int od = -1;
      for (const auto& [i, s] : split) {
        int d = s.dim + out_rank - rankOf(n->input(i));
        if (od >= 0 && d != od) return fail("combines values split along different dimensions", kFixPlan);
        od = d;
      }
      if (!wrapReplicated(n, od, out_rank, fail)) return;
      return shard(od);
    }

    const State s = split.front().second;
    const int in_rank = rankOf(n->input(0));
    if (split.size() == 1 && split.front().first == 0) {
      if (op == "aten::transpose") {
        auto a = constantInt(n->input(1)), b = constantInt(n->input(2));
        if (!a || !b) return fail("transposes dimensions computed at run time", kFixPlan);
        int da = normalize(*a, in_rank), db = normalize(*b, in_rank);
        return shard(s.dim == da ? db : s.dim == db ? da : s.dim);
      }
      if (op == "aten::t") return shard(in_rank < 2 ? s.dim : 1 - s.dim);
      if (op == "aten::permute") {
        auto dims = constantInts(n->input(1));
        if (!dims) return fail("permutes dimensions computed at run time", kFixPlan);
        for (std::size_t k = 0; k < dims->size(); ++k) {
          if (normalize((*dims)[k], in_rank) == s.dim) return shard(static_cast<int>(k));
        }
        return fail("permutes away the split dimension", kFixPlan);
      }
      if (op == "aten::expand") {
        int od = s.dim + out_rank - in_rank;
        if (!resizeList(n, 1, od, fail)) return;
        return shard(od);
      }
      if (op == "aten::view" || op == "aten::reshape" || op == "aten::_unsafe_view" || op == "aten::unsqueeze" ||
          op == "aten::squeeze" || op == "aten::flatten" || op == "aten::unflatten" || op == "aten::view_as" ||
          op == "aten::reshape_as") {
        int od = reshapedDim(n->input(0), s.dim, out);
        if (od < 0) {
          return fail(fmt::format("makes dimensions {} from the split dimension of size {}, and {} does not divide "
                                  "them",
                                  shapeString(out), shapeOf(n->input(0))[s.dim], degree_),
                      kFixDivide);
        }
        if ((op == "aten::view" || op == "aten::reshape" || op == "aten::_unsafe_view") && !resizeList(n, 1, od, fail)) {
          return;
        }
        return shard(od);
      }
      if (op == "aten::slice" || op == "aten::narrow" || op == "aten::select" || op == "aten::index_select") {
        auto d = constantInt(n->input(1));
        if (!d) return fail("slices a dimension computed at run time", kFixPlan);
        int dd = normalize(*d, in_rank);
        if (dd == s.dim) return fail("slices the split dimension (a fused projection cut into its parts)", kFixFused);
        return shard(op == "aten::select" && dd < s.dim ? s.dim - 1 : s.dim);
      }
      if (isReduction(op)) return visitReduction(n, s, fail, shard);
    }
    if (op == "aten::cat" || op == "aten::stack") {
      auto el = elements_.find(n->input(0));
      auto d = constantInt(n->input(1));
      if (el == elements_.end() || !d) return fail("joins values it cannot see", kFixPlan);
      int dim = -1;
      for (const State& e : el->second) {
        if (e.kind != Kind::kShard || (dim >= 0 && e.dim != dim)) {
          return fail("joins split and whole values", kFixPlan);
        }
        dim = e.dim;
      }
      const int cd = normalize(*d, out_rank);
      if (op == "aten::cat") {
        if (cd == dim) return fail("joins along the split dimension", kFixPlan);
        return shard(dim);
      }
      return shard(cd <= dim ? dim + 1 : dim);
    }
    if (op == "aten::scaled_dot_product_attention") {
      // q, k, v split along the same batch-like dim (heads); the mask whole,
      // broadcast over it.
      int dim = -1;
      for (std::size_t i = 0; i < 3; ++i) {
        State q = state(n->input(i));
        if (q.kind != Kind::kShard || (dim >= 0 && q.dim != dim) || q.dim >= rankOf(n->input(i)) - 2) {
          return fail("needs query, key and value split by heads alike", kFixPlan);
        }
        dim = q.dim;
      }
      if (!wrapReplicated(n, dim, out_rank, fail)) return;
      return shard(dim);
    }
    if (op == "aten::matmul" || op == "aten::bmm") {
      // A batched product keeps a split batch dim (eager attention's heads).
      int od = -1;
      for (const auto& [i, st] : split) {
        int r = rankOf(n->input(i));
        if (st.dim >= r - 2) return fail("multiplies along the split dimension", kFixPlan);
        int d = st.dim + out_rank - r;
        if (od >= 0 && d != od) return fail("combines values split along different dimensions", kFixPlan);
        od = d;
      }
      if (!wrapReplicated(n, od, out_rank, fail)) return;
      return shard(od);
    }
    if (op == "aten::embedding") return fail("looks up split indices", kFixPlan);
    return fail("cannot take a split value", kFixPlan);
  }

  template <typename Fail, typename Shard>
  void visitReduction(Node* n, const State& s, Fail& fail, Shard& shard) {
    const std::string op = n->kind().toQualString();
    const int in_rank = rankOf(n->input(0));
    std::vector<int> reduced;
    if (op == "aten::layer_norm" || op == "aten::rms_norm") {
      auto shape = constantInts(n->input(1));
      if (!shape) return fail("normalizes over sizes computed at run time", kFixPlan);
      for (int k = in_rank - static_cast<int>(shape->size()); k < in_rank; ++k) reduced.push_back(k);
    } else if (n->inputs().size() < 2 || n->input(1)->type()->kind() == c10::TypeKind::NoneType) {
      for (int k = 0; k < in_rank; ++k) reduced.push_back(k);
    } else {
      auto dims = constantInts(n->input(1));
      if (!dims) return fail("reduces over dimensions computed at run time", kFixPlan);
      for (int64_t d : *dims) reduced.push_back(normalize(d, in_rank));
    }
    if (std::find(reduced.begin(), reduced.end(), s.dim) != reduced.end()) {
      return fail(fmt::format("reduces over the split dimension {} (of size {}), which each rank holds only a part "
                              "of",
                              s.dim, shapeOf(n->input(0))[s.dim]),
                  kFixReduce);
    }
    if (!wrapReplicated(n, s.dim, rankOf(n->output()), fail)) return;
    int od = s.dim;
    if (rankOf(n->output()) < in_rank) {
      for (int r : reduced) od -= r < s.dim ? 1 : 0;
    }
    shard(od);
  }

  void visitLinear(Node* n) {
    linears_.push_back(n);
    Value* x = n->input(0);
    Value* w = n->input(1);
    const State s = state(x);
    auto wfqn = w->node()->kind() == c10::prim::GetAttr ? frontend::attributePath(w) : std::nullopt;
    const auto& wshape = shapeOf(w);
    const bool plain = wfqn && wshape.size() == 2;
    auto bias_fqn = n->inputs().size() > 2 && isTensor(n->input(2)) ? frontend::attributePath(n->input(2))
                                                                     : std::nullopt;
    const bool shared = plain && (sharedTensor(*wfqn) || (bias_fqn && sharedTensor(*bias_fqn)));
    if (s.kind == Kind::kBroken) {
      int root = join(s.origin, -1);
      closed_.insert(root);
      return setAll(n, State{Kind::kBroken, -1, root});
    }
    if (explicit_ && !visitStyled(n, s, plain)) return;
    if (s.kind == Kind::kShard && s.seq) return visitOnSequenceShard(n, s, plain, shared, wshape);
    if (s.kind == Kind::kRep) {
      auto forced = whole_.find(n);
      if (forced != whole_.end() || !plain) return;
      if (wshape[0] % degree_ != 0) {
        whole_[n] = fmt::format("its {} output features do not divide among {} ranks", wshape[0], degree_);
        return;
      }
      if (shared && !(tiedSplittable(*wfqn) && !(bias_fqn && sharedTensor(*bias_fqn)))) {
        whole_[n] = "its weight is also read elsewhere (tied)";
        return;
      }
      int origin = static_cast<int>(columns_.size());
      columns_.push_back(n);
      parent_.push_back(origin);
      wraps_.push_back({n, 0});
      state_[n->output()] = State{Kind::kShard, rankOf(n->output()) - 1, origin};
      return;
    }
    // A split input: the row linear that ends the group.
    int root = join(s.origin, -1);
    auto fail = [&](const std::string& why, const std::string& fix) {
      closed_.insert(root);
      problem(n, root, why, fix);
      setAll(n, State{Kind::kBroken, -1, root});
    };
    if (!plain) return fail("multiplies a split value by a weight that is not a module's parameter", kFixPlan);
    if (s.dim != rankOf(x) - 1) {
      return fail(fmt::format("takes a value split along dimension {}, not along its input features", s.dim), kFixPlan);
    }
    if (shared) return fail("needs its weight split, but the weight is also read elsewhere (tied)", kFixPlan);
    rows_.push_back(n);
    closed_.insert(root);
    if (sequence_parallel_) {
      // Note [Sequence parallel]: the partial outputs are reduce-scattered
      // along the sequence (the dim before the features) instead of summed whole.
      const auto& out = shapeOf(n->output());
      const int seq = static_cast<int>(out.size()) - 2;
      if (out.size() != 3 || out[seq] % degree_ != 0) {
        problem(n, root,
                fmt::format("gives {} values, and sequence parallel splits [batch, sequence, features] outputs "
                            "along a sequence {} divides",
                            shapeString(n->output()), degree_),
                "feed sequences whose length tensor_parallel divides, or set pipeline.sequence_parallel: false");
        return setAll(n, State{Kind::kBroken, -1, root});
      }
      state_[n->output()] = State{Kind::kShard, seq, root, true};
    }
  }

  // Note [Sequence parallel]: a linear whose input is split along the
  // sequence either starts a column split, on its input gathered along the
  // sequence (whose backward reduce-scatters), or runs whole on the rank's
  // part of the sequence, its weight's gradient summed over the group (f).
  void visitOnSequenceShard(Node* n, const State& s, bool plain, bool shared, const std::vector<int64_t>& wshape) {
    const bool tied_column = shared && tiedSplittable(*frontend::attributePath(n->input(1))) &&
                             !(n->inputs().size() > 2 && isTensor(n->input(2)));
    const bool whole = whole_.count(n) > 0 || !plain || wshape[0] % degree_ != 0 || (shared && !tied_column);
    if (whole) {
      if (!whole_.count(n)) {
        whole_[n] = !plain ? "its weight is not a module's 2-d parameter"
                    : shared ? "its weight is also read elsewhere (tied)"
                             : fmt::format("its {} output features do not divide among {} ranks", wshape[0], degree_);
      }
      for (std::size_t i = 1; i < n->inputs().size(); ++i) {
        if (isTensor(n->input(i))) wraps_.push_back({n, i});
      }
      state_[n->output()] = State{Kind::kShard, s.dim, s.origin, true};
      return;
    }
    int origin = static_cast<int>(columns_.size());
    columns_.push_back(n);
    parent_.push_back(origin);
    seq_gathers_.push_back({n, 0, s.dim, 0});
    state_[n->output()] = State{Kind::kShard, rankOf(n->output()) - 1, origin};
  }

  // Note [Vocab-parallel embedding]: Megatron's VocabParallelEmbedding. Each
  // rank holds a contiguous 1/t of the rows; an id outside them looks up
  // nothing (zeros), and the sum over the group is the whole lookup. True
  // when `n` is split here.
  bool visitEmbedding(Node* n) {
    Value* w = n->input(0);
    if (state(n->input(1)).kind != Kind::kRep || state(w).kind != Kind::kRep) return false;
    auto fqn = w->node()->kind() == c10::prim::GetAttr ? frontend::attributePath(w) : std::nullopt;
    const auto& shape = shapeOf(w);
    const std::string module = opened_.ownerOf(n);
    std::string why;
    bool wanted = !explicit_;
    if (explicit_) {
      auto it = styled_embeddings_.find(n);
      wanted = it != styled_embeddings_.end() && it->second.first;
      why = it == styled_embeddings_.end() ? "tensor_parallel_plan names it with no glob" : it->second.second;
    }
    // toIValue's optional is c10's on 1.13: read the flags through it.
    auto flag = [&](std::size_t i) {
      if (n->inputs().size() <= i) return false;
      auto v = torch::jit::toIValue(n->input(i));
      return v && v->isBool() && v->toBool();
    };
    const bool by_freq = flag(3), sparse = flag(4);
    if (!fqn || shape.size() != 2) {
      why = "its weight is not a module's 2-d parameter";
    } else if (sharedTensor(*fqn) && !tiedSplittable(*fqn)) {
      why = "its weight is also read elsewhere (tied)";
    } else if (shape[0] % degree_ != 0) {
      why = fmt::format("its {} rows do not divide among {} ranks", shape[0], degree_);
    } else if (sparse || by_freq) {
      why = "it is sparse or scales gradients by frequency";
    } else if (wanted) {
      embeddings_.push_back(n);
      return true;
    }
    if (explicit_ && wanted) {
      problems_.push_back({-1, fmt::format("tensor_parallel_plan does not fit the graph: {} is {}, but {}; change the "
                                           "plan, or use tensor_parallel_plan: auto",
                                           where(n), styled_embeddings_.at(n).second, why)});
    }
    embedding_whole_[n] = why.empty() ? "kept whole" : why;
    return false;
  }

  // An explicit plan's style for linear `n` against what reaches it; false
  // when `n` is decided here (whole, or a mismatch recorded as a problem).
  bool visitStyled(Node* n, const State& s, bool plain) {
    const auto& [split, why] = styled_.at(n);
    auto mismatch = [&](const std::string& what) {
      const int root = s.kind == Kind::kRep ? -1 : join(s.origin, -1);
      problems_.push_back({root, fmt::format("tensor_parallel_plan does not fit the graph: {} is {}, but {}; change "
                                             "the plan, or use tensor_parallel_plan: auto",
                                             where(n), why, what)});
      setAll(n, State{Kind::kBroken, -1, root});
      return false;
    };
    if (split == LinearSplit::kWhole) {
      if (s.kind == Kind::kShard) {
        return mismatch(fmt::format("its input arrives split (by the colwise {})", opened_.ownerOf(columns_.at(find(s.origin)))));
      }
      whole_[n] = why;
      return false;
    }
    if (!plain) return mismatch("its weight is not a module's 2-d parameter");
    if (split == LinearSplit::kColumn && s.kind != Kind::kRep) {
      return mismatch(fmt::format("its input arrives already split (by the colwise {}); a rowwise ends that split first",
                                  opened_.ownerOf(columns_.at(find(s.origin)))));
    }
    if (split == LinearSplit::kRow && s.kind == Kind::kRep) {
      return mismatch("its input arrives whole: no colwise linear before it splits its features");
    }
    return true;  // the style agrees: the auto rules below do the rest
  }

  // f on every replicated tensor input of `n` that meets a split one; false
  // (after fail) when one is whole along the split dimension.
  template <typename Fail>
  bool wrapReplicated(Node* n, int od, int out_rank, Fail& fail) {
    for (std::size_t i = 0; i < n->inputs().size(); ++i) {
      Value* v = n->input(i);
      if (!isTensor(v) || state(v).kind != Kind::kRep) continue;
      const auto& shape = shapeOf(v);
      int k = od - (out_rank - static_cast<int>(shape.size()));
      if (k >= 0 && k < static_cast<int>(shape.size()) && shape[k] != 1) {
        // Whole where its partner is split (a stage cut between gate and up
        // of an MLP): each rank takes its block.
        if (shape[k] % degree_ != 0) {
          fail(fmt::format("meets a whole value of shape {} whose dimension {} {} does not divide", shapeString(v), k,
                           degree_),
               kFixPlan);
          return false;
        }
        wraps_.push_back({n, i, k, shape[k]});
        continue;
      }
      wraps_.push_back({n, i});
    }
    return true;
  }

  // Records the literal at `element` of the size list input `list_input`
  // for division; false (after fail) when it is computed at run time.
  template <typename Fail>
  bool resizeList(Node* n, std::size_t list_input, int element, Fail& fail) {
    Value* list = n->input(list_input);
    if (list->node()->kind() != c10::prim::ListConstruct) {
      if (auto c = constantInts(list)) {
        if ((*c)[element] == -1) return true;
      }
      fail("takes its sizes from a list computed at run time", kFixPlan);
      return false;
    }
    Value* e = list->node()->input(element);
    auto c = constantInt(e);
    if (!c) {
      fail(fmt::format("takes the size of the split dimension {} from a value computed at run time", element),
           kFixPlan);
      return false;
    }
    if (*c == -1) return true;
    if (*c % degree_ != 0) {
      fail(fmt::format("writes {} for the split dimension, which {} does not divide", *c, degree_), kFixDivide);
      return false;
    }
    resizes_.push_back({n, list_input, static_cast<std::size_t>(element), *c});
    return true;
  }

  // The output dim that holds `in`'s split dim `d` after a reshape, or -1
  // (Note [Splits through reshapes]).
  int reshapedDim(const Value* in, int d, const Value* out) const {
    const auto& is = shapeOf(in);
    const auto& os = shapeOf(out);
    if (d < 0 || d >= static_cast<int>(is.size()) || is[d] % degree_ != 0) return -1;
    const int64_t before = product(is, 0, d);
    for (std::size_t e = 0; e < os.size(); ++e) {
      int64_t p = product(os, 0, e);
      if (p > before) break;
      if (p == before && os[e] % degree_ == 0) return static_cast<int>(e);
    }
    return -1;
  }

  int firstOrigin(const Node* n) const {
    for (const torch::jit::Block* b : n->blocks()) {
      for (const Node* m : b->nodes()) {
        for (const Value* v : m->inputs()) {
          if (state(v).kind != Kind::kRep) return state(v).origin;
        }
      }
    }
    return -1;
  }

  std::string shapeString(const Value* v) const {
    const auto& s = shapeOf(v);
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }

  static int normalize(int64_t d, int rank) { return static_cast<int>(d < 0 ? d + rank : d); }

  static bool isElementwise(const std::string& op) {
    static const std::unordered_set<std::string> ops = {
        "aten::add",     "aten::sub",        "aten::mul",       "aten::div",        "aten::neg",     "aten::silu",
        "aten::gelu",    "aten::relu",       "aten::tanh",      "aten::sigmoid",    "aten::exp",     "aten::log",
        "aten::pow",     "aten::rsqrt",      "aten::sqrt",      "aten::sin",        "aten::cos",     "aten::abs",
        "aten::to",      "aten::type_as",    "aten::contiguous", "aten::clone",     "aten::where",   "aten::masked_fill",
        "aten::_to_copy", "aten::float",     "aten::square",    "aten::erf",        "aten::reciprocal", "aten::clamp",
        "aten::maximum", "aten::minimum",    "aten::dropout",   "aten::detach",     "aten::alias",   "aten::softplus",
        "aten::gelu_",   "aten::silu_",      "aten::relu_",     "aten::mul_",       "aten::add_",    "aten::div_",
        "aten::sub_",    "aten::rsub",       "aten::lift_fresh_copy"};
    return ops.count(op) > 0;
  }

  static bool isReduction(const std::string& op) {
    static const std::unordered_set<std::string> ops = {
        "aten::mean", "aten::sum", "aten::amax", "aten::amin", "aten::softmax", "aten::log_softmax", "aten::_softmax",
        "aten::var",  "aten::std", "aten::logsumexp", "aten::layer_norm", "aten::rms_norm"};
    return ops.count(op) > 0;
  }

  static constexpr const char* kFixPlan =
      "keep this layer whole with an explicit tensor_parallel_plan, or set pipeline.tensor_parallel to 1";
  static constexpr const char* kFixDivide =
      "set pipeline.tensor_parallel to a divisor of the model's head counts (num_attention_heads and "
      "num_key_value_heads)";
  static constexpr const char* kFixReduce =
      "the model reduces across the split features (OLMo2's q_norm and k_norm normalize over all heads; an MoE "
      "router's softmax runs over all its experts); keep that layer whole with an explicit tensor_parallel_plan, "
      "or set pipeline.tensor_parallel to 1";
  static constexpr const char* kFixFused =
      "the projection computes several parts at once (a fused qkv or gate_up); keep it whole with an explicit "
      "tensor_parallel_plan, or set pipeline.tensor_parallel to 1";

  const frontend::OpenedModel& opened_;
  Graph& graph_;
  std::unordered_map<const Value*, std::vector<int64_t>> shapes_;
  int degree_;
  bool explicit_;
  bool sequence_parallel_;
  std::set<std::string> keep_whole_;
  bool split_tied_;
  std::set<const void*> tied_whole_;  // across passes: tied tensors not split alike by every use, kept whole
  std::set<int> vocab_outputs_;  // outputs the loss may read split by vocabulary (TpOptions)
  std::set<int> seq_outputs_;    // outputs that may leave as sequence shards (TpOptions)
  std::unordered_map<const Node*, std::pair<bool, std::string>> styled_embeddings_;  // explicit: split?, why
  std::vector<Node*> embeddings_;                                  // vocab-parallel lookups
  std::unordered_map<const Node*, std::string> embedding_whole_;  // embeddings kept whole, and why
  std::vector<Wrap> seq_gathers_;  // sequence parallel: a column linear's input gathered along the sequence
  std::unordered_map<const Node*, std::pair<LinearSplit, std::string>> styled_;  // explicit plans: each linear's style
  std::unordered_map<const void*, int> reads_;             // per tensor (tensorKey)
  std::unordered_map<std::string, const void*> keys_;     // FQN -> its tensor's key

  std::unordered_map<const Node*, std::string> whole_;  // across passes
  std::unordered_map<const Value*, State> state_;
  std::unordered_map<const Value*, std::vector<State>> elements_;
  std::unordered_map<const Value*, State> parts_;  // a list of parts all split alike (chunk, split)
  std::vector<Node*> linears_, columns_, rows_;
  std::vector<int> parent_;
  std::set<int> closed_;
  std::vector<Problem> problems_;
  std::vector<Wrap> wraps_;
  std::vector<Wrap> gathers_;  // split values leaving the stage: {consumer, input, the dim to gather}
  std::vector<int> vocab_split_;  // ... and those that are
  std::vector<std::pair<int, int>> seq_shards_;  // outputs left as sequence shards: (output, dim)
  std::vector<Resize> resizes_;
};

// Every tensor value of the opened graph's top level with its shape, from one
// forward without grad on a copy that returns them all.
std::unordered_map<const Value*, std::vector<int64_t>> recordShapes(const frontend::OpenedModel& opened,
                                                                      const torch::jit::Module& module,
                                                                      const std::vector<at::Tensor>& inputs) {
  Graph& g = opened.graph();
  std::shared_ptr<Graph> copy = g.copy();
  std::vector<const Value*> originals;
  std::vector<Value*> copies;
  for (std::size_t i = 0; i < g.inputs().size(); ++i) {
    if (isTensor(g.inputs()[i])) {
      originals.push_back(g.inputs()[i]);
      copies.push_back(copy->inputs()[i]);
    }
  }
  auto a = g.block()->nodes().begin();
  auto b = copy->block()->nodes().begin();
  for (; a != g.block()->nodes().end(); ++a, ++b) {
    for (std::size_t i = 0; i < a->outputs().size(); ++i) {
      if (isTensor(a->outputs()[i])) {
        originals.push_back(a->outputs()[i]);
        copies.push_back(b->outputs()[i]);
      }
    }
  }
  while (!copy->outputs().empty()) copy->eraseOutput(0);
  Value* all = copy->insertNode(copy->createTuple(copies))->output();
  copy->registerOutput(all);

  torch::jit::GraphFunction fn("pipeforge_tp_shapes", copy, nullptr);
  std::vector<c10::IValue> stack{module._ivalue()};
  for (const auto& t : inputs) stack.emplace_back(t);
  {
    torch::NoGradGuard no_grad;
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    fn.run(stack);
  }
  std::unordered_map<const Value*, std::vector<int64_t>> shapes;
  const auto& values = stack.back().toTupleRef().elements();
  for (std::size_t i = 0; i < originals.size(); ++i) {
    if (values[i].isTensor() && values[i].toTensor().defined()) shapes[originals[i]] = values[i].toTensor().sizes().vec();
  }
  return shapes;
}

frontend::OpenOptions openEverything() {
  frontend::OpenOptions options;
  options.open_all = true;
  return options;
}

void checkDegree(int degree) {
  if (degree < 1) throw TpPlanError(fmt::format("tensor_parallel must be at least 1, got {}", degree));
}

}  // namespace

TpPlan planTensorParallel(const torch::jit::Module& stage, const std::vector<at::Tensor>& example_inputs, int degree,
                          const TpOptions& options) {
  checkDegree(degree);
  if (degree == 1) return TpPlan{};
  frontend::OpenedModel opened(stage, openEverything());
  Planner planner(opened, recordShapes(opened, stage, example_inputs), degree, options);
  planner.run();
  return planner.plan();
}

torch::jit::Module shardForTensorParallel(const torch::jit::Module& stage, const std::vector<at::Tensor>& example_inputs,
                                          int degree, int rank, int group, TpPlan* plan_out,
                                          const TpOptions& options) {
  checkDegree(degree);
  PIPEFORGE_CHECK(rank >= 0 && rank < degree, "tensor-parallel rank out of range");
  if (degree == 1) {
    if (plan_out) *plan_out = TpPlan{};
    return stage;
  }
  ensureOpsRegistered();
  // clone(): a new class type, so replacing forward leaves `stage` alone.
  torch::jit::Module sharded = stage.clone();
  // Module::clone() copies each parameter through Tensor::clone(): a
  // non-leaf, and tied parameters no longer one tensor. Hold the stage's own
  // tensors again (the split ones are replaced by their slices below).
  for (const auto& p : stage.named_parameters(/*recurse=*/true)) {
    auto [owner, name] = frontend::splitPath(p.name);
    frontend::submoduleAt(sharded, owner).register_parameter(name, p.value, /*is_buffer=*/false);
  }
  frontend::OpenedModel opened(sharded, openEverything());
  Planner planner(opened, recordShapes(opened, sharded, example_inputs), degree, options);
  planner.run();
  if (plan_out) *plan_out = planner.plan();

  // A tied tensor (Note [Tied vocabulary]) is sliced once: both attributes hold that one slice.
  std::map<const void*, at::Tensor> slices;
  for (const auto& cut : planner.splitParameters()) {
    auto [owner, name] = frontend::splitPath(cut.fqn);
    torch::jit::Module holder = frontend::submoduleAt(sharded, owner);
    at::Tensor whole = holder.attr(name).toTensor();
    at::Tensor& slice = slices[whole.unsafeGetTensorImpl()];
    if (!slice.defined()) {
      const int64_t block = cut.size / degree;
      slice = whole.detach().narrow(cut.dim, rank * block, block).clone();
      slice.set_requires_grad(whole.requires_grad());
    }
    holder.register_parameter(name, slice, /*is_buffer=*/false);
  }
  planner.rewrite(rank, group);

  auto graph = opened.graph().copy();
  auto type = sharded.type();
  auto cu = sharded._ivalue()->compilation_unit();
  c10::QualifiedName name(*type->name(), "forward");
  type->unsafeRemoveMethod("forward");
  torch::jit::Function* fn = cu->create_function(name, graph, /*shouldMangle=*/true);
  type->addMethod(fn);
  return sharded;
}

}  // namespace pipeforge::tensor_parallel
