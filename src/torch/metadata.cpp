// torch.cuda.memory._set_memory_metadata's strings over time (metadata.h).
#include "metadata.h"

#include <algorithm>

namespace cachalot_torch {

void MetadataTimeline::set(size_t device, std::string metadata, int64_t now_us) {
  if (device >= changes_.size())
    return;
  auto& c = changes_[device];
  if (!c.empty() && c.back().first > now_us) // the clock stepped back: keep the times ordered
    now_us = c.back().first;
  c.emplace_back(now_us, std::move(metadata));
  if (c.size() > kMaxChanges)
    c.pop_front();
}

std::string MetadataTimeline::current(size_t device) const {
  return device < changes_.size() && !changes_[device].empty() ? changes_[device].back().second : "";
}

std::string MetadataTimeline::at(size_t device, int64_t t_us) const {
  if (device >= changes_.size())
    return "";
  const auto& c = changes_[device];
  // the last change at or before t_us
  auto it = std::upper_bound(c.begin(), c.end(), t_us,
                             [](int64_t t, const std::pair<int64_t, std::string>& ch) { return t < ch.first; });
  if (it == c.begin())
    return c.size() == kMaxChanges ? c.front().second : "";
  return std::prev(it)->second;
}

} // namespace cachalot_torch
