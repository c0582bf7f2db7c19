// Private to the PyTorch backend: how PyTorch's config strings (PYTORCH_ALLOC_CONF,
// PYTORCH_CUDA_ALLOC_CONF, torch.cuda.memory._set_allocator_settings) reach cachalot.
#pragma once

#include <functional>
#include <optional>
#include <string>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// The items of a string meant for PyTorch's parsers that cachalot takes: its own keys (ROCm's spellings of
// two of them included), in order.
std::string cachalot_share(const std::string& conf);

// The value of `key` in a config string, if it names it.
std::optional<std::string> conf_value(const std::string& conf, const std::string& key);

// PyTorch's config environment variable, as PyTorch reads it: PYTORCH_ALLOC_CONF, else the older
// PYTORCH_CUDA_ALLOC_CONF; empty when neither is set.
std::string torch_env_conf();

// The first key of a config string that neither PyTorch's parsers nor cachalot know (call after
// register_settings_hook: cachalot's keys are known then), if any. PyTorch's CUDA parser refuses such a
// key in the variable it reads, but not in the other one, which cachalot may read.
std::optional<std::string> unknown_key(const std::string& conf);

// The config cachalot starts with: its share of PyTorch's variable, then install()'s conf or, without it,
// CACHALOT_ALLOC_CONF (later keys win).
std::string startup_conf(const std::optional<std::string>& install_conf);

// Makes cachalot's keys known to PyTorch's parser and `apply` the receiver of every string given to
// _set_allocator_settings (with cachalot's share of it, already checked), once PyTorch's CUDA parser has
// taken it. Once per process; later calls do nothing.
void register_settings_hook(std::function<void(const std::string& env, const std::string& share)> apply);

} // namespace cachalot_torch

#pragma GCC visibility pop
