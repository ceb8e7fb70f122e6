// The threads of the CUDA emulation (emu.h): a pool of n threads, made at the first launch
// and kept, runs each grid: its blocks one after another, each by all n threads, which
// meet at a std::barrier for __syncthreads() and after each block (so that no thread starts
// the next block, whose __shared__ variables are the same statics, while another still
// works on this one). A launch hands the pool its function and waits until every thread is
// done with the grid. Compiled once into a library that timerlc/cuda/emu.py loads
// (globally) before the kernels' modules, which use its symbols.
#include <barrier>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

struct tl_dim3 {
  unsigned int x, y, z;
};
__thread tl_dim3 threadIdx = {0, 0, 0};
__thread tl_dim3 blockIdx = {0, 0, 0};
tl_dim3 blockDim = {1, 1, 1};
tl_dim3 gridDim = {1, 1, 1};
static std::barrier<> *tl_barrier = nullptr;

extern "C" void tl_emu_sync() { tl_barrier->arrive_and_wait(); }

// __syncthreads_or: the block's threads meet, each with a value, and each gets whether any
// was not 0; three slots by turns (each thread index counts its calls: every thread of a
// block makes the same ones; by index, not by the system's thread, as thread 0 is whichever
// thread launches), thread 0 clearing the next call's before the barrier, when every thread
// has read it (two calls ago) and none has yet set it (after this call's barrier)
static int tl_or_slots[3];
static unsigned tl_or_calls[128];
extern "C" int tl_emu_sync_or(int value) {
  const unsigned k = tl_or_calls[threadIdx.x]++ % 3;
  if (threadIdx.x == 0) __atomic_store_n(&tl_or_slots[(k + 1) % 3], 0, __ATOMIC_RELAXED);
  if (value) __atomic_store_n(&tl_or_slots[k], 1, __ATOMIC_RELAXED);
  tl_barrier->arrive_and_wait();
  return __atomic_load_n(&tl_or_slots[k], __ATOMIC_RELAXED);
}

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
struct Pool {
  explicit Pool(unsigned threads) : n(threads), start(threads), done(threads), block(threads) {
    for (unsigned t = 1; t < n; t++) std::thread([this, t] { serve(t); }).detach();
  }
  // thread t's part of the grid: every block, one after another
  void work(unsigned t) {
    threadIdx = {t, 0, 0};
    for (unsigned b = 0; b < blocks; b++) {
      blockIdx = {b, 0, 0};
      fn(ctx);
      block.arrive_and_wait();
    }
  }
  void serve(unsigned t) {
    for (;;) {
      start.arrive_and_wait();  // a grid to run (the barrier publishes fn, ctx, blocks)
      work(t);
      done.arrive_and_wait();
    }
  }
  unsigned n;
  std::barrier<> start, done, block;
  void (*fn)(void *) = nullptr;
  void *ctx = nullptr;
  unsigned blocks = 0;
};
std::mutex tl_lock;  // one grid at a time
Pool *tl_pool = nullptr;
}  // namespace

extern "C" void tl_emu_run(unsigned blocks, unsigned n, void (*fn)(void *), void *ctx) {
  std::lock_guard<std::mutex> hold(tl_lock);
  if (tl_pool == nullptr) tl_pool = new Pool(n);  // (kept: its threads serve every launch)
  if (tl_pool->n != n) std::abort();               // n is tl_emu_threads(), fixed
  Pool &p = *tl_pool;
  p.fn = fn;
  p.ctx = ctx;
  p.blocks = blocks;
  tl_barrier = &p.block;
  blockDim = {n, 1, 1};
  gridDim = {blocks, 1, 1};
  p.start.arrive_and_wait();
  p.work(0);
  p.done.arrive_and_wait();
}
