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
 * Work. Copies, memsets, launches and event records on a stream go into one queue in the
 * order they were issued (so each stream's order holds, and streams are serialised more
 * than a GPU would). The device runs queued work only when the host asks: cudaEventQuery
 * and cudaStreamQuery run at most one queued operation before they answer, the
 * synchronising calls run everything up to what they wait for. Code that reads a result
 * before its event says so therefore reads it before it is there, every time. Work on the
 * legacy default stream (stream 0) and the synchronous calls first run everything queued,
 * then act at once; they are counted (agoq_emu_counters_get) so that tests can show the
 * plugin never uses them. Everything runs under one device lock, on the thread that asked.
 */
#include <errno.h>
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

#include "agoq_cuda_emu.h"
#include "agoq_cuda_probe.h"

struct agoq_emu_stream {
  unsigned flags = 0;
  int priority = 0;
  uint64_t last_seq = 0; /* newest operation queued on it */
  unsigned queued = 0;   /* its operations not yet run */
  bool destroyed = false;
};

struct agoq_emu_event {
  unsigned flags = 0;
  uint64_t seq = 0; /* the record operation; 0: never recorded */
  double t = 0;     /* when the device ran the record */
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
};

struct Op {
  uint64_t seq;
  agoq_emu_stream* stream; /* nullptr: legacy or a marker that needs no stream */
  void (*run)(void*);
  void* ctx;
  void (*drop)(void*);
};

std::recursive_mutex dev_mu;       /* the device: the queue, the allocations, running work */
std::map<uintptr_t, Alloc> allocs; /* by the address the host sees */
std::deque<Op> queue;
uint64_t next_seq = 1, done_seq = 0;
thread_local cudaError_t last_error = cudaSuccess;
std::atomic<unsigned long long> n_legacy{0}, n_sync{0}, n_run{0};
int current_device = 0;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

double now_s() {
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

/* Where a copy or memset on the device reaches [p, p + len): the device's view of device
 * memory, the pointer itself for host memory. */
char* reach(const void* p, size_t len) {
  uintptr_t base;
  const Alloc* a = find(p, len, &base);
  if (a == nullptr || !a->device) return static_cast<char*>(const_cast<void*>(p));
  return a->shadow + (reinterpret_cast<uintptr_t>(p) - base);
}

void run_one() {
  Op op = queue.front();
  queue.pop_front();
  if (op.run) op.run(op.ctx);
  if (op.drop) op.drop(op.ctx);
  done_seq = op.seq;
  n_run++;
  if (op.stream != nullptr && --op.stream->queued == 0 && op.stream->destroyed) delete op.stream;
}

void run_until(uint64_t seq) {
  while (done_seq < seq && !queue.empty()) run_one();
}

/* sync: a synchronous call (counted as such), not work queued on the legacy stream. */
void push(agoq_emu_stream* s, void (*run)(void*), void* ctx, void (*drop)(void*), bool sync = false) {
  Op op{next_seq++, s, run, ctx, drop};
  if (s == nullptr) {
    /* The legacy default stream: after everything queued, at once. */
    if (!sync) n_legacy++; /* a synchronous call counted itself */
    run_until(next_seq);
    if (run) run(ctx);
    if (drop) drop(ctx);
    done_seq = op.seq;
    n_run++;
    return;
  }
  s->last_seq = op.seq;
  s->queued++;
  queue.push_back(op);
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

void record_run(void* p) { static_cast<agoq_emu_event*>(p)->t = now_s(); }

/* The copy's kind must match where its pointers are (cudaMemcpyDefault: any). */
cudaError_t copy_check(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  bool d_dev = is_device(dst, bytes), s_dev = is_device(src, bytes);
  /* A range that starts in an allocation but runs past it is no valid buffer at all. */
  if (!d_dev && find(dst, 1, nullptr) != nullptr && find(dst, 1, nullptr)->device) return cudaErrorInvalidValue;
  if (!s_dev && find(src, 1, nullptr) != nullptr && find(src, 1, nullptr)->device) return cudaErrorInvalidValue;
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
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
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

void enqueue(cudaStream_t st, void (*run)(void*), void* ctx, void (*drop)(void*)) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
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
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  if (dev != 0) return fail(cudaErrorInvalidDevice);
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
  close(fd);
  if (host == nullptr || host == MAP_FAILED || dev == MAP_FAILED) {
    if (host != nullptr && host != MAP_FAILED) munmap(host, map);
    if (dev != nullptr && dev != MAP_FAILED) munmap(dev, map);
    return fail(cudaErrorMemoryAllocation);
  }
  /* As close to the guard page as the alignment allows. */
  size_t off = (body - (bytes ? bytes : 1)) / kAlign * kAlign;
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  allocs[reinterpret_cast<uintptr_t>(host + off)] = Alloc{bytes, dev + off, host, dev, map, true};
  *p = host + off;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || !it->second.device) return fail(cudaErrorInvalidDevicePointer);
  run_until(next_seq); /* cudaFree synchronises: no queued work may still use it */
  munmap(it->second.map_host, it->second.map_size);
  munmap(it->second.map_dev, it->second.map_size);
  allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (p == nullptr || (flags & ~cudaHostAllocPortable) != 0) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  size_t map = ((bytes ? bytes : 1) + page_size() - 1) / page_size() * page_size();
  char* h = static_cast<char*>(mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (h == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  allocs[reinterpret_cast<uintptr_t>(h)] = Alloc{bytes, h, h, nullptr, map, false};
  *p = h;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || it->second.device) return fail(cudaErrorInvalidValue);
  run_until(next_seq);
  munmap(it->second.map_host, it->second.map_size);
  allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
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
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (sync) n_sync++;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  cudaError_t e = copy_check(dst, src, bytes, kind);
  if (e != cudaSuccess) return fail(e);
  if (bytes == 0) return cudaSuccess;
  push(stream, &copy_run, new CopyJob{reach(dst, bytes), reach(src, bytes), bytes}, &copy_drop, sync);
  return cudaSuccess;
}

cudaError_t set_issue(void* p, int value, size_t bytes, cudaStream_t stream, bool sync) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
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
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  n_sync++;
  run_until(next_seq);
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
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  if (s == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  *s = new agoq_emu_stream();
  (*s)->flags = flags;
  (*s)->priority = priority;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (s == nullptr || s->destroyed) return fail(cudaErrorInvalidResourceHandle);
  /* As on a GPU: queued work still runs; the stream goes with its last operation. */
  s->destroyed = true;
  if (s->queued == 0) delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  uint64_t want = s ? s->last_seq : next_seq - 1;
  if (done_seq < want && !queue.empty()) run_one();
  return done_seq >= want ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  run_until(s ? s->last_seq : next_seq - 1);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (!stream_ok(s) || e == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  /* One queue runs in issue order: whatever e waits for runs before s's next work. */
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
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  run_until(e->seq); /* a pending record still writes into it */
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  e->seq = next_seq;
  push(stream, &record_run, e, nullptr);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if (done_seq < e->seq && !queue.empty()) run_one();
  return done_seq >= e->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  run_until(e->seq);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (done_seq < start->seq || done_seq < end->seq) return fail(cudaErrorNotReady);
  *ms = (float)((end->t - start->t) * 1e3);
  return cudaSuccess;
}

void agoq_emu_counters_get(agoq_emu_counters* c) {
  std::lock_guard<std::recursive_mutex> lk(dev_mu);
  memset(c, 0, sizeof *c);
  c->legacy_stream_ops = n_legacy;
  c->sync_calls = n_sync;
  c->ops_run = n_run;
  for (const auto& kv : allocs) (kv.second.device ? c->device_allocs : c->pinned_allocs)++;
}

/* agoq_cuda_probe.h: one emulated device. */
int agoq_cuda_device_count(void) { return 1; }

int agoq_cuda_pci_bus_id(int dev, char* buf, int len) {
  if (buf == NULL || len < 13 || dev != 0) return -1;
  snprintf(buf, (size_t)len, "0000:00:00.0");
  return 0;
}

}  // extern "C"
