// Private to the PyTorch backend: torch.cuda.memory._set_memory_metadata's strings over time.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// One string per device, as native keeps it, and its past values: PyTorch gives every trace entry the
// string in force when the entry was recorded, whatever its action; cachalot's entries carry their time
// (the same clock), so the snapshot looks the string up by it. Not locked: the caller's mutex guards it.
class MetadataTimeline {
 public:
  void resize(size_t devices) { changes_.resize(devices); }
  void set(size_t device, std::string metadata, int64_t now_us);
  std::string current(size_t device) const;
  // The string in force at t_us on `device` (before the oldest change kept: the value it replaced).
  std::string at(size_t device, int64_t t_us) const;

 private:
  static constexpr size_t kMaxChanges = 4096; // older changes go: entries that old read `before`
  struct Device {
    std::deque<std::pair<int64_t, std::string>> changes; // by time
    std::string before; // the value before the oldest change kept ("" until one is dropped)
  };
  std::vector<Device> changes_;
};

} // namespace cachalot_torch

#pragma GCC visibility pop
