// The threads of the CUDA emulation (emu.h): a block's n threads are fibers, run by the
// launching thread itself, one at a time, each until it meets the block's barrier
// (__syncthreads(), __syncthreads_or(), the TF32 mma's exchange) or its end; a round of
// all of them is a barrier passed. The blocks of a grid run one after another (so that no
// thread starts the next block, whose __shared__ variables are the same statics, while
// another still works on this one). A thread that returns counts as arrived at every later
// barrier of its block, as a GPU's exited thread does. The threads still running must meet
// at the same barrier, the same place in the code (a GPU's barrier in code that not every
// thread of the block runs hangs or does what it likes): else the emulation says which
// block and stops the process (std::abort), as no generated kernel may do that.
//
// Fibers, not system threads: the block's threads were std::threads meeting at a
// std::barrier, and each meeting waited for the system to schedule every one of them: 128
// threads a block on a 2-core machine whose other core ran another test made the tests of
// the TF32 products 3-4x slower than alone. The rounds take the threads in turn, first to
// last, then last to first: a read that a missing barrier leaves unordered with another
// thread's write sees the write in one order and not in the other, on every run of a
// process alike.
// The blocks likewise: every other grid runs them last to first, so that a block that reads
// what another block of the same grid writes (with no ticket, no atomic between them: a
// race on a GPU, whose blocks run in any order and side by side) reads it in one launch and
// not in the next.
//
// A switch between fibers saves and restores the registers a call keeps (x86-64: its own
// few instructions below; elsewhere ucontext's swapcontext, which also saves the signal
// mask, a system call each). Compiled once into a library that timerlc/cuda/emu.py loads
// (globally) before the kernels' modules, which use its symbols.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

// (TL_EMU_UCONTEXT: ucontext's switch on x86-64 too, as the tests check it)
#if defined(__x86_64__) && !defined(TL_EMU_UCONTEXT)
#define TL_SWITCH_ASM 1
#else
#include <ucontext.h>
#endif

struct tl_dim3 {
  unsigned int x, y, z;
};
__thread tl_dim3 threadIdx = {0, 0, 0};
__thread tl_dim3 blockIdx = {0, 0, 0};
tl_dim3 blockDim = {1, 1, 1};
tl_dim3 gridDim = {1, 1, 1};

// the block's threads: TIMERLC_EMU_THREADS (default 4; at most 128, the GPU's blocks' threads,
// for which the kernels' shared arrays are sized)
extern "C" unsigned tl_emu_threads() {
  static unsigned n = [] {
    const char *s = std::getenv("TIMERLC_EMU_THREADS");
    int v = s ? std::atoi(s) : 4;
    return (unsigned)(v >= 1 && v <= 128 ? v : 4);
  }();
  return n;
}

namespace {
constexpr unsigned MAX_THREADS = 128;
// each fiber's stack: reserved, its pages taken when first touched (an unoptimized kernel's
// frame holds every one of its variables), below it a page that faults on an overflow
constexpr size_t STACK = size_t(8) << 20, GUARD = 4096;

}  // namespace

#if defined(TL_SWITCH_ASM)
// tl_switch(from, to): pushes the registers a call keeps, stores the stack pointer in
// *from, takes `to` as the stack pointer, pops that fiber's registers and returns into it
extern "C" void tl_switch(void **from, void *to);
asm(R"(
  .text
  .p2align 4
  .globl tl_switch
  .hidden tl_switch
  .type tl_switch, @function
tl_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tl_switch, .-tl_switch
)");
#endif

namespace {
#if defined(TL_SWITCH_ASM)
struct Context {
  void *sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context ctx;
  char *stack = nullptr;  // its lowest usable byte
  bool done = false;
  const void *site = nullptr;  // where it called the barrier it waits at
};

struct Block {
  Fiber fibers[MAX_THREADS];
  Context sched;  // the launching thread's, while a fiber runs
  unsigned current = 0;
  void (*fn)(void *) = nullptr;
  void *ctx = nullptr;
  int or_next = 0, or_done = 0;  // __syncthreads_or: this round's, the last round's
};
Block *tl_block = nullptr;
std::mutex tl_lock;  // one grid at a time
unsigned long tl_launches = 0;  // the grids run so far: an odd one runs its blocks last to first

[[noreturn]] void entry() {
  Block &b = *tl_block;
  b.fn(b.ctx);
  Fiber &f = b.fibers[b.current];
  f.done = true;
#if defined(TL_SWITCH_ASM)
  void *dead;
  tl_switch(&dead, b.sched.sp);
#else
  setcontext(&b.sched.uc);
#endif
  std::abort();  // (never resumed)
}

// the fiber made ready to start `entry` on its stack
void start(Fiber &f) {
  f.done = false;
#if defined(TL_SWITCH_ASM)
  // the stack's top 16-byte aligned; tl_switch's ret pops `entry` and leaves the stack as a
  // call would (8 below a multiple of 16), the six registers it pops zeros
  void **sp = (void **)(f.stack + STACK);
  *--sp = nullptr;
  *--sp = (void *)&entry;
  for (int k = 0; k < 6; k++) *--sp = nullptr;
  f.ctx.sp = sp;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = f.stack;
  f.ctx.uc.uc_stack.ss_size = STACK;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, (void (*)())entry, 0);
#endif
}

// from the running context (`from` keeps where it stopped) to `to`
void swap(Context &from, Context &to) {
#if defined(TL_SWITCH_ASM)
  tl_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

void resume(Block &b, unsigned t) {
  b.current = t;
  threadIdx = {t, 0, 0};
  swap(b.sched, b.fibers[t].ctx);
}

Block &block() {
  if (tl_block == nullptr) {
    tl_block = new Block;
    for (Fiber &f : tl_block->fibers) {
      void *at = mmap(nullptr, STACK + GUARD, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (at == MAP_FAILED || mprotect(at, GUARD, PROT_NONE) != 0) std::abort();
      f.stack = (char *)at + GUARD;
    }
  }
  return *tl_block;
}

// a barrier called at `site`: the fiber gives the launching thread back its turn until the
// round is done
void wait_at(const void *site) {
  Block &b = *tl_block;
  Fiber &f = b.fibers[b.current];
  f.site = site;
  swap(f.ctx, b.sched);
}
}  // namespace

extern "C" __attribute__((noinline)) void tl_emu_sync() { wait_at(__builtin_return_address(0)); }

// __syncthreads_or: the block's threads meet, each with a value, and each gets whether any
// was not 0 (the round's, kept until the next round ends: each thread reads it first thing)
extern "C" __attribute__((noinline)) int tl_emu_sync_or(int value) {
  if (value) tl_block->or_next = 1;
  wait_at(__builtin_return_address(0));
  return tl_block->or_done;
}

extern "C" void tl_emu_run(unsigned blocks, unsigned n, void (*fn)(void *), void *ctx) {
  std::lock_guard<std::mutex> hold(tl_lock);
  if (n < 1 || n > MAX_THREADS) std::abort();  // n is tl_emu_threads()
  Block &b = block();
  b.fn = fn;
  b.ctx = ctx;
  blockDim = {n, 1, 1};
  gridDim = {blocks, 1, 1};
  const bool backwards = tl_launches++ % 2 == 1;
  for (unsigned j = 0; j < blocks; j++) {
    const unsigned k = backwards ? blocks - 1 - j : j;
    blockIdx = {k, 0, 0};
    for (unsigned t = 0; t < n; t++) start(b.fibers[t]);
    b.or_next = b.or_done = 0;
    unsigned live = n;
    for (unsigned round = 0; live > 0; round++) {
      const void *site = nullptr;
      for (unsigned i = 0; i < n; i++) {
        const unsigned t = round % 2 ? n - 1 - i : i;
        Fiber &f = b.fibers[t];
        if (f.done) continue;
        resume(b, t);
        if (f.done) {
          live--;
        } else if (site == nullptr) {
          site = f.site;
        } else if (f.site != site) {
          std::fprintf(stderr,
                       "timerlc cuda-emu: the threads of block %u of a launch of %u blocks "
                       "met at different barriers (thread %u at another than the one before "
                       "it): a barrier in code that not every thread runs\n",
                       k, blocks, t);
          std::abort();
        }
      }
      b.or_done = b.or_next;
      b.or_next = 0;
    }
  }
  threadIdx = {0, 0, 0};
}
