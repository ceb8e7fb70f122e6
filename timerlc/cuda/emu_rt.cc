// The threads of the CUDA emulation (emu.h): one block of n std::threads per launch, which
// meet at a std::barrier for __syncthreads(). Compiled once into a library that
// timerlc/cuda/emu.py loads (globally) before the kernels' modules, which use its symbols.
#include <barrier>
#include <cstdlib>
#include <thread>
#include <vector>

struct tl_dim3 {
  unsigned int x, y, z;
};
__thread tl_dim3 threadIdx = {0, 0, 0};
tl_dim3 blockDim = {1, 1, 1};
static std::barrier<> *tl_barrier = nullptr;

extern "C" void tl_emu_sync() { tl_barrier->arrive_and_wait(); }

// the block's threads: TIMERLC_EMU_THREADS (default 4)
extern "C" unsigned tl_emu_threads() {
  static unsigned n = [] {
    const char *s = std::getenv("TIMERLC_EMU_THREADS");
    int v = s ? std::atoi(s) : 4;
    return (unsigned)(v >= 1 && v <= 64 ? v : 4);
  }();
  return n;
}

extern "C" void tl_emu_run(unsigned n, void (*fn)(void *), void *ctx) {
  std::barrier<> bar(n);
  tl_barrier = &bar;
  blockDim = {n, 1, 1};
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < n; t++)
    workers.emplace_back([fn, ctx, t] {
      threadIdx = {t, 0, 0};
      fn(ctx);
    });
  threadIdx = {0, 0, 0};
  fn(ctx);
  for (auto &w : workers) w.join();
  tl_barrier = nullptr;
}
