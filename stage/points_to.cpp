#include "stage/points_to.h"

#include <ATen/core/alias_info.h>
#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "frontend/graph_reads.h"
#include "frontend/module_paths.h"

namespace pipeforge::stage {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// Deeper calls than this are treated as ops the analysis cannot read.
constexpr int kMaxCallDepth = 64;

bool isModuleType(const c10::TypePtr& type) {
  auto cls = type->cast<c10::ClassType>();
  return cls && cls->is_module();
}

// Values whose memory may be shared or changed: tensors, lists, dicts,
// tuples holding them, objects. Ints, strings and modules are not tracked
// (modules are reached by their attribute paths instead).
bool mutableType(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::ListType:
    case c10::TypeKind::DictType:
    case c10::TypeKind::FutureType:
    case c10::TypeKind::AnyType:
    case c10::TypeKind::StorageType:
      return true;
    case c10::TypeKind::ClassType:
      return !isModuleType(type);
    case c10::TypeKind::OptionalType:
    case c10::TypeKind::TupleType:
    case c10::TypeKind::UnionType: {
      const auto contained = type->containedTypes();
      return std::any_of(contained.begin(), contained.end(), [](const c10::TypePtr& t) { return mutableType(t); });
    }
    default:
      return false;
  }
}

bool tracked(const Value* v) { return mutableType(v->type()); }

// Types whose values hold other values.
bool isContainer(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto optional = t->cast<c10::OptionalType>()) t = optional->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::ListType:
    case c10::TypeKind::DictType:
    case c10::TypeKind::TupleType:
    case c10::TypeKind::FutureType:
    case c10::TypeKind::AnyType:
    case c10::TypeKind::UnionType:
      return true;
    case c10::TypeKind::ClassType:
      return !isModuleType(t);
    default:
      return false;
  }
}

// prim:: ops with no schema that neither write nor share memory: their
// tracked outputs (if any) are new.
bool isFreshPrim(const Node* n) {
  static const char* const kinds[] = {
      "prim::Uninitialized", "prim::RaiseException", "prim::Print",         "prim::NumToTensor",
      "prim::isinstance",    "prim::TypeCheck",      "prim::dtype",         "prim::device",
      "prim::layout",        "prim::requires_grad",  "prim::is_cuda",       "prim::AutogradZero",
  };
  const std::string kind = n->kind().toQualString();
  return std::any_of(std::begin(kinds), std::end(kinds), [&](const char* k) { return kind == k; });
}

}  // namespace

struct PointsTo::Impl {
  struct Var {
    std::set<ObjectId> pts;
    std::set<int> copy_to;
    std::vector<int> load_to;     // this var is a container; its contents flow to these
    std::vector<int> store_from;  // this var is a container; these flow into its contents
  };
  struct Context {
    std::optional<std::string> module_path;  // the module whose method this is, when known
    int depth = 0;
  };
  struct PendingWrite {
    const Node* top;
    int var;          // -1: `fixed` names the object
    bool contents;    // the var's contents, not the var's objects
    ObjectId fixed;
    std::string op;
  };

  const torch::jit::Module& module;
  Graph& graph;
  std::vector<Var> vars;
  std::vector<MemoryObject> objects;
  std::vector<int> content_var;  // per object
  std::map<std::pair<int, const Value*>, int> var_of;
  std::vector<Context> contexts;
  std::vector<int> worklist;
  std::vector<char> queued;
  int wildcard_var = -1;
  ObjectId opaque = -1;

  // Module attributes: one object per piece of memory (tied names share one).
  struct AttributeInfo {
    const void* identity = nullptr;  // tensor / list / dict / object identity; null: keyed by path
    bool is_tensor = false;
    bool is_parameter = false;
    bool is_container = false;
  };
  std::map<std::string, AttributeInfo> attribute_info;          // path -> info
  std::map<const void*, std::vector<std::string>> names_of_identity;
  std::map<const void*, ObjectId> object_of_identity;
  std::map<std::string, ObjectId> object_of_path;
  std::map<ObjectId, int> slot_of;  // attribute object -> var holding what the attribute currently is

  std::vector<PendingWrite> pending_writes;
  std::unordered_map<const Node*, std::vector<MemoryWrite>> writes;
  std::unordered_map<const Node*, std::set<ObjectId>> touched;
  std::unordered_map<const Node*, std::vector<int>> input_vars;  // top-level node -> vars of what it reads
  std::unordered_map<const Value*, ObjectId> getattr_object;
  std::vector<std::string> unread_ops;

  Impl(const torch::jit::Module& m, Graph& g) : module(m), graph(g) {
    std::set<std::string> parameters;
    for (const auto& p : module.named_parameters(/*recurse=*/true)) parameters.insert(p.name);
    for (const auto& a : module.named_attributes(/*recurse=*/true)) {
      if (a.value.isModule()) continue;
      AttributeInfo info;
      info.is_tensor = a.value.isTensor();
      info.is_parameter = parameters.count(a.name) != 0;
      info.is_container = a.value.isList() || a.value.isGenericDict() || a.value.isTuple() || a.value.isObject();
      if (info.is_tensor) {
        info.identity = a.value.toTensor().unsafeGetTensorImpl();
      } else if (info.is_container) {
        info.identity = a.value.internalToPointer();
      }
      if (info.identity) names_of_identity[info.identity].push_back(a.name);
      attribute_info[a.name] = info;
    }
    for (auto& [identity, names] : names_of_identity) std::sort(names.begin(), names.end());

    contexts.push_back({std::string(), 0});
    wildcard_var = newVar();
    opaque = newObject(MemoryObject::Kind::kOpaque, "memory passed in from outside the model");
    addBase(content_var[opaque], opaque);
    addBase(wildcard_var, opaque);

    for (size_t i = 1; i < graph.inputs().size(); ++i) {
      Value* in = graph.inputs()[i];
      if (!tracked(in)) continue;
      ObjectId obj = newObject(MemoryObject::Kind::kModelInput, "input " + in->debugName());
      objects[obj].value = in;
      addBase(var(0, in), obj);
      if (isContainer(in->type())) {
        ObjectId inside = newObject(MemoryObject::Kind::kModelInput, "contents of input " + in->debugName());
        objects[inside].value = in;
        addBase(content_var[obj], inside);
        addBase(content_var[inside], inside);
      }
    }
    walkBlock(graph.block(), 0, nullptr);
    solve();
    for (const PendingWrite& w : pending_writes) {
      std::set<ObjectId> written;
      if (w.fixed >= 0) {
        written.insert(w.fixed);
      } else {
        for (ObjectId o : vars[w.var].pts) {
          if (!w.contents) {
            written.insert(o);
            continue;
          }
          const auto& inside = vars[content_var[o]].pts;
          written.insert(inside.begin(), inside.end());
        }
      }
      auto& list = writes[w.top];
      for (ObjectId o : written) {
        bool seen = std::any_of(list.begin(), list.end(), [&](const MemoryWrite& m) { return m.object == o; });
        if (!seen) list.push_back({o, w.op});
      }
    }
  }

  // ---- the constraint graph -------------------------------------------------

  int newVar() {
    vars.emplace_back();
    queued.push_back(0);
    return static_cast<int>(vars.size()) - 1;
  }

  ObjectId newObject(MemoryObject::Kind kind, std::string name) {
    MemoryObject obj;
    obj.kind = kind;
    obj.name = std::move(name);
    objects.push_back(std::move(obj));
    content_var.push_back(newVar());
    return static_cast<ObjectId>(objects.size()) - 1;
  }

  int var(int ctx, const Value* v) {
    auto [it, inserted] = var_of.try_emplace({ctx, v}, -1);
    if (inserted) it->second = newVar();
    return it->second;
  }

  void enqueue(int v) {
    if (queued[v]) return;
    queued[v] = 1;
    worklist.push_back(v);
  }

  void addBase(int v, ObjectId obj) {
    if (vars[v].pts.insert(obj).second) enqueue(v);
  }

  void unionInto(int to, const std::set<ObjectId>& from) {
    bool grew = false;
    for (ObjectId o : from) grew = vars[to].pts.insert(o).second || grew;
    if (grew) enqueue(to);
  }

  void addCopy(int from, int to) {
    if (from == to || !vars[from].copy_to.insert(to).second) return;
    std::set<ObjectId> pts = vars[from].pts;
    unionInto(to, pts);
  }

  void addLoad(int container, int to) {
    vars[container].load_to.push_back(to);
    enqueue(container);
  }

  void addStore(int container, int from) {
    vars[container].store_from.push_back(from);
    enqueue(container);
  }

  void solve() {
    while (!worklist.empty()) {
      int v = worklist.back();
      worklist.pop_back();
      queued[v] = 0;
      std::vector<ObjectId> pts(vars[v].pts.begin(), vars[v].pts.end());
      std::vector<int> loads = vars[v].load_to;
      std::vector<int> stores = vars[v].store_from;
      for (ObjectId o : pts) {
        for (int to : loads) addCopy(content_var[o], to);
        for (int from : stores) addCopy(from, content_var[o]);
      }
      std::vector<int> succ(vars[v].copy_to.begin(), vars[v].copy_to.end());
      std::set<ObjectId> now = vars[v].pts;
      for (int to : succ) unionInto(to, now);
    }
  }

  // ---- objects ----------------------------------------------------------------

  ObjectId made(int ctx, const Value* v) {
    std::string name = "%" + v->debugName();
    const auto& path = contexts[ctx].module_path;
    if (ctx != 0) name += path && !path->empty() ? fmt::format(" (inside `{}`)", *path) : " (inside a call)";
    ObjectId obj = newObject(MemoryObject::Kind::kMade, name);
    if (ctx == 0) objects[obj].value = v;
    return obj;
  }

  ObjectId attributeObject(const std::string& path) {
    auto info_it = attribute_info.find(path);
    const AttributeInfo info = info_it == attribute_info.end() ? AttributeInfo{} : info_it->second;
    if (info.identity) {
      auto it = object_of_identity.find(info.identity);
      if (it != object_of_identity.end()) return it->second;
    } else {
      auto it = object_of_path.find(path);
      if (it != object_of_path.end()) return it->second;
    }
    ObjectId obj = newObject(MemoryObject::Kind::kAttribute, path);
    objects[obj].fqns = info.identity ? names_of_identity.at(info.identity) : std::vector<std::string>{path};
    objects[obj].name = objects[obj].fqns.front();
    objects[obj].is_tensor = info.is_tensor;
    objects[obj].is_parameter = info.is_parameter;
    if (info.is_container) {
      ObjectId inside = newObject(MemoryObject::Kind::kAttribute, "contents of " + objects[obj].name);
      objects[inside].fqns = objects[obj].fqns;
      addBase(content_var[obj], inside);
      addBase(content_var[inside], inside);
    }
    if (info.identity) {
      object_of_identity[info.identity] = obj;
    } else {
      object_of_path[path] = obj;
    }
    return obj;
  }

  int slot(ObjectId obj) {
    auto it = slot_of.find(obj);
    if (it != slot_of.end()) return it->second;
    int v = newVar();
    addBase(v, obj);
    slot_of[obj] = v;
    return v;
  }

  // The FQN a module-valued or attribute value stands for in context `ctx`.
  std::optional<std::string> pathIn(int ctx, const Value* v) const {
    const auto& base = contexts[ctx].module_path;
    if (!base) return std::nullopt;
    auto relative = frontend::attributePath(v);
    if (!relative) return std::nullopt;
    return frontend::joinPath(*base, *relative);
  }

  std::string describe(const Node* n, int ctx) const {
    std::string text = describeOp(n);
    const auto& path = contexts[ctx].module_path;
    if (ctx != 0) text += path && !path->empty() ? fmt::format(" inside `{}`", *path) : " inside a called function";
    return text;
  }

  void write(const Node* top, int v, bool contents, const Node* n, int ctx) {
    pending_writes.push_back({top, v, contents, -1, describe(n, ctx)});
  }

  // ---- the walk ---------------------------------------------------------------

  void walkBlock(Block* block, int ctx, const Node* top) {
    for (Node* n : block->nodes()) {
      const Node* t = top ? top : n;
      if (!top) {
        for (Value* in : frontend::externalInputs(n)) {
          if (tracked(in)) input_vars[n].push_back(var(0, in));
        }
      }
      visit(n, ctx, t);
    }
  }

  void freshOutputs(Node* n, int ctx) {
    for (Value* out : n->outputs()) {
      if (tracked(out)) addBase(var(ctx, out), made(ctx, out));
    }
  }

  void visit(Node* n, int ctx, const Node* top) {
    const c10::Symbol kind = n->kind();
    if (kind == c10::prim::Constant) {
      for (Value* out : n->outputs()) {
        if (!tracked(out)) continue;
        ObjectId obj = newObject(MemoryObject::Kind::kConstant, "constant %" + out->debugName());
        addBase(var(ctx, out), obj);
      }
      return;
    }
    if (kind == c10::prim::GetAttr) return visitGetAttr(n, ctx, top);
    if (kind == c10::prim::SetAttr) return visitSetAttr(n, ctx, top);
    if (kind == c10::prim::If) {
      for (Block* b : n->blocks()) walkBlock(b, ctx, top);
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        if (!tracked(n->output(i))) continue;
        for (Block* b : n->blocks()) addCopy(var(ctx, b->outputs()[i]), var(ctx, n->output(i)));
      }
      return;
    }
    if (kind == c10::prim::Loop) {
      // inputs: trip count, condition, carried...; body inputs: iteration, carried...;
      // body outputs: condition, carried...; outputs: carried...
      Block* body = n->blocks()[0];
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        if (!tracked(n->output(i))) continue;
        int init = var(ctx, n->input(i + 2));
        int in = var(ctx, body->inputs()[i + 1]);
        int next = var(ctx, body->outputs()[i + 1]);
        int out = var(ctx, n->output(i));
        addCopy(init, in);
        addCopy(next, in);
        addCopy(next, out);
        addCopy(init, out);
      }
      walkBlock(body, ctx, top);
      return;
    }
    if (kind == c10::prim::CallMethod || kind == c10::prim::CallFunction) return visitCall(n, ctx, top);
    if (kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct || kind == c10::prim::DictConstruct) {
      int out = var(ctx, n->output());
      addBase(out, made(ctx, n->output()));
      for (Value* in : n->inputs()) {
        if (tracked(in)) addStore(out, var(ctx, in));
      }
      return;
    }
    if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack || kind == c10::prim::TupleIndex) {
      if (!tracked(n->input(0))) return freshOutputs(n, ctx);
      for (Value* out : n->outputs()) {
        if (tracked(out)) addLoad(var(ctx, n->input(0)), var(ctx, out));
      }
      return;
    }
    if (kind == c10::prim::unchecked_cast || kind == c10::Symbol::fromQualString("prim::unchecked_unwrap_optional")) {
      if (tracked(n->output()) && tracked(n->input(0))) addCopy(var(ctx, n->input(0)), var(ctx, n->output()));
      return;
    }
    if (isFreshPrim(n)) return freshOutputs(n, ctx);
    const c10::FunctionSchema* schema = n->maybeSchema();
    const torch::jit::Operator* op = n->maybeOperator();
    if (schema && op) {
      auto analysis = op->aliasAnalysisKind();
      if (analysis == c10::AliasAnalysisKind::FROM_SCHEMA || analysis == c10::AliasAnalysisKind::PURE_FUNCTION) {
        return applySchema(n, *schema, ctx, top);
      }
    }
    conservative(n, ctx, top);
  }

  void visitGetAttr(Node* n, int ctx, const Node* top) {
    Value* out = n->output();
    if (isModuleType(out->type())) return;
    Value* from = n->input(0);
    if (!isModuleType(from->type())) {
      // A field of an object: something inside the object.
      if (tracked(out) && tracked(from)) addLoad(var(ctx, from), var(ctx, out));
      return;
    }
    auto path = pathIn(ctx, out);
    ObjectId obj = path ? attributeObject(*path) : opaque;
    touched[top].insert(obj);
    if (ctx == 0 && n->owningBlock() == graph.block()) getattr_object[out] = obj;
    if (tracked(out)) addCopy(slot(obj), var(ctx, out));
  }

  void visitSetAttr(Node* n, int ctx, const Node* top) {
    Value* target = n->input(0);
    Value* value = n->input(1);
    if (isModuleType(target->type())) {
      auto base = pathIn(ctx, target);
      ObjectId obj = base ? attributeObject(frontend::joinPath(*base, n->s(c10::attr::name))) : opaque;
      touched[top].insert(obj);
      pending_writes.push_back({top, -1, false, obj, describe(n, ctx)});
      if (tracked(value)) addCopy(var(ctx, value), slot(obj));
      return;
    }
    if (!tracked(target)) return;
    int t = var(ctx, target);
    write(top, t, false, n, ctx);
    if (tracked(value)) addStore(t, var(ctx, value));
  }

  void visitCall(Node* n, int ctx, const Node* top) {
    torch::jit::Function* fn = nullptr;
    std::optional<std::string> path;
    std::vector<std::pair<Value*, size_t>> args;  // caller value -> callee graph input index
    if (n->kind() == c10::prim::CallMethod) {
      auto cls = n->input(0)->type()->cast<c10::ClassType>();
      if (cls) fn = cls->findMethod(n->s(c10::attr::name));
      bool on_module = cls && cls->is_module();
      if (on_module) path = pathIn(ctx, n->input(0));
      for (size_t i = on_module ? 1 : 0; i < n->inputs().size(); ++i) args.emplace_back(n->input(i), i);
    } else {
      auto fn_type = n->input(0)->type()->cast<c10::FunctionType>();
      if (fn_type) fn = fn_type->function();
      for (size_t i = 1; i < n->inputs().size(); ++i) args.emplace_back(n->input(i), i - 1);
    }
    if (!fn || !fn->isGraphFunction() || contexts[ctx].depth >= kMaxCallDepth) return conservative(n, ctx, top);
    fn->ensure_defined();
    std::shared_ptr<Graph> callee = torch::jit::toGraphFunction(*fn).graph();
    if (callee->inputs().size() != (n->kind() == c10::prim::CallMethod ? n->inputs().size() : n->inputs().size() - 1)) {
      return conservative(n, ctx, top);
    }
    contexts.push_back({path, contexts[ctx].depth + 1});
    int inner = static_cast<int>(contexts.size()) - 1;
    for (const auto& [value, index] : args) {
      if (tracked(value)) addCopy(var(ctx, value), var(inner, callee->inputs()[index]));
    }
    walkBlock(callee->block(), inner, top);
    for (size_t j = 0; j < n->outputs().size() && j < callee->outputs().size(); ++j) {
      if (tracked(n->output(j))) addCopy(var(inner, callee->outputs()[j]), var(ctx, n->output(j)));
    }
  }

  // Binds the schema's alias annotations to the node's values (see the file comment).
  // What a node's inputs are to its schema's alias annotations, gathered
  // before its outputs are bound.
  struct SchemaInputs {
    std::map<c10::Symbol, std::vector<int>> in_set;           // alias set -> input vars
    std::map<c10::Symbol, std::vector<int>> contents_in_set;  // alias set -> input vars whose contents are in it
    std::vector<int> containers, written_containers, entering;
    std::vector<c10::TypePtr> element_types;  // of the container inputs
    int written_first = -1;                   // the first input, when the op writes it
  };

  void applySchema(Node* n, const c10::FunctionSchema& schema, int ctx, const Node* top) {
    if (!schema.is_vararg() && n->inputs().size() != schema.arguments().size()) return conservative(n, ctx, top);
    SchemaInputs ins = readSchemaInputs(n, schema.arguments(), ctx, top);
    for (size_t j = 0; j < n->outputs().size(); ++j) bindSchemaOutput(n, j, schema.returns(), ins, ctx);
    storeIntoWrittenContainers(ins);
  }

  // Records the inputs' alias sets and the writes the annotations declare.
  SchemaInputs readSchemaInputs(Node* n, const std::vector<c10::Argument>& args, int ctx, const Node* top) {
    SchemaInputs ins;
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      Value* in = n->input(i);
      if (!tracked(in)) continue;
      int v = var(ctx, in);
      bool container = isContainer(in->type());
      if (container) {
        ins.containers.push_back(v);
        for (const c10::TypePtr& t : in->type()->containedTypes()) ins.element_types.push_back(t);
      }
      if (i >= args.size()) continue;
      // Running statistics are written without an annotation (aten::batch_norm, instance_norm).
      const std::string& arg_name = args[i].name();
      if (arg_name == "running_mean" || arg_name == "running_var") write(top, v, false, n, ctx);
      const c10::AliasInfo* info = args[i].alias_info();
      if (!info) continue;
      for (c10::Symbol set : info->beforeSets()) {
        if (set != c10::AliasInfo::wildcardSet()) ins.in_set[set].push_back(v);
      }
      if (info->isWrite()) {
        write(top, v, false, n, ctx);
        if (container) ins.written_containers.push_back(v);
        if (i == 0) ins.written_first = v;
      }
      if (info->isWildcardAfter()) ins.entering.push_back(v);
      for (const c10::AliasInfo& inside : info->containedTypes()) {
        for (c10::Symbol set : inside.beforeSets()) ins.contents_in_set[set].push_back(v);
        if (inside.isWrite()) write(top, v, true, n, ctx);
      }
    }
    return ins;
  }

  // Binds output `j` to what its annotation says it may be: an input, what
  // is inside one, or something new (which may hold what the inputs held).
  void bindSchemaOutput(Node* n, size_t j, const std::vector<c10::Argument>& rets, SchemaInputs& ins, int ctx) {
    Value* out = n->output(j);
    if (!tracked(out)) return;
    int o = var(ctx, out);
    const c10::AliasInfo* info = j < rets.size() ? rets[j].alias_info() : nullptr;
    bool bound = false;
    if (info) {
      for (c10::Symbol set : info->beforeSets()) {
        if (set == c10::AliasInfo::wildcardSet()) {
          bool element = std::any_of(ins.element_types.begin(), ins.element_types.end(),
                                     [&](const c10::TypePtr& t) { return *t == *out->type(); });
          if (!element && isContainer(out->type()) && !ins.containers.empty()) {
            // `values(Dict(str, t) self) -> t[](*)`: a new list of what the containers hold.
            addBase(o, made(ctx, out));
            shareContents(o, ins.containers, out->type());
          } else {
            // `t(*)`: something inside one of the containers it was given.
            for (int c : ins.containers) addLoad(c, o);
            if (ins.containers.empty()) addCopy(wildcard_var, o);
          }
          bound = true;
          continue;
        }
        for (int v : ins.in_set[set]) {
          addCopy(v, o);
          bound = true;
        }
        for (int v : ins.contents_in_set[set]) {
          addLoad(v, o);
          bound = true;
        }
      }
    }
    if (!bound && ins.written_first >= 0 && j == 0 && n->kind().toUnqualString()[0] != '_' &&
        std::string(n->kind().toUnqualString()).back() == '_' && *out->type() == *n->input(0)->type()) {
      // An in-place op returns what it changed, annotated or not (`add_.t(t[](a!) self, t[] b) -> t[]`).
      addCopy(ins.written_first, o);
      bound = true;
    }
    if (!bound) {
      addBase(o, made(ctx, out));
      // A new container may hold what the containers it was given held (aten::list, slicing).
      if (isContainer(out->type())) shareContents(o, ins.containers, out->type());
    }
    if (info) {
      for (const c10::AliasInfo& inside : info->containedTypes()) {
        for (c10::Symbol set : inside.beforeSets()) {
          for (int v : ins.in_set[set]) addStore(o, v);
          for (int v : ins.contents_in_set[set]) {
            int tmp = newVar();
            addLoad(v, tmp);
            addStore(o, tmp);
          }
        }
      }
    }
  }

  void storeIntoWrittenContainers(const SchemaInputs& ins) {
    // What other containers hold may go inside the one the op writes (`extend(t[](a!) self, t[] other)`).
    for (int w : ins.written_containers) {
      for (int c : ins.containers) {
        if (c == w) continue;
        int tmp = newVar();
        addLoad(c, tmp);
        addStore(w, tmp);
      }
    }
    // `t(c -> *)`: the value goes inside the container the op writes.
    const auto& targets = ins.written_containers.empty() ? ins.containers : ins.written_containers;
    for (int v : ins.entering) {
      for (int c : targets) addStore(c, v);
      if (targets.empty()) addCopy(v, wildcard_var);
    }
  }

  // New container `o` holds what `containers` hold. When its elements are
  // themselves containers (`items() -> (str, t)[]`), their structure is not
  // known: one object that holds itself and everything stands for all levels.
  void shareContents(int o, const std::vector<int>& containers, const c10::TypePtr& type) {
    const auto contained = type->containedTypes();
    bool nested = std::any_of(contained.begin(), contained.end(), [](const c10::TypePtr& t) { return isContainer(t); });
    int target = o;
    if (nested) {
      ObjectId blob = newObject(MemoryObject::Kind::kMade, "the elements of a container");
      addBase(content_var[blob], blob);
      int holder = newVar();
      addBase(holder, blob);
      addStore(o, holder);
      target = holder;
    }
    for (int c : containers) {
      int tmp = newVar();
      addLoad(c, tmp);
      addStore(target, tmp);
    }
  }

  // An op the analysis cannot read: it may write every input and return any of them.
  void conservative(Node* n, int ctx, const Node* top) {
    bool effect = std::any_of(n->inputs().begin(), n->inputs().end(), [](const Value* v) { return tracked(v); }) ||
                  std::any_of(n->outputs().begin(), n->outputs().end(), [](const Value* v) { return tracked(v); });
    if (effect) unread_ops.push_back(describe(n, ctx));
    std::vector<int> ins;
    for (Value* in : n->inputs()) {
      if (!tracked(in)) continue;
      int v = var(ctx, in);
      ins.push_back(v);
      write(top, v, false, n, ctx);
      if (isContainer(in->type())) write(top, v, true, n, ctx);
    }
    for (Value* out : n->outputs()) {
      if (!tracked(out)) continue;
      int o = var(ctx, out);
      addBase(o, made(ctx, out));
      for (int v : ins) {
        addCopy(v, o);
        addLoad(v, o);
        if (isContainer(out->type())) addStore(o, v);
      }
    }
    for (Block* b : n->blocks()) walkBlock(b, ctx, top);
  }

  // ---- queries --------------------------------------------------------------

  std::vector<ObjectId> closure(std::set<ObjectId> start) const {
    std::vector<ObjectId> todo(start.begin(), start.end());
    while (!todo.empty()) {
      ObjectId o = todo.back();
      todo.pop_back();
      for (ObjectId inside : vars[content_var[o]].pts) {
        if (start.insert(inside).second) todo.push_back(inside);
      }
    }
    return {start.begin(), start.end()};
  }
};

std::string describeOp(const Node* node) {
  std::string text = node->kind().toQualString();
  std::string where = frontend::sourceLocation(node);
  return where.empty() ? text : text + " at " + where;
}

PointsTo::PointsTo(const torch::jit::Module& module, Graph& graph) : impl_(std::make_unique<Impl>(module, graph)) {}
PointsTo::~PointsTo() = default;
PointsTo::PointsTo(PointsTo&&) noexcept = default;
PointsTo& PointsTo::operator=(PointsTo&&) noexcept = default;

const MemoryObject& PointsTo::object(ObjectId id) const { return impl_->objects.at(id); }
size_t PointsTo::numObjects() const { return impl_->objects.size(); }

std::vector<ObjectId> PointsTo::pointsTo(const Value* value) const {
  auto it = impl_->var_of.find({0, value});
  if (it == impl_->var_of.end()) return {};
  const auto& pts = impl_->vars[it->second].pts;
  return {pts.begin(), pts.end()};
}

std::vector<ObjectId> PointsTo::reachable(const Value* value) const {
  auto pts = pointsTo(value);
  return impl_->closure({pts.begin(), pts.end()});
}

std::vector<ObjectId> PointsTo::contents(ObjectId object) const {
  const auto& pts = impl_->vars[impl_->content_var.at(object)].pts;
  return {pts.begin(), pts.end()};
}

const std::vector<MemoryWrite>& PointsTo::writes(const Node* node) const {
  static const std::vector<MemoryWrite> kNone;
  auto it = impl_->writes.find(node);
  return it == impl_->writes.end() ? kNone : it->second;
}

std::vector<ObjectId> PointsTo::reads(const Node* node) const {
  std::set<ObjectId> start;
  auto in = impl_->input_vars.find(node);
  if (in != impl_->input_vars.end()) {
    for (int v : in->second) start.insert(impl_->vars[v].pts.begin(), impl_->vars[v].pts.end());
  }
  auto t = impl_->touched.find(node);
  if (t != impl_->touched.end()) start.insert(t->second.begin(), t->second.end());
  return impl_->closure(std::move(start));
}

std::vector<ObjectId> PointsTo::attributesTouched(const Node* node) const {
  auto t = impl_->touched.find(node);
  if (t == impl_->touched.end()) return {};
  return {t->second.begin(), t->second.end()};
}

const std::vector<std::string>& PointsTo::unreadOps() const { return impl_->unread_ops; }

ObjectId PointsTo::attributeOf(const Value* value) const {
  auto it = impl_->getattr_object.find(value);
  return it == impl_->getattr_object.end() ? -1 : it->second;
}

}  // namespace pipeforge::stage
