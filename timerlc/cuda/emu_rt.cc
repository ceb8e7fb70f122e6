// The threads of the CUDA emulation (emu.h): a grid's blocks one after another, each run by
// the same n std::threads, which meet at a std::barrier for __syncthreads() and after each
// block (so that no thread starts the next block, whose __shared__ variables are the same
// statics, while another still works on this one). Compiled once into a library that
// timerlc/cuda/emu.py loads (globally) before the kernels' modules, which use its symbols.
#include <barrier>
#include <cstdlib>
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

// the block's threads: TIMERLC_EMU_THREADS (default 4)
extern "C" unsigned tl_emu_threads() {
  static unsigned n = [] {
    const char *s = std::getenv("TIMERLC_EMU_THREADS");
    int v = s ? std::atoi(s) : 4;
    return (unsigned)(v >= 1 && v <= 64 ? v : 4);
  }();
  return n;
}

extern "C" void tl_emu_run(unsigned blocks, unsigned n, void (*fn)(void *), void *ctx) {
  std::barrier<> bar(n);
  tl_barrier = &bar;
  blockDim = {n, 1, 1};
  gridDim = {blocks, 1, 1};
  auto work = [fn, ctx, blocks, &bar](unsigned t) {
    threadIdx = {t, 0, 0};
    for (unsigned b = 0; b < blocks; b++) {
      blockIdx = {b, 0, 0};
      fn(ctx);
      bar.arrive_and_wait();
    }
  };
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < n; t++) workers.emplace_back(work, t);
  work(0);
  for (auto &w : workers) w.join();
  tl_barrier = nullptr;
}
