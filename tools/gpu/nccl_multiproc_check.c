/*
 * N NCCL ranks as N processes on one GPU, without MPI.
 *
 * nccl-tests runs several processes only through MPI; a GPU host without MPI can still
 * check a net plugin end to end with this driver. It forks one process per rank, gives
 * each its own NCCL_HOSTID (so NCCL sees N "nodes" and all traffic goes through the net
 * plugin), shares rank 0's ncclUniqueId through shared memory, and runs AllReduce (float
 * sum) or a ring of Send/Recv over a range of sizes with exact correctness checks and
 * timing. The result table has nccl-tests' columns, so one parser reads both.
 *
 * libnccl and libcudart are dlopen'ed: the driver builds with a plain C compiler, with no
 * CUDA or NCCL headers, and fails cleanly (exit 77) where there is no GPU.
 *
 * Exit status: 0 all values correct, 1 wrong values, 2 error or timeout, 77 no GPU.
 */
#include <dlfcn.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agoq_args.h"
#include "abi/agoq_nccl_common.h"

#define EXIT_WRONG 1
#define EXIT_ERROR 2
#define EXIT_NO_GPU 77
#define MAX_RANKS 64
#define MAX_SIZES 64

/* ---- CUDA runtime and NCCL, declared from their stable C ABIs --------------------------- */

typedef int cuda_error;
typedef void* cuda_stream;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600
#define CUDA_MEMCPY_HOST_TO_DEVICE 1
#define CUDA_MEMCPY_DEVICE_TO_HOST 2

typedef struct {
  char internal[128];
} nccl_unique_id;
typedef void* nccl_comm;

typedef struct {
  cuda_error (*get_device_count)(int*);
  cuda_error (*set_device)(int);
  cuda_error (*malloc_)(void**, size_t);
  cuda_error (*free_)(void*);
  cuda_error (*memcpy_)(void*, const void*, size_t, int);
  cuda_error (*memset_)(void*, int, size_t);
  cuda_error (*stream_create)(cuda_stream*);
  cuda_error (*stream_destroy)(cuda_stream);
  cuda_error (*stream_query)(cuda_stream);
  cuda_error (*get_pci_bus_id)(char*, int, int);
  const char* (*get_error_string)(cuda_error);

  ncclResult_t (*get_version)(int*);
  ncclResult_t (*get_unique_id)(nccl_unique_id*);
  ncclResult_t (*comm_init_rank)(nccl_comm*, int, nccl_unique_id, int);
  ncclResult_t (*comm_destroy)(nccl_comm);
  ncclResult_t (*comm_get_async_error)(nccl_comm, ncclResult_t*);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, nccl_comm,
                             cuda_stream);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, nccl_comm, cuda_stream);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, nccl_comm, cuda_stream);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  const char* (*nccl_error_string)(ncclResult_t);
  const char* (*last_error)(nccl_comm);
} api;

/* ---- Options and shared state -------------------------------------------------------- */

typedef enum { TEST_ALL_REDUCE, TEST_SENDRECV } test_kind;

typedef struct {
  test_kind test;
  int nranks;
  size_t min_bytes, max_bytes;
  size_t factor;
  int iters, warmup;
  int device;
  int timeout_s;
  const char* nccl_path;
  const char* cudart_path;
  const char* hostid_prefix;
  const char* log_dir;
} options;

/* Lives in a MAP_SHARED mapping made before fork(): the unique id travels from rank 0 to
 * the others, and every rank's result per size travels to rank 0 and the parent. */
typedef struct {
  atomic_int id_state; /* 0 waiting, 1 ready, -1 rank 0 failed */
  nccl_unique_id id;
  pthread_barrier_t barrier;
  int nsizes;
  size_t bytes[MAX_SIZES];
  double time_us[MAX_RANKS][MAX_SIZES];
  uint64_t wrong[MAX_RANKS][MAX_SIZES];
  int done[MAX_RANKS][MAX_SIZES];
} shared_state;

static int g_rank = -1;

static void rank_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void rank_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[rank %d] ERROR: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
  va_end(ap);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char* text, size_t* out) {
  char* end = NULL;
  /* strtoull alone takes blanks, a sign (wrapping "-1") and an empty string. */
  if (text == NULL || !isdigit((unsigned char)text[0])) return -1;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return -1;
  unsigned long long mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ULL << 10;
  else if (*end == 'M' || *end == 'm') mult = 1ULL << 20;
  else if (*end == 'G' || *end == 'g') mult = 1ULL << 30;
  if (mult != 1) end++;
  if (*end != '\0' || v > SIZE_MAX / mult) return -1;
  *out = (size_t)(v * mult);
  return 0;
}

static int parse_int(const char* text, int lo, int hi, int* out) {
  long long v = 0;
  if (agoq_args_parse_ll(text, lo, hi, &v) != 0) return -1; /* the whole string, in range */
  *out = (int)v;
  return 0;
}

static void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s -t all_reduce|sendrecv [options]\n"
          "  -t, --test NAME        all_reduce (float sum) or sendrecv (ring: r -> r+1)\n"
          "  -N, --nranks N         processes, one rank each, all on one GPU (default 4)\n"
          "  -b, --minbytes SIZE    smallest message per rank, K/M/G suffixes (default 8)\n"
          "  -e, --maxbytes SIZE    largest message per rank (default 256M)\n"
          "  -f, --stepfactor F     size multiplier between steps (default 4)\n"
          "  -n, --iters N          timed iterations per size (default 20)\n"
          "  -w, --warmup N         untimed iterations per size (default 5)\n"
          "  -d, --device D         CUDA device every rank uses (default 0)\n"
          "  -T, --timeout S        whole-run limit in seconds; ranks are killed after it (600)\n"
          "      --nccl PATH        libnccl to dlopen (default libnccl.so.2)\n"
          "      --cudart PATH      libcudart to dlopen (default: libcudart.so.13, .so.12, .so)\n"
          "      --hostid-prefix S  rank r gets NCCL_HOSTID=S<r> (default agoq-node-)\n"
          "      --log-dir DIR      ranks other than 0 write stdout/stderr to DIR/rank<r>.log\n"
          "Exit: 0 correct, 1 wrong values, 2 error or timeout, 77 no usable GPU.\n",
          argv0);
}

static int parse_options(int argc, char** argv, options* o) {
  *o = (options){.test = TEST_ALL_REDUCE, .nranks = 4, .min_bytes = 8, .max_bytes = 256u << 20,
                 .factor = 4, .iters = 20, .warmup = 5, .device = 0, .timeout_s = 600,
                 .nccl_path = "libnccl.so.2", .cudart_path = NULL,
                 .hostid_prefix = "agoq-node-", .log_dir = NULL};
  enum { OPT_NCCL = 256, OPT_CUDART, OPT_HOSTID, OPT_LOGDIR };
  static const struct option longopts[] = {
      {"test", required_argument, NULL, 't'},       {"nranks", required_argument, NULL, 'N'},
      {"minbytes", required_argument, NULL, 'b'},   {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'}, {"iters", required_argument, NULL, 'n'},
      {"warmup", required_argument, NULL, 'w'},     {"device", required_argument, NULL, 'd'},
      {"timeout", required_argument, NULL, 'T'},    {"nccl", required_argument, NULL, OPT_NCCL},
      {"cudart", required_argument, NULL, OPT_CUDART},
      {"hostid-prefix", required_argument, NULL, OPT_HOSTID},
      {"log-dir", required_argument, NULL, OPT_LOGDIR},
      {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0}};
  int have_test = 0, c, factor = 0;
  while ((c = getopt_long(argc, argv, "t:N:b:e:f:n:w:d:T:h", longopts, NULL)) != -1) {
    int bad = 0;
    switch (c) {
      case 't':
        have_test = 1;
        if (strcmp(optarg, "all_reduce") == 0) o->test = TEST_ALL_REDUCE;
        else if (strcmp(optarg, "sendrecv") == 0) o->test = TEST_SENDRECV;
        else bad = 1;
        break;
      case 'N': bad = parse_int(optarg, 2, MAX_RANKS, &o->nranks); break;
      case 'b': bad = parse_size(optarg, &o->min_bytes); break;
      case 'e': bad = parse_size(optarg, &o->max_bytes); break;
      case 'f': bad = parse_int(optarg, 2, 1 << 20, &factor); o->factor = (size_t)factor; break;
      case 'n': bad = parse_int(optarg, 1, 1 << 20, &o->iters); break;
      case 'w': bad = parse_int(optarg, 0, 1 << 20, &o->warmup); break;
      case 'd': bad = parse_int(optarg, 0, 1 << 16, &o->device); break;
      case 'T': bad = parse_int(optarg, 1, 86400, &o->timeout_s); break;
      case OPT_NCCL: o->nccl_path = optarg; break;
      case OPT_CUDART: o->cudart_path = optarg; break;
      case OPT_HOSTID: o->hostid_prefix = optarg; break;
      case OPT_LOGDIR: o->log_dir = optarg; break;
      case 'h': usage(stdout, argv[0]); exit(0);
      default: usage(stderr, argv[0]); return -1;
    }
    if (bad) {
      fprintf(stderr, "%s: invalid value '%s' for -%c\n", argv[0], optarg, c < 256 ? c : '-');
      return -1;
    }
  }
  if (!have_test || optind != argc) {
    usage(stderr, argv[0]);
    return -1;
  }
  size_t elem = o->test == TEST_ALL_REDUCE ? sizeof(float) : 1;
  if (o->min_bytes < elem || o->min_bytes > o->max_bytes) {
    fprintf(stderr, "%s: need %zu <= minbytes <= maxbytes\n", argv[0], elem);
    return -1;
  }
  return 0;
}

/* ---- Loading the libraries ------------------------------------------------------------ */

static void* load_symbol(void* lib, const char* libname, const char* name, int* missing) {
  void* sym = dlsym(lib, name);
  if (sym == NULL) {
    rank_error("%s has no symbol %s", libname, name);
    (*missing)++;
  }
  return sym;
}

#define LOAD(lib, libname, field, name) \
  *(void**)(&a->field) = load_symbol(lib, libname, name, &missing)

static int load_cudart(const char* path, api* a) {
  static const char* const defaults[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  void* lib = NULL;
  const char* used = path;
  if (path != NULL) {
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  } else {
    for (size_t i = 0; lib == NULL && i < sizeof(defaults) / sizeof(defaults[0]); i++) {
      used = defaults[i];
      lib = dlopen(used, RTLD_NOW | RTLD_LOCAL);
    }
  }
  if (lib == NULL) {
    rank_error("cannot load the CUDA runtime: %s", dlerror());
    return -1;
  }
  int missing = 0;
  LOAD(lib, used, get_device_count, "cudaGetDeviceCount");
  LOAD(lib, used, set_device, "cudaSetDevice");
  LOAD(lib, used, malloc_, "cudaMalloc");
  LOAD(lib, used, free_, "cudaFree");
  LOAD(lib, used, memcpy_, "cudaMemcpy");
  LOAD(lib, used, memset_, "cudaMemset");
  LOAD(lib, used, stream_create, "cudaStreamCreate");
  LOAD(lib, used, stream_destroy, "cudaStreamDestroy");
  LOAD(lib, used, stream_query, "cudaStreamQuery");
  LOAD(lib, used, get_pci_bus_id, "cudaDeviceGetPCIBusId");
  LOAD(lib, used, get_error_string, "cudaGetErrorString");
  return missing == 0 ? 0 : -1;
}

static int load_nccl(const char* path, api* a) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    rank_error("cannot load NCCL: %s", dlerror());
    return -1;
  }
  int missing = 0;
  LOAD(lib, path, get_version, "ncclGetVersion");
  LOAD(lib, path, get_unique_id, "ncclGetUniqueId");
  LOAD(lib, path, comm_init_rank, "ncclCommInitRank");
  LOAD(lib, path, comm_destroy, "ncclCommDestroy");
  LOAD(lib, path, comm_get_async_error, "ncclCommGetAsyncError");
  LOAD(lib, path, all_reduce, "ncclAllReduce");
  LOAD(lib, path, send, "ncclSend");
  LOAD(lib, path, recv, "ncclRecv");
  LOAD(lib, path, group_start, "ncclGroupStart");
  LOAD(lib, path, group_end, "ncclGroupEnd");
  LOAD(lib, path, nccl_error_string, "ncclGetErrorString");
  LOAD(lib, path, last_error, "ncclGetLastError");
  return missing == 0 ? 0 : -1;
}

/* ---- Data: exact patterns -------------------------------------------------------------- */

static uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

/* Small integers: any summation order over <= 64 ranks is exact in float, so the check
 * can demand bit equality whatever algorithm NCCL picks. */
static float ar_value(int rank, size_t i) {
  return (float)((int)(mix32((uint32_t)i * 2654435761U + (uint32_t)rank * 40503U) % 251U) - 125);
}

/* Depends on the position and the sender, so lost, duplicated, shifted or misrouted
 * bytes all show. */
static uint8_t sr_value(int sender, size_t i) {
  return (uint8_t)mix32((uint32_t)i ^ ((uint32_t)sender << 26) ^ (uint32_t)(i >> 32));
}

/* ---- One rank ------------------------------------------------------------------------- */

typedef struct {
  const options* o;
  api* a;
  shared_state* shm;
  int rank;
  nccl_comm comm;
  cuda_stream stream;
  void* dsend;
  void* drecv;
  void* hsend;
  void* hexpect;
  void* hrecv;
  double deadline;
} rank_ctx;

#define CUDA_TRY(ctx, call)                                                                  \
  do {                                                                                       \
    cuda_error e_ = (call);                                                                  \
    if (e_ != CUDA_SUCCESS) {                                                                \
      rank_error("%s failed: %d %s", #call, e_, (ctx)->a->get_error_string(e_));           \
      return -1;                                                                             \
    }                                                                                        \
  } while (0)

#define NCCL_TRY(ctx, call)                                                                  \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      rank_error("%s failed: %d %s (%s)", #call, (int)r_, (ctx)->a->nccl_error_string(r_), \
                 (ctx)->a->last_error((ctx)->comm));                                        \
      return -1;                                                                             \
    }                                                                                        \
  } while (0)

/* Polls instead of blocking so an asynchronous NCCL error (a failed connection in the
 * plugin, say) or the deadline ends the wait rather than hanging it. */
static int wait_stream(rank_ctx* c) {
  for (unsigned spins = 0;; spins++) {
    cuda_error e = c->a->stream_query(c->stream);
    if (e == CUDA_SUCCESS) return 0;
    if (e != CUDA_ERROR_NOT_READY) {
      rank_error("cudaStreamQuery: %d %s", e, c->a->get_error_string(e));
      return -1;
    }
    ncclResult_t async = ncclSuccess;
    NCCL_TRY(c, c->a->comm_get_async_error(c->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      rank_error("NCCL asynchronous error %d %s (%s)", (int)async,
                 c->a->nccl_error_string(async), c->a->last_error(c->comm));
      return -1;
    }
    if ((spins & 1023U) == 0 && now_s() > c->deadline) {
      rank_error("timed out waiting for the GPU stream");
      return -1;
    }
  }
}

static int run_op(rank_ctx* c, size_t bytes) {
  const api* a = c->a;
  if (c->o->test == TEST_ALL_REDUCE) {
    NCCL_TRY(c, a->all_reduce(c->dsend, c->drecv, bytes / sizeof(float), ncclFloat32, ncclSum,
                              c->comm, c->stream));
    return 0;
  }
  int n = c->o->nranks;
  NCCL_TRY(c, a->group_start());
  NCCL_TRY(c, a->send(c->dsend, bytes, ncclUint8, (c->rank + 1) % n, c->comm, c->stream));
  NCCL_TRY(c, a->recv(c->drecv, bytes, ncclUint8, (c->rank + n - 1) % n, c->comm, c->stream));
  NCCL_TRY(c, a->group_end());
  return 0;
}

static int fill_patterns(rank_ctx* c) {
  const options* o = c->o;
  if (o->test == TEST_ALL_REDUCE) {
    size_t count = o->max_bytes / sizeof(float);
    float* send = c->hsend;
    float* expect = c->hexpect;
    for (size_t i = 0; i < count; i++) {
      float sum = 0.0f;
      for (int r = 0; r < o->nranks; r++) sum += ar_value(r, i);
      send[i] = ar_value(c->rank, i);
      expect[i] = sum;
    }
  } else {
    uint8_t* send = c->hsend;
    uint8_t* expect = c->hexpect;
    int prev = (c->rank + o->nranks - 1) % o->nranks;
    for (size_t i = 0; i < o->max_bytes; i++) {
      send[i] = sr_value(c->rank, i);
      expect[i] = sr_value(prev, i);
    }
  }
  CUDA_TRY(c, c->a->memcpy_(c->dsend, c->hsend, o->max_bytes, CUDA_MEMCPY_HOST_TO_DEVICE));
  return 0;
}

static uint64_t count_wrong(const rank_ctx* c, size_t bytes) {
  uint64_t wrong = 0;
  if (c->o->test == TEST_ALL_REDUCE) {
    /* Compared as bits: the expected sums are exact, and NaN must not compare equal. */
    const uint32_t* got = c->hrecv;
    const uint32_t* want = c->hexpect;
    for (size_t i = 0; i < bytes / sizeof(float); i++) wrong += got[i] != want[i];
  } else {
    const uint8_t* got = c->hrecv;
    const uint8_t* want = c->hexpect;
    for (size_t i = 0; i < bytes; i++) wrong += got[i] != want[i];
  }
  return wrong;
}

static int run_size(rank_ctx* c, int idx, size_t bytes) {
  const options* o = c->o;
  for (int i = 0; i < o->warmup; i++) {
    if (run_op(c, bytes) != 0) return -1;
  }
  if (wait_stream(c) != 0) return -1;

  double t0 = now_s();
  for (int i = 0; i < o->iters; i++) {
    if (run_op(c, bytes) != 0) return -1;
  }
  if (wait_stream(c) != 0) return -1;
  double time_us = (now_s() - t0) * 1e6 / o->iters;

  /* A separate, checked operation into a poisoned buffer (0xff bytes are NaN as float),
   * so stale results from the timed loop cannot pass for fresh ones. */
  CUDA_TRY(c, c->a->memset_(c->drecv, 0xff, bytes));
  if (run_op(c, bytes) != 0 || wait_stream(c) != 0) return -1;
  CUDA_TRY(c, c->a->memcpy_(c->hrecv, c->drecv, bytes, CUDA_MEMCPY_DEVICE_TO_HOST));

  c->shm->time_us[c->rank][idx] = time_us;
  c->shm->wrong[c->rank][idx] = count_wrong(c, bytes);
  c->shm->done[c->rank][idx] = 1;
  return 0;
}

static const char* test_name(test_kind t) {
  return t == TEST_ALL_REDUCE ? "all_reduce" : "sendrecv";
}

/* nccl-tests' definitions: AllReduce moves 2(n-1)/n of the buffer per rank over the
 * bottleneck link; a send/recv pair moves the buffer once. */
static double bus_factor(const options* o) {
  return o->test == TEST_ALL_REDUCE ? 2.0 * (o->nranks - 1) / o->nranks : 1.0;
}

static void print_row(const options* o, const shared_state* shm, int idx) {
  size_t bytes = shm->bytes[idx];
  double t = 0;
  uint64_t wrong = 0;
  for (int r = 0; r < o->nranks; r++) {
    t += shm->time_us[r][idx];
    wrong += shm->wrong[r][idx];
  }
  t /= o->nranks;
  double algbw = t > 0 ? (double)bytes / t / 1e3 : 0; /* bytes/us/1e3 = GB/s */
  int elem = o->test == TEST_ALL_REDUCE ? (int)sizeof(float) : 1;
  printf("%12zu  %12zu  %8s  %6s  %6d  %9.1f  %7.3f  %7.3f  %6" PRIu64 "\n", bytes,
         bytes / (size_t)elem, o->test == TEST_ALL_REDUCE ? "float" : "uint8",
         o->test == TEST_ALL_REDUCE ? "sum" : "none", -1, t, algbw, algbw * bus_factor(o),
         wrong);
  fflush(stdout);
}

static int rank_body(rank_ctx* c) {
  const options* o = c->o;
  api* a = c->a;
  shared_state* shm = c->shm;

  int ndev = 0;
  cuda_error e = a->get_device_count(&ndev);
  if (e != CUDA_SUCCESS || ndev <= o->device) {
    fprintf(stderr, "[rank %d] no usable CUDA device %d: cudaGetDeviceCount -> %d (%s), %d visible\n",
            c->rank, o->device, e, a->get_error_string(e), e == CUDA_SUCCESS ? ndev : 0);
    return EXIT_NO_GPU;
  }
  CUDA_TRY(c, a->set_device(o->device));

  if (c->rank == 0) {
    int version = 0;
    char bus[32] = "?";
    (void)a->get_version(&version);
    (void)a->get_pci_bus_id(bus, (int)sizeof(bus), o->device);
    printf("# nccl_multiproc_check: %s, %d processes on CUDA device %d (%s), NCCL %d\n",
           test_name(o->test), o->nranks, o->device, bus, version);
    printf("# sizes %zu..%zu x%zu, %d warmup + %d timed iterations, hostids %s0..%d\n",
           o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->hostid_prefix,
           o->nranks - 1);
    fflush(stdout);
    nccl_unique_id id;
    NCCL_TRY(c, a->get_unique_id(&id));
    shm->id = id;
    atomic_store_explicit(&shm->id_state, 1, memory_order_release);
  } else {
    int state;
    while ((state = atomic_load_explicit(&shm->id_state, memory_order_acquire)) == 0) {
      if (now_s() > c->deadline) {
        rank_error("timed out waiting for rank 0's unique id");
        return -1;
      }
      usleep(1000);
    }
    if (state < 0) return -1;
  }

  NCCL_TRY(c, a->comm_init_rank(&c->comm, o->nranks, shm->id, c->rank));
  CUDA_TRY(c, a->stream_create(&c->stream));
  CUDA_TRY(c, a->malloc_(&c->dsend, o->max_bytes));
  CUDA_TRY(c, a->malloc_(&c->drecv, o->max_bytes));
  c->hsend = malloc(o->max_bytes);
  c->hexpect = malloc(o->max_bytes);
  c->hrecv = malloc(o->max_bytes);
  if (c->hsend == NULL || c->hexpect == NULL || c->hrecv == NULL) {
    rank_error("out of host memory for %zu-byte buffers", o->max_bytes);
    return -1;
  }
  if (fill_patterns(c) != 0) return -1;

  if (c->rank == 0) {
    printf("#\n#%11s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong");
    printf("#%11s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
  }
  for (int idx = 0; idx < shm->nsizes; idx++) {
    if (run_size(c, idx, shm->bytes[idx]) != 0) return -1;
    /* Everyone's numbers for this size are in shared memory before rank 0 prints them. */
    int rc = pthread_barrier_wait(&shm->barrier);
    if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) {
      rank_error("pthread_barrier_wait: %s", strerror(rc));
      return -1;
    }
    if (c->rank == 0) print_row(o, shm, idx);
  }
  return 0;
}

static int rank_main(const options* o, shared_state* shm, int rank, double deadline) {
  g_rank = rank;
  char hostid[256];
  snprintf(hostid, sizeof(hostid), "%s%d", o->hostid_prefix, rank);
  /* Before NCCL is loaded: it reads NCCL_HOSTID once per process. */
  if (setenv("NCCL_HOSTID", hostid, 1) != 0) return EXIT_ERROR;

  if (o->log_dir != NULL && rank != 0) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank%d.log", o->log_dir, rank);
    if (freopen(path, "w", stdout) == NULL || dup2(fileno(stdout), STDERR_FILENO) < 0) {
      rank_error("cannot write %s: %s", path, strerror(errno));
      return EXIT_ERROR;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
  }

  api a;
  memset(&a, 0, sizeof(a));
  rank_ctx c = {.o = o, .a = &a, .shm = shm, .rank = rank, .deadline = deadline};
  int rc = EXIT_ERROR;
  if (load_cudart(o->cudart_path, &a) == 0 && load_nccl(o->nccl_path, &a) == 0) {
    rc = rank_body(&c);
    if (rc == -1) rc = EXIT_ERROR;
  }
  if (rank == 0 && atomic_load(&shm->id_state) == 0) {
    atomic_store(&shm->id_state, -1); /* release the waiting ranks */
  }
  if (rc == 0) {
    for (int idx = 0; idx < shm->nsizes; idx++) {
      if (shm->wrong[rank][idx] != 0) rc = EXIT_WRONG;
    }
    if (c.comm != NULL && a.comm_destroy(c.comm) != ncclSuccess) rc = EXIT_ERROR;
  }
  /* Device and host memory go with the process; on error paths ranks may still be
   * inside NCCL, so nothing else is torn down. */
  fflush(stdout);
  fflush(stderr);
  return rc;
}

/* ---- The launcher -------------------------------------------------------------------- */

static void kill_all(const pid_t* pids, const int* alive, int n, int sig) {
  for (int r = 0; r < n; r++) {
    if (alive[r]) kill(pids[r], sig);
  }
}

int main(int argc, char** argv) {
  options o;
  if (parse_options(argc, argv, &o) != 0) return EXIT_ERROR;

  shared_state* shm = mmap(NULL, sizeof(*shm), PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) {
    perror("mmap");
    return EXIT_ERROR;
  }
  memset(shm, 0, sizeof(*shm));
  atomic_init(&shm->id_state, 0);
  for (size_t b = o.min_bytes; b <= o.max_bytes && shm->nsizes < MAX_SIZES; b *= o.factor) {
    shm->bytes[shm->nsizes++] = o.test == TEST_ALL_REDUCE ? b / sizeof(float) * sizeof(float) : b;
    if (b > SIZE_MAX / o.factor) break;
  }
  pthread_barrierattr_t battr;
  if (pthread_barrierattr_init(&battr) != 0 ||
      pthread_barrierattr_setpshared(&battr, PTHREAD_PROCESS_SHARED) != 0 ||
      pthread_barrier_init(&shm->barrier, &battr, (unsigned)o.nranks) != 0) {
    fprintf(stderr, "cannot create a process-shared barrier\n");
    return EXIT_ERROR;
  }
  fflush(stdout);
  fflush(stderr);

  double deadline = now_s() + o.timeout_s;
  pid_t pids[MAX_RANKS];
  int alive[MAX_RANKS] = {0};
  int status[MAX_RANKS];
  for (int r = 0; r < o.nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      kill_all(pids, alive, r, SIGKILL);
      return EXIT_ERROR;
    }
    if (pid == 0) _exit(rank_main(&o, shm, r, deadline));
    pids[r] = pid;
    alive[r] = 1;
    status[r] = -1;
  }

  /* Reap ranks; the first failure or the deadline ends the others, which would otherwise
   * wait forever for a dead peer inside NCCL or at the barrier. */
  int remaining = o.nranks, timed_out = 0, failed = 0;
  while (remaining > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid < 0 && errno != EINTR) {
      perror("waitpid");
      break;
    }
    if (pid > 0) {
      for (int r = 0; r < o.nranks; r++) {
        if (pids[r] != pid || !alive[r]) continue;
        alive[r] = 0;
        remaining--;
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        /* EXIT_NO_GPU is not a failure to stop the others for: they find the same. */
        if (status[r] != 0 && status[r] != EXIT_WRONG && status[r] != EXIT_NO_GPU && !failed) {
          failed = 1;
          fprintf(stderr, "rank %d ended with status %d; stopping the other ranks\n", r,
                  status[r]);
          kill_all(pids, alive, o.nranks, SIGKILL);
        }
      }
      continue;
    }
    if (!timed_out && now_s() > deadline + 5) {
      timed_out = 1;
      fprintf(stderr, "timeout after %d s; killing the ranks\n", o.timeout_s);
      kill_all(pids, alive, o.nranks, SIGKILL);
    }
    usleep(10000);
  }

  uint64_t wrong = 0;
  double busbw_sum = 0;
  int complete = 0;
  for (int idx = 0; idx < shm->nsizes; idx++) {
    int all = 1;
    double t = 0;
    for (int r = 0; r < o.nranks; r++) {
      all &= shm->done[r][idx];
      wrong += shm->wrong[r][idx];
      t += shm->time_us[r][idx];
    }
    if (!all) continue;
    complete++;
    t /= o.nranks;
    busbw_sum += t > 0 ? (double)shm->bytes[idx] / t / 1e3 * bus_factor(&o) : 0;
  }
  int no_gpu = 1, any_error = timed_out;
  for (int r = 0; r < o.nranks; r++) {
    if (status[r] != EXIT_NO_GPU) no_gpu = 0;
    if (status[r] != 0 && status[r] != EXIT_WRONG) any_error = 1;
  }
  printf("# Out of bounds values : %" PRIu64 " %s\n", wrong, wrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g\n", complete ? busbw_sum / complete : 0.0);
  printf("# Sizes completed      : %d of %d\n", complete, shm->nsizes);
  if (no_gpu) {
    printf("# No usable GPU: skipped\n");
    return EXIT_NO_GPU;
  }
  if (any_error || complete != shm->nsizes) {
    printf("# FAILED: a rank ended with an error or the run timed out\n");
    return EXIT_ERROR;
  }
  return wrong ? EXIT_WRONG : 0;
}
