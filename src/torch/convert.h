// Private to the PyTorch backend: cachalot's C structures turned into the c10 types PyTorch's allocator
// interface returns (device stats, snapshots, trace entries, allocator settings) and back (pool ids,
// checkpoints). Apart from the allocator class so that what follows a torch release's types changes here.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cachalot/cachalot.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

// Nothing here leaves the shared library, whatever flags a build passes.
#pragma GCC visibility push(hidden)

namespace cachalot_torch {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using c10::MempoolId_t;

// What cachalot keeps with a block or trace entry: PyTorch's context (a CapturedTraceback, which
// torch.cuda.memory._snapshot() symbolizes) and the compiled region the call came from.
struct Ctx {
  std::atomic<int> refs{1};
  std::shared_ptr<c10::GatheredContext> gathered;
  std::string compile_context; // "" outside a compiled region
};

// cachalot's context ops: a Ctx counts its references (one per block and trace entry that keeps it).
void ctx_retain(void* p);
void ctx_release(void* p);

// One reference to a Ctx for the length of a call.
struct CtxRef {
  Ctx* p = nullptr;
  CtxRef() = default;
  explicit CtxRef(Ctx* c) : p(c) {}
  CtxRef(const CtxRef&) = delete;
  CtxRef& operator=(const CtxRef&) = delete;
  ~CtxRef() {
    if (p)
      ctx_release(p);
  }
};

// A checkpoint of a private pool (CUDA-graph trees): cachalot's pool state, owned.
struct PoolState : cca::AllocatorState {
  cachalot_pool_state* st = nullptr;
  ~PoolState() override;
};

// A failed cachalot call as PyTorch's error (c10::Error, RuntimeError in Python), with cachalot's message.
[[noreturn]] void fail(const char* what, cachalot_status rc);
void check(cachalot_status rc, const char* what);
// A message into an extern "C" entry point's err buffer of len bytes (either may be NULL / 0).
void set_error(char* err, size_t len, const std::string& msg);

cachalot_mempool_id to_id(MempoolId_t id);
bool is_default(MempoolId_t id);

cda::DeviceStats to_device_stats(const cachalot_device_stats& s);
at::HostStats to_host_stats(const cachalot_host_stats& s);

std::vector<cca::StreamSegmentSize> to_expandable_segment_sizes(const cachalot_snapshot_info& s,
                                                                c10::DeviceIndex device);

cda::SegmentInfo to_segment_info(const cachalot_snapshot_segment& seg);

cda::TraceEntry::Action torch_action(cachalot_trace_action a);

// keep_frames: whether the entry carries its stack (history records contexts at ALLOC or more);
// user_metadata: the string in force when it was recorded.
cda::TraceEntry to_trace_entry(const cachalot_trace_entry& e, cda::TraceEntry::Action action, bool keep_frames,
                               const std::string& user_metadata);

// The settings in force (cachalot_get_settings) as PyTorch's snapshot shows them; conf: the string given.
cca::AllocatorConfigInfo to_config_info(const cachalot_settings& st, const std::string& conf);

// The cachalot state inside a checkpoint PyTorch hands back; refuses another allocator's or another device's.
const cachalot_pool_state* pool_state_of(const std::shared_ptr<cca::AllocatorState>& pps, c10::DeviceIndex device);

} // namespace cachalot_torch

#pragma GCC visibility pop
