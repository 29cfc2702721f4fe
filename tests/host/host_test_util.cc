#include "host_test_util.h"

#include <cassert>
#include <utility>

namespace fsdplab::host::testing {

Trace TinyTrace(const TinySpec& spec) {
  ModelBuilder b;
  b.AddUnit("model", std::nullopt,
            {{"embed.weight", DType::kBf16, {48, 16}, std::nullopt},
             {"final_norm.weight", DType::kBf16, {16}, std::nullopt}});
  std::vector<int> order;
  for (int i = 0; i < spec.layers; ++i)
    order.push_back(spec.reversed_registration ? spec.layers - 1 - i : i);
  for (int i : order) {
    b.AddUnit("model.layers." + std::to_string(i), "model",
              {{"norm.weight", DType::kBf16, {16}, std::nullopt},
               {"fc1.weight", spec.dtype, {64, 16}, std::nullopt},
               {"fc2.weight", spec.dtype, {16, 64}, std::nullopt}},
              spec.recompute);
  }
  StatusOr<Model> model = std::move(b).Build();
  assert(model.ok());
  Trace t;
  t.meta.source = "hand";
  t.meta.world_size = 2;
  t.model = std::move(*model);
  const UnitId root = *t.model.Find("model");
  std::vector<UnitId> layers;
  for (int i = 0; i < spec.layers; ++i)
    layers.push_back(*t.model.Find("model.layers." + std::to_string(i)));
  for (int s = 0; s < spec.steps; ++s) {
    Step step;
    for (int m = 0; m < spec.microbatches; ++m) {
      Microbatch mb;
      auto& ev = mb.events;
      ev.push_back(HookEvent(Op::kPreForward, root));
      ev.push_back(ComputeEvent(root, Phase::kForward, 50, 4096));
      for (UnitId l : layers) {
        ev.push_back(HookEvent(Op::kPreForward, l));
        ev.push_back(ComputeEvent(l, Phase::kForward, spec.layer_us, 8192));
        ev.push_back(HookEvent(Op::kPostForward, l));
      }
      ev.push_back(ComputeEvent(kNoUnit, Phase::kForward, 20));
      ev.push_back(HookEvent(Op::kPostForward, root));
      ev.push_back(HookEvent(Op::kPreBackward, root));
      ev.push_back(ComputeEvent(root, Phase::kBackward, 100));
      for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
        const UnitId l = *it;
        if (spec.recompute == RecomputeKind::kReentrant) {
          ev.push_back(HookEvent(Op::kPreForward, l));
          ev.push_back(ComputeEvent(l, Phase::kRecompute, spec.layer_us / 2, 8192));
          ev.push_back(HookEvent(Op::kPostForward, l));
        }
        ev.push_back(HookEvent(Op::kPreBackward, l));
        if (spec.recompute == RecomputeKind::kInside) {
          ev.push_back(ComputeEvent(l, Phase::kRecompute, spec.layer_us / 2, 4096));
        }
        ev.push_back(ComputeEvent(l, Phase::kBackward, 2 * spec.layer_us));
        ev.push_back(HookEvent(Op::kPostBackward, l));
      }
      ev.push_back(ComputeEvent(root, Phase::kBackward, 100));
      ev.push_back(HookEvent(Op::kPostBackward, root));
      Event end;
      end.op = Op::kBackwardEnd;
      ev.push_back(end);
      step.microbatches.push_back(std::move(mb));
    }
    t.steps.push_back(std::move(step));
  }
  return t;
}

}  // namespace fsdplab::host::testing
