// cachalot as PyTorch's CUDA allocator: a complete c10::cuda::CUDACachingAllocator::CUDAAllocator over
// cachalot's public C API. This is the only C++ in the project: PyTorch's allocator interface is a C++
// class, so the layer that implements it must be C++; everything it does goes through <cachalot/cachalot.h>.
//
// PyTorch reaches the allocator through c10::cuda::CUDACachingAllocator::get() (tensors, record_stream,
// empty_cache, memory_stats, snapshots, CUDA graphs and their pools, torch.compile's graph trees) and
// through c10::GetAllocator(kCUDA); cachalot_torch_backend_install() points both at this object before the
// first CUDA allocation, as torch.cuda.memory.change_current_allocator does for a pluggable allocator.
//
// Contexts: while history is on, each allocation carries a Ctx (PyTorch's gathered stack, the compile
// context) through cachalot_malloc_with_context; cachalot keeps it with the block and the
// trace entry, counting references through ctx_retain / ctx_release, and snapshot() hands it back.
//
// What PyTorch's types look like is convert.cpp's business: this file holds the allocator PyTorch calls.
#include "convert.h"
#include "host.h"
#include "ipc.h"
#include "metadata.h"
#include "observe.h"
#include "pool_source.h"
#include "settings.h"
#include "uncached.h"

#include <c10/core/Allocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cachalot/cachalot.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

using namespace cachalot_torch;

thread_local std::vector<std::string> compile_contexts;

bool same_pool(cachalot_mempool_id a, cachalot_mempool_id b) { return a.first == b.first && a.second == b.second; }

// A snapshot taken from cachalot, freed with it.
struct Snapshot {
  cachalot_allocator* a;
  cachalot_snapshot_info* s = nullptr;
  explicit Snapshot(cachalot_allocator* alloc, bool traces) : a(alloc) {
    check(cachalot_snapshot_take(a, traces, &s), "snapshot");
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot() { cachalot_snapshot_info_free(a, s); }

  // The segments of `pool` on `device`, in the snapshot's (address) order, which the lists built from them keep.
  std::vector<const cachalot_snapshot_segment*> pool_segments(int device, cachalot_mempool_id pool) const {
    std::vector<const cachalot_snapshot_segment*> out;
    for (size_t i = 0; i < s->n_segments; i++) {
      const cachalot_snapshot_segment& seg = s->segments[i];
      if (seg.device == device && same_pool(seg.pool, pool))
        out.push_back(&seg);
    }
    return out;
  }
};

void raw_delete_fn(void* ptr);

class Allocator final : public cca::CUDAAllocator {
 public:
  // conf: install()'s config string; unset: CACHALOT_ALLOC_CONF's, read when cachalot is made.
  explicit Allocator(std::optional<std::string> conf) : install_conf_(std::move(conf)) {}

  // The allocator, made on first use: PyTorch's first CUDA use (init), or anything that needs it earlier.
  // Nothing touches CUDA before that, so a program may fork workers before its first CUDA call.
  cachalot_allocator* a() {
    cachalot_allocator* p = a_.load(std::memory_order_acquire);
    return p ? p : make();
  }

  // PyTorch's _set_allocator_settings, after PyTorch's own parsers took the string env: cachalot's share of
  // it, now, or when cachalot is made if it is not yet.
  void apply_settings(const std::string& env, const std::string& share) {
    std::lock_guard<std::mutex> g(make_mu_);
    cachalot_allocator* p = a_.load(std::memory_order_acquire);
    if (!p) {
      pending_.emplace_back(share, env);
      return;
    }
    if (cachalot_set_settings(p, share.c_str()) != CACHALOT_OK)
      TORCH_CHECK_VALUE(false, cachalot_last_error());
    std::lock_guard<std::mutex> m(mu_);
    conf_ = env;
  }

  // --- at::Allocator ---

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* p = nbytes ? malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream()) : nullptr;
    return {p, p, raw_deleter(), c10::Device(c10::DeviceType::CUDA, device)};
  }

  // caching_allocator_enable(False): the uncached allocations' own deleter, so that record_stream and
  // the like, which look for cachalot's deleter, leave them alone as native's leave its uncached ones
  c10::DeleterFnPtr raw_deleter() const override { return isEnabled() ? &raw_delete_fn : &uncached_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // --- CUDAAllocator ---

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return nbytes ? malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream()) : nullptr;
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return nbytes ? malloc_on(device, nbytes, stream) : nullptr;
  }

  void raw_delete(void* ptr) override {
    if (C10_UNLIKELY(uncached_any()) && uncached_free(ptr)) // raw_alloc'd while uncached
      return;
    free_ptr(ptr);
  }

  void init(int device_count) override {
    a();
    TORCH_CHECK(device_count <= devices_, "cachalot: PyTorch sees ", device_count, " CUDA devices, cachalot ",
                devices_);
    initialized_ = true;
  }

  bool initialized() override { return initialized_; }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 0;
    check(cachalot_get_memory_fraction(a(), device, &f), "getMemoryFraction");
    return f;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check(cachalot_set_memory_fraction(a(), device, fraction), "setMemoryFraction");
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    Snapshot snap(a(), false);
    return to_expandable_segment_sizes(*snap.s, device);
  }

  void emptyCache(MempoolId_t mempool_id) override {
    cachalot_allocator* al = a(); // made: devices_ is set
    if (is_default(mempool_id)) {
      check(cachalot_empty_cache(al), "emptyCache");
      return;
    }
    for (int d = 0; d < devices_; d++)
      check(cachalot_empty_cache_pool(al, d, to_id(mempool_id)), "emptyCache");
  }

  void enable(bool value) override { enabled_.store(value, std::memory_order_relaxed); }

  bool isEnabled() const override { return enabled_.load(std::memory_order_relaxed); }

  // cuDNN asks this with *largestBlock 0 for the workspace it may use: as native, the device's free memory
  // then, or the largest cached free block (of any pool) if that is larger.
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    size_t largest = *largestBlock;
    if (largest == 0) {
      c10::cuda::CUDAGuard guard(device);
      size_t total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(&largest, &total));
    }
    Snapshot snap(a(), false);
    for (size_t i = 0; i < snap.s->n_segments; i++) {
      const cachalot_snapshot_segment& seg = snap.s->segments[i];
      if (seg.device != device)
        continue;
      for (size_t k = 0; k < seg.n_blocks; k++)
        if (seg.blocks[k].state == CACHALOT_BLOCK_FREE)
          largest = std::max(largest, seg.blocks[k].size);
    }
    *largestBlock = largest;
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    Snapshot snap(a(), false);
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (size_t i = 0; i < snap.s->n_segments; i++) {
      const cachalot_snapshot_segment& seg = snap.s->segments[i];
      if (p >= seg.address && p < seg.address + seg.total_size) {
        if (size)
          *size = seg.total_size;
        return reinterpret_cast<void*>(seg.address);
      }
    }
    TORCH_CHECK(false, "cachalot: getBaseAllocation: ", ptr, " is not memory cachalot handed out");
  }

  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Memory another allocator handed out (from_blob, a pool's own allocator) is not cachalot's to track.
    if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn)
      return;
    check(cachalot_record_stream(a(), ptr.get(), stream.stream()), "recordStream");
  }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    cachalot_device_stats s;
    check(cachalot_memory_stats(a(), device, &s), "getDeviceStats");
    return to_device_stats(s);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(cachalot_reset_accumulated_stats(a(), device), "resetAccumulatedStats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check(cachalot_reset_peak_stats(a(), device), "resetPeakStats");
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    Snapshot snap(a(), include_traces);
    cca::SnapshotInfo out;
    const int when = when_.load();
    for (size_t i = 0; i < snap.s->n_segments; i++) {
      const cachalot_snapshot_segment& seg = snap.s->segments[i];
      if (!is_default(mempool_id) && !same_pool(seg.pool, to_id(mempool_id)))
        continue;
      out.segments.push_back(to_segment_info(seg));
    }
    out.device_traces.resize(static_cast<size_t>(devices_));
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; include_traces && i < snap.s->n_trace; i++) {
      const cachalot_trace_entry& e = snap.s->trace[i];
      const auto action = torch_action(e.action);
      if (skip_.count(action) || e.device < 0 || e.device >= devices_)
        continue;
      // PyTorch keeps stacks on trace entries from RecordContext::ALLOC on: a free entry has the free's
      // (with ALL) or else the block's (cachalot's rule too), a segment entry the malloc's.
      const bool keep = when >= static_cast<int>(cda::RecordContext::ALLOC);
      out.device_traces[static_cast<size_t>(e.device)].push_back(
          to_trace_entry(e, action, keep, metadata_.at(static_cast<size_t>(e.device), e.time_us)));
    }
    if (include_traces)
      out.external_annotations = annotations_;
    out.config_metadata = config_info();
    return out;
  }

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    auto f = std::make_unique<std::function<bool(cudaStream_t)>>(std::move(filter));
    std::lock_guard<std::mutex> g(routes_mu_);
    const auto key = std::make_pair(static_cast<int>(device), mempool_id);
    TORCH_CHECK(!routes_.count(key), "cachalot: beginAllocateToPool: already allocating to pool (", mempool_id.first,
                ", ", mempool_id.second, ")");
    check(cachalot_begin_allocate_to_pool(a(), device, to_id(mempool_id), &Allocator::filter_fn, f.get()),
          "beginAllocateToPool");
    routes_[key] = std::move(f);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    std::lock_guard<std::mutex> g(routes_mu_);
    check(cachalot_end_allocate_to_pool(a(), device, to_id(mempool_id)), "endAllocateToPool");
    routes_.erase(std::make_pair(static_cast<int>(device), mempool_id));
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cachalot_release_pool(a(), device, to_id(mempool_id)), "releasePool");
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    int n = 0;
    check(cachalot_pool_use_count(a(), device, to_id(mempool_id), &n), "getPoolUseCount");
    return n;
  }

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    int uses = 0; // a new pool takes the MemPool's allocator; an existing one is given a use, as native's
    const bool fresh = cachalot_pool_use_count(a(), device, to_id(mempool_id), &uses) != CACHALOT_OK;
    TORCH_CHECK(fresh || !allocator, "cachalot: createOrIncrefPool: pool (", mempool_id.first, ", ",
                mempool_id.second, ") exists: it cannot take an allocator now");
    check(cachalot_pool_incref(a(), device, to_id(mempool_id)), "createOrIncrefPool");
    try {
      if (allocator)
        set_pool_source(a(), device, to_id(mempool_id), std::move(allocator));
    } catch (...) { // the use just given goes back; the caller hears the first failure, not this one's
      if (cachalot_release_pool(a(), device, to_id(mempool_id)) != CACHALOT_OK) {}
      throw;
    }
  }

  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    check(cachalot_pool_set_use_on_oom(a(), device, to_id(mempool_id), use_on_oom), "setUseOnOOM");
  }

  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(cachalot_pool_set_no_split(a(), device, to_id(mempool_id)), "setNoSplit");
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    int uses = 0;
    check(cachalot_pool_use_count(a(), device, to_id(mempool_id), &uses), "checkPoolLiveAllocations");
    Snapshot snap(a(), false);
    size_t live = 0;
    for (const cachalot_snapshot_segment* seg : snap.pool_segments(device, to_id(mempool_id))) {
      for (size_t k = 0; k < seg->n_blocks; k++) {
        if (seg->blocks[k].state != CACHALOT_BLOCK_ALLOCATED)
          continue;
        if (!expected_live_allocations.count(reinterpret_cast<void*>(seg->blocks[k].address)))
          return false;
        live++;
      }
    }
    return live == expected_live_allocations.size();
  }

  cca::ShareableHandle shareIpcHandle(void* ptr) override { return share_ipc_handle(a(), ptr); }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override { return open_ipc_handle(handle); }

  bool isHistoryEnabled() override { return history_on_.load(); }

  void recordHistory(bool enabled, cda::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cda::RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) override {
    TORCH_CHECK(when == cda::RecordContext::NEVER || context_recorder,
                "cachalot: recordHistory needs a context recorder to record contexts");
    cachalot_allocator* al = a(); // before mu_: making the allocator takes it
    std::lock_guard<std::mutex> g(mu_);
    const size_t entries = std::max<size_t>(1, alloc_trace_max_entries);
    if (!enabled) {
      check(cachalot_record_history(al, false, 0), "recordHistory");
      annotations_.clear();
      history_entries_ = 0;
    } else if (clearHistory || history_entries_ != entries) {
      // cachalot starts a fresh buffer; the same size asked again without clearing keeps what is there
      check(cachalot_record_history(al, true, entries), "recordHistory");
      annotations_.clear();
      history_entries_ = entries;
    }
    skip_.clear();
    for (const std::string& s : skip_actions)
      skip_.insert(cda::parseTraceEntryAction(s));
    recorder_.store(enabled ? context_recorder : nullptr);
    when_.store(enabled ? static_cast<int>(when) : static_cast<int>(cda::RecordContext::NEVER));
    history_on_.store(enabled);
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!history_on_.load())
      return;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cda::AnnotationEntry ae(device, 0);
    ae.time_.t_ = static_cast<time_t>(now_us());
    for (const auto& kv : md)
      ae.recordUserMetadata(kv.first, kv.second);
    std::lock_guard<std::mutex> g(mu_);
    if (annotations_.size() >= std::max<size_t>(1, history_entries_)) // a ring, as the trace's
      annotations_.erase(annotations_.begin());
    annotations_.push_back(std::move(ae));
  }

  void pushCompileContext(std::string& md) override {
    if (history_on_.load())
      compile_contexts.push_back(md);
  }

  void popCompileContext() override {
    if (!compile_contexts.empty())
      compile_contexts.pop_back();
  }

  // One string per device, as native keeps it: allocations of any thread on the device carry it.
  void setUserMetadata(const std::string& metadata) override {
    a(); // sizes metadata_
    const size_t d = current_device();
    std::lock_guard<std::mutex> g(mu_);
    metadata_.set(d, metadata, now_us());
  }

  std::string getUserMetadata() override {
    a();
    const size_t d = current_device();
    std::lock_guard<std::mutex> g(mu_);
    return metadata_.current(d);
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override { oom_.attach(std::move(observer)); }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker) override {
    TORCH_CHECK(false, "cachalot: attachAllocatorTraceTracker (a callback at each allocator event) is not supported");
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();
    else
      C10_CUDA_CHECK(err);
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    // cachalot's segments are cudaMalloc'd or cuMemMap'ped (expandable): across devices without peer access
    // the latter need the peer copy, which serves both.
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    auto st = std::make_shared<PoolState>();
    check(cachalot_checkpoint_pool(a(), device, to_id(id), &st->st), "getCheckpointState");
    return st;
  }

  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    const cachalot_pool_state* st = pool_state_of(pps, device);
    cca::CheckpointDelta delta;
    {
      Snapshot snap(a(), false); // the pool's blocks handed out now: restoring frees them
      for (const cachalot_snapshot_segment* seg : snap.pool_segments(device, st->pool))
        for (size_t k = 0; k < seg->n_blocks; k++)
          if (seg->blocks[k].state == CACHALOT_BLOCK_ALLOCATED)
            delta.ptrs_freed.push_back(reinterpret_cast<void*>(seg->blocks[k].address));
    }
    void** ptrs = nullptr;
    size_t n = 0;
    CtxRef ctx(context_for(cda::RecordContext::STATE)); // the re-carved blocks', as native gives them
    check(cachalot_restore_pool_with_context(a(), st, ctx.p, &ptrs, &n), "setCheckpointPoolState");
    for (size_t i = 0; i < n; i++)
      delta.dataptrs_allocd.emplace_back(ptrs[i], ptrs[i], &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
    std::free(ptrs);
    return delta;
  }

  std::string name() override { return "cachalot"; }

  // --- the calls tensors make ---

  void* malloc_on(c10::DeviceIndex device, size_t nbytes, cudaStream_t stream) {
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) { // caching_allocator_enable(False)
      void* p = uncached_malloc(nbytes);
      observed_malloc(a(), device, p, -1);
      return p;
    }
    CtxRef ctx(context_for(cda::RecordContext::STATE));
    const int64_t mark = profiler_mark(a(), device);
    void* p = nullptr;
    cachalot_status rc = ctx.p ? cachalot_malloc_with_context(a(), device, nbytes, stream, ctx.p, &p)
                               : cachalot_malloc(a(), device, nbytes, stream, &p);
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY) {
      // PyTorch's message and type: torch.OutOfMemoryError, which programs catch to shrink a batch.
      TORCH_CHECK_WITH(OutOfMemoryError, false, cachalot_last_error());
    }
    if (rc != CACHALOT_OK)
      fail("malloc", rc);
    observed_malloc(a(), device, p, mark);
    return p;
  }

  void free_ptr(void* ptr) {
    if (!ptr)
      return;
    observing_free(ptr);
    c10::DeviceIndex device = 0;
    int64_t mark = -1;
    if (C10_UNLIKELY(profiling_memory())) { // the profiler's event names the block's device, as native's
      device = device_of(ptr);
      mark = profiler_mark(a(), device);
    }
    CtxRef ctx(when_.load(std::memory_order_relaxed) >= static_cast<int>(cda::RecordContext::ALL)
                   ? context_for(cda::RecordContext::ALL)
                   : nullptr);
    cachalot_status rc = ctx.p ? cachalot_free_with_context(a(), ptr, ctx.p) : cachalot_free(a(), ptr);
    if (rc != CACHALOT_OK)
      fail("free", rc);
    observed_free(a(), device, ptr, mark);
  }

 private:
  static bool filter_fn(cachalot_stream s, void* ctx) {
    try {
      return (*static_cast<std::function<bool(cudaStream_t)>*>(ctx))(s);
    } catch (...) { // an exception must not cross cachalot's C frames
      return false;
    }
  }

  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  static size_t current_device() {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return static_cast<size_t>(device);
  }

  // A context for a call, when history records contexts at `level` (PyTorch's
  // maybeGatherContext). Called before cachalot takes any lock: the recorder may take the GIL.
  Ctx* context_for(cda::RecordContext level) {
    if (when_.load(std::memory_order_relaxed) < static_cast<int>(level))
      return nullptr;
    cda::CreateContextFn recorder = recorder_.load();
    if (!recorder)
      return nullptr;
    auto c = std::make_unique<Ctx>();
    c->gathered = recorder();
    if (!compile_contexts.empty())
      c->compile_context = compile_contexts.back();
    return c.release();
  }

  cca::AllocatorConfigInfo config_info() {
    cachalot_settings st;
    check(cachalot_get_settings(a(), &st), "cachalot_get_settings");
    return to_config_info(st, conf_);
  }

  cachalot_allocator* make();

  std::optional<std::string> install_conf_;
  std::mutex make_mu_;                 // making the allocator; pending_
  std::vector<std::pair<std::string, std::string>> pending_; // settings given before it was made, in order:
                                                             // cachalot's share, the string given
  std::atomic<cachalot_allocator*> a_{nullptr};
  int devices_ = 0;
  std::string conf_; // the settings string last applied (the snapshot's last_allocator_settings)
  bool initialized_ = false;
  std::mutex mu_; // observers, annotations, history settings
  OomObservers oom_;
  std::vector<cda::AnnotationEntry> annotations_; // a ring of history_entries_ at most
  MetadataTimeline metadata_;
  std::set<cda::TraceEntry::Action> skip_;
  size_t history_entries_ = 0;
  std::atomic<bool> history_on_{false};
  std::atomic<bool> enabled_{true}; // false: caching_allocator_enable(False), uncached.h
  std::atomic<int> when_{static_cast<int>(cda::RecordContext::NEVER)};
  std::atomic<cda::CreateContextFn> recorder_{nullptr};
  std::mutex routes_mu_;
  std::map<std::pair<int, MempoolId_t>, std::unique_ptr<std::function<bool(cudaStream_t)>>> routes_;
};

// Lives until the process ends: tensors freed at exit still reach it.
Allocator* instance = nullptr;

// Made when PyTorch first uses CUDA, reading the environment then as native reads its config at first
// use (startup_conf), then the settings PyTorch was given before, in order.
cachalot_allocator* Allocator::make() {
  std::lock_guard<std::mutex> g(make_mu_);
  if (cachalot_allocator* p = a_.load(std::memory_order_acquire))
    return p;
  const std::string conf = startup_conf(install_conf_);
  cachalot_backend* b = nullptr;
  TORCH_CHECK(cachalot_backend_cuda(&b) == CACHALOT_OK, "cachalot: CUDA backend: ", cachalot_last_error());
  cachalot_allocator* p = nullptr;
  const cachalot_context_ops ops = {&ctx_retain, &ctx_release};
  int devices = 0;
  cachalot_status rc = cachalot_create(b, conf.c_str(), &p);
  if (rc == CACHALOT_OK)
    rc = cachalot_device_count(p, &devices);
  if (rc == CACHALOT_OK)
    rc = cachalot_set_context_ops(p, &ops);
  if (rc == CACHALOT_OK)
    rc = cachalot_attach_oom_observer(p, &OomObservers::call, &oom_);
  for (size_t i = 0; rc == CACHALOT_OK && i < pending_.size(); i++)
    rc = cachalot_set_settings(p, pending_[i].first.c_str());
  if (rc != CACHALOT_OK) {
    const std::string why = cachalot_last_error();
    cachalot_destroy(p);
    cachalot_backend_destroy(b);
    TORCH_CHECK_VALUE(false, "cachalot: ", why);
  }
  {
    std::lock_guard<std::mutex> m(mu_);
    metadata_.resize(static_cast<size_t>(devices));
    conf_ = pending_.empty() ? conf : pending_.back().second;
  }
  pending_.clear();
  devices_ = devices;
  a_.store(p, std::memory_order_release);
  return p;
}

cachalot_allocator* instance_allocator() { return instance->a(); }

void raw_delete_fn(void* ptr) { instance->free_ptr(ptr); }

} // namespace

extern "C" {

// Makes cachalot PyTorch's CUDA allocator. conf: a CACHALOT_ALLOC_CONF string, NULL for the environment's.
// Touches no CUDA: cachalot is made at PyTorch's first CUDA use. 0 on success (also when already
// installed); otherwise -1 with the reason in err (a malformed config string among them).
__attribute__((visibility("default"))) int cachalot_torch_backend_install(const char* conf, char* err, size_t len) {
  try {
    if (instance && cca::get() == instance)
      return 0;
    cca::CUDAAllocator* current = cca::get();
    if (current && current->initialized()) {
      set_error(err, len,
                "PyTorch's CUDA allocator (" + current->name() +
                    ") is already in use: call cachalot.torch.install() before anything allocates CUDA memory");
      return -1;
    }
    const std::string torch_env = torch_env_conf();
    if (auto backend = conf_value(torch_env, "backend"); backend && *backend != "native") {
      set_error(err, len, "cachalot: PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF ask for backend:" + *backend +
                              ", another allocator: unset it to use cachalot, or do not install cachalot");
      return -1;
    }
    // Malformed strings fail here, not at the first CUDA use: PyTorch's parsers read their variable now
    // (with cachalot's keys known to them; their errors are PyTorch's, and backend:native is checked
    // against the native allocator, still the one in use), then cachalot checks its share and its own.
    register_settings_hook([](const std::string& env, const std::string& share) {
      if (instance)
        instance->apply_settings(env, share);
    });
    c10::CachingAllocator::AcceleratorAllocatorConfig::instance();
    cca::CUDAAllocatorConfig::instance();
    if (auto key = unknown_key(torch_env)) {
      set_error(err, len, "cachalot: unrecognized key '" + *key + "' in PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF");
      return -1;
    }
    if (cachalot_check_config(cachalot_share(torch_env).c_str()) != CACHALOT_OK ||
        cachalot_check_config(conf) != CACHALOT_OK) {
      set_error(err, len, std::string("cachalot: ") + cachalot_last_error());
      return -1;
    }
    if (!instance)
      instance = new Allocator(conf ? std::optional<std::string>(conf) : std::nullopt);
    cca::allocator.store(instance);
    c10::SetAllocator(c10::DeviceType::CUDA, instance, 0);
    return 0;
  } catch (const c10::Error& e) { // PyTorch's own message (a malformed PYTORCH_CUDA_ALLOC_CONF), no C++ frames
    set_error(err, len, e.what_without_backtrace());
    return -1;
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
    return -1;
  }
}

// Makes the installed allocator's host cache PyTorch's CUDA host (pinned memory) allocator. 0 on success
// (also when already installed); -1 with the reason in err when the device allocator is not installed.
__attribute__((visibility("default"))) int cachalot_torch_host_install(char* err, size_t len) {
  try {
    if (!instance) {
      set_error(err, len, "cachalot: install the CUDA allocator first (cachalot.torch.install())");
      return -1;
    }
    install_host_allocator(&instance_allocator);
    return 0;
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
    return -1;
  }
}

// The allocator the backend serves from (NULL before install): for cachalot's own calls (snapshots, stats).
__attribute__((visibility("default"))) cachalot_allocator* cachalot_torch_backend_allocator(void) {
  try {
    return instance ? instance->a() : nullptr;
  } catch (const std::exception&) { // not made: cachalot_last_error() already says why
    return nullptr;
  }
}

} // extern "C"
