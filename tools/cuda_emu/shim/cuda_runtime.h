// A host emulation of the parts of the CUDA runtime braid's backend uses, to run its kernels on the
// CPU for testing (not part of braid). Threads of a block run one after another, except in kernels
// launched as "threaded" (those with __syncthreads), where each thread of a block is a fiber
// (ucontext) on the launching OS thread: every fiber runs to its next __syncthreads, then the next.
#pragma once
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNotReady = 600,
  cudaErrorNotSupported = 801,
  cudaErrorNoDevice = 100,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaMemPoolAttr {
  cudaMemPoolAttrReleaseThreshold = 4,
  cudaMemPoolAttrReservedMemCurrent = 5,
  cudaMemPoolAttrUsedMemCurrent = 7,
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
#define CUDART_CB
using cudaHostFn_t = void (*)(void*);
struct EmuStream {
  int id;
};
struct EmuPool {
  int id;
};
using cudaStream_t = EmuStream*;
using cudaMemPool_t = EmuPool*;
struct EmuEvent {
  double ms;
  bool held = false;  // recorded while a host function held the streams (see cudaLaunchHostFunc)
};
using cudaEvent_t = EmuEvent*;

namespace emu {
inline thread_local dim3 block_idx, thread_idx;
inline dim3 grid_dim, block_dim;
// The fibers of the block a threaded launch is running (one block at a time).
struct Fibers {
  ucontext_t scheduler;
  std::vector<ucontext_t> ctx;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<bool> done;
  unsigned current = 0;
  std::function<void()> body;
};
inline thread_local Fibers* fibers = nullptr;
constexpr size_t kFiberStack = 256 * 1024;  // untouched pages cost nothing

inline void fiber_entry() {
  Fibers* fb = fibers;
  fb->body();
  fb->done[fb->current] = true;  // then uc_link resumes the scheduler
}
inline thread_local cudaError_t last_error = cudaSuccess;
inline int64_t launches = 0;

inline cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

template <typename F>
void launch(bool threaded, F f, dim3 g, dim3 b, size_t = 0, cudaStream_t = nullptr) {
  ++launches;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.x * b.y * b.z > 1024 || g.y > 65535 || g.z > 65535 ||
      g.x > 2147483647u || b.y != 1 || b.z != 1) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  grid_dim = g;
  block_dim = b;
  if (!threaded) {
    for (unsigned bz = 0; bz < g.z; ++bz)
      for (unsigned by = 0; by < g.y; ++by)
        for (unsigned bx = 0; bx < g.x; ++bx)
          for (unsigned tx = 0; tx < b.x; ++tx) {
            block_idx = dim3(bx, by, bz);
            thread_idx = dim3(tx);
            f();
          }
    return;
  }
  // The threads of each block as fibers: run each in turn to its next __syncthreads (or its end)
  // until all have ended; CUDA requires every thread of a block to reach the same barriers.
  Fibers fb;
  fb.body = f;
  fb.ctx.resize(b.x);
  fb.done.assign(b.x, false);
  for (unsigned tx = 0; tx < b.x; ++tx) fb.stacks.emplace_back(new char[kFiberStack]);
  Fibers* outer = fibers;
  fibers = &fb;
  for (unsigned bz = 0; bz < g.z; ++bz)
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        for (unsigned tx = 0; tx < b.x; ++tx) {
          getcontext(&fb.ctx[tx]);
          fb.ctx[tx].uc_stack.ss_sp = fb.stacks[tx].get();
          fb.ctx[tx].uc_stack.ss_size = kFiberStack;
          fb.ctx[tx].uc_link = &fb.scheduler;
          makecontext(&fb.ctx[tx], fiber_entry, 0);
          fb.done[tx] = false;
        }
        for (unsigned left = b.x; left > 0;) {
          left = 0;
          for (unsigned tx = 0; tx < b.x; ++tx) {
            if (fb.done[tx]) continue;
            block_idx = dim3(bx, by, bz);
            thread_idx = dim3(tx);
            fb.current = tx;
            swapcontext(&fb.scheduler, &fb.ctx[tx]);
            left += !fb.done[tx];
          }
        }
      }
  fibers = outer;
}
}  // namespace emu

#define blockIdx ::emu::block_idx
#define threadIdx ::emu::thread_idx
#define gridDim ::emu::grid_dim
#define blockDim ::emu::block_dim
inline void __syncthreads() {
  ::emu::Fibers* fb = ::emu::fibers;
  swapcontext(&fb->ctx[fb->current], &fb->scheduler);
}

inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
inline float __double2float_rn(double x) { return static_cast<float>(x); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
inline double atomicAdd(double* p, double v) { double o = *p; *p = o + v; return o; }
inline int atomicAdd(int* p, int v) { int o = *p; *p = static_cast<int>(static_cast<unsigned>(o) + static_cast<unsigned>(v)); return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p = o + v; return o; }
inline unsigned atomicOr(unsigned* p, unsigned v) { unsigned o = *p; *p = o | v; return o; }

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* p, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, cudaMemPoolAttr a, void* v);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t p, cudaMemPoolAttr a, void* v);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t p, size_t keep);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device);
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s);
#define cudaHostAllocPortable 1
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data);
