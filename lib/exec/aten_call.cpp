#include "exec/aten_call.h"

#include <ATen/core/enum_tag.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <torch/version.h>

#include <sstream>

#include "data/scalar_type.h"
#include "util/error.h"

namespace dawnpiper {

namespace {

using Kind = AtenArg::Kind;

c10::Layout layout_from_name(const std::string& s) {
  if (s == "strided") return c10::kStrided;
  if (s == "sparse_coo") return c10::kSparse;
  throw ConfigError("unsupported layout " + s);
}

c10::MemoryFormat memory_format_from_name(const std::string& s) {
  if (s == "contiguous_format") return c10::MemoryFormat::Contiguous;
  if (s == "preserve_format") return c10::MemoryFormat::Preserve;
  if (s == "channels_last") return c10::MemoryFormat::ChannelsLast;
  if (s == "channels_last_3d") return c10::MemoryFormat::ChannelsLast3d;
  throw ConfigError("unsupported memory format " + s);
}

bool is_tensor_kind(Kind k) { return k == Kind::Tensor || k == Kind::Param || k == Kind::Buffer; }
bool is_number(Kind k) { return k == Kind::Int || k == Kind::Real || k == Kind::Bool; }

// A number where the schema wants a tensor (`add.Tensor(x, 1)`), as Python's argument parser
// passes it: a 0-dim CPU tensor flagged as a wrapped number, so it does not change the result
// type.
at::Tensor wrapped_number(const AtenArg& a) {
  at::Tensor t = a.kind == Kind::Real   ? at::scalar_tensor(a.r, at::kDouble)
                 : a.kind == Kind::Bool ? at::scalar_tensor(a.i != 0, at::kBool)
                                        : at::scalar_tensor(a.i, at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// The schema type with Optional[...] peeled off.
const c10::Type& bare(const c10::TypePtr& t) {
  if (auto o = t->cast<c10::OptionalType>()) return *o->getElementType();
  return *t;
}

struct Converter {
  const std::function<at::Tensor(const AtenArg&)>& tensor;
  at::Device device;

  c10::IValue value(const AtenArg& a, const c10::TypePtr& type) const {
    if (is_number(a.kind) && bare(type).kind() == c10::TypeKind::TensorType) return c10::IValue(wrapped_number(a));
    switch (a.kind) {
      case Kind::None:
        return c10::IValue();
      case Kind::Bool:
        return c10::IValue(a.i != 0);
      case Kind::Int:
        if (bare(type).kind() == c10::TypeKind::FloatType) return c10::IValue(static_cast<double>(a.i));
        return c10::IValue(a.i);
      case Kind::Real:
        return c10::IValue(a.r);
      case Kind::String:
        return c10::IValue(a.s);
      case Kind::Tensor:
      case Kind::Param:
      case Kind::Buffer:
        return c10::IValue(tensor(a));
      case Kind::DType:
        return c10::IValue(static_cast<int64_t>(scalar_type(static_cast<DType>(a.i))));
      case Kind::Device:
        return c10::IValue(device);
      case Kind::Layout:
        return c10::IValue(static_cast<int64_t>(layout_from_name(a.s)));
      case Kind::MemoryFormat:
        return c10::IValue(static_cast<int64_t>(memory_format_from_name(a.s)));
      case Kind::List:
        return list(a, type);
    }
    return c10::IValue();
  }

  c10::IValue list(const AtenArg& a, const c10::TypePtr& type) const {
    const auto* lt = bare(type).castRaw<c10::ListType>();
    const c10::TypePtr elem = lt ? lt->getElementType() : c10::IntType::get();
    const bool optional_elem = elem->kind() == c10::TypeKind::OptionalType;
    const c10::TypeKind k = bare(elem).kind();
    if (k == c10::TypeKind::TensorType) {
      if (optional_elem) {
        c10::List<std::optional<at::Tensor>> out;
        for (const AtenArg& x : a.items)
          out.push_back(x.kind == Kind::None ? std::nullopt : std::optional<at::Tensor>(tensor(x)));
        return c10::IValue(out);
      }
      c10::List<at::Tensor> out;
      for (const AtenArg& x : a.items) out.push_back(tensor(x));
      return c10::IValue(out);
    }
    if (k == c10::TypeKind::FloatType) {
      std::vector<double> out;
      for (const AtenArg& x : a.items) out.push_back(x.kind == Kind::Real ? x.r : static_cast<double>(x.i));
      return c10::IValue(out);
    }
    if (k == c10::TypeKind::BoolType) {
      c10::List<bool> out;
      for (const AtenArg& x : a.items) out.push_back(x.i != 0);
      return c10::IValue(out);
    }
    std::vector<int64_t> out;  // int[], SymInt[] (and their fixed-size forms)
    for (const AtenArg& x : a.items) out.push_back(x.i);
    return c10::IValue(out);
  }
};

// Appends the returned tensors, tensor lists flattened (None stays a slot).
void flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor())
    out.push_back(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
  else if (v.isList())
    for (const c10::IValue& x : v.toListRef()) flatten(x, out);
  else if (v.isTuple())
    for (const c10::IValue& x : v.toTupleRef().elements()) flatten(x, out);
  else
    out.push_back(at::Tensor());
}

}  // namespace

AtenKernel::AtenKernel(const Node& node) {
  const AtenCall& c = node.call;
  op_ = c10::Dispatcher::singleton().findSchema({c.op, c.overload});
  if (!op_)
    throw ConfigError("node " + node.name + " calls " + c.qualified() +
                      ", an operator this LibTorch (" TORCH_VERSION ") does not know");
  const c10::FunctionSchema& schema = op_->schema();
  if (schema.arguments().size() != c.args.size()) {
    std::ostringstream text;
    text << schema;
    throw ConfigError("node " + node.name + " gives " + std::to_string(c.args.size()) + " arguments to " +
                      c.qualified() + ", whose schema takes " + std::to_string(schema.arguments().size()) + ": " +
                      text.str());
  }
  for (size_t i = 0; i < c.args.size(); ++i) {
    const c10::TypeKind k = bare(schema.arguments()[i].type()).kind();
    const bool wants_tensor = k == c10::TypeKind::TensorType;
    if (wants_tensor && c.args[i].kind != Kind::None && !is_tensor_kind(c.args[i].kind) && !is_number(c.args[i].kind))
      throw ConfigError("node " + node.name + ": argument " + schema.arguments()[i].name() + " of " + c.qualified() +
                        " must be a tensor");
  }
  for (size_t i = 0; i < schema.arguments().size(); ++i)
    if (schema.arguments()[i].name() == "dropout_p") dropout_arg_ = static_cast<int>(i);
  seeded_ = op_->hasTag(at::Tag::nondeterministic_seeded);  // scaled_dot_product_attention has it
}

std::vector<at::Tensor> AtenKernel::call(const Node& node, const std::function<at::Tensor(const AtenArg&)>& tensor,
                                         at::Device device, bool no_dropout) const {
  const c10::FunctionSchema& schema = op_->schema();
  const Converter convert{tensor, device};
  torch::jit::Stack stack;
  stack.reserve(node.call.args.size());
  for (size_t i = 0; i < node.call.args.size(); ++i)
    stack.push_back(no_dropout && static_cast<int>(i) == dropout_arg_
                        ? c10::IValue(0.0)
                        : convert.value(node.call.args[i], schema.arguments()[i].type()));
  op_->callBoxed(stack);
  std::vector<at::Tensor> results;
  for (const c10::IValue& v : stack) flatten(v, results);
  std::vector<at::Tensor> outputs;
  for (int k : node.call.result_index) {
    if (k < 0 || k >= static_cast<int>(results.size()))
      throw std::logic_error("node " + node.name + ": " + node.call.qualified() + " returned " +
                             std::to_string(results.size()) + " tensors");
    outputs.push_back(results[static_cast<size_t>(k)]);
  }
  return outputs;
}

}  // namespace dawnpiper
