// The conversions of convert.h: cachalot's figures and snapshots as PyTorch's allocator types hold them, so
// that torch.cuda.memory_stats, _snapshot and the CUDA-graph trees read cachalot as they read native.
#include "convert.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <utility>

namespace cachalot_torch {

void ctx_retain(void* p) { static_cast<Ctx*>(p)->refs.fetch_add(1, std::memory_order_relaxed); }

void ctx_release(void* p) {
  Ctx* c = static_cast<Ctx*>(p);
  if (c->refs.fetch_sub(1, std::memory_order_acq_rel) == 1)
    delete c;
}

namespace {

void copy_stat(c10::CachingAllocator::Stat& to, const cachalot_stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_duration(c10::CachingAllocator::DurationStat& to, const cachalot_duration_stat& from) {
  to.total = from.total;
  to.max = from.max;
  to.min = from.min;
  to.count = from.count;
}

void copy_stats(c10::CachingAllocator::StatArray& to, const cachalot_stat from[3]) {
  for (size_t i = 0; i < 3; i++) // both order all, small pool, large pool
    copy_stat(to[i], from[i]);
}

std::shared_ptr<c10::GatheredContext> gathered_of(void* ctx) {
  return ctx ? static_cast<Ctx*>(ctx)->gathered : nullptr;
}

} // namespace

[[noreturn]] void fail(const char* what, cachalot_status rc) {
  TORCH_CHECK(false, "cachalot: ", what, ": ", cachalot_last_error(), " (", cachalot_status_name(rc), ")");
}

void check(cachalot_status rc, const char* what) {
  if (rc != CACHALOT_OK)
    fail(what, rc);
}

void set_error(char* err, size_t len, const std::string& msg) {
  if (err && len)
    std::snprintf(err, len, "%s", msg.c_str());
}

PoolState::~PoolState() { cachalot_pool_state_free(st); }

cachalot_mempool_id to_id(MempoolId_t id) { return cachalot_mempool_id{id.first, id.second}; }

bool is_default(MempoolId_t id) { return id.first == 0 && id.second == 0; }

cda::DeviceStats to_device_stats(const cachalot_device_stats& s) {
  cda::DeviceStats t;
  copy_stats(t.allocation, s.allocation);
  copy_stats(t.segment, s.segment);
  copy_stats(t.active, s.active);
  copy_stats(t.inactive_split, s.inactive_split);
  copy_stats(t.allocated_bytes, s.allocated_bytes);
  copy_stats(t.reserved_bytes, s.reserved_bytes);
  copy_stats(t.active_bytes, s.active_bytes);
  copy_stats(t.inactive_split_bytes, s.inactive_split_bytes);
  copy_stats(t.requested_bytes, s.requested_bytes);
  copy_stat(t.oversize_allocations, s.oversize_allocations);
  copy_stat(t.oversize_segments, s.oversize_segments);
  t.num_alloc_retries = s.num_alloc_retries;
  t.num_ooms = s.num_ooms;
  t.num_sync_all_streams = s.num_sync_all_streams;
  t.num_device_alloc = s.num_device_alloc;
  t.num_device_free = s.num_device_free;
  t.max_split_size = s.max_split_size;
  return t;
}

at::HostStats to_host_stats(const cachalot_host_stats& s) {
  at::HostStats t;
  copy_stat(t.active_requests, s.active_requests);
  copy_stat(t.active_bytes, s.active_bytes);
  copy_stat(t.allocations, s.allocations);
  copy_stat(t.allocated_bytes, s.allocated_bytes);
  copy_duration(t.host_alloc_time, s.host_alloc_time);
  copy_duration(t.host_free_time, s.host_free_time);
  t.num_host_alloc = s.num_host_alloc;
  t.num_host_free = s.num_host_free;
  return t;
}

std::vector<cca::StreamSegmentSize> to_expandable_segment_sizes(const cachalot_snapshot_info& s,
                                                                c10::DeviceIndex device) {
  std::vector<cca::StreamSegmentSize> out;
  for (size_t i = 0; i < s.n_segments; i++) {
    const cachalot_snapshot_segment& seg = s.segments[i];
    if (seg.device != device || !seg.expandable)
      continue;
    auto same = [&](const cca::StreamSegmentSize& x) { return x.stream == seg.stream && x.is_small_pool == seg.small; };
    auto it = std::find_if(out.begin(), out.end(), same);
    if (it == out.end())
      out.emplace_back(seg.stream, seg.small, seg.total_size);
    else
      it->total_size += seg.total_size;
  }
  return out;
}

cda::SegmentInfo to_segment_info(const cachalot_snapshot_segment& seg) {
  cda::SegmentInfo si;
  si.device = static_cast<c10::DeviceIndex>(seg.device);
  si.address = seg.address;
  si.total_size = seg.total_size;
  si.stream = seg.stream;
  si.is_large = !seg.small;
  si.is_expandable = seg.expandable;
  si.owner_private_pool_id = MempoolId_t{seg.pool.first, seg.pool.second};
  for (size_t k = 0; k < seg.n_blocks; k++) {
    const cachalot_snapshot_block& b = seg.blocks[k];
    cda::BlockInfo bi;
    bi.size = b.size;
    bi.requested_size = b.requested;
    bi.allocated = b.state == CACHALOT_BLOCK_ALLOCATED;
    bi.active = b.state != CACHALOT_BLOCK_FREE;
    bi.context_when_allocated = gathered_of(b.context);
    si.requested_size += b.requested;
    if (bi.allocated)
      si.allocated_size += b.size;
    if (bi.active)
      si.active_size += b.size;
    si.blocks.push_back(std::move(bi));
  }
  return si;
}

cda::TraceEntry::Action torch_action(cachalot_trace_action a) {
  switch (a) {
  case CACHALOT_TRACE_ALLOC: return cda::TraceEntry::ALLOC;
  case CACHALOT_TRACE_FREE_REQUESTED: return cda::TraceEntry::FREE_REQUESTED;
  case CACHALOT_TRACE_FREE_COMPLETED: return cda::TraceEntry::FREE_COMPLETED;
  case CACHALOT_TRACE_SEGMENT_ALLOC: return cda::TraceEntry::SEGMENT_ALLOC;
  case CACHALOT_TRACE_SEGMENT_FREE: return cda::TraceEntry::SEGMENT_FREE;
  case CACHALOT_TRACE_SEGMENT_MAP: return cda::TraceEntry::SEGMENT_MAP;
  case CACHALOT_TRACE_SEGMENT_UNMAP: return cda::TraceEntry::SEGMENT_UNMAP;
  case CACHALOT_TRACE_SNAPSHOT: return cda::TraceEntry::SNAPSHOT;
  case CACHALOT_TRACE_OOM: return cda::TraceEntry::OOM;
  }
  return cda::TraceEntry::SNAPSHOT;
}

cda::TraceEntry to_trace_entry(const cachalot_trace_entry& e, cda::TraceEntry::Action action, bool keep_frames,
                               const std::string& user_metadata) {
  // PyTorch writes "N/A" where an entry has no compiled region; its frames only from RecordContext::ALLOC on
  const Ctx* c = static_cast<const Ctx*>(e.context);
  const std::string region = c && !c->compile_context.empty() ? c->compile_context : "N/A";
  cda::TraceEntry te(action, static_cast<c10::DeviceIndex>(e.device), e.addr, e.size, e.stream, MempoolId_t{0, 0}, 0,
                     c && keep_frames ? c->gathered : nullptr, region, user_metadata);
  te.time_.t_ = static_cast<time_t>(e.time_us); // PyTorch's snapshot reads microseconds here
  return te;
}

cca::AllocatorConfigInfo to_config_info(const cachalot_settings& st, const std::string& conf) {
  cca::AllocatorConfigInfo ci{};
  ci.garbage_collection_threshold = st.garbage_collection_threshold;
  ci.max_split_size = st.max_split_size;
  ci.pinned_num_register_threads = st.pinned_num_register_threads;
  ci.expandable_segments = st.expandable_segments;
  ci.release_lock_on_malloc = st.release_lock_on_cudamalloc;
  ci.pinned_use_host_register = st.pinned_use_cuda_host_register;
  ci.last_allocator_settings = conf;
  ci.roundup_power2_divisions.assign(std::begin(st.roundup_power2_divisions), std::end(st.roundup_power2_divisions));
  return ci;
}

const cachalot_pool_state* pool_state_of(const std::shared_ptr<cca::AllocatorState>& pps, c10::DeviceIndex device) {
  auto st = std::dynamic_pointer_cast<PoolState>(pps);
  TORCH_CHECK(st && st->st, "cachalot: setCheckpointPoolState: not a checkpoint of cachalot's");
  TORCH_CHECK(st->st->device == device, "cachalot: setCheckpointPoolState: a checkpoint of device ", st->st->device,
              ", not ", static_cast<int>(device));
  return st->st;
}

} // namespace cachalot_torch
