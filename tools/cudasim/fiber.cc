#include "tools/cudasim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

#if !defined(__x86_64__)
#error "cudasim's context switch is written for x86-64"
#endif

extern "C" void cudasim_swap_context(void** save_sp, void* load_sp);
extern "C" void cudasim_fiber_start();

// Saves the callee-saved registers and the floating-point control words on the current stack,
// stores the stack pointer in *save_sp, loads load_sp and restores what is saved there.
asm(R"(
  .text
  .globl cudasim_swap_context
  .type cudasim_swap_context,@function
cudasim_swap_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cudasim_swap_context, .-cudasim_swap_context

  .globl cudasim_fiber_start
  .type cudasim_fiber_start,@function
cudasim_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cudasim_fiber_start, .-cudasim_fiber_start
)");

namespace cudasim {
namespace internal {
namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

Fiber::Fiber(size_t stack_bytes, Entry entry, void* argument) : entry_(entry), argument_(argument) {
  const size_t page = PageSize();
  stack_bytes_ = (stack_bytes + page - 1) / page * page;
  mapping_bytes_ = stack_bytes_ + page;
  void* mapping = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) {
    std::fprintf(stderr, "cudasim: cannot map a fiber stack of %zu bytes: %s\n", mapping_bytes_,
                 std::strerror(errno));
    std::abort();
  }
  mapping_ = static_cast<char*>(mapping);
  mprotect(mapping_, page, PROT_NONE);  // a stack overflow faults instead of corrupting
  stack_bottom_ = mapping_ + page;
  Reset();
}

Fiber::~Fiber() { munmap(mapping_, mapping_bytes_); }

void Fiber::Reset() {
  // The frame cudasim_swap_context pops: control words, r15, r14, r13 (entry), r12
  // (argument), rbx, rbp, then the return address (cudasim_fiber_start). After the `ret` the
  // stack pointer is 16-byte aligned, as the `call` in cudasim_fiber_start needs.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack_bottom_ + stack_bytes_) & ~uintptr_t{15};
  uint64_t* frame = reinterpret_cast<uint64_t*>(top - 8) - 7;
  uint32_t control[2];
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  std::memcpy(&frame[0], control, 8);
  frame[1] = 0;                                                 // r15
  frame[2] = 0;                                                 // r14
  frame[3] = reinterpret_cast<uint64_t>(entry_);                // r13
  frame[4] = reinterpret_cast<uint64_t>(argument_);             // r12
  frame[5] = 0;                                                 // rbx
  frame[6] = 0;                                                 // rbp
  frame[7] = reinterpret_cast<uint64_t>(&cudasim_fiber_start);  // return address
  sp_ = frame;
}

void Fiber::SwitchTo(void** from_sp, const void* from_stack_bottom, size_t from_stack_size) {
#if CUDASIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, stack_bottom_, stack_bytes_);
  cudasim_swap_context(from_sp, sp_);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)from_stack_bottom;
  (void)from_stack_size;
  cudasim_swap_context(from_sp, sp_);
#endif
}

void Fiber::Started(const void** from_stack_bottom, size_t* from_stack_size) {
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, from_stack_bottom, from_stack_size);
#else
  *from_stack_bottom = nullptr;
  *from_stack_size = 0;
#endif
}

void Fiber::SwitchBack(void* to_sp, const void* to_stack_bottom, size_t to_stack_size) {
#if CUDASIM_ASAN
  __sanitizer_start_switch_fiber(&fake_stack_, to_stack_bottom, to_stack_size);
  cudasim_swap_context(&sp_, to_sp);
  __sanitizer_finish_switch_fiber(fake_stack_, nullptr, nullptr);
#else
  (void)to_stack_bottom;
  (void)to_stack_size;
  cudasim_swap_context(&sp_, to_sp);
#endif
}

}  // namespace internal
}  // namespace cudasim
