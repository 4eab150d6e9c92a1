/*
 * A stand-in for an nccl-tests benchmark (all_reduce_perf, reduce_scatter_perf,
 * all_gather_perf, sendrecv_perf), built by this folder's Makefile with the MPI under test,
 * for the tests of tools/gpu-check.sh's MPI launcher on machines without a GPU.
 *
 * It does what the script relies on nccl-tests doing, and nothing more: MPI starts the
 * ranks and carries the ncclUniqueId (MPI_Bcast), libcudart and libnccl come from
 * LD_LIBRARY_PATH (here the fakes of tools/gpu/fake, dlopen'ed), NCCL moves the data, the
 * output has nccl-tests' table, footer and exit status (7 when values are wrong), and a
 * CUDA start-up failure is reported in nccl-tests' words ("<host>: Test CUDA failure
 * <file>:<line> '<cudaGetErrorString>'", exit 2). It also checks what only the launcher
 * can get wrong: every rank must see its own NCCL_HOSTID, or NCCL would merge the ranks
 * into one node and no byte would go through the network plugin.
 *
 * Options (nccl-tests'): -b min bytes, -e max bytes, -f factor, -n iterations, -w warm-up
 * iterations, -g GPUs per rank (must be 1), -c check (0/1). Sizes take K/M/G suffixes.
 */
#include <dlfcn.h>
#include <getopt.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "abi/agoq_nccl_common.h"

#ifndef FAKE_TEST
#error "build with -DFAKE_TEST='\"all_reduce\"' (or reduce_scatter, all_gather, sendrecv)"
#endif

#define EXIT_CUDA 2
#define EXIT_NCCL 3
#define EXIT_USAGE 6
#define EXIT_WRONG 7 /* nccl-tests' testNumResults */

typedef struct {
  char internal[128];
} nccl_unique_id;
typedef void* nccl_comm;

typedef enum { T_ALL_REDUCE, T_REDUCE_SCATTER, T_ALL_GATHER, T_SENDRECV } test_kind;

static struct {
  int (*get_device_count)(int*);
  const char* (*get_error_string)(int);
  ncclResult_t (*get_unique_id)(nccl_unique_id*);
  ncclResult_t (*comm_init_rank)(nccl_comm*, int, nccl_unique_id, int);
  ncclResult_t (*comm_destroy)(nccl_comm);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, nccl_comm, void*);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, nccl_comm,
                                 void*);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, nccl_comm, void*);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, nccl_comm, void*);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, nccl_comm, void*);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
} api;

static char host[256] = "host";

static void fail(int code, const char* what) {
  fprintf(stdout, "%s: Test failure %s\n", host, what);
  fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

static void* need(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (f == NULL) fail(EXIT_NCCL, name);
  return f;
}

static void load(void) {
  void* cudart = dlopen("libcudart.so.13", RTLD_NOW);
  if (cudart == NULL) cudart = dlopen("libcudart.so", RTLD_NOW);
  if (cudart == NULL) fail(EXIT_CUDA, "libcudart not found on LD_LIBRARY_PATH");
  *(void**)&api.get_device_count = need(cudart, "cudaGetDeviceCount");
  *(void**)&api.get_error_string = need(cudart, "cudaGetErrorString");
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW);
  if (nccl == NULL) fail(EXIT_NCCL, "libnccl.so.2 not found on LD_LIBRARY_PATH");
  *(void**)&api.get_unique_id = need(nccl, "ncclGetUniqueId");
  *(void**)&api.comm_init_rank = need(nccl, "ncclCommInitRank");
  *(void**)&api.comm_destroy = need(nccl, "ncclCommDestroy");
  *(void**)&api.all_reduce = need(nccl, "ncclAllReduce");
  *(void**)&api.reduce_scatter = need(nccl, "ncclReduceScatter");
  *(void**)&api.all_gather = need(nccl, "ncclAllGather");
  *(void**)&api.send = need(nccl, "ncclSend");
  *(void**)&api.recv = need(nccl, "ncclRecv");
  *(void**)&api.group_start = need(nccl, "ncclGroupStart");
  *(void**)&api.group_end = need(nccl, "ncclGroupEnd");
}

static size_t parse_size(const char* s) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) fail(EXIT_USAGE, "bad size");
  switch (*end) {
    case 'G': case 'g': v <<= 10; /* fall through */
    case 'M': case 'm': v <<= 10; /* fall through */
    case 'K': case 'k': v <<= 10; end++; break;
    default: break;
  }
  if (*end != '\0') fail(EXIT_USAGE, "bad size suffix");
  return (size_t)v;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Small integers: every sum is exact in float, whatever the order. */
static float input_value(int rank, size_t i) { return (float)((int)((rank * 7 + i) % 13) - 6); }

/* One operation of `count` elements per rank's share; in-place as nccl-tests lays it out. */
static void run_op(test_kind kind, nccl_comm comm, int rank, int nranks, size_t count,
                   float* send, float* recv, int in_place) {
  ncclResult_t rc = ncclSuccess;
  switch (kind) {
    case T_ALL_REDUCE:
      rc = api.all_reduce(send, in_place ? send : recv, count, ncclFloat32, ncclSum, comm, NULL);
      break;
    case T_REDUCE_SCATTER:
      rc = api.reduce_scatter(send, in_place ? send + (size_t)rank * count : recv, count,
                              ncclFloat32, ncclSum, comm, NULL);
      break;
    case T_ALL_GATHER:
      rc = api.all_gather(in_place ? recv + (size_t)rank * count : send, recv, count, ncclFloat32,
                          comm, NULL);
      break;
    case T_SENDRECV:
      api.group_start();
      api.send(send, count, ncclFloat32, (rank + 1) % nranks, comm, NULL);
      api.recv(in_place ? send : recv, count, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL);
      rc = api.group_end();
      break;
  }
  if (rc != ncclSuccess) fail(EXIT_NCCL, "NCCL call failed");
}

/* Fills the buffers as the operation expects them, runs it once, and counts wrong values. */
static long long check_op(test_kind kind, nccl_comm comm, int rank, int nranks, size_t count,
                          float* send, float* recv, int in_place) {
  size_t n_send = kind == T_REDUCE_SCATTER ? count * (size_t)nranks : count;
  size_t n_recv = kind == T_ALL_GATHER ? count * (size_t)nranks : count;
  float* in = in_place && kind == T_ALL_GATHER ? recv + (size_t)rank * count : send;
  for (size_t i = 0; i < n_send; i++) in[i] = input_value(rank, i);
  run_op(kind, comm, rank, nranks, count, send, recv, in_place);
  const float* out = recv;
  if (in_place && kind == T_ALL_REDUCE) out = send;
  if (in_place && kind == T_REDUCE_SCATTER) out = send + (size_t)rank * count;
  if (in_place && kind == T_SENDRECV) out = send;
  long long wrong = 0;
  for (size_t i = 0; i < n_recv; i++) {
    float expect = 0.0f;
    if (kind == T_ALL_REDUCE || kind == T_REDUCE_SCATTER) {
      size_t at = kind == T_REDUCE_SCATTER ? (size_t)rank * count + i : i;
      for (int r = 0; r < nranks; r++) expect += input_value(r, at);
    } else if (kind == T_ALL_GATHER) {
      expect = input_value((int)(i / count), i % count);
    } else {
      expect = input_value((rank + nranks - 1) % nranks, i);
    }
    if (out[i] != expect) wrong++;
  }
  long long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  gethostname(host, sizeof(host) - 1);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  test_kind kind;
  double bus_factor;
  const char* redop = "sum";
  if (strcmp(FAKE_TEST, "all_reduce") == 0) kind = T_ALL_REDUCE, bus_factor = 2.0 * (nranks - 1) / nranks;
  else if (strcmp(FAKE_TEST, "reduce_scatter") == 0) kind = T_REDUCE_SCATTER, bus_factor = (double)(nranks - 1) / nranks;
  else if (strcmp(FAKE_TEST, "all_gather") == 0) kind = T_ALL_GATHER, bus_factor = (double)(nranks - 1) / nranks, redop = "none";
  else if (strcmp(FAKE_TEST, "sendrecv") == 0) kind = T_SENDRECV, bus_factor = 1.0, redop = "none";
  else fail(EXIT_USAGE, "unknown test " FAKE_TEST);

  size_t min_bytes = 32 << 20, max_bytes = 32 << 20, factor = 2;
  int iters = 20, warmup = 1, check = 1;
  for (int opt; (opt = getopt(argc, argv, "b:e:f:n:w:g:c:d:R:")) != -1;) {
    switch (opt) {
      case 'b': min_bytes = parse_size(optarg); break;
      case 'e': max_bytes = parse_size(optarg); break;
      case 'f': factor = parse_size(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'w': warmup = atoi(optarg); break;
      case 'g': if (atoi(optarg) != 1) fail(EXIT_USAGE, "-g must be 1"); break;
      case 'c': check = atoi(optarg); break;
      case 'd': if (strcmp(optarg, "float") != 0) fail(EXIT_USAGE, "only -d float"); break;
      /* Registered buffers: the stand-in's buffers are not NCCL's to register; only the
       * values nccl-tests accepts (0 none, 1 local, 2 symmetric) are. */
      case 'R': if (atoi(optarg) < 0 || atoi(optarg) > 2) fail(EXIT_USAGE, "-R must be 0, 1 or 2"); break;
      default: fail(EXIT_USAGE, "usage");
    }
  }
  if (factor < 2 || iters < 1) fail(EXIT_USAGE, "bad -f or -n");
  if (rank == 0) {
    printf("# nccl-tests stand-in (tools/gpu/fake/nccl-tests): %s_perf, %d ranks\n", FAKE_TEST, nranks);
    printf("# Using devices\n");
  }
  load();
  int devices = 0, cerr = api.get_device_count(&devices);
  if (cerr != 0) {
    printf("%s: Test CUDA failure fake_perf.c:%d '%s'\n", host, __LINE__, api.get_error_string(cerr));
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, EXIT_CUDA);
    return EXIT_CUDA;
  }

  /* Each rank must be its own "node": distinct NCCL_HOSTIDs, set by the launcher's wrapper. */
  char mine[64] = {0}, *all = calloc((size_t)nranks, sizeof(mine));
  const char* hostid = getenv("NCCL_HOSTID");
  if (hostid == NULL || hostid[0] == '\0') fail(EXIT_USAGE, "NCCL_HOSTID is not set for this rank");
  snprintf(mine, sizeof(mine), "%s", hostid);
  MPI_Allgather(mine, sizeof(mine), MPI_CHAR, all, sizeof(mine), MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < nranks; r++)
    if (r != rank && strcmp(all + (size_t)r * sizeof(mine), mine) == 0)
      fail(EXIT_USAGE, "two ranks share one NCCL_HOSTID");
  free(all);

  nccl_unique_id id;
  if (rank == 0 && api.get_unique_id(&id) != ncclSuccess) fail(EXIT_NCCL, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  nccl_comm comm = NULL;
  if (api.comm_init_rank(&comm, nranks, id, rank) != ncclSuccess) fail(EXIT_NCCL, "ncclCommInitRank");

  if (rank == 0) {
    printf("#\n#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
  }
  int errors = 0;
  double bw_sum = 0;
  int bw_n = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    /* nccl-tests' size column: the largest buffer of the operation. */
    size_t count = bytes / sizeof(float);
    if (kind == T_REDUCE_SCATTER || kind == T_ALL_GATHER) count /= (size_t)nranks;
    if (count == 0) continue;
    size_t elems = count * (size_t)nranks;
    float* send = calloc(elems, sizeof(float));
    float* recv = calloc(elems, sizeof(float));
    if (send == NULL || recv == NULL) fail(EXIT_CUDA, "out of memory");
    if (rank == 0) printf("%12zu  %12zu  %8s  %6s  %6d", bytes, kind == T_ALL_GATHER || kind == T_REDUCE_SCATTER ? count * (size_t)nranks : count, "float", redop, -1);
    for (int in_place = 0; in_place <= 1; in_place++) {
      for (int i = 0; i < warmup; i++) run_op(kind, comm, rank, nranks, count, send, recv, in_place);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_us();
      for (int i = 0; i < iters; i++) run_op(kind, comm, rank, nranks, count, send, recv, in_place);
      double us = (now_us() - t0) / iters;
      long long wrong = check ? check_op(kind, comm, rank, nranks, count, send, recv, in_place) : 0;
      if (wrong != 0) errors++;
      double algbw = (double)bytes / us / 1e3, busbw = algbw * bus_factor;
      bw_sum += busbw;
      bw_n++;
      if (rank == 0) printf("  %7.2f  %6.2f  %6.2f  %6lld", us, algbw, busbw, wrong);
    }
    if (rank == 0) printf("\n");
    free(send);
    free(recv);
  }
  api.comm_destroy(comm);
  if (rank == 0) {
    printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", bw_n ? bw_sum / bw_n : 0.0);
  }
  fflush(stdout);
  MPI_Finalize();
  return errors ? EXIT_WRONG : 0;
}
