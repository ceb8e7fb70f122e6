// The host emulation of the CUDA C that timerlc/cuda/render.py writes: the same text,
// compiled by the host C++ compiler with this header first (and TL_EMU defined), runs each
// kernel as one block of TL threads on the CPU: std::threads that meet at a std::barrier
// for __syncthreads(), __shared__ variables shared by them (static), threadIdx their own.
// Only what the renderer uses is here: one block, x dimensions, __syncthreads.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <math.h>
#include <thread>
#include <vector>

#define __global__
#define __host__
#define __device__
#define __shared__ static

struct tl_dim3 {
  unsigned int x, y, z;
};
inline thread_local tl_dim3 threadIdx = {0, 0, 0};
inline tl_dim3 blockDim = {1, 1, 1};
inline std::barrier<> *tl_emu_barrier = nullptr;

inline void __syncthreads() { tl_emu_barrier->arrive_and_wait(); }

// the block's threads: TIMERLC_EMU_THREADS (default 4)
inline unsigned tl_emu_threads() {
  static unsigned n = [] {
    const char *s = std::getenv("TIMERLC_EMU_THREADS");
    int v = s ? std::atoi(s) : 4;
    return (unsigned)(v >= 1 && v <= 64 ? v : 4);
  }();
  return n;
}

template <class F> inline void tl_emu_run(unsigned n, F f) {
  std::barrier<> bar(n);
  tl_emu_barrier = &bar;
  blockDim = {n, 1, 1};
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < n; t++)
    workers.emplace_back([&f, t] {
      threadIdx = {t, 0, 0};
      f();
    });
  threadIdx = {0, 0, 0};
  f();
  for (auto &w : workers) w.join();
  tl_emu_barrier = nullptr;
}

#define TL_EMU_LAUNCH(K, ...) tl_emu_run(tl_emu_threads(), [&] { K(__VA_ARGS__); })
