// The simulated cluster: how many ranks, how they are grouped into nodes, what each link tier
// costs, and how fast compute runs relative to the trace.
//
//   Cluster c = Cluster::Default();                 // one 8-GPU NVLink node (H100-like)
//   StatusOr<Cluster> f = ReadClusterFile("cluster.json");
//   TimeUs t = c.CollectiveUs(CollectiveKind::kAllGather, /*bytes=*/64 << 20);
//   std::string json = ClusterToJson(c);           // printed back in every report
//
// Cluster file (DESIGN §4.2; format "fsdplab.cluster", version 2, as `fsdplab calibrate` writes
// it; the format/version keys are optional and files without them, version 1, still load):
//   {"format": "fsdplab.cluster", "version": 2, "world_size": 64, "gpus_per_node": 8,
//    "intra": {"bandwidth_GBps": 360, "latency_us": 10},
//    "inter": {"bandwidth_GBps": 45, "latency_us": 20},
//    "compute_scale": 1.0,
//    "calibration": {"all_gather": {"intra": {"world_size": 8, "knots": [{"bytes": 128,
//                                             "time_us": 35.05}, ...], "tail_busbw_GBps": 360},
//                                   "inter": {...}},
//                    "reduce_scatter": {...}, "all_reduce": {...}},
//    "notes": ["inter: not measured; the default line 45 GB/s 20 us", ...],
//    "comm_contention": {"all_gather": 0.42, "reduce_scatter": 0.9}}
// "calibration" is optional: per collective and tier a cost curve (calib/cost_curve.h, with its
// error band when the fit measured one), or, in a
// version-1 file, a list of segments [{"min_bytes", "max_bytes", "latency_us",
// "bandwidth_GBps"}, ...] each costed as its own ring line (calib::PredictCollectiveUs).
// "notes" (optional) says which collectives and tiers fell back to lines, and why; it is printed
// back. "comm_contention" is optional (`fsdplab calibrate --contention` writes it from `fsdplab
// bench-gather --op concurrent`; see CommContention in calib/calibration.h): while an all-gather
// and a reduce-scatter are in progress at once the all-gather runs (1 + all_gather) times slower
// and the reduce-scatter (1 + reduce_scatter) times slower. Both values are >= 0 (a missing one is
// 0); "source" and "statistic" inside it (as bench-gather writes them) are informational.
// "stream_wake_us" is optional (host backends; written by calibrate from the same bench file):
// {"idle": us, "while_all_gather": us, "while_reduce_scatter": us}, how late a communication
// stream resumes after the event it waited on fired, with no collective in progress on the rank
// or while one of each kind is (see StreamWake in calib/calibration.h).
//
// Cost model. `bytes` is the collective's full (unsharded) buffer: the all-gather output or the
// reduce-scatter input on one rank. A ring over n ranks of one tier with latency a (us) and bus
// bandwidth B (GB/s = 1e3 bytes/us) costs (calib::RingTimeUs, the one copy of the formula)
//     ring(n, bytes) = (n-1) * a + (n-1)/n * bytes / (B * 1e3).
// A group within one node (W <= gpus_per_node) is one intra ring, or, when the cluster has an
// intra calibration for that collective, its curve at W ranks: the measured curve replaces the
// line. A group spanning N nodes of G GPUs (W = N*G) with an inter calibration uses that curve at
// W ranks (the calibration measured the whole multi-node collective). Without one it is
// hierarchical: an inter-node ring between the N GPUs of the same local rank moves that local
// rank's 1/G slice of the buffer, then an intra-node ring (or curve) over G GPUs moves the whole
// buffer (a reduce-scatter runs the same two phases in the other order, at the same cost):
//     hier(bytes) = ring_inter(N, bytes / G) + intra(G, bytes),
// where an all-reduce's inter ring is two passes (reduce-scatter then all-gather).
// An all-reduce uses its own calibration when the cluster has one, else costs a reduce-scatter
// plus an all-gather. A world of one rank costs nothing. Cost() says which tier, curve segment or
// line gave a time (`fsdplab cost` prints it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/calib/calibration.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::sim {

// The measured parts of the cluster come from the calibration library.
using calib::CommContention;
using calib::CostCurve;
using calib::PredictCollectiveUs;
using calib::Segment;
using calib::StreamWake;
using calib::ValidateSegments;

// One link tier: bus bandwidth and per-step latency of a ring.
struct LinkTier final {
  double bandwidth_GBps = 0;  // GB/s (1e9 bytes per second) of bus bandwidth
  TimeUs latency_us = 0;      // per ring step
  friend bool operator==(const LinkTier&, const LinkTier&) = default;
};

// Which end of the calibrated curves' error bands (calib/cost_curve.h) a cluster costs with: the
// curve itself, or the fastest or the slowest the band allows (`simulate --band` runs one of
// each). Tier lines and version-1 segments have no band: the same at every end.
enum class BandEnd : std::uint8_t { kNominal, kLow, kHigh };

// One collective's measured cost on one tier: a cost curve (version-2 files) or the per-segment
// ring lines of a version-1 file. Empty when not measured.
struct TierModel final {
  CostCurve curve;
  std::vector<Segment> segments;
  bool empty() const { return curve.empty() && segments.empty(); }
  TimeUs Us(Bytes bytes, int world_size, BandEnd end = BandEnd::kNominal) const;
  // "curve segment 3: 4194304 .. 8388608 B", "version-1 segment 1", ...
  std::string Describe(Bytes bytes, int world_size) const;
  friend bool operator==(const TierModel&, const TierModel&) = default;
};

struct TierCalibration final {
  TierModel intra;  // measured on one node
  TierModel inter;  // measured across nodes
  bool empty() const { return intra.empty() && inter.empty(); }
  friend bool operator==(const TierCalibration&, const TierCalibration&) = default;
};

// A collective's time and where it came from.
struct CollectiveCost final {
  TimeUs time_us = 0;
  TimeUs low_us = 0;  // the band's ends (calibrated curves); time_us where there is no band
  TimeUs high_us = 0;
  std::string tier;    // "intra", "inter", "inter+intra" (hierarchical); "" for one rank
  std::string source;  // "all_gather intra curve", "intra line (default)", ...
  std::string detail;  // the segment of the curve, or the line's parameters
};

struct Cluster final {
  int world_size = 8;
  int gpus_per_node = 8;
  LinkTier intra{360.0, 3.0};  // NVLink 4 / NVSwitch class (H100 SXM bus bandwidth)
  LinkTier inter{45.0, 20.0};  // one 400 Gb/s NIC per GPU
  double compute_scale = 1.0;
  TierCalibration all_gather;
  TierCalibration reduce_scatter;
  TierCalibration all_reduce;  // empty: an all-reduce costs a reduce-scatter plus an all-gather
  // What the file says fell back to lines or defaults (`fsdplab calibrate` writes them).
  std::vector<std::string> notes;
  // While an all-gather and a reduce-scatter are in progress at once, the all-gather runs
  // (1 + all_gather) times slower and the reduce-scatter (1 + reduce_scatter) times slower
  // (measured by `fsdplab bench-gather --op concurrent`). Unset: none. The simulator's
  // --comm-contention (SimOptions::comm_contention) overrides it when given.
  std::optional<CommContention> comm_contention;
  // A host's communication streams resume this late after the events they wait on (measured by
  // `fsdplab bench-gather --op concurrent` on the host). Unset: at once, as a device's do.
  std::optional<StreamWake> stream_wake;
  // True when nothing described the cluster (no file, no flag): the report warns that its
  // collectives are costed as an H100 node's.
  bool defaults_used = true;
  // True when the collectives' curves were fitted to the trace's own measured collectives
  // (trace_calibration.h); `notes` then say which sizes, how many samples and the band.
  bool from_trace = false;
  // The end of the calibrated curves' bands that collectives cost at (not part of the file).
  BandEnd band_end = BandEnd::kNominal;

  static Cluster Default() { return Cluster{}; }

  int nodes() const;
  // Time of one collective over the whole world with a buffer of `bytes` (see the model above).
  TimeUs CollectiveUs(CollectiveKind kind, Bytes bytes) const;
  // The same, for a group of `group_size` ranks `stride` apart (1: consecutive ranks, filling
  // nodes first; hsdp's replica all-reduce: the shard group size). A strided group has
  // max(1, gpus_per_node / stride) ranks on each node it spans: within one node it is an intra
  // ring (or curve); across nodes with one rank per node an inter ring over the whole buffer;
  // else the hierarchical model with that many ranks per node. A calibrated inter curve is
  // used only for contiguous groups (what nccl-tests measured).
  TimeUs CollectiveUs(CollectiveKind kind, Bytes bytes, int group_size, int stride = 1) const;
  // The same, with the tier and the segment or line that gave the time.
  CollectiveCost Cost(CollectiveKind kind, Bytes bytes, int group_size, int stride = 1) const;
  const TierCalibration& calibration(CollectiveKind kind) const;

  friend bool operator==(const Cluster&, const Cluster&) = default;
};

// Parses a cluster file's JSON; every field is optional and defaults as in Cluster{}. Unknown
// keys, wrong types and impossible values (bandwidth <= 0, world not a multiple of the node size
// when it spans nodes) are errors naming the field.
StatusOr<Cluster> ParseClusterJson(std::string_view json_text);
StatusOr<Cluster> ReadClusterFile(const std::string& path);
// Checks the values (also done by the parser).
Status ValidateCluster(const Cluster& cluster);
// One JSON object in the file's schema, with "defaults_used" added.
std::string ClusterToJson(const Cluster& cluster);
// "8 ranks (1 node x 8 GPUs), intra 360 GB/s 3 us, inter 45 GB/s 20 us, compute x1", then
// ", calibrated" and ", comm contention: all-gather x1.42, reduce-scatter x1.9 while both run"
// when the cluster has them.
std::string DescribeCluster(const Cluster& cluster);

}  // namespace fsdplab::sim
