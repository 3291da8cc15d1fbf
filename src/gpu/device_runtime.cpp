// The device runtime every generated CUDA translation unit starts with: fixed-width types, f16 /
// bf16 storage types with exact conversions, the IR's scalar semantics (wrapping integers, XLA's
// division rules, NaN-propagating max/min, saturating float -> int), atomics and sort keys.
//
// It needs no header at all under NVRTC (no CCCL: a compile stays in tens of milliseconds), and
// the same text compiles as plain C++ with PALLAS_HOST_EMULATION defined: one thread per CTA, so
// the generated kernels run on the CPU, where the tests compare them with the reference
// interpreter. Every rule here mirrors src/eval/scalar_ops.h and src/eval/accumulate.h; a change
// there needs the same change here (the host-emulation tests catch a disagreement).
#include "gpu/codegen.h"

namespace pallas::gpu {

namespace {

// The wgmma.mma_async wrappers for each instruction width the runtime uses: an m64nNk16 operation
// names all N/2 accumulator registers of the thread, too many to write out by hand. TB is the
// instruction's transpose-b immediate (1: b is MN-major in shared memory). PlWgmma reads a from
// shared memory through a descriptor; PlWgmmaRs from registers (a register tile: per 16 columns
// four 32-bit registers of two elements each — rows 16 w + l / 4 and + 8, columns 2 (l % 4) and
// + 8 —, as wgmma's accumulator holds them), only in units with such products (PL_WGMMA_RS).
// The widest, 256, only where the unit uses it (PL_WGMMA_WIDE; never with a in registers, which an
// ACC that wide does not take): its 128 operands cost NVRTC time to parse.
std::string wgmma_wrapper(int n, const char* ty, bool a_in_registers) {
  const int regs = n / 2;
  auto reg = [](int i) { return "%" + std::to_string(i); };
  // Operands: the accumulator's registers, then a (a descriptor, or 4 registers), b's descriptor,
  // scale-d (1: accumulate) and TB.
  const int a_regs = a_in_registers ? 4 : 1, scale = regs + a_regs + 1;
  std::string s = std::string("template <> struct ") + (a_in_registers ? "PlWgmmaRs<" : "PlWgmma<") + std::to_string(n) +
                  ", pl_" + ty + "> {\n  template <int TB> static PL_MEMBER void run(float* d, " +
                  (a_in_registers ? "const pl_u32* a" : "pl_u64 da") + ", pl_u64 db) {\n" +
                  "  asm volatile(\"{ .reg .pred p; setp.ne.b32 p, " + reg(scale) + ", 0; wgmma.mma_async.sync.aligned.m64n" +
                  std::to_string(n) + "k16.f32." + ty + "." + ty + " {";
  for (int i = 0; i < regs; ++i) s += (i ? ", " : "") + reg(i);
  s += "}, ";
  if (a_in_registers) s += "{" + reg(regs) + ", " + reg(regs + 1) + ", " + reg(regs + 2) + ", " + reg(regs + 3) + "}";
  else s += reg(regs);
  // (With a in registers there is no transpose-a immediate.)
  s += ", " + reg(regs + a_regs) + ", p, 1, 1, " + (a_in_registers ? "" : "0, ") + reg(scale + 1) + "; }\"\n               : ";
  for (int i = 0; i < regs; ++i) s += (i ? ", " : "") + std::string("\"+f\"(d[") + std::to_string(i) + "])";
  s += std::string("\n               : ") +
       (a_in_registers ? "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])" : "\"l\"(da)") +
       ", \"l\"(db), \"r\"(1), \"n\"(TB));\n  }\n};\n";
  return s;
}

std::string wgmma_instructions() {
  std::string s;
  for (bool a_in_registers : {false, true}) {
    if (a_in_registers) s += "#ifdef PL_WGMMA_RS\n";
    for (int n : {8, 16, 32, 64, 128, 256}) {
      if (n == 256 && a_in_registers) continue;
      if (n == 256) s += "#ifdef PL_WGMMA_WIDE\n";
      for (const char* ty : {"bf16", "f16"}) s += wgmma_wrapper(n, ty, a_in_registers);
      if (n == 256) s += "#endif\n";
    }
    if (a_in_registers) s += "#endif\n";
  }
  return s;
}

const char* runtime_template() {
  return R"PALLAS_RT(// ---- Pallas device runtime -------------------------------------------------------------------
// Dynamic shared memory starts on a PL_SMEM_ALIGN boundary: 1024 where the generated code has
// swizzled ring slots or tiles (pl_swizzle), else 128.
#ifndef PL_SMEM_ALIGN
#define PL_SMEM_ALIGN 128
#endif
#if defined(__CUDACC__)
#define PL_DEV __device__ __forceinline__
#define PL_MEMBER __device__ __forceinline__
#define PL_HOST_EMULATION 0
#else
#define PL_HOST_EMULATION 1
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <atomic>
#include <pthread.h>
#include <chrono>
#include <map>
#include <mutex>
#include <stdlib.h>
#include <thread>
#include <vector>
#define PL_DEV static inline
#define PL_MEMBER inline
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(...)
#define __restrict__
#endif

typedef signed char pl_i8;
typedef short pl_i16;
typedef int pl_i32;
typedef long long pl_i64;
typedef unsigned char pl_u8;
typedef unsigned short pl_u16;
typedef unsigned int pl_u32;
typedef unsigned long long pl_u64;
struct pl_f16 { pl_u16 bits; };
struct pl_bf16 { pl_u16 bits; };

// A CTA's threads form PL_NUM_GROUPS equal groups (a gpu::kernel's Pallas threads, one warpgroup
// each on the GPU; 1 for a pallas_call). Tile ops are loops of one group's threads: pl_tid(),
// pl_nthreads() and pl_sync() are relative to the calling thread's group; pl_cta_*() to the CTA.
#ifndef PL_NUM_GROUPS
#define PL_NUM_GROUPS 1
#endif
// A gpu::kernel with clusters: the CTAs of a cluster (PL_CLUSTER_CTAS, launched as 1-D clusters)
// run together and reach each other's mbarriers (gpu::ClusterBarrier).
#ifndef PL_CLUSTER_CTAS
#define PL_CLUSTER_CTAS 1
#endif
// Host emulation runs PL_HOST_CTAS CTAs at once: one cluster, or every CTA of the grid for a
// gpu::kernel with semaphores of the grid (pl::get_global: a wait may need any other CTA).
#ifndef PL_HOST_CTAS
#define PL_HOST_CTAS PL_CLUSTER_CTAS
#endif
#if PL_CLUSTER_CTAS > 1 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "a gpu::kernel with clusters of more than one CTA needs sm_90 or later"
#endif
// A batch's bound check where the generator knows every thread gets whole batches of the block
// (Emitter::batched_store_loop): true on the GPU, whose groups have the generated thread count;
// checked in host emulation, which runs a CTA with any number of threads.
#if PL_HOST_EMULATION
#define PL_IN_BATCH(c) (c)
#else
#define PL_IN_BATCH(c) true
#endif
#if PL_HOST_EMULATION
// The CTA's threads are host threads (PL_HOST_CTAS CTAs at a time: host thread t is thread
// t % pl_host_nthreads of CTA t / pl_host_nthreads of those); pl_sync is a real barrier, so a
// missing barrier shows up as a wrong result (or a ThreadSanitizer report) on the CPU too.
// Once the kernel has recorded an error (pl_host_err), barriers stop waiting, so threads that
// left early (a failed check, a barrier wait that gave up) cannot leave the others stuck.
// The thread's index lives in a pthread key, not a thread_local: LeakSanitizer crashes scanning
// the dynamic TLS of a dlopen'ed kernel (GCC 12's libsanitizer), which the tests run under.
static pthread_key_t pl_host_tid_key;
static pthread_once_t pl_host_tid_once = PTHREAD_ONCE_INIT;
static void pl_host_make_tid_key() { pthread_key_create(&pl_host_tid_key, nullptr); }
PL_DEV void pl_host_set_tid(int t) {
  pthread_once(&pl_host_tid_once, pl_host_make_tid_key);
  pthread_setspecific(pl_host_tid_key, (void*)(pl_i64)t);
}
PL_DEV int pl_host_tid() { return (int)(pl_i64)pthread_getspecific(pl_host_tid_key); }
static int pl_host_nthreads = 1;  // per CTA
static pl_i64* pl_host_err = nullptr;
struct pl_host_barrier_t {
  std::atomic<int> arrived{0};
  std::atomic<unsigned> generation{0};
  int count = 1;
};
static pl_host_barrier_t pl_host_cluster_barrier[PL_HOST_CTAS / PL_CLUSTER_CTAS], pl_host_cta_barrier[PL_HOST_CTAS],
    pl_host_group_barrier[PL_HOST_CTAS][PL_NUM_GROUPS];
// A warp of a group (its threads 32 w .. 32 w + 31, fewer for the last): what a shuffle syncs, as
// shfl.sync syncs only its warp (the group's other warps run on).
static pl_host_barrier_t pl_host_warp_barrier[PL_HOST_CTAS][PL_NUM_GROUPS][32];
// The warp-wide mma.sync instructions the last run executed (the tests check the tensor-core
// path ran; run_host_emulation's stats).
static std::atomic<pl_u64> pl_host_mma_count{0};
extern "C" pl_u64 pl_host_mma_instructions() { return pl_host_mma_count.load(); }
// The same for warpgroup-wide wgmma instructions.
static std::atomic<pl_u64> pl_host_wgmma_count{0};
extern "C" pl_u64 pl_host_wgmma_instructions() { return pl_host_wgmma_count.load(); }
// The same for TMA boxes (the ring's cp.async.bulk.tensor copies).
static std::atomic<pl_u64> pl_host_tma_count{0};
extern "C" pl_u64 pl_host_tma_boxes() { return pl_host_tma_count.load(); }
// The same for warp shuffles (one per warp and shuffle, as the hardware counts instructions).
static std::atomic<pl_u64> pl_host_shuffle_count{0};
extern "C" pl_u64 pl_host_shuffles() { return pl_host_shuffle_count.load(); }
// The same for flushes of an accumulator's registers into its memory (one per Pallas thread).
static std::atomic<pl_u64> pl_host_acc_flush_count{0};
extern "C" pl_u64 pl_host_acc_flushes() { return pl_host_acc_flush_count.load(); }
// Asynchronous operations in host emulation: wgmma, cp.async and bulk copies to global memory
// complete when a wait retires their group, the latest moment the hardware may complete them —
// so a kernel that touches their memory before the wait gets a wrong result on the CPU too.
// Each host thread queues its operations (a thread's groups, as the hardware keeps them per
// thread): `commit` closes the open group, `retire(pending, run)` runs, in issue order, the
// operations of all groups but the newest `pending`.
template <class Op> struct PlHostGroups {
  struct Entry {
    Op op;
    long group;  // 0: not committed yet
  };
  std::vector<Entry> entries;
  long committed = 0;
  void push(const Op& op) { entries.push_back({op, 0}); }
  void commit() {
    ++committed;
    for (Entry& e : entries)
      if (e.group == 0) e.group = committed;
  }
  template <class F> void retire(long pending, F run) {
    size_t done = 0;
    for (; done < entries.size() && entries[done].group != 0 && entries[done].group <= committed - pending; ++done)
      run(entries[done].op);
    entries.erase(entries.begin(), entries.begin() + (long)done);
  }
};
// A wgmma: its operands are read when it is computed (pl_host_wgmma_run).
struct PlHostWgmmaOp {
  void (*run)(float*, pl_u64, pl_u64);
  float* d;
  pl_u64 da, db;
  // With a in registers (run null): the thread's two rows of a, gathered from its quad when issued.
  void (*run_rows)(float*, const float (*)[16], pl_u64);
  float a[2][16];
};
// Copies n bytes from src to dst; with `swizzle` 32, 64 or 128, each byte to its swizzled address
// (pl_swizzle of the host address: the emulated shared memory starts on a 1024-byte boundary),
// as the TMA unit writes a box with CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B: the 16-byte chunk
// bits of the address XOR its bits 7.. (1, 2 or 3 of them). With `from_swizzled`, each byte from
// its swizzled address instead, as a store of such a box reads shared memory.
static inline void pl_host_copy_bytes(pl_u8* dst, const pl_u8* src, pl_i64 n, int swizzle, bool from_swizzled = false) {
  if (swizzle == 0) return (void)memcpy(dst, src, (size_t)n);
  const pl_u64 mask = (pl_u64)(swizzle / 16 - 1) << 4;
  for (pl_i64 i = 0; i < n;) {
    const pl_u64 at = (pl_u64)((from_swizzled ? src : dst) + i);
    const pl_i64 piece = 16 - (pl_i64)(at % 16) < n - i ? 16 - (pl_i64)(at % 16) : n - i;  // (within a chunk)
    pl_u8* moved = (pl_u8*)(at ^ ((at >> 3) & mask));
    if (from_swizzled) memcpy(dst + i, moved, (size_t)piece);
    else memcpy(moved, src + i, (size_t)piece);
    i += piece;
  }
}
// Rows copied from src to dst (a cp.async chunk is one row of 16 bytes).
struct PlHostRows {
  pl_u8* dst;
  const pl_u8* src;
  pl_i64 dst_stride, src_stride, rows;
  pl_u32 row_bytes;
  int swizzle = 0;  // bytes (pl_host_copy_bytes): dst's, or src's with from_swizzled
  bool from_swizzled = false;
  void land() const {
    for (pl_i64 r = 0; r < rows; ++r)
      pl_host_copy_bytes(dst + r * dst_stride, src + r * src_stride, row_bytes, swizzle, from_swizzled);
  }
};
// Per host thread, sized by pl_host_start.
static std::vector<PlHostGroups<PlHostWgmmaOp>> pl_host_wgmmas;
static std::vector<PlHostGroups<PlHostRows>> pl_host_async_copies, pl_host_bulk_stores;
// Bulk copies into shared memory in flight, for all threads: they complete on a barrier, not a
// thread's group — each lands, and makes its arrival, when a thread next tests its barrier
// (pl_host_land_bulk_loads).
// An entry is either a copy's rows or an expect-tx arrival (`arrive`, no rows: pl_expect_tx).
// The barrier keeps the hardware's transaction count (`owed`: bytes expected minus bytes landed,
// in this phase), and its expect-tx arrivals wait until the count is zero — so a test that
// comes between the arrival and the issue of the copies does not complete the phase, and bytes
// that land before their arrival (a peer's share of a multicast copy, before this CTA's own
// expect-tx) count against the arrival to come: the count goes negative for a while, as the
// hardware's may.
struct PlHostBulkLoad {
  pl_u64* b;
  PlHostRows rows;
  bool arrive;
  pl_i64 expect = 0;
};
static std::mutex pl_host_bulk_loads_mu;
static std::vector<PlHostBulkLoad> pl_host_bulk_loads;
// Per barrier: the transaction count (bytes of landed expect-tx arrivals minus bytes landed), and
// the arrivals that wait for it to be zero.
struct PlHostTx {
  pl_i64 owed = 0;
  int arrivals = 0;
};
static std::map<pl_u64*, PlHostTx> pl_host_tx;
static std::atomic<int> pl_host_bulk_loads_pending{0};
// Computes the thread's wgmma of every group but the newest `pending`.
PL_DEV void pl_host_wgmma_retire(long pending) {
  pl_host_wgmmas[(size_t)pl_host_tid()].retire(pending, [](const PlHostWgmmaOp& op) {
    if (op.run) op.run(op.d, op.da, op.db);
    else op.run_rows(op.d, op.a, op.db);
  });
}
PL_DEV bool pl_host_failed() { return pl_host_err && __atomic_load_n(pl_host_err, __ATOMIC_ACQUIRE) != 0; }
PL_DEV void pl_host_wait(pl_host_barrier_t& b) {
  if (b.count <= 1) return;
  const unsigned g = b.generation.load(std::memory_order_acquire);
  if (b.arrived.fetch_add(1, std::memory_order_acq_rel) == b.count - 1) {
    b.arrived.store(0, std::memory_order_relaxed);
    b.generation.fetch_add(1, std::memory_order_release);
    b.generation.notify_all();
    return;
  }
  while (b.generation.load(std::memory_order_acquire) == g && !pl_host_failed()) b.generation.wait(g);
}
// After an error: wakes every thread waiting at a barrier.
PL_DEV void pl_host_release_all() {
  auto wake = [](pl_host_barrier_t& b) {
    b.generation.fetch_add(1, std::memory_order_release);
    b.generation.notify_all();
  };
  for (int c = 0; c < PL_HOST_CTAS; ++c) {
    for (pl_host_barrier_t& b : pl_host_group_barrier[c]) wake(b);
    for (auto& group : pl_host_warp_barrier[c])
      for (pl_host_barrier_t& b : group) wake(b);
    wake(pl_host_cta_barrier[c]);
  }
  for (pl_host_barrier_t& b : pl_host_cluster_barrier) wake(b);
}
// Before a run: a run that failed may have left threads counted at a barrier.
PL_DEV void pl_host_start(int nthreads, pl_i64* err) {
  pl_host_nthreads = nthreads;
  pl_host_err = err;
  pl_host_mma_count.store(0);
  pl_host_wgmma_count.store(0);
  pl_host_tma_count.store(0);
  pl_host_shuffle_count.store(0);
  pl_host_acc_flush_count.store(0);
  const size_t threads = (size_t)PL_HOST_CTAS * (size_t)nthreads;
  pl_host_wgmmas.assign(threads, {});
  pl_host_async_copies.assign(threads, {});
  pl_host_bulk_stores.assign(threads, {});
  pl_host_bulk_loads.clear();
  pl_host_tx.clear();
  pl_host_bulk_loads_pending.store(0);
  for (pl_host_barrier_t& b : pl_host_cluster_barrier) {
    b.count = nthreads * PL_CLUSTER_CTAS;
    b.arrived.store(0);
  }
  for (int c = 0; c < PL_HOST_CTAS; ++c) {
    pl_host_cta_barrier[c].count = nthreads;
    pl_host_cta_barrier[c].arrived.store(0);
    for (pl_host_barrier_t& b : pl_host_group_barrier[c]) {
      b.count = nthreads / PL_NUM_GROUPS;
      b.arrived.store(0);
    }
    for (auto& group : pl_host_warp_barrier[c])
      for (int w = 0; w < 32; ++w) {
        const int left = nthreads / PL_NUM_GROUPS - 32 * w;
        group[w].count = left < 0 ? 0 : left < 32 ? left : 32;
        group[w].arrived.store(0);
      }
  }
}
// Which of the CTAs running at once the calling thread belongs to; its rank in its cluster.
PL_DEV int pl_host_cta() { return pl_host_tid() / pl_host_nthreads; }
// This CTA among the launch's (each takes the points in turn): its share of the workspace.
PL_DEV pl_i64 pl_launch_cta() { return pl_host_cta(); }
PL_DEV int pl_cluster_rank() { return pl_host_cta() % PL_CLUSTER_CTAS; }
PL_DEV void pl_cluster_sync() { pl_host_wait(pl_host_cluster_barrier[pl_host_cta() / PL_CLUSTER_CTAS]); }
PL_DEV int pl_cta_tid() { return pl_host_tid() % pl_host_nthreads; }
// Six words per lane of each warp of the CTA: what the lanes of the warp-wide instructions
// (shuffles, ldmatrix, mma.sync) hand each other, between two barriers of the group.
static pl_u64 pl_host_warp_words[PL_HOST_CTAS][32][32][6];
PL_DEV pl_u64* pl_host_lane_words(int lane) { return pl_host_warp_words[pl_host_cta()][pl_cta_tid() >> 5][lane]; }
PL_DEV int pl_cta_nthreads() { return pl_host_nthreads; }
PL_DEV void pl_cta_sync() { pl_host_wait(pl_host_cta_barrier[pl_host_cta()]); }
PL_DEV int pl_nthreads() { return pl_host_nthreads / PL_NUM_GROUPS; }
PL_DEV int pl_group() { return pl_cta_tid() / pl_nthreads(); }
PL_DEV int pl_tid() { return pl_cta_tid() % pl_nthreads(); }
PL_DEV void pl_sync() {
  pl_host_wait(PL_NUM_GROUPS == 1 ? pl_host_cta_barrier[pl_host_cta()] : pl_host_group_barrier[pl_host_cta()][pl_group()]);
}
// The placeholder a failing pl_group_all leaves in err[0] until its caller records the reason
// (pl_fail): it names the thread whose check failed, so that only that thread records — not the
// others that the failure woke from their barriers (they leave too, each reporting a failure at
// whatever barrier it was in, which is not the reason).
PL_DEV pl_i64 pl_host_placeholder() { return -2 - (pl_i64)pl_host_tid(); }
// Whether `ok` holds on every thread of the caller's group (a barrier of the group).
PL_DEV bool pl_group_all(bool ok) {
  if (!ok && pl_host_err) {
    pl_i64 zero = 0;  // any nonzero value stops the barriers
    __atomic_compare_exchange_n(pl_host_err, &zero, pl_host_placeholder(), false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    pl_host_release_all();
  }
  pl_sync();
  return ok && !pl_host_failed();
}
#define PL_MATH(f) ::f
#else
PL_DEV int pl_cta_tid() { return threadIdx.x; }
PL_DEV pl_i64 pl_launch_cta() { return blockIdx.x; }
#ifdef PL_CTA_THREADS
// The block size the kernel was generated for (the driver launches exactly that; the kernel traps
// on another): as a constant, NVVM folds the tensor-core dispatch and the per-thread loop trip
// counts, which makes the cold compile faster (docs/PERFORMANCE.md, stop 17).
PL_DEV constexpr int pl_cta_nthreads() { return PL_CTA_THREADS; }
#else
PL_DEV int pl_cta_nthreads() { return blockDim.x; }
#endif
PL_DEV void pl_cta_sync() { __syncthreads(); }
#if PL_CLUSTER_CTAS > 1
PL_DEV int pl_cluster_rank() {
  pl_u32 r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
// Every thread of every CTA of the cluster (a CTA-wide barrier too); what each wrote before is
// visible to all after it.
PL_DEV void pl_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#else
PL_DEV int pl_cluster_rank() { return 0; }
PL_DEV void pl_cluster_sync() { __syncthreads(); }
#endif
PL_DEV int pl_nthreads() { return pl_cta_nthreads() / PL_NUM_GROUPS; }
PL_DEV int pl_group() { return threadIdx.x / pl_nthreads(); }
PL_DEV int pl_tid() { return threadIdx.x % pl_nthreads(); }
PL_DEV void pl_sync() {
#if PL_NUM_GROUPS == 1
  __syncthreads();
#else
  // A named barrier per group (0 is __syncthreads'): groups branch independently.
  asm volatile("bar.sync %0, %1;" ::"r"(pl_group() + 1), "r"(pl_nthreads()) : "memory");
#endif
}
// Whether `ok` holds on every thread of the caller's group (bar.red.and on the group's barrier).
PL_DEV bool pl_group_all(bool ok) {
#if PL_NUM_GROUPS == 1
  return __syncthreads_and(ok) != 0;
#else
  pl_u32 all;
  asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
               : "=r"(all) : "r"((pl_u32)ok), "r"(pl_group() + 1), "r"(pl_nthreads()) : "memory");
  return all != 0;
#endif
}
#define PL_MATH(f) ::f
#endif
// Byte copies and compares (no headers: NVRTC has no <cstring>); compilers turn them into moves.
PL_DEV void pl_copy_bytes(void* dst, const void* src, int n) {
  for (int i = 0; i < n; ++i) ((char*)dst)[i] = ((const char*)src)[i];
}
PL_DEV bool pl_same_bytes(const void* a, const void* b, int n) {
  for (int i = 0; i < n; ++i)
    if (((const char*)a)[i] != ((const char*)b)[i]) return false;
  return true;
}
template <class To, class From> PL_DEV To pl_bitcast(From x) {
  To t;
  pl_copy_bytes(&t, &x, (int)sizeof t);
  return t;
}

// ---- Reductions across threads ------------------------------------------------------------------
// A reduction with fewer results than the group has threads gives each result a team of S
// threads (a power of two dividing the group, at most 1024): each thread combines every S-th
// reduced element, the team's lanes combine theirs by shuffles (an xor butterfly, so every lane
// ends with the team's value), and a team wider than a warp meets in 32 words of scratch. S is 1
// (one thread per result, nothing shared) when the results alone keep the threads busy. Every
// thread of the group calls pl_team_combine alike: with S > 1 each runs exactly one team round.
PL_DEV int pl_reduce_team(pl_i64 results, pl_i64 count) {
  const int T = pl_nthreads();
#if !PL_HOST_EMULATION
  if (T % 32 != 0) return 1;  // a shuffle is a whole warp's
#endif
  if (pl_cta_nthreads() > 1024) return 1;  // (emulation's lane words: 32 warps)
  int S = 1;
  while (2 * S <= 1024 && T % (2 * S) == 0 && 2 * S * results <= T && 2 * S <= count) S *= 2;
  return S;
}
// v from the lane whose index differs from the caller's by xor `m` (m < 32, within its team).
template <class A> PL_DEV A pl_shfl_xor(A v, int m) {
  static_assert(sizeof(A) <= 16, "a shuffled value is at most four words");
  pl_u32 w[4] = {0, 0, 0, 0};
  pl_copy_bytes(w, &v, (int)sizeof(A));
#if PL_HOST_EMULATION
  const int lane = pl_cta_tid() & 31;
  if (lane == 0) pl_host_shuffle_count.fetch_add(1, std::memory_order_relaxed);
  pl_host_barrier_t& warp = pl_host_warp_barrier[pl_host_cta()][pl_group()][pl_tid() >> 5];
  pl_copy_bytes(pl_host_lane_words(lane), w, 16);
  pl_host_wait(warp);
  pl_copy_bytes(w, pl_host_lane_words(lane ^ m), 16);
  pl_host_wait(warp);
#else
  for (int i = 0; i < (int)(sizeof(A) + 3) / 4; ++i)
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(w[i]) : "r"(w[i]), "r"(m));
#endif
  pl_copy_bytes(&v, w, (int)sizeof(A));
  return v;
}
// The team's combined value, on every thread of the team. WIDE: teams may be wider than a warp
// (the emitter passes 32 values of scratch in the arena then).
template <bool WIDE, class A, class F> PL_DEV A pl_team_combine(A acc, int S, F combine, A* scratch) {
  for (int m = 1; m < S && m < 32; m <<= 1) acc = combine(acc, pl_shfl_xor(acc, m));
  if (WIDE && S > 32) {
    const int warp = pl_tid() >> 5, first = warp & ~(S / 32 - 1);
    if ((pl_tid() & 31) == 0) scratch[warp] = acc;
    pl_sync();
    acc = scratch[first];
    for (int i = 1; i < S / 32; ++i) acc = combine(acc, scratch[first + i]);
    pl_sync();  // before the scratch is written again
  }
  return acc;
}
// The combination of the values of the team's earlier threads (`identity` for its first thread),
// in thread order: an xor butterfly in which each thread keeps its block's total and, in the
// upper half of each block, adds the lower half's total to what comes before it. WIDE as above.
template <bool WIDE, class A, class F> PL_DEV A pl_team_exclusive_scan(A v, A identity, int S, F combine, A* scratch) {
  A total = v, before = identity;
  for (int m = 1; m < S && m < 32; m <<= 1) {
    const A other = pl_shfl_xor(total, m);
    if (pl_tid() & m) {
      before = combine(other, before);
      total = combine(other, total);
    } else {
      total = combine(total, other);
    }
  }
  if (WIDE && S > 32) {
    const int warp = pl_tid() >> 5, first = warp & ~(S / 32 - 1);
    if ((pl_tid() & 31) == 0) scratch[warp] = total;
    pl_sync();
    A earlier = identity;
    for (int i = first; i < warp; ++i) earlier = combine(earlier, scratch[i]);
    before = combine(earlier, before);
    pl_sync();  // before the scratch is written again
  }
  return before;
}
// argmax / argmin's running best: a value and its index along the axis (-1: none yet).
template <class A> struct pl_arg_best {
  A v;
  pl_i64 i;
};
// The better of two candidates; on a tie the lower index; a NaN beats every number.
template <bool MAX, class A> PL_DEV pl_arg_best<A> pl_arg_better(pl_arg_best<A> a, pl_arg_best<A> b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  const bool a_nan = a.v != a.v, b_nan = b.v != b.v;
  if (a_nan || b_nan) return a_nan && (!b_nan || a.i < b.i) ? a : b;
  if (a.v == b.v) return a.i < b.i ? a : b;
  return (MAX ? a.v > b.v : a.v < b.v) ? a : b;
}

// ---- Traits ---------------------------------------------------------------------------------------
template <class T> struct pl_int;  // integer types: unsigned twin, width-safe wrapping type, range
#define PL_INT(T, U, W, S, LO, HI)                  \
  template <> struct pl_int<T> {                    \
    typedef U uns;                                  \
    typedef W wide;                                 \
    enum { is_signed = S, bits = sizeof(T) * 8 };   \
    PL_MEMBER static T lo() { return (T)(LO); }        \
    PL_MEMBER static T hi() { return (T)(HI); }        \
  };
PL_INT(pl_i8, pl_u8, pl_u32, 1, -128, 127)
PL_INT(pl_i16, pl_u16, pl_u32, 1, -32768, 32767)
PL_INT(pl_i32, pl_u32, pl_u32, 1, -2147483647 - 1, 2147483647)
PL_INT(pl_i64, pl_u64, pl_u64, 1, -9223372036854775807LL - 1, 9223372036854775807LL)
PL_INT(pl_u8, pl_u8, pl_u32, 0, 0, 255)
PL_INT(pl_u16, pl_u16, pl_u32, 0, 0, 65535)
PL_INT(pl_u32, pl_u32, pl_u32, 0, 0, 4294967295u)
PL_INT(pl_u64, pl_u64, pl_u64, 0, 0, 18446744073709551615ull)
#undef PL_INT

// ---- f16 / bf16: storage types; arithmetic in float, rounded to nearest even per op -------------
PL_DEV float pl_f32_of_bits(pl_u32 b) { return pl_bitcast<float>(b); }
PL_DEV pl_u32 pl_bits_of_f32(float f) { return pl_bitcast<pl_u32>(f); }
PL_DEV float pl_widen(pl_bf16 x) { return pl_f32_of_bits((pl_u32)x.bits << 16); }
PL_DEV pl_bf16 pl_to_bf16(float f) {
  pl_u32 b = pl_bits_of_f32(f);
  pl_bf16 r;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) { r.bits = (pl_u16)((b >> 16) | 0x0040u); return r; }
  b += 0x7FFFu + ((b >> 16) & 1u);
  r.bits = (pl_u16)(b >> 16);
  return r;
}
PL_DEV float pl_widen(pl_f16 x) {
  pl_u32 sign = (pl_u32)(x.bits & 0x8000u) << 16, exp = (x.bits >> 10) & 0x1Fu, man = x.bits & 0x3FFu;
  if (exp == 0x1Fu) return pl_f32_of_bits(sign | 0x7F800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return pl_f32_of_bits(sign);
    float f = (float)man * 5.9604644775390625e-8f;  // subnormal: man * 2^-24, exact
    return sign ? -f : f;
  }
  return pl_f32_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
}
PL_DEV pl_f16 pl_to_f16(float f) {
  pl_u32 b = pl_bits_of_f32(f);
  pl_u32 sign = (b >> 16) & 0x8000u, abs = b & 0x7FFFFFFFu;
  pl_f16 r;
  if (abs > 0x7F800000u) { r.bits = (pl_u16)(sign | 0x7E00u | ((abs >> 13) & 0x3FFu)); return r; }
  if (abs >= 0x477FF000u) { r.bits = (pl_u16)(sign | 0x7C00u); return r; }  // rounds to inf
  if (abs < 0x38800000u) {  // below the smallest normal: round abs / 2^-24 to an integer
    float m = pl_f32_of_bits(abs) * 16777216.0f;  // exact (power of two)
    pl_u32 q = (pl_u32)m;
    float rem = m - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    r.bits = (pl_u16)(sign | q);
    return r;
  }
  pl_u32 e = ((abs >> 23) - 112u) << 10, man = (abs >> 13) & 0x3FFu, rest = abs & 0x1FFFu;
  pl_u32 h = e | man;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  r.bits = (pl_u16)(sign | h);
  return r;
}
// double -> float rounding toward zero, then the last bit set when inexact ("round to odd"):
// rounding that float once more to f16 / bf16 gives the correctly rounded result of the double.
PL_DEV float pl_f32_round_odd(double d) {
  if (d != d) return (float)d;
  float f = (float)d;
  if ((double)f == d) return f;
  pl_u32 b = pl_bits_of_f32(f);
  double af = f < 0 ? -(double)f : (double)f, ad = d < 0 ? -d : d;
  if (af > ad) b -= 1;  // rounded away from zero: step back toward it
  return pl_f32_of_bits(b | 1u);
}
// Load to the compute type (float for f16 / bf16, the type itself otherwise); the emitter
// stores back with pl_to_f16 / pl_to_bf16 or a cast.
template <class T> PL_DEV T pl_ld(T x) { return x; }
PL_DEV float pl_ld(pl_f16 x) { return pl_widen(x); }
PL_DEV float pl_ld(pl_bf16 x) { return pl_widen(x); }

// ---- Float helpers --------------------------------------------------------------------------------
PL_DEV bool pl_isnan(float x) { return x != x; }
PL_DEV bool pl_isnan(double x) { return x != x; }
PL_DEV bool pl_signbit(float x) { return (pl_bits_of_f32(x) >> 31) != 0; }
PL_DEV bool pl_signbit(double x) { return (pl_bitcast<pl_u64>(x) >> 63) != 0; }
PL_DEV float pl_copysign(float a, float b) { return PL_MATH(copysignf)(a, b); }
PL_DEV double pl_copysign(double a, double b) { return PL_MATH(copysign)(a, b); }

#define PL_UNARY_MATH(name, ff, fd)                            \
  PL_DEV float name(float x) { return PL_MATH(ff)(x); }        \
  PL_DEV double name(double x) { return PL_MATH(fd)(x); }
PL_UNARY_MATH(pl_floor, floorf, floor)
PL_UNARY_MATH(pl_ceil, ceilf, ceil)
PL_UNARY_MATH(pl_round_away, roundf, round)
PL_UNARY_MATH(pl_round_even, rintf, rint)
PL_UNARY_MATH(pl_log1p, log1pf, log1p)
PL_UNARY_MATH(pl_sqrt, sqrtf, sqrt)
PL_UNARY_MATH(pl_erf, erff, erf)
PL_UNARY_MATH(pl_fabs, fabsf, fabs)
#undef PL_UNARY_MATH
// gpu::CompilerParams::approx_math: exp, exp2, log, tanh, sin, cos and rsqrt of float (f32, and
// f16 / bf16, which compute in f32) take the special function unit's approximate instructions,
// as Mosaic GPU's approx_math does; f64 stays exact. exp(x) is ex2(x * log2 e) and log(x) is
// lg2(x) * ln 2 (an error that grows with |x| for exp, as CUDA's __expf). ex2 and lg2 flush
// subnormal inputs and results to zero (.ftz): exp of x below about -87.3 is 0 instead of a
// subnormal, log of a subnormal is -inf. Host emulation computes each instruction exactly but
// flushes where the hardware does, so that difference from the exact functions shows there too.
#ifndef PL_APPROX_MATH
#define PL_APPROX_MATH 0
#endif
#if PL_APPROX_MATH
#if PL_HOST_EMULATION
PL_DEV float pl_flush_subnormal(float x) { return (x != 0 && PL_MATH(fabsf)(x) < 1.17549435e-38f) ? PL_MATH(copysignf)(0.0f, x) : x; }
PL_DEV float pl_ex2_approx(float x) { return pl_flush_subnormal(PL_MATH(exp2f)(pl_flush_subnormal(x))); }
PL_DEV float pl_lg2_approx(float x) { return PL_MATH(log2f)(pl_flush_subnormal(x)); }
PL_DEV float pl_tanh_approx(float x) { return PL_MATH(tanhf)(x); }
PL_DEV float pl_sin_approx(float x) { return PL_MATH(sinf)(x); }
PL_DEV float pl_cos_approx(float x) { return PL_MATH(cosf)(x); }
PL_DEV float pl_rsqrt_approx(float x) { return 1.0f / PL_MATH(sqrtf)(x); }
#else
#define PL_APPROX_INSTR(name, instr)                        \
  PL_DEV float name(float x) {                              \
    float y;                                                \
    asm(instr " %0, %1;" : "=f"(y) : "f"(x));               \
    return y;                                               \
  }
PL_APPROX_INSTR(pl_ex2_approx, "ex2.approx.ftz.f32")
PL_APPROX_INSTR(pl_lg2_approx, "lg2.approx.ftz.f32")
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
PL_DEV float pl_tanh_approx(float x) { return PL_MATH(tanhf)(x); }  // (tanh.approx needs sm_75)
#else
PL_APPROX_INSTR(pl_tanh_approx, "tanh.approx.f32")
#endif
PL_APPROX_INSTR(pl_sin_approx, "sin.approx.f32")
PL_APPROX_INSTR(pl_cos_approx, "cos.approx.f32")
PL_APPROX_INSTR(pl_rsqrt_approx, "rsqrt.approx.f32")
#undef PL_APPROX_INSTR
#endif
PL_DEV float pl_exp(float x) { return pl_ex2_approx(x * 1.44269504088896341f); }
PL_DEV float pl_exp2(float x) { return pl_ex2_approx(x); }
PL_DEV float pl_log(float x) { return pl_lg2_approx(x) * 0.693147180559945309f; }
PL_DEV float pl_tanh(float x) { return pl_tanh_approx(x); }
PL_DEV float pl_sin(float x) { return pl_sin_approx(x); }
PL_DEV float pl_cos(float x) { return pl_cos_approx(x); }
PL_DEV float pl_rsqrt(float x) { return pl_rsqrt_approx(x); }
#else
PL_DEV float pl_exp(float x) { return PL_MATH(expf)(x); }
PL_DEV float pl_exp2(float x) { return PL_MATH(exp2f)(x); }
PL_DEV float pl_log(float x) { return PL_MATH(logf)(x); }
PL_DEV float pl_tanh(float x) { return PL_MATH(tanhf)(x); }
PL_DEV float pl_sin(float x) { return PL_MATH(sinf)(x); }
PL_DEV float pl_cos(float x) { return PL_MATH(cosf)(x); }
PL_DEV float pl_rsqrt(float x) { return 1.0f / PL_MATH(sqrtf)(x); }
#endif
PL_DEV double pl_exp(double x) { return PL_MATH(exp)(x); }
PL_DEV double pl_exp2(double x) { return PL_MATH(exp2)(x); }
PL_DEV double pl_log(double x) { return PL_MATH(log)(x); }
PL_DEV double pl_tanh(double x) { return PL_MATH(tanh)(x); }
PL_DEV double pl_sin(double x) { return PL_MATH(sin)(x); }
PL_DEV double pl_cos(double x) { return PL_MATH(cos)(x); }
PL_DEV double pl_rsqrt(double x) { return 1.0 / PL_MATH(sqrt)(x); }
PL_DEV float pl_fmod(float a, float b) { return PL_MATH(fmodf)(a, b); }
PL_DEV double pl_fmod(double a, double b) { return PL_MATH(fmod)(a, b); }
PL_DEV float pl_pow(float a, float b) { return PL_MATH(powf)(a, b); }
PL_DEV double pl_pow(double a, double b) { return PL_MATH(pow)(a, b); }
template <class T> PL_DEV T pl_logistic(T x) {  // stable on both sides
  if (x >= 0) return T(1) / (T(1) + pl_exp(-x));
  T e = pl_exp(x);
  return e / (T(1) + e);
}
template <class T> PL_DEV T pl_fsign(T x) { return (pl_isnan(x) || x == 0) ? x : pl_copysign(T(1), x); }
template <class T> PL_DEV bool pl_isfinite(T x) { return !pl_isnan(x) && x - x == 0; }
template <class T> PL_DEV T pl_fmax(T a, T b) {
  if (pl_isnan(a)) return a;
  if (pl_isnan(b)) return b;
  if (a == b) return pl_signbit(a) ? b : a;
  return a > b ? a : b;
}
template <class T> PL_DEV T pl_fmin(T a, T b) {
  if (pl_isnan(a)) return a;
  if (pl_isnan(b)) return b;
  if (a == b) return pl_signbit(a) ? a : b;
  return a < b ? a : b;
}
template <class T> PL_DEV T pl_fpow_int(T x, pl_i64 n) {
  pl_u64 e = n < 0 ? (pl_u64)(-(n + 1)) + 1 : (pl_u64)n;
  T base = x, acc = 1;
  for (; e; e >>= 1, base *= base)
    if (e & 1) acc *= base;
  return n < 0 ? T(1) / acc : acc;
}

// ---- Integers: two's-complement wrapping, XLA's division and shift rules -------------------------
template <class T> PL_DEV T pl_iadd(T a, T b) { typedef typename pl_int<T>::wide W; return (T)((W)(typename pl_int<T>::uns)a + (W)(typename pl_int<T>::uns)b); }
template <class T> PL_DEV T pl_isub(T a, T b) { typedef typename pl_int<T>::wide W; return (T)((W)(typename pl_int<T>::uns)a - (W)(typename pl_int<T>::uns)b); }
template <class T> PL_DEV T pl_imul(T a, T b) { typedef typename pl_int<T>::wide W; return (T)((W)(typename pl_int<T>::uns)a * (W)(typename pl_int<T>::uns)b); }
template <class T> PL_DEV T pl_ineg(T a) { return pl_isub<T>((T)0, a); }
template <class T> PL_DEV T pl_iabs(T a) { return (pl_int<T>::is_signed && a < (T)0) ? pl_ineg(a) : a; }
template <class T> PL_DEV T pl_isign(T a) { return (T)((a > (T)0) - (a < (T)0)); }
template <class T> PL_DEV T pl_idiv(T a, T b) {
  if (b == (T)0) return (T)~(typename pl_int<T>::uns)0;
  if (pl_int<T>::is_signed && a == pl_int<T>::lo() && b == (T)-1) return a;
  return (T)(a / b);
}
template <class T> PL_DEV T pl_irem(T a, T b) {
  if (b == (T)0) return a;
  if (pl_int<T>::is_signed && b == (T)-1) return (T)0;
  return (T)(a % b);
}
template <class T> PL_DEV T pl_shl(T a, T b) {
  typedef typename pl_int<T>::uns U;
  if ((U)b >= (U)pl_int<T>::bits) return (T)0;
  return (T)((typename pl_int<T>::wide)(U)a << (U)b);
}
template <class T> PL_DEV T pl_shr_logical(T a, T b) {
  typedef typename pl_int<T>::uns U;
  if ((U)b >= (U)pl_int<T>::bits) return (T)0;
  return (T)((U)a >> (U)b);
}
template <class T> PL_DEV T pl_shr_arith(T a, T b) {
  typedef typename pl_int<T>::uns U;
  if ((U)b >= (U)pl_int<T>::bits) return (T)(a < (T)0 && pl_int<T>::is_signed ? (T)-1 : (T)0);
  if (!pl_int<T>::is_signed) {  // arithmetic shift of the bit pattern read as signed
    U u = (U)a;
    bool neg = (u >> (pl_int<T>::bits - 1)) != 0;
    U r = (U)(u >> (U)b);
    if (neg) r = (U)(r | (U)~((U)~(U)0 >> (U)b));
    return (T)r;
  }
  return (T)(a >> (U)b);
}
template <class T> PL_DEV T pl_ipow(T x, pl_i64 n) {
  typedef typename pl_int<T>::uns U;
  pl_u64 e = (pl_u64)n;
  U base = (U)x, acc = 1;
  for (; e; e >>= 1, base = (U)((typename pl_int<T>::wide)base * base))
    if (e & 1) acc = (U)((typename pl_int<T>::wide)acc * base);
  return (T)acc;
}
template <class T> PL_DEV T pl_imax(T a, T b) { return a > b ? a : b; }
template <class T> PL_DEV T pl_imin(T a, T b) { return a < b ? a : b; }

// float -> int: truncate toward zero, NaN -> 0, saturate.
template <class To, class F> PL_DEV To pl_f2i(F x) {
  if (pl_isnan(x)) return (To)0;
  double d = (double)x;
  if (d >= (double)pl_int<To>::hi()) return pl_int<To>::hi();
  if (d <= (double)pl_int<To>::lo()) return pl_int<To>::lo();
  return (To)d;
}

// ---- Sort keys: an int64 whose signed order is the element type's total order --------------------
PL_DEV pl_i64 pl_sort_key(float x) { pl_i32 i = pl_bitcast<pl_i32>(x); return i < 0 ? (pl_i64)(i ^ 0x7FFFFFFF) : (pl_i64)i; }
PL_DEV pl_i64 pl_sort_key(double x) { pl_i64 i = pl_bitcast<pl_i64>(x); return i < 0 ? (i ^ 0x7FFFFFFFFFFFFFFFLL) : i; }
PL_DEV pl_i64 pl_sort_key(pl_f16 x) { pl_i16 i = (pl_i16)x.bits; return i < 0 ? (pl_i64)(pl_i16)(i ^ 0x7FFF) : (pl_i64)i; }
PL_DEV pl_i64 pl_sort_key(pl_bf16 x) { pl_i16 i = (pl_i16)x.bits; return i < 0 ? (pl_i64)(pl_i16)(i ^ 0x7FFF) : (pl_i64)i; }
PL_DEV pl_i64 pl_sort_key(pl_u64 x) { return (pl_i64)(x ^ 0x8000000000000000ull); }
PL_DEV pl_i64 pl_sort_key(bool x) { return x ? 1 : 0; }
template <class T> PL_DEV pl_i64 pl_sort_key(T x) { return (pl_i64)x; }

// ---- Atomics: compare-and-swap loops on the aligned 4- or 8-byte word holding the element ---------
#if PL_HOST_EMULATION
PL_DEV pl_u32 pl_cas32(pl_u32* p, pl_u32 expected, pl_u32 desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;  // the value seen: `expected` when the exchange happened
}
PL_DEV pl_u64 pl_cas64(pl_u64* p, pl_u64 expected, pl_u64 desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
#else
PL_DEV pl_u32 pl_cas32(pl_u32* p, pl_u32 expected, pl_u32 desired) { return atomicCAS(p, expected, desired); }
PL_DEV pl_u64 pl_cas64(pl_u64* p, pl_u64 expected, pl_u64 desired) { return atomicCAS((unsigned long long*)p, expected, desired); }
#endif
#if PL_HOST_EMULATION
template <class W> PL_DEV W pl_load_word(W* w) { return __atomic_load_n(w, __ATOMIC_RELAXED); }
#else
template <class W> PL_DEV W pl_load_word(W* w) { return *(volatile W*)w; }
#endif
// Applies `f(old) -> new` atomically to *p; returns the old value. Elements narrower than 4 bytes
// update their bytes inside the containing aligned word.
template <class T, class F> PL_DEV T pl_atomic_update(T* p, F f) {
  if constexpr (sizeof(T) == 8) {
    pl_u64* w = (pl_u64*)p;
    pl_u64 old = pl_load_word(w), seen;
    while (true) {
      T cur = pl_bitcast<T>(old);
      seen = pl_cas64(w, old, pl_bitcast<pl_u64>(f(cur)));
      if (seen == old) return cur;
      old = seen;
    }
  } else {
  char* bytes = (char*)p;
  pl_u64 addr = (pl_u64)bytes;
  pl_u32* w = (pl_u32*)(bytes - (addr & 3));
  unsigned shift = (unsigned)(addr & 3) * 8;
  pl_u32 mask = sizeof(T) == 4 ? 0xFFFFFFFFu : ((1u << (sizeof(T) * 8)) - 1u) << shift;
  pl_u32 old = pl_load_word(w), seen;
  while (true) {
    T cur;
    pl_u32 part = (old & mask) >> shift;
    pl_copy_bytes(&cur, &part, (int)sizeof(T));
    T nv = f(cur);
    pl_u32 nbits = 0;
    pl_copy_bytes(&nbits, &nv, (int)sizeof(T));
    pl_u32 next = (old & ~mask) | ((nbits << shift) & mask);
    seen = pl_cas32(w, old, next);
    if (seen == old) return cur;
    old = seen;
  }
  }
}

// ---- Errors: the first failing check of a launch wins; the host turns it into a pallas::Error ----
// err[0]: 0 = ok, else 1 + the failing site's number; err[1..]: the site's values.
PL_DEV void pl_fail(pl_i64* err, pl_i64 site, const pl_i64* values, int n) {
#if PL_HOST_EMULATION
  // A negative value: a thread's placeholder (pl_host_placeholder) for the reason it records now;
  // another thread's, or a recorded site, wins.
  pl_i64 expected = __atomic_load_n(err, __ATOMIC_SEQ_CST);
  do {
    if (expected != 0 && expected != pl_host_placeholder()) return;
  } while (!__atomic_compare_exchange_n((pl_i64*)err, &expected, site + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  pl_host_release_all();
#else
  if (atomicCAS((unsigned long long*)err, 0ull, (unsigned long long)(site + 1)) != 0ull) return;
#endif
  for (int i = 0; i < n && i < 30; ++i) err[1 + i] = values[i];
#if !PL_HOST_EMULATION
  __threadfence_system();
  // err[31] (kErrorFlagWord): the host's mapped flag, raised once the record is complete.
  if (pl_i64* flag = (pl_i64*)err[31]) {
    *(volatile pl_i64*)flag = 1;
    __threadfence_system();
  }
#endif
}
// ---- debug_print: one Pallas thread prints, holding a lock ------------------------------------------
// The GPU keeps only each thread's printf calls in order; the lock keeps a print's calls (an
// array takes one per element) together when several threads print.
__device__ int pl_print_lock_word;
PL_DEV void pl_print_lock() {
#if PL_HOST_EMULATION
  int free_word = 0;
  while (!__atomic_compare_exchange_n(&pl_print_lock_word, &free_word, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
    free_word = 0;
    std::this_thread::yield();
  }
#else
  while (atomicCAS(&pl_print_lock_word, 0, 1) != 0) __nanosleep(64);
  __threadfence();
#endif
}
PL_DEV void pl_print_unlock() {
#if PL_HOST_EMULATION
  fflush(stdout);
  __atomic_store_n(&pl_print_lock_word, 0, __ATOMIC_RELEASE);
#else
  __threadfence();
  atomicExch(&pl_print_lock_word, 0);
#endif
}
// A value as the interpreters print it (Scalar::to_string), except that floats show 9
// significant digits (%.9g) where the interpreters show the shortest text that reads back.
PL_DEV void pl_print_value(double x) {
  if (x != x) printf("nan");
  else printf("%.9g", x);
}
PL_DEV void pl_print_value(bool x) { printf("%s", x ? "true" : "false"); }
PL_DEV void pl_print_value(long long x) { printf("%lld", x); }
PL_DEV void pl_print_value(unsigned long long x) { printf("%llu", x); }
// The elements of an R-D array of `shape` as Array::to_string lays them out after its header
// (array_format.cpp): nested brackets, ", " between the elements of a row, between rows a comma,
// a newline per remaining axis and an indent of one space per open bracket. With `summarize` an
// axis longer than 6 shows its first and last 3 entries with "..." between. `elem(flat)` prints
// the element at row-major index flat. (Arrays with no elements are printed by the caller.)
template <int R, class F> PL_DEV void pl_print_array(const pl_i64 (&shape)[R], bool summarize, F elem) {
  static_assert(R >= 1 && R <= 16, "pl_print_array: rank 1 to 16");
  const char* open = "[[[[[[[[[[[[[[[[" + (16 - R);      // + (R - n): n brackets
  const char* close = "]]]]]]]]]]]]]]]]" + (16 - R);
  const char* lines = "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n" + (16 - R);
  const char* spaces = "                " + (16 - R);
  pl_i64 shown[R], total = 1;
  for (int a = 0; a < R; ++a) {
    shown[a] = summarize && shape[a] > 6 ? 6 : shape[a];
    total *= shown[a];
  }
  printf("%s", open);
  for (pl_i64 k = 0; k < total; ++k) {
    // k counts the shown elements; the last axis whose shown position is not 0 is where the
    // previous element's brackets close and reopen (none for the first element).
    pl_i64 rest = k, flat = 0, stride = 1, moved_to = 0;
    int moved = -1;
    for (int a = R - 1; a >= 0; --a) {
      const pl_i64 j = rest % shown[a];
      rest /= shown[a];
      if (moved < 0 && j != 0) moved = a, moved_to = j;
      flat += (shown[a] < shape[a] && j >= 3 ? shape[a] - 6 + j : j) * stride;
      stride *= shape[a];
    }
    if (moved >= 0) {
      const int inner = R - 1 - moved;  // brackets closed and reopened
      const char* comma = inner == 0 ? ", " : ",";
      const char* nl = lines + (R - inner);
      const char* indent = inner == 0 ? "" : spaces + (R - (moved + 1));
      const bool dots = shown[moved] < shape[moved] && moved_to == 3;
      printf("%s%s%s%s%s%s%s%s%s", close + (R - inner), comma, nl, indent, dots ? "..." : "", dots ? comma : "",
             dots ? nl : "", dots ? indent : "", open + (R - inner));
    }
    elem(flat);
  }
  printf("%s", close);
}
// ---- mbarriers (gpu::Barrier): a phase completes after its count of arrivals --------------------
// How long a barrier wait may take before the kernel reports a deadlock instead of hanging (host
// emulation: $PALLAS_GPU_WAIT_TIMEOUT_MS overrides it, so tests need not wait that long).
#define PL_WAIT_LIMIT_MS 20000ull
// Each thread keeps, per barrier, the parity of the phase its next wait awaits (a bit of
// `phases`), as Mosaic GPU does; a wait returns once that phase has completed.
#if PL_HOST_EMULATION
// One 64-bit word: pending arrivals (bits 0-19), arrivals per phase (20-39), completed phases
// (40-63), updated with atomics; waits spin on it, yielding.
PL_DEV void pl_mbar_init(pl_u64* b, pl_u32 count) { __atomic_store_n(b, ((pl_u64)count << 20) | count, __ATOMIC_RELEASE); }
PL_DEV void pl_mbar_arrive(pl_u64* b) {
  pl_u64 old = __atomic_load_n(b, __ATOMIC_RELAXED), next;
  do {
    const pl_u64 pending = old & 0xFFFFFull, count = (old >> 20) & 0xFFFFFull, phase = old >> 40;
    next = pending > 1 ? old - 1 : ((phase + 1) << 40) | (count << 20) | count;
  } while (!__atomic_compare_exchange_n(b, &old, next, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
}
// A bulk copy into shared memory lands at the latest moment its barrier's phase can be seen to
// complete: when some thread next tests the barrier. Until then its destination reads as all
// ones (pl_bulk_copy_rows), and it reads its source only now, so a read before the wait, or a
// write of the source after the issue, shows on the CPU.
PL_DEV void pl_host_land_bulk_loads(pl_u64* b) {
  if (pl_host_bulk_loads_pending.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(pl_host_bulk_loads_mu);
  std::vector<PlHostBulkLoad>& v = pl_host_bulk_loads;
  size_t keep = 0;
  int landed = 0;
  PlHostTx* tx = nullptr;
  for (size_t i = 0; i < v.size(); ++i) {  // (one pass: a slot's TMA boxes are many entries)
    if (v[i].b != b) {
      v[keep++] = v[i];
      continue;
    }
    v[i].rows.land();
    ++landed;
    if (!tx) tx = &pl_host_tx[b];
    if (v[i].arrive) {
      tx->owed += v[i].expect;
      ++tx->arrivals;
    } else {
      tx->owed -= v[i].rows.rows * (pl_i64)v[i].rows.row_bytes;
    }
  }
  v.resize(keep);
  pl_host_bulk_loads_pending.fetch_sub(landed, std::memory_order_release);
  if (!tx || tx->arrivals == 0 || tx->owed != 0) return;
  const int arrivals = tx->arrivals;
  tx->arrivals = 0;
  for (int a = 0; a < arrivals; ++a) pl_mbar_arrive(b);
}
PL_DEV void pl_mbar_inval(pl_u64* b) {
  pl_host_land_bulk_loads(b);
  std::lock_guard<std::mutex> lock(pl_host_bulk_loads_mu);
  pl_host_tx.erase(b);
}
PL_DEV bool pl_mbar_test(pl_u64* b, pl_u32 parity) {
  pl_host_land_bulk_loads(b);
  return ((__atomic_load_n(b, __ATOMIC_ACQUIRE) >> 40) & 1u) != parity;
}
PL_DEV pl_u64 pl_now_ns() {
  return (pl_u64)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
PL_DEV void pl_backoff() { std::this_thread::yield(); }
// (The GPU's blocks for a while in hardware; emulated threads let the others run.)
PL_DEV bool pl_mbar_try_wait(pl_u64* b, pl_u32 parity) {
  if (pl_mbar_test(b, parity)) return true;
  pl_backoff();
  return false;
}
static pl_u64 pl_wait_limit_ns() {
  const char* v = getenv("PALLAS_GPU_WAIT_TIMEOUT_MS");
  return (v && *v ? (pl_u64)atoll(v) : PL_WAIT_LIMIT_MS) * 1000000ull;
}
#else
PL_DEV pl_u32 pl_smem_u32(const void* p) {
  pl_u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
PL_DEV void pl_mbar_init(pl_u64* b, pl_u32 count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(pl_smem_u32(b)), "r"(count) : "memory");
}
PL_DEV void pl_mbar_inval(pl_u64* b) {
  asm volatile("mbarrier.inval.shared.b64 [%0];" ::"r"(pl_smem_u32(b)) : "memory");
}
PL_DEV void pl_mbar_arrive(pl_u64* b) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" ::"r"(pl_smem_u32(b)) : "memory");
}
// In a kernel with clusters a completed phase may carry other CTAs' arrivals: the wait acquires
// at cluster scope, so what they wrote before arriving is visible after it.
#if PL_CLUSTER_CTAS > 1
#define PL_MBAR_TEST_WAIT "mbarrier.test_wait.parity.acquire.cluster.shared::cta.b64"
#else
#define PL_MBAR_TEST_WAIT "mbarrier.test_wait.parity.shared.b64"
#endif
PL_DEV bool pl_mbar_test(pl_u64* b, pl_u32 parity) {
  pl_u32 done;
  asm volatile("{ .reg .pred p; " PL_MBAR_TEST_WAIT " p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done) : "r"(pl_smem_u32(b)), "r"(parity) : "memory");
  return done != 0;
}
// Like pl_mbar_test, but on sm_90 the thread is suspended in hardware until the phase completes
// or a time limit of the hardware's passes (CUTLASS's ClusterBarrier::wait loops on it): it wakes
// as the phase completes, where a poll with a sleep between tests would wake up to a sleep late.
// Before sm_90 (no try_wait) a test and a short sleep.
PL_DEV bool pl_mbar_try_wait(pl_u64* b, pl_u32 parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pl_u32 done;
#if PL_CLUSTER_CTAS > 1
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done) : "r"(pl_smem_u32(b)), "r"(parity) : "memory");
#else
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done) : "r"(pl_smem_u32(b)), "r"(parity) : "memory");
#endif
  return done != 0;
#else
  if (pl_mbar_test(b, parity)) return true;
  asm volatile("nanosleep.u32 64;");
  return false;
#endif
}
PL_DEV pl_u64 pl_now_ns() {
  pl_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
PL_DEV void pl_backoff() { asm volatile("nanosleep.u32 64;"); }
PL_DEV pl_u64 pl_wait_limit_ns() { return PL_WAIT_LIMIT_MS * 1000000ull; }
#endif
// Whether some thread has recorded an error (a wait stops waiting: it may be the one it needs).
PL_DEV bool pl_error_recorded(const pl_i64* err) {
#if PL_HOST_EMULATION
  return __atomic_load_n(err, __ATOMIC_ACQUIRE) != 0;
#else
  return *(const volatile pl_i64*)err != 0;
#endif
}
// Waits for the phase of barrier `i` (of the kernel's barriers at `b`) this thread awaits next;
// false when it has not completed within the wait limit (a deadlock: the caller reports it), or
// when another thread has recorded an error meanwhile (it may be the one this wait needs).
PL_DEV bool pl_mbar_wait(pl_u64* b, pl_u32* phases, pl_i64 i, const pl_i64* err) {
  const pl_u32 parity = (phases[i >> 5] >> (i & 31)) & 1u;
  if (!pl_mbar_test(b, parity)) {
    const pl_u64 start = pl_now_ns(), limit = pl_wait_limit_ns();
    while (!pl_mbar_try_wait(b, parity))
      if (pl_error_recorded(err) || pl_now_ns() - start > limit) return false;
  }
  phases[i >> 5] ^= 1u << (i & 31);
  return true;
}
// Before the `n` barriers at `b` are invalidated after a failed point (an error recorded: a wait
// gave up, so copies it did not wait for may still be landing): waits, for a bounded time, for
// each barrier's current phase to complete, so that copies completing on it land before the
// scratch is set up again for the next point or the CTA leaves. A phase that also lacks arrivals
// (from threads the failure took out) never completes: the bound (PL_SETTLE_NS in all) ends the
// wait — the copies the failed point issued are microseconds from landing by then. (The current
// phase is the one whose parity test_wait does not report complete; a phase that completes just
// before it is looked at costs the bound, nothing else. Host emulation's test lands the copies
// as it looks, so there the phase is read from the barrier's word: they land in the wait, as on
// the GPU.)
#ifndef PL_SETTLE_NS
#define PL_SETTLE_NS 1000000ull
#endif
PL_DEV pl_u32 pl_mbar_current_parity(pl_u64* b) {
#if PL_HOST_EMULATION
  return (pl_u32)((__atomic_load_n(b, __ATOMIC_ACQUIRE) >> 40) & 1u);
#else
  return pl_mbar_test(b, 0) ? 1u : 0u;
#endif
}
PL_DEV void pl_mbar_settle(pl_u64* b, int n, const pl_i64* err) {
  if (!pl_error_recorded(err)) return;
  const pl_u64 start = pl_now_ns();
  for (int i = 0; i < n; ++i) {
    const pl_u32 current = pl_mbar_current_parity(b + i);
    while (!pl_mbar_test(b + i, current) && pl_now_ns() - start < PL_SETTLE_NS) pl_backoff();
  }
}
// ---- Semaphores (gpu::Semaphore): a CTA's counters (shared memory), or the grid's (global) -----
// A signal is a release at GPU scope, made by one thread after its group's barrier, so what the
// whole group wrote before it is visible to a thread that acquires the count. A wait spins on an
// acquiring load until the count reaches `value`, then takes `value` away with a compare-and-swap
// (another waiter may have taken it first: then it looks again). Generic addresses: the grid's
// counters are in the launch's workspace, a CTA's in its shared memory (GPU scope covers both).
#if PL_HOST_EMULATION
PL_DEV void pl_sem_signal(pl_i32* s, pl_i32 inc) { __atomic_fetch_add(s, inc, __ATOMIC_RELEASE); }
PL_DEV pl_i32 pl_sem_read(pl_i32* s) { return __atomic_load_n(s, __ATOMIC_ACQUIRE); }
PL_DEV bool pl_sem_take(pl_i32* s, pl_i32 seen, pl_i32 value) {
  return __atomic_compare_exchange_n(s, &seen, seen - value, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
#else
PL_DEV void pl_sem_signal(pl_i32* s, pl_i32 inc) {
  asm volatile("red.release.gpu.add.s32 [%0], %1;" ::"l"(s), "r"(inc) : "memory");
}
PL_DEV pl_i32 pl_sem_read(pl_i32* s) {
  pl_i32 v;
  asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(s) : "memory");
  return v;
}
PL_DEV bool pl_sem_take(pl_i32* s, pl_i32 seen, pl_i32 value) {
  pl_i32 old;
  asm volatile("atom.acq_rel.gpu.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(s), "r"(seen), "r"(seen - value) : "memory");
  return old == seen;
}
#endif
// False when the count was not reached within the wait limit (a deadlock: the caller reports it),
// or when another thread has recorded an error meanwhile.
PL_DEV bool pl_sem_wait(pl_i32* s, pl_i32 value, bool decrement, const pl_i64* err) {
  const pl_u64 start = pl_now_ns(), limit = pl_wait_limit_ns();
  while (true) {
    const pl_i32 seen = pl_sem_read(s);
    if (seen >= value) {
      if (!decrement || pl_sem_take(s, seen, value)) return true;
      continue;
    }
    if (pl_error_recorded(err) || pl_now_ns() - start > limit) return false;
    pl_backoff();
  }
}
// ---- Bulk copies of either direction: what they need -------------------------------------------
#if !PL_HOST_EMULATION && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PL_HAS_BULK_COPY 1
#else
#define PL_HAS_BULK_COPY PL_HOST_EMULATION
#endif
PL_DEV bool pl_bulk_ok(const void* src, const void* dst) {
  return PL_HAS_BULK_COPY && (((unsigned long long)src | (unsigned long long)dst) & 15ull) == 0;
}
// Arrives on barrier b with `bytes` as expected transactions: the phase completes once every
// arrival is in and that many bytes of bulk or TMA copies (complete_tx on b) have landed. Each
// bulk or TMA copy into shared memory arrives through it, once, before its copies are issued.
PL_DEV void pl_expect_tx(pl_u64* b, pl_u32 bytes) {
#if PL_HOST_EMULATION
  // The arrival lands when a thread tests the barrier and `bytes` of copies have landed on it.
  std::lock_guard<std::mutex> lock(pl_host_bulk_loads_mu);
  pl_host_bulk_loads.push_back({b, {nullptr, nullptr, 0, 0, 0, 0}, true, (pl_i64)bytes});
  pl_host_bulk_loads_pending.fetch_add(1, std::memory_order_release);
#elif PL_HAS_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(pl_smem_u32(b)), "r"(bytes) : "memory");
#else
  (void)b, (void)bytes;
#endif
}
// Orders the thread's earlier accesses to shared and global memory (the generic proxy) before
// bulk copies that a thread of its group starts after the group's next sync (the async proxy).
PL_DEV void pl_fence_before_bulk_copy() {
#if !PL_HOST_EMULATION && PL_HAS_BULK_COPY
  asm volatile("fence.proxy.async;" ::: "memory");
#endif
}
// The kernel's mbarriers (PL_NUM_MBARRIERS, gpu::Barrier scratch): static shared memory, one set
// per CTA; pl_mbar_arrive_peers(b, peers) arrives on barrier b of each CTA of the cluster whose
// rank is in the mask `peers` (gpu::ClusterBarrier; 0: this CTA's barrier only), remotely with
// mapa and a cluster-scope release.
#ifdef PL_NUM_MBARRIERS
#if PL_HOST_EMULATION
static pl_u64 pl_host_mbar[PL_HOST_CTAS][PL_NUM_MBARRIERS];
#define pl_mbar (pl_host_mbar[pl_host_cta()])
PL_DEV void pl_mbar_arrive_remote(pl_u64* b, int rank) {
  pl_mbar_arrive(&pl_host_mbar[pl_host_cta() - pl_cluster_rank() + rank][b - pl_mbar]);
}
#else
__shared__ __align__(8) pl_u64 pl_mbar[PL_NUM_MBARRIERS];
PL_DEV void pl_mbar_arrive_remote(pl_u64* b, int rank) {
#if PL_CLUSTER_CTAS > 1
  asm volatile("{ .reg .b32 remote; mapa.shared::cluster.u32 remote, %0, %1; "
               "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote]; }" ::"r"(pl_smem_u32(b)), "r"(rank)
               : "memory");
#else
  pl_mbar_arrive(b);
#endif
}
#endif
// Orders this thread's mbarrier.init before the arrivals that other proxies and CTAs make on
// them: the complete_tx of bulk and TMA copies (the async proxy, in any kernel on sm_90) and
// peers' remote arrivals (with clusters); a CTA or cluster sync follows.
PL_DEV void pl_fence_mbar_init() {
#if !PL_HOST_EMULATION && PL_HAS_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
PL_DEV void pl_mbar_arrive_peers(pl_u64* b, pl_u32 peers) {
  if (peers == 0) {
    pl_mbar_arrive(b);
    return;
  }
  for (int q = 0; q < PL_CLUSTER_CTAS; ++q)
    if ((peers >> q) & 1u) pl_mbar_arrive_remote(b, q);
}
// ---- Asynchronous copies from global to shared memory (gpu::kernel's copy_gmem_to_smem) ---------
// On sm_90 one thread starts a bulk copy per row (cp.async.bulk, the TMA unit's untiled form) and
// arrives on the barrier with the copy's bytes as the phase's expected transactions: the phase
// completes when every arrival is in and every byte has landed, so the issuing group goes on at
// once and the copy overlaps whatever comes next. Bulk copies need 16-byte aligned addresses
// (the emitter checks sizes and strides; pl_bulk_ok the addresses at run time, else the group
// copies the elements itself). In host emulation the copy lands, and arrives, when a thread
// next tests the barrier (pl_host_land_bulk_loads).
PL_DEV void pl_bulk_copy_rows(void* dst, pl_i64 dst_row_stride, const void* src, pl_i64 src_row_stride, pl_i64 rows,
                              pl_u32 row_bytes, pl_u64* b) {
  pl_expect_tx(b, (pl_u32)(rows * row_bytes));
#if PL_HOST_EMULATION
  for (pl_i64 r = 0; r < rows; ++r) memset((pl_u8*)dst + r * dst_row_stride, 0xFF, row_bytes);
  std::lock_guard<std::mutex> lock(pl_host_bulk_loads_mu);
  pl_host_bulk_loads.push_back({b, {(pl_u8*)dst, (const pl_u8*)src, dst_row_stride, src_row_stride, rows, row_bytes}, false});
  pl_host_bulk_loads_pending.fetch_add(1, std::memory_order_release);
#elif PL_HAS_BULK_COPY
  for (pl_i64 r = 0; r < rows; ++r)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     pl_smem_u32((pl_u8*)dst + r * dst_row_stride)),
                 "l"((const pl_u8*)src + r * src_row_stride), "r"(row_bytes), "r"(pl_smem_u32(b))
                 : "memory");
#endif
}
#endif
// ---- Asynchronous copies from shared to global memory (gpu::kernel's copy_smem_to_gmem) ---------
// On sm_90 thread 0 of the group starts a bulk copy per row (cp.async.bulk ... bulk_group) and
// commits them as one bulk group; pl_bulk_store_wait<N, READ_ONLY> (wait_smem_to_gmem) returns
// once at most N of the thread's newest groups are pending — with READ_ONLY, pending their reads
// of shared memory only. Every copy_smem_to_gmem commits one group (an empty one when the group
// copied the elements itself) unless made with commit_group = false, which leaves it to the next
// commit (pl_bulk_store_commit: commit_smem_to_gmem_group), so N counts groups as the interpreter
// does. A CTA's point ends by committing and waiting for them all. Host emulation takes both ends of a copy's
// window, as for cp.async: at the issue the destination rows become all ones (NaN for floats),
// and the rows are copied when a wait retires the group, reading the source then.
PL_DEV void pl_bulk_store_commit() {
#if PL_HOST_EMULATION
  pl_host_bulk_stores[(size_t)pl_host_tid()].commit();
#elif PL_HAS_BULK_COPY
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
PL_DEV void pl_bulk_store_rows(void* dst, pl_i64 dst_row_stride, const void* src, pl_i64 src_row_stride, pl_i64 rows,
                               pl_u32 row_bytes, bool commit) {
#if PL_HOST_EMULATION
  for (pl_i64 r = 0; r < rows; ++r) memset((pl_u8*)dst + r * dst_row_stride, 0xFF, row_bytes);
  pl_host_bulk_stores[(size_t)pl_host_tid()].push({(pl_u8*)dst, (const pl_u8*)src, dst_row_stride, src_row_stride, rows, row_bytes});
#elif PL_HAS_BULK_COPY
  for (pl_i64 r = 0; r < rows; ++r)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"((pl_u8*)dst + r * dst_row_stride),
                 "r"(pl_smem_u32((const pl_u8*)src + r * src_row_stride)), "r"(row_bytes)
                 : "memory");
#endif
  if (commit) pl_bulk_store_commit();
}
template <int N, bool READ_ONLY> PL_DEV void pl_bulk_store_wait() {
#if PL_HOST_EMULATION
  pl_host_bulk_stores[(size_t)pl_host_tid()].retire(N, [](const PlHostRows& r) { r.land(); });
#elif PL_HAS_BULK_COPY
  if (READ_ONLY)
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
  else
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// ---- The pipeline of a sequential axis: blocks copied ahead into shared-memory slots ---------------
// (codegen.cpp, "pipelined" inputs.) pl_slots is the ring's shared memory: after the arena in the
// dynamic shared memory on the GPU (PL_SLOTS_OFFSET), a static buffer per CTA in host emulation.
// pl_cp_async16 copies 16 bytes from global memory without passing through registers (cp.async,
// sm_80 and later; a plain copy before sm_80; in host emulation a copy that lands at the wait);
// a thread's copies since its
// last pl_cp_async_commit form a group, and pl_cp_async_wait<N>() returns once at most N of its
// newest groups are still in flight. Other threads see the bytes after a barrier that follows.
//
// In host emulation the ring and wgmma's staging share one static buffer per CTA, the emulated
// shared memory: wgmma's descriptors hold addresses in it (pl_wgmma_smem_addr), whichever of the
// two an operand is in.
#if PL_HOST_EMULATION
#ifdef PL_SLOT_BYTES
#define PL_HOST_SLOT_SPAN PL_SLOT_BYTES
#else
#define PL_HOST_SLOT_SPAN 0
#endif
#ifdef PL_WGMMA_STAGES
#define PL_HOST_STAGING_SPAN (PL_WGMMA_STAGES * PL_WG_STAGE_BYTES)
#else
#define PL_HOST_STAGING_SPAN 0
#endif
// A gpu::kernel's arena (its SMEM scratch) comes first, as in the GPU's dynamic shared memory:
// PL_HOST_ARENA_SPAN bytes (whole KiB), so that wgmma can read its operands there in place.
#ifndef PL_HOST_ARENA_SPAN
#define PL_HOST_ARENA_SPAN 0
#endif
// (Each CTA's from a 1024-byte boundary, as swizzled shared memory needs: pl_swizzle.)
alignas(1024) static pl_u8 pl_host_shared[PL_HOST_CTAS][(PL_HOST_ARENA_SPAN + PL_HOST_SLOT_SPAN + PL_HOST_STAGING_SPAN + 128 + 1023) / 1024 * 1024];
#define pl_host_shared_base (pl_host_shared[pl_host_cta()])
#endif
#ifdef PL_SLOT_BYTES
#if PL_HOST_EMULATION
#define pl_slots (pl_host_shared_base + PL_HOST_ARENA_SPAN)
#else
extern __shared__ __align__(PL_SMEM_ALIGN) char pl_smem[];
#define pl_slots ((pl_u8*)pl_smem + PL_SLOTS_OFFSET)
#endif
#endif
// gpu::async_prefetch: the 128-byte line of global memory at p into the L2 cache (a hint).
PL_DEV void pl_prefetch_l2(const void* p) {
#if !PL_HOST_EMULATION
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}
// gpu::cluster_ref: the place of p (in this CTA's shared memory) in the shared memory of the
// cluster's CTA `rank` — distributed shared memory, a generic address that loads and stores take
// (mapa); in host emulation the same offset in that CTA's emulated shared memory.
template <class T> PL_DEV T* pl_cluster_peer(T* p, int rank) {
#if PL_HOST_EMULATION
  return (T*)(pl_host_shared[pl_host_cta() - pl_cluster_rank() + rank] + ((pl_u8*)p - pl_host_shared_base));
#elif PL_CLUSTER_CTAS > 1 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pl_u64 peer;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(peer) : "l"(p), "r"(rank));
  return (T*)peer;
#else
  return (void)rank, p;  // (a cluster of one CTA)
#endif
}
// Where a ring slot keeps its block (codegen.cpp's PL_SLOT_LAYOUT_j): layout 0 is row-major;
// 1 to 4 are wgmma's canonical layouts, so the tensor cores read the slot as it is (no staging
// copy). They differ in how wgmma reads them (pl_wgmma_block's descriptors):
//  * 1 and 3, K-major: a's block m x k, or b's n x k;
//  * 2 and 4, MN-major: b's block k x n, read with wgmma's transpose-b flag.
// 1 and 2 are the no-swizzle layouts, for any block of 8-column chunks. They keep the block
// (rows x cols) column chunk by column chunk: the 16-byte chunks of columns 8q .. 8q + 7 of all
// rows, row after row, then those of the next q — element (r, c) at byte (c / 8) * 16 * rows +
// r * 16 + (c % 8) * size — read by 8 x 16-byte "core matrices" (128 contiguous bytes):
//  * 1: core matrices 128 bytes apart down the rows (the stride byte offset), 16 * rows apart
//    along K (the leading byte offset);
//  * 2: 128 bytes apart along K (the rows), 16 * rows apart along N.
// 3 and 4 are the 128-byte swizzled layouts, for blocks of 64-column panels (rows % 8 == 0): a
// panel is its rows of 128 bytes one after the other, the panels one after the other, and within
// each 1024 bytes (8 rows) the 16-byte chunk j of row r sits at chunk j ^ (r % 8)
// (pl_swizzle<128>) — what the TMA unit writes with CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads
// with descriptor layout 1, both from the address bits, so a slot starts on a 1024-byte boundary.
// A panel is one TMA box (64 columns x rows), where the no-swizzle layouts take a box per
// 8-column chunk, and the 8 rows of a 16-byte column chunk that wgmma reads together lie in
// different banks.
// A chunk of a slot is thus one TMA box of 8 columns x rows (layouts 1, 2) or a panel of 64 (3,
// 4) (pl_prefetch issues them); its cp.async path copies 16-byte chunks: pl_slot_chunk names the
// source chunk (row r, chunk q) of destination chunk c — consecutive threads write consecutive
// chunks of the slot (no bank conflicts). The layouts are chosen for 2-byte elements only (bf16,
// f16: 8 to a chunk).
// The W-byte swizzle (W 32, 64, 128: CUTLASS's Swizzle<1|2|3, 4, 3>) of a byte offset from an
// 8 W-byte boundary: its 16-byte chunk bits XOR the bits from bit 7 up (rows of W bytes: chunk j
// of row r goes to j ^ ((r * W >> 7) % (W / 16))); 0: none.
template <int W> PL_DEV constexpr pl_i64 pl_swizzle(pl_i64 byte) {
  return W == 0 ? byte : byte ^ ((byte >> 3) & ((W / 16 - 1) << 4));
}
// The layout (of pl_slot_elem, pl_wgmma_block's descriptors) of a W-byte swizzled panel read
// K-major or MN-major: 3 / 4 for 128 bytes, 5 / 6 for 64, 7 / 8 for 32; 0 for none.
PL_DEV constexpr int pl_swizzled_layout(int w, bool mn_major) {
  return w == 128 ? 3 + mn_major : w == 64 ? 5 + mn_major : w == 32 ? 7 + mn_major : 0;
}
// The row bytes of layout L's panels (0: not swizzled).
PL_DEV constexpr int pl_layout_swizzle(int L) { return L == 3 || L == 4 ? 128 : L == 5 || L == 6 ? 64 : L >= 7 ? 32 : 0; }
// Element e (counted row-major from a 1024-byte boundary) of a gpu::kernel's swizzled SMEM tile
// (PL_SMEM_SWIZZLED_s = W: rows of W bytes, each 16-byte chunk moved by pl_swizzle<W>, as a
// W-byte swizzled TMA box lands and as wgmma reads it); e itself when W is 0. A tile of R x C
// matrices with C wider than a panel (W bytes) holds each matrix as C / P panels of R rows of P
// elements (P = W / sizeof(T)), one after another — as a TMA box per panel lands them and as
// wgmma's swizzled layouts read several panels — e counted row-major over whole matrices.
template <int W, class T, int C = 0, int R = 0> PL_DEV pl_i64 pl_smem_elem(pl_i64 e) {
  if (W == 0) return e;
  constexpr pl_i64 P = W ? W / (pl_i64)sizeof(T) : 1;
  if constexpr (C > P) {
    const pl_i64 in = e % ((pl_i64)C * R);
    e += (in % C / P) * R * P + (in / C) * P + in % P - in;
  }
  return pl_swizzle<W>(e * (pl_i64)sizeof(T)) / (pl_i64)sizeof(T);
}
template <int L>
PL_DEV void pl_slot_chunk(pl_i64 c, pl_i64 rows, pl_i64 chunks_per_row, pl_i64& r, pl_i64& q) {
  if (L >= 3) {
    constexpr int W = pl_layout_swizzle(L), C = W / 16;  // chunks per panel row
    const pl_i64 in_panel = c % (rows * C);
    r = in_panel / C;
    q = c / (rows * C) * C + ((in_panel % C) ^ ((r * W >> 7) % C));
  } else if (L != 0) {
    r = c % rows;
    q = c / rows;
  } else {
    r = c / chunks_per_row;
    q = c % chunks_per_row;
  }
}
// The element index in the slot of the block's element (r, col) (8 elements per chunk).
template <int L>
PL_DEV pl_i64 pl_slot_elem(pl_i64 r, pl_i64 col, pl_i64 rows, pl_i64 chunks_per_row) {
  if constexpr (L >= 3) {  // (constexpr: no division by a zero W where L is not swizzled)
    constexpr int W = pl_layout_swizzle(L), P = W / 2;  // a panel's row: bytes, elements
    return (col / P * rows * W + pl_swizzle<W>(r * W + col % P * 2)) / 2;
  }
  if (L != 0) return (col / 8 * rows + r) * 8 + col % 8;
  return r * chunks_per_row * 8 + col;
}
// ---- TMA tensor copies (sm_90): the ring's, and gpu::kernel's copies of boxes -------------------
// A box of an array is copied by the TMA unit through a tensor map the host encoded
// (cuTensorMapEncodeTiled; GeneratedKernel::tensor_maps) into the kernel's parameters, which are
// __grid_constant__ so that the unit reads it where it is: p.tmap[m], and bit m of p.tma_ok says
// it was encoded (else the copy takes its other path: a base address that is not 16-byte aligned,
// a device without TMA). Into shared memory a box completes on an mbarrier whose phase expects
// its bytes (pl_expect_tx: one arrival with the bytes as expected transactions, before the
// boxes); to global memory it joins the thread's bulk group (pl_bulk_store_commit / _wait).
struct alignas(64) PlTensorMap {
  pl_u64 w[16];
};
#if PL_HOST_EMULATION
// The emulated tensor map (host_emulation.cpp writes it): w[0] the array's address, w[1] its rank
// R, w[2] the element's bytes, w[3 + i] the size of dim i (innermost first), w[7 + i] the byte
// stride of dim i >= 1, w[12 + i / 2] >> 32 (i % 2) the box's size in dim i, w[15] its swizzle's
// bytes (0, or 32, 64, 128: CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B).
static const pl_u8 pl_host_zeros[256 * 8] = {};
// Walks the box at element coordinates c (innermost first), laid out row-major in shared memory
// at smem, as runs of rows along dim 1: run(smem_rows, gmem_rows, rows, gmem_row_stride, lo, hi)
// for each run, gmem_rows the array's address of the first row's element c[0] (null: the rows lie
// outside the array), [lo, hi) the elements of a row inside it.
template <int R, class F> PL_DEV void pl_host_box_rows(const PlTensorMap* map, const int (&c)[R], pl_u8* smem, F run) {
  const pl_u64* w = map->w;
  if ((int)w[1] != R) abort();  // (boxes are issued with the map's rank)
  const pl_u8* base = (const pl_u8*)w[0];
  const pl_i64 elem = (pl_i64)w[2];
  pl_i64 dim[5] = {1, 1, 1, 1, 1}, stride[5] = {0, 0, 0, 0, 0}, box[5] = {1, 1, 1, 1, 1}, at[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < R; ++i) {
    dim[i] = (pl_i64)w[3 + i];
    stride[i] = i == 0 ? elem : (pl_i64)w[7 + i];
    box[i] = (pl_i64)((w[12 + i / 2] >> (32 * (i % 2))) & 0xFFFFFFFFu);
    at[i] = c[i];
  }
  const pl_i64 lo = at[0] < 0 ? -at[0] : 0, hi = at[0] + box[0] > dim[0] ? dim[0] - at[0] : box[0];
  const pl_i64 row_bytes = box[0] * elem, outer = box[2] * box[3] * box[4];
  for (pl_i64 o = 0; o < outer; ++o) {
    pl_i64 rest = o, offset = 0;
    bool inside = hi > lo;
    for (int i = 2; i < 5; ++i) {
      const pl_i64 x = at[i] + rest % box[i];
      rest /= box[i];
      inside = inside && x >= 0 && x < dim[i];
      offset += x * stride[i];
    }
    pl_u8* rows = smem + o * box[1] * row_bytes;
    // Dim 1: the rows before the array, inside it, past it.
    const pl_i64 first = at[1] < 0 ? -at[1] : 0, last = at[1] + box[1] > dim[1] ? dim[1] - at[1] : box[1];
    if (!inside || last <= first) {
      run(rows, (const pl_u8*)nullptr, box[1], stride[1], lo, hi);
      continue;
    }
    if (first > 0) run(rows, (const pl_u8*)nullptr, first, stride[1], lo, hi);
    run(rows + first * row_bytes, base + offset + (at[1] + first) * stride[1] + at[0] * elem, last - first, stride[1], lo, hi);
    if (last < box[1]) run(rows + last * row_bytes, (const pl_u8*)nullptr, box[1] - last, stride[1], lo, hi);
  }
}
// Loads the box at coordinates c into dst (row-major) as the TMA unit does: elements outside the
// array read as zero. The rows land when a thread tests barrier b (pl_host_land_bulk_loads);
// until then they read as all ones.
// With a W-byte swizzle each row's 16-byte chunks are permuted (pl_host_copy_bytes): the box's
// rows are W bytes and it starts on an 8 W-byte boundary, where the swizzle's pattern repeats.
template <int R> PL_DEV void pl_host_tma_land(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b) {
  const pl_i64 elem = (pl_i64)map->w[2], row_bytes = elem * (pl_i64)(map->w[12] & 0xFFFFFFFFu);
  const int swizzle = (int)map->w[15];  // (rows of that many bytes from a boundary of 8 of them)
  if (swizzle != 0 && (row_bytes != swizzle || (pl_u64)dst % (8 * swizzle) != 0)) abort();  // (never emitted)
  std::lock_guard<std::mutex> lock(pl_host_bulk_loads_mu);
  pl_u8 ones[128];
  memset(ones, 0xFF, sizeof ones);
  auto push = [&](pl_u8* to, const pl_u8* from, pl_i64 from_stride, pl_i64 rows, pl_i64 bytes) {
    if (rows <= 0 || bytes <= 0) return;
    for (pl_i64 r = 0; r < rows; ++r) {
      if (swizzle != 0) pl_host_copy_bytes(to + r * row_bytes, ones, bytes, swizzle);
      else memset(to + r * row_bytes, 0xFF, (size_t)bytes);
    }
    pl_host_bulk_loads.push_back({b, {to, from, row_bytes, from_stride, rows, (pl_u32)bytes, swizzle}, false});
    pl_host_bulk_loads_pending.fetch_add(1, std::memory_order_release);
  };
  pl_host_box_rows<R>(map, c, (pl_u8*)dst, [&](pl_u8* rows, const pl_u8* from, pl_i64 n, pl_i64 stride, pl_i64 lo, pl_i64 hi) {
    if (!from) return push(rows, pl_host_zeros, 0, n, row_bytes);
    push(rows, pl_host_zeros, 0, n, lo * elem);
    push(rows + lo * elem, from + lo * elem, stride, n, (hi - lo) * elem);
    push(rows + hi * elem, pl_host_zeros, 0, n, row_bytes - hi * elem);
  });
}
template <int R> PL_DEV void pl_tma_load(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b) {
  pl_host_tma_count.fetch_add(1, std::memory_order_relaxed);
  pl_host_tma_land<R>(dst, map, c, b);
}
#ifdef PL_NUM_MBARRIERS
// The same box landing in every CTA of the cluster whose rank is in `peers`, at the place of dst
// in each one's shared memory, completing on its barrier at the place of b (a multicast copy's
// share): one instruction.
template <int R> PL_DEV void pl_tma_load_multicast(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b, pl_u32 peers) {
  pl_host_tma_count.fetch_add(1, std::memory_order_relaxed);
  const int first = pl_host_cta() - pl_cluster_rank();
  const pl_i64 at = (pl_u8*)dst - pl_host_shared_base, barrier = b - pl_mbar;
  for (int q = 0; q < PL_CLUSTER_CTAS; ++q)
    if ((peers >> q) & 1u) pl_host_tma_land<R>(pl_host_shared[first + q] + at, map, c, &pl_host_mbar[first + q][barrier]);
}
#endif
// Stores the box at coordinates c from src (row-major) into the array, as the TMA unit does:
// elements outside the array are not written. A part of the thread's open bulk group: at the issue
// the destination reads as all ones, and the rows are copied (reading src then) when a
// pl_bulk_store_wait retires the group. With a W-byte swizzle src is swizzled as pl_tma_load
// leaves it (the same limits), and each row's chunks are read from their swizzled places.
template <int R> PL_DEV void pl_tma_store(const PlTensorMap* map, const int (&c)[R], const void* src) {
  const pl_i64 elem = (pl_i64)map->w[2], row_bytes = elem * (pl_i64)(map->w[12] & 0xFFFFFFFFu);
  const int swizzle = (int)map->w[15];
  if (swizzle != 0 && (row_bytes != swizzle || (pl_u64)src % (8 * swizzle) != 0)) abort();  // (never emitted)
  pl_host_tma_count.fetch_add(1, std::memory_order_relaxed);
  pl_host_box_rows<R>(map, c, (pl_u8*)src, [&](pl_u8* rows, const pl_u8* to, pl_i64 n, pl_i64 stride, pl_i64 lo, pl_i64 hi) {
    if (!to || hi <= lo) return;
    for (pl_i64 r = 0; r < n; ++r) memset((pl_u8*)to + r * stride + lo * elem, 0xFF, (size_t)((hi - lo) * elem));
    pl_host_bulk_stores[(size_t)pl_host_tid()].push(
        {(pl_u8*)to + lo * elem, rows + lo * elem, stride, row_bytes, n, (pl_u32)((hi - lo) * elem), swizzle, true});
  });
}
#elif PL_HAS_BULK_COPY
// One TMA load of the box at coordinates c into dst, completing on barrier b; MULTICAST: the box
// lands at dst's offset in the shared memory of each CTA of the cluster whose rank is in `peers`
// (a 16-bit mask), completing on the barrier at b's offset there.
template <int R, bool MULTICAST>
PL_DEV void pl_tma_load_box(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b, pl_u32 peers) {
  const pl_u32 d = pl_smem_u32(dst), m = pl_smem_u32(b);
  const pl_u64 t = (pl_u64)map;
  const unsigned short mask = (unsigned short)peers;  // (operand %3, which the plain form leaves unused)
#define PL_TMA_LOAD(N, COORDS, ...)                                                                                  \
  if constexpr (MULTICAST)                                                                                           \
    asm volatile("cp.async.bulk.tensor." #N "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster" \
                 " [%0], [%1, " COORDS "], [%2], %3;" ::"r"(d), "l"(t), "r"(m), "h"(mask), __VA_ARGS__ : "memory");     \
  else                                                                                                               \
    asm volatile("cp.async.bulk.tensor." #N "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"              \
                 " [%0], [%1, " COORDS "], [%2];" ::"r"(d), "l"(t), "r"(m), "h"(mask), __VA_ARGS__ : "memory")
  if constexpr (R == 1) { PL_TMA_LOAD(1, "{%4}", "r"(c[0])); }
  if constexpr (R == 2) { PL_TMA_LOAD(2, "{%4, %5}", "r"(c[0]), "r"(c[1])); }
  if constexpr (R == 3) { PL_TMA_LOAD(3, "{%4, %5, %6}", "r"(c[0]), "r"(c[1]), "r"(c[2])); }
  if constexpr (R == 4) { PL_TMA_LOAD(4, "{%4, %5, %6, %7}", "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3])); }
  if constexpr (R == 5) { PL_TMA_LOAD(5, "{%4, %5, %6, %7, %8}", "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4])); }
#undef PL_TMA_LOAD
}
template <int R> PL_DEV void pl_tma_load(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b) {
  pl_tma_load_box<R, false>(dst, map, c, b, 0);
}
template <int R> PL_DEV void pl_tma_load_multicast(void* dst, const PlTensorMap* map, const int (&c)[R], pl_u64* b, pl_u32 peers) {
  pl_tma_load_box<R, true>(dst, map, c, b, peers);
}
template <int R> PL_DEV void pl_tma_store(const PlTensorMap* map, const int (&c)[R], const void* src) {
  const pl_u32 s = pl_smem_u32(src);
  const pl_u64 t = (pl_u64)map;
#define PL_TMA_STORE(N, COORDS, ...)                                                                               \
  asm volatile("cp.async.bulk.tensor." #N "d.global.shared::cta.tile.bulk_group [%0, " COORDS "], [%1];" ::"l"(t), \
               "r"(s), __VA_ARGS__ : "memory")
  if constexpr (R == 1) PL_TMA_STORE(1, "{%2}", "r"(c[0]));
  if constexpr (R == 2) PL_TMA_STORE(2, "{%2, %3}", "r"(c[0]), "r"(c[1]));
  if constexpr (R == 3) PL_TMA_STORE(3, "{%2, %3, %4}", "r"(c[0]), "r"(c[1]), "r"(c[2]));
  if constexpr (R == 4) PL_TMA_STORE(4, "{%2, %3, %4, %5}", "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
  if constexpr (R == 5) PL_TMA_STORE(5, "{%2, %3, %4, %5, %6}", "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]));
#undef PL_TMA_STORE
}
#endif
// At the kernel's entry: one thread brings the encoded tensor maps (bit m of `ok`) into the TMA
// unit's descriptor cache, so that a CTA's first copies do not wait for their map's fetch
// (CUTLASS's prefetch_tma_descriptor). Nothing to do in emulation or without TMA.
PL_DEV void pl_prefetch_tensor_maps(const PlTensorMap* maps, int n, pl_u64 ok) {
#if PL_HAS_BULK_COPY && !PL_HOST_EMULATION
  if (threadIdx.x == 0)
    for (int m = 0; m < n; ++m)
      if ((ok >> m) & 1u) asm volatile("prefetch.tensormap [%0];" ::"l"(maps + m) : "memory");
#else
  (void)maps, (void)n, (void)ok;
#endif
}
#if !PL_HOST_EMULATION && !PL_HAS_BULK_COPY
template <int R> PL_DEV void pl_tma_load(void*, const PlTensorMap*, const int (&)[R], pl_u64*) {}
template <int R> PL_DEV void pl_tma_load_multicast(void*, const PlTensorMap*, const int (&)[R], pl_u64*, pl_u32) {}
template <int R> PL_DEV void pl_tma_store(const PlTensorMap*, const int (&)[R], const void*) {}
#endif
// The ring (codegen.cpp's pipelined inputs with TMA): one barrier per slot, initialized once per
// CTA; at each step thread 0 expects the slot's bytes and issues its boxes (pl_prefetch), and
// every thread waits for the slot's phase (pl_ring_wait), keeping the parity it awaits next per
// slot (pl_ring_phase) across the CTA's points.
#ifdef PL_RING_SLOTS
#if PL_HOST_EMULATION
static pl_u64 pl_host_ring_mbar[PL_HOST_CTAS][PL_RING_SLOTS];
#define pl_ring_mbar (pl_host_ring_mbar[pl_host_cta()])
#elif PL_HAS_BULK_COPY
__shared__ __align__(8) pl_u64 pl_ring_mbar[PL_RING_SLOTS];
#endif
#if PL_HAS_BULK_COPY
PL_DEV void pl_ring_init() {
  if (pl_cta_tid() == 0) {
    for (int i = 0; i < PL_RING_SLOTS; ++i) pl_mbar_init(pl_ring_mbar + i, 1);
#if !PL_HOST_EMULATION
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // seen by the TMA unit
#endif
  }
  pl_cta_sync();
}
// Waits for slot `slot`'s copies (false: not within the wait limit, or another thread failed).
PL_DEV bool pl_ring_wait(const pl_i64* err, pl_u32& phases, int slot) {
  return pl_mbar_wait(pl_ring_mbar + slot, &phases, slot, err);
}
// Leaving a point early: waits for the copies of steps [first, last] still landing in their slots
// (the TMA unit completes them), so the parities stay in step and no copy lands later. Within
// the wait limit all the same: copies that never complete (a byte count that disagrees with the
// boxes) must not hang a kernel that has recorded its error already.
PL_DEV void pl_ring_drain(pl_u32& phases, pl_i64 first, pl_i64 last) {
  const pl_u64 start = pl_now_ns(), limit = pl_wait_limit_ns();
  for (pl_i64 s = first; s <= last; ++s) {
    const int slot = (int)(s % PL_RING_SLOTS);
    while (!pl_mbar_test(pl_ring_mbar + slot, (phases >> slot) & 1u)) {
      if (pl_now_ns() - start > limit) return;
      pl_backoff();
    }
    phases ^= 1u << slot;
  }
}
#else
PL_DEV void pl_ring_init() {}
PL_DEV bool pl_ring_wait(const pl_i64*, pl_u32&, int) { return true; }
PL_DEV void pl_ring_drain(pl_u32&, pl_i64, pl_i64) {}
#endif
#endif
#if !PL_HOST_EMULATION && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
PL_DEV void pl_cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(pl_smem_u32(smem)), "l"(gmem) : "memory");
}
PL_DEV void pl_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> PL_DEV void pl_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#elif PL_HOST_EMULATION
// On the GPU the 16 bytes land at some time between the copy's issue and the wait that retires
// its group. Emulation takes both ends: at the issue the destination becomes all ones (NaN for
// floats) — so whatever still reads the old bytes (a wgmma left running on the slot) reads
// garbage — and the bytes land at the wait (the thread's queue, pl_host_async_copies) — so a read
// before the wait reads garbage too.
PL_DEV void pl_cp_async16(void* smem, const void* gmem) {
  memset(smem, 0xFF, 16);
  pl_host_async_copies[(size_t)pl_host_tid()].push({(pl_u8*)smem, (const pl_u8*)gmem, 0, 0, 1, 16});
}
PL_DEV void pl_cp_async_commit() { pl_host_async_copies[(size_t)pl_host_tid()].commit(); }
template <int N> PL_DEV void pl_cp_async_wait() {
  pl_host_async_copies[(size_t)pl_host_tid()].retire(N, [](const PlHostRows& r) { r.land(); });
}
#else
PL_DEV void pl_cp_async16(void* smem, const void* gmem) {
  ((pl_u64*)smem)[0] = ((const pl_u64*)gmem)[0];
  ((pl_u64*)smem)[1] = ((const pl_u64*)gmem)[1];
}
PL_DEV void pl_cp_async_commit() {}
template <int N> PL_DEV void pl_cp_async_wait() {}
#endif
// ---- Tensor cores: mma.sync (sm_80 and later) ------------------------------------------------------
// A 2-D dot of bf16 or f16 tiles (f32 accumulation) runs on mma.sync.m16n8k16: the group's warps
// take 16x8 blocks of the result in turn and load their fragments from shared memory with
// ldmatrix. Host emulation runs the same loop with ldmatrix and mma emulated from their PTX
// definitions (each lane is a host thread; a warp's registers meet in memory at the group's
// barriers), so a fragment index that disagrees with the instructions fails on the CPU too.
#if PL_HOST_EMULATION || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define PL_HAS_MMA 1
#else
#define PL_HAS_MMA 0
#endif
#if PL_HAS_MMA
#ifndef PL_ARENA_IN_SHARED
#define PL_ARENA_IN_SHARED 1
#endif
PL_DEV void pl_put(float* p, float v) { *p = v; }
PL_DEV void pl_put(pl_bf16* p, float v) { *p = pl_to_bf16(v); }
PL_DEV void pl_put(pl_f16* p, float v) { *p = pl_to_f16(v); }
#if PL_HOST_EMULATION
// Where the GPU's arena would be: the emulated tiles and scratch all live in it (a global-memory
// operand of wgmma would be misjudged here; it only changes how fragments load, not the result).
PL_DEV bool pl_is_shared(const void*) { return PL_ARENA_IN_SHARED != 0; }
// ldmatrix.sync.aligned.m8n8.x{N}[.trans].shared.b16: lane 8j + r holds the address of row r of
// 8x8 matrix j; lane i receives in register j, low half first, row i/4 columns 2(i%4) and
// 2(i%4)+1 of matrix j (.trans: column i/4, rows 2(i%4) and 2(i%4)+1).
template <int N, bool Trans> PL_DEV void pl_ldmatrix(pl_u32* regs, const void* row) {
  const int lane = pl_tid() & 31;
  pl_host_lane_words(lane)[0] = (pl_u64)row;
  pl_sync();
  for (int j = 0; j < N; ++j) {
    pl_u32 halves[2];
    for (int h = 0; h < 2; ++h) {
      const int r = Trans ? 2 * (lane % 4) + h : lane / 4, c = Trans ? lane / 4 : 2 * (lane % 4) + h;
      halves[h] = ((const pl_u16*)pl_host_lane_words(8 * j + r)[0])[c];
    }
    regs[j] = halves[0] | (halves[1] << 16);
  }
  pl_sync();
}
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d = A B + c (A 16x16, B 16x8, c and d 16x8
// f32). Lane 4g + t holds A[g][2t], A[g][2t+1] in a0; rows g+8 in a1; columns 8 on in a2, a3;
// B[2t][g], B[2t+1][g] in b0, rows 8 on in b1; C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
// d may be c.
template <class In> PL_DEV void pl_mma_16816(float* d, const pl_u32* a, const pl_u32* b, const float* c, In) {
  const int lane = pl_tid() & 31;
  pl_u64* mine = pl_host_lane_words(lane);
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  if (lane == 0) pl_host_mma_count.fetch_add(1);
  pl_sync();
  auto half = [](pl_u64 word, int h) { In x; x.bits = (pl_u16)(word >> (16 * h)); return pl_widen(x); };
  // Where element (row, k) of A and (k, col) of B live: the lane, the register, the half.
  auto A = [&](int r, int k) { return half(pl_host_lane_words(4 * (r % 8) + (k % 8) / 2)[r / 8 + 2 * (k / 8)], k % 2); };
  auto B = [&](int k, int col) { return half(pl_host_lane_words(4 * col + (k % 8) / 2)[4 + k / 8], k % 2); };
  for (int i = 0; i < 4; ++i) {
    const int r = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += A(r, k) * B(k, col);
    d[i] = acc;
  }
  pl_sync();
}
#else
PL_DEV bool pl_is_shared(const void* p) {
  pl_u32 r;
  asm("{ .reg .pred q; isspacep.shared q, %1; selp.u32 %0, 1, 0, q; }" : "=r"(r) : "l"(p));
  return r != 0;
}
template <int N, bool Trans> PL_DEV void pl_ldmatrix(pl_u32* regs, const void* row);
template <> PL_DEV void pl_ldmatrix<4, false>(pl_u32* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(pl_smem_u32(row)) : "memory");
}
template <> PL_DEV void pl_ldmatrix<2, false>(pl_u32* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(pl_smem_u32(row)) : "memory");
}
template <> PL_DEV void pl_ldmatrix<2, true>(pl_u32* r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(pl_smem_u32(row)) : "memory");
}
#define PL_MMA_16816(In, ptx)                                                                               \
  PL_DEV void pl_mma_16816(float* d, const pl_u32* a, const pl_u32* b, const float* c, In) {                 \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ptx "." ptx ".f32 {%0, %1, %2, %3}, "             \
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"                                         \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),   \
                   "f"(c[2]), "f"(c[3]));                                                                    \
  }
PL_MMA_16816(pl_bf16, "bf16")
PL_MMA_16816(pl_f16, "f16")
#undef PL_MMA_16816
#endif
// The fragments of the 16x16 block of a at (m0, k0) and the 16x8 block of b at (k0, n0) loaded
// element by element from any memory (where ldmatrix cannot read): lane 4g + t's registers as
// the mma's definition above lays them out.
template <bool BNK, class In>
PL_DEV void pl_mma_fragments(pl_u32* fa, pl_u32* fb, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int m0,
                             int n0, int k0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const In* p = a + (m0 + g + 8 * (i & 1)) * lda + k0 + 2 * t + 8 * (i >> 1);
    fa[i] = (pl_u32)p[0].bits | ((pl_u32)p[1].bits << 16);
  }
  for (int j = 0; j < 2; ++j) {
    const int k = k0 + 2 * t + 8 * j, n = n0 + g;
    const In lo = BNK ? b[n * ldb + k] : b[k * ldb + n], hi = BNK ? b[n * ldb + k + 1] : b[(k + 1) * ldb + n];
    fb[j] = (pl_u32)lo.bits | ((pl_u32)hi.bits << 16);
  }
}
// d (M x N, row stride ldd) = a (M x K, row stride lda) . b, or d += it when `accumulate`: b is
// K x N with row stride ldb, or (BNK) N x K. M % 16 == N % 8 == K % 16 == 0 (the emitter checks).
// Fragments come through ldmatrix when a and b are in shared memory with 16-byte aligned rows,
// else straight from memory. False, having done nothing, when the group is not whole warps (host
// emulation may run fewer threads): the caller computes the product on the CUDA cores instead.
template <bool BNK, class In, class Out>
PL_DEV bool pl_mma_dot(Out* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K,
                       bool accumulate) {
  if (pl_nthreads() % 32 != 0 || pl_cta_nthreads() > 1024) return false;  // (emulation's warp slots)
  const bool by_ldmatrix = pl_is_shared(a) && pl_is_shared(b) && ((pl_u64)a & 15) == 0 && ((pl_u64)b & 15) == 0 &&
                           lda % 8 == 0 && ldb % 8 == 0;
  const int lane = pl_tid() & 31, warp = pl_tid() >> 5, warps = pl_nthreads() >> 5;
  const int blocks_n = N / 8, blocks = (M / 16) * blocks_n;
  for (int first = 0; first < blocks; first += warps) {
    // Every warp takes part in every round (host emulation meets at the group's barriers): one
    // past the last block redoes that block, from zero (d is the owner's to read and write: a
    // read of it would race with the owner's store), and stores nothing.
    const bool mine = first + warp < blocks;
    const int blk = mine ? first + warp : blocks - 1;
    const int m0 = blk / blocks_n * 16, n0 = blk % blocks_n * 8, g = lane >> 2, t = lane & 3;
    float c[4] = {0, 0, 0, 0};
    if (accumulate && mine)
      for (int i = 0; i < 4; ++i) c[i] = (float)pl_ld(d[(m0 + g + 8 * (i / 2)) * ldd + n0 + 2 * t + i % 2]);
    for (int k0 = 0; k0 < K; k0 += 16) {
      pl_u32 fa[4], fb[2];
      if (!by_ldmatrix) {
        pl_mma_fragments<BNK>(fa, fb, a, lda, b, ldb, m0, n0, k0, lane);
      } else {
        // Lane 8j + r gives row r of 8x8 matrix j: a's four quadrants, b's two k-halves.
        pl_ldmatrix<4, false>(fa, a + (m0 + (lane & 7) + (lane & 8)) * lda + k0 + (lane >> 4) * 8);
        if (BNK) pl_ldmatrix<2, false>(fb, b + (n0 + (lane & 7)) * ldb + k0 + (lane & 8));
        else pl_ldmatrix<2, true>(fb, b + (k0 + (lane & 7) + (lane & 8)) * ldb + n0);
      }
      pl_mma_16816(c, fa, fb, c, In());
    }
    if (mine)
      for (int i = 0; i < 4; ++i) pl_put(&d[(m0 + g + 8 * (i / 2)) * ldd + n0 + 2 * t + i % 2], c[i]);
  }
  // The emitter assumes a tile's element e was written by thread e % pl_nthreads(); these were
  // not, so every thread waits until all of d is written.
  pl_sync();
  return true;
}
#else
template <bool BNK, class In, class Out>
PL_DEV bool pl_mma_dot(Out*, pl_i64, const In*, pl_i64, const In*, pl_i64, int, int, int, bool) {
  return false;  // before sm_80: no bf16 mma.sync
}
#endif
// ---- Tensor cores: wgmma (sm_90a) -----------------------------------------------------------------
// On Hopper a warpgroup (4 warps, 128 threads) multiplies 64xN by Nx16 in one asynchronous
// wgmma.mma_async, reading both operands from shared memory through 64-bit matrix descriptors.
// The operands must be in one of the instruction's canonical layouts, which a plain row-major tile
// is not, so each warpgroup first copies the slices it needs into a staging area of its own in
// the no-swizzle "interleaved" K-major layout: 8x8 "core matrices" (8 rows of 16 bytes, 128
// contiguous bytes), K-adjacent core matrices 128 bytes apart (the leading byte offset) and each
// next 8 rows PL_WG_KC * 16 bytes on (the stride byte offset). The staging is shared memory the
// codegen reserves when the kernel has tensor-core dots and room for it (codegen.h's
// kWgmmaStepK and wgmma_stage_bytes(), defined as PL_WG_KC and PL_WG_STAGE_BYTES: a 64-row slice
// of a and a slice of up to 128 rows of b, PL_WG_KC columns each, for each of PL_WGMMA_STAGES
// warpgroups). Host emulation executes the same loop and emulates wgmma from the descriptor
// (start address, both byte offsets, no swizzle), each thread computing its own accumulator
// fragment; the descriptors' addresses there are offsets into the emulated staging.
#if defined(PL_WGMMA_STAGES) && \
    (PL_HOST_EMULATION || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)))
#define PL_HAS_WGMMA 1
#else
#define PL_HAS_WGMMA 0
#endif
#ifndef PL_WGMMA_ASYNC
#define PL_WGMMA_ASYNC 1  // CodegenOptions::async_wgmma
#endif
// How many groups of wgmma a product leaves running (pl_wgmma_block's PENDING): the ring's
// leaves its own (the next step's product waits for it), a gpu::kernel's all of them (the
// kernel's wgmma_wait waits, as on Mosaic GPU); -1: no wait at all.
#define PL_RING_WGMMA_PENDING (PL_WGMMA_ASYNC ? 1 : 0)
#define PL_KERNEL_WGMMA_PENDING (PL_WGMMA_ASYNC ? -1 : 0)
// Where a warpgroup thread's wgmma accumulator register i of the 64 x N block at (m0, n0) goes
// in a row-major d: at pl_wgmma_acc_base (register 0: row 16 warp + lane / 4, column 2 (lane % 4))
// plus pl_wgmma_acc_off(i) (8 more rows for odd i / 2, 8 (i / 4) + i % 2 more columns). The
// thread's part is computed once per block: written per register in the unrolled loops it cost
// NVVM about 40 ms a loop (PERFORMANCE.md, stop 24).
PL_DEV pl_i64 pl_wgmma_acc_base(int m0, int n0, pl_i64 ldd) {
  const int lane = pl_tid() & 31, warp = (pl_tid() & 127) >> 5;
  return (pl_i64)(m0 + 16 * warp + (lane >> 2)) * ldd + n0 + 2 * (lane & 3);
}
PL_DEV constexpr pl_i64 pl_wgmma_acc_off(int i, pl_i64 ldd) { return 8 * ((i >> 1) & 1) * ldd + 8 * (i >> 2) + (i & 1); }
// Waits for all of this warpgroup's wgmma, where nothing reads their registers after (no register
// fence, which inlined at every exit of a kernel's body cost NVRTC ~50 ms for ws_matmul).
PL_DEV void pl_wgmma_retire_all() {
#if PL_HAS_WGMMA && !PL_HOST_EMULATION
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#elif PL_HAS_WGMMA
  pl_host_wgmma_retire(0);
#endif
}
// The accumulator of `acc[...] += dot(a, b)` (f32 scratch, M x N) kept in registers across the
// steps of the sequential axes (codegen.cpp: the register accumulator): each warpgroup thread
// holds its wgmma registers of the blocks it takes, ROUNDS rounds of NC / 2. `dirty`: the
// registers hold a newer value than the scratch. Every other access to the scratch first
// flushes (pl_acc_flush), and so does the end of the CTA's point; a product after an access
// reloads the registers from the scratch.
// A gpu::kernel's ACC kept in registers (codegen.cpp, register_accumulators) is one of these per
// Pallas thread, holding the thread's M x N matrix of the ACC in one warpgroup's registers.
// Leaving the scope waits for the wgmma still writing the registers (host emulation's would
// write a stack frame that is gone).
template <int NC, int ROUNDS> struct PlAccRegs {
  float r[ROUNDS * NC / 2];
  int dirty;
  PL_MEMBER ~PlAccRegs() { pl_wgmma_retire_all(); }
};
// Waits until at most N groups of this warpgroup's wgmma are running (wgmma_wait), and then
// for f's registers: the compiler must not read them before the wait.
template <int N, int NC, int ROUNDS> PL_DEV void pl_acc_wait(PlAccRegs<NC, ROUNDS>& f) {
#if PL_HAS_WGMMA && !PL_HOST_EMULATION
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
  for (int i = 0; i < ROUNDS * NC / 2; ++i) asm volatile("" : "+f"(f.r[i])::"memory");
#elif PL_HAS_WGMMA
  (void)f;
  pl_host_wgmma_retire(N);
#else
  (void)f;
#endif
}
// Waits for all the wgmma still accumulating into f (pl_wgmma_block's groups left running).
template <int NC, int ROUNDS> PL_DEV void pl_acc_drain(PlAccRegs<NC, ROUNDS>& f) { pl_acc_wait<0>(f); }
// Writes f's registers to d (M x N, row stride ldd) where they are newer than the scratch; false,
// having written nothing, where the scratch is current. The registers stay the newer copy.
// PAIRS (where the accumulator goes to other memory, `dst[...] = acc[...]`: an epilogue storing it
// to global memory): registers 2 p and 2 p + 1 are neighbours in a row (columns 2 (lane % 4) +
// 8 (p / 2) + 0, 1), so where d's rows start on 8 bytes each pair is one 8-byte store, half the
// instructions. (Only there: the pair loop in every pl_acc_store cost NVRTC ~20 ms a unit.)
#if !PL_HOST_EMULATION
struct __align__(8) PlF32Pair {
  float lo, hi;
};
#endif
template <bool PAIRS = false, int NC, int ROUNDS>
PL_DEV bool pl_acc_store(PlAccRegs<NC, ROUNDS>& f, float* d, pl_i64 ldd, int M, int N) {
  pl_acc_drain(f);
  if (!f.dirty) return false;
  const int wg = pl_tid() >> 7, wgs = pl_nthreads() >> 7, blocks_n = N / NC, blocks = (M / 64) * blocks_n;
  const bool pairs = PAIRS && ((pl_u64)d & 7) == 0 && (ldd & 1) == 0;  // (the same for the group)
#pragma unroll
  for (int q = 0; q < ROUNDS; ++q) {
    const int blk = q * wgs + wg;
    if (blk >= blocks) continue;
    float* dq = d + pl_wgmma_acc_base(blk / blocks_n * 64, blk % blocks_n * NC, ldd);
    const float* r = f.r + q * NC / 2;
    if constexpr (PAIRS) {
      if (pairs) {
#pragma unroll
        for (int i = 0; i < NC / 2; i += 2) {
          float* p = dq + pl_wgmma_acc_off(i, ldd);
#if PL_HOST_EMULATION
          p[0] = r[i], p[1] = r[i + 1];
#else
          *(PlF32Pair*)p = PlF32Pair{r[i], r[i + 1]};
#endif
        }
        continue;
      }
    }
#pragma unroll
    for (int i = 0; i < NC / 2; ++i) dq[pl_wgmma_acc_off(i, ldd)] = r[i];
  }
  return true;
}
// Two neighbouring elements (a register tile's registers 2 j and 2 j + 1: columns c and c + 1)
// stored as one access where p is aligned for it: half the store instructions of an epilogue
// writing its registers to global memory, each warp's accesses in half as many pieces.
template <class T> struct alignas(2 * sizeof(T)) PlPair {
  T lo, hi;
};
template <class T> PL_DEV void pl_store_pair(T* p, T lo, T hi) {
#if !PL_HOST_EMULATION
  if (((pl_u64)p & (2 * sizeof(T) - 1)) == 0) {
    *(PlPair<T>*)p = PlPair<T>{lo, hi};
    return;
  }
#endif
  p[0] = lo, p[1] = hi;
}
// Copies f's registers into r, a register tile of their layout (the emitter's FragmentLayout),
// where they hold the ACC's value (newer than its memory); false, having copied nothing, where
// its memory does.
template <int NC, int ROUNDS> PL_DEV bool pl_acc_to_fragment(PlAccRegs<NC, ROUNDS>& f, float* r) {
  pl_acc_drain(f);
  if (!f.dirty) return false;
  for (int i = 0; i < ROUNDS * NC / 2; ++i) r[i] = f.r[i];
  return true;
}
template <int NC, int ROUNDS> PL_DEV void pl_acc_flush(PlAccRegs<NC, ROUNDS>& f, float* d, pl_i64 ldd, int M, int N) {
  if (!pl_acc_store(f, d, ldd, M, N)) return;
#if PL_HOST_EMULATION
  if (pl_tid() == 0) pl_host_acc_flush_count.fetch_add(1, std::memory_order_relaxed);
#endif
  f.dirty = 0;
  pl_sync();  // the scratch is whole before anyone reads it
}
#if PL_HAS_WGMMA
#define PL_WGMMA_STAGING_BYTES (PL_WGMMA_STAGES * PL_WG_STAGE_BYTES)
#if PL_HOST_EMULATION
#define pl_wgmma_staging (pl_host_shared_base + PL_HOST_ARENA_SPAN + PL_HOST_SLOT_SPAN)
PL_DEV pl_u32 pl_wgmma_smem_addr(const void* p) { return (pl_u32)((const pl_u8*)p - pl_host_shared_base); }
PL_DEV void pl_wgmma_fence() {}
// Commits the issued wgmma as a group (and waits until at most PENDING groups are running).
PL_DEV void pl_wgmma_commit() { pl_host_wgmmas[(size_t)pl_host_tid()].commit(); }
template <int PENDING = 0> PL_DEV void pl_wgmma_commit_and_wait() {
  pl_wgmma_commit();
  pl_host_wgmma_retire(PENDING);
}
PL_DEV void pl_fence_proxy_async() {}
// Element (r, k) of a no-swizzle operand described by `desc` (r: its row of a, or column of b):
// K-major, or with `mn_major` (the transpose flag) MN-major — the layouts of pl_slot_elem.
// A W-byte swizzled operand (layout type 1, 2, 3: W = 128, 64, 32; pl_swizzle): K-major, rows of
// W bytes with K along them, 8-row groups `sbo` apart (the leading offset unused: 16 K elements
// lie within a row); MN-major, 8 K rows of W / 2 elements along MN, the next 8 rows `sbo` on and
// the next W / 2 elements `lbo` on; then the swizzle of the address, as the hardware applies it:
// its 16-byte chunk bits XOR its bits from 7 up.
template <class In> PL_DEV float pl_wgmma_operand(pl_u64 desc, int r, int k, bool mn_major) {
  const pl_u64 mode = desc >> 62;
  const pl_u64 start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
  pl_u64 at;
  if (mode != 0) {
    const pl_u64 w = 256 >> mode, p = w / 2;  // a row's bytes, elements
    at = start + (mn_major ? (r / p) * lbo + (k / 8) * sbo + (k % 8) * w + (r % p) * 2
                           : (r / 8) * sbo + (r % 8) * w + k * 2);
    at ^= (at >> 3) & ((w / 16 - 1) << 4);
  } else {
    const pl_u64 in_core = mn_major ? (k % 8) * 16 + (r % 8) * 2 : (r % 8) * 16 + (k % 8) * 2;
    at = start + (r / 8) * sbo + (k / 8) * lbo + in_core;
  }
  const pl_u8* p = pl_host_shared_base + at;
  In x;
  x.bits = *(const pl_u16*)p;
  return pl_widen(x);
}
// wgmma.mma_async.sync.aligned.m64n{NC}k16.f32.{bf16,f16} d, a-desc, b-desc (scale-d 1, no
// negation, a K-major, b K-major or with TB MN-major), stated as where each element of the
// 64 x NC result lives (the ISA's figure for the m64nNk16 accumulator): element (r, c) is in thread
// 32 (r / 16) + 4 (r % 8) + (c % 8) / 2 of the warpgroup, register 4 (c / 8) + 2 ((r % 16) / 8) + c % 2.
// (pl_wgmma_dot_n loads and stores the registers by the inverse map, written independently.)
// Each thread visits only its own elements — solving the map for it: rows 16 (me / 32) + (me % 32) / 4
// and 8 below, columns 2 (me % 4) and the next in every 8 — and reads its two rows of a once.
template <int NC, class In, int TB> PL_DEV void pl_host_wgmma_rows(float* d, const float (*a)[16], pl_u64 db) {
  const int me = pl_tid() & 127;
  const int rows[2] = {16 * (me / 32) + (me % 32) / 4, 16 * (me / 32) + (me % 32) / 4 + 8};
  float b[16];
  for (int c = 2 * (me % 4); c < NC; c += (c % 2 == 0 ? 1 : 7)) {
    for (int k = 0; k < 16; ++k) b[k] = pl_wgmma_operand<In>(db, c, k, TB != 0);
    for (int h = 0; h < 2; ++h) {
      const int r = rows[h];
      if (32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2 != me) __builtin_trap();  // (the map above, solved)
      float acc = 0;
      for (int k = 0; k < 16; ++k) acc += a[h][k] * b[k];
      d[4 * (c / 8) + 2 * ((r % 16) / 8) + c % 2] += acc;
    }
  }
}
template <int NC, class In, int TB> PL_DEV void pl_host_wgmma_run(float* d, pl_u64 da, pl_u64 db) {
  const int me = pl_tid() & 127;
  float a[2][16];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k) a[h][k] = pl_wgmma_operand<In>(da, 16 * (me / 32) + (me % 32) / 4 + 8 * h, k, false);
  pl_host_wgmma_rows<NC, In, TB>(d, a, db);
}
template <int NC, class In, int TB = 0> PL_DEV void pl_wgmma_async(float* d, pl_u64 da, pl_u64 db) {
  if ((pl_tid() & 127) == 0) pl_host_wgmma_count.fetch_add(1);
  PlHostWgmmaOp op{};
  op.run = &pl_host_wgmma_run<NC, In, TB>, op.d = d, op.da = da, op.db = db;
  pl_host_wgmmas[(size_t)pl_host_tid()].push(op);
}
// With a in registers: each thread's 4 registers (8 elements) of the 64 x 16 slice go to the
// warpgroup's rows in host memory, and each takes its two whole rows from there into the op.
#ifdef PL_WGMMA_RS
static float pl_host_rs_rows[PL_HOST_CTAS][16][64][16];
#endif
template <int NC, class In, int TB = 0> PL_DEV void pl_wgmma_async_rs(float* d, const pl_u32* a, pl_u64 db) {
#ifndef PL_WGMMA_RS
  (void)d, (void)a, (void)db;
  __builtin_trap();  // (only units with such products call it)
#else
  const int me = pl_tid() & 127, row = 16 * (me / 32) + (me % 32) / 4;
  float (*rows)[16] = pl_host_rs_rows[pl_host_cta()][pl_cta_tid() >> 7];
  pl_sync();  // (every thread took its rows of the warpgroup's previous one)
  for (int w = 0; w < 4; ++w) {
    In lo, hi;
    lo.bits = (pl_u16)(a[w] & 0xFFFFu), hi.bits = (pl_u16)(a[w] >> 16);
    const int r = row + 8 * (w & 1), c = 2 * (me % 4) + 8 * (w >> 1);
    rows[r][c] = pl_widen(lo), rows[r][c + 1] = pl_widen(hi);
  }
  pl_sync();
  if (me == 0) pl_host_wgmma_count.fetch_add(1);
  PlHostWgmmaOp op{};
  op.run_rows = &pl_host_wgmma_rows<NC, In, TB>, op.d = d, op.db = db;
  for (int k = 0; k < 16; ++k) op.a[0][k] = rows[row][k], op.a[1][k] = rows[row + 8][k];
  pl_host_wgmmas[(size_t)pl_host_tid()].push(op);
#endif
}
#else
// After the arena and the ring in the dynamic shared memory (launches on other GPUs leave it out).
extern __shared__ __align__(PL_SMEM_ALIGN) char pl_smem[];
#define pl_wgmma_staging ((pl_u8*)pl_smem + PL_WGMMA_STAGING_OFFSET)
PL_DEV pl_u32 pl_wgmma_smem_addr(const void* p) { return pl_smem_u32(p); }
PL_DEV void pl_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Commits the issued wgmma as a group (and waits until at most PENDING groups are running).
PL_DEV void pl_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int PENDING = 0> PL_DEV void pl_wgmma_commit_and_wait() {
  pl_wgmma_commit();
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory");
}
// Makes this thread's ordinary stores to shared memory (and its completed cp.async copies)
// visible to wgmma's (async proxy) reads.
PL_DEV void pl_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
template <int NC, class In> struct PlWgmma;
template <int NC, class In> struct PlWgmmaRs;
// @@WGMMA_INSTRUCTIONS@@
template <int NC, class In, int TB = 0> PL_DEV void pl_wgmma_async(float* d, pl_u64 da, pl_u64 db) {
  PlWgmma<NC, In>::template run<TB>(d, da, db);
}
template <int NC, class In, int TB = 0> PL_DEV void pl_wgmma_async_rs(float* d, const pl_u32* a, pl_u64 db) {
  PlWgmmaRs<NC, In>::template run<TB>(d, a, db);
}
#endif
// The descriptor of an operand at p (16-byte aligned, in shared memory). No swizzle: core
// matrices adjacent along K `lbo` bytes apart (the leading byte offset), the next 8 rows (or,
// MN-major, the next 8 columns) `sbo` bytes on (the stride byte offset). `swizzle` 128, 64 or 32
// (layout type 1, 2 or 3 in bits 62-63): pl_wgmma_operand's swizzled layouts, whose pattern the
// hardware takes from the address bits (the base offset field stays 0).
PL_DEV pl_u64 pl_wgmma_desc(const void* p, pl_u64 lbo, pl_u64 sbo, int swizzle = 0) {
  const pl_u64 type = swizzle == 128 ? 1 : swizzle == 64 ? 2 : swizzle == 32 ? 3 : 0;
  // (Each field 14 bits of 16-byte units; a stride of 256 KiB, past any SM's shared memory,
  // cannot spill into the next field.)
  return (pl_u64)((pl_wgmma_smem_addr(p) & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) |
         (type << 62);
}
// Copies rows [r0, r0 + rows) x columns [k0, k0 + kc) of a K-contiguous matrix (row stride ld)
// — or, with `transposed`, of the transpose of a row-major (K x rows) matrix — into the staging
// layout (K-major, PL_WG_KC columns), a warpgroup's thread t taking 16-byte chunks t, t + 128,
// ...: consecutive threads write consecutive chunks (no bank conflicts).
template <class In>
PL_DEV void pl_wgmma_stage(pl_u8* dst, const In* src, pl_i64 ld, bool transposed, int r0, int rows, int k0, int kc,
                           int t) {
  const bool vec = !transposed && ((pl_u64)src & 15) == 0 && ld % 8 == 0;
  const int chunks = rows * (PL_WG_KC / 8);
  for (int c = t; c < chunks; c += 128) {
    // c = (r % 8) + 8 * (kq + (PL_WG_KC / 8) * (r / 8)): the byte offset in the layout is 16 c.
    const int kq = (c >> 3) % (PL_WG_KC / 8), r = (c & 7) + 8 * ((c >> 3) / (PL_WG_KC / 8));
    if (8 * kq >= kc) continue;
    pl_u32* out = (pl_u32*)(dst + 16 * c);
    const pl_i64 k = k0 + 8 * kq;
    if (vec) {
      const pl_u32* in = (const pl_u32*)(src + (r0 + r) * ld + k);
      for (int w = 0; w < 4; ++w) out[w] = in[w];
    } else {
      for (int w = 0; w < 4; ++w) {
        const In lo = transposed ? src[(k + 2 * w) * ld + r0 + r] : src[(r0 + r) * ld + k + 2 * w];
        const In hi = transposed ? src[(k + 2 * w + 1) * ld + r0 + r] : src[(r0 + r) * ld + k + 2 * w + 1];
        out[w] = (pl_u32)lo.bits | ((pl_u32)hi.bits << 16);
      }
    }
  }
}
// d (M x N) = a . b (or d += it), as pl_mma_dot, on wgmma with NC columns per instruction. The
// group's warpgroups take 64 x NC blocks of d in rounds; one past the last block redoes it and
// stores nothing (every warpgroup meets at the group's barriers). LA / LB: the operands' layouts
// (pl_slot_elem). A row-major operand is copied into the warpgroup's staging PL_WG_KC columns at
// a time, the wgmma waited for before the next copy; an operand in a canonical layout (a ring
// slot) is read where it is, and with both so, a block's whole K is one group of wgmma.
// The warpgroup's 64 x NC block at (m0, n0) of a . b added to its accumulator registers acc.
// PENDING (operands both in place, else 0): the groups left running after the block's — 1 in the
// ring, which keeps these slots one step longer (GeneratedKernel::pipeline_slots), so they are
// refilled only after the next step's wait has retired the group; -1 (a gpu::kernel, whose
// wgmma_wait waits): all. Whatever reads the registers first drains them (pl_acc_flush).
// NCA > 0: a is a register tile of the warpgroup (the emitter's FragmentLayout, blocks NCA columns
// wide) and lda its first register of the block's rows: each 16 columns are four of its 32-bit
// pairs, in the accumulator's layout that wgmma takes a in registers in (wgmma_instructions).
template <int NC, bool BNK, int LA, int LB, int PENDING = 0, int NCA = 0, class In>
PL_DEV void pl_wgmma_block(float* acc, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int m0, int n0, int M, int N,
                           int K) {
  constexpr bool staged = (LA == 0 && NCA == 0) || LB == 0;
  static_assert(NC <= 128 || !staged, "the staging holds 128 columns of b: wider products read both operands in place");
  const int t = pl_tid() & 127, step = staged ? PL_WG_KC : K;
  pl_u8* stage_a = pl_wgmma_staging + (pl_cta_tid() >> 7) * PL_WG_STAGE_BYTES;
  pl_u8* stage_b = stage_a + 64 * PL_WG_KC * 2;
  // (An operand in place was written by TMA, or by threads that fenced their writes for the
  // async proxy before the barrier this group has passed since: the ring's step, a copy's
  // arrival. So its wgmma needs no fence here, and the group no sync.)
  for (int k0 = 0; k0 < K; k0 += step) {
    const int kc = K - k0 < step ? K - k0 : step;
    if (staged) {
      pl_sync();  // the previous step's wgmma have read the staging
      if (LA == 0 && NCA == 0) pl_wgmma_stage(stage_a, a, lda, false, m0, 64, k0, kc, t);
      if (LB == 0) pl_wgmma_stage(stage_b, b, ldb, !BNK, n0, NC, k0, kc, t);
      pl_fence_proxy_async();
      pl_sync();
    }
    // a's registers as wgmma takes them (NCA > 0; at most 256 columns), packed before the fence:
    // packed between the wgmma, ptxas would make each wait for the one before (its C7519 note).
    [[maybe_unused]] pl_u32 aw[NCA > 0 ? 64 : 1];
    if constexpr (NCA > 0) {
#pragma unroll
      for (int ks = 0; ks < kc; ks += 16) {
        const pl_i64 r = lda + (k0 + ks) / NCA * (NCA / 2) + (k0 + ks) % NCA / 8 * 4;
        for (int j = 0; j < 4; ++j) aw[ks / 16 * 4 + j] = (pl_u32)a[r + 2 * j].bits | (pl_u32)a[r + 2 * j + 1].bits << 16;
      }
    }
    pl_wgmma_fence();
    // Unrolled (K is a constant here), ptxas sees the registers untouched between the wgmma and
    // issues them back to back; rolled, it injects a warpgroup.arrive before each (its C7519
    // note). Unrolled costs the bf16 matmul 40% more cold compile, rolled 20% (PERFORMANCE.md).
    for (int ks = 0; ks < kc; ks += 16) {  // the next 16 columns: two core matrices on
      // An operand in a slot (pl_slot_elem). No swizzle (element (r, c) at (c / 8) * 8 rows + 8 r
      // + c % 8): layout 1 (a's m x K, b's n x K) from row r0 at column k is at element k rows + 8
      // r0, K-adjacent core matrices 16 rows bytes apart, row groups 128; layout 2 (b's K x n,
      // MN-major) from column n0 at row k is at n0 K + 8 k, K-adjacent core matrices 128 bytes
      // apart, groups of 8 columns 16 K. Swizzled (panels of P = W / 2 columns, rows of W = 128,
      // 64 or 32 bytes): K-major (3, 5, 7) from row r0 at column k is in panel k / P at row r0,
      // k % P elements along it, 8-row groups 8 W bytes apart; MN-major (4, 6, 8) from column n0
      // at row k is in panel n0 / P at row k, n0 % P along it (n0 % P + NC <= P when NC < P),
      // 8-row groups 8 W bytes apart and panels W K. The staging is K-major with PL_WG_KC
      // columns, a row group per 16 KC.
      const pl_i64 k = k0 + ks;
      constexpr int WA = pl_layout_swizzle(LA), WB = pl_layout_swizzle(LB);
      constexpr int PA = WA ? WA / 2 : 1, PB = WB ? WB / 2 : 1;
      constexpr bool b_mn_major = LB != 0 && LB % 2 == 0;  // (wgmma's transpose-b flag)
      const pl_u64 db = WB && b_mn_major ? pl_wgmma_desc(b + n0 / PB * PB * K + PB * k + n0 % PB, (pl_u64)WB * K, 8 * WB, WB)
                        : WB             ? pl_wgmma_desc(b + k / PB * PB * N + PB * n0 + k % PB, 16, 8 * WB, WB)
                        : LB == 2        ? pl_wgmma_desc(b + (pl_i64)n0 * K + 8 * k, 128, 16 * (pl_u64)K)
                        : LB == 1        ? pl_wgmma_desc(b + k * N + 8 * n0, 16 * (pl_u64)N, 128)
                                         : pl_wgmma_desc(stage_b + ks * 16, 128, 16 * PL_WG_KC);
      if constexpr (NCA > 0) {
        pl_wgmma_async_rs<NC, In, b_mn_major>(acc, aw + ks / 16 * 4, db);
      } else {
        const pl_u64 da = WA   ? pl_wgmma_desc(a + k / PA * PA * M + PA * m0 + k % PA, 16, 8 * WA, WA)
                          : LA ? pl_wgmma_desc(a + k * M + 8 * m0, 16 * (pl_u64)M, 128)
                               : pl_wgmma_desc(stage_a + ks * 16, 128, 16 * PL_WG_KC);
        pl_wgmma_async<NC, In, b_mn_major>(acc, da, db);
      }
    }
    if constexpr (PENDING < 0 && !staged) {
      pl_wgmma_commit();
    } else if constexpr (PENDING > 0 && !staged) {
      pl_wgmma_commit_and_wait<PENDING>();  // (the ring: the previous step's group is done)
    } else {
      pl_wgmma_commit_and_wait();
#if !PL_HOST_EMULATION
      for (int i = 0; i < NC / 2; ++i) asm volatile("" : "+f"(acc[i])::"memory");  // read after the wait
#endif
    }
  }
}
template <int NC, bool BNK, int LA, int LB, class In, class Out>
PL_DEV void pl_wgmma_dot_n(Out* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K,
                           bool accumulate) {
  const int wg = pl_tid() >> 7, wgs = pl_nthreads() >> 7;
  const int blocks_n = N / NC, blocks = (M / 64) * blocks_n;
  for (int first = 0; first < blocks; first += wgs) {
    const bool mine = first + wg < blocks;
    const int blk = mine ? first + wg : blocks - 1;
    const int m0 = blk / blocks_n * 64, n0 = blk % blocks_n * NC;
    Out* dq = d + pl_wgmma_acc_base(m0, n0, ldd);
    float acc[NC / 2];
    // (A warpgroup past the last block redoes it from zero: see pl_mma_dot.)
    for (int i = 0; i < NC / 2; ++i) acc[i] = accumulate && mine ? (float)pl_ld(dq[pl_wgmma_acc_off(i, ldd)]) : 0.0f;
    pl_wgmma_block<NC, BNK, LA, LB>(acc, a, lda, b, ldb, m0, n0, M, N, K);
    if (mine)
      for (int i = 0; i < NC / 2; ++i) pl_put(&dq[pl_wgmma_acc_off(i, ldd)], acc[i]);
  }
  pl_sync();
}
// Whether an M-row product fits wgmma (M % 64 == 0) and the group is whole warpgroups with
// staging for each (host emulation may run fewer threads).
PL_DEV bool pl_wgmma_fits(int M) {
  return M % 64 == 0 && pl_nthreads() % 128 == 0 && (pl_cta_nthreads() >> 7) * PL_WG_STAGE_BYTES <= PL_WGMMA_STAGING_BYTES;
}
// False, having done nothing, unless it fits. NC: the instruction's width, the emitter's choice
// (the widest of 128, 64, 32, 16, 8 dividing N).
template <bool BNK, int NC, int LA, int LB, class In, class Out>
PL_DEV bool pl_wgmma_dot(Out* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K,
                         bool accumulate) {
  if (!pl_wgmma_fits(M)) return false;
  pl_wgmma_dot_n<NC, BNK, LA, LB>(d, ldd, a, lda, b, ldb, M, N, K, accumulate);
  return true;
}
// d += a . b into the register accumulator f (d: its scratch), loading it first when the scratch
// is newer. The rounds are constants, so the registers stay registers across the calls.
// NCA > 0: a is a register tile (pl_wgmma_block) and the group one warpgroup, so block q is round q.
template <int NC, bool BNK, int LA, int LB, int PENDING, int NCA, int ROUNDS, class In>
PL_DEV void pl_wgmma_dot_regs(PlAccRegs<NC, ROUNDS>& f, float* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b,
                              pl_i64 ldb, int M, int N, int K) {
  const int wg = pl_tid() >> 7, wgs = pl_nthreads() >> 7, blocks_n = N / NC, blocks = (M / 64) * blocks_n;
#pragma unroll
  for (int q = 0; q < ROUNDS; ++q) {
    if (q * wgs >= blocks) break;  // (the same for every thread)
    const bool mine = q * wgs + wg < blocks;
    const int blk = mine ? q * wgs + wg : blocks - 1;
    const int m0 = blk / blocks_n * 64, n0 = blk % blocks_n * NC;
    float* acc = f.r + q * NC / 2;
    if (!f.dirty) {  // (d is null where the registers start newer: pl_tc_dot_fragment)
      const float* dq = d + pl_wgmma_acc_base(m0, n0, ldd);
#pragma unroll
      for (int i = 0; i < NC / 2; ++i) acc[i] = mine ? dq[pl_wgmma_acc_off(i, ldd)] : 0.0f;
    }
    const pl_i64 a_first = NCA > 0 ? (pl_i64)(q / blocks_n) * (K / NCA) * (NCA / 2) : lda;  // (the band's registers)
    pl_wgmma_block<NC, BNK, LA, LB, PENDING, NCA>(acc, a, a_first, b, ldb, m0, n0, M, N, K);
  }
  f.dirty = 1;
}
#else
PL_DEV void pl_fence_proxy_async() {}  // (nothing reads shared memory through the async proxy)
#endif
// gpu::set_max_registers: this warpgroup's registers per thread become N (setmaxnreg, sm_90a;
// every thread of the warpgroup executes it). The kernel is launched with __launch_bounds__(T, 1)
// so that ptxas knows the count at the entry; the code generator checks that the requests fit.
template <int N, bool INCREASE> PL_DEV void pl_setmaxnreg() {
#if !PL_HOST_EMULATION && defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (INCREASE)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
  else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
// The same product on CUDA cores with operands in any layout of pl_slot_elem (0: row-major with
// row stride lda / ldb): what runs when an operand is in a canonical layout and wgmma cannot
// (host emulation with threads that are not whole warpgroups). Each product is summed in f32
// and then added to d's element, as the caller's loop does.
template <bool BNK, int LA, int LB, class In, class Out>
PL_DEV void pl_slot_dot(Out* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K,
                        bool accumulate) {
  for (pl_i64 e = pl_tid(); e < (pl_i64)M * N; e += pl_nthreads()) {
    const pl_i64 m = e / N, n = e % N;
    float acc = 0;
    for (pl_i64 k = 0; k < K; ++k) {
      const In x = a[LA ? pl_slot_elem<LA>(m, k, M, K / 8) : m * lda + k];
      const In y = BNK ? b[LB ? pl_slot_elem<LB>(n, k, N, K / 8) : n * ldb + k]
                       : b[LB ? pl_slot_elem<LB>(k, n, K, N / 8) : k * ldb + n];
      acc += pl_widen(x) * pl_widen(y);
    }
    pl_put(&d[m * ldd + n], accumulate ? (float)pl_ld(d[m * ldd + n]) + acc : acc);
  }
  pl_sync();
}
// A 2-D bf16 / f16 product on the best tensor-core instruction the target has: wgmma, else
// mma.sync; false when neither applies (the caller's CUDA-core loop runs). LA / LB != 0 (only
// where wgmma is there): an operand in a ring slot's canonical layout, which the caller's loop
// cannot read — then the product is always computed here.
template <bool BNK, int NC, int LA = 0, int LB = 0, class In, class Out>
PL_DEV bool pl_tc_dot(Out* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K,
                      bool accumulate) {
#if PL_HAS_WGMMA
  if (pl_wgmma_dot<BNK, NC, LA, LB>(d, ldd, a, lda, b, ldb, M, N, K, accumulate)) return true;
#endif
  if constexpr (LA != 0 || LB != 0) {
    pl_slot_dot<BNK, LA, LB>(d, ldd, a, lda, b, ldb, M, N, K, accumulate);
    return true;
  } else {
    return pl_mma_dot<BNK>(d, ldd, a, lda, b, ldb, M, N, K, accumulate);
  }
}
// Whether the accumulator's products run on its registers: whole warpgroups covering its
// blocks in ROUNDS rounds, with wgmma's staging for each.
template <int NC, int ROUNDS> PL_DEV bool pl_acc_in_registers(int M, int N) {
#if PL_HAS_WGMMA
  return pl_wgmma_fits(M) && (pl_nthreads() >> 7) * ROUNDS >= (M / 64) * (N / NC);
#else
  return (void)M, (void)N, false;
#endif
}
// A gpu::kernel's ACC in registers starts as the uninitialized value (the interpreter's NaN) in
// its registers where the products run on them — its memory is not written then — else in
// memory (pl_init_scratch).
template <int NC, int ROUNDS> PL_DEV void pl_acc_start(PlAccRegs<NC, ROUNDS>& f, int M, int N) {
  f.dirty = pl_acc_in_registers<NC, ROUNDS>(M, N);
  if (f.dirty)
    for (int i = 0; i < ROUNDS * NC / 2; ++i) f.r[i] = pl_f32_of_bits(0x7FC00000u);
}
// Sets every element of the accumulator to `value` in its registers (newer than the scratch)
// where the products run on them; false, having done nothing, where they do not: the caller
// stores to the scratch.
template <int NC, int ROUNDS> PL_DEV bool pl_acc_fill(PlAccRegs<NC, ROUNDS>& f, float value, int M, int N) {
  if (!pl_acc_in_registers<NC, ROUNDS>(M, N)) return false;
  pl_acc_drain(f);
  for (int i = 0; i < ROUNDS * NC / 2; ++i) f.r[i] = value;
  f.dirty = 1;
  return true;
}
// Sets every element of the accumulator to value(e, old, k) — e = row * N + column, old its
// current value, k its register (the emitter's register tiles of this layout read theirs) — in
// its registers (newer than the scratch) where the products run on them and the registers hold
// its value; false, having done nothing, where not: the caller stores to the scratch (then
// current), and the next product reloads the registers.
// (`acc[...] = acc[...] * alpha`, attention's rescaling of its output accumulator, in place.)
template <int NC, int ROUNDS, class F> PL_DEV bool pl_acc_assign(PlAccRegs<NC, ROUNDS>& f, int M, int N, F value) {
  if (!pl_acc_in_registers<NC, ROUNDS>(M, N)) return false;
  pl_acc_drain(f);
  if (!f.dirty) return false;  // the scratch is newer (a part of it was written): it takes the store
  const int wg = pl_tid() >> 7, wgs = pl_nthreads() >> 7, blocks_n = N / NC, blocks = (M / 64) * blocks_n;
#pragma unroll
  for (int q = 0; q < ROUNDS; ++q) {
    const int blk = q * wgs + wg;
    if (blk >= blocks) continue;
    const pl_i64 base = pl_wgmma_acc_base(blk / blocks_n * 64, blk % blocks_n * NC, N);
    float* r = f.r + q * NC / 2;
#pragma unroll
    for (int i = 0; i < NC / 2; ++i) r[i] = value(base + pl_wgmma_acc_off(i, N), r[i], q * NC / 2 + i);
  }
  f.dirty = 1;
  return true;
}
// d += a . b where d is the scratch of register accumulator f: on wgmma into the registers when
// the group's warpgroups cover the blocks in ROUNDS rounds, leaving PENDING groups running
// (pl_wgmma_block), else (flushed first) as pl_tc_dot.
// NCA > 0: a is a register tile of one warpgroup (pl_wgmma_block): wgmma takes it from the
// registers where the accumulator is in them; false, having done nothing, where not (the caller
// writes the tile to memory for the other paths).
template <bool BNK, int NC, int LA, int LB, int ROUNDS, int PENDING = PL_RING_WGMMA_PENDING, int NCA = 0, class In>
PL_DEV bool pl_tc_dot_acc(PlAccRegs<NC, ROUNDS>& f, float* d, pl_i64 ldd, const In* a, pl_i64 lda, const In* b,
                          pl_i64 ldb, int M, int N, int K) {
#if PL_HAS_WGMMA
  if (pl_acc_in_registers<NC, ROUNDS>(M, N) && (NCA == 0 || pl_nthreads() == 128)) {
    pl_wgmma_dot_regs<NC, BNK, LA, LB, PENDING, NCA>(f, d, ldd, a, lda, b, ldb, M, N, K);
    return true;
  }
#endif
  if constexpr (NCA > 0) {
    return false;
  } else {
    pl_acc_flush(f, d, ldd, M, N);
    return pl_tc_dot<BNK, NC, LA, LB>(d, ldd, a, lda, b, ldb, M, N, K, true);
  }
}
// r = a . b, a register tile of the accumulator's layout (the emitter's FragmentLayout of an
// AccumulatorRegisters{NC, ROUNDS}: a pallas_call's `dot` whose result stays in registers), on
// wgmma where the group's warpgroups cover its blocks in ROUNDS rounds; false, having done
// nothing, where not (the caller computes the product in memory and reads it in that layout).
// The wgmma are waited for: r is the product when this returns. NCA > 0: a is a register tile of
// that layout too (blocks NCA columns wide), taken from the registers — where a warpgroup's
// rounds of a and of r are the same rows: one warpgroup, or blocks as wide as a and r.
template <bool BNK, int NC, int LA, int LB, int ROUNDS, int NCA = 0, class In>
PL_DEV bool pl_tc_dot_fragment(float* r, const In* a, pl_i64 lda, const In* b, pl_i64 ldb, int M, int N, int K) {
#if PL_HAS_WGMMA
  if (!pl_acc_in_registers<NC, ROUNDS>(M, N) || (NCA > 0 && pl_nthreads() != 128 && (N != NC || K != NCA))) return false;
  PlAccRegs<NC, ROUNDS> f;
  for (int i = 0; i < ROUNDS * NC / 2; ++i) f.r[i] = 0.0f;
  f.dirty = 1;  // (the registers are the value: the product reads no memory for them)
  pl_wgmma_dot_regs<NC, BNK, LA, LB, 0, NCA>(f, (float*)nullptr, 0, a, lda, b, ldb, M, N, K);
  pl_acc_to_fragment(f, r);
  return true;
#else
  return (void)r, (void)a, (void)lda, (void)b, (void)ldb, (void)M, (void)N, (void)K, false;
#endif
}
// ---- The on-device profiler (gpu::named_region) ---------------------------------------------------
// Each Pallas thread has a slot per parallel point (when profiling): word 0 counts the events its
// thread 0 recorded, then PL_PROF_SPACE events of two words: 2 * region (+1 for the exit) and
// the time in ns (%globaltimer). Events past the space are counted but not written.
#ifndef PL_PROF_SPACE
#define PL_PROF_SPACE 0
#endif
PL_DEV void pl_prof_record(pl_u64* slot, pl_u64 tag) {
  if (pl_tid() != 0) return;
  const pl_u64 n = slot[0];
  if ((pl_i64)n < (pl_i64)PL_PROF_SPACE) {  // (signed: no "pointless comparison" warning at 0)
    slot[1 + 2 * n] = tag;
    slot[2 + 2 * n] = pl_now_ns();
  }
  slot[0] = n + 1;
}
// ---- End of the Pallas device runtime --------------------------------------------------------------
)PALLAS_RT";
}

}  // namespace

const char* device_runtime_source() {
  static const std::string text = [] {
    std::string s = runtime_template();
    const std::string marker = "// @@WGMMA_INSTRUCTIONS@@\n";
    s.replace(s.find(marker), marker.size(), wgmma_instructions());
    return s;
  }();
  return text.c_str();
}

}  // namespace pallas::gpu
