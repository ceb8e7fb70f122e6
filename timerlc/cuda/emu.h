// The host emulation of the CUDA C that timerlc/cuda/render.py writes: the same text,
// compiled by the host C++ compiler with this header first (and TL_EMU defined), runs a
// function over a grid of blocks on the CPU. The threads themselves live in emu_rt.cc (a
// library compiled once and loaded before any module): a block's threads are fibers that
// the launching thread runs in turns from one barrier (__syncthreads()) to the next,
// threadIdx set for each; the blocks of a grid run one after another. __shared__
// variables are static, so shared by a block's threads. Only what the renderer uses is
// here: x dimensions, __syncthreads(_or), atomicCAS, atomicAdd, __threadfence, float4,
// TF32's mma.sync. The header includes no C++ library header, so that a module compiles
// fast.
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

// (macros: the runtime tells a barrier by the place it is called from, and all the
// threads of a block must meet at the same one; an unoptimized module keeps an inline
// function out of line, one place for every barrier)
#define __syncthreads() tl_emu_sync()
#define __syncthreads_or(value) tl_emu_sync_or(value)

inline unsigned atomicAdd(unsigned *at, unsigned value) {
  return __atomic_fetch_add(at, value, __ATOMIC_SEQ_CST); // the old value
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline int atomicCAS(int *at, int compare, int value) {
  __atomic_compare_exchange_n(at, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare; // the old value
}

// TF32 (cuda/products.py's TF32 functions): cvt.rna.tf32.f32, to the nearest with ties away
// from zero (half a unit of the 10th bit added to the magnitude, the 13 bits below dropped;
// infinities and NaNs as they are), its bits and its value
inline unsigned tl_tf32(float x) {
  unsigned u;
  __builtin_memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
}
inline float tl_tf32_value(float x) {
  const unsigned u = tl_tf32(x);
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 over each warp of the block (every
// thread calls it alike, as the TF32 functions do, with 128 threads a block): the lanes'
// fragments (PTX's layout: lane 4g + t holds A's (g, t), (g + 8, t), (g, t + 4), (g + 8,
// t + 4), B's (t, g), (t + 4, g), and D's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1))
// through the block's static memory between two of its barriers; each element of D its
// own value plus the 8 products in k's order (fmaf: a product of two TF32s is exact)
inline void tl_mma_tf32(float *d, const unsigned *a, const unsigned *b) {
  static unsigned tl_x[128][6];
  const unsigned t = threadIdx.x, w = t / 32 * 32, g = t % 32 / 4, q = t % 4;
  for (int i = 0; i < 4; i++) tl_x[t][i] = a[i];
  tl_x[t][4] = b[0];
  tl_x[t][5] = b[1];
  tl_emu_sync();
  for (unsigned i = 0; i < 4; i++) {
    const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
    float v = d[i];
    for (unsigned kk = 0; kk < 8; kk++) {
      const unsigned ua = tl_x[w + row % 8 * 4 + kk % 4][(row >= 8) + 2 * (kk >= 4)];
      const unsigned ub = tl_x[w + col * 4 + kk % 4][4 + (kk >= 4)];
      float fa, fb;
      __builtin_memcpy(&fa, &ua, 4);
      __builtin_memcpy(&fb, &ub, 4);
      v = __builtin_fmaf(fa, fb, v);
    }
    d[i] = v;
  }
  tl_emu_sync();
}

template <class F> void tl_emu_thunk(void *f) { (*(F *)f)(); }

// run function K over `blocks` blocks of tl_emu_threads() threads (TIMERLC_EMU_THREADS,
// default 4)
#define TL_EMU_LAUNCH(BLOCKS, K, ...)                                                      \
  do {                                                                                     \
    auto tl_body = [&] { K(__VA_ARGS__); };                                                \
    tl_emu_run(BLOCKS, tl_emu_threads(), &tl_emu_thunk<decltype(tl_body)>, &tl_body);     \
  } while (0)
