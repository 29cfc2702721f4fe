// The vocabulary of FSDP2's profiler ranges and of Kineto's operator arguments.
#include "internal/vocabulary.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace fsdplab::kineto::internal {

// "FSDP::pre_forward (layers.0) [pg=2]" -> label "pre_forward", fqn "layers.0".
FsdpRange ParseFsdpName(std::string_view name) {
  FsdpRange r;
  if (!name.starts_with("FSDP::")) return r;
  std::string_view rest = name.substr(6);
  if (rest.ends_with("]")) {
    if (std::size_t p = rest.rfind(" ["); p != std::string_view::npos) rest = rest.substr(0, p);
  }
  std::string_view label = rest;
  if (rest.ends_with(")")) {
    if (std::size_t p = rest.rfind(" ("); p != std::string_view::npos) {
      r.fqn = std::string(rest.substr(p + 2, rest.size() - p - 3));
      label = rest.substr(0, p);
    }
  }
  if (std::size_t sp = label.find(' '); sp != std::string_view::npos) label = label.substr(0, sp);
  if (label == "pre_forward") {
    r.hook = Hook::kPreForward;
  } else if (label == "post_forward") {
    r.hook = Hook::kPostForward;
  } else if (label == "pre_backward") {
    r.hook = Hook::kPreBackward;
  } else if (label == "post_backward" || label == "post_backward_reshard") {
    r.hook = Hook::kPostBackward;
  } else if (label == "all_gather") {
    r.hook = Hook::kAllGather;
  } else if (label == "all_gather_copy_out") {
    r.hook = Hook::kCopyOut;
  } else if (label == "post_backward_reduce") {
    r.hook = Hook::kReduce;
  } else if (label == "root_post_backward_callback") {
    r.hook = Hook::kBackwardEnd;
  }
  return r;
}

bool IsUnitHook(Hook h) {
  return h == Hook::kPreForward || h == Hook::kPostForward || h == Hook::kPreBackward ||
         h == Hook::kPostBackward;
}

// Operators a module's forward calls and no autograd backward formula does: seen inside a
// backward function, they are a recomputation (activation checkpointing).
bool IsForwardOp(std::string_view n) {
  static constexpr std::string_view kOps[] = {
      "aten::linear",     "aten::addmm",
      "aten::layer_norm", "aten::rms_norm",
      "aten::group_norm", "aten::batch_norm",
      "aten::embedding",  "aten::conv1d",
      "aten::conv2d",     "aten::conv3d",
      "aten::dropout",    "aten::relu",
      "aten::gelu",       "aten::silu",
      "aten::softmax",    "aten::scaled_dot_product_attention"};
  return std::find(std::begin(kOps), std::end(kOps), n) != std::end(kOps);
}

std::optional<Bytes> ElementBytes(std::string_view type) {
  // Operator input types (record_shapes) and record_param_comms dtypes (c10 ScalarType names).
  if (type == "float" || type == "Float" || type == "int" || type == "Int") return 4;
  if (type == "double" || type == "Double" || type == "long int" || type == "Long") return 8;
  if (type == "c10::BFloat16" || type == "BFloat16" || type == "c10::Half" || type == "Half" ||
      type == "short int" || type == "Short") {
    return 2;
  }
  if (type.find("Float8") != std::string_view::npos || type == "unsigned char" ||
      type == "signed char" || type == "Byte" || type == "Char" || type == "bool" ||
      type == "Bool") {
    return 1;
  }
  return std::nullopt;
}

std::optional<DType> ParamDType(std::string_view type) {
  if (type == "float" || type == "Float") return DType::kFp32;
  if (type == "c10::BFloat16" || type == "BFloat16") return DType::kBf16;
  if (type == "c10::Half" || type == "Half") return DType::kFp16;
  return std::nullopt;
}

namespace {
// Whether the file of a "python_function" event ("<path>(<line>): <function>") lies under the
// package folder `dir` ("torch/distributed/fsdp/_fully_shard"): the path is relative or
// absolute, with / or (a Windows install) \\.
bool FrameUnder(std::string_view name, std::string_view dir) {
  const std::string_view file = name.substr(0, name.find('('));
  for (std::size_t at = file.find(dir); at != std::string_view::npos; at = file.find(dir, at + 1)) {
    const bool starts = at == 0 || file[at - 1] == '/' || file[at - 1] == '\\';
    const std::size_t after = at + dir.size();
    if (starts && after < file.size() && (file[after] == '/' || file[after] == '\\')) return true;
  }
  return false;
}
bool FrameUnderAny(std::string_view name, std::string_view slash, std::string_view backslash) {
  return FrameUnder(name, slash) || FrameUnder(name, backslash);
}
}  // namespace

bool IsFsdpFrame(std::string_view name) {
  return FrameUnderAny(name, "torch/distributed/fsdp/_fully_shard",
                       "torch\\distributed\\fsdp\\_fully_shard");
}

bool IsRecorderFrame(std::string_view name) {
  return FrameUnderAny(name, "fsdplab/torch", "fsdplab\\torch");
}

std::string UnitName(const std::string& fqn) {
  return fqn.empty() ? std::string(kRootName) : fmt::format("{}.{}", kRootName, fqn);
}

}  // namespace fsdplab::kineto::internal
