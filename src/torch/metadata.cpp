// torch.cuda.memory._set_memory_metadata's strings over time (metadata.h).
#include "metadata.h"

#include <algorithm>
#include <iterator>

namespace cachalot_torch {

void MetadataTimeline::set(size_t device, std::string metadata, int64_t now_us) {
  if (device >= changes_.size())
    return;
  auto& c = changes_[device].changes;
  if (metadata == current(device)) // a label set again each step is no change
    return;
  if (!c.empty() && c.back().first > now_us) // the clock stepped back: keep the times ordered
    now_us = c.back().first;
  c.emplace_back(now_us, std::move(metadata));
  if (c.size() > kMaxChanges) {
    changes_[device].before = std::move(c.front().second);
    c.pop_front();
  }
}

std::string MetadataTimeline::current(size_t device) const {
  if (device >= changes_.size())
    return "";
  const auto& d = changes_[device];
  return d.changes.empty() ? d.before : d.changes.back().second;
}

std::string MetadataTimeline::at(size_t device, int64_t t_us) const {
  if (device >= changes_.size())
    return "";
  const auto& d = changes_[device];
  // the last change at or before t_us; before the oldest kept, the value it replaced
  auto it = std::upper_bound(d.changes.begin(), d.changes.end(), t_us,
                             [](int64_t t, const std::pair<int64_t, std::string>& ch) { return t < ch.first; });
  return it == d.changes.begin() ? d.before : std::prev(it)->second;
}

} // namespace cachalot_torch
