// The host emulation of the CUDA C that timerlc/cuda/render.py writes: the same text,
// compiled by the host C++ compiler with this header first (and TL_EMU defined), runs each
// kernel as one block of threads on the CPU. The threads themselves live in emu_rt.cc (a
// library compiled once and loaded before any module): std::threads that meet at a
// std::barrier for __syncthreads(), threadIdx their own; __shared__ variables are static,
// so shared by them. Only what the renderer uses is here: one block, x dimensions,
// __syncthreads. The header includes no C++ library header, so that a module compiles fast.
#pragma once

#define __global__
#define __host__
#define __device__
#define __shared__ static

struct tl_dim3 {
  unsigned int x, y, z;
};
extern __thread tl_dim3 threadIdx; // each thread's own (emu_rt.cc)
extern tl_dim3 blockDim;
extern "C" void tl_emu_sync();
extern "C" unsigned tl_emu_threads();
extern "C" void tl_emu_run(unsigned n, void (*fn)(void *), void *ctx);

inline void __syncthreads() { tl_emu_sync(); }

template <class F> void tl_emu_thunk(void *f) { (*(F *)f)(); }

// run kernel K on a block of tl_emu_threads() threads (TIMERLC_EMU_THREADS, default 4)
#define TL_EMU_LAUNCH(K, ...)                                                              \
  do {                                                                                     \
    auto tl_body = [&] { K(__VA_ARGS__); };                                                \
    tl_emu_run(tl_emu_threads(), &tl_emu_thunk<decltype(tl_body)>, &tl_body);             \
  } while (0)
