// The model: units (FSDP modules) as a tree in registration order, their parameters grouped by
// dtype, and the exact bytes of every plane.
//
//   ModelBuilder b;
//   b.AddUnit("model", std::nullopt, {{"embed.weight", DType::kBf16, {32000, 4096}}});
//   b.AddUnit("model.layers.0", "model", {{"fc1.weight", DType::kMxfp8, {16384, 4096}}});
//   StatusOr<Model> model = std::move(b).Build();
//   Bytes rowwise = model->unit(1).PlaneBytes(PlaneSet::Rowwise());  // 16384*4096*1.03125
//
// Plane rules (DESIGN §2.2): an MXFP8 tensor of logical shape [R, C] (leading dims folded into R)
// stores rowwise data (R*C bytes) with rowwise scales (R * ceil(C/32) E8M0 bytes), and
// columnwise data (R*C bytes) with columnwise scales (C * ceil(R/32) bytes). A tensor given by
// numel alone is a vector of numel elements: each plane has numel data bytes and
// ceil(numel/32) scale bytes. Other dtypes have a single plane holding numel * element size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

enum class DType : std::uint8_t { kFp32, kBf16, kFp16, kMxfp8 };

std::string_view DTypeName(DType dtype);                 // "fp32", "bf16", "fp16", "mxfp8"
std::optional<DType> ParseDType(std::string_view name);  // inverse of DTypeName
// Bytes per element of the data (1 for mxfp8; scales are counted separately).
Bytes DTypeElementBytes(DType dtype);

// MXFP8 scales (DESIGN §2.2): one E8M0 byte per kMxfp8ScaleBlock elements along a row (rowwise
// plane) or a column (columnwise plane) of the tensor seen as a matrix [rows, cols]; a vector
// (`matrix` false: numel alone or one dimension; rows 1, cols numel) scales both planes as one run
// of elements. Every reader of the bytes (the model, the parameter layout, the executors' decoders
// and kernels) asks these.
inline constexpr Elements kMxfp8ScaleBlock = 32;
Bytes Mxfp8ScaleBytes(Elements rows, Elements cols, bool matrix, bool columnwise);

// Which weight planes a gather moves or a compute needs. Single-plane dtypes treat any non-empty
// set as "the tensor".
class PlaneSet final {
 public:
  constexpr PlaneSet() = default;
  static constexpr PlaneSet None() { return PlaneSet(0); }
  static constexpr PlaneSet Rowwise() { return PlaneSet(kRowBit); }
  static constexpr PlaneSet Columnwise() { return PlaneSet(kColBit); }
  static constexpr PlaneSet Both() { return PlaneSet(kRowBit | kColBit); }

  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool rowwise() const { return (bits_ & kRowBit) != 0; }
  constexpr bool columnwise() const { return (bits_ & kColBit) != 0; }
  constexpr bool Contains(PlaneSet other) const { return (bits_ & other.bits_) == other.bits_; }
  constexpr PlaneSet operator|(PlaneSet o) const { return PlaneSet(bits_ | o.bits_); }
  constexpr PlaneSet operator&(PlaneSet o) const { return PlaneSet(bits_ & o.bits_); }
  constexpr PlaneSet Minus(PlaneSet o) const { return PlaneSet(bits_ & ~o.bits_ & 3u); }
  constexpr std::uint8_t bits() const { return bits_; }
  friend constexpr bool operator==(PlaneSet, PlaneSet) = default;

  // "rowwise", "columnwise", "rowwise+columnwise", "none".
  std::string_view Name() const;

 private:
  static constexpr std::uint8_t kRowBit = 1;
  static constexpr std::uint8_t kColBit = 2;
  constexpr explicit PlaneSet(std::uint8_t bits) : bits_(bits) {}
  std::uint8_t bits_ = 0;
};

struct ParamSpec final {
  std::string name;
  DType dtype = DType::kBf16;
  std::vector<std::int64_t> shape;  // empty when given by numel
  std::optional<Elements> numel;    // set when the trace gave numel instead of shape

  Elements Numel() const;
  // Bytes of one plane of this parameter (unsharded). For single-plane dtypes both planes
  // report the tensor's bytes.
  Bytes RowwiseBytes() const;
  Bytes ColumnwiseBytes() const;
  friend bool operator==(const ParamSpec&, const ParamSpec&) = default;
};

// The parameters of one unit that share a dtype: one flat buffer per plane, sharded over ranks.
struct ParamGroup final {
  DType dtype = DType::kBf16;
  std::vector<int> params;  // indices into Unit::params()
  Elements numel = 0;
  Bytes rowwise_bytes = 0;     // unsharded bytes of the rowwise plane (or of the only plane)
  Bytes columnwise_bytes = 0;  // unsharded bytes of the columnwise plane (mxfp8 only, else 0)

  bool multi_plane() const { return dtype == DType::kMxfp8; }
  // Unsharded bytes of the given planes of this group; a single-plane group counts once.
  Bytes PlaneBytes(PlaneSet planes) const;
  // Bytes one rank holds of `planes` when sharded over `world_size` ranks: each plane's flat
  // buffer is padded to a multiple of the world size, as FSDP pads.
  Bytes ShardBytes(PlaneSet planes, int world_size) const;
  // The planes that exist for this group (Rowwise for a single-plane group).
  PlaneSet ExistingPlanes() const { return multi_plane() ? PlaneSet::Both() : PlaneSet::Rowwise(); }
  // The planes a compute of this phase reads.
};

enum class RecomputeKind : std::uint8_t { kNone, kReentrant, kInside };
std::string_view RecomputeKindName(RecomputeKind kind);
std::optional<RecomputeKind> ParseRecomputeKind(std::string_view name);

class Unit final {
 public:
  const std::string& name() const { return name_; }
  UnitId id() const { return id_; }
  UnitId parent() const { return parent_; }  // kNoUnit for a root
  bool is_root() const { return parent_ == kNoUnit; }
  const std::vector<UnitId>& children() const { return children_; }  // registration order
  RecomputeKind recompute() const { return recompute_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  bool has_params() const { return !groups_.empty(); }
  Elements numel() const { return numel_; }

  // Unsharded bytes of the given planes over all groups (single-plane groups count once if any
  // plane is asked for).
  Bytes PlaneBytes(PlaneSet planes) const;
  Bytes ShardBytes(PlaneSet planes, int world_size) const;

 private:
  friend class ModelBuilder;
  std::string name_;
  UnitId id_ = kNoUnit;
  UnitId parent_ = kNoUnit;
  std::vector<UnitId> children_;
  RecomputeKind recompute_ = RecomputeKind::kNone;
  std::vector<ParamSpec> params_;
  std::vector<ParamGroup> groups_;
  Elements numel_ = 0;
};

class Model final {
 public:
  int num_units() const { return static_cast<int>(units_.size()); }
  const Unit& unit(UnitId id) const { return units_[static_cast<std::size_t>(id)]; }
  const std::vector<Unit>& units() const { return units_; }
  const std::vector<UnitId>& roots() const { return roots_; }  // registration order
  std::optional<UnitId> Find(std::string_view name) const;
  // The name of `id`, or "(none)" for kNoUnit.
  std::string_view NameOf(UnitId id) const;

 private:
  friend class ModelBuilder;
  std::vector<Unit> units_;
  std::vector<UnitId> roots_;
  std::unordered_map<std::string, UnitId> by_name_;
};

// Builds a Model and checks it: unique unit names, parents that exist, no parent cycle, no
// parameter owned twice (the same parameter name under one unit), valid shapes.
class ModelBuilder final {
 public:
  // `parent` may name a unit added later (traces list units in registration order, but a
  // child's parent may be registered after it); Build resolves and checks it.
  void AddUnit(std::string name, std::optional<std::string> parent, std::vector<ParamSpec> params,
               RecomputeKind recompute = RecomputeKind::kNone);
  StatusOr<Model> Build() &&;
  // Every problem Build would report, not only the first (for `fsdplab validate`). Messages name
  // the position as a trace does: "units[3].parent: unknown parent 'x'".
  std::vector<Status> Problems() const;

 private:
  struct Pending {
    std::string name;
    std::optional<std::string> parent;
    std::vector<ParamSpec> params;
    RecomputeKind recompute;
  };
  std::vector<Pending> pending_;
};

}  // namespace fsdplab
