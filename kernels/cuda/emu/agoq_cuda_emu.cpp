/*
 * The CPU emulation of the execution model behind agoq_cuda_emu.h: a fiber scheduler for
 * the threads of one CTA and the barriers. The runtime API (memory, streams, events, the
 * launch queue) is agoq_cuda_emu_runtime.cpp, which runs kernels one at a time under its
 * device lock, on whichever thread makes the device progress: the scheduler's own state is
 * used by one thread at a time, and only what belongs to the calling thread's stack is
 * thread-local.
 *
 * Fibers switch with a few instructions on x86-64 (the codec's kernels switch at every
 * shuffle, millions of times per check), each switch announced to AddressSanitizer when it
 * is on (its fiber interface); elsewhere with ucontext.
 */
#include "agoq_cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define AGOQ_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AGOQ_EMU_ASAN 1
#endif
#endif
#if defined(AGOQ_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#define AGOQ_EMU_UCONTEXT 1
#endif

#if !defined(AGOQ_EMU_UCONTEXT)
/* agoq_emu_switch(save, load): saves the callee-saved registers, MXCSR and the x87 control
 * word on the current stack, stores the stack pointer in *save, and resumes the fiber whose
 * stack pointer is load (SysV x86-64 ABI). */
extern "C" void agoq_emu_switch(void** save, void* load);
__asm__(
    ".text\n"
    ".globl agoq_emu_switch\n"
    ".hidden agoq_emu_switch\n"
    ".type agoq_emu_switch,@function\n"
    "agoq_emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size agoq_emu_switch, .-agoq_emu_switch\n");
#endif

#include "agoq_cuda_probe.h"

namespace agoq_emu {

dim3 g_block_idx, g_block_dim, g_grid_dim;

namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 * 1024; /* kernels are shallow; Debug/ASan frames are big */

struct Fiber {
#if defined(AGOQ_EMU_UCONTEXT)
  ucontext_t ctx;
#else
  void* sp;
#endif
  bool done;
};

struct Barrier {
  unsigned arrived = 0;
  uint64_t generation = 0;
};

/* Plain arrays: the fiber stacks are kept for the next CTA and stay reachable until exit
 * (a vector's destructor would drop them before LeakSanitizer looks). */
Fiber fibers[kMaxThreads];
char* stacks[kMaxThreads];
#if defined(AGOQ_EMU_ASAN)
/* Bytes at the top of each stack that its last fiber left poisoned: the frames that never
 * returned (fiber_main's, with a margin for what it called last). Unpoisoning only those, not
 * the whole 256 KiB, keeps a CTA launch cheap under ASan (256 threads: 8 MiB of shadow). */
size_t stack_dirty[kMaxThreads];
constexpr size_t kDirtyMargin = 16 * 1024;
#endif
unsigned nthreads, cur, alive, waiting;
void (*job_fn)(void*);
void* job_ctx;
#if defined(AGOQ_EMU_UCONTEXT)
thread_local ucontext_t main_ctx;
#else
thread_local void* main_sp;
thread_local void* dead_sp; /* where a finished fiber's last switch saves what nobody resumes */
#endif
#if defined(AGOQ_EMU_ASAN)
thread_local const void* main_stack_bottom; /* the caller's stack, learnt at its first switch */
thread_local size_t main_stack_size;
#endif

/* Tell ASan which stack runs next (target == nthreads: the caller's), and, once resumed,
 * that the switch is complete. `dying`: the current fiber is never resumed. */
void asan_before_switch(void** fake, unsigned target) {
#if defined(AGOQ_EMU_ASAN)
  if (target == nthreads)
    __sanitizer_start_switch_fiber(fake, main_stack_bottom, main_stack_size);
  else
    __sanitizer_start_switch_fiber(fake, stacks[target], kStackBytes);
#else
  (void)fake;
  (void)target;
#endif
}

void asan_after_switch(void* fake) {
#if defined(AGOQ_EMU_ASAN)
  const void* bottom;
  size_t size;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  if (main_stack_bottom == nullptr) {
    main_stack_bottom = bottom;
    main_stack_size = size;
  }
#else
  (void)fake;
#endif
}

Barrier cta_barrier;
Barrier warp_barriers[kMaxThreads / 32];
uint64_t warp_slots[kMaxThreads];
int or_flag;

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "agoq CUDA emulation: %s (block %u, thread %u of %u)\n", what, g_block_idx.x, cur,
          nthreads);
  abort();
}

unsigned next_alive(unsigned from) {
  for (unsigned k = 1; k <= nthreads; k++) {
    unsigned t = (from + k) % nthreads;
    if (!fibers[t].done) return t;
  }
  return nthreads;
}

void switch_to(unsigned t) {
  unsigned prev = cur;
  cur = t;
#if defined(AGOQ_EMU_UCONTEXT)
  if (swapcontext(&fibers[prev].ctx, &fibers[t].ctx) != 0) die("swapcontext failed");
#else
  void* fake = nullptr;
  asan_before_switch(&fake, t);
  agoq_emu_switch(&fibers[prev].sp, fibers[t].sp);
  asan_after_switch(fake);
#endif
}

void yield() {
  unsigned t = next_alive(cur);
  if (t != nthreads && t != cur) switch_to(t);
}

void fiber_main() {
  asan_after_switch(nullptr); /* first entry: nothing of this fiber to restore */
  job_fn(job_ctx);
  fibers[cur].done = true;
  alive--;
  if (alive != 0 && waiting == alive) die("barrier never completes: a thread left the kernel before it");
  unsigned t = next_alive(cur);
#if defined(AGOQ_EMU_ASAN)
  {
    /* Every frame below this one returned (and cleared its redzones); this one never will. */
    const char* top = stacks[cur] + kStackBytes;
    const char* here = static_cast<const char*>(__builtin_frame_address(0));
    size_t dirty = static_cast<size_t>(top - here) + kDirtyMargin;
    stack_dirty[cur] = dirty < kStackBytes ? dirty : kStackBytes;
  }
#endif
  /* This fiber is finished: never resumed, so its context need not be saved. */
#if defined(AGOQ_EMU_UCONTEXT)
  if (t == nthreads) setcontext(&main_ctx);
  cur = t;
  setcontext(&fibers[t].ctx);
#else
  asan_before_switch(nullptr, t);
  if (t == nthreads) agoq_emu_switch(&dead_sp, main_sp);
  cur = t;
  agoq_emu_switch(&dead_sp, fibers[t].sp);
#endif
  die("a finished fiber was resumed");
}

/* `waiting` counts the fibers blocked at a barrier that has not completed: the fiber that
 * completes one takes its waiters off at once, so waiting == alive means no fiber can ever
 * run again. */
void barrier_wait(Barrier& b, unsigned count) {
  const uint64_t gen = b.generation;
  if (++b.arrived == count) {
    b.arrived = 0;
    b.generation++;
    waiting -= count - 1;
    return;
  }
  waiting++;
  while (b.generation == gen) {
    if (waiting == alive) die("deadlock: every live thread waits at a barrier");
    yield();
  }
}

}  // namespace

unsigned thread_x() { return cur; }

void syncthreads() { barrier_wait(cta_barrier, nthreads); }

int syncthreads_or(int pred) {
  syncthreads();
  if (pred) or_flag = 1;
  syncthreads();
  const int r = or_flag;
  syncthreads();
  if (cur == 0) or_flag = 0;
  return r;
}

uint64_t warp_exchange(uint64_t v, unsigned src) {
  if (nthreads % 32 != 0) die("warp shuffle in a CTA that is not whole warps");
  const unsigned w = cur / 32;
  warp_slots[cur] = v;
  barrier_wait(warp_barriers[w], 32);
  const uint64_t r = warp_slots[w * 32 + (src & 31u)];
  barrier_wait(warp_barriers[w], 32);
  return r;
}

void run_cta(unsigned threads, void (*fn)(void*), void* ctx) {
  if (threads == 0 || threads > kMaxThreads) die("bad CTA size");
  nthreads = threads;
  alive = threads;
  waiting = 0;
  job_fn = fn;
  job_ctx = ctx;
  cta_barrier = Barrier();
  for (auto& b : warp_barriers) b = Barrier();
  or_flag = 0;
  for (unsigned t = 0; t < threads; t++) {
    if (stacks[t] == nullptr) {
      stacks[t] = static_cast<char*>(malloc(kStackBytes));
      if (stacks[t] == nullptr) die("out of memory for fiber stacks");
    }
    Fiber& f = fibers[t];
    f.done = false;
#if defined(AGOQ_EMU_ASAN)
    /* Frames of the stack's previous fiber never returned: their redzones are still marked. */
    ASAN_UNPOISON_MEMORY_REGION(stacks[t] + kStackBytes - stack_dirty[t], stack_dirty[t]);
    stack_dirty[t] = 0;
#endif
#if defined(AGOQ_EMU_UCONTEXT)
    if (getcontext(&f.ctx) != 0) die("getcontext failed");
    f.ctx.uc_stack.ss_sp = stacks[t];
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#else
    /* What agoq_emu_switch pops: MXCSR + x87 control word, six registers, then the return
     * address fiber_main, entered with rsp = 8 mod 16 as after a call. */
    uintptr_t top = ((uintptr_t)(stacks[t] + kStackBytes)) & ~(uintptr_t)15;
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr; /* fiber_main's (never used) return address */
    *--sp = reinterpret_cast<void*>(&fiber_main);
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    uint32_t mxcsr;
    uint16_t fcw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fcw));
    --sp;
    memcpy(sp, &mxcsr, 4);
    memcpy(reinterpret_cast<char*>(sp) + 4, &fcw, 2);
    f.sp = sp;
#endif
  }
  cur = 0;
#if defined(AGOQ_EMU_UCONTEXT)
  if (swapcontext(&main_ctx, &fibers[0].ctx) != 0) die("swapcontext failed");
#else
  void* fake = nullptr;
  asan_before_switch(&fake, 0);
  agoq_emu_switch(&main_sp, fibers[0].sp);
  asan_after_switch(fake);
#endif
}

}  // namespace agoq_emu
