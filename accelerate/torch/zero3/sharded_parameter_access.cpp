// The check is a dispatcher fallback on DispatchKey::DeferredInit, a key LibTorch reserves for
// torchdistx's deferred initialisation and registers nothing on: a watched parameter's tensor
// carries it, so each operation on it (its views and detached aliases keep the key set) comes
// here first, above autograd. With the storage in place the operation goes on at once;
// released, the owner gathers it or throws. A process that also loads torchdistx would meet
// a second fallback on the key at load time (LibTorch refuses the duplicate by name).

#include "accelerate/torch/zero3/detail/sharded_parameter_access.hpp"

#include <mutex>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

namespace accel {
namespace {

constexpr c10::DispatchKey kWatched = c10::DispatchKey::DeferredInit;

struct Watch {
  ShardedParameterOwner* owner;
  std::size_t model, param;
};

// By storage: views of a parameter have tensors of their own but share its storage.
std::mutex watches_mutex;
std::unordered_map<const c10::StorageImpl*, Watch>& watches() {
  static std::unordered_map<const c10::StorageImpl*, Watch> map;
  return map;
}

void check(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(kWatched)) return;
  const bool released = t.numel() > 0 && t.unsafeGetTensorImpl()->storage().nbytes() == 0;
  Watch watch{};
  {
    const std::lock_guard<std::mutex> lock(watches_mutex);
    const auto it = watches().find(t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl());
    if (it == watches().end()) return;  // no longer watched: LibTorch's own error follows
    watch = it->second;
  }
  watch.owner->sharded_parameter_used(watch.model, watch.param, released);
}

// An alias of the whole tensor (an optimizer's detached copy, set_data's check) reads nothing
// and needs no storage: its result shares the storage and the key, and is checked where it is
// used. Other views gather (as_strided checks the storage's bounds).
bool only_aliases(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  return name == "aten::detach" || name == "aten::alias" ||
         name == "aten::_has_compatible_shallow_copy_type";
}

void check_arguments(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack) {
  const std::size_t count = only_aliases(op.schema()) ? 0 : op.schema().arguments().size();
  for (const c10::IValue& value : torch::jit::last(*stack, count)) {
    if (value.isTensor()) {
      check(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList().vec()) check(t);
    } else if (value.isList()) {  // Tensor?[] (index)
      for (const c10::IValue& item : value.toListRef())
        if (item.isTensor()) check(item.toTensor());
    }
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kWatched), stack);
}

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&check_arguments>());
}

// p's TensorImpl takes the key set `keys` (set_data keeps the tensor, shares the storage).
void set_keys(at::Tensor& p, c10::DispatchKeySet keys) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(p.storage()), keys, p.dtype());
  impl->set_sizes_and_strides(p.sizes(), p.strides());
  impl->set_storage_offset(p.storage_offset());
  p.set_data(at::Tensor(std::move(impl)));
}

}  // namespace

void watch_sharded_parameter(at::Tensor& p, ShardedParameterOwner& owner, std::size_t model,
                             std::size_t param) {
  // The key first: set_data's own operation must not find the storage watched yet.
  if (!p.key_set().has(kWatched)) set_keys(p, p.key_set().add(kWatched));
  const std::lock_guard<std::mutex> lock(watches_mutex);
  watches()[p.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl()] = {&owner, model, param};
}

void unwatch_sharded_parameter(at::Tensor& p) {
  {
    const std::lock_guard<std::mutex> lock(watches_mutex);
    watches().erase(p.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl());
  }
  if (p.key_set().has(kWatched)) set_keys(p, p.key_set().remove(kWatched));
}

}  // namespace accel
