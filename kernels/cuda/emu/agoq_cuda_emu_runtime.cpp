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
 *
 * Hangs (docs/design-gpu.md, "Emulation rules for hangs"; measured on an H200 in
 * docs/gpu-h200.md). The device lock is CUDA's context lock: every runtime call takes it.
 * cudaFree and cudaFreeHost hold it until every queued operation has completed (a first-time
 * module load under lazy loading does the same on a GPU: it would call
 * hold_context_until_idle). A wait item (agoq_emu_wait_item) stands in for NCCL's kernel
 * spinning on a word. Streams are spread round-robin, at creation, over
 * CUDA_DEVICE_MAX_CONNECTIONS in-order hardware queues: an operation starts only after
 * everything queued before it in its queue has started, so an operation that waits for its
 * stream's running wait item holds up everything behind it in the queue, whatever its
 * stream. While what a caller waits for is held up by a wait item, the device runs whatever
 * else it can (a GPU runs streams side by side). Where the emulation can prove that a word
 * a wait item needs will never be written (the copy that writes it sits behind the wait
 * item; the context lock is held until the device is idle and the word is device memory
 * that only device work writes) it prints the cycle, ends the wait item (ABORTED) and the
 * call returns cudaErrorLaunchTimeout instead of hanging. Where it cannot (a pinned host
 * word another thread may write), it waits; a call that makes no progress for
 * CUDAEMU_HANG_S seconds (default 60, real time) ends the same way, as a backstop only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <map>
#include <memory>
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
  const char* what;             /* for deadlock reports: "a copy", "a kernel", ... */
  agoq_emu_wait* item;     /* a wait item: completes when its word holds its value */
  bool started;                 /* left its hardware queue (a running wait item) */
};
}  // namespace
}  // namespace agoq_emu

struct agoq_emu_context;

struct agoq_emu_stream {
  unsigned flags = 0;
  int priority = 0;
  std::deque<agoq_emu::Op> ops; /* queued, not run */
  uint64_t last_seq = 0;        /* newest operation queued on it */
  uint64_t done_seq = 0;        /* newest operation run */
  unsigned waiters = 0;         /* queued waits (of other streams) that name it */
  bool destroyed = false;       /* freed once its work ran and no wait names it (reap) */
  unsigned queue = 0;           /* its hardware queue (round-robin at creation) */
  int device = 0;               /* the device current at its creation */
  agoq_emu_context* ctx = nullptr; /* the context current at its creation */
};

struct agoq_emu_wait {
  const unsigned* word; /* where the device (or, pinned, the host) sees it */
  unsigned value;
  bool device_word;     /* in device memory: only device work (or a NIC through a dma-buf) writes it */
  bool exported;        /* its allocation was exported as a dma-buf: a NIC may write it */
  agoq_emu_stream* stream;
  agoq_emu_wait_state state = AGOQ_EMU_WAIT_QUEUED;
  unsigned refs = 2; /* the queued operation and the caller's handle */
};

struct agoq_emu_graph {
  int unused; /* a finished capture; nothing is recorded (include/cuda_runtime_api.h) */
};

struct agoq_emu_event {
  unsigned flags = 0;
  agoq_emu_stream* stream = nullptr; /* of the newest record */
  uint64_t seq = 0;                  /* the newest record operation; 0: never recorded */
  uint64_t done_seq = 0;             /* the newest record the device has run */
  unsigned pending = 0;              /* records queued, not run */
  double t = 0;                      /* when the newest one ran */
  int device = 0;                    /* the device current at its creation */
  agoq_emu_context* ctx = nullptr;   /* the context current at its creation */
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
  int ordinal = 0; /* device allocations: the device it is on (current at cudaMalloc) */
  bool exported = false; /* a dma-buf of it was handed out: a NIC may write it without CUDA */
};

std::recursive_mutex dev_mu;       /* the context lock: the queues, the allocations, running work */
thread_local int dev_mu_depth = 0;  /* how many Sessions this thread holds (a wait releases all) */
std::map<uintptr_t, Alloc> allocs; /* by the address the host sees */
std::vector<agoq_emu_stream*> streams; /* every stream created and not yet freed */
uint64_t next_seq = 1;
thread_local cudaError_t last_error = cudaSuccess;
std::atomic<unsigned long long> n_legacy{0}, n_sync{0}, n_run{0}, n_rdma_flush{0}, n_deadlocks{0};
std::atomic<unsigned long long> n_ll128_early{0}, n_live_events{0};
uintptr_t ll128_lo = 0, ll128_hi = 0; /* the watched LL128 range (agoq_emu_watch_ll128), device addresses */
std::string last_deadlock;

/* The hardware queues: each holds, in order, the operations of its streams that have not
 * started (stream, seq). */
constexpr int kMaxQueues = 32;
std::deque<std::pair<agoq_emu_stream*, uint64_t>> hw_queues[kMaxQueues];
int n_queues = 0; /* 0: not yet read from CUDA_DEVICE_MAX_CONNECTIONS */
unsigned next_queue = 0;
std::vector<agoq_emu_wait*> wait_items; /* queued or running */
/* The emulated devices: ordinals [0, n_devices), CUDAEMU_DEVICES (1 to kMaxDevices, default 1),
 * read at the first call that needs it, or agoq_emu_devices_set. Each thread has its own
 * current device, as in CUDA. */
constexpr int kMaxDevices = 8;
int n_devices = 0;
thread_local int current_device = 0;

int device_count() {
  if (n_devices == 0) {
    const char* v = getenv("CUDAEMU_DEVICES");
    int n = v != nullptr ? atoi(v) : 1;
    n_devices = n < 1 ? 1 : n > kMaxDevices ? kMaxDevices : n;
  }
  return n_devices;
}

/* Lazy loading (cudaFuncGetAttributes, launch_loaded): per device, the kernels loaded there
 * and those launched there; per kernel name, its launches. Under dev_mu. */
struct DeviceKernels {
  std::set<const void*> loaded, launched;
};
std::map<std::string, unsigned long long> launches_by_name;
unsigned long long n_launches = 0, n_refused = 0;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

}  // namespace
}  // namespace agoq_emu

/* A CUDA context: its device, and the kernels loaded in it (lazy loading is per context). */
struct agoq_emu_context {
  int device = 0;
  bool primary = false;
  agoq_emu::DeviceKernels kernels;
};

namespace agoq_emu {
namespace {

/* Contexts (the driver API's cuCtxGetCurrent and cuCtxSetCurrent, reached through
 * cudaGetDriverEntryPointByVersion; agoq_emu_context_create stands in for cuCtxCreate). Each
 * device has its primary context, which cudaSetDevice makes current; a thread bound to none
 * gets its current device's primary context at its first runtime call, as cudart does.
 * Streams and events belong to the context current at their creation; kernels are loaded per
 * context. Among primary contexts CUDA's documented device rules apply (enqueue,
 * cudaEventRecord). Between a private context (NCCL_CREATE_THREAD_CONTEXT=1 makes one for
 * NCCL's proxy threads) and any other, the behaviour is undocumented and emulated as it hurts
 * most: a stream or event of one is refused while the other is current (ctx_refuses). Under
 * dev_mu. */
agoq_emu_context primary_ctx[kMaxDevices];
std::vector<std::unique_ptr<agoq_emu_context>> private_ctx; /* live as long as the process */
thread_local agoq_emu_context* bound_ctx = nullptr;

agoq_emu_context* primary_of(int dev) {
  agoq_emu_context* c = &primary_ctx[dev];
  c->device = dev;
  c->primary = true;
  return c;
}

agoq_emu_context* cur_ctx() {
  if (bound_ctx == nullptr) bound_ctx = primary_of(current_device);
  return bound_ctx;
}

bool ctx_known(const agoq_emu_context* c) {
  if (c >= primary_ctx && c < primary_ctx + kMaxDevices) return true;
  for (const auto& p : private_ctx)
    if (p.get() == c) return true;
  return false;
}

const char* ctx_name(const agoq_emu_context* c) { return c->primary ? "primary" : "private"; }

/* `what` on an object of context `owner` while another is current: refused (with a line)
 * unless both are primary contexts. */
bool ctx_refuses(const agoq_emu_context* owner, const char* what) {
  const agoq_emu_context* cur = cur_ctx();
  if (owner == nullptr || owner == cur || (owner->primary && cur->primary)) return false;
  fprintf(stderr,
          "agoq CUDA emulation: %s on a stream or event of device %d's %s context while device %d's %s context is "
          "current: refused (a private context's streams and events are used with it current)\n",
          what, owner->device, ctx_name(owner), cur->device, ctx_name(cur));
  fail(cudaErrorInvalidResourceHandle);
  return true;
}

/* Stream capture (include/cuda_runtime_api.h says which calls are refused, and when). The
 * captures under way, under dev_mu; each thread's mode is its own, as in CUDA. */
struct Capture {
  agoq_emu_stream* stream;
  cudaStreamCaptureMode mode;
  const void* thread; /* the capturing thread: the address of its capture_mode */
  bool invalidated;
};
std::vector<Capture> captures;
thread_local cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
std::atomic<unsigned long long> n_capture_refused{0};

const void* this_thread() { return &capture_mode; }

const char* capture_mode_name(cudaStreamCaptureMode m) {
  switch (m) {
    case cudaStreamCaptureModeGlobal: return "Global";
    case cudaStreamCaptureModeThreadLocal: return "ThreadLocal";
    case cudaStreamCaptureModeRelaxed: return "Relaxed";
  }
  return "?";
}

Capture* capture_of(const agoq_emu_stream* s) {
  for (Capture& c : captures)
    if (c.stream == s) return &c;
  return nullptr;
}

/* `call` is "potentially unsafe": refused on this thread while a capture it conflicts with
 * is under way, and that capture invalidated, as CUDA does. Under dev_mu. */
bool capture_refuses(const char* call) {
  if (capture_mode == cudaStreamCaptureModeRelaxed) return false;
  bool refused = false;
  for (Capture& c : captures) {
    const bool own = c.thread == this_thread();
    const bool conflicts = own ? c.mode != cudaStreamCaptureModeRelaxed
                               : capture_mode == cudaStreamCaptureModeGlobal &&
                                     c.mode == cudaStreamCaptureModeGlobal;
    if (conflicts) {
      c.invalidated = true;
      refused = true;
    }
  }
  if (!refused) return false;
  n_capture_refused++;
  fprintf(stderr,
          "agoq CUDA emulation: %s while a stream capture is under way, on a thread in %s capture mode: refused "
          "(cudaErrorStreamCaptureUnsupported) and the capture invalidated; such calls belong in "
          "cudaThreadExchangeStreamCaptureMode(Relaxed), as NCCL's own proxy allocations are\n",
          call, capture_mode_name(capture_mode));
  fail(cudaErrorStreamCaptureUnsupported);
  return true;
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

bool word_holds(const agoq_emu_wait* w) {
  /* A pinned word is written by host threads without the context lock. */
  return __atomic_load_n(w->word, __ATOMIC_ACQUIRE) == w->value;
}

void item_unref(agoq_emu_wait* w) {
  if (--w->refs == 0) delete w;
}

void item_finish(agoq_emu_wait* w, agoq_emu_wait_state st) {
  w->state = st;
  for (size_t i = 0; i < wait_items.size(); i++)
    if (wait_items[i] == w) {
      wait_items.erase(wait_items.begin() + (long)i);
      break;
    }
}

/* Runs one operation of s, or one operation toward it: the one queued before it in its
 * hardware queue, or the event it waits for. A wait item starts (leaves its queue) and then
 * completes only once its word holds. true: something progressed; false: s has nothing
 * queued or is held up (by a wait item whose word does not hold). */
bool run_one(agoq_emu_stream* s) {
  if (s->ops.empty()) return false;
  Op& head = s->ops.front();
  bool progressed = false;
  if (!head.started) {
    auto& q = hw_queues[s->queue];
    /* In order: whatever is queued before it in its hardware queue starts first. */
    if (!q.empty() && q.front().second != head.seq) return run_one(q.front().first);
    if (head.wait != nullptr && head.wait->done_seq < head.wait_seq) return run_one(head.wait);
    if (!q.empty()) q.pop_front();
    head.started = true;
    if (head.item != nullptr) {
      if (head.item->state == AGOQ_EMU_WAIT_QUEUED) head.item->state = AGOQ_EMU_WAIT_RUNNING; /* not if ended */
      progressed = true;
    }
  }
  if (head.item != nullptr && head.item->state != AGOQ_EMU_WAIT_ABORTED && !word_holds(head.item)) return progressed;
  Op op = head;
  s->ops.pop_front();
  if (op.wait != nullptr) op.wait->waiters--;
  if (op.item != nullptr) {
    if (op.item->state != AGOQ_EMU_WAIT_ABORTED) item_finish(op.item, AGOQ_EMU_WAIT_DONE);
    item_unref(op.item);
  }
  if (op.run) op.run(op.ctx);
  if (op.drop) op.drop(op.ctx);
  s->done_seq = op.seq;
  n_run++;
  return true;
}

/* true: s has run operation seq; false: held up. */
bool stream_drain(agoq_emu_stream* s, uint64_t seq) {
  while (s->done_seq < seq && run_one(s)) {
  }
  return s->done_seq >= seq;
}

/* Everything queued (blocking_only: on the streams the legacy stream synchronises with).
 * false: some of it is held up. */
bool drain_all(bool blocking_only) {
  bool all = true;
  for (size_t i = 0; i < streams.size(); i++) {
    agoq_emu_stream* s = streams[i];
    if (blocking_only && (s->flags & cudaStreamNonBlocking)) continue;
    if (!stream_drain(s, s->last_seq)) all = false;
  }
  return all;
}

/* One operation of any stream that can progress, as a GPU runs streams side by side while
 * NCCL's kernel waits. */
bool run_any() {
  for (size_t i = 0; i < streams.size(); i++)
    if (run_one(streams[i])) return true;
  return false;
}

void report_deadlock(const std::string& text) {
  last_deadlock = text;
  n_deadlocks++;
  fprintf(stderr, "agoq CUDA emulation: %s\n", text.c_str());
  fflush(stderr);
}

/* Ends every wait item that has not finished: the emulation's watchdog after a report. */
void abort_wait_items() {
  while (!wait_items.empty()) item_finish(wait_items.front(), AGOQ_EMU_WAIT_ABORTED);
}

double mono_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double hang_bound_s() {
  static const double b = [] {
    const char* v = getenv("CUDAEMU_HANG_S");
    double d = v != nullptr ? atof(v) : 0;
    return d > 0 ? d : 60.0;
  }();
  return b;
}

/* CUDA_DEVICE_MAX_CONNECTIONS as the driver reads it, once, when it creates the context
 * (here: at the first stream): 8 unless set (or not a number); the emulation clamps to
 * 1..32. */
int queue_count() {
  if (n_queues == 0) {
    const char* v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    char* end = nullptr;
    long n = v != nullptr && *v != '\0' ? strtol(v, &end, 10) : 8;
    if (end != nullptr && *end != '\0') n = 8;
    n_queues = n < 1 ? 1 : n > kMaxQueues ? kMaxQueues : (int)n;
  }
  return n_queues;
}

/* The wait items that hold the device up, for a report. */
std::string describe_wait_items() {
  std::string t;
  char buf[160];
  for (const agoq_emu_wait* w : wait_items) {
    snprintf(buf, sizeof buf, "%sNCCL's kernel (a wait item on stream %p, hardware queue %u, %s) waits for the %s word %p",
             t.empty() ? "" : "; ", (void*)w->stream, w->stream->queue,
             w->state == AGOQ_EMU_WAIT_RUNNING ? "running" : "queued", w->device_word ? "device" : "pinned host",
             (const void*)w->word);
    t += buf;
  }
  return t;
}

void release_and_pause();

/* Runs device work until done() holds. progress() makes one step toward it (false: held
 * up); then the rest of the device runs. holds_context: the caller keeps the context lock
 * while it waits (cudaFree): nothing else can issue work meanwhile, so a wait item on a
 * device word nobody can write any more is a deadlock, reported at once. Otherwise the
 * lock is released between looks so that other threads can issue the work that frees it.
 * cudaErrorLaunchTimeout after a report (the wait items are ended, the device drained). */
template <typename Done, typename Progress>
cudaError_t wait_device(const char* call, bool holds_context, Done done, Progress progress) {
  double start = mono_s();
  cudaError_t res = cudaSuccess;
  while (!done()) {
    if (progress() || run_any()) {
      start = mono_s();
      continue;
    }
    bool provable = holds_context && !wait_items.empty();
    for (const agoq_emu_wait* w : wait_items)
      if (!w->device_word || w->exported) provable = false;
    if (provable) {
      report_deadlock(std::string("deadlock: ") + call +
                      " holds the context lock until every queued operation has completed (as CUDA's does); " +
                      describe_wait_items() +
                      "; only device work issued later can write it, and issuing work (the plugin's cudaMemcpyAsync "
                      "included) waits for that lock. The wait items are ended; the call fails");
      abort_wait_items();
      res = cudaErrorLaunchTimeout;
      continue;
    }
    if (mono_s() - start > hang_bound_s()) {
      report_deadlock(std::string("no progress for CUDAEMU_HANG_S seconds: ") + call + " waits; " +
                      describe_wait_items() + (holds_context ? " (the call holds the context lock)" : "") +
                      ". The wait items are ended; the call fails");
      abort_wait_items();
      res = cudaErrorLaunchTimeout;
      start = mono_s();
      continue;
    }
    if (holds_context) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, nullptr);
    } else {
      release_and_pause();
    }
  }
  return res;
}

/* The context lock held until the device is idle: cudaFree, cudaFreeHost (measured on an
 * H200: another thread's cudaMemcpyAsync call blocks meanwhile). The per-device lazy-load
 * tracking should make a kernel's first launch call this too (CUDA_MODULE_LOADING=LAZY). */
std::atomic<int> n_context_waiting{0};

cudaError_t hold_context_until_idle(const char* call) {
  n_context_waiting++;
  cudaError_t res = wait_device(call, true, [] { return drain_all(false); }, [] { return false; });
  n_context_waiting--;
  return res;
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

/* The context lock for a runtime call: frees what the work it ran left behind on the way
 * out. */
struct Session {
  Session() {
    dev_mu.lock();
    dev_mu_depth++;
  }
  ~Session() {
    reap();
    dev_mu_depth--;
    dev_mu.unlock();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

/* Between two looks of a wait that does not hold the context: lets other threads in. Only
 * an outermost call releases (a nested one keeps the lock: its caller's state is live). */
void release_and_pause() {
  int depth = dev_mu_depth;
  if (depth == 1) dev_mu.unlock();
  struct timespec ts = {0, 200000};
  nanosleep(&ts, nullptr);
  if (depth == 1) dev_mu.lock();
}

/* Whether an operation queued now on s (after everything queued so far) could complete
 * while the wait item w never does: false when it cannot start before w completes,
 * through its stream, its hardware queue or an event it waits for, transitively. Every
 * dependency points at an earlier operation, so one pass in queue order decides. */
bool could_complete_without(agoq_emu_stream* s, const agoq_emu_wait* w) {
  struct Pending {
    uint64_t seq;
    agoq_emu_stream* s;
    const Op* op;
  };
  std::vector<Pending> pending;
  for (agoq_emu_stream* st : streams)
    for (const Op& op : st->ops) pending.push_back({op.seq, st, &op});
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) { return a.seq < b.seq; });
  /* held_start: cannot start before w completes; held_done: cannot complete before it. */
  std::map<uint64_t, bool> held_done;
  std::map<agoq_emu_stream*, bool> stream_tail_held; /* the newest pending op of each stream */
  bool queue_tail_held[kMaxQueues] = {};             /* the newest not-started op of each queue */
  for (const Pending& p : pending) {
    const Op& op = *p.op;
    bool held_start = false;
    if (!op.started) {
      held_start = stream_tail_held[p.s] || queue_tail_held[p.s->queue];
      if (op.wait != nullptr && op.wait->done_seq < op.wait_seq) {
        auto it = held_done.find(op.wait_seq);
        if (it != held_done.end() && it->second) held_start = true;
      }
      queue_tail_held[p.s->queue] = held_start;
    }
    bool done = held_start || op.item == w;
    held_done[op.seq] = done;
    stream_tail_held[p.s] = done;
  }
  return !(stream_tail_held[s] || queue_tail_held[s->queue]);
}

/* Before a copy or memset into [dst, dst + bytes) (the device's view) is queued on s: if a
 * wait item waits for a word in that range and the copy could only start after the wait
 * item completes, neither ever will. (What a kernel writes is not known here: a kernel
 * that would write the word is not checked.) Reports the cycle and ends the wait item; true: the
 * caller fails instead of queuing. */
bool closes_cycle(agoq_emu_stream* s, const char* what, const char* dst, size_t bytes) {
  for (agoq_emu_wait* w : wait_items) {
    const char* word = reinterpret_cast<const char*>(w->word);
    if (word + sizeof(unsigned) <= dst || word >= dst + bytes || word_holds(w)) continue;
    if (could_complete_without(s, w)) continue;
    char buf[512];
    snprintf(buf, sizeof buf,
             "deadlock: %s on stream %p (hardware queue %u of %d) would write the word %p that NCCL's kernel (a wait "
             "item on stream %p, hardware queue %u) waits for, but it waits behind that kernel: %s. The copy fails "
             "and the wait item is ended",
             what, (void*)s, s->queue, n_queues, (const void*)w->word, (void*)w->stream, w->stream->queue,
             s == w->stream ? "queued after it on the same stream"
             : s->queue == w->stream->queue
                 ? "its hardware queue holds, before it, work that waits for the kernel (CUDA_DEVICE_MAX_CONNECTIONS)"
                 : "it waits for an event recorded after the kernel");
    report_deadlock(buf);
    abort_wait_items();
    return true;
  }
  return false;
}

/* sync: a synchronous call (counted as such), not work queued on the legacy stream. */
void push(agoq_emu_stream* s, void (*run)(void*), void* ctx, void (*drop)(void*), const char* what,
          bool sync = false, agoq_emu_stream* wait = nullptr, uint64_t wait_seq = 0,
          agoq_emu_wait* item = nullptr) {
  if (s != nullptr && capture_of(s) != nullptr) {
    /* A graph would record it; the emulation records none (its tests never need one). */
    fprintf(stderr, "agoq CUDA emulation: %s queued on a capturing stream: graphs are not emulated\n", what);
    abort();
  }
  Op op{next_seq++, run, ctx, drop, wait, wait_seq, what, item, false};
  if (wait != nullptr) wait->waiters++;
  if (s == nullptr) {
    /* The legacy default stream, synchronous calls included (cudaMemcpy, cudaMemset):
     * after the blocking streams' work, at once. Never after a cudaStreamNonBlocking
     * stream's: on a GPU a synchronous copy does not wait for those either, so a test's
     * own cudaMemcpy does not finish the plugin's copies for it. Held up by a wait item,
     * it keeps the context lock meanwhile (adversarial: not measured). */
    if (!sync) n_legacy++; /* a synchronous call counted itself */
    (void)wait_device(what, true, [] { return drain_all(true); }, [] { return false; });
    if (wait != nullptr) wait->waiters--;
    if (run) run(ctx);
    if (drop) drop(ctx);
    n_run++;
    return;
  }
  s->last_seq = op.seq;
  s->ops.push_back(op);
  hw_queues[s->queue].push_back({s, op.seq});
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

struct Copy2DJob {
  char* dst;
  const char* src;
  size_t dpitch, spitch, width, height;
};
void copy2d_run(void* p) {
  Copy2DJob* j = static_cast<Copy2DJob*>(p);
  for (size_t r = 0; r < j->height; r++) memmove(j->dst + r * j->dpitch, j->src + r * j->spitch, j->width);
}
void copy2d_drop(void* p) { delete static_cast<Copy2DJob*>(p); }

/* One copy's rows into device memory (height rows of width bytes, pitch apart): the watched
 * LL128 lines it writes both the data (bytes 0-119) and the flag (120-127) of. A copy engine
 * may write a line's flag before its data (the order inside one copy is undocumented), so
 * each such line counts as a flag that can be seen early. */
void ll128_count(uintptr_t dst, size_t pitch, size_t width, size_t height) {
  if (ll128_hi <= ll128_lo || width == 0) return;
  std::map<uintptr_t, unsigned> lines; /* line -> bit 1 data written, bit 2 flag written */
  for (size_t r = 0; r < height; r++) {
    uintptr_t lo = std::max(dst + r * pitch, ll128_lo), hi = std::min(dst + r * pitch + width, ll128_hi);
    for (uintptr_t line = lo / 128 * 128; line < hi; line += 128) {
      uintptr_t a = std::max(lo, line), b = std::min(hi, line + 128);
      if (a < line + 120) lines[line] |= 1u;
      if (b > line + 120) lines[line] |= 2u;
    }
  }
  for (const auto& l : lines)
    if (l.second == 3u) n_ll128_early++;
}

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
  /* Another device's memory: no peer access is enabled in the emulation. */
  if (a == nullptr || (a->device && a->ordinal != current_device)) return false;
  *out = reach(p, 0);
  return true;
}

void launch_refused(const void* p) {
  fprintf(stderr,
          "agoq CUDA emulation: a kernel argument points at %p, which is neither device memory of the current "
          "device (%d) nor pinned host memory (a GPU cannot reach pageable memory, nor a peer's without peer "
          "access); the launch fails\n",
          p, current_device);
  fail(cudaErrorInvalidDevicePointer);
}

void launch_bad_grid(const char* name, unsigned grid, unsigned grid_y) {
  fprintf(stderr,
          "agoq CUDA emulation: kernel %s launched with a grid of %u x %u CTAs (CUDA takes 1 to 2^31-1 by 1 to "
          "65535); the launch fails\n",
          name != nullptr ? name : "?", grid, grid_y);
  fail(cudaErrorInvalidConfiguration);
}

bool launch_loaded(const void* fn, const char* name) {
  Session lk;
  DeviceKernels& dk = cur_ctx()->kernels;
  n_launches++;
  launches_by_name[name != nullptr ? name : "?"]++;
  dk.launched.insert(fn);
  if (dk.loaded.count(fn) != 0) return true;
  n_refused++;
  fprintf(stderr,
          "agoq CUDA emulation: kernel %s launched before it was loaded in device %d's %s context: under lazy loading this "
          "first launch would load it while NCCL's kernel runs (load it at setup: cudaFuncGetAttributes, "
          "agoq_cuda_codec_load_all); the launch fails with cudaErrorFunctionNotLoaded\n",
          name != nullptr ? name : "?", current_device, ctx_name(cur_ctx()));
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
  if (st != nullptr && st->device == current_device && ctx_refuses(st->ctx, "a kernel launch")) {
    if (drop) drop(ctx);
    return;
  }
  if (st != nullptr && st->device != current_device) {
    /* CUDA: a kernel goes to a stream of the current device. */
    fprintf(stderr, "agoq CUDA emulation: a kernel launched on a stream of device %d while device %d is current: "
            "refused\n", st->device, current_device);
    if (drop) drop(ctx);
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  push(st, run, ctx, drop, "a kernel");
}

}  // namespace agoq_emu

using namespace agoq_emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  Session lk; /* every runtime call takes the context lock */
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  Session lk; /* every runtime call takes the context lock */
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = dev;
  bound_ctx = primary_of(dev); /* cudaSetDevice makes the device's primary context current */
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* dev) {
  Session lk; /* every runtime call takes the context lock */
  if (dev == nullptr) return fail(cudaErrorInvalidValue);
  *dev = cur_ctx()->device; /* a private context's device too */
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int dev) {
  Session lk; /* every runtime call takes the context lock */
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "agoq CPU emulation");
  prop->totalGlobalMem = (size_t)1 << 30;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev) {
  Session lk; /* every runtime call takes the context lock */
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
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
  Session lk; /* every runtime call takes the context lock */
  if (target != cudaFlushGPUDirectRDMAWritesTargetCurrentDevice ||
      (scope != cudaFlushGPUDirectRDMAWritesToOwner && scope != cudaFlushGPUDirectRDMAWritesToAllDevices))
    return fail(cudaErrorInvalidValue);
  n_rdma_flush++;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  {
    Session lk;
    if (capture_refuses("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  }
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
  allocs[reinterpret_cast<uintptr_t>(host + off)] = Alloc{bytes, dev + off, host, dev, map, true, fd, current_device};
  *p = host + off;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Session lk;
  if (capture_refuses("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || !it->second.device) return fail(cudaErrorInvalidDevicePointer);
  /* cudaFree synchronises: no queued work may still use it. The memory goes even after a
   * reported deadlock (the wait items were ended), so that a test's teardown stays clean. */
  cudaError_t res = hold_context_until_idle("cudaFree");
  it = allocs.find(reinterpret_cast<uintptr_t>(p));
  munmap(it->second.map_host, it->second.map_size);
  munmap(it->second.map_dev, it->second.map_size);
  close(it->second.fd);
  allocs.erase(it);
  return res == cudaSuccess ? cudaSuccess : fail(res);
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (p == nullptr || (flags & ~cudaHostAllocPortable) != 0) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  {
    Session lk;
    if (capture_refuses("cudaHostAlloc")) return cudaErrorStreamCaptureUnsupported;
  }
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
  if (capture_refuses("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || it->second.device) return fail(cudaErrorInvalidValue);
  cudaError_t res = hold_context_until_idle("cudaFreeHost");
  it = allocs.find(reinterpret_cast<uintptr_t>(p));
  munmap(it->second.map_host, it->second.map_size);
  allocs.erase(it);
  return res == cudaSuccess ? cudaSuccess : fail(res);
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
  attr->device = a->device ? a->ordinal : current_device;
  attr->type = a->device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attr->devicePointer = const_cast<void*>(p);
  attr->hostPointer = a->device ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}

namespace {
cudaError_t copy_issue(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  Session lk;
  if (sync) n_sync++;
  if (sync && capture_refuses("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (stream != nullptr && ctx_refuses(stream->ctx, "a copy")) return cudaErrorInvalidResourceHandle;
  cudaError_t e = copy_check(dst, src, bytes, kind);
  if (e != cudaSuccess) return fail(e);
  if (bytes == 0) return cudaSuccess;
  static const char* const names[] = {"a copy (host to host)", "a copy (host to device)", "a copy (device to host)",
                                      "a copy (device to device)", "a copy (cudaMemcpyDefault)"};
  const char* what = (unsigned)kind < 5 ? names[kind] : "a copy";
  if (stream != nullptr && closes_cycle(stream, what, reach(dst, bytes), bytes)) return fail(cudaErrorLaunchTimeout);
  if (kind != cudaMemcpyDeviceToHost && is_device(dst, bytes)) ll128_count(reinterpret_cast<uintptr_t>(dst), bytes, bytes, 1);
  push(stream, &copy_run, new CopyJob{reach(dst, bytes), reach(src, bytes), bytes}, &copy_drop, what, sync);
  return cudaSuccess;
}

cudaError_t set_issue(void* p, int value, size_t bytes, cudaStream_t stream, bool sync) {
  Session lk;
  if (sync) n_sync++;
  if (sync && capture_refuses("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (stream != nullptr && ctx_refuses(stream->ctx, "a memset")) return cudaErrorInvalidResourceHandle;
  if (bytes == 0) return cudaSuccess;
  if (!is_device(p, bytes)) return fail(cudaErrorInvalidValue);
  if (stream != nullptr && closes_cycle(stream, "a memset", reach(p, bytes), bytes))
    return fail(cudaErrorLaunchTimeout);
  push(stream, &set_run, new SetJob{reach(p, bytes), value, bytes}, &set_drop, "a memset", sync);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy_issue(dst, src, bytes, kind, stream, false);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
  Session lk;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (stream != nullptr && ctx_refuses(stream->ctx, "a 2D copy")) return cudaErrorInvalidResourceHandle;
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
  /* The whole spans, first row to the end of the last: one allocation each side. */
  size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
  if (dst == nullptr || src == nullptr || runs_past_device(dst, dspan) || runs_past_device(src, sspan))
    return fail(cudaErrorInvalidValue);
  bool d_dev = is_device(dst, dspan), s_dev = is_device(src, sspan);
  bool ok = kind == cudaMemcpyHostToDevice   ? d_dev && !s_dev
            : kind == cudaMemcpyDeviceToHost ? !d_dev && s_dev
            : kind == cudaMemcpyDeviceToDevice ? d_dev && s_dev
            : kind == cudaMemcpyHostToHost     ? !d_dev && !s_dev
                                               : kind == cudaMemcpyDefault;
  if (!ok) return fail(cudaErrorInvalidValue);
  const char* what = "a 2D copy";
  if (stream != nullptr && closes_cycle(stream, what, reach(dst, dspan), dspan)) return fail(cudaErrorLaunchTimeout);
  if (d_dev) ll128_count(reinterpret_cast<uintptr_t>(dst), dpitch, width, height);
  push(stream, &copy2d_run, new Copy2DJob{reach(dst, dspan), reach(src, sspan), dpitch, spitch, width, height},
       &copy2d_drop, what, false);
  return cudaSuccess;
}

void agoq_emu_watch_ll128(const void* dev, size_t bytes) {
  Session lk;
  ll128_lo = reinterpret_cast<uintptr_t>(dev);
  ll128_hi = bytes == 0 ? ll128_lo : ll128_lo + bytes;
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
  if (capture_refuses("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
  cudaError_t res = wait_device("cudaDeviceSynchronize", false, [] { return drain_all(false); }, [] { return false; });
  return res == cudaSuccess ? cudaSuccess : fail(res);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  Session lk; /* every runtime call takes the context lock */
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
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorFunctionNotLoaded: return "cudaErrorFunctionNotLoaded";
    case cudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  if (s == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  Session lk;
  if (capture_refuses("cudaStreamCreate")) return cudaErrorStreamCaptureUnsupported;
  *s = new agoq_emu_stream();
  (*s)->flags = flags;
  (*s)->priority = priority;
  (*s)->device = current_device;
  (*s)->ctx = cur_ctx();
  /* Round-robin over the hardware queues, whatever the priority: on an H200, NCCL's and
   * the plugin's greatest-priority streams shared queues as any others did. */
  (*s)->queue = next_queue++ % (unsigned)queue_count();
  streams.push_back(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Session lk;
  if (capture_refuses("cudaStreamDestroy")) return cudaErrorStreamCaptureUnsupported;
  if (s == nullptr || s->destroyed) return fail(cudaErrorInvalidResourceHandle);
  if (ctx_refuses(s->ctx, "cudaStreamDestroy")) return cudaErrorInvalidResourceHandle;
  /* As on a GPU: queued work still runs; the object goes once it has (reap). */
  s->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  Session lk;
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s == nullptr) return cudaSuccess; /* legacy work ran when it was issued */
  if (ctx_refuses(s->ctx, "cudaStreamQuery")) return cudaErrorInvalidResourceHandle;
  if (s->done_seq < s->last_seq) run_one(s);
  return s->done_seq >= s->last_seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Session lk;
  if (capture_refuses("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s == nullptr) return cudaSuccess;
  if (ctx_refuses(s->ctx, "cudaStreamSynchronize")) return cudaErrorInvalidResourceHandle;
  /* A queued wait naming it keeps it from being reaped while the lock is let go. */
  s->waiters++;
  uint64_t seq = s->last_seq;
  cudaError_t res = wait_device("cudaStreamSynchronize", false, [s, seq] { return s->done_seq >= seq; },
                                [s, seq] { return stream_drain(s, seq); });
  s->waiters--;
  return res == cudaSuccess ? cudaSuccess : fail(res);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  Session lk;
  if (!stream_ok(s) || e == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  if ((s != nullptr && ctx_refuses(s->ctx, "cudaStreamWaitEvent")) || ctx_refuses(e->ctx, "cudaStreamWaitEvent"))
    return cudaErrorInvalidResourceHandle;
  /* s's later work waits for e's newest record at this call (none: nothing to wait for). */
  if (e->seq == 0 || event_done(e, e->seq)) return cudaSuccess;
  if (s == nullptr) {
    stream_drain(e->stream, e->seq);
    return cudaSuccess;
  }
  push(s, nullptr, nullptr, nullptr, "an event wait", false, e->stream, e->seq);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  Session lk;
  if (capture_refuses("cudaEventCreate")) return cudaErrorStreamCaptureUnsupported;
  *e = new agoq_emu_event();
  n_live_events++;
  (*e)->flags = flags;
  (*e)->device = current_device;
  (*e)->ctx = cur_ctx();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (capture_refuses("cudaEventDestroy")) return cudaErrorStreamCaptureUnsupported;
  if (ctx_refuses(e->ctx, "cudaEventDestroy")) return cudaErrorInvalidResourceHandle;
  if (e->pending > 0) /* a queued record still writes into it */
    (void)wait_device("cudaEventDestroy", false, [e] { return e->pending == 0; }, [] { return drain_all(false); });
  delete e;
  n_live_events--;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (ctx_refuses(e->ctx, "cudaEventRecord") || (stream != nullptr && ctx_refuses(stream->ctx, "cudaEventRecord")))
    return cudaErrorInvalidResourceHandle;
  const int stream_device = stream != nullptr ? stream->device : current_device;
  if (e->device != stream_device) {
    /* CUDA: an event and the stream it is recorded on must belong to one device. */
    fprintf(stderr, "agoq CUDA emulation: an event of device %d recorded on a stream of device %d: refused\n",
            e->device, stream_device);
    return fail(cudaErrorInvalidResourceHandle);
  }
  uint64_t seq = next_seq;
  e->seq = seq;
  e->stream = stream;
  e->pending++;
  push(stream, &record_run, new RecordJob{e, seq}, &record_drop, "an event record");
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (ctx_refuses(e->ctx, "cudaEventQuery")) return cudaErrorInvalidResourceHandle;
  if (!event_done(e, e->seq)) run_one(e->stream);
  return event_done(e, e->seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Session lk;
  if (capture_refuses("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
  if (ctx_refuses(e->ctx, "cudaEventSynchronize")) return cudaErrorInvalidResourceHandle;
  uint64_t seq = e->seq;
  agoq_emu_stream* s = e->stream;
  if (s == nullptr || event_done(e, seq)) return cudaSuccess;
  s->waiters++;
  cudaError_t res = wait_device("cudaEventSynchronize", false, [e, seq] { return event_done(e, seq); },
                                [s, seq] { return stream_drain(s, seq); });
  s->waiters--;
  return res == cudaSuccess ? cudaSuccess : fail(res);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  Session lk;
  if (stream == nullptr || stream->destroyed || mode < cudaStreamCaptureModeGlobal ||
      mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  if (capture_of(stream) != nullptr) return fail(cudaErrorIllegalState);
  captures.push_back(Capture{stream, mode, this_thread(), false});
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Session lk;
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  Capture* c = capture_of(stream);
  if (c == nullptr) return fail(cudaErrorIllegalState);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != this_thread())
    return fail(cudaErrorStreamCaptureWrongThread);
  const bool invalidated = c->invalidated;
  captures.erase(captures.begin() + (c - captures.data()));
  if (invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = new agoq_emu_graph();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  Session lk;
  if (status == nullptr || !stream_ok(stream)) return fail(cudaErrorInvalidValue);
  const Capture* c = stream != nullptr ? capture_of(stream) : nullptr;
  *status = c == nullptr       ? cudaStreamCaptureStatusNone
            : c->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

/* The thread's own mode: no context lock (it is the thread's state, not the context's). */
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  const cudaStreamCaptureMode old = capture_mode;
  capture_mode = *mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  Session lk;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (ctx_refuses(start->ctx, "cudaEventElapsedTime") || ctx_refuses(end->ctx, "cudaEventElapsedTime"))
    return cudaErrorInvalidResourceHandle;
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
  c->ll128_flag_early = n_ll128_early;
  c->live_events = n_live_events;
  c->kernel_launches = n_launches;
  c->kernels_refused = n_refused;
  c->deadlocks = n_deadlocks;
  c->capture_refused = n_capture_refused;
  for (const auto& kv : allocs) {
    (kv.second.device ? c->device_allocs : c->pinned_allocs)++;
    if (!kv.second.device) c->pinned_bytes += kv.second.size;
  }
}

int agoq_emu_peek(void* host, const void* dev, size_t bytes) {
  Session lk;
  if (host == nullptr || !is_device(dev, bytes)) return -1;
  if (bytes > 0) memcpy(host, reach(dev, bytes), bytes);
  return 0;
}

void agoq_emu_clock_set(double (*clock)(void)) { g_clock.store(clock); }

cudaError_t agoq_emu_wait_item(cudaStream_t stream, const void* word, unsigned value, agoq_emu_wait** item) {
  if (item == nullptr || word == nullptr || stream == nullptr || reinterpret_cast<uintptr_t>(word) % 4 != 0)
    return fail(cudaErrorInvalidValue);
  *item = nullptr;
  Session lk;
  if (!stream_ok(stream)) return fail(cudaErrorInvalidResourceHandle);
  const Alloc* a = find(word, sizeof(unsigned), nullptr);
  if (a == nullptr) return fail(cudaErrorInvalidValue); /* a kernel reaches device or pinned memory only */
  agoq_emu_wait* w = new agoq_emu_wait();
  w->word = reinterpret_cast<const unsigned*>(reach(word, sizeof(unsigned)));
  w->value = value;
  w->device_word = a->device;
  w->exported = a->exported;
  w->stream = stream;
  wait_items.push_back(w);
  push(stream, nullptr, nullptr, nullptr, "NCCL's kernel (a wait item)", false, nullptr, 0, w);
  *item = w;
  return cudaSuccess;
}

enum agoq_emu_wait_state agoq_emu_wait_item_state(const agoq_emu_wait* item) {
  Session lk;
  return item->state;
}

void agoq_emu_wait_item_release(agoq_emu_wait* item) {
  if (item == nullptr) return;
  Session lk;
  item_unref(item);
}

void agoq_emu_deadlock_text(char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  Session lk;
  snprintf(buf, len, "%s", last_deadlock.c_str());
}

void agoq_emu_max_connections_set(int n) {
  Session lk;
  n_queues = n == 0 ? 0 : n < 1 ? 1 : n > kMaxQueues ? kMaxQueues : n;
  if (n_queues == 0) (void)queue_count();
  next_queue = 0;
}

int agoq_emu_context_lock_holders_waiting(void) { return n_context_waiting.load(); }

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
    const_cast<Alloc&>(a).exported = true;
    *static_cast<int*>(handle) = fd;
    return 0;
  }
  return 1;
}

/* The driver's cuCtxGetCurrent: the calling thread's context, NULL where it is bound to none. */
static int emu_ctx_get_current(agoq_emu_context** pctx) {
  if (pctx == nullptr) return 1; /* CUDA_ERROR_INVALID_VALUE */
  Session lk;
  *pctx = bound_ctx;
  return 0;
}

/* The driver's cuCtxSetCurrent: binds ctx (NULL: none) to the calling thread. */
static int emu_ctx_set_current(agoq_emu_context* ctx) {
  Session lk;
  if (ctx != nullptr && !ctx_known(ctx)) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  bound_ctx = ctx;
  if (ctx != nullptr) current_device = ctx->device;
  return 0;
}

void* agoq_emu_context_create(int device) {
  Session lk;
  if (device < 0 || device >= device_count()) return nullptr;
  private_ctx.push_back(std::make_unique<agoq_emu_context>());
  agoq_emu_context* c = private_ctx.back().get();
  c->device = device;
  bound_ctx = c; /* cuCtxCreate makes it current */
  current_device = device;
  return c;
}

int agoq_emu_context_set(void* ctx) { return emu_ctx_set_current(static_cast<agoq_emu_context*>(ctx)); }

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction);
  Session lk;
  cur_ctx()->kernels.loaded.insert(func);
  memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024; /* the fiber scheduler's limit */
  return cudaSuccess;
}

int agoq_emu_kernels_get(int device, unsigned long long* loaded, unsigned long long* launched) {
  Session lk;
  if (device < 0 || device >= device_count()) return -1;
  const DeviceKernels& dk = primary_of(device)->kernels;
  if (loaded != nullptr) *loaded = dk.loaded.size();
  if (launched != nullptr) *launched = dk.launched.size();
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

int agoq_emu_devices_set(int n) {
  Session lk;
  const int old = device_count();
  if (n >= 1 && n <= kMaxDevices) n_devices = n;
  if (current_device >= n_devices) {
    current_device = 0;
    bound_ctx = nullptr;
  }
  return old;
}

void agoq_emu_kernels_forget(void) {
  Session lk;
  for (agoq_emu_context& c : primary_ctx) c.kernels = DeviceKernels();
  for (auto& c : private_ctx) c->kernels = DeviceKernels();
  launches_by_name.clear();
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int cuda_version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* status) {
  Session lk; /* every runtime call takes the context lock */
  (void)cuda_version;
  if (symbol == nullptr || fn == nullptr || flags != cudaEnableDefault) return fail(cudaErrorInvalidValue);
  *fn = nullptr;
  if (strcmp(symbol, "cuMemGetAddressRange") == 0) {
    *fn = reinterpret_cast<void*>(&emu_mem_get_address_range);
  } else if (strcmp(symbol, "cuMemGetHandleForAddressRange") == 0) {
    *fn = reinterpret_cast<void*>(&emu_mem_get_handle_for_address_range);
  } else if (strcmp(symbol, "cuCtxGetCurrent") == 0) {
    *fn = reinterpret_cast<void*>(&emu_ctx_get_current);
  } else if (strcmp(symbol, "cuCtxSetCurrent") == 0) {
    *fn = reinterpret_cast<void*>(&emu_ctx_set_current);
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
