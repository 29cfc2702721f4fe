#include "fsdplab/core/model.h"

#include <gtest/gtest.h>

namespace fsdplab {
namespace {

ParamSpec Shaped(std::string name, DType dtype, std::vector<std::int64_t> shape) {
  ParamSpec p;
  p.name = std::move(name);
  p.dtype = dtype;
  p.shape = std::move(shape);
  return p;
}

ParamSpec Numel(std::string name, DType dtype, Elements n) {
  ParamSpec p;
  p.name = std::move(name);
  p.dtype = dtype;
  p.numel = n;
  return p;
}

TEST(PlaneBytes, Mxfp8LargeMatrix) {
  ParamSpec w = Shaped("fc1.weight", DType::kMxfp8, {16384, 4096});
  // rowwise: data 16384*4096, scales one per 32 along a row: 16384 * (4096/32 = 128).
  EXPECT_EQ(w.RowwiseBytes(), 16384ull * 4096 + 16384ull * 128);
  // columnwise: data 16384*4096, scales one per 32 down a column: 4096 * (16384/32 = 512).
  EXPECT_EQ(w.ColumnwiseBytes(), 16384ull * 4096 + 4096ull * 512);
  // Both are 1.03125 bytes per element here (DESIGN §2.2).
  EXPECT_EQ(w.RowwiseBytes(), 16384ull * 4096 * 33 / 32);
}

TEST(PlaneBytes, Mxfp8RoundsScaleBlocksUp) {
  ParamSpec w = Shaped("w", DType::kMxfp8, {33, 70});
  // rowwise: 33*70 = 2310 data bytes + 33 rows * ceil(70/32) = 33*3 = 99 scales -> 2409.
  EXPECT_EQ(w.RowwiseBytes(), 2409u);
  // columnwise: 2310 + 70 columns * ceil(33/32) = 70*2 = 140 scales -> 2450.
  EXPECT_EQ(w.ColumnwiseBytes(), 2450u);
}

TEST(PlaneBytes, Mxfp8FoldsLeadingDimsIntoRows) {
  ParamSpec w = Shaped("w", DType::kMxfp8, {2, 3, 64});
  // R = 2*3 = 6, C = 64: rowwise 384 + 6*2 = 396; columnwise 384 + 64*ceil(6/32)=64 -> 448.
  EXPECT_EQ(w.RowwiseBytes(), 396u);
  EXPECT_EQ(w.ColumnwiseBytes(), 448u);
}

TEST(PlaneBytes, Mxfp8NumelOnlyIsAVector) {
  ParamSpec v = Numel("bias", DType::kMxfp8, 100);
  // 100 data bytes + ceil(100/32) = 4 scales, the same for both planes.
  EXPECT_EQ(v.RowwiseBytes(), 104u);
  EXPECT_EQ(v.ColumnwiseBytes(), 104u);
}

TEST(PlaneBytes, SinglePlaneDtypes) {
  EXPECT_EQ(Shaped("a", DType::kBf16, {10, 3}).RowwiseBytes(), 60u);     // 30 * 2
  EXPECT_EQ(Shaped("a", DType::kBf16, {10, 3}).ColumnwiseBytes(), 60u);  // the same tensor
  EXPECT_EQ(Numel("b", DType::kFp32, 7).RowwiseBytes(), 28u);            // 7 * 4
  EXPECT_EQ(Numel("c", DType::kFp16, 5).RowwiseBytes(), 10u);            // 5 * 2
}

TEST(ModelBuilder, GroupsByDtypeInFirstAppearanceOrder) {
  ModelBuilder b;
  b.AddUnit("u", std::nullopt,
            {Shaped("w1", DType::kMxfp8, {64, 64}), Numel("b1", DType::kBf16, 64),
             Shaped("w2", DType::kMxfp8, {32, 64}), Numel("n", DType::kFp32, 10)});
  StatusOr<Model> m = std::move(b).Build();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Unit& u = m->unit(0);
  ASSERT_EQ(u.groups().size(), 3u);
  EXPECT_EQ(u.groups()[0].dtype, DType::kMxfp8);
  EXPECT_EQ(u.groups()[0].params, (std::vector<int>{0, 2}));
  EXPECT_EQ(u.groups()[1].dtype, DType::kBf16);
  EXPECT_EQ(u.groups()[2].dtype, DType::kFp32);
  // mxfp8 group: w1 rowwise 4096 + 64*2 = 4224, w2 rowwise 2048 + 32*2 = 2112 -> 6336;
  // columnwise w1 4096 + 64*2 = 4224, w2 2048 + 64*1 = 2112 -> 6336.
  EXPECT_EQ(u.groups()[0].numel, 4096u + 2048u);
  EXPECT_EQ(u.groups()[0].rowwise_bytes, 6336u);
  EXPECT_EQ(u.groups()[0].columnwise_bytes, 6336u);
  EXPECT_EQ(u.groups()[1].rowwise_bytes, 128u);  // 64 * 2
  EXPECT_EQ(u.groups()[1].columnwise_bytes, 0u);
  // Unit planes: rowwise = 6336 + 128 + 40; both = 6336*2 + 128 + 40 (single-plane counts once).
  EXPECT_EQ(u.PlaneBytes(PlaneSet::Rowwise()), 6504u);
  EXPECT_EQ(u.PlaneBytes(PlaneSet::Columnwise()), 6504u);
  EXPECT_EQ(u.PlaneBytes(PlaneSet::Both()), 12840u);
  EXPECT_EQ(u.PlaneBytes(PlaneSet::None()), 0u);
  EXPECT_EQ(u.numel(), 4096u + 64 + 2048 + 10);
}

TEST(ModelBuilder, ShardBytesPadEachPlaneToTheWorldSize) {
  ModelBuilder b;
  b.AddUnit("u", std::nullopt, {Shaped("w", DType::kMxfp8, {33, 70}), Numel("b", DType::kBf16, 5)});
  StatusOr<Model> m = std::move(b).Build();
  ASSERT_TRUE(m.ok());
  const Unit& u = m->unit(0);
  // rowwise 2409 over 8 ranks: ceil(2409/8) = 302; columnwise 2450 -> ceil = 307 (306.25).
  EXPECT_EQ(u.groups()[0].ShardBytes(PlaneSet::Rowwise(), 8), 302u);
  EXPECT_EQ(u.groups()[0].ShardBytes(PlaneSet::Columnwise(), 8), 307u);
  EXPECT_EQ(u.groups()[0].ShardBytes(PlaneSet::Both(), 8), 609u);
  // bf16 10 bytes over 8 ranks: ceil(10/8) = 2.
  EXPECT_EQ(u.groups()[1].ShardBytes(PlaneSet::Columnwise(), 8), 2u);
  EXPECT_EQ(u.ShardBytes(PlaneSet::Rowwise(), 8), 304u);
  EXPECT_EQ(u.ShardBytes(PlaneSet::Rowwise(), 1), 2419u);  // 2409 + 10, no padding
}

TEST(ModelBuilder, TreeInRegistrationOrderWithLateParent) {
  ModelBuilder b;
  b.AddUnit("child.b", "root", {});
  b.AddUnit("root", std::nullopt, {Numel("w", DType::kBf16, 4)});
  b.AddUnit("child.a", "root", {});
  b.AddUnit("other_root", std::nullopt, {});
  StatusOr<Model> m = std::move(b).Build();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->roots(), (std::vector<UnitId>{1, 3}));
  EXPECT_EQ(m->unit(1).children(), (std::vector<UnitId>{0, 2}));
  EXPECT_EQ(m->unit(0).parent(), 1);
  EXPECT_EQ(m->Find("child.a"), std::optional<UnitId>(2));
  EXPECT_EQ(m->Find("nope"), std::nullopt);
  EXPECT_EQ(m->NameOf(kNoUnit), "(none)");
  EXPECT_FALSE(m->unit(0).has_params());
  EXPECT_TRUE(m->unit(1).has_params());
}

Status BuildError(ModelBuilder b) {
  StatusOr<Model> m = std::move(b).Build();
  return m.status();
}

TEST(ModelBuilder, RejectsDuplicateNames) {
  ModelBuilder b;
  b.AddUnit("a", std::nullopt, {});
  b.AddUnit("a", std::nullopt, {});
  Status s = BuildError(std::move(b));
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(s.message(), "units[1].name: duplicate unit name 'a' (also units[0])");
}

TEST(ModelBuilder, RejectsUnknownParent) {
  ModelBuilder b;
  b.AddUnit("a", "ghost", {});
  EXPECT_EQ(BuildError(std::move(b)).message(),
            "units[0].parent: unit 'a' names unknown parent 'ghost'");
}

TEST(ModelBuilder, RejectsParentCycleNamingTheUnits) {
  ModelBuilder b;
  b.AddUnit("root", std::nullopt, {});
  b.AddUnit("a", "c", {});
  b.AddUnit("b", "a", {});
  b.AddUnit("c", "b", {});
  ModelBuilder copy = b;
  std::vector<Status> all = copy.Problems();
  ASSERT_EQ(all.size(), 1u);  // one cycle, reported once
  EXPECT_EQ(BuildError(std::move(b)).message(),
            "units[1].parent: parent cycle 'a' -> 'c' -> 'b' -> 'a'");
}

TEST(ModelBuilder, RejectsSelfParent) {
  ModelBuilder b;
  b.AddUnit("a", "a", {});
  EXPECT_EQ(BuildError(std::move(b)).message(), "units[0].parent: parent cycle 'a' -> 'a'");
}

TEST(ModelBuilder, RejectsParameterOwnedTwice) {
  ModelBuilder b;
  // "model" + "." + "layers.0.w" and "model.layers.0" + "." + "w" are the same parameter.
  b.AddUnit("model", std::nullopt, {Numel("layers.0.w", DType::kBf16, 4)});
  b.AddUnit("model.layers.0", "model", {Numel("w", DType::kBf16, 4)});
  EXPECT_EQ(BuildError(std::move(b)).message(),
            "units[1].params[0].name: parameter 'model.layers.0.w' owned twice (also "
            "units[0].params[0])");
}

TEST(ModelBuilder, RejectsNegativeDimension) {
  ModelBuilder b;
  b.AddUnit("a", std::nullopt, {Shaped("w", DType::kBf16, {4, -2})});
  EXPECT_EQ(BuildError(std::move(b)).message(),
            "units[0].params[0].shape[1]: negative dimension -2");
}

TEST(ModelBuilder, RejectsShapeAndNumelThatDisagree) {
  ParamSpec p = Shaped("w", DType::kBf16, {4, 8});
  p.numel = 30;
  ModelBuilder b;
  b.AddUnit("a", std::nullopt, {p});
  EXPECT_EQ(BuildError(std::move(b)).message(),
            "units[0].params[0]: shape [4, 8] has 32 elements but numel is 30");
}

TEST(ModelBuilder, ProblemsListsEveryProblem) {
  ModelBuilder b;
  b.AddUnit("a", "ghost", {});
  b.AddUnit("a", std::nullopt, {Shaped("w", DType::kBf16, {-1})});
  std::vector<Status> p = b.Problems();
  ASSERT_EQ(p.size(), 3u);  // duplicate name, unknown parent, negative dimension
  EXPECT_NE(p[0].message().find("duplicate"), std::string::npos);
  EXPECT_NE(p[1].message().find("unknown parent"), std::string::npos);
  EXPECT_NE(p[2].message().find("negative dimension"), std::string::npos);
}

TEST(Names, RoundTrip) {
  for (DType d : {DType::kFp32, DType::kBf16, DType::kFp16, DType::kMxfp8}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(ParseDType("int8"), std::nullopt);
  for (RecomputeKind k :
       {RecomputeKind::kNone, RecomputeKind::kReentrant, RecomputeKind::kInside}) {
    EXPECT_EQ(ParseRecomputeKind(RecomputeKindName(k)), k);
  }
  EXPECT_EQ(PlaneSet::Both().Name(), "rowwise+columnwise");
  EXPECT_EQ(PlaneSet::Columnwise().Name(), "columnwise");
  EXPECT_EQ(PlaneSet::None().Name(), "none");
}

}  // namespace
}  // namespace fsdplab
