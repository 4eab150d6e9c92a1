/* gpu_hazards: settles on a real GPU the two driver behaviours that decide whether agoq's
 * device path can hang inside NCCL (issue 27, items 2, 3 and 10). Each run is one process, one
 * test, one verdict line; tools/gpu-check.sh runs the matrix under timeouts.
 *
 *   gpu_hazards facts
 *       driver and runtime versions, the device, its GPUDirect RDMA attributes, the module
 *       loading mode the driver reports, CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS.
 *
 *   gpu_hazards hwq [--streams S] [--priority greatest|default]
 *       Hardware queues. NCCL's kernel K1 runs on NCCL's stream and waits for data that only
 *       the plugin's copy X brings; K2, NCCL's next kernel, is queued behind K1 on the same
 *       stream. Streams share CUDA_DEVICE_MAX_CONNECTIONS in-order hardware queues: where the
 *       plugin's stream shares NCCL's queue, X sits behind K2, K2 behind K1, K1 waits for X.
 *       The plugin's streams are made after NCCL's (one per link, greatest priority as
 *       plugin/gpu/agoq_gpu_link.c makes them); for each one in turn: K1, K2, X, and whether
 *       K1 saw X's write before its own time limit. K1 bounds its own wait (globaltimer), so a
 *       blocked case ends by itself instead of hanging the GPU.
 *
 *   gpu_hazards ctx --action lazy|free|none
 *       Context lock. K1 runs and waits for X (as above, X on a stream of its own queue is
 *       enough when nothing else interferes). While K1 runs, another thread (PyTorch's, say)
 *       does ACTION: "lazy" launches a kernel never launched before (under
 *       CUDA_MODULE_LOADING=LAZY its first launch loads it), "free" calls cudaFree, "none" does
 *       nothing. 200 ms later this thread (NCCL's proxy, in the plugin's place) issues X. If
 *       the action waits for the device while holding the context's lock, X's call blocks
 *       until K1 gives up: in a real process K1 never gives up, and that is a hang.
 *
 * Output: lines "fact: ..." and one "hazard: <test> <settings>: OK|BLOCKED ..." line; exit 0
 * when the test ran (whatever the verdict), 2 when it could not run.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      printf("hazard: error: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),        \
             __FILE__, __LINE__);                                                            \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__device__ static unsigned long long gtimer(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* K1: says it started (mapped host word), then waits for *flag == want or limit_ns.
 * out[0] = 1 seen, 0 gave up; out[1] = ns waited. */
__global__ void k1_wait(volatile int* flag, int want, unsigned long long limit_ns,
                        volatile int* started, unsigned long long* out) {
  unsigned long long t0 = gtimer();
  *started = 1;
  __threadfence_system();
  int seen = 0;
  for (;;) {
    if (*flag == want) {
      seen = 1;
      break;
    }
    if (gtimer() - t0 > limit_ns) break;
  }
  out[0] = (unsigned long long)seen;
  out[1] = gtimer() - t0;
}

__global__ void k2_next(int* x) {
  if (x) atomicAdd(x, 1);
}

/* Launched only by "ctx --action lazy", on the other thread, while K1 runs: under lazy loading
 * this first launch is what loads it. */
__global__ void cold_kernel(int* x) {
  if (x) atomicAdd(x, 7);
}

static const char* envs(const char* n) {
  const char* v = getenv(n);
  return v ? v : "(unset)";
}

typedef int (*get_loading_mode_fn)(int*);

static void facts(void) {
  int drv = 0, rt = 0, dev = 0;
  CHECK(cudaDriverGetVersion(&drv));
  CHECK(cudaRuntimeGetVersion(&rt));
  CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, dev));
  printf("fact: driver CUDA %d.%d, runtime %d.%d, device %d %s (sm_%d%d, %d SMs)\n", drv / 1000,
         drv % 1000 / 10, rt / 1000, rt % 1000 / 10, dev, p.name, p.major, p.minor,
         p.multiProcessorCount);
  int gdr = -1, flush = -1, order = -1, dmabuf = -1;
  cudaDeviceGetAttribute(&dmabuf, (cudaDeviceAttr)124 /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */, dev);
  cudaDeviceGetAttribute(&gdr, cudaDevAttrGPUDirectRDMASupported, dev);
  cudaDeviceGetAttribute(&flush, cudaDevAttrGPUDirectRDMAFlushWritesOptions, dev);
  cudaDeviceGetAttribute(&order, cudaDevAttrGPUDirectRDMAWritesOrdering, dev);
  cudaGetLastError();
  printf("fact: cudaDevAttrGPUDirectRDMASupported=%d FlushWritesOptions=%d WritesOrdering=%d "
         "DmaBufSupported=%d\n", gdr, flush, order, dmabuf);
  void* fn = NULL;
  cudaDriverEntryPointQueryResult q;
  int mode = -1;
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault,
                                       &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess && fn) {
    ((get_loading_mode_fn)fn)(&mode);
  }
  cudaGetLastError();
  /* CUmoduleLoadingMode: 1 eager, 2 lazy */
  printf("fact: module loading mode reported by the driver: %s; CUDA_MODULE_LOADING=%s "
         "CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
         mode == 1 ? "EAGER" : mode == 2 ? "LAZY" : "unknown", envs("CUDA_MODULE_LOADING"),
         envs("CUDA_DEVICE_MAX_CONNECTIONS"));
}

struct shared_words {
  int* flag;            /* device */
  int* host_value;      /* pinned */
  int* started;         /* mapped pinned */
  unsigned long long* out; /* mapped pinned, 2 words */
};

static void words_make(struct shared_words* w) {
  CHECK(cudaMalloc((void**)&w->flag, sizeof(int)));
  CHECK(cudaMemset(w->flag, 0, sizeof(int)));
  CHECK(cudaHostAlloc((void**)&w->host_value, sizeof(int), cudaHostAllocDefault));
  CHECK(cudaHostAlloc((void**)&w->started, sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostAlloc((void**)&w->out, 2 * sizeof(unsigned long long), cudaHostAllocMapped));
  CHECK(cudaDeviceSynchronize());
}

static int wait_started(volatile int* started, double limit_s) {
  double t0 = now_s();
  while (!*started) {
    if (now_s() - t0 > limit_s) return 0;
    usleep(100);
  }
  return 1;
}

static int hwq(int nstreams, int greatest) {
  const unsigned long long limit_ns = 1500ull * 1000 * 1000;
  struct shared_words w;
  words_make(&w);
  int* counter;
  CHECK(cudaMalloc((void**)&counter, sizeof(int)));
  cudaStream_t nccl;
  CHECK(cudaStreamCreateWithFlags(&nccl, cudaStreamNonBlocking));
  int least = 0, great = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &great));
  cudaStream_t* links = (cudaStream_t*)calloc((size_t)nstreams, sizeof *links);
  for (int i = 0; i < nstreams; i++)
    CHECK(cudaStreamCreateWithPriority(&links[i], cudaStreamNonBlocking, greatest ? great : 0));
  char blocked[512] = "";
  int nblocked = 0;
  double worst_ok = 0;
  for (int i = 0; i < nstreams; i++) {
    CHECK(cudaMemset(w.flag, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    *w.started = 0;
    *w.host_value = i + 1;
    k1_wait<<<1, 1, 0, nccl>>>(w.flag, i + 1, limit_ns, w.started, w.out);
    CHECK(cudaGetLastError());
    k2_next<<<1, 1, 0, nccl>>>(counter);
    CHECK(cudaGetLastError());
    /* X is issued once K1 runs, as the plugin's copy is (NCCL's kernel is already waiting). */
    wait_started(w.started, 5.0);
    CHECK(cudaMemcpyAsync(w.flag, w.host_value, sizeof(int), cudaMemcpyHostToDevice, links[i]));
    CHECK(cudaStreamSynchronize(nccl));
    CHECK(cudaStreamSynchronize(links[i]));
    if (w.out[0] == 0) {
      nblocked++;
      size_t n = strlen(blocked);
      snprintf(blocked + n, sizeof blocked - n, "%s%d", n ? "," : "", i);
    } else if ((double)w.out[1] * 1e-9 > worst_ok) {
      worst_ok = (double)w.out[1] * 1e-9;
    }
  }
  printf("hazard: hwq CUDA_DEVICE_MAX_CONNECTIONS=%s priority=%s streams=%d: %s", 
         envs("CUDA_DEVICE_MAX_CONNECTIONS"), greatest ? "greatest" : "default", nstreams,
         nblocked ? "BLOCKED" : "OK");
  if (nblocked)
    printf(" (the copy on link stream(s) %s of 0..%d waited behind NCCL's next kernel until "
           "NCCL's running kernel gave up after %.1f s: %d of %d would hang)",
           blocked, nstreams - 1, (double)limit_ns * 1e-9, nblocked, nstreams);
  else
    printf(" (every copy reached the waiting kernel; slowest %.3f ms)", worst_ok * 1e3);
  printf("\n");
  return 0;
}

struct action_arg {
  const char* action;
  cudaStream_t stream;
  int* counter;
  void* to_free;
  double t0, t1;
  cudaError_t err;
};

static void* action_thread(void* p) {
  struct action_arg* a = (struct action_arg*)p;
  a->t0 = now_s();
  if (strcmp(a->action, "lazy") == 0) {
    cold_kernel<<<1, 1, 0, a->stream>>>(a->counter);
    a->err = cudaGetLastError();
  } else if (strcmp(a->action, "free") == 0) {
    a->err = cudaFree(a->to_free);
  } else {
    a->err = cudaSuccess;
  }
  a->t1 = now_s();
  return NULL;
}

static int ctx(const char* action) {
  const unsigned long long limit_ns = 3000ull * 1000 * 1000;
  struct shared_words w;
  words_make(&w);
  int* counter;
  CHECK(cudaMalloc((void**)&counter, sizeof(int)));
  void* victim;
  CHECK(cudaMalloc(&victim, 64 << 20));
  int least = 0, great = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &great));
  cudaStream_t nccl, link, other;
  CHECK(cudaStreamCreateWithFlags(&nccl, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithPriority(&link, cudaStreamNonBlocking, great));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  /* The other thread's streams and this process's kernels exist before the test: only the
   * action itself can be a first time. */
  k2_next<<<1, 1, 0, other>>>(counter);
  CHECK(cudaDeviceSynchronize());
  *w.started = 0;
  *w.host_value = 1;
  k1_wait<<<1, 1, 0, nccl>>>(w.flag, 1, limit_ns, w.started, w.out);
  CHECK(cudaGetLastError());
  if (!wait_started(w.started, 5.0)) {
    printf("hazard: error: the waiting kernel did not start within 5 s\n");
    return 2;
  }
  struct action_arg a = {action, other, counter, victim, 0, 0, cudaSuccess};
  pthread_t th;
  pthread_create(&th, NULL, action_thread, &a);
  usleep(200 * 1000);
  double x0 = now_s();
  cudaError_t xe = cudaMemcpyAsync(w.flag, w.host_value, sizeof(int), cudaMemcpyHostToDevice, link);
  double x1 = now_s();
  CHECK(cudaStreamSynchronize(nccl));
  pthread_join(th, NULL);
  CHECK(cudaDeviceSynchronize());
  int seen = (int)w.out[0];
  printf("hazard: ctx CUDA_MODULE_LOADING=%s action=%s: %s (the other thread's %s took %.3f s%s; "
         "the copy's call took %.3f s%s; the waiting kernel %s after %.3f s)\n",
         envs("CUDA_MODULE_LOADING"), action, seen && xe == cudaSuccess ? "OK" : "BLOCKED",
         action, a.t1 - a.t0, a.err == cudaSuccess ? "" : " and failed", x1 - x0,
         xe == cudaSuccess ? "" : " and failed", seen ? "saw the copy" : "gave up",
         (double)w.out[1] * 1e-9);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_hazards facts | hwq [--streams S] [--priority greatest|default] | "
                    "ctx --action lazy|free|none\n");
    return 2;
  }
  const char* test = argv[1];
  int streams = 18, greatest = 1;
  const char* action = "none";
  for (int i = 2; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--streams") == 0) streams = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--priority") == 0) greatest = strcmp(argv[i + 1], "default") != 0;
    else if (strcmp(argv[i], "--action") == 0) action = argv[i + 1];
    else {
      fprintf(stderr, "gpu_hazards: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (streams < 1 || streams > 64) streams = 18;
  CHECK(cudaSetDevice(0));
  if (strcmp(test, "facts") == 0) {
    facts();
    return 0;
  }
  if (strcmp(test, "hwq") == 0) return hwq(streams, greatest);
  if (strcmp(test, "ctx") == 0) return ctx(action);
  fprintf(stderr, "gpu_hazards: unknown test %s\n", test);
  return 2;
}
