// cudasim's fibers: a stack and a saved stack pointer, switched by a few instructions of
// assembly (x86-64 System V). ucontext would do a signal-mask system call at every switch,
// and the simulator switches at every barrier and warp shuffle of every simulated thread.
#ifndef TANDEM_TOOLS_CUDASIM_FIBER_H_
#define TANDEM_TOOLS_CUDASIM_FIBER_H_

#include <cstddef>

namespace cudasim {
namespace internal {

class Fiber {
 public:
  using Entry = void (*)(void* argument);

  // A stack of `stack_bytes` (plus a guard page below it) that starts running
  // entry(argument) at its first SwitchTo. `entry` must never return.
  Fiber(size_t stack_bytes, Entry entry, void* argument);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Puts the stack back to its initial state (the next switch starts entry() afresh).
  void Reset();

  // Saves the caller's context in *from_sp and continues this fiber.
  void SwitchTo(void** from_sp, const void* from_stack_bottom, size_t from_stack_size);
  // The first thing entry() calls: tells AddressSanitizer the switch is complete and
  // returns the stack it came from (where SwitchBack goes).
  static void Started(const void** from_stack_bottom, size_t* from_stack_size);
  // From inside this fiber: saves it and continues the context saved in *to_sp.
  void SwitchBack(void* to_sp, const void* to_stack_bottom, size_t to_stack_size);

 private:
  char* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  char* stack_bottom_ = nullptr;
  size_t stack_bytes_ = 0;
  Entry entry_;
  void* argument_;
  void* sp_ = nullptr;
  void* fake_stack_ = nullptr;  // AddressSanitizer's bookkeeping across switches
};

}  // namespace internal
}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_FIBER_H_
