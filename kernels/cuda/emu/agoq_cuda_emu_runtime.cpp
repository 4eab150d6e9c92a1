/*
 * The runtime API of the CPU emulation (emu/include/cuda_runtime_api.h): one device, its
 * memory, streams, events and a queue of work.
 *
 * Memory. A cudaMalloc is a memfd mapped twice: once without access (the pointer the host
 * gets: reading or writing it from host code faults, as it does on a GPU) and once
 * read-write (the device's view, which kernels and copies use). The allocation ends less
 * than 256 bytes before an inaccessible page of the device's view, so a kernel that runs
 * past its buffer faults too. Pinned host memory (cudaMallocHost, cudaHostAlloc) is host
 * memory both sides reach. Nothing else is reachable from a kernel.
 *
 * Work. Copies, memsets, launches, event records and waits go into their stream's queue,
 * in order; streams are independent, except where cudaStreamWaitEvent joins them. The
 * device runs queued work only when the host asks, and only the work that what it asks
 * about depends on: cudaEventQuery and cudaStreamQuery run at most one operation of that
 * event's or stream's queue (or, when that operation waits on an event of another stream,
 * one operation of that stream) before they answer; the synchronising calls run everything
 * up to what they wait for. Code that reads a result before its event says so therefore
 * reads it before it is there, and code that polls the wrong stream never sees it done,
 * every time. Work on the legacy default stream (stream 0) first runs everything queued on
 * blocking streams (not on cudaStreamNonBlocking ones, as on a GPU), then runs at once; the
 * synchronous calls (cudaMemcpy, cudaMemset) likewise; cudaDeviceSynchronize, cudaFree and
 * cudaFreeHost run everything. Both are counted (agoq_emu_counters_get) so that
 * tests can show the plugin never uses them. Everything runs under one device lock, on the
 * thread that asked.
 *
 * Kernels. A launch is refused unless cudaFuncGetAttributes loaded that kernel on the current
 * device before (launch_loaded): lazy loading as it hurts most, every first launch being one
 * made while NCCL's kernel waits for the plugin.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "agoq_cuda_emu.h"
#include "agoq_cuda_probe.h"

namespace agoq_emu {
namespace {
struct Op {
  uint64_t seq;
  void (*run)(void*);
  void* ctx;
  void (*drop)(void*);
  agoq_emu_stream* wait; /* a cudaStreamWaitEvent: runs once wait has run operation wait_seq */
  uint64_t wait_seq;
};
}  // namespace
}  // namespace agoq_emu

struct agoq_emu_stream {
  unsigned flags = 0;
  int priority = 0;
  std::deque<agoq_emu::Op> ops; /* queued, not run */
  uint64_t last_seq = 0;        /* newest operation queued on it */
  uint64_t done_seq = 0;        /* newest operation run */
  unsigned waiters = 0;         /* queued waits (of other streams) that name it */
  bool destroyed = false;       /* freed once its work ran and no wait names it (reap) */
};

struct agoq_emu_event {
  unsigned flags = 0;
  agoq_emu_stream* stream = nullptr; /* of the newest record */
  uint64_t seq = 0;                  /* the newest record operation; 0: never recorded */
  uint64_t done_seq = 0;             /* the newest record the device has run */
  unsigned pending = 0;              /* records queued, not run */
  double t = 0;                      /* when the newest one ran */
};

namespace agoq_emu {
namespace {

constexpr size_t kAlign = 256; /* cudaMalloc's alignment */

struct Alloc {
  size_t size;     /* bytes asked for */
  char* shadow;    /* the device's view of the first byte */
  char* map_host;  /* the inaccessible mapping (device allocations) */
  char* map_dev;   /* the device's mapping, with its trailing guard page */
  size_t map_size; /* both mappings, guard included */
  bool device;
  int fd; /* device allocations: the memfd behind both mappings (the dma-buf it exports) */
};

std::recursive_mutex dev_mu;       /* the device: the queues, the allocations, running work */
std::map<uintptr_t, Alloc> allocs; /* by the address the host sees */
std::vector<agoq_emu_stream*> streams; /* every stream created and not yet freed */
uint64_t next_seq = 1;
thread_local cudaError_t last_error = cudaSuccess;
std::atomic<unsigned long long> n_legacy{0}, n_sync{0}, n_run{0}, n_rdma_flush{0};
int current_device = 0;
constexpr int kDevices = 1; /* the emulated devices: ordinals [0, kDevices) */

/* Lazy loading (cudaFuncGetAttributes, launch_loaded): per device, the kernels loaded there
 * and those launched there; per kernel name, its launches. Under dev_mu. */
struct DeviceKernels {
  std::set<const void*> loaded, launched;
};
DeviceKernels dev_kernels[kDevices];
std::map<std::string, unsigned long long> launches_by_name;
unsigned long long n_launches = 0, n_refused = 0;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

std::atomic<double (*)(void)> g_clock{nullptr};

double now_s() {
  double (*clock)(void) = g_clock.load();
  if (clock != nullptr) return clock();
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t page_size() {
  static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

/* The allocation holding [p, p + len) as the host sees it, or nullptr. */
const Alloc* find(const void* p, size_t len, uintptr_t* base_out) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  const Alloc& al = it->second;
  if (a < it->first || a - it->first > al.size || len > al.size - (a - it->first)) return nullptr;
  if (base_out) *base_out = it->first;
  return &al;
}

bool is_device(const void* p, size_t len) {
  const Alloc* a = find(p, len ? len : 1, nullptr);
  return a != nullptr && a->device;
}

/* [p, p + len) starts in a device allocation but runs past its end: no valid buffer. */
bool runs_past_device(const void* p, size_t len) { return !is_device(p, len) && is_device(p, 1); }

/* Where a copy or memset on the device reaches [p, p + len): the device's view of device
 * memory, the pointer itself for host memory. */
char* reach(const void* p, size_t len) {
  uintptr_t base;
  const Alloc* a = find(p, len, &base);
  if (a == nullptr || !a->device) return static_cast<char*>(const_cast<void*>(p));
  return a->shadow + (reinterpret_cast<uintptr_t>(p) - base);
}

bool event_done(const agoq_emu_event* e, uint64_t seq) { return e->done_seq >= seq; }

/* Runs one operation of s, or, when s's next one waits on another stream's event, one
 * operation toward that event. false: s has nothing queued. */
bool run_one(agoq_emu_stream* s) {
  if (s->ops.empty()) return false;
  Op& head = s->ops.front();
  if (head.wait != nullptr && head.wait->done_seq < head.wait_seq) return run_one(head.wait);
  Op op = head;
  s->ops.pop_front();
  if (op.wait != nullptr) op.wait->waiters--;
  if (op.run) op.run(op.ctx);
  if (op.drop) op.drop(op.ctx);
  s->done_seq = op.seq;
  n_run++;
  return true;
}

void stream_drain(agoq_emu_stream* s, uint64_t seq) {
  while (s->done_seq < seq && run_one(s)) {
  }
}

/* Everything queued (blocking_only: on the streams the legacy stream synchronises with). */
void drain_all(bool blocking_only) {
  for (size_t i = 0; i < streams.size(); i++) {
    agoq_emu_stream* s = streams[i];
    if (blocking_only && (s->flags & cudaStreamNonBlocking)) continue;
    stream_drain(s, s->last_seq);
  }
}

/* Frees the destroyed streams whose work has run and that no queued wait names. Called
 * at the end of the calls that run work, never while work runs. */
void reap() {
  for (size_t i = 0; i < streams.size();) {
    agoq_emu_stream* s = streams[i];
    if (s->destroyed && s->ops.empty() && s->waiters == 0) {
      streams.erase(streams.begin() + (long)i);
      delete s;
    } else {
      i++;
    }
  }
}

/* The device lock for a call that may run work: frees what that work left behind on the
 * way out. */
struct Session {
  std::lock_guard<std::recursive_mutex> lk{dev_mu};
  ~Session() { reap(); }
};

/* sync: a synchronous call (counted as such), not work queued on the legacy stream. */
void push(agoq_emu_stream* s, void (*run)(void*), void* ctx, void (*drop)(void*), bool sync = false,
          agoq_emu_stream* wait = nullptr, uint64_t wait_seq = 0) {
  Op op{next_seq++, run, ctx, drop, wait, wait_seq};
  if (wait != nullptr) wait->waiters++;
  if (s == nullptr) {
    /* The legacy default stream, synchronous calls included (cudaMemcpy, cudaMemset):
     * after the blocking streams' work, at once. Never after a cudaStreamNonBlocking
     * stream's: on a GPU a synchronous copy does not wait for those either, so a test's
     * own cudaMemcpy does not finish the plugin's copies for it. */
    if (!sync) n_legacy++; /* a synchronous call counted itself */
    drain_all(true);
    if (run) run(ctx);
    if (drop) drop(ctx);
    n_run++;
    return;
  }
  s->last_seq = op.seq;
  s->ops.push_back(op);
}

struct CopyJob {
  char* dst;
  const char* src;
  size_t bytes;
};
void copy_run(void* p) {
  CopyJob* j = static_cast<CopyJob*>(p);
  memmove(j->dst, j->src, j->bytes);
}
void copy_drop(void* p) { delete static_cast<CopyJob*>(p); }

struct SetJob {
  char* dst;
  int value;
  size_t bytes;
};
void set_run(void* p) {
  SetJob* j = static_cast<SetJob*>(p);
  memset(j->dst, j->value, j->bytes);
}
void set_drop(void* p) { delete static_cast<SetJob*>(p); }

struct RecordJob {
  agoq_emu_event* e;
  uint64_t seq;
};
void record_run(void* p) {
  RecordJob* j = static_cast<RecordJob*>(p);
  j->e->pending--;
  if (j->seq < j->e->done_seq) return; /* a newer record, on another stream, ran first */
  j->e->t = now_s();
  j->e->done_seq = j->seq;
}
void record_drop(void* p) { delete static_cast<RecordJob*>(p); }

/* The copy's kind must match where its pointers are (cudaMemcpyDefault: any). */
cudaError_t copy_check(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (runs_past_device(dst, bytes) || runs_past_device(src, bytes)) return cudaErrorInvalidValue;
  bool d_dev = is_device(dst, bytes), s_dev = is_device(src, bytes);
  switch (kind) {
    case cudaMemcpyHostToHost: return !d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice: return d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return !d_dev && s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return d_dev && s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

bool stream_ok(cudaStream_t s) { return s == nullptr || !s->destroyed; }

}  // namespace

bool device_view(const void* p, void** out) {
  Session lk;
  if (p == nullptr) {
    *out = nullptr;
    return true;
  }
  const Alloc* a = find(p, 0, nullptr);
  if (a == nullptr) return false;
  *out = reach(p, 0);
  return true;
}

void launch_refused(const void* p) {
  fprintf(stderr,
          "agoq CUDA emulation: a kernel argument points at %p, which is neither device memory nor pinned host "
          "memory (a GPU cannot reach pageable memory); the launch fails\n",
          p);
  fail(cudaErrorInvalidDevicePointer);
}

bool launch_loaded(const void* fn, const char* name) {
  Session lk;
  DeviceKernels& dk = dev_kernels[current_device];
  n_launches++;
  launches_by_name[name != nullptr ? name : "?"]++;
  dk.launched.insert(fn);
  if (dk.loaded.count(fn) != 0) return true;
  n_refused++;
  fprintf(stderr,
          "agoq CUDA emulation: kernel %s launched before it was loaded on device %d: under lazy loading this "
          "first launch would load it while NCCL's kernel runs (load it at setup: cudaFuncGetAttributes, "
          "agoq_cuda_codec_load_all); the launch fails with cudaErrorFunctionNotLoaded\n",
          name != nullptr ? name : "?", current_device);
  fail(cudaErrorFunctionNotLoaded);
  return false;
}

void enqueue(cudaStream_t st, void (*run)(void*), void* ctx, void (*drop)(void*)) {
  Session lk;
  if (!stream_ok(st)) {
    if (drop) drop(ctx);
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  push(st, run, ctx, drop);
}

}  // namespace agoq_emu

using namespace agoq_emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = kDevices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  if (dev < 0 || dev >= kDevices) return fail(cudaErrorInvalidDevice);
  current_device = dev;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* dev) {
  if (dev == nullptr) return fail(cudaErrorInvalidValue);
  *dev = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int dev) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (dev != 0) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "agoq CPU emulation");
  prop->totalGlobalMem = (size_t)1 << 30;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (dev != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrGPUDirectRDMASupported:
      *value = 1;
      return cudaSuccess;
    case cudaDevAttrGPUDirectRDMAFlushWritesOptions:
      *value = cudaFlushGPUDirectRDMAWritesOptionHost;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceFlushGPUDirectRDMAWrites(enum cudaFlushGPUDirectRDMAWritesTarget target,
                                               enum cudaFlushGPUDirectRDMAWritesScope scope) {
  if (target != cudaFlushGPUDirectRDMAWritesTargetCurrentDevice ||
      (scope != cudaFlushGPUDirectRDMAWritesToOwner && scope != cudaFlushGPUDirectRDMAWritesToAllDevices))
    return fail(cudaErrorInvalidValue);
  n_rdma_flush++;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  size_t pg = page_size();
  size_t body = ((bytes ? bytes : 1) + pg - 1) / pg * pg;
  size_t map = body + pg; /* a guard page after the device's view */
  int fd = memfd_create("agoq-emu-device", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  char* host = nullptr;
  char* dev = nullptr;
  if (ftruncate(fd, (off_t)body) == 0) {
    host = static_cast<char*>(mmap(nullptr, map, PROT_NONE, MAP_SHARED, fd, 0));
    dev = static_cast<char*>(mmap(nullptr, map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (dev != MAP_FAILED &&
        mmap(dev, body, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      munmap(dev, map);
      dev = static_cast<char*>(MAP_FAILED);
    }
  }
  if (host == nullptr || host == MAP_FAILED || dev == MAP_FAILED) {
    if (host != nullptr && host != MAP_FAILED) munmap(host, map);
    if (dev != nullptr && dev != MAP_FAILED) munmap(dev, map);
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  /* As close to the guard page as the alignment allows. */
  size_t off = (body - (bytes ? bytes : 1)) / kAlign * kAlign;
  Session lk;
  allocs[reinterpret_cast<uintptr_t>(host + off)] = Alloc{bytes, dev + off, host, dev, map, true, fd};
  *p = host + off;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Session lk;
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || !it->second.device) return fail(cudaErrorInvalidDevicePointer);
  drain_all(false); /* cudaFree synchronises: no queued work may still use it */
  munmap(it->second.map_host, it->second.map_size);
  munmap(it->second.map_dev, it->second.map_size);
  close(it->second.fd);
  allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (p == nullptr || (flags & ~cudaHostAllocPortable) != 0) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  size_t map = ((bytes ? bytes : 1) + page_size() - 1) / page_size() * page_size();
  char* h = static_cast<char*>(mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (h == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  Session lk;
  allocs[reinterpret_cast<uintptr_t>(h)] = Alloc{bytes, h, h, nullptr, map, false, -1};
  *p = h;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  Session lk;
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || it->second.device) return fail(cudaErrorInvalidValue);
  drain_all(false);
  munmap(it->second.map_host, it->second.map_size);
  allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  Session lk;
  memset(attr, 0, sizeof *attr);
  attr->device = -2;
  const Alloc* a = p ? find(p, 0, nullptr) : nullptr;
  if (a == nullptr) {
    attr->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  attr->device = 0;
  attr->type = a->device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attr->devicePointer = const_cast<void*>(p);
  attr->hostPointer = a->device ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}

namespace {
cudaError_t copy_issue(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  Session lk;
  if (sync) n_sync++;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  cudaError_t e = copy_check(dst, src, bytes, kind);
  if (e != cudaSuccess) return fail(e);
  if (bytes == 0) return cudaSuccess;
  push(stream, &copy_run, new CopyJob{reach(dst, bytes), reach(src, bytes), bytes}, &copy_drop, sync);
  return cudaSuccess;
}

cudaError_t set_issue(void* p, int value, size_t bytes, cudaStream_t stream, bool sync) {
  Session lk;
  if (sync) n_sync++;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!is_device(p, bytes)) return fail(cudaErrorInvalidValue);
  push(stream, &set_run, new SetJob{reach(p, bytes), value, bytes}, &set_drop, sync);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy_issue(dst, src, bytes, kind, stream, false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  return copy_issue(dst, src, bytes, kind, nullptr, true);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  return set_issue(p, value, bytes, stream, false);
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) { return set_issue(p, value, bytes, nullptr, true); }

cudaError_t cudaDeviceSynchronize(void) {
  Session lk;
  n_sync++;
  drain_all(false);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorFunctionNotLoaded: return "cudaErrorFunctionNotLoaded";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  if (s == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  Session lk;
  *s = new agoq_emu_stream();
  (*s)->flags = flags;
  (*s)->priority = priority;
  streams.push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Session lk;
  if (s == nullptr || s->destroyed) return fail(cudaErrorInvalidResourceHandle);
  /* As on a GPU: queued work still runs; the object goes once it has (reap). */
  s->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  Session lk;
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s == nullptr) return cudaSuccess; /* legacy work ran when it was issued */
  if (s->done_seq < s->last_seq) run_one(s);
  return s->done_seq >= s->last_seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Session lk;
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s != nullptr) stream_drain(s, s->last_seq);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  Session lk;
  if (!stream_ok(s) || e == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  /* s's later work waits for e's newest record at this call (none: nothing to wait for). */
  if (e->seq == 0 || event_done(e, e->seq)) return cudaSuccess;
  if (s == nullptr) {
    stream_drain(e->stream, e->seq);
    return cudaSuccess;
  }
  push(s, nullptr, nullptr, nullptr, false, e->stream, e->seq);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  *e = new agoq_emu_event();
  (*e)->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (e->pending > 0) drain_all(false); /* a queued record still writes into it */
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  uint64_t seq = next_seq;
  e->seq = seq;
  e->stream = stream;
  e->pending++;
  push(stream, &record_run, new RecordJob{e, seq}, &record_drop);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (!event_done(e, e->seq)) run_one(e->stream);
  return event_done(e, e->seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (!event_done(e, e->seq)) stream_drain(e->stream, e->seq);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  Session lk;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (!event_done(start, start->seq) || !event_done(end, end->seq)) return fail(cudaErrorNotReady);
  *ms = (float)((end->t - start->t) * 1e3);
  return cudaSuccess;
}

void agoq_emu_counters_get(agoq_emu_counters* c) {
  Session lk;
  memset(c, 0, sizeof *c);
  c->legacy_stream_ops = n_legacy;
  c->sync_calls = n_sync;
  c->ops_run = n_run;
  c->rdma_flushes = n_rdma_flush;
  c->kernel_launches = n_launches;
  c->kernels_refused = n_refused;
  for (const auto& kv : allocs) (kv.second.device ? c->device_allocs : c->pinned_allocs)++;
}

int agoq_emu_peek(void* host, const void* dev, size_t bytes) {
  Session lk;
  if (host == nullptr || !is_device(dev, bytes)) return -1;
  if (bytes > 0) memcpy(host, reach(dev, bytes), bytes);
  return 0;
}

void agoq_emu_clock_set(double (*clock)(void)) { g_clock.store(clock); }

/* The driver's cuMemGetAddressRange_v2: the device allocation that holds ptr. */
static int emu_mem_get_address_range(unsigned long long* base, size_t* size, unsigned long long ptr) {
  Session lk;
  uintptr_t b = 0;
  const Alloc* a = find(reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr)), 1, &b);
  if (a == nullptr || !a->device) return 1; /* CUDA_ERROR_INVALID_VALUE */
  if (base != nullptr) *base = b;
  if (size != nullptr) *size = a->size;
  return 0;
}

/* The driver's cuMemGetHandleForAddressRange with CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (1):
 * a dma-buf file of the range, whose offset 0 is dptr. dptr and size must be multiples of
 * the host page (as the driver requires) and the range must lie in one device allocation's
 * pages. The emulation's file is the allocation's memfd, so the range must start at the
 * allocation's first page (its offset 0): a later start is refused, loudly, rather than
 * handed out with another offset. The caller owns (and closes) the fd. */
static int emu_mem_get_handle_for_address_range(void* handle, unsigned long long dptr, size_t size, int type,
                                                unsigned long long flags) {
  if (handle == nullptr || type != 1 || flags != 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
  size_t pg = page_size();
  if (dptr % pg != 0 || size == 0 || size % pg != 0) return 1;
  Session lk;
  for (const auto& kv : allocs) {
    const Alloc& a = kv.second;
    uintptr_t lo = reinterpret_cast<uintptr_t>(a.map_host), body = a.map_size - pg;
    if (!a.device || dptr < lo || dptr >= lo + body) continue;
    if (size > lo + body - dptr) return 1;
    if (dptr != lo) {
      fprintf(stderr, "agoq CUDA emulation: cuMemGetHandleForAddressRange from page %llu of an allocation: the "
                      "emulation exports whole allocations only\n",
              (unsigned long long)((dptr - lo) / pg));
      return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    }
    int fd = fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *static_cast<int*>(handle) = fd;
    return 0;
  }
  return 1;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction);
  Session lk;
  dev_kernels[current_device].loaded.insert(func);
  memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024; /* the fiber scheduler's limit */
  return cudaSuccess;
}

int agoq_emu_kernels_get(int device, unsigned long long* loaded, unsigned long long* launched) {
  if (device < 0 || device >= kDevices) return -1;
  Session lk;
  if (loaded != nullptr) *loaded = dev_kernels[device].loaded.size();
  if (launched != nullptr) *launched = dev_kernels[device].launched.size();
  return 0;
}

unsigned long long agoq_emu_kernel_launches(const char* prefix) {
  Session lk;
  const size_t len = prefix != nullptr ? strlen(prefix) : 0;
  unsigned long long n = 0;
  for (const auto& kv : launches_by_name)
    if (kv.first.compare(0, len, prefix != nullptr ? prefix : "") == 0) n += kv.second;
  return n;
}

void agoq_emu_kernels_forget(void) {
  Session lk;
  for (DeviceKernels& dk : dev_kernels) dk = DeviceKernels();
  launches_by_name.clear();
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int cuda_version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* status) {
  (void)cuda_version;
  if (symbol == nullptr || fn == nullptr || flags != cudaEnableDefault) return fail(cudaErrorInvalidValue);
  *fn = nullptr;
  if (strcmp(symbol, "cuMemGetAddressRange") == 0) {
    *fn = reinterpret_cast<void*>(&emu_mem_get_address_range);
  } else if (strcmp(symbol, "cuMemGetHandleForAddressRange") == 0) {
    *fn = reinterpret_cast<void*>(&emu_mem_get_handle_for_address_range);
  } else {
    if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
    return fail(cudaErrorSymbolNotFound);
  }
  if (status != nullptr) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

/* agoq_cuda_probe.h: one emulated device. */
int agoq_cuda_device_count(void) { return 1; }

int agoq_cuda_pci_bus_id(int dev, char* buf, int len) {
  if (buf == NULL || len < 13 || dev != 0) return -1;
  snprintf(buf, (size_t)len, "0000:00:00.0");
  return 0;
}

}  // extern "C"
