/*
 * A stand-in for libnccl: ranks in separate processes exchange data through one POSIX
 * shared-memory segment named in the unique id. Only what nccl_multiproc_check and the
 * stand-in nccl-tests (fake/nccl-tests) call is there: AllReduce and ReduceScatter (float
 * sum, ranks summed in order), AllGather, and grouped Send/Recv of bytes or floats.
 * With NCCL_DEBUG=INFO it logs, like NCCL, "Using network <NCCL_NET>" at init, to
 * NCCL_DEBUG_FILE (%h host, %p pid) or stdout, so tools/gpu-check.sh's log reading runs too.
 * With NCCL_NET=AGOQ and NCCL_NET_GDR_LEVEL=SYS it also logs NCCL's GPUDirect lines
 * ("[send] via NET/AGOQ/0/GDRDMA", and ".../COLLNET/AGOQ/0/GDRDMA" with CollNet on).
 * FAKE agoq statistics: with NCCL_NET=AGOQ, AGOQ_STATS=1 and AGOQ_STATS_FILE set, every rank
 * appends at ncclCommDestroy one made-up "agoq-stats" line in the plugin's format (bytes_in:
 * what the fake moved; PCIe bytes bytes_in/2, and only with NCCL_NET_GDR_LEVEL=SYS). No plugin
 * runs here: the line exists only to test gpu-check.sh's parsing, its figures mean nothing.
 * Faults for the driver's own tests:
 *   FAKE_NCCL_CORRUPT=1    rank 1 flips one received value of every operation
 *   FAKE_NCCL_CRASH_RANK=r rank r aborts in its first collective
 *   FAKE_NCCL_HANG_RANK=r  rank r never returns from its first collective
 *   FAKE_NCCL_NO_COLLNET   no CollNet line
 *   FAKE_NCCL_NO_GDR       no GDRDMA lines even with NCCL_NET_GDR_LEVEL=SYS
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "abi/agoq_nccl_common.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_MAX_RANKS 64
#define FAKE_SLOT_BYTES (4u << 20)

typedef struct {
  char internal[128];
} fake_unique_id;

typedef struct {
  atomic_uint arrived;
  atomic_uint generation;
  size_t bytes[FAKE_MAX_RANKS];
} fake_header;

typedef struct {
  fake_header* h;
  uint8_t* slots;
  size_t map_len;
  int rank, nranks;
  /* Pending grouped operations. */
  int in_group;
  const void* send_buf;
  size_t send_bytes;
  int send_peer;
  void* recv_buf;
  size_t recv_bytes;
  int recv_peer;
  /* For the fake agoq-stats line. */
  unsigned long calls;
  size_t bytes_moved;
} fake_comm;

static size_t map_len(void) {
  return sizeof(fake_header) + (size_t)FAKE_MAX_RANKS * FAKE_SLOT_BYTES;
}

static void barrier(fake_comm* c) {
  unsigned gen = atomic_load(&c->h->generation);
  if (atomic_fetch_add(&c->h->arrived, 1) == (unsigned)c->nranks - 1) {
    atomic_store(&c->h->arrived, 0);
    atomic_fetch_add(&c->h->generation, 1);
  } else {
    while (atomic_load(&c->h->generation) == gen) sched_yield();
  }
}

static uint8_t* slot(fake_comm* c, int r) { return c->slots + (size_t)r * FAKE_SLOT_BYTES; }

/* A test's FAKE_NCCL_* number, strictly: unset is `unset`, anything but a whole decimal
 * number is a loud failure (a misspelt fault would otherwise silently not be injected). */
static long fake_env_number(const char* name, long unset) {
  const char* v = getenv(name);
  if (v == NULL) return unset;
  char* end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') {
    fprintf(stderr, "fake libnccl: %s=\"%s\" is not a number\n", name, v);
    exit(2);
  }
  return x;
}

static void maybe_fault(fake_comm* c, void* recv, size_t bytes) {
  if (fake_env_number("FAKE_NCCL_CRASH_RANK", -1) == c->rank) abort();
  while (fake_env_number("FAKE_NCCL_HANG_RANK", -1) == c->rank) pause();
  if (fake_env_number("FAKE_NCCL_CORRUPT", 0) != 0 && c->rank == 1 && bytes > 0) {
    ((uint8_t*)recv)[bytes / 2] ^= 0x40;
  }
}

/* A file name pattern with %h (host) and %p (pid) expanded, opened for appending. */
static FILE* open_pattern(const char* pattern) {
  char host[256] = "host", path[4096];
  gethostname(host, sizeof(host) - 1);
  size_t n = 0;
  for (const char* p = pattern; *p != '\0' && n + 1 < sizeof(path); p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      char part[256];
      if (p[1] == 'h') snprintf(part, sizeof(part), "%s", host);
      else snprintf(part, sizeof(part), "%d", (int)getpid());
      n += (size_t)snprintf(path + n, sizeof(path) - n, "%s", part);
      if (n >= sizeof(path)) return NULL;
      p++;
    } else {
      path[n++] = *p;
    }
  }
  path[n] = '\0';
  return fopen(path, "a");
}

/* NCCL_DEBUG_FILE with %h and %p expanded. */
static FILE* open_debug_file(void) {
  const char* pattern = getenv("NCCL_DEBUG_FILE");
  if (pattern == NULL) return stdout;
  return open_pattern(pattern);
}

static int env_is(const char* name, const char* value) {
  const char* v = getenv(name);
  return v != NULL && strcmp(v, value) == 0;
}

/* NCCL would use device buffers with the plugin (the real one advertises NCCL_PTR_CUDA). */
static int fake_gdr(void) {
  return env_is("NCCL_NET", "AGOQ") && env_is("NCCL_NET_GDR_LEVEL", "SYS");
}

/* The FAKE statistics line (see the top of the file): for gpu-check.sh's parsing only. */
static void write_fake_stats(const fake_comm* c) {
  const char* pattern = getenv("AGOQ_STATS_FILE");
  if (pattern == NULL || !env_is("NCCL_NET", "AGOQ") || !env_is("AGOQ_STATS", "1")) return;
  FILE* f = open_pattern(pattern);
  if (f == NULL) return;
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  const char* format = getenv("AGOQ_FORMAT");
  int quantized = format != NULL && strcmp(format, "none") != 0;
  int gdr = fake_gdr();
  size_t pcie = gdr ? c->bytes_moved / 4 : 0; /* each way: bytes_in / 2 in all */
  fprintf(f,
          "agoq-stats pid=%d host=%s event=close id=1 comm=%p kind=%s rank=%d nranks=%d "
          "path=%s calls=%lu bytes_in=%zu wire_raw=%zu wire_bytes=%zu ratio=1.000 "
          "codec_ms=0.000 crc_ms=0.000 wire_ms=0.000 device_calls=%lu pcie_d2h=%zu "
          "pcie_h2d=%zu gpu_ms=0.000 format=%s fake=1\n",
          (int)getpid(), host, (const void*)c,
          env_is("NCCL_COLLNET_ENABLE", "1") ? "collnet" : "p2p_send", c->rank, c->nranks,
          quantized ? "quantized" : "exact", c->calls, c->bytes_moved, c->bytes_moved,
          c->bytes_moved, gdr ? c->calls : 0ul, pcie, pcie, format != NULL ? format : "none");
  fclose(f);
}

static void log_network(int rank) {
  const char* level = getenv("NCCL_DEBUG");
  if (level == NULL || strcmp(level, "INFO") != 0) return;
  FILE* f = open_debug_file();
  if (f == NULL) return;
  const char* net = getenv("NCCL_NET");
  fprintf(f, "fake:%d:%d [0] NCCL INFO Using network %s\n", (int)getpid(), rank,
          net != NULL ? net : "Socket");
  /* Like NCCL's CollNet setup line, unless a test wants CollNet to look absent. */
  const char* collnet = getenv("NCCL_COLLNET_ENABLE");
  int gdr = fake_gdr() && getenv("FAKE_NCCL_NO_GDR") == NULL;
  if (gdr)
    fprintf(f,
            "fake:%d:%d [0] NCCL INFO Channel 00/0 : %d[0] -> %d[0] [send] via "
            "NET/AGOQ/0/GDRDMA\n",
            (int)getpid(), rank, rank, rank + 1);
  if (collnet != NULL && strcmp(collnet, "1") == 0 && getenv("FAKE_NCCL_NO_COLLNET") == NULL)
    fprintf(f, "fake:%d:%d [0] NCCL INFO CollNet 00/0 : %d [send] via COLLNET/%s/0%s\n",
            (int)getpid(), rank, rank, net != NULL ? net : "Socket", gdr ? "/GDRDMA" : "");
  if (f != stdout) fclose(f);
}

EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = 22809;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(fake_unique_id* id) {
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "/agoq-fake-nccl-%d", (int)getpid());
  int fd = shm_open(id->internal, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  int rc = ftruncate(fd, (off_t)map_len());
  close(fd);
  return rc == 0 ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclCommInitRank(fake_comm** out, int nranks, fake_unique_id id, int rank) {
  if (nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  int fd = shm_open(id.internal, O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  void* base = mmap(NULL, map_len(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return ncclSystemError;
  fake_comm* c = calloc(1, sizeof(*c));
  if (c == NULL) return ncclSystemError;
  c->h = base;
  c->slots = (uint8_t*)base + sizeof(fake_header);
  c->map_len = map_len();
  c->rank = rank;
  c->nranks = nranks;
  barrier(c); /* everyone has the segment mapped: its name can go */
  if (rank == 0) shm_unlink(id.internal);
  log_network(rank);
  *out = c;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(fake_comm* c) {
  write_fake_stats(c);
  munmap(c->h, c->map_len);
  free(c);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(fake_comm* c, ncclResult_t* r) {
  *r = ncclSuccess;
  return ncclSuccess;
}

/* The bytes of `count` elements of a type the fake moves (bytes or floats) that fit one
 * slot; 0 when they do not, or the type is another. */
static int fake_bytes(size_t count, ncclDataType_t type, size_t* bytes) {
  size_t size = type == ncclUint8 ? 1 : type == ncclFloat32 ? sizeof(float) : 0;
  *bytes = count * size;
  return size != 0 && *bytes <= FAKE_SLOT_BYTES;
}

/* Every rank has put its contribution in its slot: out[i] = the sum over ranks, in rank
 * order, of element `first + i` of each slot. */
static void sum_slots(fake_comm* c, size_t first, size_t count, float* out) {
  barrier(c);
  for (size_t i = 0; i < count; i++) {
    float sum = 0.0f;
    for (int r = 0; r < c->nranks; r++) sum += ((const float*)slot(c, r))[first + i];
    out[i] = sum;
  }
  barrier(c); /* nobody reuses its slot before all have read it */
}

EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, fake_comm* c, void* stream) {
  size_t bytes = count * sizeof(float);
  if (type != ncclFloat32 || op != ncclSum || bytes > FAKE_SLOT_BYTES) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), send, bytes);
  sum_slots(c, 0, count, recv);
  c->calls++;
  c->bytes_moved += bytes;
  maybe_fault(c, recv, bytes);
  return ncclSuccess;
}

/* recv (count floats) = the sum over ranks of block `rank` of every rank's send. */
EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                                      ncclRedOp_t op, fake_comm* c, void* stream) {
  size_t bytes = count * sizeof(float), total = bytes * (size_t)c->nranks;
  if (type != ncclFloat32 || op != ncclSum || total > FAKE_SLOT_BYTES) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), send, total);
  sum_slots(c, (size_t)c->rank * count, count, recv);
  c->calls++;
  c->bytes_moved += total;
  maybe_fault(c, recv, bytes);
  return ncclSuccess;
}

/* recv (count * nranks elements) = every rank's send, in rank order. */
EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                                  fake_comm* c, void* stream) {
  size_t bytes;
  if (!fake_bytes(count, type, &bytes)) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), send, bytes);
  barrier(c);
  for (int r = 0; r < c->nranks; r++) memcpy((uint8_t*)recv + (size_t)r * bytes, slot(c, r), bytes);
  barrier(c);
  c->calls++;
  c->bytes_moved += bytes;
  maybe_fault(c, recv, bytes * (size_t)c->nranks);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart(void) { return ncclSuccess; }

/* Send and Recv of one rank are matched in ncclGroupEnd; the fake keeps the pending pair
 * in the one communicator the driver uses. */
static fake_comm* g_group_comm;

EXPORT ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer,
                             fake_comm* c, void* stream) {
  size_t bytes;
  if (!fake_bytes(count, type, &bytes)) return ncclInvalidArgument;
  c->in_group = 1;
  c->send_buf = buf;
  c->send_bytes = bytes;
  c->send_peer = peer;
  g_group_comm = c;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, fake_comm* c,
                             void* stream) {
  size_t bytes;
  if (!fake_bytes(count, type, &bytes)) return ncclInvalidArgument;
  c->in_group = 1;
  c->recv_buf = buf;
  c->recv_bytes = bytes;
  c->recv_peer = peer;
  g_group_comm = c;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  fake_comm* c = g_group_comm;
  if (c == NULL || !c->in_group) return ncclSuccess;
  memcpy(slot(c, c->rank), c->send_buf, c->send_bytes);
  c->h->bytes[c->rank] = c->send_bytes;
  barrier(c);
  size_t got = c->h->bytes[c->recv_peer];
  ncclResult_t rc = got <= c->recv_bytes ? ncclSuccess : ncclInvalidUsage;
  if (rc == ncclSuccess) memcpy(c->recv_buf, slot(c, c->recv_peer), got);
  barrier(c);
  c->calls++;
  c->bytes_moved += c->send_bytes;
  if (rc == ncclSuccess) maybe_fault(c, c->recv_buf, got);
  c->in_group = 0;
  g_group_comm = NULL;
  return rc;
}

EXPORT const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake error"; }
EXPORT const char* ncclGetLastError(fake_comm* c) { return ""; }
