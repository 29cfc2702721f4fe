#include "fsdplab/core/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "fsdplab/core/limits.h"

namespace fsdplab {
namespace {

// The product of the dims, or nullopt when a dim is negative or the product overflows.
std::optional<Elements> ShapeNumel(const std::vector<std::int64_t>& shape) {
  Elements n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<Elements>(d), &n)) return std::nullopt;
  }
  return n;
}

// An MXFP8 tensor seen as a matrix [rows, cols]: leading dims folded into rows. A vector (numel
// only, or a 1-D shape) has no second axis: both planes scale it as one run of elements.
struct Matrix {
  Elements rows = 0;
  Elements cols = 0;
  bool vector = false;
};

Matrix AsMatrix(const ParamSpec& p) {
  if (p.numel.has_value() && p.shape.empty()) return {1, *p.numel, true};
  if (p.shape.size() <= 1) return {1, p.Numel(), true};
  Elements cols = static_cast<Elements>(std::max<std::int64_t>(p.shape.back(), 0));
  Elements rows = 1;
  for (std::size_t i = 0; i + 1 < p.shape.size(); ++i) {
    rows *= static_cast<Elements>(std::max<std::int64_t>(p.shape[i], 0));
  }
  return {rows, cols, false};
}

std::string ShapeText(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return "fp32";
    case DType::kBf16: return "bf16";
    case DType::kFp16: return "fp16";
    case DType::kMxfp8: return "mxfp8";
  }
  return "unknown";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "fp32") return DType::kFp32;
  if (name == "bf16") return DType::kBf16;
  if (name == "fp16") return DType::kFp16;
  if (name == "mxfp8") return DType::kMxfp8;
  return std::nullopt;
}

Bytes DTypeElementBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return 4;
    case DType::kBf16:
    case DType::kFp16: return 2;
    case DType::kMxfp8: return 1;
  }
  return 0;
}

std::string_view PlaneSet::Name() const {
  if (rowwise() && columnwise()) return "rowwise+columnwise";
  if (rowwise()) return "rowwise";
  if (columnwise()) return "columnwise";
  return "none";
}

std::string_view RecomputeKindName(RecomputeKind kind) {
  switch (kind) {
    case RecomputeKind::kNone: return "none";
    case RecomputeKind::kReentrant: return "reentrant";
    case RecomputeKind::kInside: return "inside";
  }
  return "unknown";
}

std::optional<RecomputeKind> ParseRecomputeKind(std::string_view name) {
  if (name == "none") return RecomputeKind::kNone;
  if (name == "reentrant") return RecomputeKind::kReentrant;
  if (name == "inside") return RecomputeKind::kInside;
  return std::nullopt;
}

Elements ParamSpec::Numel() const {
  if (numel.has_value()) return *numel;
  return ShapeNumel(shape).value_or(0);
}

Bytes Mxfp8ScaleBytes(Elements rows, Elements cols, bool matrix, bool columnwise) {
  if (!matrix) return CeilDiv(rows * cols, kMxfp8ScaleBlock);
  return columnwise ? cols * CeilDiv(rows, kMxfp8ScaleBlock)
                    : rows * CeilDiv(cols, kMxfp8ScaleBlock);
}

Bytes ParamSpec::RowwiseBytes() const {
  Elements n = Numel();
  if (dtype != DType::kMxfp8) return n * DTypeElementBytes(dtype);
  Matrix m = AsMatrix(*this);
  return n + Mxfp8ScaleBytes(m.rows, m.cols, !m.vector, /*columnwise=*/false);
}

Bytes ParamSpec::ColumnwiseBytes() const {
  Elements n = Numel();
  if (dtype != DType::kMxfp8) return n * DTypeElementBytes(dtype);
  Matrix m = AsMatrix(*this);
  return n + Mxfp8ScaleBytes(m.rows, m.cols, !m.vector, /*columnwise=*/true);
}

Bytes ParamGroup::PlaneBytes(PlaneSet planes) const {
  if (!multi_plane()) return planes.empty() ? 0 : rowwise_bytes;
  return (planes.rowwise() ? rowwise_bytes : 0) + (planes.columnwise() ? columnwise_bytes : 0);
}

Bytes ParamGroup::ShardBytes(PlaneSet planes, int world_size) const {
  Bytes w = world_size < 1 ? 1 : static_cast<Bytes>(world_size);
  if (!multi_plane()) return planes.empty() ? 0 : CeilDiv(rowwise_bytes, w);
  return (planes.rowwise() ? CeilDiv(rowwise_bytes, w) : 0) +
         (planes.columnwise() ? CeilDiv(columnwise_bytes, w) : 0);
}

Bytes Unit::PlaneBytes(PlaneSet planes) const {
  Bytes total = 0;
  for (const ParamGroup& g : groups_) total += g.PlaneBytes(planes);
  return total;
}

Bytes Unit::ShardBytes(PlaneSet planes, int world_size) const {
  Bytes total = 0;
  for (const ParamGroup& g : groups_) total += g.ShardBytes(planes, world_size);
  return total;
}

std::optional<UnitId> Model::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::string_view Model::NameOf(UnitId id) const {
  if (id < 0 || id >= num_units()) return "(none)";
  return units_[static_cast<std::size_t>(id)].name();
}

void ModelBuilder::AddUnit(std::string name, std::optional<std::string> parent,
                           std::vector<ParamSpec> params, RecomputeKind recompute) {
  pending_.push_back({std::move(name), std::move(parent), std::move(params), recompute});
}

std::vector<Status> ModelBuilder::Problems() const {
  std::vector<Status> problems;
  auto add = [&problems](std::string msg) { problems.push_back(InvalidInput(std::move(msg))); };

  if (static_cast<std::int64_t>(pending_.size()) > kMaxUnits) {
    add(fmt::format("units: {} units is more than the {} a model may have", pending_.size(),
                    kMaxUnits));
    return problems;
  }

  // Names: non-empty and unique. The first unit of a name is the one parents resolve to.
  std::unordered_map<std::string_view, std::size_t> first_of;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const Pending& u = pending_[i];
    if (u.name.empty()) {
      add(fmt::format("units[{}].name: empty unit name", i));
      continue;
    }
    auto [it, inserted] = first_of.emplace(u.name, i);
    if (!inserted) {
      add(fmt::format("units[{}].name: duplicate unit name '{}' (also units[{}])", i, u.name,
                      it->second));
    }
  }

  // Parents exist; no cycle.
  std::vector<std::optional<std::size_t>> parent_of(pending_.size());
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const Pending& u = pending_[i];
    if (!u.parent.has_value()) continue;
    auto it = first_of.find(*u.parent);
    if (it == first_of.end()) {
      add(fmt::format("units[{}].parent: unit '{}' names unknown parent '{}'", i, u.name,
                      *u.parent));
      continue;
    }
    parent_of[i] = it->second;
  }
  // Walk up from each unit; a cycle is reported once, from its lowest index. Each unit is walked
  // through once in all (state: 0 unvisited, 1 on the current path, 2 done), so a long chain of
  // units costs linear time.
  std::vector<std::uint8_t> state(pending_.size(), 0);
  std::vector<std::size_t> path;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (state[i] != 0) continue;
    path.clear();
    std::optional<std::size_t> cur = i;
    while (cur.has_value() && state[*cur] == 0) {
      state[*cur] = 1;
      path.push_back(*cur);
      cur = parent_of[*cur];
    }
    const bool cycle_found = cur.has_value() && state[*cur] == 1;
    for (std::size_t c : path) state[c] = 2;
    if (!cycle_found) continue;
    // *cur is on the path: the cycle is path[k..] back to *cur.
    auto start = std::find(path.begin(), path.end(), *cur);
    std::vector<std::size_t> cycle(start, path.end());
    std::size_t lowest = *std::min_element(cycle.begin(), cycle.end());
    // Print the cycle starting from its lowest index: a -> b -> a.
    auto low_it = std::find(cycle.begin(), cycle.end(), lowest);
    std::rotate(cycle.begin(), low_it, cycle.end());
    std::string names;
    for (std::size_t c : cycle) names += fmt::format("'{}' -> ", pending_[c].name);
    names += fmt::format("'{}'", pending_[lowest].name);
    add(fmt::format("units[{}].parent: parent cycle {}", lowest, names));
  }

  // Parameters: valid shapes, numel agreeing with shape, sizes within the limits, each fully
  // qualified name owned once.
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> owner;
  Bytes total_bytes = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const Pending& u = pending_[i];
    for (std::size_t j = 0; j < u.params.size(); ++j) {
      const ParamSpec& p = u.params[j];
      std::string where = fmt::format("units[{}].params[{}]", i, j);
      if (p.name.empty()) add(fmt::format("{}.name: empty parameter name", where));
      bool shape_ok = true;
      for (std::size_t k = 0; k < p.shape.size(); ++k) {
        if (p.shape[k] < 0) {
          add(fmt::format("{}.shape[{}]: negative dimension {}", where, k, p.shape[k]));
          shape_ok = false;
        }
      }
      std::optional<Elements> from_shape = ShapeNumel(p.shape);
      if (shape_ok && !from_shape.has_value()) {
        add(fmt::format("{}.shape: {} has more elements than fit in 64 bits", where,
                        ShapeText(p.shape)));
        shape_ok = false;
      }
      if (shape_ok && p.numel.has_value() && !p.shape.empty() && *from_shape != *p.numel) {
        add(fmt::format("{}: shape {} has {} elements but numel is {}", where, ShapeText(p.shape),
                        *from_shape, *p.numel));
      }
      const Elements numel =
          p.numel.has_value() ? *p.numel : (shape_ok ? from_shape.value_or(0) : 0);
      if (numel > kMaxParamElements) {
        add(fmt::format("{}: {} elements is more than the {} (2^48) a parameter may have", where,
                        numel, kMaxParamElements));
      } else if (shape_ok || p.numel.has_value()) {
        // Both planes of an mxfp8 parameter, at most 4 bytes an element: no overflow below 2^48.
        Bytes bytes = p.RowwiseBytes() + (p.dtype == DType::kMxfp8 ? p.ColumnwiseBytes() : 0);
        total_bytes = total_bytes > kMaxModelBytes ? total_bytes : total_bytes + bytes;
      }
      std::string fq = u.name + "." + p.name;
      auto [it, inserted] = owner.emplace(fq, std::make_pair(i, j));
      if (!inserted) {
        add(fmt::format("{}.name: parameter '{}' owned twice (also units[{}].params[{}])", where,
                        fq, it->second.first, it->second.second));
      }
    }
  }
  if (total_bytes > kMaxModelBytes) {
    add(fmt::format("units: the parameters hold more than {} bytes (2^56) in all", kMaxModelBytes));
  }
  return problems;
}

StatusOr<Model> ModelBuilder::Build() && {
  std::vector<Status> problems = Problems();
  if (!problems.empty()) return problems.front();

  Model model;
  model.units_.resize(pending_.size());
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    model.by_name_.emplace(pending_[i].name, static_cast<UnitId>(i));
  }
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    Unit& u = model.units_[i];
    u.id_ = static_cast<UnitId>(i);
    u.name_ = std::move(p.name);
    u.recompute_ = p.recompute;
    u.params_ = std::move(p.params);
    if (p.parent.has_value()) {
      u.parent_ = model.by_name_.at(*p.parent);
    } else {
      model.roots_.push_back(u.id_);
    }
    // Groups by dtype in first-appearance order.
    for (std::size_t j = 0; j < u.params_.size(); ++j) {
      const ParamSpec& spec = u.params_[j];
      auto g = std::find_if(u.groups_.begin(), u.groups_.end(),
                            [&](const ParamGroup& x) { return x.dtype == spec.dtype; });
      if (g == u.groups_.end()) {
        ParamGroup group;
        group.dtype = spec.dtype;
        u.groups_.push_back(std::move(group));
        g = std::prev(u.groups_.end());
      }
      g->params.push_back(static_cast<int>(j));
      g->numel += spec.Numel();
      g->rowwise_bytes += spec.RowwiseBytes();
      if (g->multi_plane()) g->columnwise_bytes += spec.ColumnwiseBytes();
      u.numel_ += spec.Numel();
    }
  }
  // Children in registration order.
  for (const Unit& u : model.units_) {
    if (!u.is_root()) model.units_[static_cast<std::size_t>(u.parent_)].children_.push_back(u.id_);
  }
  return model;
}

}  // namespace fsdplab
