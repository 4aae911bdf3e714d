#pragma once
// A range that advances a ProgressBar as a loop walks it: Accelerator::progress(loader) (or any
// range) in a range-for. The bar closes, printing its final state, when the loop's range ends
// (the temporary this is dies with the loop).

#include <cstddef>
#include <iterator>
#include <memory>
#include <utility>

#include "accelerate/progress_bar.hpp"

namespace accel {

template <typename Range>
class ProgressRange {
  using Inner = decltype(std::begin(std::declval<Range&>()));
  using InnerEnd = decltype(std::end(std::declval<Range&>()));

 public:
  struct Sentinel {
    InnerEnd end;
  };
  class Iterator {
   public:
    Iterator(Inner it, ProgressBar* bar) : it_(std::move(it)), bar_(bar) {}
    decltype(auto) operator*() { return *it_; }  // some loaders' iterators are not const
    Iterator& operator++() {
      ++it_;
      bar_->update();
      return *this;
    }
    bool operator!=(const Sentinel& s) const { return !(it_ == s.end); }

   private:
    Inner it_;
    ProgressBar* bar_;
  };

  ProgressRange(Range& range, std::shared_ptr<ProgressBar> bar)
      : range_(range), bar_(std::move(bar)) {}
  ~ProgressRange() {
    if (bar_) bar_->close();  // a moved-from range has none
  }
  ProgressRange(ProgressRange&&) = default;

  Iterator begin() { return Iterator(std::begin(range_), bar_.get()); }
  Sentinel end() { return Sentinel{std::end(range_)}; }
  ProgressBar& bar() { return *bar_; }

 private:
  Range& range_;
  std::shared_ptr<ProgressBar> bar_;
};

}  // namespace accel
