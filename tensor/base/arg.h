// TANDEM_ARG: declares one argument of an options struct, as libtorch's TORCH_ARG: the member
// `name_`, a setter that returns the struct so that calls chain, and two getters. Use it for
// every field of an options struct (optimizer, loss, layer, loader, process group...), so that
// all of them read and write alike; give defaults after the macro.
//
//   struct ClipOptions {
//     explicit ClipOptions(double max_norm) : max_norm_(max_norm) {}
//     TANDEM_ARG(double, max_norm);
//     TANDEM_ARG(double, norm_type) = 2.0;
//   };
//   ClipOptions options = ClipOptions(1.0).norm_type(1.0);   // setters chain
//   double p = options.norm_type();                          // getter
//   options.max_norm() = 5.0;                                // mutable getter
//
// The macro leaves the struct's access at private (the member is private): put methods and
// constructors before the arguments, or open a `public:` section after them.
#ifndef TANDEM_TENSOR_BASE_ARG_H_
#define TANDEM_TENSOR_BASE_ARG_H_

// clang-format off
#define TANDEM_ARG(T, name)                                                \
 public:                                                                   \
  inline auto name(const T& new_##name) -> decltype(*this) { /* NOLINT */ \
    this->name##_ = new_##name;                                            \
    return *this;                                                          \
  }                                                                        \
  inline const T& name() const noexcept { /* NOLINT */                     \
    return this->name##_;                                                  \
  }                                                                        \
  inline T& name() noexcept { /* NOLINT */                                 \
    return this->name##_;                                                  \
  }                                                                        \
                                                                           \
 private:                                                                  \
  T name##_ /* NOLINT */
// clang-format on

#endif  // TANDEM_TENSOR_BASE_ARG_H_
