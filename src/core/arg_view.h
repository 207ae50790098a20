// ArgView: what an op's front door hands to the helpers it calls on every op (traced(), record()):
// a braced list or a vector, read only during the call, so that building it never allocates.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <vector>

namespace braid::detail {

/// A read-only view of a braced list or a vector, valid for the call it is passed to. An op's front
/// door builds these on every call, traced or not, with grad or without, so they must not allocate.
template <typename T>
class ArgView {
 public:
  ArgView() = default;
  // The list's array lives until the end of the caller's full expression, which is as long as a
  // view lives; GCC warns about the pattern in general.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  ArgView(std::initializer_list<T> l) : p_(l.begin()), n_(l.size()) {}  // NOLINT: braced lists at call sites
#pragma GCC diagnostic pop
  ArgView(const std::vector<T>& v) : p_(v.data()), n_(v.size()) {}     // NOLINT
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }
  size_t size() const { return n_; }
  const T& operator[](size_t i) const { return p_[i]; }
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }

 private:
  const T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace braid::detail
