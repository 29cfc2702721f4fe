// The vocabulary of FSDP2's profiler ranges and of Kineto's operator arguments, for the import.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fsdplab/core/model.h"
#include "fsdplab/core/units.h"

namespace fsdplab::kineto::internal {

inline constexpr std::string_view kRootName = "model";
// The profiler's allocation events (profile_memory=True) and the operator that hands a
// parameter its gradient (its input: the gradient, with record_shapes=True).
inline constexpr std::string_view kMemoryEvent = "[memory]";
inline constexpr std::string_view kAccumulateGrad = "torch::autograd::AccumulateGrad";
// The optimizer's step range, "Optimizer.step#AdamW.step": the class is after '#'.
inline constexpr std::string_view kOptimizerStep = "Optimizer.step#";

enum class Hook : std::uint8_t {
  kPreForward,
  kPostForward,
  kPreBackward,
  kPostBackward,
  kAllGather,
  kCopyOut,  // FSDP::all_gather_copy_out: a gather's copy into the parameters
  kReduce,
  kBackwardEnd,
  kOther,
};

struct FsdpRange {
  Hook hook = Hook::kOther;
  std::string fqn;
  TimeUs start = 0;
  TimeUs end = 0;
  std::int32_t thread = 0;
};

// "FSDP::pre_forward (layers.0) [pg=2]" -> hook kPreForward, fqn "layers.0" (times unset).
FsdpRange ParseFsdpName(std::string_view name);
bool IsUnitHook(Hook h);
// Operators a module's forward calls and no autograd backward formula does: seen inside a
// backward function, they are a recomputation (activation checkpointing).
bool IsForwardOp(std::string_view name);
// A Python frame of FSDP2 itself, from a profile taken with_stack=True: its "python_function"
// event's name is "<path>(<line>): <function>", and FSDP2's code lies under
// torch/distributed/fsdp/_fully_shard/. Everything such a frame spans (its hooks' Python, the
// dynamo guard inside, the methods they call) is FSDP's work.
bool IsFsdpFrame(std::string_view python_function_name);
// A Python frame of fsdplab's own recorder (fsdplab/torch/), in a profile of a run it recorded
// too: its hooks' bookkeeping is the recorder's time, not the run's.
bool IsRecorderFrame(std::string_view python_function_name);
// Bytes per element of an operator input type ("float", "c10::BFloat16") or a
// record_param_comms dtype ("Float", "BFloat16"); nullopt when unknown.
std::optional<Bytes> ElementBytes(std::string_view type);
// The trace dtype of a parameter gathered as `type` (fp32, bf16, fp16).
std::optional<DType> ParamDType(std::string_view type);
// "" -> "model", "layers.0" -> "model.layers.0".
std::string UnitName(const std::string& fqn);

}  // namespace fsdplab::kineto::internal
