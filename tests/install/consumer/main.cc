// Builds a two-unit model with the installed library and prints its registration order.
#include <cstdio>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/model.h"

int main() {
  fsdplab::ModelBuilder b;
  b.AddUnit("model", std::nullopt, {});
  b.AddUnit("model.layers.0", "model", {});
  fsdplab::StatusOr<fsdplab::Model> m = std::move(b).Build();
  if (!m.ok()) return 1;
  std::fputs(fsdplab::ExecutionOrder::Registration(*m).ToText(*m).c_str(), stdout);
  return 0;
}
