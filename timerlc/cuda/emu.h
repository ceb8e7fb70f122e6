// The host emulation of the CUDA C that timerlc/cuda/render.py writes: the same text,
// compiled by the host C++ compiler with this header first (and TL_EMU defined), runs a
// function over a grid of blocks on the CPU. The threads themselves live in emu_rt.cc (a
// library compiled once and loaded before any module): a block's threads are std::threads
// that meet at a std::barrier for __syncthreads(), threadIdx and blockIdx their own; the
// blocks of a grid run one after another. __shared__ variables are static, so shared by a
// block's threads. Only what the renderer uses is here: x dimensions, __syncthreads(_or),
// atomicCAS, atomicAdd, __threadfence, float4. The header includes no C++ library header, so
// that a module compiles fast.
#pragma once

#define __global__
#define __host__
#define __device__
#define __shared__ static

struct alignas(16) float4 { // (CUDA's vector type: the products' loads of 16 bytes)
  float x, y, z, w;
};

struct tl_dim3 {
  unsigned int x, y, z;
};
extern __thread tl_dim3 threadIdx; // each thread's own (emu_rt.cc)
extern __thread tl_dim3 blockIdx;
extern tl_dim3 blockDim, gridDim;
extern "C" void tl_emu_sync();
extern "C" int tl_emu_sync_or(int value);
extern "C" unsigned tl_emu_threads();
extern "C" void tl_emu_run(unsigned blocks, unsigned threads, void (*fn)(void *), void *ctx);

inline void __syncthreads() { tl_emu_sync(); }
inline int __syncthreads_or(int value) { return tl_emu_sync_or(value); }

inline unsigned atomicAdd(unsigned *at, unsigned value) {
  return __atomic_fetch_add(at, value, __ATOMIC_SEQ_CST); // the old value
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline int atomicCAS(int *at, int compare, int value) {
  __atomic_compare_exchange_n(at, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare; // the old value
}

template <class F> void tl_emu_thunk(void *f) { (*(F *)f)(); }

// run function K over `blocks` blocks of tl_emu_threads() threads (TIMERLC_EMU_THREADS,
// default 4)
#define TL_EMU_LAUNCH(BLOCKS, K, ...)                                                      \
  do {                                                                                     \
    auto tl_body = [&] { K(__VA_ARGS__); };                                                \
    tl_emu_run(BLOCKS, tl_emu_threads(), &tl_emu_thunk<decltype(tl_body)>, &tl_body);     \
  } while (0)
