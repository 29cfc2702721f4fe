// The host backend's runtime: threads acting as device streams, the run-wide abort switch, and
// in-process collectives with NCCL's synchronising semantics.
//
//   RunControl control(/*timeout_us=*/30e6);
//   StreamWorker compute(control, /*rank=*/0, "compute");
//   compute.Start();
//   std::uint64_t seq = compute.Enqueue([] { return Status::Ok(); });
//   FSDP_RETURN_IF_ERROR(compute.WaitReached(seq, ctx));   // an event wait, with a timeout
//   Communicator comm(control, /*world_size=*/2, "all_gather");    // a Transport
//   StatusOr<CollectiveTimes> t = comm.Call(rank, desc, segments, ctx);  // on each rank's thread
//
// No wait blocks forever: every wait gives up after the run's timeout and returns an error naming
// the rank, step, unit and op; the first failure aborts the run and wakes every waiter, which then
// returns an error naming its own position and the failure that stopped it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::host {

using Clock = std::chrono::steady_clock;

// Where an operation runs, for error messages:
// "rank 1, step 0, microbatch 0, unit 'model.layers.0', op all_gather (prefetch)".
struct OpContext final {
  int rank = 0;
  int step = 0;
  int microbatch = 0;
  std::string unit = "(none)";
  std::string op;
  std::string Describe() const;
};

// Run-wide state every thread shares: the clock origin, the timeout and the abort switch.
class RunControl final {
 public:
  explicit RunControl(TimeUs timeout_us, int world_size = 1);

  TimeUs timeout_us() const { return timeout_us_; }
  Clock::duration timeout() const;
  // Microseconds since the run started.
  TimeUs NowUs() const;
  TimeUs ToUs(Clock::time_point t) const;

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Records `status` as `rank`'s failure (the first one per rank is kept; the first of the run is
  // the root cause) and aborts the run: every registered waiter wakes up.
  void Fail(int rank, const Status& status);
  // The root cause, and the rank it happened on (-1 if none).
  Status root_cause() const;
  int root_rank() const;
  // The first failure of each rank (ok where a rank did not fail).
  std::vector<Status> rank_errors() const;
  // The error a wait returns when it sees the abort: "<ctx>: aborted because rank R failed".
  Status AbortedError(const OpContext& ctx) const;

  // Called once, by the thread that records the run's first failure, with that rank and status
  // (a multi-process run tells the other processes). Set before any thread starts.
  void OnFirstFailure(std::function<void(int rank, const Status& status)> hook);
  // Moves the clock origin (ranks in other processes agree on one at a barrier). Before any
  // thread starts.
  void SetOrigin(Clock::time_point origin) { start_ = origin; }

 private:
  friend class AbortWaiter;
  using Waiter = std::pair<std::mutex*, std::condition_variable*>;
  void Register(Waiter waiter);
  void Unregister(Waiter waiter);

  const TimeUs timeout_us_;
  Clock::time_point start_;
  std::function<void(int, const Status&)> on_first_failure_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  Status root_;
  int root_rank_ = -1;
  std::vector<Status> rank_errors_;
  // Held while the abort notifies the waiters, so that none is unregistered (and destroyed)
  // halfway through.
  std::mutex waiters_mu_;
  std::vector<Waiter> waiters_;
};

// Keeps a mutex and condition variable pair registered with the run for as long as it lives:
// when the run aborts, the pair is notified under its mutex. Declare it after the pair, so that
// it unregisters before they are destroyed: a thread failing late must not notify a condition
// variable its owner has already destroyed.
class AbortWaiter final {
 public:
  AbortWaiter(RunControl& control, std::mutex& mu, std::condition_variable& cv);
  ~AbortWaiter();
  AbortWaiter(const AbortWaiter&) = delete;
  AbortWaiter& operator=(const AbortWaiter&) = delete;

 private:
  RunControl& control_;
  const RunControl::Waiter waiter_;
};

// The emulated device (--compute timed): its compute thread sleeps to each kernel's end, and
// the communication threads, which copy and sum on the same cores, run at this niceness so that
// the kernels end on time. The executor and the bench's stream-wake probe both use these.
inline constexpr int kEmulatedCommNice = 5;

// The core that rank `rank`'s communication threads run on, of the cores this process may use:
// one per rank when there are at least `world_size` of them, as each rank of a job has a device
// of its own; -1 (wherever the scheduler puts them) when the ranks outnumber the cores. Left to
// the scheduler, a rank's thread woken to join a collective was often queued behind another
// rank's on one core while the other stood idle, and the collective took twice its time.
int RankCore(int rank, int world_size);
// Pins the calling thread to `core` (-1: leaves it); failure only costs timing stability.
void PinThisThread(int core);

// Sleeps towards `end` (an emulated kernel's end), aiming early by `lateness`: a running mean of
// how late this thread's wake-ups have been, updated here. Returns when the thread woke; a thread
// already past `end` does not sleep.
Clock::time_point SleepTowards(Clock::time_point end, Clock::duration& lateness);

// One in-order queue of work on its own thread: a device stream. Tasks run one after another;
// `WaitReached` is an event wait (the caller blocks until the first `seq` tasks have completed).
// A task that fails stops the stream and aborts the run.
class StreamWorker final {
 public:
  using Task = std::function<Status()>;

  StreamWorker(RunControl& control, int rank, std::string name);
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // `low_timer_slack`: ask the kernel for precise sleeps on this thread (emulated compute, and
  // the streams that wait for its kernels' ends).
  // `nice`: raise this thread's niceness (communication threads, so that the emulated device's
  // compute thread is not delayed behind the copies and sums that share its cores).
  // `core`: pin the thread to that core (-1: not pinned; see RankCore).
  void Start(bool low_timer_slack = false, int nice = 0, int core = -1);
  // Appends a task; returns its sequence number (1 for the first).
  std::uint64_t Enqueue(Task task);
  std::uint64_t issued() const;
  std::uint64_t completed() const;
  // Blocks until the first `seq` tasks have completed, the run aborts, or the timeout passes,
  // and then until task `seq`'s completion time (the event's timestamp, which CompleteAt can put
  // after its thread returned). With `reached_at`, also says what that time was.
  Status WaitReached(std::uint64_t seq, const OpContext& ctx,
                     Clock::time_point* reached_at = nullptr) const;
  // Called by a running task on this stream's own thread: the task completes at `at` as far as
  // events are concerned (an emulated kernel ends on the device's clock, not when its thread
  // woke), instead of when it returns.
  void CompleteAt(Clock::time_point at) { complete_at_ = at; }
  // Blocks until every task issued so far has completed, as long as the stream keeps completing
  // tasks: the timeout applies to a stall, not to the total.
  Status Drain(const OpContext& ctx) const;
  // No more tasks; the thread exits once its queue is empty (or at once after an abort).
  void Close();
  void Join();
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }

 private:
  void Loop();

  RunControl& control_;
  const int rank_;
  const std::string name_;
  // Wakes a waiter only when what it waits for has happened. The stream's own thread waits on
  // cv_ for tasks; event waiters (WaitReached, Drain) on done_cv_, each registering the task
  // count it needs in wanted_, and a completion notifies them only once the smallest of those is
  // reached. (One condition for everything woke every event waiter at every enqueue and
  // completion, a stream's half-dozen trivial tasks per collective included: each woken waiter
  // found its event not yet fired and slept again, but on a core shared with the stream's
  // niced thread it preempted that thread first. A comm-bound step lost 30-90 us between two
  // collectives of a stream that way.)
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::condition_variable done_cv_;
  AbortWaiter abort_waiter_{control_, mu_, cv_};
  AbortWaiter abort_done_waiter_{control_, mu_, done_cv_};
  mutable std::multiset<std::uint64_t> wanted_;
  std::deque<Task> queue_;
  std::uint64_t issued_ = 0;
  std::uint64_t completed_ = 0;
  // When the most recent tasks completed: completed_at_[i] is task completed_ - size() + i + 1.
  // Bounded (a long run issues millions of tasks); waits reach back a few steps at most.
  std::deque<Clock::time_point> completed_at_;
  Clock::time_point complete_at_{};  // the running task's CompleteAt (the thread's own)
  bool closed_ = false;
  bool low_timer_slack_ = false;
  int nice_ = 0;
  int core_ = -1;
  std::thread thread_;
};

// Reuses byte buffers by size, as a caching allocator does: a large host allocation is otherwise
// handed back to the OS when freed and page-faulted in again on every use, which would make the
// host's "device" memory several times slower than memcpy. Contents of a reused buffer are
// whatever its last user left. The pool must outlive every buffer it handed out.
class BufferPool final {
 public:
  using Buffer = std::shared_ptr<std::vector<std::byte>>;
  BufferPool() = default;
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  Buffer Get(std::size_t bytes);

 private:
  void Put(std::vector<std::byte>* buffer);
  std::mutex mu_;
  std::multimap<std::size_t, std::unique_ptr<std::vector<std::byte>>> free_;
};

// The description every rank gives of a collective call; all ranks must agree.
struct CollectiveDesc final {
  CollectiveKind kind = CollectiveKind::kAllGather;
  UnitId unit = kNoUnit;
  std::string unit_name;
  Bytes bytes = 0;  // unsharded bytes
  // "all_gather of 'model.layers.0' (4.0 MB)"
  std::string Describe() const;
  // The error when the ranks of call #`call` on communicator `name` disagree: every rank's call,
  // by world rank: `ranks[q]` is the world rank of the communicator's rank q (hsdp's
  // sub-communicators), or, empty, q itself.
  static std::string Mismatch(const std::vector<CollectiveDesc>& calls, std::uint64_t call,
                              std::string_view name, std::span<const int> ranks = {});
  bool SameCall(const CollectiveDesc& other) const;
};

// One buffer pair of a collective on one rank.
//   all-gather:     input = this rank's shard (shard_elements elements), output = the full buffer
//                   (world_size * shard_elements), rank q's shard lands at q * shard_elements.
//                   input may point into output (in place).
//   reduce-scatter: input = the full buffer, output = this rank's shard: the sum over ranks, in
//                   rank order, of input[rank * shard_elements + i].
//   all-reduce:     input and output full; output = the sum over ranks.
struct Segment final {
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  DType dtype = DType::kBf16;  // element type (reductions); all-gathers move bytes
  std::size_t element_size = 1;
  std::size_t shard_elements = 0;
  std::size_t elements = 0;  // all-reduce: the whole buffer (not necessarily W * shard)
};

struct CollectiveTimes final {
  TimeUs arrived_us = 0;  // when this rank called it; it waits for the others until start_us
  TimeUs start_us = 0;    // when the last rank joined: the collective could start
  TimeUs end_us = 0;      // when every rank was done with it
  TimeUs wait_us() const { return start_us - arrived_us; }  // waiting for the other ranks
};

// Where the ranks' host threads meet between steps. Returns the abort's error when the run
// aborts, or a timeout naming the ranks that did not arrive.
class StepBarrier {
 public:
  virtual ~StepBarrier() = default;
  virtual Status Arrive(int rank, const OpContext& ctx) = 0;
};

// What a stream's collectives go through: in-process copies and sums (Communicator), or MPI
// between processes (process_group.h: MPI or Gloo). Each rank calls `Call` from one thread per
// transport, in the same order on every rank: call k of every rank forms one collective. A call
// waits until every rank has joined, checks they agree (rank divergence is reported, never hung),
// and returns once this rank's output is complete and its input no longer read. Reductions sum in
// rank order, element by element, whatever the transport (ReduceElements), so results are the
// same bits in every mode.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual StatusOr<CollectiveTimes> Call(int rank, const CollectiveDesc& desc,
                                         std::span<const Segment> segments,
                                         const OpContext& ctx) = 0;
  virtual int world_size() const = 0;
  virtual const std::string& name() const = 0;
};

// Every rank's host thread waits here until all `world_size` have arrived (reusable: the k-th
// arrival of each rank forms round k).
class RankBarrier final : public StepBarrier {
 public:
  RankBarrier(RunControl& control, int world_size);
  Status Arrive(int rank, const OpContext& ctx) override;

 private:
  RunControl& control_;
  const int world_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  AbortWaiter abort_waiter_{control_, mu_, cv_};
  std::uint64_t round_ = 0;
  std::vector<bool> arrived_;
  int count_ = 0;
};

// Under hsdp, the sub-communicators of the mesh (ModelLayout): shard group k joins the ranks
// whose shard_group_of is k, replica column c those whose shard_rank_of is c. The in-process run
// and the process group both form and name theirs from these.
struct MeshGroup final {
  std::string name;        // "shard group 1", "replica column 0"
  int index = 0;           // k or c
  std::vector<int> ranks;  // ascending; a communicator over the group numbers them 0..n-1
  // What errors call the group's communicator of `stream`, naming its ranks: "all_gather of
  // shard group 1 (ranks 2, 3)".
  std::string CommName(std::string_view stream) const;
};
MeshGroup ShardGroup(const ModelLayout& layout, int k);
MeshGroup ReplicaColumn(const ModelLayout& layout, int c);

// In-process collectives among `world_size` ranks (threads of this process): each call moves or
// sums the bytes straight from the other ranks' buffers and waits until every rank is done
// reading the inputs. `ranks`: a sub-communicator's world ranks, which its errors name.
class Communicator final : public Transport {
 public:
  Communicator(RunControl& control, int world_size, std::string name, std::vector<int> ranks = {});
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  StatusOr<CollectiveTimes> Call(int rank, const CollectiveDesc& desc,
                                 std::span<const Segment> segments, const OpContext& ctx) override;
  int world_size() const override { return world_size_; }
  const std::string& name() const override { return name_; }

 private:
  struct Slot {
    std::vector<const CollectiveDesc*> descs;
    std::vector<std::span<const Segment>> segments;
    std::vector<char> joined;
    int arrived = 0;
    int done = 0;
    int left = 0;
    TimeUs start_us = 0;
    bool checked = false;
    bool broken = false;   // a rank left early (timeout, abort): nobody may read its buffers
    std::string mismatch;  // set by the first rank that checked, if the ranks disagree
  };
  std::string CheckAgreement(const Slot& slot, std::uint64_t call) const;
  void Move(int rank, const Slot& slot) const;

  RunControl& control_;
  const int world_size_;
  const std::string name_;
  const std::vector<int> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  AbortWaiter abort_waiter_{control_, mu_, cv_};
  std::map<std::uint64_t, Slot> slots_;
  std::vector<std::uint64_t> next_call_;
};

}  // namespace fsdplab::host
