// How PyTorch's config strings reach cachalot: cachalot's share of PYTORCH_ALLOC_CONF /
// PYTORCH_CUDA_ALLOC_CONF, and the hook through which torch.cuda.memory._set_allocator_settings reaches
// the allocator at run time.
#include "settings.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/util/Exception.h>

#include <cachalot/cachalot.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

namespace cachalot_torch {

namespace {

std::string without_spaces(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  return s;
}

// Whether `key` is one cachalot's parser takes (cachalot_config_keys).
bool is_cachalot_key(const std::string& key) {
  static const std::set<std::string> keys = [] {
    std::set<std::string> k;
    for (const char* const* p = cachalot_config_keys(); *p; p++)
      k.insert(*p);
    return k;
  }();
  return keys.count(key) != 0;
}

// One config string as items "key:value" (a value may be a [list]), split at the commas outside brackets.
std::vector<std::pair<std::string, std::string>> conf_items(const std::string& conf) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string item;
  int depth = 0;
  auto flush = [&] {
    const size_t colon = item.find(':');
    std::string key = without_spaces(item.substr(0, colon));
    if (!key.empty() || colon != std::string::npos)
      out.emplace_back(key, item);
    item.clear();
  };
  for (char c : conf) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c == ',' && depth <= 0)
      flush();
    else
      item += c;
  }
  flush();
  return out;
}

} // namespace

// PyTorch's parsers have already refused keys neither knows; the keys only PyTorch's allocators read
// (pinned_use_background_threads, pinned_reserve_segment_size_mb, ...) are left to them.
std::string cachalot_share(const std::string& conf) {
  std::string out;
  for (auto& [key, item] : conf_items(conf)) {
    std::string text = item;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) // not "key:value": PyTorch's parser says what is wrong with it
      continue;
    if (key == "release_lock_on_hipmalloc" || key == "pinned_use_hip_host_register") {
      const std::string cuda = key == "release_lock_on_hipmalloc" ? "release_lock_on_cudamalloc"
                                                                   : "pinned_use_cuda_host_register";
      text = cuda + item.substr(colon);
    } else if (!is_cachalot_key(key)) {
      continue;
    }
    out += (out.empty() ? "" : ",") + text;
  }
  return out;
}

std::optional<std::string> conf_value(const std::string& conf, const std::string& key) {
  for (auto& [k, item] : conf_items(conf))
    if (k == key && item.find(':') != std::string::npos)
      return without_spaces(item.substr(item.find(':') + 1));
  return std::nullopt;
}

std::string torch_env_conf() {
  for (const char* name : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"})
    if (const char* v = std::getenv(name))
      return v;
  return "";
}

std::optional<std::string> unknown_key(const std::string& conf) {
  const auto& known = c10::CachingAllocator::AcceleratorAllocatorConfig::getKeys();
  // the keys PyTorch's CUDA parser takes by name, whichever of them its key set lists
  static const std::set<std::string> by_name = {"backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                                                "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                                                "pinned_num_register_threads", "pinned_reserve_segment_size_mb",
                                                "graph_capture_record_stream_reuse", "pinned_use_background_threads"};
  for (auto& [key, item] : conf_items(conf))
    if (!is_cachalot_key(key) && !by_name.count(key) && !known.count(key))
      return key;
  return std::nullopt;
}

std::string startup_conf(const std::optional<std::string>& install_conf) {
  const char* env = std::getenv("CACHALOT_ALLOC_CONF");
  const std::string own = install_conf ? *install_conf : env ? env : "";
  std::string conf = cachalot_share(torch_env_conf());
  if (!own.empty())
    conf += (conf.empty() ? "" : ",") + own;
  return conf;
}

// PyTorch keeps one device-config hook: cachalot's replaces CUDA's, hands the string to CUDA's parser as
// that hook did, then to `apply`. cachalot's own keys join the set PyTorch accepts, in either variable.
void register_settings_hook(std::function<void(const std::string& env, const std::string& share)> apply) {
  static bool done = false;
  if (done)
    return;
  using c10::CachingAllocator::AcceleratorAllocatorConfig;
  std::unordered_set<std::string> extra;
  for (const char* const* k = cachalot_config_keys(); *k; k++)
    if (!AcceleratorAllocatorConfig::getKeys().count(*k))
      extra.insert(*k);
  AcceleratorAllocatorConfig::registerDeviceConfigParserHook(
      [apply = std::move(apply)](const std::string& env) {
        if (auto backend = conf_value(env, "backend"))
          TORCH_CHECK_VALUE(false, "cachalot is PyTorch's CUDA allocator (cachalot.torch.install()): backend:", *backend,
                            " cannot be chosen at run time");
        // cachalot's share is checked before PyTorch's CUDA parser takes the string, so that a value only
        // cachalot refuses changes nothing there either, and raises now, not at the first CUDA use
        const std::string share = cachalot_share(env);
        if (cachalot_check_config(share.c_str()) != CACHALOT_OK)
          TORCH_CHECK_VALUE(false, "cachalot: ", cachalot_last_error());
        c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::instance().parseArgs(env);
        apply(env, share);
      },
      extra);
  done = true;
}

} // namespace cachalot_torch
