// cachalot's host cache as PyTorch's CUDA host allocator: an at::HostAllocator over <cachalot/host.h>,
// installed with at::setHostAllocator(kCUDA), through which pin_memory(), torch.empty(pin_memory=True),
// DataLoader's pinning, the record_event of non_blocking copies, torch._C._host_emptyCache and
// torch.cuda.host_memory_stats() reach it.
//
// CUDA graphs: PyTorch routes the pinned allocations of a capture to a private pool (begin/end_allocate_to_
// pool) because a captured copy reads its pinned source at every replay, long after the tensor is freed.
// cachalot's host cache has no private pools, so this layer keeps the pool's blocks out of the cache
// instead. A block pinned while a capture routes to a pool is the pool's: freed unread, it is reused by the
// pool's next capture only (as native reuses it); read by a captured copy (marked with a capturing stream),
// it is never reused. Both go back to the cache only when the pool is released (the graphs that could
// replay them are gone), after a device synchronization.
#include "convert.h"
#include "host.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cachalot/cachalot.h>

#include <cstring>
#include <functional>
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <utility>
#include <vector>

namespace {

using c10::MempoolId_t;
using namespace cachalot_torch;

void host_delete(void* ptr);

class HostAllocator final : public at::HostAllocator {
 public:
  HostAllocator(cachalot_allocator* (*get)(), at::HostAllocator* prev) : get_(get), prev_(prev) {}

  at::DataPtr allocate(size_t size) override {
    void* p = nullptr;
    const size_t round = size < 2 ? size : size_t{1} << (64 - __builtin_clzll(size - 1)); // the cache's size
    std::optional<MempoolId_t> pool;
    {
      std::lock_guard<std::mutex> g(mu_);
      pool = routed_pool();
      auto it = pool ? pools_.find(*pool) : pools_.end();
      if (it != pools_.end() && round) { // the pool's own free block of this size first
        auto& list = it->second.free[round];
        if (!list.empty()) {
          p = list.back();
          list.pop_back();
          own(p, Owned{*pool, round, {}, false});
          return {p, p, &host_delete, at::Device(at::DeviceType::CPU)};
        }
      }
    }
    check(cachalot_host_malloc(a(), size, &p), "pinned host allocation");
    if (pool && p) {
      std::lock_guard<std::mutex> g(mu_);
      if (pools_.count(*pool)) // released meanwhile: the block is the cache's, freed the usual way
        own(p, Owned{*pool, round, {}, false});
    }
    return {p, p, &host_delete, at::Device(at::DeviceType::CPU)};
  }

  at::DeleterFnPtr raw_deleter() const override { return &host_delete; }

  // Around a fork (pthread_atfork): a forked child that frees a pinned tensor (at its interpreter's
  // teardown) must not wait on the lock a thread of the parent held.
  void fork_lock() { mu_.lock(); }
  void fork_unlock() { mu_.unlock(); }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count)
      std::memcpy(dest, src, count);
  }

  void free(void* p) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = owned_.find(p);
      if (it != owned_.end()) { // a pool's: kept for the graphs that read it, or for its pool's captures
        Owned o = std::move(it->second);
        owned_.erase(it);
        n_owned_.store(owned_.size(), std::memory_order_relaxed);
        auto pool = o.pool ? pools_.find(*o.pool) : pools_.end();
        try {
          if (!o.readers.empty()) {
            kept_[p] = std::move(o.readers);
            return;
          }
          // unread: the pool's next captures may take it, unless a copy outside any capture used it (its
          // event is the cache's to wait for)
          if (pool != pools_.end() && o.size && !o.used_outside) {
            pool->second.free[o.size].push_back(p);
            return;
          }
        } catch (const std::exception&) { // a deleter must not throw: kept pinned for good instead
          TORCH_WARN("cachalot: no host memory to keep a graph's pinned block; it stays pinned");
          return;
        }
      }
    }
    // a deleter must not throw: a failure here (an event cannot be recorded) leaves the block allocated
    if (cachalot_host_free(a(), p) != CACHALOT_OK)
      TORCH_WARN("cachalot: freeing pinned memory: ", cachalot_last_error());
  }

  // PyTorch calls this for every non_blocking copy between the host and a device, pinned or not: memory
  // that is not a block of cachalot's is the previous allocator's (pinned before the install) or nobody's.
  // ptr is the copied tensor's data, which a slice places inside its block; ctx is what allocate() gave
  // the DataPtr, the block's start, so the block is found by ctx first.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    const c10::cuda::CUDAStream s(stream);
    void* block = ctx ? ctx : ptr;
    const auto cs = reinterpret_cast<cachalot_stream>(s.stream());
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s.stream(), &capturing) != cudaSuccess)
      (void)cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone) {
      // the copy is a graph's, which may replay it at any time: the block is kept until its pool goes
      std::lock_guard<std::mutex> g(mu_);
      auto it = owned_.find(block);
      for (auto& c : captures_)
        if (c.second(stream)) {
          if (it != owned_.end() && std::count(it->second.readers.begin(), it->second.readers.end(), c.first))
            return true;
          // the mark tells whether the block is cachalot's; its event is recorded at the pool's release
          if (cachalot_host_record_event(a(), block, s.device_index(), cs) != CACHALOT_OK)
            break;
          if (it == owned_.end()) // pinned before the capture and read by it: kept for its graphs now
            it = own(block, Owned{});
          it->second.readers.push_back(c.first); // kept until every pool whose graph read it is released
          return true;
        }
    }
    if (C10_UNLIKELY(n_owned_.load(std::memory_order_relaxed) != 0)) { // a pool's block used by eager work
      std::lock_guard<std::mutex> g(mu_);
      auto it = owned_.find(block);
      if (it != owned_.end())
        it->second.used_outside = true;
    }
    cachalot_status rc = cachalot_host_record_event(a(), block, s.device_index(), cs);
    if (rc == CACHALOT_ERROR_INVALID_POINTER && block != ptr)
      rc = cachalot_host_record_event(a(), ptr, s.device_index(), cs);
    if (rc == CACHALOT_ERROR_INVALID_POINTER)
      return prev_ ? prev_->record_event(ptr, ctx, stream) : false;
    check(rc, "recording a stream's use of pinned memory");
    return true;
  }

  void empty_cache() override {
    check(cachalot_host_empty_cache(a()), "emptying the pinned host cache");
    if (prev_)
      prev_->empty_cache();
  }

  at::HostStats get_stats() override {
    cachalot_host_stats s;
    check(cachalot_host_memory_stats(a(), &s), "pinned host stats");
    return to_host_stats(s);
  }

  void reset_accumulated_stats() override {
    check(cachalot_host_reset_accumulated_stats(a()), "resetting pinned host stats");
  }

  void reset_peak_stats() override { check(cachalot_host_reset_peak_stats(a()), "resetting pinned host peaks"); }

  void begin_allocate_to_pool(MempoolId_t pool, std::function<bool(c10::Stream)> filter) override {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& c : captures_)
      TORCH_CHECK(c.first != pool, "cachalot: beginAllocateToPool: already recording to this pool");
    Pool& p = pools_[pool];
    if (p.uses++ == 0)
      p.device = c10::cuda::current_device();
    captures_.emplace_back(pool, std::move(filter));
  }

  void end_allocate_to_pool(MempoolId_t pool) override {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = captures_.begin(); it != captures_.end(); ++it)
      if (it->first == pool) {
        captures_.erase(it);
        return;
      }
    TORCH_CHECK(false, "cachalot: endAllocateToPool: not recording to this pool");
  }

  void release_pool(MempoolId_t pool) override {
    std::vector<void*> back;
    bool alive = false; // blocks of the pool still allocated: freed later, the usual way
    c10::DeviceIndex device = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = pools_.find(pool);
      TORCH_CHECK(it != pools_.end() && it->second.uses > 0, "cachalot: releasePool: no such pinned pool");
      if (--it->second.uses > 0)
        return;
      for (auto& sized : it->second.free)
        back.insert(back.end(), sized.second.begin(), sized.second.end());
      device = it->second.device;
      pools_.erase(it);
      for (auto k = kept_.begin(); k != kept_.end();) { // freed blocks its graphs read: the last reader frees
        k->second.erase(std::remove(k->second.begin(), k->second.end(), pool), k->second.end());
        if (k->second.empty()) {
          back.push_back(k->first);
          k = kept_.erase(k);
        } else {
          ++k;
        }
      }
      for (auto& o : owned_) { // still allocated: freed later, the usual way once no reader is left
        auto& r = o.second.readers;
        alive |= std::count(r.begin(), r.end(), pool) > 0 || o.second.pool == pool;
        r.erase(std::remove(r.begin(), r.end(), pool), r.end());
        if (o.second.pool == pool)
          o.second.pool.reset();
      }
    }
    if (back.empty() && !alive)
      return;
    // The pool's last graph is going (PyTorch releases the pool before it destroys the instance), but its
    // last replay may still be reading, on the capture's device: wait for it there. Without that wait the
    // blocks stay pinned for good rather than be reused under a replay.
    cudaError_t err;
    {
      c10::cuda::CUDAGuard guard(device);
      err = cudaDeviceSynchronize();
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      TORCH_WARN("cachalot: cannot wait for a released graph pool's replays (", cudaGetErrorString(err), "): its ",
                 back.size(), " pinned blocks stay pinned");
      return;
    }
    for (void* p : back)
      if (cachalot_host_free(a(), p) != CACHALOT_OK)
        TORCH_WARN("cachalot: freeing pinned memory of a released graph pool: ", cachalot_last_error());
  }

 private:
  struct Pool {
    int uses = 0;
    c10::DeviceIndex device = 0;                // where its captures ran
    std::map<size_t, std::vector<void*>> free;  // freed unread, by the cache's size: for the next captures
  };
  // An allocated block pinned while a capture routed to `pool` (size: the cache's rounding), or pinned
  // before and read by a captured copy (no pool, size 0).
  struct Owned {
    std::optional<MempoolId_t> pool;
    size_t size = 0;
    std::vector<MempoolId_t> readers; // pools whose graphs read it: they may replay that copy
    bool used_outside = false;        // an eager copy used it: its event is the cache's to wait for
  };
  std::map<void*, Owned>::iterator own(void* p, Owned o) { // (mu_ held)
    auto it = owned_.insert_or_assign(p, std::move(o)).first;
    n_owned_.store(owned_.size(), std::memory_order_relaxed);
    return it;
  }

  // The pool the current stream's capture allocates to, if any (mu_ held).
  std::optional<MempoolId_t> routed_pool() const {
    if (captures_.empty())
      return std::nullopt;
    const c10::Stream stream = c10::cuda::getCurrentCUDAStream();
    for (auto& c : captures_)
      if (c.second(stream))
        return c.first;
    return std::nullopt;
  }

  // The device allocator is made at PyTorch's first CUDA use; pinning is one (it needs the CUDA context).
  cachalot_allocator* a() const { return get_(); }

  cachalot_allocator* (*get_)();
  at::HostAllocator* prev_;
  std::mutex mu_;
  std::vector<std::pair<MempoolId_t, std::function<bool(c10::Stream)>>> captures_;
  std::map<MempoolId_t, Pool> pools_;
  std::map<void*, Owned> owned_;                       // allocated blocks that belong to pools
  std::atomic<size_t> n_owned_{0};                     // owned_.size(), read before any lock
  std::map<void*, std::vector<MempoolId_t>> kept_;     // freed blocks graphs read: until their pools go
};

HostAllocator* host_instance = nullptr;

void host_delete(void* ptr) {
  if (ptr)
    host_instance->free(ptr);
}

} // namespace

namespace cachalot_torch {

void install_host_allocator(cachalot_allocator* (*get)()) {
  if (host_instance)
    return;
  at::HostAllocator* prev = at::getHostAllocator(at::kCUDA);
  host_instance = new HostAllocator(get, prev); // lives as long as the process: PyTorch keeps pointers to it
  (void)pthread_atfork([] { host_instance->fork_lock(); }, [] { host_instance->fork_unlock(); },
                       [] { host_instance->fork_unlock(); });
  at::setHostAllocator(at::kCUDA, host_instance, 1); // above the built-in one's registration (0)
}

bool host_allocator_installed() { return host_instance != nullptr; }

} // namespace cachalot_torch
